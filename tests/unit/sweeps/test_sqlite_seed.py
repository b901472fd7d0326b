"""A new SQLite MLflow store seeded from the cached empty one is the store MLflow itself would have made (issue #47:
start-up): the same schema, revision and rows, the Default experiment where MLflow puts it; anything unusual leaves
the store to MLflow."""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest
from mlflow import MlflowClient

from sweeps.integrations.mlflow.sqlite_seed import seed_sqlite_store


def _statement(sql: str) -> tuple[str, ...]:
    """A schema statement's lines in order of their text: MLflow's own migrations write a table's constraints in
    a different order from one new store to the next."""
    return tuple(sorted(line.strip().rstrip(",").strip() for line in sql.splitlines()))


def _dump(db: Path) -> tuple[set[tuple[str, ...]], dict[str, list[tuple]]]:
    """(every schema statement, every table's rows with the Default experiment's times left out)."""
    with closing(sqlite3.connect(db)) as con:
        schema = {_statement(sql) for (sql,) in con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")}
        rows = {}
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cur = con.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cur.description]
            keep = [i for i, n in enumerate(names) if n not in ("creation_time", "last_update_time")]
            rows[table] = sorted(tuple(r[i] for i in keep) for r in cur.fetchall())
    return schema, rows


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # one empty store made for the module's tests


@pytest.fixture
def cache(module_cache, monkeypatch):
    monkeypatch.setenv("CALIB_DATA_CACHE", str(module_cache))
    return module_cache


def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path, cache, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # MLflow puts the Default experiment's artifacts under the working folder
    plain, seeded = tmp_path / "plain.db", tmp_path / "seeded.db"
    MlflowClient(f"sqlite:///{plain}").search_experiments()
    assert seed_sqlite_store(f"sqlite:///{seeded}") is True
    assert list(cache.glob("mlflow-store/mlflow-*.db")), "the empty store is kept in the cache folder"
    client = MlflowClient(f"sqlite:///{seeded}")
    default = client.get_experiment("0")
    assert default.name == "Default" and default.artifact_location == str(work / "mlruns" / "0")
    assert _dump(seeded) == _dump(plain)
    # and it works as a store: the first experiment of ours gets MLflow's next id
    assert client.create_experiment("calib-sweeps") == MlflowClient(f"sqlite:///{plain}").create_experiment("x")


def test_the_file_has_the_mode_a_new_file_gets(tmp_path, cache):
    seeded = tmp_path / "m.db"
    assert seed_sqlite_store(f"sqlite:///{seeded}")
    other = tmp_path / "other"
    other.touch()
    assert stat.S_IMODE(seeded.stat().st_mode) == stat.S_IMODE(other.stat().st_mode)
    assert not list(tmp_path.glob(".m.db.*")), "no temporary file is left beside the store"


def test_an_existing_store_is_never_touched(tmp_path, cache):
    db = tmp_path / "m.db"
    db.write_bytes(b"")  # even an empty file: MLflow decides what to do with it
    assert seed_sqlite_store(f"sqlite:///{db}") is False
    assert db.read_bytes() == b""


@pytest.mark.parametrize(
    "uri",
    ["http://127.0.0.1:5000", "postgresql://u@h/db", "file:///tmp/mlruns", "sqlite:///{tmp}/m.db?timeout=5"],
)
def test_other_stores_are_left_to_mlflow(tmp_path, cache, uri):
    assert seed_sqlite_store(uri.format(tmp=tmp_path)) is False
    assert not (tmp_path / "m.db").exists()


def test_no_cache_or_an_unwritable_one_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIB_DATA_CACHE", "off")
    assert seed_sqlite_store(f"sqlite:///{tmp_path}/a.db") is False
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("CALIB_DATA_CACHE", str(blocked))
    assert seed_sqlite_store(f"sqlite:///{tmp_path}/b.db") is False
    assert not (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()
    assert seed_sqlite_store(f"sqlite:///{tmp_path}/missing/c.db") is False  # MLflow says what is wrong


def test_the_sweeps_store_is_seeded(tmp_path, cache, monkeypatch):
    from sweeps.integrations.mlflow import store as store_module

    seeded = []
    real = store_module.seed_sqlite_store
    monkeypatch.setattr(store_module, "seed_sqlite_store", lambda uri: seeded.append((uri, real(uri))) or seeded[-1][1])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store_module.MlflowStore(uri).ensure_experiment("calib-sweeps")
    assert seeded == [(uri, True)]  # the sweep's new store was a copy, before MLflow opened it
    assert os.path.getsize(tmp_path / "mlflow.db") > 0

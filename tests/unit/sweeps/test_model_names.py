"""Names that never collide (issue #44 item 4): the default registered model name carries a digest of the data
file's content, the champion gate refuses a champion of another task naming --model-name, and a champion no better
than the majority class gets @no-better-than-majority instead of @champion."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sweeps.config import load_sweep_config
from sweeps.config_defaults import with_defaults


def _name(*sets: str) -> str:
    return with_defaults(load_sweep_config(None, list(sets)), cluster=True).tracking.registered_model


def _table(path: Path, label: str = "y") -> str:
    return _name("run.data.name=table", f"run.data.path={path}", f"run.data.label_column={label}")


def _csv(path: Path, rows: list[tuple[float, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x,y\n" + "".join(f"{x},{y}\n" for x, y in rows))
    return path


# ---------------------------------------------------------------------------- the default name
def test_two_different_train_csv_files_never_share_a_name(tmp_path):
    a = _csv(tmp_path / "projA" / "train.csv", [(1.0, "benign"), (2.0, "malignant")])
    b = _csv(tmp_path / "projB" / "train.csv", [(1.0, "class_0"), (2.0, "class_1")])
    name_a, name_b = _table(a), _table(b)
    assert re.fullmatch(r"calibrated-table-train-[0-9a-f]{8}", name_a), name_a
    assert re.fullmatch(r"calibrated-table-train-[0-9a-f]{8}", name_b), name_b
    assert name_a != name_b
    # one changed cell is other data
    c = _csv(tmp_path / "projC" / "train.csv", [(1.0, "benign"), (2.5, "malignant")])
    assert _table(c) not in (name_a, name_b)


def test_the_same_content_keeps_its_name_wherever_it_lies(tmp_path):
    a = _csv(tmp_path / "projA" / "train.csv", [(1.0, "0"), (2.0, "1")])
    first = _table(a)
    assert _table(a) == first  # a re-run: the champion gate compares like with like
    copy = tmp_path / "elsewhere" / "deeper" / "train.csv"
    copy.parent.mkdir(parents=True)
    shutil.copy(a, copy)
    assert _table(copy) == first
    moved = tmp_path / "moved" / "train.csv"
    moved.parent.mkdir()
    a.rename(moved)
    assert _table(moved) == first


def test_the_label_column_is_part_of_the_task(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,0\n0,1\n")
    assert _table(p, "a") != _table(p, "b")


def test_the_digest_is_the_files_bytes_and_the_task_settings_streamed(tmp_path):
    """An independent reference: blake2b over the task settings and the whole file at once, for a file larger than
    the chunks it is read in."""
    from sweeps.config_defaults import CHUNK_BYTES

    rng = np.random.default_rng(0)
    p = tmp_path / "big.csv"
    p.write_text("x,y\n" + "".join(f"{v:.6f},{int(v > 0)}\n" for v in rng.normal(size=CHUNK_BYTES // 5)))
    assert p.stat().st_size > 2 * CHUNK_BYTES
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": "table", "label_column": "y"}, sort_keys=True).encode())
    h.update(p.read_bytes())
    assert _table(p) == f"calibrated-table-big-{h.hexdigest()[:8]}"


def test_folders_are_named_by_their_listing_and_array_contents(tmp_path):
    def folder(root: Path, files: dict[str, bytes]) -> Path:
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        return root

    def images(root: Path) -> str:
        return _name("run.data.name=image_folder", f"run.data.path={root}")

    cats = folder(tmp_path / "a" / "pets", {"cat/1.png": b"x" * 10, "dog/1.png": b"y" * 12})
    same = folder(tmp_path / "b" / "pets", {"cat/1.png": b"z" * 10, "dog/1.png": b"w" * 12, ".DS_Store": b"?"})
    other = folder(tmp_path / "c" / "pets", {"cat/1.png": b"x" * 10, "dog/2.png": b"y" * 12})
    assert re.fullmatch(r"calibrated-image_folder-pets-[0-9a-f]{8}", images(cats))
    assert images(cats) == images(same)  # an image folder is named by its listing and sizes, not read
    assert images(cats) != images(other)

    def arrays(root: Path) -> str:
        return _name("run.data.name=arrays", f"run.data.path={root}")

    x0, x1 = np.zeros((20, 3)), np.ones((20, 3))
    for name, x in (("d0", x0), ("d1", x1)):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "x.npy", x)
        np.save(tmp_path / name / "y.npy", np.arange(20) % 2)
    # the same file sizes, other values: array files are read
    assert arrays(tmp_path / "d0") != arrays(tmp_path / "d1")


def _no_reads_of(monkeypatch, path: Path) -> None:
    """Any open of `path` from here on fails the test."""
    real = Path.open

    def guarded(self, *args, **kwargs):
        assert Path(self).resolve() != path.resolve(), f"{path} was read"
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)


def test_a_launch_on_data_already_named_reads_none_of_it(tmp_path, monkeypatch):
    """The digest is kept under the file's stat: the second launch on the same file opens it not at all, and
    agrees with the first (and with the digest computed without a cache)."""
    monkeypatch.setenv("CALIB_DATA_CACHE", str(tmp_path / "cache"))
    a = _csv(tmp_path / "train.csv", [(float(i), str(i % 2)) for i in range(200)])
    first = _table(a)
    monkeypatch.setenv("CALIB_DATA_CACHE", "off")
    uncached = _table(a)
    monkeypatch.setenv("CALIB_DATA_CACHE", str(tmp_path / "cache"))
    with monkeypatch.context() as m:
        _no_reads_of(m, a)
        assert _table(a) == first == uncached


def test_data_rewritten_in_place_is_named_again_even_with_its_old_mtime(tmp_path, monkeypatch):
    """Same size, same modification time put back (as `cp -p` or a careless tool leaves it): the change time still
    moves, so the cached name is not reused for other data."""
    import os

    monkeypatch.setenv("CALIB_DATA_CACHE", str(tmp_path / "cache"))
    a = _csv(tmp_path / "train.csv", [(1.0, "0"), (2.0, "1")])
    before = _table(a)
    st = a.stat()
    a.write_text(a.read_text().replace("1.0,0", "3.0,0"))  # same length
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert a.stat().st_size == st.st_size and a.stat().st_mtime_ns == st.st_mtime_ns
    after = _table(a)
    monkeypatch.setenv("CALIB_DATA_CACHE", "off")
    assert after == _table(a) != before


def test_a_csv_too_large_for_memory_is_not_hashed(tmp_path, monkeypatch):
    """A file too large for memory by its size alone (a CSV needs six times its size) is not read for its name (a
    24 GiB CSV took 83 s to hash before the launch said it was too large): the name has no digest, and the data
    check refuses the file."""
    from calib_core.data.files import DataError, available_memory
    from calib_core.data.registry import load_dataset

    big = tmp_path / "big.csv"
    with open(big, "wb") as fh:
        fh.truncate(available_memory())  # sparse; six times this in memory is more than there is
    sets = ("run.data.name=table", f"run.data.path={big}", "run.data.label_column=y")
    with monkeypatch.context() as m:
        _no_reads_of(m, big)
        assert _name(*sets) == "calibrated-table-big"
    cfg = with_defaults(load_sweep_config(None, list(sets)), cluster=True)
    with pytest.raises(DataError, match="is too large for memory"):
        load_dataset(cfg.run.data.model_copy(update={"num_samples": None}), seed=0)


def test_naming_the_data_imports_no_torch(tmp_path):
    """The config step names file data (the digest, its cache, the size check) without torch, which would cost the
    launch about a second before its checks."""
    import subprocess
    import sys

    from tests.paths import ROOT

    _csv(tmp_path / "t.csv", [(1.0, "0"), (2.0, "1")])
    np.savez(tmp_path / "a.npz", x=np.ones((4, 2)), y=np.arange(4) % 2)
    code = (
        "import sys\n"
        "from sweeps.config import load_sweep_config\n"
        "from sweeps.config_defaults import with_defaults\n"
        f'for sets in (["run.data.name=table", "run.data.path={tmp_path / "t.csv"}", "run.data.label_column=y"],\n'
        f'             ["run.data.name=arrays", "run.data.path={tmp_path / "a.npz"}"]):\n'
        "    name = with_defaults(load_sweep_config(None, sets), cluster=False).tracking.registered_model\n"
        "    assert name.count('-') >= 3, name\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_built_in_data_and_unreadable_paths_keep_plain_names(tmp_path):
    assert _name() == "calibrated-mnist1d"
    assert _name("run.data.name=digits") == "calibrated-digits"
    assert _name("run.data.name=breast_cancer") == "calibrated-breast_cancer"
    # not readable where the config is read: no digest (the data checks refuse the path before any trial)
    assert _table(tmp_path / "absent" / "patients.csv") == "calibrated-table-patients"
    # a name the user gives stays as given
    a = _csv(tmp_path / "train.csv", [(1.0, "0"), (2.0, "1")])
    assert (
        _name("run.data.name=table", f"run.data.path={a}", "run.data.label_column=y", "tracking.registered_model=x")
        == "x"
    )


def test_model_name_flag_sets_the_registered_model(tmp_path):
    from sweeps.cli import build_parser, resolve_config

    args = build_parser().parse_args(["--model-name", "my-model"])
    assert resolve_config(args).tracking.registered_model == "my-model"
    assert not resolve_config(args).tracking.registered_model_is_default


# ---------------------------------------------------------------------------- the task signature
def _task(shape: list[int], k: int, names: list[str] | None = None, cols: list[str] | None = None) -> dict:
    return {"input_shape": shape, "num_classes": k, "class_names": names, "columns": cols}


def test_another_task_is_named_and_the_same_task_is_not():
    from sweeps.decide.gate import task_difference

    cancer = _task([30], 2, ["benign", "malignant"], [f"c{i}" for i in range(30)])
    wine = _task([13], 3, ["class_0", "class_1", "class_2"], [f"w{i}" for i in range(13)])
    line = task_difference(wine, cancer)
    assert line and "--model-name" in line and "\n" not in line
    assert "input shape (13,) vs (30,)" in line and "3 classes vs 2" in line
    # the same shape and class count, other columns and class names: still another task
    renamed = _task([30], 2, ["no", "yes"], [f"d{i}" for i in range(30)])
    line = task_difference(renamed, cancer)
    assert line and "input columns [d0, d1, d2, d3, ...] (30)" in line and "classes [no, yes] (2)" in line
    assert task_difference(dict(cancer), cancer) is None
    # a champion recorded before class names and columns were kept: compared on shape and class count only
    assert task_difference(cancer, {"input_shape": [30], "num_classes": 2}) is None


class _FakeStore:
    """The MlflowStore calls move_alias makes, in memory: artifacts by run, aliases, version tags."""

    def __init__(self) -> None:
        self.artifacts: dict[str, dict[str, bytes]] = {}
        self.aliases: dict[str, str] = {}
        self.tags: dict[str, dict[str, str]] = {}
        self.client = SimpleNamespace(
            list_artifacts=lambda run, d: [SimpleNamespace(path=p) for p in self.artifacts.get(run, {})],
            get_model_version=lambda name, v: SimpleNamespace(run_id=f"run{v}"),
            set_model_version_tag=lambda name, v, k, val: self.tags.setdefault(v, {}).__setitem__(k, val),
        )

    def log_artifacts(self, run: str, files: list[tuple[Path, str]]) -> None:
        for path, folder in files:
            self.artifacts.setdefault(run, {})[f"{folder}/{Path(path).name}"] = Path(path).read_bytes()

    def download_artifact(self, run: str, path: str, dst: str) -> str:
        out = Path(dst) / Path(path).name
        out.write_bytes(self.artifacts[run][path])  # KeyError: not there
        return str(out)

    def alias_version(self, name: str, alias: str) -> str | None:
        return self.aliases.get(alias)

    def point_alias(self, name: str, alias: str, version: str, tags: dict[str, str]) -> None:
        self.aliases[alias] = version


def _frame_csv(path: Path, which: str, columns: int | None = None) -> dict[str, Any]:
    """A real table as a user holds it (scikit-learn's breast cancer or wine data), and its run config."""
    from sklearn.datasets import load_breast_cancer, load_wine

    frame = (load_breast_cancer if which == "cancer" else load_wine)(as_frame=True).frame
    if columns is not None:  # the first `columns` features under other names, the same labels
        frame = frame.iloc[:, list(range(columns)) + [-1]]
        frame.columns = [f"f{i}" for i in range(columns)] + ["target"]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return {"data": {"name": "table", "path": str(path), "label_column": "target"}, "model": {"name": "mlp"}}


def _move(store: _FakeStore, version: str, run_config: dict, **kw: Any) -> tuple[str, str]:
    from sweeps.integrations.mlflow.champion_gate import move_alias

    fake: Any = store  # the calls move_alias makes, not an MlflowStore
    return move_alias(
        fake, "shared-name", version, f"run{version}", run_config, "unused.npz", level=0.95, num_bins=15, **kw
    )


def test_the_gate_refuses_a_champion_of_another_task(tmp_path):
    store = _FakeStore()
    cancer = _frame_csv(tmp_path / "projA" / "train.csv", "cancer")
    assert _move(store, "1", cancer) == ("champion", "")
    recorded = json.loads(store.artifacts["run1"]["gate/data.json"])
    assert recorded["num_classes"] == 2 and recorded["class_names"] == ["0", "1"] and len(recorded["columns"]) == 30

    wine = _frame_csv(tmp_path / "projB" / "train.csv", "wine")
    alias, line = _move(store, "2", wine)
    assert (alias, store.aliases["champion"]) == ("challenger", "1")
    assert line.startswith("Champion gate: version 1 stays @champion, version 2 is @challenger: ")
    assert "another task" in line and "--model-name" in line and "\n" not in line
    assert store.tags["2"]["calib.gate"] == line

    # the same shape and classes as the champion, other input columns: not compared either
    same_shape = _frame_csv(tmp_path / "projC" / "train.csv", "cancer", columns=30)
    alias, line = _move(store, "3", same_shape)
    assert alias == "challenger" and store.aliases["champion"] == "1"
    assert "input columns [f0, f1, f2, f3, ...] (30) vs [mean radius," in line and "--model-name" in line

    # --promote is the user's word: it moves the alias anyway
    alias, line = _move(store, "4", wine, promote=True)
    assert alias == "champion" and store.aliases["champion"] == "4" and "--promote" in line


# ---------------------------------------------------------------------------- no better than the majority class
def test_majority_rate_by_hand():
    from sweeps.decide.majority import majority_rate

    assert majority_rate(np.array([0] * 6 + [1] * 3 + [2])) == pytest.approx(0.6)
    assert majority_rate(np.array([-1, -1, 3, 3, 1])) == pytest.approx(2 / 3)  # missing labels left out
    assert majority_rate(np.array([-1])) is None


def test_no_better_than_majority_by_hand():
    from sweeps.decide.majority import no_better_than_majority

    rates = {"val": 0.6, "test": 0.5}
    # validation: 60 % majority, interval [55, 75]: includes it
    why = no_better_than_majority({"val": (0.55, 0.75), "test": (0.8, 0.9)}, rates)
    assert why == (
        "its validation accuracy interval [55.0 %, 75.0 %] includes the majority-class rate of that split, 60.0 %"
    )
    # validation above its rate, test's lower bound exactly at 50 %: no better
    why = no_better_than_majority({"val": (0.61, 0.8), "test": (0.5, 0.7)}, rates)
    assert why and why.startswith("its test accuracy interval [50.0 %, 70.0 %] includes")
    why = no_better_than_majority({"val": (0.3, 0.4), "test": (0.8, 0.9)}, rates)
    assert why and "lies below the majority-class rate of that split, 60.0 %" in why
    assert no_better_than_majority({"val": (0.61, 0.8), "test": (0.51, 0.7)}, rates) is None
    assert no_better_than_majority({}, rates) is None and no_better_than_majority({"val": (0.1, 0.2)}, {}) is None


def test_a_chance_level_champion_is_told_apart_with_the_services_intervals(tmp_path):
    """Intervals as the sweep computes them (compute_replicates): a model that always answers the most frequent
    class is no better than it; a model right on 90 % of 10 balanced classes is."""
    from sweeps.decide.uncertainty import compute_replicates
    from sweeps.integrations.mlflow.champion_gate import majority_reason

    rng = np.random.default_rng(0)
    y = {s: rng.integers(0, 10, 400) for s in ("val", "test")}
    constant = {s: np.tile(np.eye(10)[np.bincount(y[s]).argmax()] * 0.9 + 0.01, (400, 1)) for s in y}
    good = {
        s: np.where(rng.random((400, 1)) < 0.9, np.eye(10)[y[s]], np.eye(10)[(y[s] + 1) % 10]) * 0.9 + 0.01 for s in y
    }
    preds = {t: {s: [(None, p[s], y[s])] for s in y} for t, p in (("constant", constant), ("good", good))}
    reps = compute_replicates(preds, num_bins=15, num_resamples=200, level=0.95, seed=0, names=("accuracy",))
    path = tmp_path / "predictions.npz"
    np.savez(path, val_labels=y["val"], test_labels=y["test"])

    def intervals(t: str) -> dict[str, tuple[float, float]]:
        return {s: tuple(float(v) for v in reps.interval(t, f"{s}_accuracy")) for s in y}  # type: ignore[misc]

    why = majority_reason(path, intervals("constant"))
    rate = np.bincount(y["val"]).max() / 400
    assert why and why.endswith(f"the majority-class rate of that split, {100 * rate:.1f} %"), why
    assert majority_reason(path, intervals("good")) is None


def test_a_no_better_champion_gets_its_own_alias_and_champion_stays(tmp_path):
    store = _FakeStore()
    cancer = _frame_csv(tmp_path / "projA" / "train.csv", "cancer")
    why = "its validation accuracy interval [8.1 %, 12.9 %] includes the majority-class rate of that split, 11.2 %"
    # no champion yet: none is set
    alias, line = _move(store, "1", cancer, no_better=why)
    assert alias == "no-better-than-majority" and "champion" not in store.aliases
    assert (
        line == f"Champion gate: version 1 is @no-better-than-majority, not @champion (no version is @champion): {why}"
    )
    assert _move(store, "2", cancer) == ("champion", "")
    # a champion exists: it stays, even with --promote
    alias, line = _move(store, "3", cancer, no_better=why, promote=True)
    assert (alias, store.aliases["champion"], store.aliases["no-better-than-majority"]) == (
        "no-better-than-majority",
        "2",
        "3",
    )
    assert "(version 2 stays @champion)" in line and store.tags["3"]["calib.gate"] == line

"""sweeps/startup.py: every check before the first write in one pass, every problem it finds in one answer.

Each case plants several independent faults at once (a path under a file, servers that refuse connections,
data that is not there) and requires a line for each: a start-up that stopped at its first problem fails here.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from calib_core.config import ConfigError
from sweeps.api import resolve, run_sweep
from sweeps.checks.preflight import SEARCH_SPACE_FILE
from sweeps.startup import check_all, preflight


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broken_environment(tmp_path: Path, *extra: str):
    """A local config with four independent faults: storage under a file, no tracking server, no study
    database, a dataset folder that does not exist."""
    port = _closed_port()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return resolve(
        None,
        [
            f"tracking.uri=http://127.0.0.1:{port}",
            f"search.storage=postgresql://u:pw@127.0.0.1:{port}/db",
            f"storage_path={blocker}/results",
            "run.data.name=cifar10",
            f"run.data.root={tmp_path}/missing",
            *extra,
        ],
        workdir=tmp_path,
    )


def test_every_environment_problem_is_found_in_one_pass(tmp_path):
    cfg = _broken_environment(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    found = check_all(cfg, cluster=False)
    assert [p.split(":", 1)[0] for p in found.problems] == [
        "run.data.root",
        "storage_path",
        "tracking.uri",
        "search.storage",
    ], found.problems
    assert "is a file" in found.problems[1] and "Connection refused" in found.problems[2]
    assert "pw" not in " ".join(found.problems)  # the database URL's password is not repeated
    assert found.nothing_to_do is None
    with pytest.raises(ConfigError) as err:
        preflight(cfg, cluster=False)
    assert str(err.value) == "; ".join(found.problems) and "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_a_refused_data_folder_starts_no_model_and_data_check(tmp_path, monkeypatch):
    """The model/data check's child (it imports torch: about 2 s of CPU) is not started for data already refused:
    its answer would not be used (one line for one cause)."""
    from sweeps.checks import model_fit

    started = []
    real_start = model_fit.start
    monkeypatch.setattr(model_fit, "start", lambda *a, **k: started.append(1) or real_start(*a, **k))
    problems = check_all(_broken_environment(tmp_path), cluster=False).problems
    assert problems[0].startswith("run.data.root") and started == []
    problems = check_all(_broken_environment(tmp_path, f"run.data.root={tmp_path}"), cluster=False).problems
    assert not problems[0].startswith("run.data.root") and started == [1], problems


def test_the_model_and_data_check_joins_the_other_problems(tmp_path):
    """An image folder that does not exist is found by the model/data check (its child process); its line
    comes with the server's, not instead of it."""
    port = _closed_port()
    cfg = resolve(
        None,
        [
            f"tracking.uri=http://127.0.0.1:{port}",
            "run.data.name=image_folder",
            "run.data.num_samples=null",
            f"run.data.path={tmp_path}/img",
        ],
        workdir=tmp_path,
    )
    problems = check_all(cfg, cluster=False).problems
    assert len(problems) == 2, problems
    assert problems[0].startswith("tracking.uri: no MLflow server answers")
    assert problems[1].startswith("run.data") and f"{tmp_path}/img does not exist" in problems[1]


def test_bad_values_are_answered_before_the_environment_is_touched(tmp_path):
    """A value problem stops the pass before any server is asked (their answers would be about a config that
    cannot run anyway): only the value's line, at once."""
    cfg = _broken_environment(tmp_path, "resources.cpus_per_trial=0.00001")
    problems = check_all(cfg, cluster=False).problems
    assert len(problems) == 1 and problems[0].startswith("resources.cpus_per_trial: Ray counts resources"), problems


def test_the_python_api_checks_a_resumed_search_space_as_the_cli_does(tmp_path):
    """run_sweep(resume=True) with another search space is refused before anything runs (it was checked by the
    CLI only), with the same line."""
    cfg = resolve(None, [], workdir=tmp_path)
    recorded = cfg.search.resumed_space()
    first = sorted(recorded)[0]
    recorded[first] = {"changed": True}
    exp = Path(cfg.storage_path or "") / cfg.name
    exp.mkdir(parents=True)
    (exp / SEARCH_SPACE_FILE).write_text(json.dumps(recorded))
    with pytest.raises(ConfigError, match=rf"^search\.{first}: --resume of {cfg.name!r} must search what it started"):
        run_sweep(None, resume=True, workdir=tmp_path)
    assert not (tmp_path / "mlflow.db").exists()

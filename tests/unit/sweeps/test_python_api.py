"""The Python API: examples/python_api.py runs a 2-trial sweep with `run_sweep` and uses its result."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.paths import ROOT


@pytest.mark.slow  # a whole sweep: the e2e tier
def test_example_runs_a_sweep_and_uses_its_result(tmp_path):
    # env: TMPDIR left as it is (a TMPDIR this deep: Ray socket paths too long)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python_api.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout.split("--- what run_sweep returned ---", 1)[1]
    assert re.search(r"champion: \S+ .*\(MLflow run [0-9a-f]{32}, trial [\w+]+\)", out), out
    assert re.search(r"model: models:/calibrated-mnist1d/\d+ \(also models:/calibrated-mnist1d@champion\)", out)
    assert "val_ece_ci_low" in out and "selection: " in out
    assert "calibrated probabilities of 5 test inputs: shape (5, 10), rows sum to 1" in out
    # the result's short repr, best config, errors, study; load_result by name, without progress bars
    rep = re.search(r"^repr: (SweepResult\(.*\))$", out, re.M)
    assert rep and len(rep.group(1)) < 300 and "trials=2, errors=0" in rep.group(1), out
    assert re.search(r"^best config: \{'calibrator': '\w+'", out, re.M), out
    assert "trials that did not complete: []" in out and re.search(r"^study: api-example with 2 trials$", out, re.M)
    assert re.search(r"^load_result: SweepResult\(name='api-example'", out, re.M), out
    assert "Downloading artifacts" not in proc.stdout + proc.stderr
    assert not list(tmp_path.glob("mlflow.db")), "the example writes into its own temporary folder only"


def test_config_errors_are_raised_before_anything_is_written(tmp_path):
    from sweeps import ConfigError, run_sweep

    with pytest.raises(ConfigError, match="search.num_samples"):
        run_sweep(overrides=["search.num_samples=0"], workdir=tmp_path)
    with pytest.raises(ConfigError, match="run.train.epochs"):
        run_sweep({"run": {"train": {"epochs": "x"}}}, workdir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_resolve_fills_the_cli_defaults_in_workdir(tmp_path):
    from sweeps.api import resolve

    cfg = resolve(None, ["search.num_samples=2"], workdir=tmp_path)
    assert cfg.search.num_samples == 2
    assert cfg.tracking.uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert cfg.search.storage == f"sqlite:///{tmp_path.resolve()}/optuna.db"
    assert cfg.storage_path == str(tmp_path.resolve() / "ray_results")


def test_result_study_is_loaded_by_the_optuna_integration(tmp_path):
    """`result.study` loads the study through the loader run_sweep / load_result set (sweeps.contract imports no
    third-party library, optuna included); an in-memory study, or a result made without a loader, gives None."""
    import pickle

    import optuna

    from sweeps.contract import SweepResult
    from sweeps.integrations.optuna.study import load_study

    url = f"sqlite:///{tmp_path}/optuna.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="api-study", storage=url).optimize(lambda t: t.suggest_float("x", 0, 1), 3)
    fields = dict(
        name="api-study",
        champion_run_id="0" * 32,
        champion_trial_id="1",
        champion_label="l",
        model_uri="models:/m/1",
        model_version="1",
        leaderboard=None,
        selection="s",
        intervals={},
        confidence=0.95,
        parent_run_id="1" * 32,
        experiment_id="1",
        tracking_uri="sqlite:////tmp/x.db",
    )
    result = SweepResult(**fields, study_storage=url, study_loader=load_study)
    assert result.study.study_name == "api-study" and len(result.study.trials) == 3
    assert pickle.loads(pickle.dumps(result)).study.study_name == "api-study"  # the loader pickles by reference
    assert result == SweepResult(**fields, study_storage=url)  # the loader is not part of the result's value
    assert SweepResult(**fields, study_storage=url).study is None
    assert SweepResult(**fields, study_storage="memory", study_loader=load_study).study is None

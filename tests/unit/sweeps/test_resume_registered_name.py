"""--resume keeps the registered model name a sweep started with (issue #34 item 5's follow-up).

The default name now follows the data (calibrated-mnist1d); sweeps started before registered their champion as
calibrated-classifier, the old default, which their parent run records as the param `tracking.registered_model`.
Resumed, such a sweep must find and register its champion under that name, not a second model named after the data,
unless the user sets tracking.registered_model. Stores are fabricated as the old version left them; the slow test
runs a real sweep, removes its registration (as a sweep cut between selection and registration) and resumes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from sweeps.config import load_sweep_config
from sweeps.config_defaults import with_defaults
from sweeps.integrations.mlflow import existing
from tests.paths import ROOT

OLD = "calibrated-classifier"  # the default name before it followed the data
NEW = "calibrated-mnist1d"  # today's default for the demo data


def _cfg(d: Path, *sets: str):
    base = [f"tracking.uri=sqlite:///{d}/mlflow.db", f"storage_path={d}/ray_results", "name=old"]
    return with_defaults(load_sweep_config(None, [*base, *sets]), cluster=False, workdir=d)


def _old_sweep(d: Path, status: str, register: bool) -> str:
    """A store as the old version left a sweep 'old': its parent run with its config as params (the registered
    model's name among them), the champion's trial run, and (register) the champion registered under OLD."""
    client = MlflowClient(f"sqlite:///{d}/mlflow.db")
    exp = client.create_experiment("calib-sweeps", artifact_location=(d / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name="old", tags={"calib.sweep": "old", "calib.role": "parent"})
    client.log_param(parent.info.run_id, existing.PARAM_REGISTERED_MODEL, OLD)
    client.log_param(parent.info.run_id, "run.data.name", "mnist1d")
    trial = client.create_run(
        exp,
        tags={
            "calib.sweep": "old",
            "calib.role": "trial",
            "calib.trial_id": "t1",
            "mlflow.parentRunId": parent.info.run_id,
        },
    )
    client.set_terminated(trial.info.run_id, "FINISHED")
    client.set_tag(parent.info.run_id, "calib.champion_trial", "t1")
    client.set_tag(parent.info.run_id, "calib.champion_run", trial.info.run_id)
    if register:
        client.create_registered_model(OLD)
        mv = client.create_model_version(OLD, source=f"runs:/{trial.info.run_id}/model", run_id=trial.info.run_id)
        client.set_registered_model_alias(OLD, "champion", mv.version)
    client.set_terminated(parent.info.run_id, status)
    return parent.info.run_id


def _models(d: Path) -> list[str]:
    return sorted(m.name for m in MlflowClient(f"sqlite:///{d}/mlflow.db").search_registered_models())


def test_the_name_comes_from_the_parent_unless_the_user_sets_one(tmp_path):
    parent = SimpleNamespace(data=SimpleNamespace(params={existing.PARAM_REGISTERED_MODEL: OLD}))
    default = _cfg(tmp_path)
    assert default.tracking.registered_model == NEW and default.tracking.registered_model_is_default
    assert existing.started_registered_model(default, parent) == OLD
    assert existing.started_registered_model(default, None) == NEW  # a new sweep: named after the data
    bare = SimpleNamespace(data=SimpleNamespace(params={}))  # a parent that recorded no config
    assert existing.started_registered_model(default, bare) == NEW
    explicit = _cfg(tmp_path, "tracking.registered_model=mine")
    assert not explicit.tracking.registered_model_is_default
    assert existing.started_registered_model(explicit, parent) == "mine"
    # set to today's default name on purpose is still the user's choice
    assert existing.started_registered_model(_cfg(tmp_path, f"tracking.registered_model={NEW}"), parent) == NEW
    # the Python API's resolve(SweepConfig) keeps "left unset" (it re-validates a dump of the config)
    from sweeps.api import resolve

    assert resolve(default, workdir=tmp_path).tracking.registered_model_is_default
    assert not resolve(explicit, workdir=tmp_path).tracking.registered_model_is_default


def test_resume_of_a_finished_old_sweep_finds_its_champion_under_the_old_name(tmp_path):
    _old_sweep(tmp_path, "FINISHED", register=True)
    line = existing.check_store(_cfg(tmp_path), resume=True)
    assert line is not None and f"registered as {OLD} version 1 (alias champion); nothing to resume" in line
    # the user's own name: the champion is not registered there yet, so the resume goes on and registers it there
    assert existing.check_store(_cfg(tmp_path, "tracking.registered_model=mine"), resume=True) is None


def test_the_cli_resume_of_a_finished_old_sweep_changes_nothing(tmp_path):
    _old_sweep(tmp_path, "FINISHED", register=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "sweeps" / "launch.py"), "--resume", "--name", "old"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"registered as {OLD} version 1 (alias champion); nothing to resume" in proc.stdout, proc.stdout
    assert _models(tmp_path) == [OLD]  # no calibrated-mnist1d beside it
    assert not (tmp_path / "ray_results").exists()


def test_the_resumed_sweep_opens_with_the_name_it_started_with(tmp_path):
    """service_start.open_tracking (what execute registers under) reads the name off the reopened parent run."""
    from sweeps.integrations.mlflow.store import MlflowStore
    from sweeps.service_start import open_tracking

    parent_id = _old_sweep(tmp_path, "KILLED", register=False)
    cfg = _cfg(tmp_path)
    assert cfg.storage_path
    opened = open_tracking(cfg, MlflowStore(cfg.tracking.uri or ""), f"{cfg.storage_path}/old", resume=True)
    assert opened.parent_id == parent_id and opened.registered_model == OLD
    mine = _cfg(tmp_path, "tracking.registered_model=mine")
    assert open_tracking(
        mine, MlflowStore(cfg.tracking.uri or ""), f"{cfg.storage_path}/old", True
    ).registered_model == ("mine")


@pytest.mark.slow
def test_a_resumed_sweep_registers_under_the_name_it_started_with(tmp_path):
    """A real sweep started under the old default (its parent records calibrated-classifier, as the old version's
    did), cut between selection and registration (its registered model deleted), then resumed with today's default
    in force: the champion is registered as calibrated-classifier again, and no calibrated-mnist1d appears."""
    from tests.sweep_helpers import FAST, launch, store, sweep_runs

    short = ["--num-samples", "2", "--set", "resources.max_failures=0", *FAST]
    first = launch(tmp_path, "--name", "old", *short, "--set", f"tracking.registered_model={OLD}")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"Registered: models:/{OLD}@champion (version 1)" in first.stdout
    client = store(tmp_path)
    (parent,), _ = sweep_runs(client, "old")
    assert parent.data.params[existing.PARAM_REGISTERED_MODEL] == OLD
    client.delete_registered_model(OLD)  # as if the old driver died before registering its champion
    resumed = launch(tmp_path, "--resume", "--name", "old", *short)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"the champion registers as '{OLD}'" in resumed.stdout
    assert f"Registered: models:/{OLD}@champion (version 1)" in resumed.stdout, resumed.stdout[-3000:]
    assert _models(tmp_path) == [OLD]
    from sweeps.api import load_result

    result = load_result("old", workdir=tmp_path)  # read back without naming the model: found under OLD
    assert result.model_uri == f"models:/{OLD}/1"

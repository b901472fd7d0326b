"""Lineage in MLflow (issue #34 item 5): each trial's run logs its data as an MLflow dataset input, and the
registered model's default name follows the data.

A trial's checkpoint summary records its dataset's lineage (calib_core.preprocess.dataset_lineage: name, source,
a digest of the split tensors, split sizes); the driver's tracking callback logs it on the trial's run when the
trial completes. Read back through MlflowClient from a real SQLite store: name, digest, source, source type, the
split sizes in the profile, the context `train`; logged once even when the completion is delivered twice; two
datasets give two digests.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.preprocess import dataset_lineage
from tests.paths import ROOT


def _trial(tmp: Path, tid: str, lineage: dict) -> SimpleNamespace:
    from ray import tune

    from sweeps.contract import SUMMARY_FILE

    d = tmp / f"ckpt-{tid}"
    d.mkdir()
    (d / SUMMARY_FILE).write_text(json.dumps({"dataset": lineage, "status": "completed"}))
    return SimpleNamespace(
        trial_id=tid,
        config={},
        checkpoint=tune.Checkpoint.from_directory(str(d)),
        last_result={"status": "completed", "epoch": 1, "val_accuracy": 0.5, "val_ece": 0.1},
        error_file=None,
    )


@pytest.fixture
def tracked(tmp_path):
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow.store import MlflowStore
    from sweeps.integrations.mlflow.tracking import MLflowTrackingCallback

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    with contextlib.chdir(tmp_path):
        client = MlflowClient(uri)
        exp = client.create_experiment("lineage", artifact_location=(tmp_path / "mlartifacts").as_uri())
        parent = client.create_run(exp).info.run_id
    store = MlflowStore(uri)
    cb = MLflowTrackingCallback(store, exp, parent, "lineage", {}, lambda cfg: ({}, {}, {"x": 1}))
    return SimpleNamespace(dir=tmp_path, client=client, exp=exp, store=store, cb=cb)


def _complete(tracked, trial) -> str:
    rid = tracked.store.client.create_run(tracked.exp).info.run_id
    tracked.cb._runs[trial.trial_id] = rid
    with contextlib.chdir(tracked.dir):
        tracked.cb.on_trial_complete(0, [], trial)
    return rid


def test_a_trials_run_logs_its_dataset_input(tracked, tmp_path):
    data = load_dataset(DataConfig(name="mnist1d", num_samples=300), 0)
    lineage = dataset_lineage(data, {"name": "mnist1d", "num_samples": 300}, seed=0)
    trial = _trial(tmp_path, "t1", lineage)
    rid = _complete(tracked, trial)
    with contextlib.chdir(tracked.dir):
        tracked.cb._finished.discard(rid)
        tracked.cb.on_trial_complete(0, [], trial)  # delivered again (a resumed driver): logged once
    inputs = tracked.client.get_run(rid).inputs.dataset_inputs
    assert len(inputs) == 1
    ds = inputs[0].dataset
    assert ds.name == "mnist1d" and len(ds.digest) == 32 and ds.source_type == "code"
    assert json.loads(ds.source) == {"generator": "mnist1d.data.make_dataset(num_samples=300, seed=0)"}
    profile = json.loads(ds.profile)
    assert profile["splits"] == {"train": len(data.train), "val": len(data.val), "test": len(data.test)}
    assert sum(profile["splits"].values()) == 300 and profile["input_shape"] == [40]
    assert {t.key: t.value for t in inputs[0].tags} == {"mlflow.data.context": "train"}
    assert tracked.client.get_run(rid).info.status == "FINISHED"


def test_a_file_dataset_names_its_file_and_other_data_another_digest(tracked, tmp_path):
    rng = np.random.default_rng(0)
    digests = []
    for i in range(2):
        y = np.arange(120) % 3
        np.savez(tmp_path / f"f{i}.npz", x=rng.normal(size=(120, 4)) + y[:, None], y=y)
        cfg = {"name": "arrays", "path": str(tmp_path / f"f{i}.npz")}
        lineage = dataset_lineage(load_dataset(DataConfig(**cfg), 0), cfg, seed=0)
        rid = _complete(tracked, _trial(tmp_path, f"a{i}", lineage))
        ds = tracked.client.get_run(rid).inputs.dataset_inputs[0].dataset
        assert ds.name == f"arrays:f{i}.npz" and ds.source_type == "local"
        assert json.loads(ds.source) == {"uri": str(tmp_path / f"f{i}.npz")}
        digests.append(ds.digest)
    assert digests[0] != digests[1]
    # the same data and seed: the same digest
    cfg = {"name": "arrays", "path": str(tmp_path / "f0.npz")}
    assert dataset_lineage(load_dataset(DataConfig(**cfg), 0), cfg, seed=0)["digest"] == digests[0]


# ---------------------------------------------------------------------------- the registered model's default name
def test_the_registered_models_default_name_follows_the_data():
    from sweeps.config import load_sweep_config
    from sweeps.config_defaults import default_registered_model, with_defaults

    def name(*sets: str) -> str:
        return with_defaults(load_sweep_config(None, list(sets)), cluster=True).tracking.registered_model

    assert name() == "calibrated-mnist1d"
    assert name("run.data.name=digits") == "calibrated-digits"
    table = ["run.data.name=table", "run.data.path=/data/patients.csv", "run.data.label_column=y"]
    assert name(*table) == "calibrated-table-patients"
    assert name("run.data.name=image_folder", "run.data.path=/data/my pets/") == "calibrated-image_folder-my-pets"
    # set explicitly, it stays, even to the old default
    assert name("tracking.registered_model=calibrated-classifier") == "calibrated-classifier"
    assert name(*table, "tracking.registered_model=mine") == "mine"
    cfg = with_defaults(load_sweep_config(ROOT / "sweeps/configs/tabular_demo.yaml"), cluster=True)
    assert cfg.tracking.registered_model == "calibrated-breast_cancer"
    assert with_defaults(cfg, cluster=True).tracking.registered_model == "calibrated-breast_cancer"
    assert default_registered_model(cfg.run.data) == "calibrated-breast_cancer"


def test_the_sweeps_intro_says_which_registered_model_it_uses():
    from sweeps.config import load_sweep_config
    from sweeps.config_defaults import with_defaults
    from sweeps.report.summary import intro

    cfg = with_defaults(load_sweep_config(None), cluster=False, workdir="/tmp")
    assert "the champion registers as 'calibrated-mnist1d'" in intro(cfg, "/tmp/ray_results", "0" * 32, resumed=False)


# ---------------------------------------------------------------------------- the runs page (headless Chromium)
@pytest.mark.slow
def test_the_runs_page_shows_the_dataset_column(tracked, tmp_path):
    """MLflow's runs page, served from the SQLite store, in Debian's headless Chromium: the trial's run shows its
    dataset (name and digest) in the Dataset column. Saves test-artifacts/mlflow_runs_dataset.png."""
    import time

    from tests.sweep_helpers import ARTIFACTS, chromium_paths, headless_chromium, mlflow_server

    paths = chromium_paths()
    if paths is None:
        pytest.skip("Debian chromium + chromium-driver not installed")
    data = load_dataset(DataConfig(name="mnist1d", num_samples=300), 0)
    lineage = dataset_lineage(data, {"name": "mnist1d", "num_samples": 300}, seed=0)
    rid = _complete(tracked, _trial(tmp_path, "ui", lineage))
    tracked.client.set_tag(rid, "mlflow.runName", "trial-ui")
    ARTIFACTS.mkdir(exist_ok=True)
    with mlflow_server(f"sqlite:///{tmp_path.resolve()}/mlflow.db", tmp_path / "mlartifacts") as url:
        with headless_chromium(paths, "1600,1000") as driver:
            driver.get(f"{url}/#/experiments/{tracked.exp}/runs")
            deadline, text = time.time() + 90, ""
            while time.time() < deadline:
                text = driver.find_element("tag name", "body").text
                if "trial-ui" in text and "Dataset" in text and "mnist1d" in text:
                    break
                time.sleep(0.5)
            time.sleep(1)
            driver.save_screenshot(str(ARTIFACTS / "mlflow_runs_dataset.png"))
    assert "trial-ui" in text and "Dataset" in text, text[:2000]
    assert f"mnist1d ({lineage['digest'][:8]}" in text or "mnist1d" in text.split("Dataset", 1)[1], text[:2000]

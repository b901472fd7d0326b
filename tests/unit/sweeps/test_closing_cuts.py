"""The closing's cuts (issue 47 item 1) keep what they replace: the gate's record comes from the trial's checkpoint
without regenerating the data and equals the one regenerated; MLflow's pin check is off only while the champion is
logged; the rank agreement is scipy's Spearman correlation without scipy."""

from __future__ import annotations

import contextlib
import json
import warnings

import numpy as np
import pytest

from calib_core.config import RunConfig
from calib_core.data import load_dataset
from sweeps.contract import GATE_DATA_FILE, GATE_DIR, GATE_ROWS_FILE
from sweeps.decide.gate import seen_record, write_seen_record

RUN = {"data": {"name": "mnist1d", "num_samples": 300}, "model": {"name": "cnn1d"}}


def _run_config() -> dict:
    return RunConfig.model_validate(RUN).model_dump(mode="json")


def test_record_rows_logs_the_checkpoint_record_without_regenerating(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow import champion_gate
    from sweeps.integrations.mlflow.store import MlflowStore

    cfg = RunConfig.model_validate(RUN)
    seen, desc = seen_record(load_dataset(cfg.data, cfg.seed))
    ckpt = tmp_path / "ckpt"
    write_seen_record(ckpt / GATE_DIR, seen, desc)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with contextlib.chdir(tmp_path):
        client = MlflowClient(uri)
        exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
        run_id = client.create_run(exp).info.run_id
        store = MlflowStore(uri)

        def regenerated(run_config):
            raise AssertionError("the splits were regenerated")

        monkeypatch.setattr(champion_gate, "_splits", regenerated)
        got = champion_gate.record_rows(store, run_id, _run_config(), None, ckpt)
        assert got == json.loads(json.dumps(desc))
        arts = {a.path for a in client.list_artifacts(run_id, GATE_DIR)}
        assert arts == {f"{GATE_DIR}/{GATE_ROWS_FILE}", f"{GATE_DIR}/{GATE_DATA_FILE}"}
        logged = client.download_artifacts(run_id, f"{GATE_DIR}/{GATE_ROWS_FILE}", str(tmp_path))
        with np.load(logged) as z:
            assert np.array_equal(z["seen"], seen)
        # the same record as the driver regenerates (no checkpoint record)
        monkeypatch.undo()
        other = client.create_run(exp).info.run_id
        assert champion_gate.record_rows(store, other, _run_config()) == got
        again = client.download_artifacts(other, f"{GATE_DIR}/{GATE_ROWS_FILE}", str(tmp_path / "b"))
        with np.load(again) as z:
            assert np.array_equal(z["seen"], seen)


def test_pin_check_is_off_only_inside():
    import mlflow.pyfunc
    import mlflow.utils.environment

    from sweeps.integrations.mlflow.logged_model import pins_not_rechecked

    name = "warn_dependency_requirement_mismatches"
    before = [getattr(m, name) for m in (mlflow.utils.environment, mlflow.pyfunc)]
    with pins_not_rechecked():
        assert all(getattr(m, name) is not b for m, b in zip((mlflow.utils.environment, mlflow.pyfunc), before))
        assert mlflow.utils.environment.warn_dependency_requirement_mismatches(["torch==0.0.1"]) is None
    assert [getattr(m, name) for m in (mlflow.utils.environment, mlflow.pyfunc)] == before


@pytest.mark.parametrize("seed", range(30))
def test_rank_agreement_is_scipys_spearman(seed):
    from scipy.stats import spearmanr

    from sweeps.decide.selection import TrialRecord
    from sweeps.report.files import RANK_METRICS, rank_agreement

    rng = np.random.default_rng(seed)
    vals = np.round(rng.random((int(rng.integers(2, 10)), len(RANK_METRICS))), 1)  # ties
    if seed % 3 == 0:
        vals[:, 2] = 0.25  # a constant metric
    if seed % 4 == 0:
        vals[0, 4] = np.nan
    recs = [
        TrialRecord(str(i), "t", "completed", {"val_accuracy": 0.9, **dict(zip(RANK_METRICS, map(float, row)))})
        for i, row in enumerate(vals)
    ]
    table = rank_agreement(recs).to_numpy()
    for a in range(len(RANK_METRICS)):
        for b in range(len(RANK_METRICS)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = spearmanr(vals[:, a], vals[:, b]).statistic if len(vals) >= 3 else np.nan
            assert (np.isnan(want) and np.isnan(table[a, b])) or table[a, b] == pytest.approx(want, abs=1e-12)
    assert np.array_equal(np.nan_to_num(table), np.nan_to_num(table.T))

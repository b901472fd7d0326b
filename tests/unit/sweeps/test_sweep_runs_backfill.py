"""A resumed sweep logs the epochs whose queued MLflow writes died with a killed driver (fast, real SQLite store)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from sweeps.contract import ROLE_TRIAL, TAG_ROLE, TAG_SWEEP, TAG_TRIAL
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.sweep_runs import UntilTrackingStops, deliver_missed_completions
from sweeps.integrations.mlflow.tracking import MLflowTrackingCallback


def _setup(tmp_path):
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = store.ensure_experiment("backfill")
    rid = store.create_run(exp, "t", {TAG_SWEEP: "s", TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: "a0001"})
    # what reached MLflow before the kill: epochs 1 and 3 (epoch 2 was still queued), then the run finished
    for step in (1, 3):
        store.log_metrics(rid, {"epoch_time": 0.5, "val_ece": 0.1 * step}, step=step)
    store.terminate(rid, "FINISHED")
    rows = [{"epoch": e, "epoch_time": 0.5, "val_ece": 0.1 * e, "trial_id": "a0001", "done": e == 3} for e in (1, 2, 3)]
    res = SimpleNamespace(
        metrics={"trial_id": "a0001", "status": "completed", "epoch": 3},
        path=str(tmp_path / "trial_a0001"),
        error=None,
        checkpoint=None,
        config={},
        metrics_dataframe=pd.DataFrame(rows),
    )
    tracking = UntilTrackingStops(
        MLflowTrackingCallback(store, exp, "parent", "s", base_tags={}, trial_params=None), store
    )
    return store, exp, rid, res, tracking


def _history(store, rid, key):
    return sorted((m.step, round(m.value, 6)) for m in store.client.get_metric_history(rid, key))


def test_resumed_sweep_logs_the_lost_epoch_once_and_leaves_the_run_finished(tmp_path):
    store, exp, rid, res, tracking = _setup(tmp_path)
    deliver_missed_completions([res], store, exp, "s", tracking, resumed=True)
    assert _history(store, rid, "epoch_time") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    assert _history(store, rid, "val_ece") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert store.client.get_run(rid).info.status == "FINISHED"
    deliver_missed_completions([res], store, exp, "s", tracking, resumed=True)  # idempotent
    assert _history(store, rid, "val_ece") == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_a_fresh_sweep_does_not_read_back_finished_runs(tmp_path):
    store, exp, rid, res, tracking = _setup(tmp_path)
    deliver_missed_completions([res], store, exp, "s", tracking, resumed=False)
    assert _history(store, rid, "epoch_time") == [(1, 0.5), (3, 0.5)]


def _closing(tmp_path, resumed: bool):
    """service._closed_trials on the store above, counting how often the trial runs are read."""
    from sweeps import service
    from sweeps.config import load_sweep_config

    store, exp, rid, res, tracking = _setup(tmp_path)
    reads = []
    real = store.trial_runs
    store.trial_runs = lambda *a: reads.append(a) or real(*a)  # type: ignore[method-assign]
    cfg = load_sweep_config(None, [], {"name": "s", "search.num_samples": 1})
    run = SimpleNamespace(
        cfg=cfg, store=store, opened=SimpleNamespace(experiment_id=exp, parent_id=rid, restoring=resumed)
    )
    grids = [
        type("Grid", (list,), {"num_terminated": 1, "num_errors": 0})([res])
    ]  # a ResultGrid as close_trials reads it
    records, incomplete = service._closed_trials(run, grids, tracking, interrupted=False)
    return store, rid, records, incomplete, reads


def test_the_closing_reads_the_trial_runs_once(tmp_path):
    store, rid, records, incomplete, reads = _closing(tmp_path, resumed=False)
    assert len(reads) == 1  # delivery, the records and the orphan check share one read
    assert [(r.trial_id, r.run_id) for r in records] == [("a0001", rid)] and not incomplete


def test_a_delivered_completion_is_read_again_before_the_records(tmp_path):
    store, rid, records, _, reads = _closing(tmp_path, resumed=True)  # the lost epoch 2 is replayed
    assert len(reads) == 2
    assert _history(store, rid, "epoch_time") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    assert [(r.trial_id, r.run_id) for r in records] == [("a0001", rid)]

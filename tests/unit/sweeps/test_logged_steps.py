"""A reattached trial's run says which (metric, step) pairs it has from one request (its summary's last steps),
not one request per metric: against an authenticated server each request checks the password, and 60 metrics
took a minute per reattached trial in the container tests. Checked against the runs' full histories."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from sweeps.integrations.mlflow.store import LoggedSteps, MlflowStore


@pytest.fixture()
def store(tmp_path):
    return MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _run_with_history(store: MlflowStore) -> str:
    client: MlflowClient = store.client
    exp = client.create_experiment("e")
    rid = client.create_run(exp).info.run_id
    for epoch in range(4):  # per-epoch metrics, then a crash after half of epoch 4's batch
        store.log_metrics(rid, {"val_ece": 0.1 / (epoch + 1), "epoch_time": 1.0, "train_loss": 2.0 - epoch}, step=epoch)
    store.log_metrics(rid, {"val_ece": 0.02}, step=4)
    return rid


def test_the_runs_last_steps_say_which_pairs_it_has_as_its_histories_do(store, monkeypatch):
    rid = _run_with_history(store)
    history = {
        (k, m.step) for k in ("val_ece", "epoch_time", "train_loss") for m in store.client.get_metric_history(rid, k)
    }
    asked: list[str] = []
    real = store.client.get_metric_history
    monkeypatch.setattr(store.client, "get_metric_history", lambda *a, **k: asked.append(a[1]) or real(*a, **k))
    for run in (store.client.get_run(rid), store.client.search_runs([store.client.get_run(rid).info.experiment_id])[0]):
        asked.clear()
        logged = store.logged_steps(run)
        assert asked == ["epoch_time"]  # the epochs' steps (no gap), not every metric's history
        for key in ("val_ece", "epoch_time", "train_loss", "test_ece"):
            for step in range(6):
                assert ((key, step) in logged) == ((key, step) in history), (key, step)


def test_a_gap_in_the_epochs_reads_every_history(store):
    """Epoch 2's writes died with a killed driver, epochs 1 and 3 reached MLflow: (val_ece, 2) is not logged,
    although a later step is."""
    client: MlflowClient = store.client
    rid = client.create_run(client.create_experiment("g")).info.run_id
    for step in (1, 3):
        store.log_metrics(rid, {"epoch_time": 0.5, "val_ece": 0.1 * step}, step=step)
    logged = store.logged_steps(client.get_run(rid))
    assert ("val_ece", 1) in logged and ("val_ece", 3) in logged and ("val_ece", 2) not in logged


def test_without_the_summarys_steps_every_history_is_read(store, monkeypatch):
    rid = _run_with_history(store)
    run = store.client.get_run(rid)
    monkeypatch.setattr(run.data, "_metric_objs", None, raising=False)  # as an MLflow without it
    logged = store.logged_steps(run)
    assert ("train_loss", 3) in logged and ("val_ece", 4) in logged and ("train_loss", 4) not in logged


def test_pairs_logged_since_are_remembered():
    seen = LoggedSteps({"a": 2})
    assert ("a", 2) in seen and ("a", 3) not in seen and ("b", 0) not in seen
    seen.update([("a", 3), ("b", 0)])
    assert ("a", 3) in seen and ("b", 0) in seen and ("b", 1) not in seen

"""ASHA in the sweep, without starting Ray: what the trainable reports, what the scheduler
decides on it, and how a trial the scheduler stops early is recorded (MLflow, progress line,
selection). The end-to-end runs are in tests/e2e/test_sweep_configs_e2e.py (slow)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from calib_core.config import RunConfig
from sweeps.config import SearchConfig, SelectionConfig, load_sweep_config
from sweeps.contract import (
    FINAL_FILE,
    METRIC_NAMES,
    MODEL_FILE,
    PREDICTIONS_FILE,
    STATE_FILE,
    STOPPED_EARLY,
    SUMMARY_FILE,
    TAG_REASON,
    TAG_STATUS,
    TAG_STOP_REASON,
)
from sweeps.decide.selection import TrialRecord, select
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.tracking import MLflowTrackingCallback
from sweeps.integrations.ray import trainable
from sweeps.integrations.ray.progress import ProgressCallback
from tests.paths import ROOT

DIGITS = ROOT / "sweeps" / "configs" / "digits_demo.yaml"
EPOCHS = 3


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[tuple[dict, Path | None]]:
    """Every (result, checkpoint copy) one digits trial reports to Tune, run outside Tune."""
    cfg = load_sweep_config(DIGITS, [f"run.train.epochs={EPOCHS}"])
    out = tmp_path_factory.mktemp("reports")
    got: list[tuple[dict, Path | None]] = []

    def report(metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:  # the trainable deletes its directory after reporting
            kept = out / f"ckpt_{len(got)}"
            shutil.copytree(checkpoint.path, kept)
        got.append((dict(metrics), kept))

    mp = pytest.MonkeyPatch()
    mp.setattr(trainable.tune, "report", report)
    mp.setattr(trainable.tune, "get_checkpoint", lambda: None)
    mp.setattr(trainable, "_trial_resources", lambda: (1.0, 0.0))
    mp.setattr(trainable, "_node_id", lambda: "local")
    try:
        trainable.train_trial(
            {"calibrator": "temperature", "calibrator_lr": 0.01},
            base=cfg.run.model_dump(mode="json"),
            evaluation=cfg.evaluation,
        )
    finally:
        mp.undo()
    return got


def test_last_epoch_is_reported_once_by_the_final_report(reports):
    results = [r for r, _ in reports]
    assert [r["epoch"] for r in results] == list(range(1, EPOCHS + 1))
    assert [r["done"] for r in results] == [False] * (EPOCHS - 1) + [True]
    final, ckpt = reports[-1]
    assert final["status"] == "completed"
    for key in ("val_ece", "val_accuracy", "test_ece", "test_accuracy", "train_loss", "epoch_time", "wall_time"):
        assert key in final, key
    assert {p.name for p in ckpt.iterdir()} >= {MODEL_FILE, PREDICTIONS_FILE, SUMMARY_FILE, FINAL_FILE, STATE_FILE}
    assert all(c is not None and (c / STATE_FILE).is_file() for _, c in reports[:-1])


def test_every_reported_validation_metric_is_a_valid_search_metric(reports):
    """sweeps.contract's names are what a trial reports: each val_ metric of the final report (no
    shift or OOD here) may be searched, and every per-epoch and debiased name is reported. The conformal
    measures (val_cp_*: coverage has a target, not a direction) are for the smallest_sets rule, not the search."""
    final, _ = reports[-1]
    reported = {k for k in final if k.startswith("val_") and not k.startswith("val_cp_")}
    for key in reported:
        assert SearchConfig(objective="single", metric=key).metric == key
    expected = {f"val_{m}" for m in METRIC_NAMES if not m.startswith(("shift_", "ood_"))}
    assert expected <= reported
    assert all(set(r) >= expected for r, _ in reports[:-1])  # Tune and Optuna need every key in every result


def test_asha_never_stops_the_trial_before_its_final_report(reports):
    """Tune asks the scheduler about every result that is not done; ASHA (as the service builds
    it) must let a trial that is not below a rung cutoff reach its final report."""
    from sweeps.integrations.ray.tuner import make_scheduler as _scheduler

    cfg = load_sweep_config(DIGITS, [f"run.train.epochs={EPOCHS}", "search.grace_period=1"])
    sched = _scheduler(cfg)
    assert sched is not None
    sched.set_search_properties(cfg.search.metric, cfg.search.mode)
    trial = SimpleNamespace(trial_id="t1")
    sched.on_trial_add(None, trial)
    for result, _ in reports[:-1]:
        assert sched.on_trial_result(None, trial, result) == TrialScheduler.CONTINUE, result["epoch"]
    # Were the last epoch a separate, not-done report, ASHA would not stop it either.
    assert sched.on_trial_result(None, trial, {**reports[-1][0], "done": False}) == TrialScheduler.CONTINUE
    sched.on_trial_complete(None, trial, reports[-1][0])
    assert _scheduler(load_sweep_config(DIGITS, ["search.scheduler=none"])) is None


class MemoryClient:
    """The MlflowClient calls the tracking callback makes through its store, in memory (a SQLite store takes
    seconds to create; the slow end-to-end tests use the real one)."""

    def __init__(self) -> None:
        self.runs: dict[str, dict] = {}

    def search_runs(self, *args, **kwargs) -> list:
        return []

    def create_run(self, experiment_id, run_name=None, tags=None):
        rid = f"run{len(self.runs)}"
        self.runs[rid] = {"tags": dict(tags or {}), "metrics": {}, "status": "RUNNING"}
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, status="RUNNING"))

    def log_batch(self, run_id, metrics=(), params=()) -> None:
        for m in metrics:
            self.runs[run_id]["metrics"].setdefault(m.key, {})[m.step] = m.value

    def log_dict(self, *args) -> None:
        pass

    def set_tag(self, run_id, key, value) -> None:
        self.runs[run_id]["tags"][key] = value

    def get_run(self, run_id) -> SimpleNamespace:
        run = self.runs[run_id]
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id, status=run["status"]),
            data=SimpleNamespace(tags=dict(run["tags"]), metrics={}),
        )

    def set_terminated(self, run_id, status="FINISHED", end_time=None) -> None:
        self.runs[run_id]["status"] = status


def _trial(tid: str, calibrator: str) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=tid,
        config={"calibrator": calibrator, "calibrator_lr": 0.01},
        last_result=None,
        checkpoint=None,
        error_file=None,
        status="RUNNING",
    )


def _epoch(epoch: int, ece: float) -> dict:
    return {"val_accuracy": 0.9, "val_ece": ece, "epoch": epoch, "done": False, "train_loss": 0.5, "epoch_time": 0.1}


def test_scheduler_stop_is_recorded_as_stopped_early_not_as_failure(capsys):
    client = MemoryClient()
    cb = MLflowTrackingCallback(
        MlflowStore("sqlite:///unused.db", client=client),
        "0",
        "parent",
        "asha-unit",
        base_tags={},
        trial_params=lambda c: ({"x": 1}, {"calib.label": str(c)}, RunConfig().model_dump(mode="json")),
        scheduler="ASHA",
    )
    progress = ProgressCallback(2, SelectionConfig(rule="min_metric", metric="val_ece"))
    stopped, completed = _trial("stop1", "matrix"), _trial("done1", "temperature")
    for t in (stopped, completed):
        cb.on_trial_start(0, [], t)

    # ASHA stops `stopped` at epoch 2: Tune sets done=True on that per-epoch result.
    for epoch in (1, 2):
        result = _epoch(epoch, 0.01)
        if epoch == 2:
            result["done"] = True
        cb.on_trial_result(0, [], stopped, result)
        stopped.last_result = result
    assert stopped.last_result["status"] == STOPPED_EARLY
    assert stopped.last_result["reason"] == "stopped early by ASHA at epoch 2"
    stopped.status = "TERMINATED"
    cb.on_trial_complete(0, [], stopped)
    progress.on_trial_complete(0, [stopped, completed], stopped)

    # `completed` trains 3 epochs; the third is its final report.
    for epoch in (1, 2):
        cb.on_trial_result(0, [], completed, _epoch(epoch, 0.2))
    final = {
        **_epoch(3, 0.1),
        "done": True,
        "status": "completed",
        "reason": "",
        "test_ece": 0.12,
        "test_accuracy": 0.88,
        "wall_time": 1.0,
    }
    cb.on_trial_result(0, [], completed, final)
    completed.last_result, completed.status = final, "TERMINATED"
    cb.on_trial_complete(0, [], completed)
    progress.on_trial_complete(0, [stopped, completed], completed)

    runs = {r["tags"]["calib.trial_id"]: r for r in client.runs.values()}
    s, c = runs["stop1"], runs["done1"]
    assert s["status"] == "FINISHED"
    assert s["tags"][TAG_STATUS] == STOPPED_EARLY
    assert s["tags"][TAG_STOP_REASON] == "stopped early by ASHA at epoch 2"
    assert TAG_REASON not in s["tags"] and "test_ece" not in s["metrics"]
    assert sorted(s["metrics"]["val_ece"]) == [1, 2]
    assert c["status"] == "FINISHED" and c["tags"][TAG_STATUS] == "completed"
    assert sorted(c["metrics"]["epoch_time"]) == [1, 2, 3]
    assert c["metrics"]["val_ece"][3] == pytest.approx(0.1) and c["metrics"]["test_ece"][3] == pytest.approx(0.12)

    lines = capsys.readouterr().out.splitlines()
    assert "matrix lr=1.0e-02: stopped early by ASHA at epoch 2; no completed trial yet" in lines[0]
    assert "best so far: temperature" in lines[1]

    # Selection sees only completed trials, even when a stopped one has the lower val ECE.
    records = [
        TrialRecord(
            trial_id=t.trial_id,
            label=t.trial_id,
            status=t.last_result["status"],
            metrics={k: v for k, v in t.last_result.items() if k.startswith(("val_", "test_"))},
        )
        for t in (stopped, completed)
    ]
    best, _ = select(records, SelectionConfig(rule="min_metric", metric="val_ece"))
    assert best.trial_id == "done1"


def test_every_shipped_config_dry_runs(tmp_path, monkeypatch, capsys):
    """The CIFAR configs need their data (and GPUs): they are checked with --dry-run only."""
    from sweeps.cli import main

    monkeypatch.chdir(tmp_path)
    for path in sorted((ROOT / "sweeps" / "configs").glob("*.yaml")):
        assert main(["--config", str(path), "--dry-run"]) == 0, path
        out = capsys.readouterr().out
        cfg = load_sweep_config(path)
        assert f"name: {cfg.name}" in out and f"scheduler {cfg.search.scheduler}" in out, path
        assert f"epochs per trial: {cfg.run.train.epochs}" in out, path
    assert list(tmp_path.iterdir()) == []

"""Every shipped config that runs locally and every objective/scheduler combination, end to end:
exit 0 and a registered champion. (The CIFAR configs need their data and GPUs: they are
checked with --dry-run in tests/unit/sweeps/test_sweep_asha.py.)"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.sweep_helpers import FAST, ROOT, launch, store, sweep_runs

pytestmark = pytest.mark.slow
CONFIGS = ROOT / "sweeps" / "configs"
MODEL = "calibrated-mnist1d"  # the default name follows the data (digits: calibrated-digits)
STOP_REASON = re.compile(r"^stopped early by ASHA at epoch (\d+)$")


def _check_sweep(cwd: Path, proc, sweep: str, n: int, epochs: int, model: str = MODEL) -> dict[str, list]:
    """Exit 0, one FINISHED parent, n children each completed (test metrics, one epoch_time per
    epoch) or stopped early by ASHA (a reason, no test metrics), the champion a completed trial
    registered as `champion`, and the leaderboard saying the same. Returns children by status."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"Registered: models:/{model}@champion" in proc.stdout
    client = store(cwd)
    parents, children = sweep_runs(client, sweep)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == n
    by_status: dict[str, list] = {}
    for run in children:
        tags, status = run.data.tags, run.data.tags.get("calib.status")
        by_status.setdefault(status, []).append(run)
        assert run.info.status == "FINISHED", tags
        assert "calib.failure_reason" not in tags, tags
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch_time"))
        if status == "completed":
            assert "test_ece" in run.data.metrics and "val_ece" in run.data.metrics
            assert steps == list(range(1, epochs + 1))
        else:
            assert status == "stopped_early", tags
            stopped_at = int(STOP_REASON.match(tags["calib.stop_reason"]).group(1))
            assert 1 <= stopped_at < epochs
            assert steps == list(range(1, stopped_at + 1))
            assert "test_ece" not in run.data.metrics
    champion_trial = parents[0].data.tags["calib.champion_trial"]
    champion = [r for r in children if r.data.tags["calib.trial_id"] == champion_trial][0]
    assert champion.data.tags["calib.status"] == "completed"
    mv = client.get_model_version_by_alias(model, "champion")
    assert mv.tags.get("source_run_id") == champion.info.run_id
    path = client.download_artifacts(parents[0].info.run_id, "sweep/leaderboard.csv", str(cwd))
    with open(path) as f:
        board = {row["trial_id"]: row["status"] for row in csv.DictReader(f)}
    # a row per trial as trained, and one per completed trial with temperature scaling on top ("<id>+ts")
    trained = {k: v for k, v in board.items() if not k.endswith("+ts")}
    assert trained == {r.data.tags["calib.trial_id"]: r.data.tags["calib.status"] for r in children}
    on_top = {k.removesuffix("+ts") for k in board if k.endswith("+ts")}
    assert on_top == {k for k, v in trained.items() if v == "completed"}
    return by_status


def test_readme_digits_command_registers_a_champion(tmp_path):
    """README: `python sweeps/launch.py --config sweeps/configs/digits_demo.yaml --seed 3`
    (single objective val_ece with ASHA), with fewer epochs and trials."""
    proc = launch(
        tmp_path,
        "--config",
        str(CONFIGS / "digits_demo.yaml"),
        "--seed",
        "3",
        "--set",
        "run.train.epochs=6",
        "--num-samples",
        "6",
    )
    by_status = _check_sweep(tmp_path, proc, "digits-demo", n=6, epochs=6, model="calibrated-digits")
    assert by_status.get("completed")
    assert "stopped early by ASHA at epoch" in proc.stdout or not by_status.get("stopped_early")


def test_mnist1d_demo_config_multi_objective(tmp_path):
    proc = launch(tmp_path, "--config", str(CONFIGS / "mnist1d_demo.yaml"), "--num-samples", "3", *FAST)
    by_status = _check_sweep(tmp_path, proc, "mnist1d-demo", n=3, epochs=2)
    assert len(by_status["completed"]) == 3


def test_single_objective_without_scheduler(tmp_path):
    proc = launch(
        tmp_path,
        "--num-samples",
        "3",
        "--name",
        "single",
        *FAST,
        "--set",
        "search.objective=single",
        "--set",
        "search.metric=val_nll",
        "--set",
        "selection.rule=min_metric",
        "--set",
        "selection.metric=val_nll",
    )
    by_status = _check_sweep(tmp_path, proc, "single", n=3, epochs=2)
    assert len(by_status["completed"]) == 3
    parents, children = sweep_runs(store(tmp_path), "single")
    best = min(children, key=lambda r: r.data.metrics["val_nll"])
    assert parents[0].data.tags["calib.champion_trial"] == best.data.tags["calib.trial_id"]


def test_single_objective_with_asha_completes_some_and_stops_some(tmp_path):
    # One trial at a time: ASHA's rung decisions, and so this outcome, are deterministic.
    proc = launch(
        tmp_path,
        "--num-samples",
        "5",
        "--name",
        "asha",
        "--max-concurrent",
        "1",
        "--set",
        "run.data.num_samples=1200",
        "--set",
        "run.train.epochs=3",
        "--set",
        "run.train.batch_size=64",
        "--set",
        "search.objective=single",
        "--set",
        "search.metric=val_ece",
        "--set",
        "search.scheduler=asha",
        "--set",
        "search.grace_period=1",
        "--set",
        "selection.rule=min_metric",
        "--set",
        "selection.metric=val_ece",
    )
    by_status = _check_sweep(tmp_path, proc, "asha", n=5, epochs=3)
    assert by_status.get("completed") and by_status.get("stopped_early"), {k: len(v) for k, v in by_status.items()}
    assert "stopped early by ASHA at epoch 1" in proc.stdout  # the progress line
    parents, _ = sweep_runs(store(tmp_path), "asha")
    # the candidates: each completed trial as trained (val_ece) and + TS (ts_val_ece, on the same run)
    best = min(
        by_status["completed"],
        key=lambda r: min(r.data.metrics["val_ece"], r.data.metrics.get("ts_val_ece", float("inf"))),
    )
    assert parents[0].data.tags["calib.champion_trial"] == best.data.tags["calib.trial_id"]

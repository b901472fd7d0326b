"""Fault injection: killed trials retry from checkpoints, a killed driver resumes, divergence fails cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.paths import TESTS
from tests.sweep_helpers import LAUNCH, launch, store, store_ready, sweep_runs

pytestmark = pytest.mark.slow
PLUGINS_DIR = TESTS / "plugins"


def _steps(client, run_id, key="epoch_time"):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_killed_trial_retries_from_checkpoint_into_the_same_run(tmp_path):
    marker = tmp_path / "killed.marker"
    proc = launch(
        tmp_path,
        "--num-samples",
        "2",
        "--name",
        "kill",
        "--max-concurrent",
        "2",
        "--set",
        "run.data.num_samples=1200",
        "--set",
        "run.train.epochs=4",
        "--set",
        "search.calibrators=[temperature]",
        env={
            "CALIB_SWEEP_FAULT_KILL_EPOCH": "2",
            "CALIB_SWEEP_FAULT_MARKER": str(marker),
            "CALIB_PLUGINS": "fault_kill",  # tests/plugins/fault_kill.py, behind calib_core.plugins.on_epoch_end
            "PYTHONPATH": str(PLUGINS_DIR),
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert marker.exists(), "the fault was never injected"
    # what a person reads: one line for the retry (which trial, why, from where), nothing of Ray's or Tune's about it
    retried = [ln for ln in proc.stdout.splitlines() if re.search(r" failed (after epoch \d+|before its first)", ln)]
    assert len(retried) == 1, proc.stdout[-3000:]
    assert (
        ": its worker process ended without a word (killed, or crashed); it retries from its last checkpoint "
        in (retried[0])
    ), retried
    assert "A worker died or was killed" not in proc.stdout, proc.stdout[-3000:]
    assert "Trial task failed" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    client = store(tmp_path)
    parents, children = sweep_runs(client, "kill")
    assert len(parents) == 1 and len(children) == 2
    for run in children:
        assert run.info.status == "FINISHED"
        assert _steps(client, run.info.run_id) == [1, 2, 3, 4]
        assert _steps(client, run.info.run_id, "val_ece") == [1, 2, 3, 4]
    # The retry restored from the epoch-2 checkpoint rather than starting over: in Tune's record of each trial's
    # reports no epoch repeats (a restart from scratch would report epochs 1 and 2 again), and the killed trial's
    # first report after the restore is epoch 3 with one iteration since the restore.
    records = _tune_records(tmp_path / "ray_results" / "kill")
    assert len(records) == 2, records
    for reports in records.values():
        epochs = [r["epoch"] for r in reports]
        assert epochs == sorted(set(epochs)) and epochs[-1] == 4, epochs
    restored = [
        r for reports in records.values() for r in reports if r["iterations_since_restore"] < r["training_iteration"]
    ]
    assert restored and restored[0]["epoch"] == 3 and restored[0]["iterations_since_restore"] == 1, restored


def _tune_records(experiment) -> dict[str, list[dict]]:
    """Each trial's reports as Ray Tune recorded them (its result.json, one JSON object a line)."""
    import json

    out = {}
    for path in experiment.glob("*/result.json"):
        lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        out[path.parent.name] = [
            {k: r.get(k) for k in ("epoch", "iterations_since_restore", "training_iteration")} for r in lines
        ]
    return out


def test_killed_driver_then_resume_completes_without_duplicates(tmp_path):
    # Calibrators and learning rates that cannot diverge, so every trial must end FINISHED.
    args = [
        "--num-samples",
        "4",
        "--name",
        "resume",
        "--max-concurrent",
        "1",
        "--set",
        "run.data.num_samples=1200",
        "--set",
        "run.train.epochs=3",
        "--set",
        "search.calibrators=[temperature,vector]",
        "--set",
        "search.calibrator_lr.high=0.01",
    ]
    driver = subprocess.Popen(
        [sys.executable, str(LAUNCH), *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    finished_before: dict[str, int] = {}
    deadline = time.time() + 400
    try:
        while time.time() < deadline:
            time.sleep(2)
            if store_ready(tmp_path):
                try:
                    _, children = sweep_runs(store(tmp_path), "resume")
                except Exception:
                    continue
                done = [r for r in children if r.info.status == "FINISHED"]
                if done:
                    finished_before = {r.data.tags["calib.trial_id"]: r.info.end_time for r in done}
                    break
            assert driver.poll() is None, "driver ended before it could be killed"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the local Ray it started
        driver.wait()
    assert finished_before, "no trial finished in time"
    # the SIGKILLed driver's own Ray processes are stopped by the resumed run (integrations/ray/session.py: the session
    # it recorded under the storage path); `ray stop --force` would kill every Ray cluster on the machine

    proc = launch(tmp_path, *args, "--resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = store(tmp_path)
    parents, children = sweep_runs(client, "resume")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4
    assert len({r.data.tags["calib.trial_id"] for r in children}) == 4
    for run in children:
        assert run.info.status == "FINISHED", (run.data.tags.get("calib.failure_reason"), proc.stdout[-4000:])
        assert _steps(client, run.info.run_id) == [1, 2, 3]
        tid = run.data.tags["calib.trial_id"]
        if tid in finished_before:  # finished trials were not run again
            assert run.info.end_time == finished_before[tid]


def test_interrupted_sweep_leaves_no_run_running(tmp_path):
    args = [
        "--num-samples",
        "4",
        "--name",
        "interrupt",
        "--max-concurrent",
        "1",
        "--set",
        "run.data.num_samples=1200",
        "--set",
        "run.train.epochs=6",
    ]
    driver = subprocess.Popen(
        [sys.executable, str(LAUNCH), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # the driver's output is read as it comes (a full pipe would stall it on a loaded machine)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(driver.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 600
    started = False
    while time.time() < deadline and not started:
        time.sleep(1)
        assert driver.poll() is None, "".join(lines)[-3000:]
        if store_ready(tmp_path):
            try:
                started = bool(sweep_runs(store(tmp_path), "interrupt")[1])
            except Exception:
                continue
    assert started, "no trial started in time:\n" + "".join(lines)[-3000:]
    driver.send_signal(signal.SIGINT)  # what Ctrl+C sends
    driver.wait(timeout=300)
    reader.join(timeout=30)
    out = "".join(lines)
    assert driver.returncode != 0, out[-2000:]
    parents, children = sweep_runs(store(tmp_path), "interrupt")
    assert parents[0].info.status == "KILLED"
    assert children and all(r.info.status in ("KILLED", "FINISHED") for r in children)
    assert "--resume" in out


def test_diverging_trial_fails_with_reason_while_sweep_completes(tmp_path):
    proc = launch(
        tmp_path,
        "--num-samples",
        "4",
        "--name",
        "diverge",
        "--seed",
        "1",
        "--set",
        "run.data.num_samples=1200",
        "--set",
        "run.train.epochs=2",
        "--set",
        "search.calibrators=[none,temperature]",
        "--set",
        "search.calibrator_lr.low=1.0e6",
        "--set",
        "search.calibrator_lr.high=1.0e7",
        "--set",
        "run.train.calibrator_optimizer=sgd",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, children = sweep_runs(store(tmp_path), "diverge")
    assert len(children) == 4
    by_kind = {}
    for run in children:
        by_kind.setdefault(run.data.tags["calib.calibrator"], []).append(run)
    assert by_kind.get("temperature") and by_kind.get("none"), "seed 1 should sample both kinds"
    for run in by_kind["temperature"]:
        assert run.info.status == "FAILED"
        assert "diverged" in run.data.tags["calib.failure_reason"]
    for run in by_kind["none"]:
        assert run.info.status == "FINISHED"

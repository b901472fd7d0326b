"""No orphans: SIGTERM behaves as Ctrl+C, and a SIGKILLed driver's Ray processes are stopped by the next run.

Each test starts its driver in a new session (process group) and stops only that group and the
processes of the Ray session the driver recorded (sweeps/integrations/ray/session.py), never other Ray clusters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.integrations.ray.session import SESSIONS_DIR, session_processes, stop_processes
from tests.sweep_helpers import LAUNCH, launch, store, store_ready, sweep_runs

pytestmark = pytest.mark.slow

ARGS = [
    "--num-samples",
    "3",
    "--max-concurrent",
    "1",
    "--set",
    "run.data.num_samples=1200",
    "--set",
    "run.train.epochs=6",
    "--set",
    "run.train.batch_size=64",
]


def _start(tmp_path: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), *ARGS, "--name", name],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_trial(tmp_path: Path, name: str, driver: subprocess.Popen) -> dict:
    """Once a trial run exists: the driver's Ray session record."""
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(1)
        assert driver.poll() is None, driver.stdout.read()[-3000:] if driver.stdout else ""
        records = list((tmp_path / "ray_results" / SESSIONS_DIR).glob(f"{driver.pid}.json"))
        if not records or not store_ready(tmp_path):
            continue
        try:
            if sweep_runs(store(tmp_path), name)[1]:
                return json.loads(records[0].read_text())
        except Exception:
            continue
    raise AssertionError("no trial started in time")


def _cleanup(driver: subprocess.Popen, record: dict | None) -> None:
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait(timeout=30)
    if record:
        stop_processes(session_processes(record["session_dir"], record.get("raylet_pids")), grace_s=2)


def _left(record: dict, wait_s: float) -> list[int]:
    deadline = time.time() + wait_s
    left = session_processes(record["session_dir"], record.get("raylet_pids"))
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = session_processes(record["session_dir"], record.get("raylet_pids"))
    return left


def test_sigterm_stops_like_ctrl_c_and_leaves_nothing_running(tmp_path):
    driver, record = _start(tmp_path, "term"), None
    try:
        record = _wait_for_trial(tmp_path, "term", driver)
        assert session_processes(record["session_dir"], record["raylet_pids"]), "the sweep's Ray is not found"
        t0 = time.time()
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=300)
        print(f"driver exited {time.time() - t0:.1f}s after SIGTERM, code {driver.returncode}\n{out[-1500:]}")
        assert driver.returncode != 0, out[-3000:]
        assert "--resume" in out
        parents, children = sweep_runs(store(tmp_path), "term")
        assert parents[0].info.status == "KILLED"
        assert children and all(r.info.status in ("KILLED", "FINISHED") for r in children)
        assert _left(record, 10) == []
        assert not (tmp_path / "ray_results" / SESSIONS_DIR / f"{record['driver_pid']}.json").exists()
        # --resume finishes the sweep, and every completed trial's run has its reliability diagrams, the
        # trials that finished while the driver was stopping included
        proc = launch(tmp_path, *ARGS, "--name", "term", "--resume", timeout=900)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        client = store(tmp_path)
        parents, children = sweep_runs(client, "term")
        assert parents[0].info.status == "FINISHED"
        completed = [r for r in children if r.data.tags.get("calib.status") == "completed"]
        assert completed
        for run in completed:
            names = {a.path for a in client.list_artifacts(run.info.run_id, "diagrams")}
            assert {"diagrams/reliability_val.png", "diagrams/reliability_test.png"} <= names, (run.info.run_id, names)
    finally:
        _cleanup(driver, record)


def _wait_for_a_finished_trial(tmp_path: Path, name: str, driver: subprocess.Popen) -> None:
    deadline = time.time() + 600
    while time.time() < deadline:
        time.sleep(0.5)
        assert driver.poll() is None, driver.stdout.read()[-3000:] if driver.stdout else ""
        try:
            if any(r.info.status == "FINISHED" for r in sweep_runs(store(tmp_path), name)[1]):
                return
        except Exception:
            continue
    raise AssertionError("no trial finished in time")


@pytest.mark.parametrize("when", ["a trial started", "a trial finished"])
def test_sigkilled_driver_leftovers_are_stopped_by_the_next_run(tmp_path, when):
    driver, record = _start(tmp_path, "killed"), None
    try:
        record = _wait_for_trial(tmp_path, "killed", driver)
        if when == "a trial finished":
            _wait_for_a_finished_trial(tmp_path, "killed", driver)
        os.kill(driver.pid, signal.SIGKILL)  # the driver only, not its children: it cannot clean up
        driver.wait(timeout=30)
        time.sleep(1)
        # Ray's fate sharing (the raylet and GCS die with the driver, workers with the raylet) often
        # stops everything within seconds, but not always (2 of the session's processes were left
        # 5 s after the kill in one run, none in another): whatever is left when the next run
        # starts is stopped by it, with one line
        left = session_processes(record["session_dir"], record["raylet_pids"])
        print(
            f"left 1 s after SIGKILL: {len(left)} processes",
            [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left if Path(f"/proc/{p}").exists()],
        )
        proc = launch(tmp_path, *ARGS, "--name", "killed", "--resume", timeout=900)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        stopped = [line for line in out.splitlines() if "leftover Ray processes" in line]
        print("\n".join(["the next run said:", *stopped]))
        assert len(stopped) <= 1 and all(record["session_dir"] in line for line in stopped), out[-3000:]
        assert not (tmp_path / "ray_results" / SESSIONS_DIR / f"{record['driver_pid']}.json").exists()
        assert _left(record, 10) == []
        parents, children = sweep_runs(store(tmp_path), "killed")
        assert parents[0].info.status == "FINISHED"
        assert len(children) >= 3 and all(r.info.status in ("FINISHED", "FAILED") for r in children)
    finally:
        _cleanup(driver, record)

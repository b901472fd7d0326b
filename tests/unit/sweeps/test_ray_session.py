"""sweeps/integrations/ray/session.py with stand-in processes (fast): only a dead driver's recorded session
is stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sweeps.integrations.ray.session import SESSIONS_DIR, _start_time, reap_stale, session_processes

SLEEP = "import time, sys; time.sleep(120)"


def _spawn(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLEEP, *argv], start_new_session=True)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_reap_stops_only_the_dead_drivers_session(tmp_path):
    ours = str(tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_1")
    other = str(tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_2")
    mine, foreign = _spawn(f"--session-dir={ours}"), _spawn(f"--session-dir={other}")
    try:
        time.sleep(0.5)
        folder = tmp_path / "ray_results" / SESSIONS_DIR
        folder.mkdir(parents=True)
        dead = _dead_pid()
        (folder / f"{dead}.json").write_text(
            json.dumps({"driver_pid": dead, "driver_start": "1", "session_dir": ours, "raylet_pids": []})
        )
        live = {
            "driver_pid": os.getpid(),
            "driver_start": _start_time(os.getpid()),
            "session_dir": other,
            "raylet_pids": [],
        }
        (folder / f"{os.getpid()}.json").write_text(json.dumps(live))
        assert session_processes(ours) == [mine.pid]
        lines: list[str] = []
        stopped = reap_stale(str(tmp_path / "ray_results"), say=lines.append)
        assert stopped == [mine.pid]
        assert mine.wait(timeout=10) is not None
        assert foreign.poll() is None  # another (live) driver's session is untouched
        assert len(lines) == 1 and ours in lines[0] and str(mine.pid) in lines[0]
        assert not (folder / f"{dead}.json").exists() and (folder / f"{os.getpid()}.json").exists()
        assert reap_stale(str(tmp_path / "ray_results"), say=lines.append) == [] and len(lines) == 1
    finally:
        for p in (mine, foreign):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_remote_storage_is_left_alone(tmp_path):
    assert reap_stale("s3://bucket/ray_results") == []


def test_a_process_logging_into_the_session_folder_belongs_to_it(tmp_path):
    """An agent whose command line and environment carry no marker (a SIGKILLed driver's leftovers seen 3
    times in 6) is still found: Ray points its stdout/stderr into <session>/logs."""
    ours = tmp_path / "ray" / "session_2026-01-01_00-00-00_000000_3"
    (ours / "logs").mkdir(parents=True)
    other = tmp_path / "elsewhere"
    other.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_RAYLET_PID"}
    with open(ours / "logs" / "agent.out", "wb") as out, open(other / "x.out", "wb") as elsewhere:
        agent = subprocess.Popen([sys.executable, "-c", SLEEP], stdout=out, stderr=out, env=env, start_new_session=True)
        bystander = subprocess.Popen(
            [sys.executable, "-c", SLEEP], stdout=elsewhere, stderr=elsewhere, env=env, start_new_session=True
        )
    try:
        time.sleep(0.3)
        found = session_processes(str(ours))
        assert agent.pid in found and bystander.pid not in found
    finally:
        for p in (agent, bystander):
            p.kill()
            p.wait()

"""Ctrl+C and SIGTERM at every point of start-up (issue 47 item 2): exit 130, nothing left RUNNING, no Ray process
of the sweep left, the `--resume` hint where there is something to resume, and `--resume` takes what is left.

Before the fix a Ctrl+C 1 to 5 s into `launch.py` (imports, checks, Ray's start, the stores) was lost when the
sweep had inherited SIGINT ignored (started in the background of a shell script), and a SIGTERM before the
trials ended the driver outright (exit -15, or 15 from Ray's own handler, runs RUNNING).

The signal is sent when the driver's trace (CALIB_STARTUP_TRACE, sweeps/start_steps.py) says the step has begun,
not after a sleep: each case stops at the step it names or, when that step ends first, at one of the next ones
(the trace says where the signal landed; the test prints it). The cases share one working directory and its
stores, each its own sweep name (the last a `--resume` of an earlier one). Each stops during start-up, so each
costs its start-up (seconds on an idle machine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.integrations.ray.session import SESSIONS_DIR, session_processes, stop_processes
from sweeps.start_steps import STEP_NAMES, TRACE_ENV
from tests.e2e.test_sweep_stops_group import group_members
from tests.sweep_helpers import LAUNCH, store, store_ready, sweep_runs

pytestmark = pytest.mark.slow

ARGS = ["--num-samples", "2", "--set", "run.train.epochs=2", "--set", "run.data.num_samples=1200"]
BEFORE_THE_PARENT_RUN = ("imports", "config", "checks", "lock")  # a stop there writes nothing

# (step the signal follows, signal, sweep name, extra flags, SIGINT inherited ignored)
CASES = [
    ("imports", signal.SIGINT, "s-imports", (), True),  # the lost Ctrl+C: a script's background job
    ("checks", signal.SIGINT, "s-checks", (), False),
    ("ray_start", signal.SIGINT, "s-ray", (), False),
    ("ray_start", signal.SIGTERM, "s-ray-term", (), False),
    ("study", signal.SIGINT, "s-study", (), False),
    ("tuner", signal.SIGINT, "s-study", ("--resume",), False),  # the sweep stopped above, continued and stopped
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stops_startup")


def _events(trace: Path) -> list[list[str]]:
    try:
        return [line.split()[1:] for line in trace.read_text().splitlines()]
    except OSError:
        return []


def _children(cwd: Path, name: str) -> list:
    if not store_ready(cwd):
        return []
    try:
        return sweep_runs(store(cwd), name)[1]
    except Exception:  # noqa: BLE001 - the store is being written: asked again
        return []


def _stop_at(cwd: Path, step: str, signum: int, name: str, extra: tuple[str, ...], ignored: bool) -> tuple:
    """Start the sweep, send `signum` to its process group once `step` has begun ("trials": once a trial's run
    exists); (exit code, output, trace events, Ray session folder, driver pid)."""
    trace = cwd / f"trace-{name}{'-'.join(extra)}"
    trace.unlink(missing_ok=True)
    driver = subprocess.Popen(
        [sys.executable, str(LAUNCH), *ARGS, "--name", name, *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        env={**os.environ, "PYTHONUNBUFFERED": "1", TRACE_ENV: str(trace)},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )
    session = None
    try:
        deadline = time.time() + 300
        while ["begin", step] not in _events(trace) or (step == "trials" and not _children(cwd, name)):
            assert driver.poll() is None and time.time() < deadline, (driver.poll(), _events(trace))
            time.sleep(0.02)
        os.killpg(driver.pid, signum)
        out, _ = driver.communicate(timeout=180)
        events = _events(trace)
        session = next((e[1] for e in events if e[0] == "ray_session"), None)
        return driver.returncode, out, events, session, driver.pid
    finally:
        if driver.poll() is None:  # only what this test started: the driver's group, then its Ray session
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        if session:
            stop_processes(session_processes(session), grace_s=2)


def _nothing_left(workdir: Path, name: str, session: str | None, pid: int, killed: bool) -> None:
    """No run of the sweep RUNNING (its parent KILLED when `killed`), no Ray process of it, nothing of its group."""
    if (workdir / "mlflow.db").exists():
        parents, children = sweep_runs(store(workdir), name)
        assert [p.info.status for p in parents] == (["KILLED"] if killed else []), parents
        assert all(r.info.status != "RUNNING" for r in children), children
    time.sleep(1)
    if session:
        assert session_processes(session) == [], session
    assert list((workdir / "ray_results" / SESSIONS_DIR).glob("*.json")) == []
    assert group_members(pid) == []  # the model/data check's child included


def test_a_stop_at_any_step_of_start_up_keeps_the_promises(workdir: Path) -> None:
    t0, landed = time.time(), []
    for step, signum, name, extra, ignored in CASES:
        t = time.time()
        rc, out, events, session, pid = _stop_at(workdir, step, signum, name, extra, ignored)
        where = next((" ".join(e[3:]) for e in events if e[0] == "signal"), "?")
        landed.append(f"{signal.Signals(signum).name} after 'begin {step}' landed in {where}: exit {rc}")
        print(f"{landed[-1]} ({time.time() - t:.1f}s)\n{out[-600:]}")
        assert rc == 130, (out[-3000:], events)
        assert "Traceback" not in out and "SIGTERM received" not in out, out[-3000:]
        assert where.split()[-1] in (*STEP_NAMES, "main", "start"), events  # it came during start-up
        last = out.strip().splitlines()[-1]
        stopped_before = where.split()[-1] in BEFORE_THE_PARENT_RUN and not extra
        if stopped_before:
            assert last == "interrupted before the sweep started; nothing was written", out[-2000:]
        else:  # the parent run exists: KILLED, its trials' runs too, and --resume continues it
            assert last == "interrupted: runs marked KILLED; continue with --resume", out[-2000:]
        if step in ("ray_start", "study", "tuner"):
            assert session, events  # Ray was up when the stop was raised: the session it stopped
        _nothing_left(workdir, name, session, pid, killed=not stopped_before)
    # --resume takes what the stops left (the last one: a Tuner made, its fit never run): trials start; a Ctrl+C
    # there is Ray Tune's graceful stop, as documented
    rc, out, events, session, pid = _stop_at(workdir, "trials", signal.SIGINT, "s-study", ("--resume",), False)
    print(f"--resume, Ctrl+C once a trial ran: exit {rc}\n{out[-800:]}")
    assert rc == 130 and "no experiment state file" not in out, out[-3000:]
    assert "--resume" in out.strip().splitlines()[-1], out[-3000:]
    _nothing_left(workdir, "s-study", session, pid, killed=True)
    print("\n".join(landed), f"\ntotal {time.time() - t0:.0f}s")

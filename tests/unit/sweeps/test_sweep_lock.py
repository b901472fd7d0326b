"""One sweep per name at a time (sweeps/sweep_lock.py).

Fast: a second process is refused with one line naming the holder (pid and host), both when it
takes the lock and in preflight's read-only probe; a holder killed with SIGKILL leaves a lock
the next process takes at once (the kernel released it), rewriting the holder line; a remote
storage path takes no lock; `launch.py` refuses a name whose lock is held with exit 2 and one
stderr line. Slow: 2, then 4 launches of the same tiny sweep at the same moment (twice each):
exactly one runs, the others exit 2 with one line, the MLflow store holds one parent run and
one child run per trial, and `--resume` of the name then exits 0.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sweeps.sweep_lock import SweepRunning, hold, lock_path, refuse_if_running
from tests.sweep_helpers import LAUNCH, ROOT, launch, store, sweep_runs

HOLDER = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
from sweeps.sweep_lock import hold
with hold(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


def _start_holder(storage: Path, name: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(storage), name, str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "held", proc.stderr.read() if proc.poll() is not None else line
    return proc


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_second_process_is_refused_naming_the_holder_and_a_killed_holder_is_taken_over(tmp_path):
    storage, name = tmp_path / "ray_results", "same-name"
    holder = _start_holder(storage, name)
    try:
        path = lock_path(str(storage), name)
        assert path == storage / ".locks" / f"{name}.lock"
        assert f"pid {holder.pid} on host {socket.gethostname()} since " in path.read_text()

        with pytest.raises(SweepRunning) as taken:
            with hold(str(storage), name):
                pytest.fail("took a lock another process holds")
        msg = str(taken.value)
        assert "\n" not in msg and msg.startswith(f"name: sweep {name!r} is already running (pid {holder.pid} ")
        assert f"on host {socket.gethostname()}" in msg and str(path) in msg
        # preflight's probe says the same and writes nothing
        before = (path.read_bytes(), path.stat().st_mtime_ns)
        with pytest.raises(SweepRunning, match=rf"already running \(pid {holder.pid} "):
            refuse_if_running(str(storage), name)
        assert (path.read_bytes(), path.stat().st_mtime_ns) == before
        # another name in the same folder is free
        with hold(str(storage), "other-name"):
            pass

        os.kill(holder.pid, signal.SIGKILL)  # no clean-up ran: its line stays in the file
        holder.wait(timeout=30)
        assert f"pid {holder.pid} " in path.read_text()
        refuse_if_running(str(storage), name)  # the kernel released the dead holder's lock
        t0 = time.monotonic()
        with hold(str(storage), name) as held:
            assert held == path
            assert path.read_text().startswith(f"pid {os.getpid()} on host {socket.gethostname()} since ")
            assert time.monotonic() - t0 < 1.0
        assert path.read_text() == ""  # released: no holder line left behind
    finally:
        _kill(holder)


TAKES = 300

# Another launch's preflight probing the same name in a loop (a process of its own, as launches are); prints
# "free held" counts, or the first unexpected exception, when its stop file appears.
PROBER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
from sweeps.sweep_lock import SweepRunning, refuse_if_running
storage, name, stop = sys.argv[1], sys.argv[2], sys.argv[3]
free = held = 0
while not os.path.exists(stop):
    try:
        refuse_if_running(storage, name)
        free += 1
    except SweepRunning:
        held += 1
print(free, held)
"""


def test_probes_never_make_the_taker_fail(tmp_path):
    """preflight's shared probes of other launches only delay a taker by moments: a probe caught holding its
    shared lock is waited out, and beside two processes probing without pause 300 takes all succeed. A taker
    that does not retry its lock fails here (sweep_lock.READ_TRIES = 1: the first part fails every time)."""
    storage, name = str(tmp_path), "probed"
    with hold(storage, name) as path:
        pass  # the lock file exists
    # a probe caught holding its shared lock (for 0.2 s here, microseconds in life): the taker waits it out
    probe_fd = os.open(str(path), os.O_RDONLY)
    fcntl.flock(probe_fd, fcntl.LOCK_SH)
    threading.Timer(0.2, os.close, (probe_fd,)).start()  # closing the descriptor releases its lock
    t0 = time.monotonic()
    with hold(storage, name):
        waited = time.monotonic() - t0
    assert 0.1 < waited < 2.0, waited
    stop = tmp_path / "stop"
    probers = [
        subprocess.Popen(
            [sys.executable, "-c", PROBER, storage, name, str(stop), str(ROOT)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    waits: list[float] = []
    try:
        time.sleep(1.0)  # the probers have started probing (their interpreter starts in well under a second)
        for _ in range(TAKES):
            t0 = time.monotonic()
            with hold(storage, name):
                waits.append(time.monotonic() - t0)
    finally:
        stop.write_text("")
        outs = [p.communicate(timeout=30) for p in probers]
    for (out, err), p in zip(outs, probers, strict=True):
        assert p.returncode == 0, err[-2000:]  # a probe that raised anything but SweepRunning fails here
        free, held = (int(v) for v in out.split())
        assert free + held >= 20, (free, held)  # it ran beside the taker
    assert len(waits) == TAKES and max(waits) < 2.0, max(waits)  # every take succeeded, none waited more than moments


def test_remote_storage_is_not_locked(tmp_path):
    assert lock_path("s3://bucket/sweeps", "x") is None
    assert lock_path(f"file://{tmp_path}", "x") == tmp_path / ".locks" / "x.lock"
    with hold("s3://bucket/sweeps", "x") as held:
        assert held is None
    refuse_if_running("s3://bucket/sweeps", "x")


def test_launch_refuses_a_running_name_with_one_line(tmp_path):
    holder = _start_holder(tmp_path / "ray_results", "busy")
    try:
        proc = launch(tmp_path, "--name", "busy", "--num-samples", "2", timeout=300)
    finally:
        _kill(holder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: name: sweep 'busy' is already running (pid {holder.pid} on host ")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "ray_results" / "busy").exists()


# ---------------------------------------------------------------------------- the race, end to end
TINY = ["--num-samples", "2", "--set", "run.train.epochs=1", "--set", "run.data.num_samples=600"]


def _race(cwd: Path, name: str, n: int) -> list[subprocess.CompletedProcess]:
    """`n` launches of the same sweep started at the same moment in `cwd`; their results."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(LAUNCH), "--name", name, "--seed", "0", *TINY]
    logs = [(cwd / f"launch{i}.out", cwd / f"launch{i}.err") for i in range(n)]
    procs = []
    for out_path, err_path in logs:  # files, not pipes: no launch waits on a full pipe
        with open(out_path, "w") as out, open(err_path, "w") as err:
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err))
    codes = [p.wait(timeout=900) for p in procs]
    return [subprocess.CompletedProcess(cmd, rc, o.read_text(), e.read_text()) for rc, (o, e) in zip(codes, logs)]


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("repeat", [1, 2])
def test_simultaneous_launches_of_one_name_run_it_once(tmp_path, n, repeat):
    name = f"race-{n}"
    results = _race(tmp_path, name, n)
    report = "\n\n".join(f"rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}" for r in results)
    winners = [r for r in results if r.returncode == 0]
    losers = [r for r in results if r.returncode != 0]
    assert len(winners) == 1, report
    for r in losers:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, report
        assert lines[0].startswith(f"error: name: sweep {name!r} is already running (pid "), report
    print("\n".join(r.stderr.strip() for r in losers))

    parents, children = sweep_runs(store(tmp_path), name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [p.info for p in parents]
    trial_ids = [c.data.tags["calib.trial_id"] for c in children]
    assert len(trial_ids) == 2 and len(set(trial_ids)) == 2, trial_ids

    again = launch(tmp_path, "--name", name, "--seed", "0", "--resume", *TINY)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "already finished" in again.stdout
    parents, children = sweep_runs(store(tmp_path), name)
    assert len(parents) == 1 and len(children) == 2

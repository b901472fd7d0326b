"""The local Ray cluster a sweep driver starts, recorded so that none of its processes outlives the driver.

A local sweep (no --cluster) starts Ray in the driver: gcs_server, raylet, dashboard, log monitor,
agents and trial workers. `ray.shutdown()` (run at exit) stops them, and `track` checks after it
that none is left. A driver killed with SIGKILL cannot clean up: each driver records its Ray
session in `<storage_path>/.ray_sessions/<driver pid>.json`, and the next sweep on that storage
path (`reap_stale`) stops the processes of a recorded session whose driver is gone, with one line.

A process belongs to a session when its command line names the session folder
(/tmp/ray/session_*: gcs_server, raylet, monitors) or, for workers and agents (whose command line
Ray rewrites to `ray::...`), its environment carries the session raylet's pid (RAY_RAYLET_PID) or
its stdout/stderr is a log file in the session folder, or its parent is one of these.
Nothing else is touched: not another sweep's cluster, not a
cluster started with `ray start`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SESSIONS_DIR = ".ray_sessions"


@contextlib.contextmanager
def own_session() -> Iterator[None]:
    """The Ray processes started inside (`ray.init`'s gcs_server, raylet, agents and monitors, and through the
    raylet the trial workers) start in a session of their own, outside the driver's process group.

    A stop sent to the sweep's whole process group (`kill -- -PGID`, `timeout`, a terminal's or a job runner's
    group signal) then reaches the driver alone: it stops the trials through Ray Tune (runs KILLED, resumable,
    exit 130) and then Ray's processes (`track`/`end`). Were Ray's processes in the group, they would die under
    the driver, which then waited 60 s for the lost GCS and exited 1 with its runs left RUNNING. They still die
    with the driver (Ray's kernel fate-sharing), and a SIGKILLed driver's leftovers are reaped (`reap_stale`)."""
    from ray._private import services

    original = services.ConsolePopen

    class _InOwnSession(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _InOwnSession  # type: ignore[misc]
    try:
        yield
    finally:
        services.ConsolePopen = original  # type: ignore[misc]


@contextlib.contextmanager
def stop_handlers_kept() -> Iterator[None]:
    """`ray.init` inside leaves the driver's SIGINT and SIGTERM handlers as they were.

    Ray's init puts its own SIGTERM handler in place at its start (`sys.exit(15)`: a SIGTERM during start-up
    then ended the driver with exit 15, its parent run FAILED or RUNNING, no --resume hint), and its core worker
    one at the C level (a log of the signal with a stack, then Python's handler). Inside, the first is not set;
    after, the handlers from before are installed again, which makes the operating system's action Python's
    handler once more. Main thread only (where Python runs signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from ray._private import utils as ray_utils

    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is not None:
        ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if original is not None:
            ray_utils.set_sigterm_handler = original
        for signum, handler in saved.items():
            if handler is not None:  # None: set outside Python, nothing of ours to restore
                signal.signal(signum, handler)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when there is no such process)."""
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    if not stat:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def _ppid(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    try:
        return int(stat.rsplit(")", 1)[-1].split()[1])
    except (IndexError, ValueError):
        return 0


def _writes_into(pid: int, session_dir: str) -> bool:
    """Whether the process's stdout or stderr is a file under the session folder: Ray redirects every worker's
    and agent's output to <session>/logs, which marks them even when their environment carries no
    RAY_RAYLET_PID (seen for agents of a SIGKILLed driver)."""
    prefix = session_dir.rstrip("/") + "/"
    for fd in (1, 2):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def session_processes(session_dir: str, raylet_pids: list[int] | None = None) -> list[int]:
    """Pids of the live processes of Ray session `session_dir` (see the module's docstring); never this process."""
    me = os.getpid()
    marker = session_dir.encode()
    # a recorded raylet pid now held by another process (the pid was reused) marks nothing of this session
    raylets = {
        f"RAY_RAYLET_PID={p}".encode()
        for p in raylet_pids or []
        if not _start_time(p) or _zombie(p) or marker in _read(f"/proc/{p}/cmdline")
    }
    found: set[int] = set()
    pids = _pids()
    for pid in pids:
        if pid == me:
            continue
        cmd = _read(f"/proc/{pid}/cmdline")
        if marker in cmd:
            found.add(pid)
            if b"raylet/raylet" in cmd:
                raylets.add(f"RAY_RAYLET_PID={pid}".encode())
    for pid in pids:
        if pid != me and pid not in found and raylets and set(_read(f"/proc/{pid}/environ").split(b"\0")) & raylets:
            found.add(pid)
        elif pid != me and pid not in found and _writes_into(pid, session_dir):
            found.add(pid)
    grew = True
    while grew:  # children of session processes (agents, workers) belong to it too
        grew = False
        for pid in pids:
            if pid != me and pid not in found and _ppid(pid) in found:
                found.add(pid)
                grew = True
    return sorted(p for p in found if _start_time(p))


def stop_processes(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL what is still there after `grace_s`; the pids that were stopped."""
    stopped = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_start_time(p) and not _zombie(p) for p in stopped):
        time.sleep(0.1)
    for pid in stopped:
        if _start_time(pid) and not _zombie(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return stopped


def _zombie(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    return bool(stat) and stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _is_local(storage_path: str) -> bool:
    return "://" not in storage_path or storage_path.startswith("file://")


def _folder(storage_path: str) -> Path:
    return Path(storage_path.removeprefix("file://")) / SESSIONS_DIR


def reap_stale(storage_path: str, say: Callable[[str], None] = print) -> list[int]:
    """Stop the leftover processes of every recorded session on `storage_path` whose driver is gone; their pids."""
    if not _is_local(storage_path):
        return []
    folder = _folder(storage_path)
    stopped: list[int] = []
    for record in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            info = json.loads(record.read_text())
            driver, started, session_dir = int(info["driver_pid"]), str(info["driver_start"]), info["session_dir"]
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)
            continue
        if _start_time(driver) == started:
            continue  # its driver still runs (another sweep on this storage path)
        left = session_processes(session_dir, [int(p) for p in info.get("raylet_pids", [])])
        if left:
            stopped += stop_processes(left)
            say(
                f"Stopped {len(left)} leftover Ray processes (pids {', '.join(map(str, left))}) of session "
                f"{session_dir}, left by sweep driver {driver}, which is gone"
            )
        record.unlink(missing_ok=True)
    return stopped


def track(storage_path: str, session_dir: str, quiet: bool = False) -> Path | None:
    """Record this driver's local Ray session; at exit shut Ray down, stop what it left and drop the record
    (`quiet`: what the workers print while they are torn down is not forwarded)."""
    if not _is_local(storage_path):
        return None
    folder = _folder(storage_path)
    folder.mkdir(parents=True, exist_ok=True)
    raylets = [p for p in session_processes(session_dir) if b"raylet/raylet" in _read(f"/proc/{p}/cmdline")]
    record = folder / f"{os.getpid()}.json"
    info: dict[str, Any] = {
        "driver_pid": os.getpid(),
        "driver_start": _start_time(os.getpid()),
        "session_dir": session_dir,
        "raylet_pids": raylets,
    }
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(record)
    _TRACKED[record] = (session_dir, raylets, quiet)
    atexit.register(end, record)
    return record


_TRACKED: dict[Path, tuple[str, list[int], bool]] = {}  # sessions this process started and has not ended


def core_processes(record: Path) -> list[int]:
    """The pids of the tracked session's gcs_server and raylet: what the driver cannot go on without."""
    if record not in _TRACKED:
        return []
    session_dir, raylets, _ = _TRACKED[record]
    return [
        p
        for p in session_processes(session_dir, raylets)
        if any(k in _read(f"/proc/{p}/cmdline") for k in (b"gcs_server", b"raylet/raylet"))
    ]


def is_tracked(record: Path) -> bool:
    """Whether the session of `record` is still this driver's to end (`end` has not begun)."""
    return record in _TRACKED


def alive(pid: int) -> bool:
    return bool(_start_time(pid)) and not _zombie(pid)


def stop_now(record: Path) -> None:
    """What is left of the tracked session stopped without `ray.shutdown` (whose GCS is gone, so it would wait
    on it); the record dropped."""
    if record in _TRACKED:
        session_dir, raylets, _ = _TRACKED.pop(record)
        left = session_processes(session_dir, raylets)
        if left:
            stop_processes(left, grace_s=2)
        record.unlink(missing_ok=True)


def end(record: Path | None) -> None:
    """Shut Ray down in this driver now: with the `record` of a local session it started (`track`), its processes
    stop and the record goes; None only drops the driver's connection (a cluster's stays up). Idempotent: the
    service ends its session when the trials are over and the exit handler then finds nothing to do."""
    if record is None:
        shutdown()
        return
    if record in _TRACKED:
        _at_exit(record, *_TRACKED.pop(record))


def shutdown() -> None:
    """`ray.shutdown()`, after which the driver's own SIGTERM and SIGINT handlers work again.

    Ray's core worker, shutting down, puts the process's SIGTERM action back to the default (terminate) at the C
    level while Python still reports the handler the driver installed: a stop during selection and registration
    then killed the driver outright (exit 143, runs left RUNNING, no --resume hint). Re-installing what Python
    holds makes the operating system's action match it again.

    Python's cyclic garbage collector is run first and held off during `ray.shutdown()`: while the core worker
    shuts down (the GIL released) another thread of the driver (the closing's warm-up, importing) could start a
    collection that frees Ray object references, whose release then reaches the core worker just gone, and Ray
    ends the process at once with exit 1 ("The core worker has already been shutdown", nothing else said; a CI
    run's resumed sweep died so)."""
    import ray

    gc.collect()  # Ray's cyclic garbage freed while its core worker can still take the releases
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ray.shutdown()
    finally:
        if was_enabled:
            gc.enable()
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers are the main thread's; a shutdown elsewhere leaves them as they are
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if handler is not None:  # None: installed outside Python, nothing of ours to restore
            signal.signal(signum, handler)


def _at_exit(record: Path, session_dir: str, raylets: list[int], quiet: bool = False) -> None:
    try:
        if quiet:  # the workers' teardown (SIGTERM tracebacks of idle trial actors) is not for people
            with contextlib.suppress(Exception):
                from ray._private.worker import global_worker_stdstream_dispatcher

                global_worker_stdstream_dispatcher.remove_handler("ray_print_logs")
        shutdown()
    except Exception:  # noqa: BLE001 - still stop what is left
        pass
    left = session_processes(session_dir, raylets)
    if left:
        stop_processes(left)
    record.unlink(missing_ok=True)

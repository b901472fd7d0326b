"""One sweep per name at a time: an exclusive OS lock beside the sweep's stores.

`hold(storage_path, name)` takes `<storage_path>/.locks/<name>.lock` with `flock(LOCK_EX)`
before the sweep writes anything (sweeps.service.execute) and keeps it until the sweep ends;
the holder writes its pid, host and start time into the file. A second launch of the same
name finds the lock taken and stops with `SweepRunning` (a ConfigError: exit 2, one line)
naming that holder. The kernel drops the lock when the holder's process dies (even by
SIGKILL), so a stale lock never blocks: the next launch takes it and rewrites the file.

`refuse_if_running(storage_path, name)` is the read-only check preflight makes: it opens an
existing lock file read-only and probes it with a shared, non-blocking flock (nothing is
created or written), so a launch that arrives while the sweep runs is refused before it reads
stores the running sweep is writing.

Only a local storage path (a directory, or file://) is locked. With a remote storage path
(s3://, gs://, ... used with a tracking server and --cluster) no lock is taken for now: two
drivers launching the same name against remote stores are not kept apart.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from calib_core.config import ConfigError

LOCK_DIR = ".locks"
READ_TRIES = 20  # a holder that has just taken the lock writes its line within moments
READ_WAIT_S = 0.05


class SweepRunning(ConfigError):
    """Another process holds this sweep name's lock (one line naming it)."""


def lock_path(storage_path: str | None, name: str) -> Path | None:
    """`<storage_path>/.locks/<name>.lock` for a local storage path; None for a remote one."""
    if not storage_path:
        return None
    if storage_path.startswith("file://"):
        storage_path = storage_path.removeprefix("file://")
    elif "://" in storage_path:
        return None
    return Path(storage_path) / LOCK_DIR / f"{name}.lock"


def _holder_line() -> str:
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"pid {os.getpid()} on host {socket.gethostname()} since {started}\n"


def _read_holder(fd: int) -> str:
    """The holder's line, waiting briefly for one that has just taken the lock to write it."""
    for _ in range(READ_TRIES):
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if text:
            return " ".join(text.split())
        time.sleep(READ_WAIT_S)
    return "a process that has not written its pid yet"


def _refusal(name: str, path: Path, holder: str) -> SweepRunning:
    return SweepRunning(
        f"name: sweep {name!r} is already running ({holder}; lock {path}); wait for it to finish, "
        "or use --name for a new sweep"
    )


def _busy(exc: OSError) -> bool:
    return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _take(fd: int) -> bool:
    """flock(LOCK_EX) without blocking, tried for a moment: another launch's read-only probe
    (refuse_if_running) holds a shared lock for microseconds; a running sweep holds it for good."""
    for attempt in range(READ_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if not _busy(exc):
                raise
        if attempt + 1 < READ_TRIES:
            time.sleep(READ_WAIT_S)
    return False


@contextmanager
def hold(storage_path: str | None, name: str) -> Iterator[Path | None]:
    """Hold the sweep's lock for the block (yields its path; None when the storage path is remote).

    Raises SweepRunning at once (no waiting) when another process holds it."""
    path = lock_path(storage_path, name)
    if path is None:
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_CLOEXEC (Python's default): programs this process starts (Ray's) never hold the lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _take(fd):
            raise _refusal(name, path, _read_holder(fd))
        # ours now (a holder that died left its line: replaced)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_line().encode(), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # no stale line for a reader; the file stays (unlinking it would race)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def refuse_if_running(storage_path: str | None, name: str) -> None:
    """Raise SweepRunning when a process holds the sweep's lock now. Reads only."""
    path = lock_path(storage_path, name)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file (never run here) or unreadable: nothing to tell
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if _busy(exc):
                raise _refusal(name, path, _read_holder(fd)) from None
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def refused_while_running(storage_path: str | None, name: str) -> Iterator[None]:
    """preflight's store checks: refuse first when the sweep runs; and when a check fails, say so
    if a launch of the same name took the lock meanwhile (its first writes explain the failure)."""
    refuse_if_running(storage_path, name)
    try:
        yield
    except ConfigError:
        refuse_if_running(storage_path, name)
        raise


__all__ = ["SweepRunning", "hold", "lock_path", "refuse_if_running", "refused_while_running"]

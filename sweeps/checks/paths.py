"""Pre-flight checks of paths: a folder a store or Ray Tune's results can be written into (not a file in the way,
not a read-only or kernel file system, permissions), a remote storage path taking a marker file, and file-system
errors as one ConfigError line. Nothing is left behind (the remote probe deletes its marker).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from calib_core.config import ConfigError, clip
from calib_core.redaction import redact

# File systems that cannot hold a store (kernel interfaces).
PSEUDO_FS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "devtmpfs",
    "securityfs",
    "debugfs",
    "tracefs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "mqueue",
    "binfmt_misc",
    "efivarfs",
    "autofs",
    "nsfs",
}


@contextmanager
def fs_errors(field: str) -> Iterator[None]:
    """A file-system error while checking (e.g. a folder on the way this user may not enter) as one line."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ConfigError(f"{field}: {exc.strerror or exc}{where}") from None


PROBE_TIMEOUT_S = 20.0


def probe_remote_storage(storage: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Write and delete a marker file in a remote storage path (s3://, gs://, hdfs://, ...) through pyarrow, as
    Ray Tune will: missing libraries or credentials are one line here, before anything of the sweep is written."""
    import threading
    import uuid

    problem: list[str] = []

    def probe() -> None:
        try:
            import pyarrow.fs as pafs

            fs, path = pafs.FileSystem.from_uri(storage)
            marker = f"{path.rstrip('/')}/.calib-probe-{uuid.uuid4().hex}"
            with fs.open_output_stream(marker) as out:
                out.write(b"calib-sweep storage probe")
            fs.delete_file(marker)
        except Exception as exc:  # noqa: BLE001 - every failure is reported as the one line below
            problem.append(" ".join(str(exc).split()) or type(exc).__name__)

    worker = threading.Thread(target=probe, name="storage-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    scheme = storage.split("://", 1)[0]
    if worker.is_alive():
        raise ConfigError(
            f"storage_path: {scheme}:// storage did not answer within {timeout:.0f} s ({clip(redact(storage), 100)})"
        )
    if problem:
        raise ConfigError(
            f"storage_path: cannot write to {clip(redact(storage), 100)} ({clip(problem[0], 140)}); check the "
            f"{scheme} library and credentials"
        )


def check_storage(storage: str, cluster: bool) -> None:
    """A local storage path (or file://) must be a folder this process can create or write into; a remote one
    (s3://, gs://, hdfs://, ...) must take a marker file."""
    if storage.startswith("file://"):
        parts = urllib.parse.urlsplit(storage)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"storage_path: {storage!r}: a file:// URI names no host (file:///ABS/PATH)")
        path = Path(urllib.parse.unquote(parts.path))
    elif "://" in storage:
        return  # an object store: probed by preflight once the cheaper checks passed (probe_remote_storage)
    elif cluster and not os.environ.get("CALIB_SHARED_STORAGE"):
        return  # nothing local to check
    else:
        path = Path(storage)
    if not path.is_absolute():
        raise ConfigError(f"storage_path: {storage!r} is not an absolute path")
    check_writable_dir("storage_path", path, what="the storage folder", may_create=True)


def check_writable_dir(field: str, path: Path, what: str, may_create: bool = False) -> None:
    """`path` is a writable folder, or (may_create) could be created: no file in the way, the nearest
    existing folder writable, not on a read-only or kernel file system. Creates nothing.

    os.access cannot see permissions for root (it may write anywhere on a writable file system),
    so the mount table (/proc/self/mountinfo) is checked too: read-only mounts and kernel file
    systems (proc, sysfs, ...) are refused for everyone.
    """
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ConfigError(f"{field}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        if existing == path:
            raise ConfigError(f"{field}: {path} is a file, not a folder")
        raise ConfigError(f"{field}: {existing} is a file, so {path} cannot be created under it")
    if existing != path and not may_create:
        raise ConfigError(f"{field}: {path} does not exist")
    mount = _mount_of(existing)
    if mount is not None:
        point, fstype, options = mount
        if fstype in PSEUDO_FS:
            raise ConfigError(f"{field}: {path} is on {point}, a {fstype} file system that cannot hold {what}")
        if "ro" in options:
            raise ConfigError(f"{field}: {path} is on {point}, which is mounted read-only")
    if not os.access(existing, os.W_OK | os.X_OK):
        action = "write into" if existing == path else f"create {path} under"
        raise ConfigError(f"{field}: no permission to {action} {existing}")


def _mount_of(path: Path) -> tuple[str, str, set[str]] | None:
    """(mount point, file system type, mount options) of the mount holding `path` (Linux), else None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best: tuple[str, str, set[str]] | None = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or not tail:
            continue
        point = fields[4].encode().decode("unicode_escape")  # \040 for a space
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                opts = set(fields[5].split(",")) | (set(tail[2].split(",")) if len(tail) > 2 else set())
                best = (point, tail[0], opts)
    return best

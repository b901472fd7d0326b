"""Make sure a dataset's files are on disk, downloading them at most once at a time.

Several trials of a sweep start together on one node (or on nodes sharing a data volume) and
would otherwise all find the files missing and download into the same folder at once,
overwriting each other's half-written archives. The download therefore runs under an
exclusive file lock ``<root>/.calib-download.lock`` (``flock``, released by the kernel if the
holder dies); whoever waited re-checks the files and downloads only if they are still missing.
:func:`verify_md5` compares files with their official checksums for every loader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock, Timeout
from torchvision.datasets.utils import calculate_md5

LOCK_NAME = ".calib-download.lock"

log = logging.getLogger(__name__)


def ensure_files(
    name: str,
    root: Path,
    missing: Callable[[], list[Path]],
    download: Callable[[], object],
    *,
    allowed: bool,
    not_found: Callable[[list[Path]], str],
) -> None:
    """Return when ``missing()`` is empty, downloading first (under the lock) if ``allowed``.

    Raises FileNotFoundError(``not_found(paths)``) when files are missing and downloading is
    not allowed, RuntimeError when the download fails, FileNotFoundError when files are still
    missing after it.
    """
    gone = missing()
    if not gone:
        return
    if not allowed:
        raise FileNotFoundError(not_found(gone))
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("%s: another process is downloading into %s; waiting for it", name, root)
        lock.acquire()
    try:
        gone = missing()
        if not gone:
            return
        try:
            download()
        except Exception as exc:  # network errors come in many types (URLError, RuntimeError, OSError)
            raise RuntimeError(f"{name}: download to {root} failed: {exc}") from exc
        gone = missing()
        if gone:
            raise FileNotFoundError(f"{name}: still missing after download: {', '.join(map(str, gone))}")
    finally:
        lock.release()


def some(items: list[str], k: int = 3) -> str:
    """The first ``k`` items joined, and how many more there are."""
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


def verify_md5(name: str, official: dict[Path, str]) -> None:
    """ValueError naming every file whose md5 differs from its official one."""
    bad = [
        f"{path} (md5 {got}, official {md5})" for path, md5 in official.items() if (got := calculate_md5(path)) != md5
    ]
    if bad:
        raise ValueError(
            f"{name}: files differ from the official release: {some(bad)}. "
            "Re-download them, or set data.verify_checksums=false to use this copy as it is."
        )

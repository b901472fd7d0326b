"""Where calib-sweeps keeps what it can compute again: $CALIB_DATA_CACHE (default $XDG_CACHE_HOME/calib-sweeps, else
~/.cache/calib-sweeps; `off` keeps nothing). MNIST-1D's generated arrays (calib_core/data/mnist1d.py), the
model/data check's answers (sweeps/checks/model_fit.py) and MLflow's empty SQLite store
(sweeps/integrations/mlflow/sqlite_seed.py) live in folders of it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

CACHE_ENV = "CALIB_DATA_CACHE"


def cache_root() -> Path | None:
    """The cache folder, or None when $CALIB_DATA_CACHE is `off`."""
    root = os.environ.get(CACHE_ENV, "").strip()
    if root.lower() == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "calib-sweeps")
    return Path(root)


def write_whole(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write a cache file through `write`, whole, then rename it into place: a reader never sees half a file.
    Raises OSError when the disk refuses (callers keep nothing then)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

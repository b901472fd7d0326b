"""Where a benchmark run came from: code commit, package versions, CPU and threads (issue #31).

`provenance()` returns a flat dict of plain values that every run row of a study records:

- `git_commit`: the HEAD commit of the repository, None outside a git checkout; `CALIB_SOURCE_COMMIT`, when set,
  names it instead (a copy of the tree sent to a device machine, whose .git may be an older one);
- `git_clean`: whether tracked files match HEAD (`git status --porcelain --untracked-files=no` is empty):
  False means the run's code may differ from the commit (other edits in the working tree);
- `python`, `torch`, `numpy`, `calib_core`: versions;
- `cpu_model`: the first "model name" of /proc/cpuinfo (platform.processor() elsewhere);
- `threads`: torch's intra-op thread count at the time of the call.

No host name, user or path is recorded. `check_same_commit` is the rule a study applies before adding a
run: a table must not mix commits unless the caller allows it.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("git_commit", "git_clean", "python", "torch", "numpy", "calib_core", "cpu_model", "threads")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked files are unmodified); (CALIB_SOURCE_COMMIT, None) when that is set."""
    named = os.environ.get("CALIB_SOURCE_COMMIT")
    if named:  # the sender of a copied tree knows its commit; whether the copy matches it is not known here
        return named, None
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), (status is not None and status.strip() == "")


def provenance() -> dict[str, Any]:
    """The run's provenance record (see the module docstring)."""
    import numpy
    import torch

    import calib_core

    commit, clean = git_state()
    return {
        "git_commit": commit,
        "git_clean": clean,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "calib_core": getattr(calib_core, "__version__", "unknown"),
        "cpu_model": cpu_model(),
        "threads": int(torch.get_num_threads()),
    }


def check_same_commit(existing: Iterable[str | None], commit: str | None, allow_mixed: bool = False) -> None:
    """Refuse (ValueError) to add a run made at `commit` to rows made at other commits, unless `allow_mixed`."""
    others = sorted({c for c in existing if c and c != commit})
    if others and not allow_mixed:
        raise ValueError(
            f"the study's rows were made at commit(s) {', '.join(o[:10] for o in others)}, this run at "
            f"{(commit or 'unknown')[:10]}: refusing to mix commits (pass --allow-mixed-commits to override)"
        )

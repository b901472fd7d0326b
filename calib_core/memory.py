"""The memory a process may still allocate, without torch: the data loaders' memory checks (calib_core/data) and the
sweep's config step (the data digest of sweeps/config_defaults.py, which must not import torch) read it here."""

from __future__ import annotations

import os
from pathlib import Path

# bytes in memory per byte of CSV: pandas' frame, the float64 features, the float32 splits (calib_core/data/table.py)
CSV_MEMORY_FACTOR = 6


def available_memory() -> int:
    """Bytes this process may still allocate: the kernel's MemAvailable, capped by the cgroup's limit."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 1 << 62  # unknown: do not refuse
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(avail, 0)

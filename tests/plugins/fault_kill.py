"""Test-only plugin (tests/e2e/test_sweep_faults.py): SIGKILLs the trial process once, at the end of epoch
$CALIB_SWEEP_FAULT_KILL_EPOCH, the first trial to get there winning the marker file $CALIB_SWEEP_FAULT_MARKER.

Loaded through CALIB_PLUGINS=fault_kill with this folder on PYTHONPATH; product code only offers the seam
(calib_core.plugins.on_epoch_end).
"""

from __future__ import annotations

import os
import signal

from calib_core.plugins import on_epoch_end

KILL_EPOCH_ENV = "CALIB_SWEEP_FAULT_KILL_EPOCH"
MARKER_ENV = "CALIB_SWEEP_FAULT_MARKER"


@on_epoch_end
def kill_once(epoch: int) -> None:
    """SIGKILL this process at the configured epoch, once per sweep (the marker file records the pid)."""
    kill_at, marker = os.environ.get(KILL_EPOCH_ENV), os.environ.get(MARKER_ENV)
    if not kill_at or not marker or int(kill_at) != epoch:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)

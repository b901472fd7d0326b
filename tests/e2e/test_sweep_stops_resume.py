"""Ctrl+C during a `--resume` (issue #36): an interrupted resume stops like any interrupted sweep (exit 130,
runs KILLED, the --resume hint, resumable), and a resume never "grows" a sweep it did not finish; a `--resume`
with a changed search space is refused in one line.

Before the fix the resumed Tune fit, stopped by SIGINT, returned its two restored trials as TERMINATED; with
`--num-samples 4` on the command line (the user repeating the command) the service took that for a finished
sweep of 2 trials, printed "Growing ... from 2 to 4 trials", ran two new trials, exited 0 and left the two
restored trials `stopped` (their runs KILLED) for good.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.test_sweep_stops_group import (
    LONG,
    NAME,
    checkpoints,
    cleanup,
    group_members,
    start,
    wait_for_checkpoints,
)
from tests.sweep_helpers import launch, store, sweep_runs

pytestmark = pytest.mark.slow


def _interrupt(cwd: Path, *extra: str, after: int = 0) -> tuple[int, str]:
    """Start LONG (plus `extra`), wait for two trials' checkpoints (more than `after` in all), Ctrl+C the group."""
    driver, record = start(cwd, *LONG, *extra), None
    try:
        record = wait_for_checkpoints(cwd, driver, after=after)
        os.killpg(driver.pid, signal.SIGINT)  # what a terminal sends to its foreground group on Ctrl+C
        out, _ = driver.communicate(timeout=120)
        time.sleep(1)
        assert group_members(driver.pid) == []
        return driver.returncode, out
    finally:
        cleanup(driver, record)


def test_ctrl_c_during_resume_stops_and_a_changed_search_space_is_refused(tmp_path: Path) -> None:
    t0 = time.time()
    rc, out = _interrupt(tmp_path)
    assert rc == 130, out[-3000:]
    first = checkpoints(tmp_path)

    rc, out = _interrupt(tmp_path, "--resume", after=len(first))
    print(f"resume interrupted: exit {rc}\n{out[-1500:]}")
    assert rc == 130, out[-3000:]
    assert "Growing" not in out, out[-3000:]
    assert "--resume" in out.strip().splitlines()[-1], out[-3000:]
    assert "Traceback" not in out and "Stop signal received" not in out, out[-3000:]
    parents, children = sweep_runs(store(tmp_path), NAME)
    assert [p.info.status for p in parents] == ["KILLED"]
    statuses = sorted((r.data.tags.get("calib.trial_id"), r.info.status) for r in children)
    assert len(children) == 2 and all(s == "KILLED" for _, s in statuses), statuses  # nothing grown
    assert len({c.split("/")[0] for c in checkpoints(tmp_path)}) == 2  # the same two trials, continued
    assert checkpoints(tmp_path) > first

    # the search space the sweep started with is kept on --resume: a change is one line, exit 2, nothing run
    proc = launch(tmp_path, *LONG, "--resume", "--set", "search.calibrators=[temperature]", timeout=120)
    print(proc.stderr)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.startswith("error: search.calibrators: --resume of ") and len(proc.stderr.splitlines()) == 1
    assert "Sweep " not in proc.stdout  # refused before the sweep started
    print(f"took {time.time() - t0:.0f}s")

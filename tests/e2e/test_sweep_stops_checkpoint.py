"""A corrupted checkpoint on `--resume` (issue #36): after a driver SIGKILL the checkpoint files are overwritten
with garbage. A trial falls back to its newest readable checkpoint, or starts again from its first epoch when
none is readable, saying in one line which file was unreadable; the sweep finishes.

Before the fix each affected trial failed three times with `UnsafeFileError` (six Ray tracebacks on the
terminal) and ended errored.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from sweeps.contract import FINAL_FILE
from tests.e2e.test_sweep_stops_group import checkpoints, cleanup, group_members, start, wait_for_checkpoints
from tests.sweep_helpers import launch, store, sweep_runs

pytestmark = pytest.mark.slow

NAME = "corrupt"
# epochs enough that no trial can finish before the kill on an idle machine (30 did, at the end of a test run)
ARGS = ["--num-samples", "2", "--set", "run.data.num_samples=1200", "--set", "run.train.epochs=150"]
ARGS += ["--set", "run.train.batch_size=64", "--set", "search.references=[]", "--name", NAME]


def _garbage(folder: Path) -> list[str]:
    """Every file in a checkpoint folder overwritten with bytes that are no checkpoint."""
    out = []
    for f in folder.iterdir():
        if f.is_file():
            f.write_bytes(os.urandom(64) + b"not a checkpoint")
            out.append(str(f))
    return out


def test_corrupted_checkpoints_fall_back_or_restart(tmp_path: Path) -> None:
    driver, record = start(tmp_path, *ARGS), None
    try:
        record = wait_for_checkpoints(tmp_path, driver, name=NAME)
        deadline = time.time() + 300  # at least two checkpoints of each trial: one to fall back on
        while time.time() < deadline:
            per_trial: dict[str, list[str]] = {}
            for c in checkpoints(tmp_path, NAME):
                per_trial.setdefault(c.split("/")[0], []).append(c)
            if len(per_trial) == 2 and all(len(v) >= 3 for v in per_trial.values()):
                break
            time.sleep(0.5)
        time.sleep(3)  # Tune's experiment snapshot (every second) points past checkpoint_000000
        os.kill(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=60)
    finally:
        cleanup(driver, record)
    assert group_members(driver.pid) == []
    trials = sorted({c.split("/")[0] for c in checkpoints(tmp_path, NAME)})
    assert len(trials) == 2, trials
    exp = tmp_path / "ray_results" / NAME
    # both trials were mid-training (a finished trial's final checkpoint is not what this test damages)
    assert not list(exp.glob(f"*/checkpoint_*/{FINAL_FILE}")), "a trial finished before the kill"
    # trial 1: every checkpoint but its first damaged (the one Tune restores included: it falls back to the
    # first); trial 2: every checkpoint damaged (it starts again)
    for p in (exp / trials[0]).glob("checkpoint_*"):
        if p.name != "checkpoint_000000":
            _garbage(p)
    for p in (exp / trials[1]).glob("checkpoint_*"):
        _garbage(p)

    t0 = time.time()
    proc = launch(tmp_path, *ARGS, "--resume", timeout=900)
    out = proc.stdout + proc.stderr
    print(f"resume took {time.time() - t0:.0f}s, exit {proc.returncode}\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    lines = [line for line in out.splitlines() if "checkpoint unreadable" in line]
    # no trial failed, none retried: no error file, no "errored"/"failed" line, and no traceback but the one a
    # Ray worker may print when it is sent SIGTERM at shutdown, after the sweep ended ("Exception ignored in")
    assert not list(exp.glob("*/error.*")), list(exp.glob("*/error.*"))
    assert "errored" not in out.lower() and "failed" not in out.lower(), out[-4000:]
    lines_all = out.splitlines()
    for i, line in enumerate(lines_all):
        if "Traceback (most recent call last)" in line:
            assert i > 0 and "Exception ignored in" in lines_all[i - 1], out[-4000:]
    assert [line for line in out.splitlines() if "UnsafeFileError" in line] == [
        line for line in lines if "UnsafeFileError" in line
    ]
    fell_back = [line for line in lines if trials[0] in line and "resuming from checkpoint_000000" in line]
    restarted = [line for line in lines if trials[1] in line and "the trial starts again" in line]
    assert len(fell_back) == 1 and len(restarted) == 1, lines
    for line in lines:  # which file, and why, in one line
        assert re.search(r"checkpoint unreadable: \S+/checkpoint_\d+/\S+ \(\w+: ", line), line
    parents, children = sweep_runs(store(tmp_path), NAME)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len(children) == 2, [r.data.tags for r in children]  # exactly one run per trial, retries included
    assert all(r.data.tags.get("calib.status") == "completed" for r in children), [
        (r.data.tags.get("calib.trial_id"), r.data.tags.get("calib.status")) for r in children
    ]

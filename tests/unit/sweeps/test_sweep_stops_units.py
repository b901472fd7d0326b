"""Fast checks behind the stop tests (issue #36; the slow ones are tests/e2e/test_sweep_stops_*.py): the stop that
Ray Tune handles itself is seen, a changed search space is named in one line, an unreadable checkpoint falls
back to the newest readable one or to none."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch
from ray import tune

from calib_core.export import load_tensors
from sweeps.checks.preflight import search_space_problem
from sweeps.config import load_sweep_config
from sweeps.contract import FINAL_FILE, STATE_FILE
from sweeps.integrations.ray.trainable import _readable_checkpoint
from sweeps.integrations.ray.tuner import StopWatch, tune_sigint_undone
from tests.paths import ROOT


def test_the_stop_lines_stopwatch_reads_are_ray_tunes_own() -> None:
    """StopWatch knows an interrupted fit from Ray Tune's log lines: they must still be Tune's wording."""
    import ray.tune.tune as tune_module

    source = inspect.getsource(tune_module)
    for line in StopWatch.LINES:
        assert line in source, line


def test_ray_tune_still_leaves_its_sigint_handler_behind_a_fit() -> None:
    """What tune_sigint_undone is for: fit() installs its own SIGINT handler and restores the previous one only
    when a SIGINT came."""
    import ray.tune.tune as tune_module

    source = inspect.getsource(tune_module)
    assert "signal.signal(signal.SIGINT, signal_interrupt_tune_run)" in source
    assert "signal.signal(signal.SIGINT, original_handler)" in source


def test_after_the_trials_ctrl_c_interrupts_again() -> None:
    """A handler put in place during the trial phase (as Ray Tune's) is gone after it: SIGINT raises
    KeyboardInterrupt again instead of being swallowed."""
    swallowed: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with tune_sigint_undone():
            signal.signal(signal.SIGINT, lambda signum, frame: swallowed.append(signum))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert swallowed == [signal.SIGINT]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("quiet", [True, False])
def test_stopwatch_records_the_stop_and_keeps_the_line_out_when_quiet(quiet: bool) -> None:
    stops = StopWatch(quiet=quiet)
    other = logging.LogRecord("ray.tune.tune", logging.WARNING, "", 0, "something else", None, None)
    assert stops.filter(other) and not stops.requested
    stop = logging.LogRecord(
        "ray.tune.tune", logging.WARNING, "", 0, "Experiment has been interrupted, but ...", None, None
    )
    assert stops.filter(stop) is (not quiet)
    assert stops.requested


def test_a_changed_search_space_is_named_in_one_line() -> None:
    cfg = load_sweep_config(None, [])
    recorded = cfg.search.resumed_space()
    assert search_space_problem(cfg, recorded) is None
    assert search_space_problem(load_sweep_config(None, ["search.num_samples=20"]), recorded) is None  # growth
    changed = load_sweep_config(None, ["search.calibrators=[temperature]", "search.seed=7"])
    line = search_space_problem(changed, recorded)
    assert line is not None and "\n" not in line and len(line) < 400
    assert line.startswith("search.calibrators: --resume of 'mnist1d-demo' must search what it started with")
    assert "(and search.seed)" in line


def _checkpoints(trial: Path, good: list[int], bad: list[int]) -> tune.Checkpoint:
    for i in sorted(good + bad):
        d = trial / f"checkpoint_{i:06d}"
        d.mkdir(parents=True)
        if i in good:
            torch.save({"epoch": i}, d / STATE_FILE)
        else:
            (d / STATE_FILE).write_bytes(b"\x80\x02garbage, not a checkpoint")
    return tune.Checkpoint(str(trial / f"checkpoint_{max(good + bad):06d}"), filesystem=pafs.LocalFileSystem())


def test_an_unreadable_checkpoint_falls_back_to_the_newest_readable(tmp_path: Path, capsys) -> None:
    ckpt = _checkpoints(tmp_path / "trial", good=[0, 1, 2], bad=[3, 4])
    state, final = _readable_checkpoint(ckpt, load_tensors)
    assert final is None and state == {"epoch": 2}
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"checkpoint unreadable: {tmp_path}/trial/checkpoint_000004/state.pt (")
    assert out[0].endswith("; resuming from checkpoint_000002")


def test_no_readable_checkpoint_starts_the_trial_again(tmp_path: Path, capsys) -> None:
    ckpt = _checkpoints(tmp_path / "trial", good=[], bad=[0, 1])
    assert _readable_checkpoint(ckpt, load_tensors) == (None, None)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].endswith("; no older one readable, the trial starts again")


def test_a_readable_checkpoint_is_used_without_a_word(tmp_path: Path, capsys) -> None:
    ckpt = _checkpoints(tmp_path / "trial", good=[0, 1], bad=[])
    assert _readable_checkpoint(ckpt, load_tensors) == ({"epoch": 1}, None)
    (Path(ckpt.path) / FINAL_FILE).write_text('{"val_ece": 0.1}')
    assert _readable_checkpoint(ckpt, load_tensors) == (None, {"val_ece": 0.1})
    assert capsys.readouterr().out == ""
    assert _readable_checkpoint(None, load_tensors) == (None, None)


LOST_RAY_SCRIPT = """
import subprocess, sys, threading, time
from pathlib import Path
import sweeps.integrations.ray.session as session
from sweeps import service

raylet = subprocess.Popen(["sleep", "60"])  # stands for the session's raylet
session.core_processes = lambda record: [raylet.pid]
session.is_tracked = lambda record: True
session.stop_now = lambda record: print("stop_now", flush=True)
on_sigterm = service._watch_for_lost_ray(Path("record"), lambda: print("runs closed", flush=True))
if sys.argv[1] == "dies":  # the stop of a whole control group: the raylet goes a moment after the driver's signal
    threading.Timer(0.3, lambda: (raylet.kill(), raylet.wait())).start()
t0 = time.monotonic()
on_sigterm()
print(f"returned after {time.monotonic() - t0:.1f}s", flush=True)  # the main thread would now call into Ray
raylet.kill()
"""


def test_a_raylet_lost_with_the_stop_ends_the_driver_before_it_calls_ray_again(tmp_path: Path) -> None:
    """Ray ends a driver whose raylet died at its next call into Ray, with exit 1 and nothing printed (a slow
    test shows it: tests/e2e/test_sweep_stops_group.py). So SIGTERM's handler holds the main thread until it knows
    whether Ray was stopped with it: then the runs are closed, one line is printed and the exit code is 130."""
    import subprocess
    import sys

    script = tmp_path / "lost.py"
    script.write_text(LOST_RAY_SCRIPT)
    root = ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    dies = subprocess.run([sys.executable, str(script), "dies"], capture_output=True, text=True, env=env, timeout=60)
    assert dies.returncode == 130, dies.stdout + dies.stderr
    assert "returned" not in dies.stdout and dies.stdout.splitlines() == ["runs closed", "stop_now"], dies.stdout
    assert dies.stderr.strip().splitlines()[-1].endswith("continue with --resume"), dies.stderr
    # Ray not stopped with the driver: the handler gives the main thread back after its bounded hold
    stays = subprocess.run([sys.executable, str(script), "stays"], capture_output=True, text=True, env=env, timeout=60)
    assert stays.returncode == 0, stays.stdout + stays.stderr
    held = float(stays.stdout.split("returned after ")[1].split("s")[0])
    from sweeps.service import LOST_RAY_HOLD_S

    assert LOST_RAY_HOLD_S - 0.1 <= held <= LOST_RAY_HOLD_S + 1.5, stays.stdout
    assert "runs closed" not in stays.stdout

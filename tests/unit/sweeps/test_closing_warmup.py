"""The closing's warm-up (sweeps/closing_warmup.py): its steps run in order in a daemon thread at a lower priority;
finish() lets no further step start and waits for the running one only; stop() (the context's exit) ends it at the
next step; a failing step ends it quietly; CALIB_CLOSING_WARMUP=0 turns it off; Ctrl+C in the main thread is raised
there at once while a step runs; and the real steps run without error."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from sweeps import closing_warmup
from sweeps.closing_warmup import ClosingWarmup


def _steps(log: list[str], gate: threading.Event | None = None, n: int = 3):
    def step(name: str):
        def run() -> None:
            log.append(name)
            if gate is not None and name == "s1":
                assert gate.wait(10)

        return name, run

    return tuple(step(f"s{i}") for i in range(n))


def test_steps_run_in_order_in_a_daemon_thread():
    log: list[str] = []
    w = ClosingWarmup(_steps(log))
    assert not w.started and w.finish() is True  # never started: nothing to wait for
    w = ClosingWarmup(_steps(log))
    w.start()
    assert w._thread is not None and w._thread.daemon and w._thread.name == "closing-warmup"
    assert w.wait(10)
    assert log == w.done == ["s0", "s1", "s2"] and w.error == "" and w.cpu_s >= 0.0


def test_finish_waits_for_the_running_step_only():
    log: list[str] = []
    gate = threading.Event()
    w = ClosingWarmup(_steps(log, gate))
    w.start()
    while "s1" not in log:
        time.sleep(0.01)
    threading.Timer(0.2, gate.set).start()
    t0 = time.monotonic()
    assert w.finish(10) is True
    assert time.monotonic() - t0 >= 0.15  # it waited for s1 ...
    assert log == ["s0", "s1"] and w.done == ["s0", "s1"]  # ... and s2 never started


def test_stop_on_the_way_out_ends_it_at_the_next_step():
    log: list[str] = []
    gate = threading.Event()
    with ClosingWarmup(_steps(log, gate)) as w:
        w.start()
        while "s1" not in log:
            time.sleep(0.01)
    gate.set()  # the sweep ended (its context exited) while s1 ran
    assert w.wait(10) and log == ["s0", "s1"]
    w.start()  # a stopped warm-up does not start again
    assert log == ["s0", "s1"]


def test_a_failing_step_ends_it_quietly():
    def boom() -> None:
        raise ModuleNotFoundError("No module named 'x'")

    log: list[str] = []
    w = ClosingWarmup((("a", lambda: log.append("a")), ("b", boom), ("c", lambda: log.append("c"))))
    w.start()
    assert w.wait(10)
    assert log == ["a"] and w.done == ["a"] and w.error == "b: ModuleNotFoundError: No module named 'x'"


def test_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(closing_warmup.ENV, "0")
    log: list[str] = []
    w = ClosingWarmup(_steps(log))
    w.start()
    assert not w.started and w.finish() and log == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_the_thread_runs_at_a_lower_priority_than_the_driver():
    seen = {}

    def look() -> None:
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    w = ClosingWarmup((("look", look),))
    w.start()
    assert w.wait(10)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen["nice"] == min(mine + closing_warmup.WARMUP_NICENESS, 19)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the main thread's is untouched


def test_ctrl_c_reaches_the_main_thread_while_a_step_runs():
    gate = threading.Event()
    log: list[str] = []
    w = ClosingWarmup(_steps(log, gate))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), w:
            w.start()
            while "s1" not in log:
                time.sleep(0.01)
            t0 = time.monotonic()
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)  # interrupted at once, not after this
        assert time.monotonic() - t0 < 2
    finally:
        signal.signal(signal.SIGINT, previous)
        gate.set()
    assert w.wait(10) and log == ["s0", "s1"]  # stopped on the way out


def test_the_real_steps_run():
    w = ClosingWarmup()
    w.start()
    assert w.wait(300)
    assert w.error == "" and w.done == [name for name, _ in closing_warmup.STEPS]
    for module in ("torch", "calib_core.metrics", "mlflow.pyfunc", "matplotlib.pyplot", "optuna.importance"):
        assert module in sys.modules


def test_a_sweep_without_importances_skips_their_imports():
    names = [name for name, _ in closing_warmup.steps_for(False)]
    assert names == [name for name, _ in closing_warmup.STEPS if name != "importance"]
    assert closing_warmup.steps_for(True) == closing_warmup.STEPS

"""A sweep's start-up, step by step: what it waits on before its first trial, timed and traced, and a stop signal
(Ctrl+C's SIGINT, SIGTERM) honoured at every moment of it (issue 47 item 2).

The steps, in the order they run (`STEPS`), each timed by `Startup` (the sweep's `Start-up:` line and the
`startup_*_s` keys of SweepResult.timings) and, when the environment variable CALIB_STARTUP_TRACE names a file,
traced into it one line each as it begins and ends (`<unix time> begin <step>`, `<unix time> end <step>
<seconds>`; a stop signal adds `<unix time> signal SIGINT in <step>`; the local Ray session `ray_session <dir>`).

`SIGNALS` is the process's stop handling: installed by `sweeps/launch.py` before anything heavy is imported (and
by the CLI's `main` and the service's `execute`, for their duration, when they run in a process of their own),
it takes SIGINT and SIGTERM, records the stop and raises KeyboardInterrupt, as Python's own Ctrl+C does; the
service unwinds from there (runs KILLED, Ray stopped, exit 130, the `--resume` hint). Three things keep it from
being lost:

- installed first, whatever the process inherited: a sweep started in the background of a shell script (`python
  sweeps/launch.py ... &`, or `setsid` there) inherits SIGINT *ignored*, and Python then installs no Ctrl+C
  handler at all; the sweep ignored SIGINT until Ray Tune's fit put its own handler in place, 6 s in on an idle
  machine, and ran to completion (exit 0) when stopped before (the lost Ctrl+C of issue 47);
- deferred, not lost, inside `held()` sections (Ray's start with the session record that lets the sweep stop its
  processes; the study's and Tune's first writes): the stop is raised as the section ends; a second signal
  inside one stops at once;
- checked between steps (`Startup.step`): a KeyboardInterrupt that something swallowed is raised again at the
  next step, and the stop is always raised in the main thread.

Standard library only (layer 0): `sweeps/launch.py` imports it before any other module of the sweep.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TRACE_ENV = "CALIB_STARTUP_TRACE"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# (name, what it does, its words in the Start-up line), in the order they run; "store" runs beside "ray_start"
STEPS: tuple[tuple[str, str, str], ...] = (
    ("imports", "Python started and the command line's modules imported", "imports"),
    ("config", "the config read and its values checked", "config"),
    ("checks", "paths, servers, resources, the stores and the model/data check (sweeps/startup.py)", "checks"),
    ("lock", "the sweep name's lock taken", "lock"),
    ("ray_start", "leftover Ray processes reaped; Ray started (or the cluster joined) and its session recorded", "Ray"),
    ("store", "the MLflow experiment and the sweep's parent run opened, in a thread beside ray_start", "MLflow"),
    ("study", "the Optuna study's storage opened", "study"),
    ("tuner", "the trainable and Ray Tune's Tuner made (or restored)", "tuner"),
)
STEP_NAMES = tuple(name for name, _, _ in STEPS)
BESIDE = {"store": "ray_start"}  # a step that runs in a thread beside another


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def trace(event: str) -> None:
    """One line into the CALIB_STARTUP_TRACE file (nothing when it is not set)."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:  # one write of one line (O_APPEND): threads do not interleave
            f.write(f"{time.time():.3f} {event}\n")
    except OSError:
        pass


class StopSignals:
    """SIGINT and SIGTERM as a recorded stop: raised as KeyboardInterrupt at once, or, inside `held()`, as the
    section ends. `count` is the number of stop signals since `clear()`; `where` the step they arrive in."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None
        self.where = "start"
        self._held = 0
        self._deferred = False

    @property
    def requested(self) -> bool:
        return self.count > 0

    def clear(self) -> None:
        """The stop was reported (exit 130, SweepIncomplete): a later sweep in this process starts afresh."""
        self.count, self.signum, self._deferred = 0, None, False

    def handler(self, signum: int, frame: Any) -> None:
        """The signal handler (SIGINT and SIGTERM; Ray Tune's fit replaces it for SIGINT while trials run)."""
        self.count += 1
        if self.signum is None:
            self.signum = signum
        trace(f"signal {signal.Signals(signum).name} in {self.where}")
        if self._held and not self._deferred:
            self._deferred = True  # raised when the held section ends
            return
        raise KeyboardInterrupt

    def ours(self) -> bool:
        return signal.getsignal(signal.SIGINT) == self.handler

    def install(self) -> None:
        """Take SIGINT and SIGTERM (main thread only; an ignored SIGINT included), for good."""
        if _main_thread():
            for signum in STOP_SIGNALS:
                signal.signal(signum, self.handler)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Take SIGINT and SIGTERM for the block unless they are this object's already; the handlers from before
        after it."""
        if not _main_thread() or self.ours():
            yield
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        self.install()
        try:
            yield
        finally:
            for signum, handler in previous.items():
                if handler is not None:  # None: set outside Python, nothing to put back
                    signal.signal(signum, handler)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A stop signal inside the block is raised as it ends (a second one at once); main thread only."""
        if not _main_thread():
            yield
            return
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            deferred = self._deferred and not self._held
            if not self._held:
                self._deferred = False
        if deferred:  # reached only when the block ended without an exception
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt when a stop was requested (main thread only: a thread finishes its step)."""
        if self.count and _main_thread() and not self._held:
            raise KeyboardInterrupt


SIGNALS = StopSignals()

_LAUNCHED: float | None = None  # time.monotonic() of the process's start, set by sweeps/launch.py


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat against the boot clock), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0 <= age < 600 else None


def launched() -> None:
    """`sweeps/launch.py`'s first act: the stop handlers installed and the imports step begun (at the process's
    start)."""
    global _LAUNCHED
    SIGNALS.install()
    SIGNALS.where = "imports"
    now = time.monotonic()
    _LAUNCHED = now - (process_age_s() or 0.0)
    trace("begin imports")


class Startup:
    """The start-up steps of one sweep: when each began and ended, traced; the stop checked between them."""

    def __init__(self, signals: StopSignals = SIGNALS) -> None:
        self.signals = signals
        self.begun: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.first_trial: float | None = None
        if _LAUNCHED is not None:  # this process is sweeps/launch.py: its imports are the first step
            self.begun["imports"] = _LAUNCHED

    def end_imports(self) -> None:
        """The command line's `main` has begun."""
        if "imports" in self.begun and "imports" not in self.ended:
            self._end("imports")

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run step `name` (one of STEP_NAMES): a stop requested before it is raised first, and one that came
        during it as it ends (main thread); its begin and end traced and timed."""
        if name not in STEP_NAMES:
            raise ValueError(f"unknown start-up step {name!r}: one of {', '.join(STEP_NAMES)}")
        main = _main_thread()
        if main:
            self.signals.check()
            self.signals.where = name
        self.begun[name] = time.monotonic()
        self.ended.pop(name, None)
        trace(f"begin {name}")
        try:
            yield
        except KeyboardInterrupt:
            trace(f"stopped {name}")
            raise
        self._end(name)
        if main:
            self.signals.where = f"after {name}"
            self.signals.check()

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        """`fn(*args)` as step `name` (for a step run in a thread)."""
        with self.step(name):
            return fn(*args)

    def _end(self, name: str) -> None:
        self.ended[name] = time.monotonic()
        trace(f"end {name} {self.ended[name] - self.begun[name]:.3f}")

    def done(self) -> None:
        """Start-up is over: the first trial is next (a stop requested until now is raised here)."""
        self.signals.check()
        self.first_trial = time.monotonic()
        self.signals.where = "trials"
        trace("begin trials")

    def seconds(self) -> dict[str, float]:
        """Each finished step's seconds, in STEPS order."""
        return {n: self.ended[n] - self.begun[n] for n in STEP_NAMES if n in self.ended and n in self.begun}

    def total_s(self) -> float | None:
        """From the first step's begin to the first trial."""
        if self.first_trial is None or not self.begun:
            return None
        return self.first_trial - min(self.begun.values())

    def timings(self) -> dict[str, float]:
        """SweepResult.timings' start-up keys: `startup_<step>_s`, and `startup_s` up to the first trial."""
        out = {f"startup_{n}_s": s for n, s in self.seconds().items()}
        total = self.total_s()
        if total is not None:
            out["startup_s"] = total
        return out

    def line(self) -> str:
        """`Start-up: 6.1s before the first trial: imports 1.0s, config 0.2s, ...`: what the sweep waited on,
        step by step (a step run beside another is named in brackets after it)."""
        secs = self.seconds()
        words = {n: w for n, _, w in STEPS}
        beside = {other: step for step, other in BESIDE.items()}
        parts = []
        for name in STEP_NAMES:
            if name not in secs or name in BESIDE:
                continue
            part = f"{words[name]} {secs[name]:.1f}s"
            if name in beside and beside[name] in secs:
                other = beside[name]
                waited = max(0.0, self.ended[other] - self.ended[name])  # what the next step waited for it
                part += f" ({words[other]} {secs[other]:.1f}s beside it, {waited:.1f}s of it waited for)"
            parts.append(part)
        total = self.total_s()
        head = f"Start-up: {total:.1f}s before the first trial" if total is not None else "Start-up"
        return f"{head}: {', '.join(parts)}"

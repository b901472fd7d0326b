"""Tune callbacks and progress reporter that act for the invocation running the sweep, even after a restore.

Ray Tune pickles the run config (callbacks, progress reporter) into the experiment when the Tuner
is made, and `Tuner.restore` runs those pickled copies: a resumed sweep would keep the first
invocation's tracking URI and output settings, and Tune has no public way to replace them. So Tune
gets stand-ins whose pickled state is only the sweep's name; each hook forwards to the callbacks
and reporter this process installed for that name (`installed`), a fresh run and a restored one alike.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ray import tune
from ray.tune import ProgressReporter

log = logging.getLogger(__name__)


@dataclass
class _Hooks:
    callbacks: list[tune.Callback]
    reporter: ProgressReporter | None
    # Tune sets a reporter up once per run and refuses to set up one twice; a second run in this
    # process (the in-process resume of lost trials) gets a fresh copy of the reporter as installed.
    pristine: ProgressReporter | None = None
    set_up: bool = False


_INSTALLED: dict[str, _Hooks] = {}
# (sweep, Tune trial id) -> MLflow run id, noted by the tracking callback when a trial's run opens, read by the
# Optuna searcher while the study trial is still open (Optuna refuses attributes on a finished trial).
_RUN_IDS: dict[tuple[str, str], str] = {}


_RUN_LISTENERS: dict[str, Any] = {}
# Listeners are told on a thread of their own: one that waits (the study database away) must not hold up the
# tracking writer that notes the runs, or a trial completing meanwhile would find its run not yet noted.
_TOLD: queue.Queue[tuple[str, str, str]] = queue.Queue()
_TELLER: threading.Thread | None = None
_TELLER_LOCK = threading.Lock()


def _tell_listeners() -> None:
    while True:
        sweep, trial_id, run_id = _TOLD.get()
        try:
            listener = _RUN_LISTENERS.get(sweep)
            if listener is not None:
                listener(trial_id, run_id)
        except Exception:  # noqa: BLE001 - a listener's failure is its own (the completion records the run too)
            log.debug("run listener of %s failed for trial %s", sweep, trial_id, exc_info=True)
        finally:
            _TOLD.task_done()


def note_run(sweep: str, trial_id: str, run_id: str) -> None:
    """Record the MLflow run of a trial of `sweep` (in this driver process); the sweep's listener is told on
    its own thread."""
    global _TELLER
    _RUN_IDS[(sweep, trial_id)] = run_id
    if sweep not in _RUN_LISTENERS:
        return
    with _TELLER_LOCK:
        if _TELLER is None or not _TELLER.is_alive():
            _TELLER = threading.Thread(target=_tell_listeners, name="run-listeners", daemon=True)
            _TELLER.start()
    _TOLD.put((sweep, trial_id, run_id))


def listeners_told(timeout_s: float = 5.0) -> bool:
    """Wait until every noted run was told to its listener (at most `timeout_s`); whether all were."""
    deadline = time.monotonic() + timeout_s
    while _TOLD.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def listen_for_runs(sweep: str, listener: Any) -> None:
    """Call `listener(trial_id, run_id)` whenever a run of `sweep` is noted (the Optuna searcher's)."""
    _RUN_LISTENERS[sweep] = listener


def noted_run(sweep: str, trial_id: str) -> str | None:
    """The MLflow run id noted for this trial, or None."""
    return _RUN_IDS.get((sweep, trial_id))


@contextmanager
def installed(sweep: str, callbacks: list[tune.Callback], reporter: ProgressReporter | None) -> Iterator[None]:
    """Make `callbacks` and `reporter` the ones that sweep `sweep`'s stand-ins forward to, while it runs."""
    _INSTALLED[sweep] = _Hooks(list(callbacks), reporter, copy.deepcopy(reporter))
    try:
        yield
    finally:
        _INSTALLED.pop(sweep, None)


def _hooks(sweep: str) -> _Hooks:
    try:
        return _INSTALLED[sweep]
    except KeyError:
        raise RuntimeError(
            f"sweep {sweep!r} runs without its callbacks: call Tuner.fit inside "
            "sweeps.integrations.ray.live_hooks.installed(...)"
        ) from None


# Every hook of tune.Callback; the experiment's callback state (get_state) stays the default
# None: the installed callbacks keep none across a driver restart.
_CALLBACK_HOOKS = (
    "setup",
    "on_step_begin",
    "on_step_end",
    "on_trial_start",
    "on_trial_restore",
    "on_trial_save",
    "on_trial_result",
    "on_trial_complete",
    "on_trial_recover",
    "on_trial_error",
    "on_checkpoint",
    "on_experiment_end",
)


class LiveCallbacks(tune.Callback):
    """Stands in for the installed callbacks of `sweep`; pickles as the sweep's name only."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep

    def targets(self) -> list[tune.Callback]:
        """The callbacks this process installed for the sweep."""
        return _hooks(self.sweep).callbacks


def _forward(hook: str) -> Any:
    def method(self: LiveCallbacks, **info: Any) -> None:
        for callback in self.targets():
            getattr(callback, hook)(**info)

    method.__name__ = method.__qualname__ = hook
    method.__doc__ = f"Forward `{hook}` to the installed callbacks."
    return method


for _hook in _CALLBACK_HOOKS:
    setattr(LiveCallbacks, _hook, _forward(_hook))


class LiveReporter(ProgressReporter):
    """Stands in for the installed progress reporter of `sweep`; pickles as the sweep's name only.

    With no reporter installed (--verbose) it is falsy, which `tune.run` treats as no reporter at all:
    Tune's default output, without its warning that a passed-in reporter is ignored."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep

    def target(self) -> ProgressReporter | None:
        """The reporter this process installed for the sweep (None: Tune's default output)."""
        return _hooks(self.sweep).reporter if self.sweep in _INSTALLED else None

    def __bool__(self) -> bool:
        return self.target() is not None

    def setup(self, *args: Any, **kwargs: Any) -> None:
        """Forward to the installed reporter (a fresh copy of it for a second run in this process)."""
        if self.target() is None:
            return
        hooks = _hooks(self.sweep)
        if hooks.set_up:
            hooks.reporter = copy.deepcopy(hooks.pristine)
        hooks.set_up = True
        assert hooks.reporter is not None
        hooks.reporter.setup(*args, **kwargs)

    def should_report(self, trials: list, done: bool = False) -> bool:
        """Forward to the installed reporter."""
        target = self.target()
        return target is not None and bool(target.should_report(trials, done=done))

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        """Forward to the installed reporter."""
        target = self.target()
        if target is not None:
            target.report(trials, done, *sys_info)

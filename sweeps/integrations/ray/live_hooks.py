"""Tune callbacks and progress reporter that act for the invocation running the sweep, even after a restore.

Ray Tune pickles the run config (callbacks, progress reporter) into the experiment when the Tuner
is made, and `Tuner.restore` runs those pickled copies: a resumed sweep would keep the first
invocation's tracking URI and output settings, and Tune has no public way to replace them. So Tune
gets stand-ins whose pickled state is only the sweep's name; each hook forwards to the callbacks
and reporter this process installed for that name (`installed`), a fresh run and a restored one alike.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ray import tune
from ray.tune import ProgressReporter


@dataclass
class _Hooks:
    callbacks: list[tune.Callback]
    reporter: ProgressReporter | None
    # Tune sets a reporter up once per run and refuses to set up one twice; a second run in this
    # process (the in-process resume of lost trials) gets a fresh copy of the reporter as installed.
    pristine: ProgressReporter | None = None
    set_up: bool = False


_INSTALLED: dict[str, _Hooks] = {}


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

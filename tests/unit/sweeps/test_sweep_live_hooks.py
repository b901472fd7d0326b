"""The stand-ins Tune pickles with an experiment act for the invocation running it (integrations/ray/live_hooks.py):
a restored experiment uses this invocation's callbacks and reporter, not the pickled ones."""

from __future__ import annotations

import pickle

import pytest
from ray import tune
from ray.tune import ProgressReporter

from sweeps.integrations.ray.live_hooks import LiveCallbacks, LiveReporter, installed


class Recorder(tune.Callback):
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def on_trial_result(self, **info) -> None:
        self.log.append((self.name, "result", info["result"]["epoch"]))

    def on_experiment_end(self, **info) -> None:
        self.log.append((self.name, "end"))


class Table(ProgressReporter):
    def __init__(self, log: list) -> None:
        self.log = log

    def setup(self, **kwargs) -> None:
        self.log.append(("setup", kwargs.get("total_samples")))

    def should_report(self, trials, done=False) -> bool:
        return True

    def report(self, trials, done, *sys_info) -> None:
        self.log.append(("report", len(trials), done))


def test_restored_stand_ins_forward_to_this_invocations_hooks():
    first: list = []
    with installed("s1", [Recorder("first", first)], Table(first)):
        callbacks, reporter = pickle.loads(pickle.dumps((LiveCallbacks("s1"), LiveReporter("s1"))))
    assert vars(callbacks) == {"sweep": "s1"} and vars(reporter) == {"sweep": "s1"}

    second: list = []
    with installed("s1", [Recorder("a", second), Recorder("b", second)], Table(second)):
        callbacks.on_trial_result(iteration=1, trials=[], trial=None, result={"epoch": 3})
        callbacks.on_experiment_end(trials=[])
        assert reporter
        reporter.setup(start_time=0.0, total_samples=4)
        assert reporter.should_report([1, 2])
        reporter.report([1, 2], True)
    assert first == []
    assert second == [
        ("a", "result", 3),
        ("b", "result", 3),
        ("a", "end"),
        ("b", "end"),
        ("setup", 4),
        ("report", 2, True),
    ]


def test_no_installed_reporter_means_tunes_default_output():
    """--verbose installs no reporter: the stand-in is falsy, which tune.run treats as none passed."""
    with installed("s2", [], None):
        assert not LiveReporter("s2")
        assert not LiveReporter("s2").should_report([])
    assert not LiveReporter("s2")


def test_callbacks_without_an_installed_sweep_fail_clearly():
    with pytest.raises(RuntimeError, match="runs without its callbacks"):
        LiveCallbacks("nowhere").on_trial_start(iteration=0, trials=[], trial=None)


def test_a_second_run_in_the_process_sets_up_a_fresh_reporter():
    """Tune sets the reporter up once per run and refuses a reporter that already has a metric;
    the in-process resume of lost trials is a second run, so it gets a fresh copy."""
    from ray.tune import CLIReporter

    reporter = CLIReporter()
    live = LiveReporter("twice")
    with installed("twice", [], reporter):
        live.setup(start_time=0.0, total_samples=2, metric="val_ece", mode="min")
        first = live.target()
        live.setup(start_time=1.0, total_samples=2, metric="val_ece", mode="min")  # no ValueError
        assert live.target() is not first
    assert reporter is first  # the first run used the installed reporter itself

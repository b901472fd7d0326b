"""Trials that ended in a worker death are resumed in-process (sweeps.integrations.ray.tuner), at most
LOST_WORKER_ROUNDS times; trials whose own code raised are not."""

from __future__ import annotations

from types import SimpleNamespace

import ray.exceptions

from sweeps.integrations.ray import tuner as service


class FakeTuner:
    def __init__(self, rounds: list[list[Exception | None]]) -> None:
        self.rounds, self.fits = rounds, 0

    def fit(self) -> list[SimpleNamespace]:
        errors = self.rounds[min(self.fits, len(self.rounds) - 1)]
        self.fits += 1
        return [SimpleNamespace(error=e) for e in errors]


def _patch_restore(monkeypatch, tuner: FakeTuner) -> list[tuple]:
    calls: list[tuple] = []

    def restore(path, trainable, **kw):
        calls.append((path, kw))
        return tuner

    monkeypatch.setattr(service.tune.Tuner, "restore", staticmethod(restore))
    return calls


def test_a_lost_worker_is_resumed_until_it_completes(monkeypatch, capsys):
    died = ray.exceptions.ActorDiedError()
    tuner = FakeTuner([[None, died], [None, None]])
    calls = _patch_restore(monkeypatch, tuner)
    results = service.fit_resuming_lost_workers(tuner, "/exp", object(), 2)
    assert [r.error for r in results] == [None, None]
    assert calls == [("/exp", {"resume_unfinished": True, "resume_errored": True})]
    assert "1 trial(s) ended when their worker died" in capsys.readouterr().out


def test_rounds_are_bounded_and_code_errors_are_not_resumed(monkeypatch):
    died = ray.exceptions.ActorDiedError()
    tuner = FakeTuner([[died]])
    calls = _patch_restore(monkeypatch, tuner)
    results = service.fit_resuming_lost_workers(tuner, "/exp", object(), 2)
    assert len(calls) == service.LOST_WORKER_ROUNDS and isinstance(results[0].error, ray.exceptions.RayActorError)

    tuner = FakeTuner([[ValueError("the trainable raised")]])
    calls = _patch_restore(monkeypatch, tuner)
    service.fit_resuming_lost_workers(tuner, "/exp", object(), 2)
    assert calls == [] and tuner.fits == 1


def test_no_rounds_when_retries_are_off(monkeypatch):
    tuner = FakeTuner([[ray.exceptions.ActorDiedError()]])
    calls = _patch_restore(monkeypatch, tuner)
    results = service.fit_resuming_lost_workers(tuner, "/exp", object(), 0)
    assert calls == [] and isinstance(results[0].error, ray.exceptions.RayActorError)

"""Shared test harness: crash a training run after an epoch, then resume it from the pickled state."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch


def crash_then_resume(make_trainer: Callable[[], Any], crash_after: int) -> tuple[Any, Any, list]:
    """Run until `crash_after` epochs (state pickled, then a crash), resume in a fresh trainer.

    Returns (resumed trainer, its result, the epoch reports of the resumed part). The global
    RNG is reseeded before resuming: resumption must not depend on it.
    """
    saved: dict = {}

    class Crash(Exception):
        pass

    def crash(report: Any) -> None:
        if report.epoch == crash_after:
            saved["state"] = pickle.dumps(report.state())
            raise Crash

    with pytest.raises(Crash):
        make_trainer().fit(on_epoch=crash)
    torch.manual_seed(999)
    trainer = make_trainer()
    reports: list = []
    result = trainer.fit(on_epoch=reports.append, resume_state=pickle.loads(saved["state"]))
    return trainer, result, reports

"""Shared test harness: crash a training run after an epoch, then resume it from the saved state.

The state goes through `torch.save` and `torch.load(weights_only=True)`, as a sweep's trial
checkpoint does (sweeps/integrations/ray/trainable.py): it must hold only tensors and plain data."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch


def crash_then_resume(make_trainer: Callable[[], Any], crash_after: int) -> tuple[Any, Any, list]:
    """Run until `crash_after` epochs (state saved, then a crash), resume in a fresh trainer.

    Returns (resumed trainer, its result, the epoch reports of the resumed part). The global
    RNG is reseeded before resuming: resumption must not depend on it.
    """
    saved: dict = {}

    class Crash(Exception):
        pass

    def crash(report: Any) -> None:
        if report.epoch == crash_after:
            buf = io.BytesIO()
            torch.save(report.state(), buf)
            saved["state"] = buf.getvalue()
            raise Crash

    with pytest.raises(Crash):
        make_trainer().fit(on_epoch=crash)
    torch.manual_seed(999)
    trainer = make_trainer()
    reports: list = []
    result = trainer.fit(on_epoch=reports.append, resume_state=load_state(saved["state"]))
    return trainer, result, reports


def load_state(raw: bytes) -> Any:
    """A saved trainer state read back the way a trial reads its checkpoint (no unpickling of objects)."""
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)

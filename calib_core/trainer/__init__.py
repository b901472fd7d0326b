"""The one-go trainer: backbone and calibrator trained together (and the baselines).

`Trainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> TrainResult`.
Modules: schedule (optimizers, LR schedules), calibrator_batches (holdout split, batch
sources, seeded orders), hypergradient (the unrolled look-ahead), trainer (the loop),
result (EpochReport, TrainResult, CalibratedModel), multitask (one head and calibrator per
task on a shared backbone). `make_trainer(cfg, data, device)` picks the right one.
"""

from typing import Any

from .multitask import MultiTaskCalibratedModel, MultiTaskTrainer, MultiTaskTrainResult
from .result import CalibratedModel, EpochReport, TrainResult
from .trainer import Diverged, Trainer, resolve_device


def make_trainer(cfg: Any, data: Any, device: Any = None, **kwargs: Any) -> Trainer:
    """`MultiTaskTrainer` for multi-task data (`data.tasks` set), else `Trainer`."""
    cls = MultiTaskTrainer if getattr(data, "tasks", None) else Trainer
    return cls(cfg, data, device, **kwargs)


__all__ = [
    "CalibratedModel", "Diverged", "EpochReport", "MultiTaskCalibratedModel", "MultiTaskTrainResult",
    "MultiTaskTrainer", "TrainResult", "Trainer", "make_trainer", "resolve_device",
]

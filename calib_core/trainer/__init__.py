"""The one-go trainer: backbone and calibrator trained together (and the baselines).

`Trainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> TrainResult`.
Modules: schedule (optimizers, LR schedules), calibrator_batches (holdout split, batch
sources, seeded orders), hypergradient (the unrolled look-ahead), trainer (the loop),
result (EpochReport, TrainResult, CalibratedModel).
"""

from .result import CalibratedModel, EpochReport, TrainResult
from .trainer import Diverged, Trainer, resolve_device

__all__ = ["CalibratedModel", "Diverged", "EpochReport", "TrainResult", "Trainer", "resolve_device"]

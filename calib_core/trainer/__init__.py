"""The one-go trainer: backbone and calibrator trained together (and the baselines).

`Trainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> TrainResult`.
Modules: trainer (the one loop), strategy (TaskStrategy: what single- and multi-task runs do
differently, with the post-hoc fits and cross-fitting written once), single_task (SingleTask, the
default strategy), posthoc (the fit the trainer is given, CountingFit, k-fold cross-fitting),
multitask (the MultiTask strategy: one head and calibrator per task on a shared backbone;
MultiTaskTrainer = Trainer with it), plan (which samples each player trains on), schedule
(optimizers, LR schedules), calibrator_batches (holdout split, batch sources, seeded orders),
hypergradient (the unrolled look-ahead), snapshot (resume-state helpers), result (EpochReport,
Evaluation, TrainResult, CalibratedModel). `make_trainer(cfg, data, device)` picks the strategy
from the data.
"""

from typing import Any

from .multitask import MultiTask, MultiTaskCalibratedModel, MultiTaskTrainer, MultiTaskTrainResult
from .posthoc import CountingFit, PosthocFit
from .result import CalibratedModel, EpochReport, Evaluation, TrainResult
from .single_task import SingleTask
from .strategy import TaskStrategy
from .trainer import Diverged, Trainer, resolve_device


def make_trainer(cfg: Any, data: Any, device: Any = None, **kwargs: Any) -> Trainer:
    """`MultiTaskTrainer` for multi-task data (`data.tasks` set), else `Trainer`."""
    cls = MultiTaskTrainer if getattr(data, "tasks", None) else Trainer
    return cls(cfg, data, device, **kwargs)


__all__ = [
    "CalibratedModel",
    "CountingFit",
    "Diverged",
    "EpochReport",
    "Evaluation",
    "MultiTask",
    "MultiTaskCalibratedModel",
    "MultiTaskTrainResult",
    "MultiTaskTrainer",
    "PosthocFit",
    "SingleTask",
    "TaskStrategy",
    "TrainResult",
    "Trainer",
    "make_trainer",
    "resolve_device",
]

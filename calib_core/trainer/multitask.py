"""Multi-task one-go calibration: a shared backbone, one head and one calibrator per task.

`MultiTaskTrainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> MultiTaskTrainResult`
for data with `data.tasks` set (labels (N, T), -1 = missing; calib_core.data.multitask).

It is the one `Trainer` loop with the `MultiTask` strategy (strategy.py): the step loop
(`train_epoch`: batch orders, calibrator batch sources, K_c, warm-up), the epoch loop
(`fit`), divergence checks, the state snapshot and bit-for-bit resume are the loop's; this
module supplies the per-task pieces (calibrators, inputs, losses, post-hoc fits, metrics,
the calibrated model and the result).

Players: theta = the backbone's feature extractor plus the heads (with `last_layer`: without
the heads, each head being its task's calibrator) and phi_t = task t's calibrator. Per step:
  1. every task's calibrator takes K_c CE steps on its own task's labelled rows of the
     calibrator batch (backbone outputs detached, eval mode). The calibrators share one
     optimizer object over disjoint parameters, so task t's step depends only on task t's
     loss; a task with no labelled row in the batch does not step at all (grad None);
  2. the backbone takes one step on sum_t CE_t through the frozen calibrators (`unrolled`:
     through each calibrator's one-step look-ahead on its task's labelled rows).
Missing labels (-1) are masked out of every loss and every metric: CE_t is the mean over
task t's labelled rows of the batch, and 0 (no NaN) when there are none.

Methods: `onego`, `ce` (no calibrator), `label_smoothing` (CE with smoothing per task) and
`posthoc` (one post-hoc stage per task: LBFGS on task t's labelled holdout rows of the cached
logits, refitted from the identity after every epoch; `calibrator_info["calibration_stages"]`
counts the stages a final model needs: one per task with labelled holdout rows, 0 for
one-go; `posthoc_split: val` fits on each task's labelled validation rows instead, with
cross-fitted validation metrics as in `Trainer`). `focal` is refused.

Metrics: `calib_core.metrics.compute_all` per task on the labelled rows, keyed
`<task>_<metric>`, plus `<metric>` = the mean over the tasks that have labelled rows, so
epoch reports carry `val_<task>_ece`, ... and `val_ece`, `val_nll`, ... as the sweep expects.

The result's `model` (`MultiTaskCalibratedModel`) maps x -> list of calibrated logits, and
its `predict_proba(x)` returns a list of (N, K_t) probabilities. `val_probs`/`val_labels`
(and test) hold the first task's labelled rows, so code written for one task (reliability
diagrams, prediction files) runs unchanged; `task_val_probs` etc. hold every task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from calib_core.calibrators import Calibrator, create_calibrator
from calib_core.config import RunConfig

from .hypergradient import lookahead_params
from .posthoc import PosthocFit
from .result import Evaluation, TrainResult, forward_in_batches, model_features, model_submodule
from .strategy import CalibratorBatch, TaskStrategy, add_regularization
from .trainer import Trainer

MISSING = -1


def masked_cross_entropy(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean CE over the rows with a label (labels >= 0); exactly 0 (with a zero gradient, no
    NaN) when no row has one. Needs no host sync."""
    n = (labels >= 0).sum()
    total = F.cross_entropy(logits, labels, ignore_index=MISSING, reduction="sum", label_smoothing=label_smoothing)
    return total / n.clamp_min(1).to(total.dtype)


def multitask_metrics(
    logits: Sequence[Tensor], labels: Tensor, tasks: Sequence[Sequence[Any]], *, num_bins: int = 15
) -> dict[str, float]:
    """compute_all per task on its labelled rows (`<task>_<metric>`) plus the mean over tasks
    with at least one label (`<metric>`). `labels` is (N, T) with -1 = missing."""
    from calib_core.metrics import compute_all

    if labels.dim() != 2 or labels.shape[1] != len(tasks) or len(logits) != len(tasks):
        raise ValueError(
            f"expected {len(tasks)} logit tensors and labels (N, {len(tasks)}), "
            f"got {len(logits)} and {tuple(labels.shape)}"
        )
    out: dict[str, float] = {}
    per_task: list[dict[str, float]] = []
    for t, (name, _) in enumerate(tasks):
        y = labels[:, t]
        keep = y >= 0
        if not bool(keep.any()):
            continue
        m = compute_all(logits[t][keep].float(), y[keep], num_bins=num_bins, from_logits=True)
        m = {k: float(v) for k, v in m.items()}
        per_task.append(m)
        out.update({f"{name}_{k}": v for k, v in m.items()})
    if not per_task:
        raise ValueError("no task has a labelled row in this split")
    means = {k: sum(m[k] for m in per_task) / len(per_task) for k in per_task[0]}
    return {**means, **out}


def model_heads(model: nn.Module) -> nn.ModuleList:
    """`model.heads`, the per-task heads, typed as the ModuleList they are."""
    return cast(nn.ModuleList, model_submodule(model, "heads"))


class MultiTaskCalibratedModel(nn.Module):
    """Shared backbone + per-task heads + per-task calibrators: x -> list of calibrated logits."""

    def __init__(self, model: nn.Module, calibrators: nn.ModuleList | None, tasks: Sequence[Sequence[Any]]) -> None:
        super().__init__()
        self.model = model
        self.calibrators = calibrators
        self.tasks = tuple((str(n), int(k)) for n, k in tasks)

    def forward(self, x: Tensor) -> list[Tensor]:
        f = model_features(self.model, x)
        out = []
        for t, head in enumerate(model_heads(self.model)):
            cal = cast(Calibrator, self.calibrators[t]) if self.calibrators is not None else None
            if cal is None:
                out.append(head(f))
            elif cal.input_kind == "features":
                out.append(cal(f))
            else:
                out.append(cal(head(f)))
        return out

    @torch.no_grad()
    def predict_logits(self, x: Tensor, batch_size: int = 1024) -> list[Tensor]:
        """Calibrated logits per task, each (N, K_t) on the model's device, computed in eval mode."""
        chunks = forward_in_batches(self, x, batch_size)
        if not chunks:
            return [torch.empty(0, k) for _, k in self.tasks]
        return [torch.cat([c[t] for c in chunks]) for t in range(len(self.tasks))]

    def predict_proba(self, x: Tensor, batch_size: int = 1024) -> list[Tensor]:
        """Calibrated probabilities per task, each (N, K_t) on the CPU, in eval mode."""
        return [torch.softmax(z.float(), dim=1).cpu() for z in self.predict_logits(x, batch_size)]


@dataclass
class MultiTaskTrainResult(TrainResult):
    """TrainResult with every task's predictions. `val_probs`/`val_labels` (and test) are the
    first task's labelled rows; `task_val_probs[t]` is (N, K_t) over all rows and
    `task_val_labels` the (N, T) labels (-1 = missing)."""

    tasks: tuple[tuple[str, int], ...] = ()
    task_val_probs: list[Tensor] | None = None
    task_val_labels: Tensor | None = None
    task_test_probs: list[Tensor] | None = None
    task_test_labels: Tensor | None = None
    calibration_stages: int = 0


class MultiTask(TaskStrategy):
    """Labels (N, T) with -1 = missing; one head and one calibrator per task (module docstring)."""

    head_name = "heads"

    def __init__(self, tasks: Sequence[Sequence[Any]], label_smoothing: float = 0.0) -> None:
        self.tasks = tuple((str(n), int(k)) for n, k in tasks)
        self.smoothing = label_smoothing

    @classmethod
    def for_run(cls, cfg: RunConfig, data: Any) -> MultiTask:
        """The strategy of a run of `cfg` on multi-task `data`; ValueError when they do not fit."""
        tasks = getattr(data, "tasks", None)
        if not tasks:
            raise ValueError(
                "MultiTaskTrainer needs multi-task data (data.tasks set); use Trainer for single-task data"
            )
        T = len(tasks)
        for split_name in ("train", "val", "test"):
            y = getattr(data, split_name).y
            if y.dim() != 2 or y.shape[1] != T:
                raise ValueError(f"multi-task {split_name} labels must be (N, {T}), got {tuple(y.shape)}")
        tc = cfg.train
        if tc.method == "focal":
            raise ValueError(
                "method 'focal' is not supported for multi-task data; use onego, ce, posthoc or label_smoothing"
            )
        return cls(tasks, tc.label_smoothing if tc.method == "label_smoothing" else 0.0)

    def create_model(self, cfg: RunConfig, data: Any) -> nn.Module:
        """A `MultiTaskClassifier`: the named backbone with one head per task."""
        from calib_core.models.multitask import MultiTaskClassifier

        return MultiTaskClassifier.create(cfg.model.name, self.tasks, tuple(data.input_shape), **cfg.model.kwargs)

    def check_model(self, model: nn.Module) -> None:
        """The model needs one head per task."""
        if len(model_heads(model)) != len(self.tasks):
            raise ValueError(f"the model has {len(model_heads(model))} heads for {len(self.tasks)} tasks")

    def create_calibrator(self, name: str, kwargs: dict[str, Any], model: nn.Module) -> nn.Module:
        """One calibrator per task (with last_layer: the task's head), as a ModuleList."""
        fd = getattr(model, "feature_dim", None)
        return nn.ModuleList(
            [
                create_calibrator(name, k, feature_dim=fd, head=model_heads(model)[t], **kwargs)
                for t, (_, k) in enumerate(self.tasks)
            ]
        )

    def calibrators(self, module: nn.Module | None) -> list[Calibrator]:
        """The per-task calibrators, typed (ModuleList items are typed as plain modules)."""
        return [] if module is None else [cast(Calibrator, c) for c in cast(nn.ModuleList, module)]

    def inputs(self, model: nn.Module, calibrators: list[Calibrator], x: Tensor) -> list[Tensor]:
        """Each task's calibrator input: the shared features, or the logits of the task's head."""
        f = model_features(model, x)
        kinds = [c.input_kind for c in calibrators] if calibrators else ["logits"] * len(self.tasks)
        return [f if kinds[t] == "features" else head(f) for t, head in enumerate(model_heads(model))]

    def calibrator_loss(
        self, calibrators: list[Calibrator], inputs: list[Tensor], labels: Tensor
    ) -> tuple[Tensor, list[int]] | None:
        """Sum over the tasks with labelled rows of masked CE plus regularization."""
        counts = (labels >= 0).sum(0).tolist()
        live = [t for t in range(len(self.tasks)) if counts[t] > 0]
        if not live:
            return None
        terms = [
            add_regularization(masked_cross_entropy(calibrators[t](inputs[t]), labels[:, t]), calibrators[t])
            for t in live
        ]
        return cast(Tensor, sum(terms)), live  # a tensor: live is not empty

    def backbone_loss(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        lookahead: CalibratorBatch | None,
        calibrator_lr: float,
    ) -> Tensor:
        """sum_t masked CE_t of the calibrated logits (a task's look-ahead uses its labelled rows)."""
        losses = []
        for t, z in enumerate(inputs):
            cal = calibrators[t] if calibrators else None
            if cal is None:
                out = z
            elif lookahead is not None:
                keep = lookahead.labels[:, t] >= 0
                if bool(keep.any()):
                    new = lookahead_params(cal, lookahead.inputs[t][keep], lookahead.labels[keep, t], calibrator_lr)
                    out = functional_call(cal, new, (z,))
                else:
                    out = cal(z)
            else:
                out = cal(z)
            losses.append(masked_cross_entropy(out, labels[:, t], self.smoothing))
        return torch.stack(losses).sum()

    @property
    def num_tasks(self) -> int:
        """How many tasks (and calibrators)."""
        return len(self.tasks)

    def labelled_rows(self, labels: Tensor, task: int) -> tuple[Tensor | None, Tensor]:
        """Task `task`'s labelled rows of `labels` (N, T) (label -1 = missing) and their labels."""
        rows = (labels[:, task] >= 0).nonzero().squeeze(1)
        return rows, labels[rows, task]

    def task_name(self, task: int) -> str | None:
        """The task's name."""
        return self.tasks[task][0]

    def metrics(self, logits: list[Tensor], labels: Tensor, num_bins: int) -> dict[str, float]:
        """`multitask_metrics`: per task on its labelled rows, and the means over tasks."""
        return multitask_metrics(logits, labels, self.tasks, num_bins=num_bins)

    def calibrated_model(self, model: nn.Module, calibrator: nn.Module | None) -> MultiTaskCalibratedModel:
        """`MultiTaskCalibratedModel(model, calibrators, tasks)`."""
        return MultiTaskCalibratedModel(model, cast("nn.ModuleList | None", calibrator), self.tasks)

    def calibrator_info(self, calibrators: list[Calibrator], name: str, stages: int) -> dict[str, Any]:
        """Totals over the tasks, each task's numeric calibrator fields (`<task>_<field>`), and `per_task`."""
        info: dict[str, Any] = {
            "calibrator": name,
            "num_params": 0,
            "num_tasks": len(self.tasks),
            "calibration_stages": stages,
        }
        if not calibrators:
            return info
        per = {n: cal.describe() for (n, _), cal in zip(self.tasks, calibrators)}
        info["num_params"] = int(sum(int(d.get("num_params", 0)) for d in per.values()))
        for n, d in per.items():
            for k, v in d.items():
                if k not in ("calibrator", "num_params") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    info[f"{n}_{k}"] = v
        info["per_task"] = per
        return info

    def result(self, common: dict[str, Any], val: Evaluation | None, test: Evaluation | None) -> MultiTaskTrainResult:
        """A `MultiTaskTrainResult`: every task's predictions, and the first task's as the single-task view."""
        vp, vl = _first_task(val)
        tp, tl = _first_task(test)
        return MultiTaskTrainResult(
            **common,
            val_metrics=val.metrics if val is not None else {},
            test_metrics=test.metrics if test is not None else {},
            val_probs=vp,
            val_labels=vl,
            test_probs=tp,
            test_labels=tl,
            tasks=self.tasks,
            task_val_probs=val.probs if val is not None else None,
            task_val_labels=val.labels if val is not None else None,
            task_test_probs=test.probs if test is not None else None,
            task_test_labels=test.labels if test is not None else None,
            calibration_stages=int(common["calibrator_info"].get("calibration_stages", 0)),
        )


def _first_task(ev: Evaluation | None) -> tuple[Tensor | None, Tensor | None]:
    """The first task's labelled rows: probabilities and labels."""
    if ev is None:
        return None, None
    keep = ev.labels[:, 0] >= 0
    return ev.probs[0][keep], ev.labels[keep, 0]


class MultiTaskTrainer(Trainer):
    """`MultiTaskTrainer(cfg, data, device).fit(on_epoch=None, resume_state=None)` (module docstring):
    the `Trainer` loop with the `MultiTask` strategy.

    `model` may be a ready-made `MultiTaskClassifier` (`.features`, `.heads`, `.feature_dim`).
    """

    def __init__(
        self,
        cfg: RunConfig,
        data: Any,
        device: str | torch.device | None = None,
        *,
        model: nn.Module | None = None,
        posthoc_fit: PosthocFit | None = None,
    ) -> None:
        super().__init__(cfg, data, device, model=model, strategy=MultiTask.for_run(cfg, data), posthoc_fit=posthoc_fit)

    @property
    def tasks(self) -> tuple[tuple[str, int], ...]:
        """(name, num_classes) per task."""
        return cast(MultiTask, self.strategy).tasks


__all__ = [
    "MultiTask",
    "MultiTaskCalibratedModel",
    "MultiTaskTrainResult",
    "MultiTaskTrainer",
    "masked_cross_entropy",
    "multitask_metrics",
]

"""Multi-task one-go calibration: a shared backbone, one head and one calibrator per task.

`MultiTaskTrainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> MultiTaskTrainResult`
for data with `data.tasks` set (labels (N, T), -1 = missing; calib_core.data.multitask).

It is the single-task `Trainer` with the per-batch pieces replaced; the step loop
(`train_epoch`: batch orders, calibrator batch sources, K_c, warm-up), the epoch loop
(`fit`), divergence checks, the state snapshot and bit-for-bit resume are inherited unchanged.

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
from dataclasses import dataclass, field, fields
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from calib_core.calibrators import Calibrator, create_calibrator, fit_posthoc
from calib_core.config import RunConfig

from .calibrator_batches import HoldoutCycler, kfold_indices
from .hypergradient import lookahead_params
from .result import Evaluation, TrainResult, model_features, model_submodule
from .schedule import backbone_optimizer, backbone_param_groups, calibrator_optimizer, lr_scheduler
from .trainer import EVAL_BATCH, Diverged, Trainer, _cpu_copy, crossfit_posthoc

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
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            chunks = [self(xb.to(device)) for xb in x.split(batch_size)]
        finally:
            self.train(was_training)
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
    extra: dict[str, Any] = field(default_factory=dict)


class MultiTaskTrainer(Trainer):
    """`MultiTaskTrainer(cfg, data, device).fit(on_epoch=None, resume_state=None)` (module docstring).

    `model` may be a ready-made `MultiTaskClassifier` (`.features`, `.heads`, `.feature_dim`).
    """

    # one calibrator per task where Trainer has one: Trainer's methods that use a single
    # calibrator are all overridden here (as the `type: ignore[override]`s below record)
    calibrator: nn.ModuleList | None  # type: ignore[assignment]
    train_calibrator: nn.ModuleList | None  # type: ignore[assignment]

    def __init__(
        self, cfg: RunConfig, data: Any, device: str | torch.device | None = None, *, model: nn.Module | None = None
    ) -> None:
        tasks = getattr(data, "tasks", None)
        if not tasks:
            raise ValueError(
                "MultiTaskTrainer needs multi-task data (data.tasks set); use Trainer for single-task data"
            )
        self.tasks = tuple((str(n), int(k)) for n, k in tasks)
        T = len(self.tasks)
        for split_name in ("train", "val", "test"):
            y = getattr(data, split_name).y
            if y.dim() != 2 or y.shape[1] != T:
                raise ValueError(f"multi-task {split_name} labels must be (N, {T}), got {tuple(y.shape)}")
        self.cfg = cfg
        tc = self.tc = cfg.train
        if tc.method == "focal":
            raise ValueError(
                "method 'focal' is not supported for multi-task data; use onego, ce, posthoc or label_smoothing"
            )
        self._setup_run(cfg, data, device)

        if model is None:
            from calib_core.models.multitask import MultiTaskClassifier

            model = MultiTaskClassifier.create(cfg.model.name, self.tasks, tuple(data.input_shape), **cfg.model.kwargs)
        if len(model_heads(model)) != T:
            raise ValueError(f"the model has {len(model_heads(model))} heads for {T} tasks")
        self.model = model.to(self.device)

        # which samples each player trains on (as in Trainer); one calibrator per task
        # (with last_layer: the task's head)
        name, kwargs = self._plan_data_and_calibrator(cfg)
        self.calibrator_name = name or "none"
        self.calibrator = None
        if name is not None:
            fd = getattr(self.model, "feature_dim", None)
            self.calibrator = nn.ModuleList(
                [
                    create_calibrator(name, k, feature_dim=fd, head=model_heads(self.model)[t], **kwargs)
                    for t, (_, k) in enumerate(self.tasks)
                ]
            ).to(self.device)
        self._cal_init = _cpu_copy(self.calibrator.state_dict()) if self.calibrator is not None else None
        self.train_calibrator = self.calibrator if self.method == "onego" else None
        self._posthoc_tasks: list[int] = []
        if self.method == "posthoc":
            y_fit = (
                self.val_split.y if tc.posthoc_split == "val" else self.train_split.y[self.holdout_idx.to(self.device)]
            )
            self._posthoc_tasks = [t for t in range(T) if bool((y_fit[:, t] >= 0).any())]

        # the players' parameters and optimizers
        last_layer = self.method == "onego" and tc.calibrator == "last_layer"
        head_ids = {id(p) for p in model_heads(self.model).parameters()} if last_layer else set()
        self.feature_params = [p for p in self.model.parameters() if id(p) not in head_ids]
        self.head_params = list(model_heads(self.model).parameters()) if last_layer else []
        if not self.feature_params:
            raise ValueError(
                "the backbone has no parameters besides the heads: nothing for the backbone player to train"
            )
        self.head_warmup = last_layer and tc.warmup_epochs > 0
        groups = backbone_param_groups(
            self.feature_params, model_heads(self.model), self.head_params if self.head_warmup else [], tc
        )
        self.backbone_opt = backbone_optimizer(groups, tc)
        self.scheduler = lr_scheduler(self.backbone_opt, tc)
        self.task_cal_params: list[list[nn.Parameter]] = (
            [[p for p in c.parameters() if p.requires_grad] for c in self.train_calibrator]
            if self.train_calibrator is not None
            else []
        )
        self.cal_params = [p for ps in self.task_cal_params for p in ps]
        self.calibrator_opt = calibrator_optimizer(self.cal_params, tc) if self.cal_params else None
        self.smoothing = tc.label_smoothing if self.method == "label_smoothing" else 0.0
        self.loss_fn = None  # the backbone's loss is the masked per-task CE
        self.cycler = HoldoutCycler(self.holdout_idx, tc.batch_size, cfg.seed) if self.cal_source == "holdout" else None

        # progress
        self.epoch = 0
        self.history: list[dict[str, float]] = []
        self.epoch_times: list[float] = []
        self.wall_time_before = 0.0
        self.best: dict[str, Any] = {}
        self.trace: list[tuple[str, Tensor]] | None = None
        self._check_every = 1 if self.device.type == "cpu" else 25

    @property
    def task_names(self) -> list[str]:
        return [n for n, _ in self.tasks]

    # ------------------------------------------------------------------ inputs and steps
    def _task_calibrators(self) -> list[Calibrator]:
        """The per-task calibrators, typed (ModuleList items are typed as plain modules)."""
        assert self.calibrator is not None  # the method has calibrators
        return [cast(Calibrator, cal) for cal in self.calibrator]

    def _task_calibrator(self, t: int) -> Calibrator:
        assert self.calibrator is not None  # the method has calibrators
        return cast(Calibrator, self.calibrator[t])

    def _kind(self, t: int) -> str:
        return self._task_calibrator(t).input_kind if self.calibrator is not None else "logits"

    def _inputs_from_features(self, f: Tensor) -> list[Tensor]:
        return [f if self._kind(t) == "features" else head(f) for t, head in enumerate(model_heads(self.model))]

    def _cal_inputs(self, x: Tensor, grad: bool = False) -> list[Tensor]:  # type: ignore[override]
        """Each task's calibrator input (logits of its head, or the shared features), eval mode."""
        was = self.model.training
        self.model.eval()
        try:
            with torch.set_grad_enabled(grad):
                return self._inputs_from_features(model_features(self.model, x))
        finally:
            self.model.train(was)

    def _calibrator_step(self, idx: Tensor, epoch: int, step: int, inp: list[Tensor] | None = None) -> list[Tensor]:  # type: ignore[override]
        """One CE step of every task's calibrator on its labelled rows of batch `idx`."""
        y = self.train_split.y[idx]
        if inp is None:
            inp = self._cal_inputs(self.train_split.x[idx])
        counts = (y >= 0).sum(0).tolist()
        live = [t for t in range(len(self.tasks)) if counts[t] > 0]
        if live:
            cals = self._task_calibrators()
            terms = [masked_cross_entropy(cals[t](inp[t]), y[:, t]) + cals[t].regularization() for t in live]
            total = cast(Tensor, sum(terms))  # a tensor: live is not empty
            self._check(total, "calibrator loss", epoch, step)
            params = [p for t in live for p in self.task_cal_params[t]]
            grads = torch.autograd.grad(total, params)
            for p in self.cal_params:
                p.grad = None  # tasks without labels here do not step (the optimizer skips them)
            for p, g in zip(params, grads):
                p.grad = g
            assert self.calibrator_opt is not None  # the one-go method's
            self.calibrator_opt.step()
            for p in params:
                p.grad = None  # spent (with last_layer these are the heads': see Trainer._apply_backbone_step)
        if self.trace is not None:
            self.trace.append(("calibrator", idx.cpu()))
        return inp

    def backbone_loss(
        self, x: Tensor, y: Tensor, calibrating: bool = True, cal_x: Tensor | None = None, cal_y: Tensor | None = None
    ) -> Tensor:
        """sum_t masked CE_t of the calibrated logits (train mode, graph to the backbone)."""
        self.model.train()
        inputs = self._inputs_from_features(model_features(self.model, x))
        cals = self.train_calibrator
        unrolled = cals is not None and calibrating and self.tc.hypergradient == "unrolled"
        cal_inp = None
        if unrolled:
            assert cal_x is not None  # the calibrator's batch, given whenever the calibrator trains
            cal_inp = self._cal_inputs(cal_x, grad=True)
        losses = []
        for t, z in enumerate(inputs):
            cal = cast(Calibrator, cals[t]) if cals is not None else None
            if cal is None:
                out = z
            elif unrolled:
                assert cal_y is not None and cal_inp is not None  # set with cal_x above
                keep = cal_y[:, t] >= 0
                if bool(keep.any()):
                    new = lookahead_params(cal, cal_inp[t][keep], cal_y[keep, t], self.tc.calibrator_lr)
                    out = functional_call(cal, new, (z,))
                else:
                    out = cal(z)
            else:
                out = cal(z)
            losses.append(masked_cross_entropy(out, y[:, t], self.smoothing))
        return torch.stack(losses).sum()

    def _backbone_step(
        self, idx: Tensor, aug_gen: torch.Generator, epoch: int, step: int, calibrating: bool, cal_idx: Tensor | None
    ) -> Tensor:
        x, y = self.train_split.x[idx], self.train_split.y[idx]
        if self._augment is not None:
            x = self._augment(x, aug_gen)
        cx = cy = None
        if cal_idx is not None:
            cx, cy = self.train_split.x[cal_idx], self.train_split.y[cal_idx]
        loss = self.backbone_loss(x, y, calibrating, cx, cy)
        return self._apply_backbone_step(loss, epoch, step, calibrating, idx)

    def fit_posthoc(self) -> None:
        """One post-hoc stage per task: refit task t's calibrator from the identity on its
        labelled holdout rows of the cached inputs."""
        assert self.calibrator is not None and self._cal_init is not None  # the post-hoc method's
        self.calibrator.load_state_dict(self._cal_init)
        if self.tc.posthoc_split == "val":
            self._fit_posthoc_val()
            return
        hold = self.holdout_idx.to(self.device)
        x, y = self.train_split.x[hold], self.train_split.y[hold]
        chunks = [self._cal_inputs(xb) for xb in x.split(EVAL_BATCH)]
        for t in self._posthoc_tasks:
            inp = torch.cat([c[t] for c in chunks])
            keep = y[:, t] >= 0
            inp_t = inp[keep]
            if not bool(torch.isfinite(inp_t).all()):
                raise Diverged(f"non-finite logits of task {self.tasks[t][0]!r} on the post-hoc holdout")
            fit_posthoc(self._task_calibrator(t), inp_t, y[keep, t])

    def _fit_posthoc_val(self) -> None:
        """posthoc_split 'val': task t's calibrator on its labelled validation rows; the cross-fitted
        (out-of-fold) logits of those rows are what the validation metrics see."""
        val = self.val_split
        chunks = [self._cal_inputs(xb) for xb in val.x.split(EVAL_BATCH)]
        out: list[Tensor] = []
        for t in range(len(self.tasks)):
            inp = torch.cat([c[t] for c in chunks])
            if t not in self._posthoc_tasks:
                out.append(inp)
                continue
            keep = (val.y[:, t] >= 0).nonzero().squeeze(1)
            if not bool(torch.isfinite(inp[keep]).all()):
                raise Diverged(f"non-finite logits of task {self.tasks[t][0]!r} on the validation split (post-hoc fit)")
            cal = self._task_calibrator(t)
            init = _cpu_copy(cal.state_dict())
            folds = [f.to(self.device) for f in kfold_indices(len(keep), self.tc.posthoc_folds, self.seed + 7919 * t)]
            z_keep = crossfit_posthoc(cal, init, inp[keep], val.y[keep, t], folds)
            with torch.no_grad():
                z = cal(inp)  # unlabelled rows never enter a metric
            z[keep] = z_keep
            out.append(z)
        self._crossfit_val = out

    def _calibrator_problem(self) -> str | None:
        """The first task's calibrator whose `divergence()` reports a problem, named."""
        if self.calibrator is None:
            return None
        for (name, _), cal in zip(self.tasks, self._task_calibrators()):
            problem = cal.divergence()
            if problem is not None:
                return f"task {name!r}: {problem}"
        return None

    # ------------------------------------------------------------------ evaluation
    @property
    def calibrated_model(self) -> MultiTaskCalibratedModel:  # type: ignore[override]
        return MultiTaskCalibratedModel(self.model, self.calibrator, self.tasks)

    def evaluate(self, split: Any, where: str) -> Evaluation:
        """Per-task and mean metrics, and every task's calibrated probabilities, on `split`."""
        if split is self.val_split and self._crossfit_val is not None:
            logits = [z.float() for z in self._crossfit_val]  # posthoc_split 'val': out-of-fold calibrated logits
        else:
            logits = [z.float() for z in self.calibrated_model.predict_logits(split.x, EVAL_BATCH)]
        if not all(bool(torch.isfinite(z).all()) for z in logits):
            raise Diverged(f"non-finite calibrated logits on the {where} split")
        metrics = multitask_metrics(logits, split.y, self.tasks, num_bins=self.tc.num_bins)
        return Evaluation(metrics, [torch.softmax(z, dim=1).cpu() for z in logits], split.y.cpu())

    def calibrator_info(self) -> dict[str, Any]:
        stages = len(self._posthoc_tasks) if self.method == "posthoc" else 0
        info: dict[str, Any] = {
            "calibrator": self.calibrator_name,
            "num_params": 0,
            "num_tasks": len(self.tasks),
            "calibration_stages": stages,
        }
        if self.calibrator is None:
            return info
        per = {name: cal.describe() for (name, _), cal in zip(self.tasks, self._task_calibrators())}
        info["num_params"] = int(sum(int(d.get("num_params", 0)) for d in per.values()))
        for name, d in per.items():
            for k, v in d.items():
                if k not in ("calibrator", "num_params") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    info[f"{name}_{k}"] = v
        info["per_task"] = per
        return info

    def _result(self, status: str, reason: str | None, wall: float, val: Evaluation | None,
                test: Evaluation | None) -> MultiTaskTrainResult:
        res = super()._result(status, reason, wall, val, test)
        base = {f.name: getattr(res, f.name) for f in fields(TrainResult)}
        tvp, ttp = (val.probs if val is not None else None), (test.probs if test is not None else None)
        tvl, ttl = res.val_labels, res.test_labels
        base["val_probs"], base["val_labels"] = _first_task(tvp, tvl)
        base["test_probs"], base["test_labels"] = _first_task(ttp, ttl)
        return MultiTaskTrainResult(
            **base,
            tasks=self.tasks,
            task_val_probs=tvp,
            task_val_labels=tvl,
            task_test_probs=ttp,
            task_test_labels=ttl,
            calibration_stages=int(res.calibrator_info.get("calibration_stages", 0)),
        )


def _first_task(probs: list[Tensor] | None, labels: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    if probs is None or labels is None:
        return None, None
    keep = labels[:, 0] >= 0
    return probs[0][keep], labels[keep, 0]


__all__ = [
    "MultiTaskCalibratedModel",
    "MultiTaskTrainResult",
    "MultiTaskTrainer",
    "masked_cross_entropy",
    "multitask_metrics",
]

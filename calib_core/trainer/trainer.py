"""The one-go trainer (docs/design.md section 3) and its baselines, in one step loop.

Players: the backbone theta (the whole model; with `last_layer` everything but the head) and
the calibrator phi (with `last_layer`: the model's head). Each has its own optimizer. Per step:
  1. (after warm-up) the calibrator takes K_c CE steps on its batches, backbone outputs
     detached and computed in eval mode, i.e. on the model as it is evaluated;
  2. the backbone takes one step of its loss through the frozen calibrator on its own batch
     (`unrolled`: through the calibrator's one-step look-ahead, see hypergradient.py).
With `calibrator_data: same` on a model whose forward does not depend on the mode (no
BatchNorm, no dropout: modes.py) and without augmentation, the eval-mode outputs of the batch
are the training forward's, so one forward serves both players (`_shared_step`, bit-identical
to the two-forward order); otherwise the calibrator's inputs take their own eval-mode forward.
With `last_layer` and `warmup_epochs > 0` the head trains with the backbone (in the backbone
optimizer) during the warm-up and only through the calibrator's optimizer after it.
Baselines share the loop: `ce`, `label_smoothing`, `focal` (no calibrator, full train split)
and `posthoc` (CE on the non-holdout part; the calibrator is refitted from the identity with
LBFGS on the holdout's cached logits after every epoch, so each epoch's val metrics are those
of the model one would get by stopping there). With `posthoc_split: val` the backbone trains
on the whole training split and the calibrator is fitted on the validation split; the
validation metrics are then k-fold cross-fitted (`crossfit_posthoc`: each validation example
is calibrated by a calibrator fitted on the other folds), so that selecting on them stays
honest, while the returned model's calibrator is fitted on the whole validation split.
`posthoc_refit: end` fits once, after training, instead of after every epoch.
`early_stopping_patience` stops after that many epochs without a lower validation NLL and
returns the model (and calibrator) of the best epoch.

Single- and multi-task runs share this one loop: what differs (the calibrator(s), their inputs,
the losses, post-hoc fits, metrics, the calibrated model and the result type) is a `TaskStrategy`
(strategy.py). `single_task.SingleTask` is the default; `multitask.MultiTask` is the other. Post-hoc
fits go through the `posthoc_fit` the trainer is given (posthoc.py; default LBFGS).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from calib_core.config import RunConfig

from .calibrator_batches import HoldoutCycler, derive_seed, epoch_batches, generator
from .modes import ModeSwitch, forward_is_mode_free
from .plan import plan_run
from .posthoc import DEFAULT_FIT, PosthocFit
from .result import EpochReport, Evaluation, TrainResult, model_submodule
from .schedule import backbone_optimizer, backbone_param_groups, calibrator_optimizer, lr_scheduler
from .single_task import SingleTask
from .snapshot import cpu_copy, differing_keys, numpy_rng_state, set_numpy_rng_state
from .strategy import EVAL_BATCH, CalibratorBatch, Diverged, TaskStrategy

STATE_VERSION = 1
# config fields that may differ between a run and its resumption
_RESUME_FREE = {"device", "num_threads"}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' (or None) -> cuda if available else cpu."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """`Trainer(cfg, data, device).fit(on_epoch=None, resume_state=None) -> TrainResult`.

    `model` may be passed to use a ready-made classifier (with `.features`, `.head`,
    `.feature_dim`) instead of `create_model(cfg.model.name, ...)`. `strategy` selects single-
    or multi-task behaviour (default: `SingleTask`; `MultiTaskTrainer` passes `MultiTask`).
    """

    # posthoc_split 'val': the cross-fitted validation logits of the current model (see evaluate)
    _crossfit_val: list[Tensor] | None = None
    # early_stopping_patience: the best epoch's model and calibrator states (CPU)
    _best_weights: dict[str, Any] | None = None
    # perf_counter() when the current fit() started (None outside a fit)
    _fit_start: float | None = None

    def _setup_run(self, cfg: RunConfig, data: Any, device: str | torch.device | None) -> None:
        """Device, threads, seeds, and the splits moved to the device."""
        self.device = resolve_device(device if device is not None else cfg.device)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        seed_everything(cfg.seed)
        self.seed = cfg.seed
        self.num_classes = int(data.num_classes)
        self.train_split = data.train.to(self.device)
        self.val_split = data.val.to(self.device)
        self.test_split = data.test.to(self.device)
        self._augment = getattr(data, "augment", None)
        # whether that changes a batch (DataSplits.augment is the identity while `augmentation` is None)
        self._augments = self._augment is not None and getattr(data, "augmentation", True) is not None

    def __init__(
        self,
        cfg: RunConfig,
        data: Any,
        device: str | torch.device | None = None,
        *,
        model: nn.Module | None = None,
        strategy: TaskStrategy | None = None,
        posthoc_fit: PosthocFit | None = None,
    ) -> None:
        self.strategy = strategy if strategy is not None else SingleTask.for_run(cfg, data)
        self.posthoc_fit = posthoc_fit if posthoc_fit is not None else DEFAULT_FIT
        self.cfg = cfg
        tc = self.tc = cfg.train
        self._setup_run(cfg, data, device)

        if model is None:
            model = self.strategy.create_model(cfg, data)
        self.strategy.check_model(model)
        self.model = model.to(self.device)

        # which samples each player trains on, and the calibrator (with last_layer: the model's head(s))
        plan = plan_run(tc, len(self.train_split), cfg.seed)
        self.method, self.cal_source = plan.method, plan.cal_source
        self.backbone_idx, self.holdout_idx = plan.backbone_idx, plan.holdout_idx
        self.calibrator_name = plan.calibrator or "none"
        self.calibrator: nn.Module | None = None
        if plan.calibrator is not None:
            self.calibrator = self.strategy.create_calibrator(plan.calibrator, plan.calibrator_kwargs, self.model).to(
                self.device
            )
        self._cal_init = cpu_copy(self.calibrator.state_dict()) if self.calibrator is not None else None
        self.calibrators = self.strategy.calibrators(self.calibrator)
        self.train_calibrators = self.calibrators if self.method == "onego" else []  # in the training graph
        self.posthoc_tasks: list[int] = []  # the calibrators a post-hoc fit fits (those with labelled rows)
        if self.method == "posthoc":
            y_fit = (
                self.val_split.y if tc.posthoc_split == "val" else self.train_split.y[self.holdout_idx.to(self.device)]
            )
            self.posthoc_tasks = self.strategy.labelled_tasks(y_fit)

        # the players' parameters and optimizers
        last_layer = self.method == "onego" and tc.calibrator == "last_layer"
        head = model_submodule(self.model, self.strategy.head_name)
        head_ids = {id(p) for p in head.parameters()} if last_layer else set()
        self.feature_params = [p for p in self.model.parameters() if id(p) not in head_ids]
        self.head_params = list(head.parameters()) if last_layer else []
        if not self.feature_params:
            raise ValueError(
                f"the backbone has no parameters besides the {self.strategy.head_name}: "
                "nothing for the backbone player to train"
            )
        self.head_warmup = last_layer and tc.warmup_epochs > 0
        groups = backbone_param_groups(self.feature_params, head, self.head_params if self.head_warmup else [], tc)
        self.backbone_opt = backbone_optimizer(groups, tc)
        self.scheduler = lr_scheduler(self.backbone_opt, tc)
        # each calibrator's trainable parameters (the calibrators share one optimizer over disjoint
        # parameters, so one calibrator's step depends only on its own loss)
        self.task_cal_params = [[p for p in c.parameters() if p.requires_grad] for c in self.train_calibrators]
        self.cal_params = [p for ps in self.task_cal_params for p in ps]
        self.calibrator_opt = calibrator_optimizer(self.cal_params, tc) if self.cal_params else None
        self.cycler = HoldoutCycler(self.holdout_idx, tc.batch_size, cfg.seed) if self.cal_source == "holdout" else None

        # progress
        self.epoch = 0  # epochs completed
        self.history: list[dict[str, float]] = []
        self.epoch_times: list[float] = []
        self.wall_time_before = 0.0
        self.best: dict[str, Any] = {}
        self.trace: list[tuple[str, Tensor]] | None = None  # set to [] to record the indices each player steps on
        self._check_every = 1 if self.device.type == "cpu" else 25
        # the eval-mode switch around calibrator forwards (skipped where the mode changes nothing), and
        # whether `calibrator_data: same` takes the calibrator's inputs from the backbone's own training
        # forward: only where that forward is the eval-mode one (mode-free model, no augmentation), so
        # the numbers are those of the separate eval-mode forward, bit for bit (docs/design.md section 3)
        self._mode_free = forward_is_mode_free(self.model)
        self._modes = ModeSwitch(self.model)
        self.shared_forward = self.cal_source == "same" and self._mode_free and not self._augments

    # ------------------------------------------------------------------ inputs and steps
    def _cal_inputs(self, x: Tensor, grad: bool = False) -> list[Tensor]:
        """What each calibrator consumes (logits or features), computed in eval mode."""
        if self._mode_free:  # eval mode would compute the same function
            with torch.set_grad_enabled(grad):
                return self.strategy.inputs(self.model, self.calibrators, x)
        was = self.model.training
        self._modes.set(False)
        try:
            with torch.set_grad_enabled(grad):
                return self.strategy.inputs(self.model, self.calibrators, x)
        finally:
            self._modes.set(was)

    def _cached_inputs(self, x: Tensor) -> list[Tensor]:
        """`_cal_inputs` of a whole split, computed in EVAL_BATCH chunks."""
        chunks = [self._cal_inputs(xb) for xb in x.split(EVAL_BATCH)]
        return [torch.cat([c[t] for c in chunks]) for t in range(len(chunks[0]))] if chunks else []

    def _check(self, loss: Tensor, what: str, epoch: int, step: int) -> None:
        """Stop on a NaN/inf loss or one above cfg.train.divergence_loss (checked every step on
        the CPU, every `_check_every` steps on an accelerator, where each check is a sync)."""
        if step % self._check_every:
            return
        value = loss.item()
        if not np.isfinite(value):
            raise Diverged(f"non-finite {what} ({value}) at epoch {epoch + 1}, step {step + 1}")
        limit = self.tc.divergence_loss
        if limit is not None and value > limit:
            raise Diverged(
                f"{what} exploded ({value:.3g} > divergence_loss={limit:g}) at epoch {epoch + 1}, step {step + 1}"
            )

    def _calibrator_step(
        self, idx: Tensor, epoch: int, step: int, inp: list[Tensor] | None = None, y: Tensor | None = None
    ) -> None:
        """One CE step of the calibrator(s) on batch `idx` (inputs detached; pass `inp` to reuse
        inputs already computed for this batch under the current backbone, `y` its labels). A
        calibrator without a labelled row in the batch does not step (its gradient stays None)."""
        if y is None:
            y = self.train_split.y[idx]
        if inp is None:
            inp = self._cal_inputs(self.train_split.x[idx])
        step_loss = self.strategy.calibrator_loss(self.train_calibrators, inp, y)
        if step_loss is not None:
            loss, live = step_loss
            self._check(loss, "calibrator loss", epoch, step)
            params = [p for t in live for p in self.task_cal_params[t]]
            grads = torch.autograd.grad(loss, params)
            for p in self.cal_params:
                p.grad = None  # calibrators without labels here do not step (the optimizer skips them)
            for p, g in zip(params, grads):
                p.grad = g
            assert self.calibrator_opt is not None  # set whenever there are calibrator parameters
            self.calibrator_opt.step()
            for p in params:
                p.grad = None  # spent (with last_layer these are the head's: see _apply_backbone_step)
        if self.trace is not None:
            self.trace.append(("calibrator", idx.cpu()))

    def backbone_loss(
        self, x: Tensor, y: Tensor, calibrating: bool = True, cal_x: Tensor | None = None, cal_y: Tensor | None = None
    ) -> Tensor:
        """The backbone's loss on (x, y) through the frozen calibrator(s) (train mode, graph to the
        backbone); with hypergradient `unrolled` while calibrating, through their look-ahead on
        the calibrator batch (cal_x, cal_y)."""
        self.model.train()
        cals = self.train_calibrators
        inputs = self.strategy.inputs(self.model, cals, x)
        lookahead = None
        if cals and calibrating and self.tc.hypergradient == "unrolled":
            assert cal_x is not None and cal_y is not None  # the calibrator's batch, given whenever it trains
            lookahead = CalibratorBatch(self._cal_inputs(cal_x, grad=True), cal_y)
        return self.strategy.backbone_loss(cals, inputs, y, lookahead, self.tc.calibrator_lr)

    def _backbone_step(
        self, idx: Tensor, aug_gen: torch.Generator, epoch: int, step: int, calibrating: bool, cal_idx: Tensor | None
    ) -> Tensor:
        x, y = self.train_split.x[idx], self.train_split.y[idx]
        if self._augment is not None:
            x = self._augment(x, aug_gen)
        cx = cy = None
        if cal_idx is not None and self.tc.hypergradient == "unrolled":  # only the look-ahead reads them
            cx, cy = self.train_split.x[cal_idx], self.train_split.y[cal_idx]
        loss = self.backbone_loss(x, y, calibrating, cx, cy)
        return self._apply_backbone_step(loss, epoch, step, calibrating, idx)

    def _shared_step(self, idx: Tensor, epoch: int, step: int) -> Tensor:
        """`calibrator_data: same` on a mode-free model without augmentation (`shared_forward`):
        one training forward of the batch gives the backbone its inputs and, detached, the
        calibrator its (they equal the eval-mode ones); then the K_c calibrator steps and the
        backbone's step through the stepped calibrator(s), exactly as the two-forward path."""
        x, y = self.train_split.x[idx], self.train_split.y[idx]
        self.model.train()
        cals = self.train_calibrators
        inputs = self.strategy.inputs(self.model, cals, x)
        detached = [z.detach() for z in inputs]
        for _ in range(self.tc.calibrator_steps):
            self._calibrator_step(idx, epoch, step, detached, y)
        lookahead = None
        if self.tc.hypergradient == "unrolled":  # the look-ahead's own forward, with its graph to the backbone
            lookahead = CalibratorBatch(self._cal_inputs(x, grad=True), y)
        loss = self.strategy.backbone_loss(cals, inputs, y, lookahead, self.tc.calibrator_lr)
        return self._apply_backbone_step(loss, epoch, step, True, idx)

    def _apply_backbone_step(self, loss: Tensor, epoch: int, step: int, calibrating: bool, idx: Tensor) -> Tensor:
        """Check the loss, then one optimizer step of the backbone's parameters on it."""
        self._check(loss, "backbone loss", epoch, step)
        head_in_warmup = self.head_warmup and not calibrating
        params = self.feature_params + (self.head_params if head_in_warmup else [])
        if self.head_warmup and not head_in_warmup:
            # after a last-layer warm-up the backbone optimizer still holds the head, which is
            # now the calibrator's alone: any gradient left on it (the calibrator's, from its
            # own step) must not make the backbone optimizer step it a second time
            for p in self.head_params:
                p.grad = None
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for p, g in zip(params, grads):
            p.grad = g
        if self.tc.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], self.tc.max_grad_norm)
        self.backbone_opt.step()
        for p in params:
            p.grad = None
        if self.trace is not None:
            self.trace.append(("backbone", idx.cpu()))
        return loss.detach()

    def train_epoch(self, epoch: int) -> float:
        """Train both players for epoch `epoch` (0-based); return the mean backbone loss."""
        tc = self.tc
        torch.manual_seed(derive_seed(self.seed, "global", epoch))  # dropout and other global draws
        batches = epoch_batches(self.backbone_idx, tc.batch_size, self.seed, epoch)
        next_first: Tensor | None = None
        aug_gen = generator(self.seed, "augment", epoch)
        calibrating = bool(self.train_calibrators) and epoch >= tc.warmup_epochs
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        dev = self.device
        for i, idx in enumerate(batches):
            cal_idx = None
            if calibrating and self.shared_forward:
                total += self._shared_step(idx.to(dev), epoch, i)
                continue
            if calibrating:
                if self.cal_source == "holdout":
                    assert self.cycler is not None  # set whenever cal_source is 'holdout'
                    for _ in range(tc.calibrator_steps):
                        cal_idx = self.cycler.next()
                        self._calibrator_step(cal_idx.to(dev), epoch, i)
                else:
                    if self.cal_source == "same":
                        cal_idx = idx
                    elif i + 1 < len(batches):
                        cal_idx = batches[i + 1]
                    else:  # lookahead at the end of an epoch: the next epoch's first batch
                        if next_first is None:
                            next_first = epoch_batches(self.backbone_idx, tc.batch_size, self.seed, epoch + 1)[0]
                        cal_idx = next_first
                    cal_dev = cal_idx.to(dev)
                    # the backbone does not move between these K_c steps: one forward
                    inp = self._cal_inputs(self.train_split.x[cal_dev])
                    for _ in range(tc.calibrator_steps):
                        self._calibrator_step(cal_dev, epoch, i, inp)
            loss = self._backbone_step(
                idx.to(dev), aug_gen, epoch, i, calibrating, cal_idx.to(dev) if cal_idx is not None else None
            )
            total += loss
        mean = float(total / max(1, len(batches)))
        if not np.isfinite(mean):
            raise Diverged(f"non-finite training loss in epoch {epoch + 1}")
        for where, mod in (("backbone", self.model), ("calibrator", self.calibrator)):
            if mod is not None and not all(bool(torch.isfinite(p).all()) for p in mod.parameters()):
                raise Diverged(f"non-finite {where} parameters after epoch {epoch + 1}")
        return mean

    def fit_posthoc(self) -> None:
        """Refit the post-hoc calibrator(s) from the identity on the holdout's cached inputs.

        posthoc_split 'val': on the validation split's, with cross-fitted validation logits."""
        assert self.calibrator is not None and self._cal_init is not None  # the post-hoc method's calibrator
        self.calibrator.load_state_dict(self._cal_init)
        if self.tc.posthoc_split == "val":
            val = self.val_split
            self._crossfit_val = self.strategy.crossfit_posthoc(
                self.calibrators,
                self._cached_inputs(val.x),
                val.y,
                self.posthoc_tasks,
                self.tc.posthoc_folds,
                self.seed,
                self.posthoc_fit,
            )
            return
        hold = self.holdout_idx.to(self.device)
        self.strategy.fit_posthoc(
            self.calibrators,
            self._cached_inputs(self.train_split.x[hold]),
            self.train_split.y[hold],
            self.posthoc_tasks,
            self.posthoc_fit,
        )

    def _calibrator_problem(self) -> str | None:
        """The calibrator's own divergence check (`Calibrator.divergence()`: its parameters and
        its effective parameters, e.g. temperature = exp(log T) overflowing to inf, which
        makes every prediction uniform while every loss stays finite); None when healthy."""
        return self.strategy.calibrator_problem(self.calibrators)

    def _check_calibrator(self, when: str) -> None:
        problem = self._calibrator_problem()
        if problem is not None:
            raise Diverged(f"calibrator diverged: {problem} {when}")

    # ------------------------------------------------------------------ evaluation
    @property
    def calibrated_model(self) -> nn.Module:
        """The backbone with its calibrator(s): inputs -> calibrated logits."""
        return self.strategy.calibrated_model(self.model, self.calibrator)

    def evaluate(self, split: Any, where: str) -> Evaluation:
        """Metrics and calibrated probabilities of the current model on `split` (named `where`)."""
        if split is self.val_split and self._crossfit_val is not None:
            logits = [z.float() for z in self._crossfit_val]  # posthoc_split 'val': out-of-fold calibrated logits
        else:
            logits = [z.float() for z in self.strategy.predict_logits(self.model, self.calibrator, split.x)]
        if not all(bool(torch.isfinite(z).all()) for z in logits):
            raise Diverged(f"non-finite calibrated logits on the {where} split")
        metrics = self.strategy.metrics(logits, split.y, self.tc.num_bins)
        return Evaluation(metrics, [torch.softmax(z, dim=1).cpu() for z in logits], split.y.cpu())

    def calibrator_info(self) -> dict[str, Any]:
        """What the calibrator(s) are and, post hoc, how many fits a final model needs."""
        return self.strategy.calibrator_info(self.calibrators, self.calibrator_name, len(self.posthoc_tasks))

    # ------------------------------------------------------------------ state
    def _config_key(self) -> dict:
        d = self.cfg.model_dump(mode="json")
        for k in _RESUME_FREE:
            d.pop(k, None)
        return d

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (tensors on the CPU and plain data: it loads with `torch.load(weights_only=True)`)
        that `fit(resume_state=...)` continues from."""
        rng = {"torch": torch.get_rng_state(), "numpy": numpy_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return cpu_copy(
            {
                "version": STATE_VERSION,
                "config": self._config_key(),
                "epoch": self.epoch,
                "model": self.model.state_dict(),
                "calibrator": self.calibrator.state_dict() if self.calibrator is not None else None,
                "backbone_optimizer": self.backbone_opt.state_dict(),
                "calibrator_optimizer": self.calibrator_opt.state_dict() if self.calibrator_opt is not None else None,
                "scheduler": self.scheduler.state_dict(),
                "holdout_indices": self.holdout_idx,
                "cycler": self.cycler.state_dict() if self.cycler is not None else None,
                # per-epoch generators are re-derived from (seed, stream, epoch); these are the
                # global generators' states at the snapshot
                "rng": rng,
                "history": self.history,
                "epoch_times": self.epoch_times,
                "wall_time": self.wall_time_before + self._running_time(),
                "best": self.best,
                "best_weights": self._best_weights,
            }
        )

    def _running_time(self) -> float:
        start = self._fit_start
        return time.perf_counter() - start if start is not None else 0.0

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` of a run of the same config and data split."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("resume_state is not a trainer state of this version")
        mine = self._config_key()
        if state["config"] != mine:
            diff = differing_keys(mine, state["config"])
            raise ValueError(f"resume_state was made by a different config (differs in: {', '.join(diff)})")
        if not torch.equal(state["holdout_indices"], self.holdout_idx):
            raise ValueError("resume_state's holdout indices differ from this run's (different data split?)")
        self.model.load_state_dict(state["model"])
        if self.calibrator is not None:
            self.calibrator.load_state_dict(state["calibrator"])
        self.backbone_opt.load_state_dict(state["backbone_optimizer"])
        if self.calibrator_opt is not None:
            self.calibrator_opt.load_state_dict(state["calibrator_optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.cycler is not None:
            self.cycler.load_state_dict(state["cycler"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        set_numpy_rng_state(rng["numpy"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.epoch = int(state["epoch"])
        self.history = [dict(h) for h in state["history"]]
        self.epoch_times = list(state["epoch_times"])
        self.wall_time_before = float(state["wall_time"])
        self.best = copy.deepcopy(state["best"])
        self._best_weights = state.get("best_weights")

    # ------------------------------------------------------------------ the loop
    def fit(
        self, on_epoch: Callable[[EpochReport], None] | None = None, resume_state: dict[str, Any] | None = None
    ) -> TrainResult:
        """Train the remaining epochs (from `resume_state` if given); `on_epoch` sees each epoch's report."""
        if resume_state is not None:
            self.load_state_dict(resume_state)
        self._fit_start = time.perf_counter()
        status, reason = "completed", None
        while self.epoch < self.tc.epochs and not self._early_stop():
            e = self.epoch
            t0 = time.perf_counter()
            lr = float(self.backbone_opt.param_groups[0]["lr"])
            try:
                train_loss = self.train_epoch(e)
                self.scheduler.step()
                if self.method == "posthoc" and self.tc.posthoc_refit == "every_epoch":
                    self.fit_posthoc()
                self._check_calibrator(f"after epoch {e + 1}")
                val = self.evaluate(self.val_split, "validation").metrics
            except Diverged as exc:
                status, reason = "diverged", self._with_calibrator_problem(str(exc))
                break
            dt = time.perf_counter() - t0
            self.epoch = e + 1
            metrics = {"train_loss": train_loss, "epoch_time": dt, "lr": lr}
            metrics.update({f"val_{k}": v for k, v in val.items()})
            for k, v in self.calibrator_info().items():
                if k != "num_params" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    metrics[f"calibrator_{k}"] = float(v)
            self.history.append(metrics)
            self.epoch_times.append(dt)
            if not self.best or metrics["val_nll"] < self.best["val_nll"]:
                self.best = {"epoch": self.epoch, "val_nll": metrics["val_nll"], "metrics": dict(metrics)}
                if self.tc.early_stopping_patience is not None:
                    cal_state = self.calibrator.state_dict() if self.calibrator is not None else None
                    self._best_weights = cpu_copy({"model": self.model.state_dict(), "calibrator": cal_state})
            if on_epoch is not None:
                on_epoch(EpochReport(epoch=self.epoch, metrics=dict(metrics), _state_fn=self.state_dict))
        return self._finish(status, reason)

    def _early_stop(self) -> bool:
        """early_stopping_patience epochs have passed without a lower validation NLL."""
        p = self.tc.early_stopping_patience
        return p is not None and bool(self.best) and self.epoch - int(self.best["epoch"]) >= p

    def _best_is_earlier(self) -> bool:
        """With early stopping, whether the best epoch's weights differ from the current ones."""
        return (
            self.tc.early_stopping_patience is not None
            and self._best_weights is not None
            and self.best.get("epoch") != self.epoch
        )

    def _restore_best(self) -> None:
        """Load the best epoch's model and calibrator (kept with early stopping)."""
        assert self._best_weights is not None  # see _best_is_earlier
        self.model.load_state_dict(self._best_weights["model"])
        if self.calibrator is not None and self._best_weights["calibrator"] is not None:
            self.calibrator.load_state_dict(self._best_weights["calibrator"])

    def _with_calibrator_problem(self, reason: str) -> str:
        """A divergence reason plus what became of the calibrator, when that is the cause
        (e.g. a NaN loss after the temperature underflowed to 0)."""
        if reason.startswith("calibrator diverged:"):
            return reason
        problem = self._calibrator_problem()
        return f"{reason}; calibrator diverged: {problem}" if problem is not None else reason

    def _finish(self, status: str, reason: str | None) -> TrainResult:
        val: Evaluation | None = None
        test: Evaluation | None = None
        if status == "completed":
            try:
                restored = self._best_is_earlier()
                if restored:
                    self._restore_best()
                if self.method == "posthoc" and (
                    restored
                    or self.tc.posthoc_refit == "end"
                    or (self.tc.posthoc_split == "val" and self._crossfit_val is None)
                ):
                    self.fit_posthoc()  # the returned model's calibrator (and cross-fitted validation logits)
                self._check_calibrator("at the end of the run")
                val = self.evaluate(self.val_split, "validation")
                test = self.evaluate(self.test_split, "test")  # reported, never used to decide
            except Diverged as exc:
                status, reason, val, test = "diverged", str(exc), None, None
        wall = self.wall_time_before + self._running_time()
        self._fit_start = None
        self.wall_time_before = wall
        common = {
            "status": status,
            "reason": reason,
            "epochs_run": self.epoch,
            "model": self.calibrated_model.eval(),
            "calibrator_info": self.calibrator_info(),
            "wall_time": wall,
            "epoch_times": list(self.epoch_times),
            "history": [dict(h) for h in self.history],
            "best": copy.deepcopy(self.best),
        }
        return self.strategy.result(common, val, test)

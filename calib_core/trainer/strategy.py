"""What single- and multi-task training do differently: the `TaskStrategy` the one trainer loop
(trainer.py) delegates to. The loop owns the state, the optimizers, resume, divergence handling,
early stopping and the order of the steps; a strategy owns what depends on how many tasks (and so
calibrators) there are: the model, the calibrator(s), their inputs, the losses, the post-hoc fits,
the metrics, the calibrated model and the result type. Strategies hold no training state, so
one method call never both changes the run and hands back values for the loop to store.

Calibrators are handed to a strategy as a list, one per task (a single-task run has one, or none
without a calibrator), and calibrator inputs and logits as lists of tensors in the same order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from calib_core.calibrators import Calibrator
from calib_core.config import RunConfig

from .calibrator_batches import kfold_indices
from .posthoc import DEFAULT_FIT, PosthocFit, crossfit
from .result import Evaluation, TrainResult
from .snapshot import cpu_copy

EVAL_BATCH = 1024


def add_regularization(loss: Tensor, calibrator: Calibrator) -> Tensor:
    """`loss + calibrator.regularization()`; just `loss` when the calibrator keeps the base
    class's zero penalty (adding an exact 0 changes neither the value nor the gradient, and
    the zero tensor and the addition cost two ops per calibrator step)."""
    if type(calibrator).regularization is Calibrator.regularization:
        return loss
    return loss + calibrator.regularization()


class Diverged(RuntimeError):
    """Raised inside the loop when a loss or a parameter stops being finite."""


class CalibratorBatch(NamedTuple):
    """The calibrator's batch as the backbone's unrolled loss sees it: inputs (with their graph to
    the backbone), one tensor per calibrator, and the labels."""

    inputs: list[Tensor]
    labels: Tensor


class TaskStrategy(ABC):
    """Single- or multi-task behaviour of the trainer loop (module docstring)."""

    # the model's submodule whose parameters are the head(s): `head` or `heads`
    head_name: str = "head"

    @abstractmethod
    def create_model(self, cfg: RunConfig, data: Any) -> nn.Module:
        """The classifier `cfg.model` names, built for `data`."""

    @abstractmethod
    def check_model(self, model: nn.Module) -> None:
        """Raise ValueError when `model` does not fit this strategy's data."""

    @abstractmethod
    def create_calibrator(self, name: str, kwargs: dict[str, Any], model: nn.Module) -> nn.Module:
        """The calibrator module (with `last_layer`: built around the model's head(s))."""

    @abstractmethod
    def calibrators(self, module: nn.Module | None) -> list[Calibrator]:
        """The calibrators inside `module` (from `create_calibrator`), one per task; [] for None."""

    @abstractmethod
    def inputs(self, model: nn.Module, calibrators: list[Calibrator], x: Tensor) -> list[Tensor]:
        """What each calibrator consumes (logits or features) for `x`, in the model's current mode."""

    @abstractmethod
    def calibrator_loss(
        self, calibrators: list[Calibrator], inputs: list[Tensor], labels: Tensor
    ) -> tuple[Tensor, list[int]] | None:
        """The calibrators' loss on a batch and the calibrators it trains; None when none has a label."""

    @abstractmethod
    def backbone_loss(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        lookahead: CalibratorBatch | None,
        calibrator_lr: float,
    ) -> Tensor:
        """The backbone's loss through the frozen calibrators ([]: none), or through their one-step
        look-ahead on `lookahead` (hypergradient `unrolled`)."""

    @property
    def num_tasks(self) -> int:
        """How many labels (and calibrators) a row has."""
        return 1

    @abstractmethod
    def labelled_rows(self, labels: Tensor, task: int) -> tuple[Tensor | None, Tensor]:
        """Task `task`'s labelled rows of `labels` (an index tensor, or None for all rows) and their labels."""

    def task_name(self, task: int) -> str | None:
        """Task `task`'s name in messages (None: a single-task run says no name)."""
        return None

    def _about(self, task: int) -> str:
        name = self.task_name(task)
        return "" if name is None else f" of task {name!r}"

    def labelled_tasks(self, labels: Tensor) -> list[int]:
        """The calibrators a post-hoc fit on `labels` fits: those with a labelled row."""
        out = []
        for t in range(self.num_tasks):
            rows, _ = self.labelled_rows(labels, t)
            if rows is None or len(rows) > 0:
                out.append(t)
        return out

    def fit_posthoc(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        tasks: list[int],
        fit: PosthocFit = DEFAULT_FIT,
    ) -> None:
        """One post-hoc stage per task in `tasks`: `fit` (calibrators already reset to the identity) on
        the task's labelled rows of the cached holdout inputs."""
        for t in tasks:
            rows, y = self.labelled_rows(labels, t)
            inp = inputs[t] if rows is None else inputs[t][rows]
            if not bool(torch.isfinite(inp).all()):
                raise Diverged(f"non-finite logits{self._about(t)} on the post-hoc holdout")
            fit(calibrators[t], inp, y)

    def crossfit_posthoc(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        tasks: list[int],
        folds: int,
        seed: int,
        fit: PosthocFit = DEFAULT_FIT,
    ) -> list[Tensor]:
        """Fit calibrators `tasks` (reset to the identity) on their labelled validation rows; return
        the cross-fitted (out-of-fold) validation logits, folds seeded per task. Unlabelled rows
        (and tasks without labels) keep the calibrated (or the identity's) logits: no metric reads them."""
        out: list[Tensor] = []
        for t, inp in enumerate(inputs):
            if t not in tasks:
                out.append(inp)
                continue
            rows, y = self.labelled_rows(labels, t)
            x = inp if rows is None else inp[rows]
            if not bool(torch.isfinite(x).all()):
                raise Diverged(f"non-finite logits{self._about(t)} on the validation split (post-hoc fit)")
            cal = calibrators[t]
            fold_idx = [f.to(inp.device) for f in kfold_indices(len(x), folds, seed + 7919 * t)]
            z_rows = crossfit(cal, cpu_copy(cal.state_dict()), x, y, fold_idx, fit)
            if rows is None:
                out.append(z_rows)
                continue
            with torch.no_grad():
                z = cal(inp)
            z[rows] = z_rows
            out.append(z)
        return out

    def predict_logits(self, model: nn.Module, calibrator: nn.Module | None, x: Tensor) -> list[Tensor]:
        """The calibrated logits of `x`, one tensor per task, in eval mode."""
        calibrated: Any = self.calibrated_model(model, calibrator)  # CalibratedModel or its multi-task twin
        out = calibrated.predict_logits(x, EVAL_BATCH)
        return out if isinstance(out, list) else [out]

    def calibrator_problem(self, calibrators: list[Calibrator]) -> str | None:
        """The first calibrator's own divergence report (`Calibrator.divergence()`), named by its task, or None."""
        for t, cal in enumerate(calibrators):
            problem = cal.divergence()
            if problem is not None:
                name = self.task_name(t)
                return problem if name is None else f"task {name!r}: {problem}"
        return None

    @abstractmethod
    def metrics(self, logits: list[Tensor], labels: Tensor, num_bins: int) -> dict[str, float]:
        """Every metric of the calibrated logits against `labels`."""

    @abstractmethod
    def calibrated_model(self, model: nn.Module, calibrator: nn.Module | None) -> nn.Module:
        """Backbone plus calibrator(s) as one module: the model a run hands back."""

    @abstractmethod
    def calibrator_info(self, calibrators: list[Calibrator], name: str, stages: int) -> dict[str, Any]:
        """What the calibrator(s) are (for reports); `stages` = post-hoc fits a final model needs."""

    @abstractmethod
    def result(self, common: dict[str, Any], val: Evaluation | None, test: Evaluation | None) -> TrainResult:
        """The run's result from the fields every result has (`common`) and the final evaluations."""

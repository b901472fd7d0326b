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

from torch import Tensor, nn

from calib_core.calibrators import Calibrator
from calib_core.config import RunConfig

from .result import Evaluation, TrainResult

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

    @abstractmethod
    def labelled_tasks(self, labels: Tensor) -> list[int]:
        """The calibrators a post-hoc fit on `labels` fits: those with a labelled row."""

    @abstractmethod
    def fit_posthoc(
        self, calibrators: list[Calibrator], inputs: list[Tensor], labels: Tensor, tasks: list[int]
    ) -> None:
        """Fit calibrators `tasks` (already reset to the identity) on cached holdout inputs."""

    @abstractmethod
    def crossfit_posthoc(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        tasks: list[int],
        folds: int,
        seed: int,
    ) -> list[Tensor]:
        """Fit calibrators `tasks` (reset to the identity) on the validation split's cached inputs;
        return their cross-fitted (out-of-fold) validation logits."""

    @abstractmethod
    def predict_logits(self, model: nn.Module, calibrator: nn.Module | None, x: Tensor) -> list[Tensor]:
        """The calibrated logits of `x`, one tensor per task, in eval mode."""

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
    def calibrator_problem(self, calibrators: list[Calibrator]) -> str | None:
        """The first calibrator's own divergence report (`Calibrator.divergence()`), or None."""

    @abstractmethod
    def result(self, common: dict[str, Any], val: Evaluation | None, test: Evaluation | None) -> TrainResult:
        """The run's result from the fields every result has (`common`) and the final evaluations."""

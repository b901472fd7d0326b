"""`SingleTask`: the trainer loop's default strategy (strategy.py): one label per sample, one
calibrator (or none), the backbone loss of the method (CE, label smoothing, focal)."""

from __future__ import annotations

from typing import Any, cast

import torch.nn.functional as F
from torch import Tensor, nn

from calib_core.calibrators import Calibrator, create_calibrator
from calib_core.config import RunConfig
from calib_core.losses import LossFn, make_loss

from .hypergradient import unrolled_loss
from .result import CalibratedModel, Evaluation, TrainResult, model_features
from .strategy import CalibratorBatch, TaskStrategy, add_regularization


class SingleTask(TaskStrategy):
    """One label per sample, one calibrator (or none); the backbone loss is the method's."""

    head_name = "head"

    def __init__(self, num_classes: int, loss_fn: LossFn) -> None:
        self.num_classes = num_classes
        self.loss_fn = loss_fn

    @classmethod
    def for_run(cls, cfg: RunConfig, data: Any) -> SingleTask:
        """The strategy of a single-task run of `cfg` on `data`."""
        tc = cfg.train
        return cls(
            int(data.num_classes), make_loss(tc.method, label_smoothing=tc.label_smoothing, focal_gamma=tc.focal_gamma)
        )

    def create_model(self, cfg: RunConfig, data: Any) -> nn.Module:
        """`build_model(cfg.model, ...)` for the data's classes and input shape: the registry's model with
        `run.model.weights` loaded and `run.model.freeze` applied (calib_core/models/pretrained.py)."""
        from calib_core.models import build_model

        return build_model(cfg.model, self.num_classes, tuple(data.input_shape))

    def check_model(self, model: nn.Module) -> None:
        """Any classifier fits (a ready-made one needs `.features`, `.head`, `.feature_dim`)."""

    def create_calibrator(self, name: str, kwargs: dict[str, Any], model: nn.Module) -> nn.Module:
        """The registry's calibrator `name` (with `last_layer`: the model's head)."""
        return create_calibrator(
            name,
            self.num_classes,
            feature_dim=getattr(model, "feature_dim", None),
            head=getattr(model, "head", None),
            **kwargs,
        )

    def calibrators(self, module: nn.Module | None) -> list[Calibrator]:
        """[the calibrator], or [] without one."""
        return [] if module is None else [_as_calibrator(module)]

    def inputs(self, model: nn.Module, calibrators: list[Calibrator], x: Tensor) -> list[Tensor]:
        """[features] for a features calibrator, else [logits]."""
        kind = calibrators[0].input_kind if calibrators else "logits"
        return [model_features(model, x) if kind == "features" else model(x)]

    def calibrator_loss(
        self, calibrators: list[Calibrator], inputs: list[Tensor], labels: Tensor
    ) -> tuple[Tensor, list[int]]:
        """CE of the calibrated inputs plus the calibrator's regularization."""
        cal = calibrators[0]
        return add_regularization(F.cross_entropy(cal(inputs[0]), labels), cal), [0]

    def backbone_loss(
        self,
        calibrators: list[Calibrator],
        inputs: list[Tensor],
        labels: Tensor,
        lookahead: CalibratorBatch | None,
        calibrator_lr: float,
    ) -> Tensor:
        """The method's loss of the calibrated logits (through the look-ahead calibrator if given)."""
        z = inputs[0]
        if not calibrators:
            return self.loss_fn(z, labels)
        cal = calibrators[0]
        if lookahead is not None:
            return unrolled_loss(cal, lookahead.inputs[0], lookahead.labels, z, labels, calibrator_lr, self.loss_fn)
        return self.loss_fn(cal(z), labels)

    def labelled_rows(self, labels: Tensor, task: int) -> tuple[Tensor | None, Tensor]:
        """Every row: a single-task split has no missing labels."""
        return None, labels

    def metrics(self, logits: list[Tensor], labels: Tensor, num_bins: int) -> dict[str, float]:
        """`compute_all` of the calibrated logits."""
        from calib_core.metrics import compute_all

        metrics = compute_all(logits[0], labels, num_bins=num_bins, from_logits=True)
        return {k: float(v) for k, v in metrics.items()}

    def calibrated_model(self, model: nn.Module, calibrator: nn.Module | None) -> CalibratedModel:
        """`CalibratedModel(model, calibrator)`."""
        return CalibratedModel(model, _as_calibrator(calibrator) if calibrator is not None else None)

    def calibrator_info(self, calibrators: list[Calibrator], name: str, stages: int) -> dict[str, Any]:
        """The calibrator's `describe()`."""
        if not calibrators:
            return {"calibrator": "none", "num_params": 0}
        return calibrators[0].describe()

    def result(self, common: dict[str, Any], val: Evaluation | None, test: Evaluation | None) -> TrainResult:
        """A `TrainResult`."""
        return TrainResult(
            **common,
            val_metrics=val.metrics if val is not None else {},
            test_metrics=test.metrics if test is not None else {},
            val_probs=val.probs[0] if val is not None else None,
            val_labels=val.labels if val is not None else None,
            test_probs=test.probs[0] if test is not None else None,
            test_labels=test.labels if test is not None else None,
        )


def _as_calibrator(module: nn.Module) -> Calibrator:
    """The module `create_calibrator` made, typed as the Calibrator it is."""
    return cast(Calibrator, module)

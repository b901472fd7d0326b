"""What the trainer hands back: the per-epoch report and the final result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn

from calib_core.calibrators import Calibrator


def model_features(model: nn.Module, x: Tensor) -> Tensor:
    """`model.features(x)`: the backbone's features (torch types a module's attributes as
    `Tensor | Module`, so the method is looked up here, once, with its real type)."""
    features = cast(Callable[[Tensor], Tensor], model.features)
    return features(x)


def model_submodule(model: nn.Module, name: str) -> nn.Module:
    """`getattr(model, name)` for a submodule (e.g. `head`, `heads`), typed as a module."""
    return cast(nn.Module, getattr(model, name))


def forward_in_batches(module: nn.Module, x: Tensor, batch_size: int) -> list[Any]:
    """`module(xb)` for each batch of `x` (moved to the module's device), in eval mode; the
    module's training mode is restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        device = next(module.parameters()).device
        return [module(xb.to(device)) for xb in x.split(batch_size)]
    finally:
        module.train(was_training)


class CalibratedModel(nn.Module):
    """backbone + calibrator: inputs -> calibrated logits (`predict_proba` -> probabilities)."""

    def __init__(self, model: nn.Module, calibrator: Calibrator | None) -> None:
        super().__init__()
        self.model = model
        self.calibrator = calibrator

    def forward(self, x: Tensor) -> Tensor:
        cal = self.calibrator
        if cal is None:
            return self.model(x)
        if cal.input_kind == "features":
            return cal(model_features(self.model, x))
        return cal(self.model(x))

    @torch.no_grad()
    def predict_logits(self, x: Tensor, batch_size: int = 1024) -> Tensor:
        """Calibrated logits (N, K) on the model's device, computed in eval mode."""
        outs = forward_in_batches(self, x, batch_size)
        return torch.cat(outs) if outs else torch.empty(0)

    def predict_proba(self, x: Tensor, batch_size: int = 1024) -> Tensor:
        """Calibrated class probabilities (N, K) on the CPU, computed in eval mode."""
        return torch.softmax(self.predict_logits(x, batch_size).float(), dim=1).cpu()


@dataclass
class EpochReport:
    """Passed to `on_epoch` after every epoch. Call `state()` inside the callback: it snapshots
    the trainer as it is at that moment."""

    epoch: int  # 1-based
    metrics: dict[str, float]
    _state_fn: Callable[[], dict[str, Any]] = field(repr=False)

    def state(self) -> dict[str, Any]:
        """A dict of tensors and plain data (`torch.save` it; it loads with `torch.load(weights_only=True)`)
        that resumes this run bit-for-bit (CPU) via `fit(resume_state=...)`."""
        return self._state_fn()


@dataclass(frozen=True)
class Evaluation:
    """One split evaluated: metrics, calibrated probabilities per task ((N, K_t) on the CPU; one
    entry for a single-task model) and the split's labels on the CPU."""

    metrics: dict[str, float]
    probs: list[Tensor]
    labels: Tensor


@dataclass
class TrainResult:
    status: str  # "completed" | "diverged"
    reason: str | None
    epochs_run: int
    val_metrics: dict[str, float]  # final val metrics (no prefix); {} when diverged
    test_metrics: dict[str, float]  # evaluated once at the end; {} when diverged
    calibrator_info: dict[str, Any]
    wall_time: float
    epoch_times: list[float]
    model: CalibratedModel
    val_probs: Tensor | None = None
    val_labels: Tensor | None = None
    test_probs: Tensor | None = None
    test_labels: Tensor | None = None
    history: list[dict[str, float]] = field(default_factory=list)  # per-epoch metrics
    best: dict[str, Any] = field(default_factory=dict)  # best epoch by val NLL (metrics only)

    def predict_proba(self, x: Tensor) -> Tensor:
        return self.model.predict_proba(x)

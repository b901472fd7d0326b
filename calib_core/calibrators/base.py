"""The calibrator base class: an nn.Module mapping logits (or features) to calibrated logits.

Every calibrator starts at the identity, reports what it learned through `describe()`, adds
its own penalty (0 unless it has one) through `regularization()`, and says through
`divergence()` when its (effective) parameters stopped being usable (None while they are).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

InputKind = Literal["logits", "features"]


class Calibrator(nn.Module):
    """Base class. Subclasses set `name`, `input_kind` and implement `forward`."""

    name: str = "calibrator"
    input_kind: InputKind = "logits"

    def __init__(self, num_classes: int, in_dim: int | None = None) -> None:
        super().__init__()
        if int(num_classes) < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = int(num_classes)
        self.in_dim = int(in_dim) if in_dim is not None else int(num_classes)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            what = "logits" if self.input_kind == "logits" else "features"
            raise ValueError(f"{self.name} calibrator expects {what} of shape (N, {self.in_dim}), got {tuple(x.shape)}")

    def num_params(self) -> int:
        """Number of parameters this calibrator adds to the model."""
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> dict:
        """What the calibrator learned, as plain Python values (for logs and reports)."""
        return {"calibrator": self.name, "num_params": self.num_params()}

    def divergence(self) -> str | None:
        """Why this calibrator no longer gives a usable map, or None while it does. The base
        check: every parameter finite. Subclasses whose effective parameters are functions of
        the stored ones (temperature = exp(log T)) also check those, which can overflow or
        underflow while the stored ones stay finite. One host sync per parameter."""
        for n, p in self.named_parameters():
            if not bool(torch.isfinite(p).all()):
                return f"non-finite {self.name} calibrator parameter {n!r}"
        return None

    def regularization(self) -> Tensor:
        """Penalty added to the calibrator's loss (0 unless the calibrator defines one)."""
        p = next(iter(self.parameters()), None)
        if p is None:
            return torch.zeros(())
        return torch.zeros((), dtype=p.dtype, device=p.device)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, input_kind={self.input_kind!r}"

"""A small residual MLP calibrator on logits (default) or on features.

logits:   out = z + g(z)
features: out = head(f) + g(f), where `head` is the model's own head (it stays a backbone
          parameter and is not registered here, so the calibrator owns only g).
g ends in a zero-initialised linear layer, so the calibrator is the identity at init.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from .base import Calibrator


class MLPCalibrator(Calibrator):
    name = "mlp"

    def __init__(
        self,
        num_classes: int,
        *,
        hidden: int = 32,
        depth: int = 1,
        input: Literal["logits", "features"] = "logits",
        feature_dim: int | None = None,
        head: nn.Module | None = None,
    ) -> None:
        if input not in ("logits", "features"):
            raise ValueError(f"mlp calibrator input must be 'logits' or 'features', got {input!r}")
        if hidden < 1 or depth < 1:
            raise ValueError(f"mlp calibrator needs hidden >= 1 and depth >= 1, got hidden={hidden}, depth={depth}")
        if input == "features" and (feature_dim is None or head is None):
            raise ValueError("mlp calibrator on features needs feature_dim and head")
        super().__init__(num_classes, in_dim=feature_dim if input == "features" else num_classes)
        self.input_kind = input
        layers: list[nn.Module] = []
        d = self.in_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.GELU()]
            d = hidden
        last = nn.Linear(d, num_classes)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(*layers, last)
        # not registered as a submodule: the head belongs to the backbone
        self._head: tuple[nn.Module] | None = None
        if input == "features":
            assert head is not None  # checked above
            self._head = (head,)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        base = x if self._head is None else self._head[0](x)
        return base + self.net(x)

    def describe(self) -> dict:
        return {**super().describe(), "input": self.input_kind}

"""Vector scaling (Guo et al. 2017): per-class scale and bias, z * w + b; identity at init."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Calibrator


class VectorScaling(Calibrator):
    name = "vector"
    input_kind = "logits"

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.scale = nn.Parameter(torch.ones(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, logits: Tensor) -> Tensor:
        self._check_input(logits)
        return logits * self.scale.to(logits.dtype) + self.bias.to(logits.dtype)

    def describe(self) -> dict:
        s = self.scale.detach()
        return {**super().describe(), "mean_scale": float(s.mean()), "mean_temperature": float((1.0 / s).mean())}

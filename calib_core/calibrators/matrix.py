"""Matrix scaling (Guo et al. 2017): z W^T + b with W = I, b = 0 at init.

Stored as W = I + delta so the output equals the input exactly at init and any weight decay
pulls towards the identity rather than towards zero.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Calibrator


class MatrixScaling(Calibrator):
    name = "matrix"
    input_kind = "logits"

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.delta = nn.Parameter(torch.zeros(num_classes, num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    @property
    def weight(self) -> Tensor:
        return torch.eye(self.num_classes, dtype=self.delta.dtype, device=self.delta.device) + self.delta

    def forward(self, logits: Tensor) -> Tensor:
        self._check_input(logits)
        d, b = self.delta.to(logits.dtype), self.bias.to(logits.dtype)
        return logits + logits @ d.T + b

"""Dirichlet calibration (Kull et al. 2019) with ODIR regularisation.

Probabilities q = softmax(W log softmax(z) + b). We return z + (W - I) log softmax(z) + b,
which differs from W log softmax(z) + b by a per-row constant (logsumexp z), so it gives the
same probabilities while being exactly the input logits at init (W = I, b = 0).
ODIR: lambda_od * sum_{i != j} W_ij^2 / (K (K - 1)) + lambda_b * sum_j b_j^2 / K.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import Calibrator


class DirichletCalibrator(Calibrator):
    name = "dirichlet"
    input_kind = "logits"
    _offdiag: Tensor  # buffer registered in __init__

    def __init__(self, num_classes: int, lambda_od: float = 1e-3, lambda_b: float = 1e-3) -> None:
        super().__init__(num_classes)
        if lambda_od < 0 or lambda_b < 0:
            raise ValueError(f"ODIR lambdas must be >= 0, got lambda_od={lambda_od}, lambda_b={lambda_b}")
        self.lambda_od = float(lambda_od)
        self.lambda_b = float(lambda_b)
        self.delta = nn.Parameter(torch.zeros(num_classes, num_classes))  # W - I
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.register_buffer("_offdiag", 1.0 - torch.eye(num_classes), persistent=False)

    @property
    def weight(self) -> Tensor:
        return torch.eye(self.num_classes, dtype=self.delta.dtype, device=self.delta.device) + self.delta

    def forward(self, logits: Tensor) -> Tensor:
        self._check_input(logits)
        logp = torch.log_softmax(logits, dim=1)
        return logits + logp @ self.delta.to(logits.dtype).T + self.bias.to(logits.dtype)

    def regularization(self) -> Tensor:
        k = self.num_classes
        off = (self.delta * self._offdiag.to(self.delta.dtype)).pow(2).sum() / (k * (k - 1))
        return self.lambda_od * off + self.lambda_b * self.bias.pow(2).sum() / k

    def describe(self) -> dict:
        return {**super().describe(), "lambda_od": self.lambda_od, "lambda_b": self.lambda_b}

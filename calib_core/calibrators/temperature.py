"""Temperature scaling (Guo et al. 2017): logits / T with one positive scalar T.

T = exp(log_t) stays positive, starts at 1 (identity), and dividing by a positive scalar is
monotone, so the argmax of the logits never changes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import Calibrator


class TemperatureScaling(Calibrator):
    name = "temperature"
    input_kind = "logits"

    def __init__(self, num_classes: int, init_temperature: float = 1.0) -> None:
        super().__init__(num_classes)
        if not init_temperature > 0:
            raise ValueError(f"init_temperature must be > 0, got {init_temperature}")
        self.log_t = nn.Parameter(torch.tensor(float(init_temperature)).log())

    @property
    def temperature(self) -> Tensor:
        return self.log_t.exp()

    def forward(self, logits: Tensor) -> Tensor:
        self._check_input(logits)
        t = self.log_t.exp()
        return logits / (t if t.dtype == logits.dtype else t.to(logits.dtype))

    def divergence(self) -> str | None:
        """Also T itself: exp(log T) overflows to inf (log T > ~88.7 in float32; the calibrated
        logits are then all 0, i.e. uniform predictions with finite losses) or underflows to
        0 (logits / 0 = inf/NaN) while log T is still finite."""
        reason = super().divergence()
        if reason is not None:
            return reason
        t = float(self.temperature.detach())
        if math.isinf(t):
            return f"temperature overflowed to inf at log T = {float(self.log_t.detach()):.4g}"
        if t == 0.0:
            return f"temperature underflowed to 0 at log T = {float(self.log_t.detach()):.4g}"
        return None

    def describe(self) -> dict:
        return {**super().describe(), "temperature": float(self.temperature.detach())}

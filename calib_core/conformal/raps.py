"""RAPS (Angelopoulos, Bates, Jordan & Malik 2021): the APS score plus penalty * max(rank - k_reg, 0), which keeps
low-ranked labels out of the sets (smaller sets where a model's tail probabilities are noisy)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .core import sorted_mass, to_label_order

#: torch-uncertainty 0.13's defaults (ConformalClsRAPS), the service's too.
PENALTY = 0.1
K_REG = 1


def check_options(penalty: float, k_reg: int) -> None:
    """ValueError unless penalty is finite and >= 0 and k_reg an integer >= 1."""
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty) or penalty < 0:
        raise ValueError(f"RAPS penalty must be a finite number >= 0, got {penalty!r}")
    if isinstance(k_reg, bool) or not isinstance(k_reg, int) or k_reg < 1:
        raise ValueError(f"RAPS k_reg must be an integer >= 1, got {k_reg!r}")


def label_scores(probs: Tensor, u: Tensor | None = None, *, penalty: float = PENALTY, k_reg: int = K_REG) -> Tensor:
    """The (randomised when `u` is given) RAPS score of every label, (N, K)."""
    check_options(penalty, k_reg)
    order, ordered, cumsum, _ = sorted_mass(probs)
    rank = torch.arange(1, probs.shape[1] + 1, dtype=ordered.dtype, device=ordered.device).unsqueeze(0)
    by_rank = cumsum + penalty * (rank - k_reg).clamp(min=0)
    if u is not None:
        by_rank = by_rank - u.unsqueeze(1) * ordered
    return to_label_order(by_rank, order)

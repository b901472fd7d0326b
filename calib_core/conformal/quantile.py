"""The conformal quantile of calibration scores, under one named convention.

* ``finite_sample`` (the service's): the ceil((n + 1)(1 - alpha))-th smallest score, +inf (every label) when that
  rank exceeds n. With exchangeable rows a new row's score lies at or below it with probability in
  [1 - alpha, 1 - alpha + 1 / (n + 1)) (continuous scores).
* ``mapie`` (MAPIE 1.6's ``_compute_classification_quantile``): numpy's quantile at ceil((n + 1)(1 - alpha)) / n with
  method "lower", the level computed in floating point as MAPIE does; MAPIE refuses a level above 1, and so does this.
* ``torch_uncertainty`` (torch-uncertainty 0.13's ConformalCls*): ``torch.quantile(scores, 1 - alpha)``, linear
  interpolation without the (n + 1) correction (its coverage can fall short of 1 - alpha on small n).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .core import check_alpha

FINITE_SAMPLE = "finite_sample"
MAPIE = "mapie"
TORCH_UNCERTAINTY = "torch_uncertainty"
CONVENTIONS = (FINITE_SAMPLE, MAPIE, TORCH_UNCERTAINTY)
# (n + 1)(1 - alpha) in floating point lands a hair above an integer (20 * 0.9 = 18.000000000000004); the exact
# rank is meant, so a product within this of an integer counts as that integer
_RANK_ATOL = 1e-9


def check_convention(convention: str) -> str:
    """The convention's name, or a ValueError listing the known ones."""
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown conformal convention {convention!r}; known: {', '.join(CONVENTIONS)}")
    return convention


def finite_sample_rank(n: int, alpha: float) -> int:
    """ceil((n + 1)(1 - alpha)): the 1-based rank of the finite-sample conformal quantile among n scores."""
    return math.ceil((n + 1) * (1.0 - alpha) - _RANK_ATOL)


def conformal_quantile(scores: Tensor, alpha: float, convention: str = FINITE_SAMPLE) -> float:
    """The quantile of calibration `scores` (N,) at miscoverage `alpha` under `convention` (module docstring)."""
    alpha = check_alpha(alpha)
    check_convention(convention)
    s = scores.detach() if isinstance(scores, Tensor) else torch.as_tensor(scores)
    if s.dim() != 1 or s.numel() == 0:
        raise ValueError(f"calibration scores must be a non-empty (N,) vector, got shape {tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()):
        raise ValueError("calibration scores have NaN or infinite values")
    n = s.numel()
    if convention == FINITE_SAMPLE:
        k = finite_sample_rank(n, alpha)
        if k > n:  # too few rows for this alpha: no finite quantile guarantees the coverage
            return math.inf
        return float(torch.kthvalue(s.cpu(), max(k, 1)).values)
    if convention == MAPIE:
        level = float(np.ceil((n + 1) * (1 - alpha)) / n)
        if level > 1:
            raise ValueError(f"alpha={alpha} needs at least {math.ceil(1 / alpha - 1)} calibration rows, got {n}")
        return float(np.quantile(s.cpu().numpy(), level, method="lower"))
    return float(torch.quantile(s, 1.0 - alpha))


__all__ = ["CONVENTIONS", "FINITE_SAMPLE", "MAPIE", "TORCH_UNCERTAINTY", "conformal_quantile", "finite_sample_rank"]

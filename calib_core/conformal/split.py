"""Split conformal classification: the methods by name, their quantile on calibration rows and their prediction sets.

The set rule of each convention (calib_core.conformal.quantile names the quantiles):

* ``finite_sample``: {k : score_k <= q}, the set that matches the calibration score, so a row is covered exactly
  when its label's score is at most q (sets may be empty; q = +inf keeps every label).
* ``mapie``: {k : score_k - q <= 1e-8} (MAPIE's EPSILON); APS without draws at prediction time keeps the label whose
  mass crosses q (``include_last_label=True``), with draws it is MAPIE's ``include_last_label="randomized"``.
* ``torch_uncertainty``: {k : score_k <= q}, an empty set getting its lowest-score label.

Randomised methods take one uniform draw per row (`u`, (N,)) at calibration and at prediction; the caller draws them
(seeded), so a result can be reproduced and compared with another library given the same draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import aps, lac, raps
from .core import check_labels, check_probs, check_quantile, check_uniform, threshold_sets, true_label_scores
from .quantile import FINITE_SAMPLE, MAPIE, TORCH_UNCERTAINTY, check_convention, conformal_quantile

MAPIE_EPSILON = 1e-8  # mapie._machine_precision.EPSILON


@dataclass(frozen=True)
class Method:
    """A conformal score by name: its per-label scores (probs, u, **options) -> (N, K) and whether it is randomised."""

    name: str
    scores: Callable[..., Tensor]
    randomized: bool
    summary: str


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("lac", lac.label_scores, False, "LAC / THR: labels with probability >= 1 - q"),
        Method("aps", aps.label_scores, False, "APS: labels whose ranked cumulative mass is <= q"),
        Method("aps_randomized", aps.label_scores, True, "APS with one uniform draw per row (exact coverage)"),
        Method("raps", raps.label_scores, False, "RAPS: APS plus a penalty on labels ranked past k_reg"),
    )
}


def get_method(name: str) -> Method:
    """The method called `name`, or a ValueError listing the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown conformal method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def _label_scores(m: Method, p: Tensor, u: Any, options: dict[str, Any]) -> Tensor:
    extra = set(options) - ({"penalty", "k_reg"} if m.name == "raps" else set())
    if extra:
        raise ValueError(f"conformal method {m.name!r} takes no option(s) {sorted(extra)}")
    draws = None if u is None else check_uniform(u, p.shape[0], p)
    return m.scores(p, draws, **options)


def label_scores(method: str, probs: Any, *, u: Any = None, **options: Any) -> Tensor:
    """Every label's score, (N, K); a randomised method needs its draws `u` (N,)."""
    m = get_method(method)
    p = check_probs(probs)
    if m.randomized and u is None:
        raise ValueError(f"{method} is randomised: pass u, one uniform draw per row")
    return _label_scores(m, p, u if m.randomized else None, options)


def calibration_scores(method: str, probs: Any, labels: Any, *, u: Any = None, **options: Any) -> Tensor:
    """Each calibration row's score at its label, (N,); a randomised method needs its draws `u` (N,)."""
    m = get_method(method)
    p = check_probs(probs)
    y = check_labels(labels, p)
    if m.randomized and u is None:
        raise ValueError(f"{method} is randomised: pass u, one uniform draw per calibration row")
    return true_label_scores(_label_scores(m, p, u if m.randomized else None, options), y)


def calibrate(
    method: str,
    probs: Any,
    labels: Any,
    alpha: float,
    *,
    convention: str = FINITE_SAMPLE,
    u: Any = None,
    **options: Any,
) -> float:
    """The conformal quantile of `method` on the calibration rows (probs (N, K), labels (N,)) at miscoverage `alpha`."""
    check_convention(convention)
    return conformal_quantile(calibration_scores(method, probs, labels, u=u, **options), alpha, convention)


def prediction_sets(
    method: str,
    probs: Any,
    quantile: float,
    *,
    convention: str = FINITE_SAMPLE,
    u: Any = None,
    **options: Any,
) -> Tensor:
    """Each row's prediction set as an (N, K) bool mask, from the calibrated `quantile` (module docstring's rules)."""
    m = get_method(method)
    check_convention(convention)
    q = check_quantile(quantile)
    p = check_probs(probs)
    if convention == MAPIE and m.name.startswith("aps") and u is None:
        return aps.crossing_sets(p, q, MAPIE_EPSILON)
    if m.randomized and u is None:
        raise ValueError(f"{method} is randomised: pass u, one uniform draw per row")
    scores = _label_scores(m, p, u if m.randomized else None, options)
    if convention == MAPIE:
        return threshold_sets(scores, q, tolerance=MAPIE_EPSILON)
    return threshold_sets(scores, q, nonempty=convention == TORCH_UNCERTAINTY)


def uniform_draws(n: int, seed: int) -> Tensor:
    """n uniform draws in [0, 1) from a generator seeded by `seed` (float64): a randomised method's `u`."""
    return torch.rand(n, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float64)


__all__ = [
    "METHODS",
    "Method",
    "calibrate",
    "calibration_scores",
    "get_method",
    "label_scores",
    "prediction_sets",
    "uniform_draws",
]

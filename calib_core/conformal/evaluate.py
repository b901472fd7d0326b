"""A classifier's conformal sets judged as a sweep judges a candidate: on validation cross-fitted (each fold's sets
from the quantile of the other folds, so the numbers are fit for selection, as temperature on top is), on test from
the quantile of all validation rows (the one a deployed model carries). The service's convention (finite_sample)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calib_core.trainer.calibrator_batches import kfold_indices

from .core import check_alpha, check_labels, check_probs, true_label_scores
from .measures import MIN_ROWS, summary
from .quantile import conformal_quantile
from .split import get_method, label_scores, uniform_draws


@dataclass(frozen=True)
class SetsEvaluation:
    """One method at one alpha: the quantile on all validation rows, the measures per split ({'val': {coverage, size,
    worst_class_coverage, worst_size_coverage}, 'test': ...}) and per split the rows' (covered, set size) arrays."""

    method: str
    alpha: float
    quantile: float
    metrics: dict[str, dict[str, float]]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]


def _crossfit_quantiles(scores: Tensor, alpha: float, folds: int, seed: int) -> Tensor:
    """Each validation row's quantile from the other folds' scores, (N,)."""
    q = torch.empty(len(scores), dtype=torch.float64)
    for idx in kfold_indices(len(scores), folds, seed):
        others = torch.ones(len(scores), dtype=torch.bool)
        others[idx] = False
        q[idx] = conformal_quantile(scores[others], alpha)
    return q


def _measured(sets: Tensor, y: Tensor, min_rows: int) -> tuple[dict[str, float], tuple[np.ndarray, np.ndarray]]:
    hit = sets.gather(1, y.unsqueeze(1)).squeeze(1)
    return summary(sets, y, min_rows=min_rows), (hit.numpy().astype(np.uint8), sets.sum(1).numpy().astype(np.int32))


def evaluate_sets(
    val_probs: Any,
    val_labels: Any,
    test_probs: Any,
    test_labels: Any,
    *,
    alphas: Sequence[float],
    methods: Sequence[str],
    folds: int = 5,
    seed: int = 0,
    min_rows: int = MIN_ROWS,
) -> list[SetsEvaluation]:
    """Every method at every alpha (module docstring); randomised methods draw their uniforms from `seed`."""
    pv, pt = check_probs(val_probs).double(), check_probs(test_probs).double()
    yv, yt = check_labels(val_labels, pv).cpu(), check_labels(test_labels, pt).cpu()
    pv, pt = pv.cpu(), pt.cpu()
    if pv.shape[1] != pt.shape[1]:
        raise ValueError(f"validation has {pv.shape[1]} classes, test {pt.shape[1]}")
    k = min(folds, len(yv))
    if k < 2:
        raise ValueError(f"cross-fitting needs at least 2 validation rows, got {len(yv)}")
    out = []
    for method in methods:
        random = get_method(method).randomized
        uv = uniform_draws(len(yv), seed * 7 + 1) if random else None
        ut = uniform_draws(len(yt), seed * 7 + 2) if random else None
        sv, st = label_scores(method, pv, u=uv), label_scores(method, pt, u=ut)
        s_true = true_label_scores(sv, yv)
        for alpha in alphas:
            a = check_alpha(alpha)
            q_rows = _crossfit_quantiles(s_true, a, k, seed)
            q = conformal_quantile(s_true, a)
            val_m, val_rows = _measured(sv <= q_rows.unsqueeze(1), yv, min_rows)
            test_m, test_rows = _measured(st <= q, yt, min_rows)
            rows = {"val": val_rows, "test": test_rows}
            out.append(SetsEvaluation(method, a, q, {"val": val_m, "test": test_m}, rows))
    return out


__all__ = ["SetsEvaluation", "evaluate_sets"]

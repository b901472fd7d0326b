"""Consistency resampling: what a calibration error looks like when the model *is* calibrated.

Binned calibration errors are biased upwards: a perfectly calibrated model on a finite set still
shows an ECE of a few percent, so no interval built from bootstrap replicates of the estimate
(which stay near that bias) covers the true value 0. Consistency resampling (Broecker & Smith
2007) draws labels from the model's own probabilities, ``y* ~ Categorical(p_i)``, which makes the
model calibrated by construction, and recomputes the metric: the null distribution of the
estimate under "calibrated". Its share at or above the observed estimate is a p-value for the
hypothesis that the model is calibrated.

:func:`calibration_interval` uses it to complete the bootstrap interval at the boundary: where the
data cannot reject "calibrated" at the interval's level, 0 is a value the data support, and the
interval's lower end becomes 0 (test inversion at the boundary of the parameter space). Elsewhere
the interval is :func:`~calib_core.metrics.bootstrap.centered_interval`. By simulation
(`python -m benchmarks.perf.bench_bootstrap --coverage`) this covers a calibrated model's ECE of 0 at about the
nominal rate, where the bootstrap interval alone almost never does.

The null draws reuse the bootstrap machinery exactly: each example is expanded into K rows, one
per class, and a draw is a 0/1 weight vector that selects the drawn class of every example, so a
null replicate is the metric computed on the relabelled data, with no Python loop over draws.
Top-label errors (ECE, MCE, RMSCE) only see whether the drawn label is the predicted class, so
for them two rows per example suffice (predicted class, another class).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._inputs import prepare
from .bootstrap import bootstrap_metrics, centered_interval
from .calibration_error import PRESETS

__all__ = ["CALIBRATION_ERRORS", "TOP_LABEL_ERRORS", "calibrated_null", "calibration_p_value", "calibration_interval"]

# The metrics that are calibration errors: 0 exactly for a calibrated model, biased upwards.
CALIBRATION_ERRORS = ("ece", "mce", "sce", "classwise_ece", "rmsce", "ace", "tace")
# Those that see only the top label's confidence and correctness: a cheap null (two rows per example).
TOP_LABEL_ERRORS = tuple(m for m in CALIBRATION_ERRORS if PRESETS[m]["top_label"])
_CHUNK_ELEMENTS = 1 << 24


def calibrated_null(
    probs: Any,
    labels: Any,
    *,
    num_draws: int = 200,
    seed: int = 0,
    num_bins: int = 15,
    from_logits: bool = False,
    names: tuple[str, ...] = CALIBRATION_ERRORS,
) -> dict[str, Tensor]:
    """Each calibration error of ``names`` on ``num_draws`` relabellings y* ~ Categorical(probs): (draws,) float64."""
    bad = [m for m in names if m not in CALIBRATION_ERRORS]
    if bad:
        allowed = ", ".join(CALIBRATION_ERRORS)
        raise ValueError(f"calibrated_null: {bad[0]!r} is not a calibration error; allowed: {allowed}")
    if num_draws < 1:
        raise ValueError(f"calibrated_null: num_draws must be >= 1, got {num_draws}")
    x = prepare(probs, labels, from_logits=from_logits)
    p = x.probs.detach().cpu()
    n, k = p.shape
    out: dict[str, Tensor] = {}
    top = tuple(m for m in names if PRESETS[m]["top_label"])
    if top:
        # Top-label errors see only whether the drawn label is the predicted class: two rows per
        # example (right, wrong) instead of K.
        pred = p.argmax(dim=1).numpy()
        right = _drawn_is(p, pred, num_draws, seed).astype(np.float32)
        weights = np.stack((right, 1.0 - right), axis=2).reshape(num_draws, 2 * n)
        wrong = (pred + 1) % k
        rows = p.repeat_interleave(2, dim=0)
        classes = torch.from_numpy(np.stack((pred, wrong), axis=1).reshape(-1))
        out.update(bootstrap_metrics(rows, classes, torch.from_numpy(weights), num_bins=num_bins, names=top))
    per_class = tuple(m for m in names if not PRESETS[m]["top_label"])
    if per_class:
        drawn = _draw_labels(p, num_draws, seed)
        rows = p.repeat_interleave(k, dim=0)
        classes = torch.arange(k).repeat(n)
        chunk = max(1, _CHUNK_ELEMENTS // (n * k))  # bounds the (draws, N * K) weight matrix
        parts: dict[str, list[Tensor]] = {m: [] for m in per_class}
        for b0 in range(0, num_draws, chunk):
            sel = drawn[b0 : b0 + chunk]
            weights = np.zeros((len(sel), n * k), dtype=np.float32)
            weights[np.arange(len(sel))[:, None], np.arange(n)[None, :] * k + sel] = 1.0
            reps = bootstrap_metrics(rows, classes, torch.from_numpy(weights), num_bins=num_bins, names=per_class)
            for m in per_class:
                parts[m].append(reps[m])
        out.update({m: torch.cat(v) for m, v in parts.items()})
    return {m: out[m] for m in names}


def _draw_labels(p: Tensor, num_draws: int, seed: int) -> np.ndarray:
    """(draws, N) labels by inverse CDF: the first class whose cumulative probability exceeds u."""
    rng = np.random.default_rng(seed)
    cum = torch.cumsum(p.double(), dim=1).numpy()
    n, k = cum.shape
    u = rng.random((num_draws, n))
    # Draws in blocks of ~_CHUNK_ELEMENTS / 4 comparisons bound the memory; the clamp keeps rows that
    # sum to 1 - eps valid.
    step = max(1, (_CHUNK_ELEMENTS // 4) // max(n * k, 1))
    out = np.empty((num_draws, n), dtype=np.int64)
    for b0 in range(0, num_draws, step):
        ub = u[b0 : b0 + step]
        out[b0 : b0 + len(ub)] = np.minimum((ub[:, :, None] > cum[None]).sum(axis=2), k - 1)
    return out


def _drawn_is(p: Tensor, classes: np.ndarray, num_draws: int, seed: int) -> np.ndarray:
    """(draws, N) bool: whether _draw_labels(p, num_draws, seed) drew `classes` (one class per row), from the same
    uniforms compared with that class's two cumulative bounds only (N per draw, not N x K: the top-label null's
    share of the selection's bootstrap). _draw_labels draws the number of classes whose cumulative probability is
    below u (capped at K - 1); the cumulative sums do not decrease, so that number is c exactly when
    cum[c - 1] < u <= cum[c] (no lower bound for c = 0, no upper one for c = K - 1)."""
    rng = np.random.default_rng(seed)
    cum = torch.cumsum(p.double(), dim=1).numpy()
    n, k = cum.shape
    u = rng.random((num_draws, n))
    rows = np.arange(n)
    low = np.where(classes > 0, cum[rows, np.maximum(classes - 1, 0)], -np.inf)
    high = np.where(classes < k - 1, cum[rows, classes], np.inf)
    return (u > low[None, :]) & (u <= high[None, :])


def calibration_p_value(null: Tensor, point: float) -> float:
    """Share of calibrated-null replicates at or above the observed estimate (with the +1 correction)."""
    r = null.double()
    r = r[torch.isfinite(r)]
    return float((1 + (r >= point - 1e-12).sum()) / (1 + r.numel()))


def calibration_interval(replicates: Tensor, point: float, null: Tensor, level: float = 0.95) -> tuple[float, float]:
    """The bootstrap interval of a calibration error, reaching down to 0 where "calibrated" is not rejected."""
    lo, hi = centered_interval(replicates, point, level)
    if calibration_p_value(null, point) > 1.0 - level:
        lo = 0.0
    return lo, hi

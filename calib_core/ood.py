"""Out-of-distribution detection: confidence scores and detection metrics.

Scores are "higher = more in-distribution" throughout:

* `max_softmax_score(probs)`: max_k p_k (MSP; Hendrycks & Gimpel 2017).
* `entropy_score(probs)`: sum_k p_k log p_k = *minus* the Shannon entropy (nats), with
  0 log 0 = 0. It lies in [-log K, 0]; 0 for a one-hot row, -log K for the uniform row.

Metrics take `scores_in` (in-distribution samples, the positives) and `scores_out` (OOD
samples, the negatives):

* `auroc`: the probability that a random in-distribution sample scores higher than a random
  OOD sample, ties counting 1/2 (the Mann-Whitney U statistic / (n_in * n_out)). Computed
  exactly from mid-ranks in integer arithmetic (no threshold sweep, no float accumulation);
  equal to `sklearn.metrics.roc_auc_score` with in = 1, out = 0.
* `fpr_at_tpr(..., tpr=0.95)`: a sample is called in-distribution when score >= t. t is the
  *largest* threshold with TPR = mean(scores_in >= t) >= tpr, i.e. the k-th largest in-score
  with k = ceil(tpr * n_in); the result is FPR = mean(scores_out >= t). Ties: every sample
  scoring exactly t is called in-distribution, so in-samples tied with t raise the TPR above
  the target and OOD samples tied with t count as false positives (the pessimistic reading;
  it equals the FPR at the first point of `sklearn.metrics.roc_curve` with TPR >= tpr).

Inputs are torch tensors (any device; moved to the CPU for the metrics) or numpy arrays.
Scores come back in the input's type (tensor on the input's device, or numpy array); metrics
as Python floats. Empty inputs, NaN, wrong shapes and rows that are not probability vectors
raise ValueError.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calib_core.metrics._inputs import _as_tensor as _metrics_as_tensor

ROW_SUM_ATOL = 1e-4


def _as_tensor(x: Any, name: str) -> tuple[Tensor, bool]:
    """The metrics package's conversion, with numpy floats widened to float64 (a copy)."""
    t, from_torch = _metrics_as_tensor(x, name)
    if not from_torch and t.is_floating_point():
        t = t.double()
    return t, from_torch


def _check_probs(probs: Any, name: str = "probs") -> tuple[Tensor, bool]:
    p, from_torch = _as_tensor(probs, name)
    if p.ndim != 2:
        raise ValueError(f"{name} must have shape (N, K), got {tuple(p.shape)}")
    if p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(p.shape)})")
    if not p.is_floating_point():
        raise ValueError(f"{name} must hold floating-point probabilities, got dtype {p.dtype}")
    if p.dtype not in (torch.float32, torch.float64):
        p = p.float()
    if not torch.isfinite(p).all():
        raise ValueError(f"{name} contains NaN or inf")
    if (p < 0).any():
        raise ValueError(f"{name} has negative entries: expected probabilities")
    tol = ROW_SUM_ATOL + 4 * p.shape[1] * torch.finfo(p.dtype).eps
    worst = (p.sum(dim=1, dtype=torch.float64) - 1).abs().max()
    if worst > tol:
        raise ValueError(
            f"{name}: rows must sum to 1 (worst deviation {float(worst):.3g}); pass softmax outputs, not logits"
        )
    return p, from_torch


def _out(score: Tensor, from_torch: bool) -> Tensor | np.ndarray:
    return score if from_torch else score.cpu().numpy()


def max_softmax_score(probs: Any) -> Tensor | np.ndarray:
    """max_k p_k per row, (N,). Higher = more in-distribution."""
    p, from_torch = _check_probs(probs)
    return _out(p.amax(dim=1), from_torch)


def entropy_score(probs: Any) -> Tensor | np.ndarray:
    """sum_k p_k log p_k per row (= -entropy in nats, 0 log 0 = 0), (N,). Higher = more in-distribution."""
    p, from_torch = _check_probs(probs)
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    return _out(plogp.sum(dim=1), from_torch)


def _check_scores(scores: Any, name: str) -> np.ndarray:
    s, _ = _as_tensor(scores, name)
    if s.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of scores, got shape {tuple(s.shape)}")
    if s.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    values = s.to("cpu", torch.float64).numpy()
    if np.isnan(values).any():
        raise ValueError(f"{name} contains NaN")
    return values


def auroc(scores_in: Any, scores_out: Any) -> float:
    """Exact AUROC of telling in-distribution (positive) from OOD by score; ties count 1/2."""
    s_in = _check_scores(scores_in, "scores_in")
    s_out = _check_scores(scores_out, "scores_out")
    n_in, n_out = len(s_in), len(s_out)
    allv = np.concatenate([s_in, s_out])
    _, inverse, counts = np.unique(allv, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts  # 0-based first position of each distinct value
    twice_rank = 2 * starts + counts + 1  # 2 x mid-rank (1-based): an integer
    twice_u = int(twice_rank[inverse[:n_in]].astype(np.int64).sum()) - n_in * (n_in + 1)
    return twice_u / (2 * n_in * n_out)


def _count_needed(tpr: float, n: int) -> int:
    x = tpr * n
    r = round(x)
    return int(r) if abs(x - r) <= 1e-9 * max(1.0, x) else math.ceil(x)


def fpr_at_tpr(scores_in: Any, scores_out: Any, tpr: float = 0.95) -> float:
    """FPR on OOD samples at the largest threshold whose TPR on in-distribution is >= `tpr`.

    Called in-distribution: score >= threshold (see the module docstring for ties).
    """
    if isinstance(tpr, bool) or not isinstance(tpr, (int, float)) or not (0.0 < float(tpr) <= 1.0):
        raise ValueError(f"tpr must be a number in (0, 1], got {tpr!r}")
    s_in = _check_scores(scores_in, "scores_in")
    s_out = _check_scores(scores_out, "scores_out")
    k = max(1, min(_count_needed(float(tpr), len(s_in)), len(s_in)))
    threshold = np.sort(s_in)[::-1][k - 1]
    return float(np.count_nonzero(s_out >= threshold)) / len(s_out)


def ood_report(probs_in: Any, probs_out: Any, *, tpr: float = 0.95) -> dict[str, float]:
    """AUROC and FPR@tpr of MSP and negative entropy: keys msp_auroc, msp_fpr95, entropy_auroc, entropy_fpr95.

    (The "95" in the key names is kept whatever `tpr` is; the default is 0.95.)
    """
    p_in, _ = _check_probs(probs_in, "probs_in")
    p_out, _ = _check_probs(probs_out, "probs_out")
    if p_in.shape[1] != p_out.shape[1]:
        raise ValueError(f"shape mismatch: probs_in has {p_in.shape[1]} classes, probs_out {p_out.shape[1]}")
    out: dict[str, float] = {}
    for key, fn in (("msp", max_softmax_score), ("entropy", entropy_score)):
        s_in, s_out = fn(p_in), fn(p_out)
        out[f"{key}_auroc"] = auroc(s_in, s_out)
        out[f"{key}_fpr95"] = fpr_at_tpr(s_in, s_out, tpr)
    return out

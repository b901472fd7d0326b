"""The shared core of split conformal classification: input checks, the labels sorted by probability mass, and
prediction sets from per-label scores (vectorised: no Python loop over rows or classes)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

#: Rows of ``probs`` must sum to 1 within this (plus 4 K eps of their dtype), as calib_core.metrics asks.
ROW_SUM_ATOL = 1e-4


def check_alpha(alpha: Any) -> float:
    """The miscoverage level as a float in (0, 1), else a ValueError naming it."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be a number in (0, 1) (the miscoverage level), got {alpha!r}")
    return float(alpha)


def check_probs(probs: Any) -> Tensor:
    """(N, K) probabilities as a floating tensor (float16/bfloat16 widened to float32); ValueError on a wrong shape,
    non-finite or negative values, or rows that do not sum to 1."""
    p = probs.detach() if isinstance(probs, Tensor) else torch.as_tensor(probs)
    if p.dim() != 2 or p.shape[1] < 2:
        raise ValueError(f"probs must be (N, K) with K >= 2 classes, got shape {tuple(p.shape)}")
    if not p.is_floating_point():
        raise ValueError(f"probs must be floating point, got {p.dtype}")
    if p.dtype in (torch.float16, torch.bfloat16):
        p = p.float()
    if p.shape[0] and not bool(torch.isfinite(p).all()):
        raise ValueError("probs has NaN or infinite values")
    if p.shape[0] and bool((p < 0).any()):
        raise ValueError("probs has negative values")
    if p.shape[0]:
        err = (p.double().sum(dim=1) - 1.0).abs().max().item()
        if err > ROW_SUM_ATOL + 4 * p.shape[1] * torch.finfo(p.dtype).eps:
            raise ValueError(f"rows of probs must sum to 1 (largest deviation {err:.3g}): probabilities, not logits")
    return p


def check_labels(labels: Any, probs: Tensor) -> Tensor:
    """(N,) integer labels in [0, K) matching `probs`' rows, as int64."""
    y = labels.detach() if isinstance(labels, Tensor) else torch.as_tensor(labels)
    if y.dim() != 1 or y.shape[0] != probs.shape[0]:
        raise ValueError(f"labels must be (N,) = ({probs.shape[0]},), got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got {y.dtype}")
    y = y.long().to(probs.device)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= probs.shape[1]):
        raise ValueError(f"labels must lie in [0, {probs.shape[1]}), got values in [{int(y.min())}, {int(y.max())}]")
    return y


def check_uniform(u: Any, n: int, like: Tensor) -> Tensor:
    """(N,) uniform draws in [0, 1], one per row (randomised scores), in `like`'s dtype and device."""
    d = u.detach() if isinstance(u, Tensor) else torch.as_tensor(u)
    d = d.reshape(-1) if d.dim() == 2 and d.shape[1] == 1 else d
    if d.dim() != 1 or d.shape[0] != n:
        raise ValueError(f"u must hold one uniform draw per row, shape ({n},), got {tuple(d.shape)}")
    d = d.to(dtype=like.dtype, device=like.device)
    if d.numel() and not bool(((d >= 0) & (d <= 1)).all()):
        raise ValueError("u must lie in [0, 1]")
    return d


def check_quantile(q: Any) -> float:
    """A conformal quantile: a real number, +inf allowed (every label), NaN refused."""
    if isinstance(q, Tensor):
        q = q.item()
    if isinstance(q, bool) or not isinstance(q, (int, float)) or math.isnan(float(q)):
        raise ValueError(f"quantile must be a number (+inf: every label), got {q!r}")
    return float(q)


def sorted_mass(probs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Labels by decreasing probability: (order (N, K) label at each rank, sorted probs, inclusive cumulative mass,
    rank (N, K) 1-based rank of each label). A stable sort, so tied labels keep their index order."""
    ordered, order = torch.sort(probs, dim=1, descending=True, stable=True)
    cumsum = torch.cumsum(ordered, dim=1)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(1, probs.shape[1] + 1).expand_as(order).to(order))
    return order, ordered, cumsum, rank


def to_label_order(by_rank: Tensor, order: Tensor) -> Tensor:
    """Values laid out by rank (N, K) back in label order."""
    return torch.empty_like(by_rank).scatter_(1, order, by_rank)


def threshold_sets(scores: Tensor, q: float, *, tolerance: float = 0.0, nonempty: bool = False) -> Tensor:
    """{k : score_k <= q + tolerance} per row as an (N, K) bool mask; `nonempty` gives an empty row its lowest-score
    label (torch-uncertainty's convention)."""
    sets = scores - q <= tolerance if math.isfinite(q) else torch.full_like(scores, q > 0, dtype=torch.bool)
    if nonempty and sets.shape[0]:
        empty = ~sets.any(dim=1)
        fallback = torch.zeros_like(sets).scatter_(1, scores.argmin(dim=1, keepdim=True), True)
        sets = sets | (empty.unsqueeze(1) & fallback)
    return sets


def true_label_scores(scores: Tensor, labels: Tensor) -> Tensor:
    """Each row's score at its label, (N,)."""
    return scores.gather(1, labels.unsqueeze(1)).squeeze(1)

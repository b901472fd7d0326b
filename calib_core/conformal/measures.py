"""What prediction sets are judged on: coverage, set size, coverage per class and per set-size stratum
(Angelopoulos et al. 2021's size-stratified coverage), from an (N, K) bool set mask and the labels."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

# Size strata as in Angelopoulos et al. 2021 (0-1, 2-3, 4-10, 11-100, 101-1000, more): lower edges
SIZE_STRATA = (0, 2, 4, 11, 101, 1001)
# A class or stratum with fewer rows says little about its coverage: left out of the worst case
MIN_ROWS = 10


def _check(sets: Tensor, labels: Tensor) -> None:
    if sets.dim() != 2 or sets.dtype != torch.bool:
        raise ValueError(f"sets must be an (N, K) bool mask, got {tuple(sets.shape)} {sets.dtype}")
    if labels.dim() != 1 or labels.shape[0] != sets.shape[0]:
        raise ValueError(f"labels must be (N,) = ({sets.shape[0]},), got {tuple(labels.shape)}")


def covered(sets: Tensor, labels: Tensor) -> Tensor:
    """Whether each row's set holds its label, (N,) bool."""
    _check(sets, labels)
    return sets.gather(1, labels.long().unsqueeze(1)).squeeze(1)


def set_sizes(sets: Tensor) -> Tensor:
    """The number of labels in each row's set, (N,) int64."""
    return sets.sum(dim=1)


def class_coverage(hit: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(coverage per true class (K,) float64, NaN where a class has no row; rows per class (K,))."""
    y = labels.long()
    rows = torch.bincount(y, minlength=num_classes)
    hits = torch.bincount(y, weights=hit.double(), minlength=num_classes)
    return hits / rows.clamp(min=1) + torch.where(rows > 0, 0.0, math.nan), rows


def stratum_coverage(hit: Tensor, sizes: Tensor, edges: Sequence[int] = SIZE_STRATA) -> tuple[Tensor, Tensor]:
    """(coverage per set-size stratum (len(edges),) float64, NaN where empty; rows per stratum); stratum i holds the
    sizes in [edges[i], edges[i + 1])."""
    bounds = torch.tensor(list(edges[1:]), dtype=sizes.dtype, device=sizes.device)
    stratum = torch.bucketize(sizes, bounds, right=True)
    rows = torch.bincount(stratum, minlength=len(edges))
    hits = torch.bincount(stratum, weights=hit.double(), minlength=len(edges))
    return hits / rows.clamp(min=1) + torch.where(rows > 0, 0.0, math.nan), rows


def worst(coverage: Tensor, rows: Tensor, min_rows: int = MIN_ROWS) -> float:
    """The lowest coverage among groups with at least `min_rows` rows; NaN when none has."""
    keep = rows >= min_rows
    return float(coverage[keep].min()) if bool(keep.any()) else math.nan


def summary(sets: Tensor, labels: Tensor, *, min_rows: int = MIN_ROWS) -> dict[str, float]:
    """coverage, size (mean set size), worst_class_coverage and worst_size_coverage of one split's sets."""
    hit = covered(sets, labels)
    sizes = set_sizes(sets)
    if hit.numel() == 0:
        raise ValueError("no rows to measure")
    return {
        "coverage": float(hit.double().mean()),
        "size": float(sizes.double().mean()),
        "worst_class_coverage": worst(*class_coverage(hit, labels, sets.shape[1]), min_rows),
        "worst_size_coverage": worst(*stratum_coverage(hit, sizes), min_rows),
    }

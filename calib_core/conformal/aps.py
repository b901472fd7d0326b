"""APS (Romano, Sesia & Candes 2020): the score of label k is the probability mass of the labels ranked at or above
it; randomised, minus U * p_k with one uniform draw U per row, which makes the coverage exact rather than at least
1 - alpha."""

from __future__ import annotations

from torch import Tensor

from .core import sorted_mass, to_label_order


def label_scores(probs: Tensor, u: Tensor | None = None) -> Tensor:
    """The (randomised when `u` (N,) is given) APS score of every label, (N, K)."""
    order, ordered, cumsum, _ = sorted_mass(probs)
    by_rank = cumsum if u is None else cumsum - u.unsqueeze(1) * ordered
    return to_label_order(by_rank, order)


def crossing_sets(probs: Tensor, q: float, tolerance: float) -> Tensor:
    """MAPIE's ``include_last_label=True``: the labels ranked above the first whose cumulative mass reaches q, and that
    one (the label whose mass crosses q is kept; the top label always is), (N, K) bool."""
    order, ordered, cumsum, _ = sorted_mass(probs)
    before = cumsum - ordered  # the mass ranked strictly above each label
    keep = before - q < -tolerance
    keep[:, 0] = True
    return to_label_order(keep, order)

"""LAC / THR (Sadinle, Lei & Wasserman 2019): the score of label k is 1 - p_k; the set keeps every label whose
probability reaches 1 - q (the smallest sets on average among valid ones; may be empty)."""

from __future__ import annotations

from torch import Tensor


def label_scores(probs: Tensor, u: Tensor | None = None) -> Tensor:
    """1 - p_k for every label, (N, K). LAC is never randomised: `u` must be None."""
    if u is not None:
        raise ValueError("LAC has no randomised form: pass u=None")
    return 1.0 - probs

"""Is the champion better than always answering the most frequent class? (pure: numpy only)

A model whose accuracy interval on validation or test (as the service computes it: the paired bootstrap of
sweeps/decide/uncertainty.py) reaches down to that split's majority-class rate has not been shown to learn anything
a constant answer does not. It is registered under NO_BETTER_ALIAS instead of `@champion` (champion_gate.py), and
one line says why.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SPLIT_WORDS = {"val": "validation", "test": "test"}


def majority_rate(labels: np.ndarray) -> float | None:
    """The share of the most frequent class among a split's labelled rows (-1 = missing); None without any."""
    y = np.asarray(labels).reshape(-1)
    y = y[y >= 0].astype(np.int64)
    if y.size == 0:
        return None
    return float(np.bincount(y).max() / y.size)


def no_better_than_majority(
    intervals: Mapping[str, tuple[float, float]], rates: Mapping[str, float | None]
) -> str | None:
    """Why the model is no better than the majority class, in a few words: the first split (validation, then test)
    whose accuracy interval's lower bound is at or below that split's majority-class rate; None when every split
    with both an interval and a rate is above it."""
    for split in ("val", "test"):
        rate, interval = rates.get(split), intervals.get(split)
        if rate is None or interval is None:
            continue
        low, high = interval
        if low <= rate:
            where = "includes" if high >= rate else "lies below"
            return (
                f"its {SPLIT_WORDS[split]} accuracy interval [{100 * low:.1f} %, {100 * high:.1f} %] {where} the "
                f"majority-class rate of that split, {100 * rate:.1f} %"
            )
    return None

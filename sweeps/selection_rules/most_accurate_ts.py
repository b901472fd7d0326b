"""The most accurate trial with temperature scaling on top: the default since selection_v4.

benchmarks/studies/protocols/selection_v4.md (pre-registered) compared four simpler rules with the margin rule on 180
sweeps in five regimes; this one was the simplest shown non-inferior on test NLL and on the accuracy gap to the best
candidate in every regime (benchmarks/results/selection_v4.md), so it became the default. It reads validation numbers
only: val accuracy (temperature scaling keeps every argmax, so a trial and its "+ TS" candidate have the same), then
val NLL to break a tie, then the candidate id. Where no "+ TS" candidate completed (evaluation.temperature_on_top off,
or every fit failed) it takes the most accurate candidate as trained, and its sentence says so.
"""

from __future__ import annotations

import math
from typing import Any

from sweeps.selection_rules.base import (
    POST_TS,
    Replicates,
    TrialRecord,
    accuracy_gaps,
    ci,
    most_accurate,
    pct,
    points,
)
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import NoSettings, RuleSpec


def _nll(r: TrialRecord) -> float:
    """Val NLL for the tie-break; a candidate without it sorts last."""
    v = r.metrics.get("val_nll", math.inf)
    return v if math.isfinite(v) else math.inf


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule (the "+ TS" candidates eligible, or every candidate where none), and its sentence."""
    pool = [r for r in ok if r.post == POST_TS] or ok
    best_acc = max(r.metrics["val_accuracy"] for r in pool)
    tied = [r for r in pool if r.metrics["val_accuracy"] == best_acc]
    best = min(tied, key=lambda r: (_nll(r), r.trial_id))
    top = most_accurate(ok)
    gap = accuracy_gaps(ok, top)
    eligible = {r.trial_id for r in pool}
    standings = {r.trial_id: Standing(gap[r.trial_id], r.trial_id in eligible) for r in ok}
    lines = [_head(best, reps), _trade(best, top, gap[best.trial_id]), _rule(pool, ok, tied)]
    return Choice(best, top, standings, "\n".join(lines))


def _head(best: TrialRecord, reps: Replicates | None) -> str:
    """The champion: its val accuracy, NLL and ECE, with intervals where the bootstrap made them."""
    nll = f", val NLL {best.metrics['val_nll']:.4f}{ci(reps, best, 'val_nll')}" if "val_nll" in best.metrics else ""
    level = f" ({100 * reps.level:.0f} % bootstrap intervals)" if reps is not None else ""
    return (
        f"{best.label} ({best.family}): val acc {pct(best.metrics['val_accuracy'])}"
        f"{ci(reps, best, 'val_accuracy')}{nll}, val ECE {pct(best.metrics['val_ece'])}{ci(reps, best, 'val_ece')}"
        f"{level}"
    )


def _trade(best: TrialRecord, top: TrialRecord, gap: float) -> str:
    """What the champion gives up in val accuracy: nothing unless the most accurate candidate has no "+ TS" twin."""
    if best is top:
        return "Trade: none, it is also the most accurate candidate."
    if gap == 0:
        return f"Trade: none, it ties the most accurate candidate {top.label} ({top.family}) on val accuracy."
    return (
        f"Trade: {points(gap, 0.0)} pt less accurate on validation than the most accurate candidate {top.label} "
        f"({top.family}), which has no candidate with temperature scaling on top."
    )


def _rule(pool: list[TrialRecord], ok: list[TrialRecord], tied: list[TrialRecord]) -> str:
    """The criterion in words with its counts, and the tie-break where it acted."""
    tie = f"; {len(tied)} tied on val accuracy, the lowest val NLL taken" if len(tied) > 1 else ""
    if pool is ok and not any(r.post == POST_TS for r in ok):
        return (
            f"Rule: the most accurate of all {len(ok)} candidates (none has temperature scaling on top: "
            f"evaluation.temperature_on_top is off or no fit completed){tie}."
        )
    return (
        f"Rule: the most accurate of the {len(pool)} candidate{'' if len(pool) == 1 else 's'} with temperature scaling "
        f"on top (of {len(ok)} candidates){tie}; the simplest rule shown non-inferior to the margin rule in "
        "benchmarks/results/selection_v4.md."
    )


RULE = RuleSpec(
    "most_accurate_ts",
    "the most accurate trial with temperature scaling on top (ties by val NLL); the default since selection_v4",
    NoSettings,
    (),
    False,
    pick,
    order=0,
)

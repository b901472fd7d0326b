"""The previous default: the best calibrated among the trials not significantly less accurate than the most accurate."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from sweeps.selection_rules.base import (
    Replicates,
    TrialRecord,
    accuracy_candidates,
    accuracy_gaps,
    ci,
    fmt_metric,
    metric_name,
    pct,
)
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import SHARED, RuleSpec, Settings


class NoiseAwareSettings(Settings):
    """The previous default's own settings."""

    # The most accurate trial is the maximum of noisy estimates; Bonferroni over the M - 1 comparisons with it keeps
    # the chance of wrongly excluding any trial below 1 - confidence (benchmarks/results/selection.md).
    multiple_comparisons: Literal["none", "bonferroni"] = "bonferroni"
    # mode min: a trial with less than this factor times the champion's metric and accuracy not significantly
    # below the champion's replaces it (None: off).
    dominance_factor: float | None = Field(default=0.5, gt=0.0, lt=1.0)


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule, every candidate's standing (its p-value against the most accurate; in the pool when
    not significantly less accurate), and the sentence saying why and what it trades."""
    assert reps is not None  # (select() refused a missing one: RULE needs the replicates)
    alpha = 1.0 - cfg.confidence
    adjusted = cfg.multiple_comparisons == "bonferroni" and len(ok) > 2
    if adjusted:
        alpha /= len(ok) - 1
    best_acc, pvals = accuracy_candidates(ok, reps)
    gap = accuracy_gaps(ok, best_acc)
    standings = {
        r.trial_id: Standing(gap[r.trial_id], pvals[r.trial_id] >= alpha, p_value=pvals[r.trial_id]) for r in ok
    }
    near = [r for r in ok if standings[r.trial_id].eligible]
    sign = 1.0 if cfg.mode == "min" else -1.0
    m = cfg.metric

    def rank(r: TrialRecord) -> tuple[float, float, str]:
        return sign * r.metrics[m], r.metrics.get("val_nll", math.inf), r.trial_id

    best = first = min(near, key=rank)
    # A trial outside the pool can still be tied with the chosen one on accuracy while far better
    # calibrated (the most accurate trial's lead is partly luck): move to it, and repeat.
    moves = []
    while cfg.dominance_factor is not None and cfg.mode == "min":
        better = [
            r
            for r in ok
            if r.metrics[m] < cfg.dominance_factor * best.metrics[m]
            and (r is best_acc or reps.significantly_greater(best.trial_id, r.trial_id, "val_accuracy")[1] >= alpha)
        ]
        if not better:
            break
        moves.append(best)
        best = min(better, key=rank)
    level = f"{100 * cfg.confidence:.0f} %"
    # three short lines: the champion with its intervals, what it trades, the rule that chose it
    head = (
        f"{best.label}: val {metric_name(m)} {fmt_metric(m, best.metrics[m])}{ci(reps, best, m)}, "
        f"val acc {pct(best.metrics['val_accuracy'])}{ci(reps, best, 'val_accuracy')} ({level} bootstrap intervals)"
    )
    test = f"one-sided paired bootstrap at {level}"
    if adjusted:
        test += f", Bonferroni over {len(ok) - 1} comparisons: p < {alpha:.3f}"
    rule = (
        f"Rule: {'lowest' if cfg.mode == 'min' else 'highest'} val {metric_name(m)} among the {len(near)} of "
        f"{len(ok)} candidates not significantly less accurate than the most accurate ({test})"
    )
    if moves:
        rule += (
            f"; that was {first.label} ({fmt_metric(m, first.metrics[m])}), replaced by this trial with under "
            f"{cfg.dominance_factor:g}x its val {metric_name(m)} and accuracy not significantly lower than that pick's"
        )
        if best not in near:  # the dominance step may leave the pool: say so rather than imply the pool's promise
            rule += (
                "; the dominance step left the pool, so this champion IS significantly less accurate than the most "
                "accurate trial (the margin rule, selection.rule: margin, never leaves its set)"
            )
    if best is best_acc:
        return Choice(
            best, best_acc, standings, f"{head}\nTrade: none, it is also the most accurate candidate.\n{rule}."
        )
    p = reps.significantly_greater(best_acc.trial_id, best.trial_id, "val_accuracy")[1]
    trade = (
        f"Trade: {100 * gap[best.trial_id]:.1f} pt below the most accurate candidate {best_acc.label} (p = {p:.3f}, "
        f"{'not significant' if p >= alpha else 'significant'}), whose val {metric_name(m)} is "
        f"{fmt_metric(m, best_acc.metrics[m])}{ci(reps, best_acc, m)}"
    )
    return Choice(best, best_acc, standings, f"{head}\n{trade}.\n{rule}.")


RULE = RuleSpec(
    "noise_aware",
    "lowest val calibration error among the trials not significantly less accurate than the most accurate "
    "(one-sided paired bootstrap, Bonferroni), then a dominance step that may leave that set",
    NoiseAwareSettings,
    SHARED,
    True,
    pick,
    order=2,
)

"""The default rule: the best calibrated candidate within an accuracy margin of the most accurate."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pydantic import Field

from sweeps.selection_rules.base import (
    Replicates,
    TrialRecord,
    accuracy_gaps,
    accuracy_lower_bounds,
    ci,
    fmt_metric,
    is_rate,
    metric_name,
    pct,
    points,
)
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import SHARED, RuleSpec, Settings


class MarginSettings(Settings):
    """The default rule's own setting."""

    # 2 pt: chosen by benchmarks/studies/protocols/selection_v3.md's pre-registered rule among 0.5, 1 and 2 pt
    # (benchmarks/results/selection_v3.md; a 1 pt default was provisional before it ran).
    max_accuracy_loss: float = Field(
        default=2.0,
        ge=0.0,
        le=100.0,
        description="margin rule: the most validation accuracy, in points, the champion may lose to the most "
        "accurate candidate (judged by the one-sided lower confidence bound of the paired difference)",
    )


def judge(ok: list[TrialRecord], cfg: Any, reps: Replicates) -> tuple[TrialRecord, dict[str, Standing]]:
    """The most accurate candidate and every candidate's standing: its point accuracy gap to it, the one-sided lower
    confidence bound of the paired difference, and whether that bound lies above minus selection.max_accuracy_loss
    (non-inferiority shown; the most accurate candidate itself always in)."""
    best_acc, lower = accuracy_lower_bounds(ok, reps)
    margin, gap = cfg.max_accuracy_loss / 100.0, accuracy_gaps(ok, best_acc)
    return best_acc, {
        r.trial_id: Standing(gap[r.trial_id], r is best_acc or lower[r.trial_id] > -margin, lower[r.trial_id])
        for r in ok
    }


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule, every candidate's standing, and the sentence read from them."""
    assert reps is not None  # (select() refused a missing one: RULE needs the replicates)
    best_acc, standings = judge(ok, cfg, reps)
    sign = 1.0 if cfg.mode == "min" else -1.0
    m = cfg.metric
    kept = [r for r in ok if standings[r.trial_id].eligible]
    best = min(kept, key=lambda r: (sign * r.metrics[m], r.metrics.get("val_nll", math.inf), r.trial_id))
    choice = Choice(best, best_acc, standings)
    lines = (head_line(choice, cfg, reps), trade_line(choice, cfg, reps), rule_line(ok, choice, cfg, reps))
    return replace(choice, sentence="\n".join((*lines, family_line(ok, choice, cfg, reps))))


def head_line(choice: Choice, cfg: Any, reps: Replicates) -> str:
    """The champion with its intervals."""
    best, m = choice.champion, cfg.metric
    return (
        f"{best.label} ({best.family}): val {metric_name(m)} {fmt_metric(m, best.metrics[m])}{ci(reps, best, m)}, "
        f"val acc {pct(best.metrics['val_accuracy'])}{ci(reps, best, 'val_accuracy')} "
        f"({100 * reps.level:.0f} % bootstrap intervals)"
    )


def trade_line(choice: Choice, cfg: Any, reps: Replicates) -> str:
    """What the champion gives up against the most accurate candidate, with the bound that let it in."""
    best, top, m = choice.champion, choice.most_accurate, cfg.metric
    if best is top:
        return "Trade: none, it is also the most accurate candidate."
    standing, margin = choice.standings[best.trial_id], cfg.max_accuracy_loss
    if standing.accuracy_gap == 0:  # tied on accuracy and (by the pick) on the metric: a tie break, not a trade
        return (
            f"Trade: none, it ties the most accurate candidate {top.label} ({top.family}) on val accuracy and val "
            f"{metric_name(m)}."
        )
    lo, hi = reps.difference_interval(best.trial_id, top.trial_id, "val_accuracy")
    assert standing.lower_bound is not None
    return (
        f"Trade: {points(standing.accuracy_gap, margin)} pt less accurate on validation than the most accurate "
        f"candidate {top.label} ({top.family}; difference {100 * -standing.accuracy_gap:+.1f} pt [{100 * lo:+.1f}, "
        f"{100 * hi:+.1f}], one-sided {100 * reps.level:.0f} % lower bound {points(standing.lower_bound, -margin, '+')}"
        f" pt, above -{margin:g} pt), for val {metric_name(m)} {fmt_metric(m, best.metrics[m])} against its "
        f"{fmt_metric(m, top.metrics[m])}."
    )


def rule_line(ok: list[TrialRecord], choice: Choice, cfg: Any, reps: Replicates) -> str:
    """The criterion in words, the count it admitted, and why the others are out: a point gap of at least the margin,
    or an interval too wide to show a smaller gap within it."""
    margin = f"{cfg.max_accuracy_loss:g} pt"
    kept = choice.eligible(ok)
    line = (
        f"Rule: {'lowest' if cfg.mode == 'min' else 'highest'} val {metric_name(cfg.metric)} among the {len(kept)} of "
        f"{len(ok)} candidates shown to be within {margin} of the most accurate candidate's val accuracy (one-sided "
        f"{100 * reps.level:.0f} % paired bootstrap lower bound of the difference above -{margin}; "
        "selection.max_accuracy_loss)."
    )
    left = [choice.standings[r.trial_id] for r in ok if not choice.standings[r.trial_id].eligible]
    if left:
        wide = sum(100 * s.accuracy_gap < cfg.max_accuracy_loss for s in left)
        line += (
            f" Left out: {len(left)} ({wide} within {margin} by point estimate but not shown to be, "
            f"{len(left) - wide} at least {margin} below)."
        )
    return line


def family_line(ok: list[TrialRecord], choice: Choice, cfg: Any, reps: Replicates) -> str:
    """Which family won and by how much: each other family's best candidate in the set, with the paired difference
    of the selection metric to the champion and its interval; each family with no candidate in the set, with its
    closest point gap (said to be within the margin where it is) and its highest lower bound."""
    champion, margin = choice.champion, cfg.max_accuracy_loss
    m, sign = cfg.metric, (1.0 if cfg.mode == "min" else -1.0)
    scale, unit = (100.0, " pt") if is_rate(m) else (1.0, "")
    inside, outside = [], []
    for fam in sorted({r.family for r in ok} - {champion.family}):
        mine = [r for r in choice.eligible(ok) if r.family == fam]
        if not mine:
            judged = [choice.standings[r.trial_id] for r in ok if r.family == fam]
            closest = min(s.accuracy_gap for s in judged)
            highest = max(s.lower_bound for s in judged if s.lower_bound is not None)
            wide = f", within {margin:g} pt by point estimate but not shown to be" if 100 * closest < margin else ""
            outside.append(
                f"{fam} (closest {points(closest, margin)} pt below{wide}, "
                f"highest lower bound {points(highest, -margin, '+')} pt)"
            )
            continue
        top = min(mine, key=lambda r: (sign * r.metrics[m], r.trial_id))
        text = f"{fam} {fmt_metric(m, top.metrics[m])}"
        if reps.has(top.trial_id, m) and reps.has(champion.trial_id, m):
            d = top.metrics[m] - champion.metrics[m]
            lo, hi = reps.difference_interval(top.trial_id, champion.trial_id, m)
            text += f", {scale * d:+.1f} [{scale * lo:+.1f}, {scale * hi:+.1f}]{unit}"
        inside.append(text)
    parts = [f"Won by family {champion.family} (val {metric_name(m)} {fmt_metric(m, champion.metrics[m])})"]
    if inside:
        parts.append(f" Others in that set, against it: {'; '.join(inside)}")
    if outside:
        parts.append(f" Families with no candidate in that set: {'; '.join(outside)}")
    return ".".join(parts) + "."


RULE = RuleSpec(
    "margin",
    "lowest val calibration error among the candidates shown to be within selection.max_accuracy_loss points of "
    "the most accurate's val accuracy (one-sided paired bootstrap lower bound of the difference above minus it)",
    MarginSettings,
    SHARED,
    True,
    pick,
    order=1,
)

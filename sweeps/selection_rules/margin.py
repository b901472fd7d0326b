"""The default rule: the best calibrated candidate within an accuracy margin of the most accurate."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import Field

from sweeps.selection_rules.base import (
    Replicates,
    TrialRecord,
    accuracy_lower_bounds,
    ci,
    fmt_metric,
    is_rate,
    metric_name,
    pct,
)
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


def within_margin(ok: list[TrialRecord], cfg: Any, reps: Replicates) -> tuple[TrialRecord, list[TrialRecord]]:
    """The most accurate candidate and the candidates non-inferior to it within selection.max_accuracy_loss:
    the one-sided lower confidence bound of the paired accuracy difference lies above minus the margin."""
    best_acc, lower = accuracy_lower_bounds(ok, reps)
    margin = cfg.max_accuracy_loss / 100.0
    return best_acc, [r for r in ok if lower[r.trial_id] > -margin or r is best_acc]


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> tuple[TrialRecord, str]:
    """The champion by this rule, and the sentence saying why and what it trades."""
    assert reps is not None  # (select() refused a missing one: RULE needs the replicates)
    best_acc, kept = within_margin(ok, cfg, reps)
    sign = 1.0 if cfg.mode == "min" else -1.0
    m = cfg.metric
    best = min(kept, key=lambda r: (sign * r.metrics[m], r.metrics.get("val_nll", math.inf), r.trial_id))
    level = f"{100 * reps.level:.0f} %"
    margin = f"{cfg.max_accuracy_loss:g} pt"
    head = (
        f"{best.label} ({best.family}): val {metric_name(m)} {fmt_metric(m, best.metrics[m])}{ci(reps, best, m)}, "
        f"val acc {pct(best.metrics['val_accuracy'])}{ci(reps, best, 'val_accuracy')} ({level} bootstrap intervals)"
    )
    if best is best_acc:
        trade = "Trade: none, it is also the most accurate candidate."
    else:
        gap = best_acc.metrics["val_accuracy"] - best.metrics["val_accuracy"]
        lo, hi = reps.difference_interval(best.trial_id, best_acc.trial_id, "val_accuracy")
        lower = float(np.quantile(reps.difference(best.trial_id, best_acc.trial_id, "val_accuracy"), 1 - reps.level))
        trade = (
            f"Trade: {100 * gap:.1f} pt less accurate on validation than the most accurate candidate {best_acc.label} "
            f"({best_acc.family}; difference {100 * -gap:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}], one-sided lower "
            f"bound {100 * lower:+.1f} pt, within the {margin} margin), for val {metric_name(m)} "
            f"{fmt_metric(m, best.metrics[m])} against its {fmt_metric(m, best_acc.metrics[m])}."
        )
    rule = (
        f"Rule: {'lowest' if cfg.mode == 'min' else 'highest'} val {metric_name(m)} among the {len(kept)} of "
        f"{len(ok)} candidates whose val accuracy is at most {margin} below the most accurate's (selection."
        f"max_accuracy_loss; one-sided {level} paired bootstrap lower bound of the difference above -{margin})"
    )
    return best, f"{head}\n{trade}\n{rule}.\n{family_line(ok, kept, best, cfg, reps)}"


def family_line(
    ok: list[TrialRecord], kept: list[TrialRecord], champion: TrialRecord, cfg: Any, reps: Replicates
) -> str:
    """Which family won and by how much: each other family's best candidate within the margin set, with the paired
    difference of the selection metric to the champion and its interval; the families outside the margin."""
    m, sign = cfg.metric, (1.0 if cfg.mode == "min" else -1.0)
    scale, unit = (100.0, " pt") if is_rate(m) else (1.0, "")
    inside, outside = [], []
    for fam in sorted({r.family for r in ok} - {champion.family}):
        mine = [r for r in kept if r.family == fam]
        if not mine:
            best_acc = max(r.metrics["val_accuracy"] for r in ok if r.family == fam)
            outside.append(f"{fam} (best val acc {pct(best_acc)})")
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
        parts.append(f"Others within the margin, against it: {'; '.join(inside)}")
    if outside:
        parts.append(f"Outside the margin: {', '.join(outside)}")
    return ". ".join(parts) + "."


RULE = RuleSpec(
    "margin",
    "lowest val calibration error among the candidates whose val accuracy is non-inferior to the most "
    "accurate's within selection.max_accuracy_loss points (one-sided paired bootstrap lower bound)",
    MarginSettings,
    SHARED,
    True,
    pick,
    order=0,
)

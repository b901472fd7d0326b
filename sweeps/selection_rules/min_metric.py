"""The best selection.metric, nothing else."""

from __future__ import annotations

from typing import Any

from sweeps.selection_rules.base import Replicates, TrialRecord, accuracy_gaps, ci, most_accurate
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import NoSettings, RuleSpec


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule (every candidate eligible), and the sentence saying why."""
    sign = 1.0 if cfg.mode == "min" else -1.0
    best = min(ok, key=lambda r: (sign * r.metrics[cfg.metric], r.trial_id))
    m = cfg.metric
    top = most_accurate(ok)
    gap = accuracy_gaps(ok, top)
    why = (
        f"{best.label}: {'lowest' if cfg.mode == 'min' else 'highest'} {m} = {best.metrics[m]:.4f}{ci(reps, best, m)} "
        f"among all {len(ok)} candidates"
    )
    return Choice(best, top, {r.trial_id: Standing(gap[r.trial_id], True) for r in ok}, why)


RULE = RuleSpec(
    "min_metric", "the best selection.metric, nothing else", NoSettings, ("metric", "mode"), False, pick, order=4
)

"""The best selection.metric, nothing else."""

from __future__ import annotations

from typing import Any

from sweeps.selection_rules.base import Replicates, TrialRecord, ci
from sweeps.selection_rules.spec import NoSettings, RuleSpec


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> tuple[TrialRecord, str]:
    """The champion by this rule, and the sentence saying why and what it trades."""
    sign = 1.0 if cfg.mode == "min" else -1.0
    best = min(ok, key=lambda r: (sign * r.metrics[cfg.metric], r.trial_id))
    m = cfg.metric
    return best, (
        f"{best.label}: {'lowest' if cfg.mode == 'min' else 'highest'} {m} = {best.metrics[m]:.4f}{ci(reps, best, m)}"
    )


RULE = RuleSpec(
    "min_metric", "the best selection.metric, nothing else", NoSettings, ("metric", "mode"), False, pick, order=3
)

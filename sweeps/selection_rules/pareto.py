"""The lowest ECE on the Pareto front near the best accuracy."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sweeps.selection_rules.base import (
    Replicates,
    TrialRecord,
    accuracy_gaps,
    most_accurate,
    pareto_front,
)
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import RuleSpec, Settings


class ParetoSettings(Settings):
    """The Pareto rule's own setting."""

    accuracy_tolerance: float = Field(default=0.005, ge=0.0, le=1.0, description="0.005 = 0.5 points (pareto rule)")


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule, every candidate's standing (eligible: on the front and within the tolerance of the
    best val accuracy), and the sentence saying why."""
    front = [ok[i] for i in pareto_front(ok)]
    best_acc = max(r.metrics["val_accuracy"] for r in front)
    near = [r for r in front if r.metrics["val_accuracy"] >= best_acc - cfg.accuracy_tolerance - 1e-12]
    best = min(near, key=lambda r: (r.metrics["val_ece"], -r.metrics["val_accuracy"], r.trial_id))
    top = most_accurate(ok)
    gap = accuracy_gaps(ok, top)
    standings = {r.trial_id: Standing(gap[r.trial_id], any(r is n for n in near)) for r in ok}
    why = (
        f"Pareto front of val accuracy vs val ECE has {len(front)} of {len(ok)} candidates; "
        f"{len(near)} within {cfg.accuracy_tolerance * 100:.2g} points of the best val accuracy "
        f"{best_acc:.4f}; lowest val ECE among them: {best.label} "
        f"(val acc {best.metrics['val_accuracy']:.4f}, val ECE {best.metrics['val_ece']:.4f})"
    )
    return Choice(best, top, standings, why)


RULE = RuleSpec(
    "pareto_min_ece_near_best_accuracy",
    "lowest val ECE on the Pareto front within selection.accuracy_tolerance of the best val accuracy",
    ParetoSettings,
    (),
    False,
    pick,
    order=3,
)

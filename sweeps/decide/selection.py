"""Model selection on validation metrics: the champion by the configured rule (sweeps/selection_rules/, one module
a rule), the "+ TS" candidates, and the trials that did not complete.

Presentation (leaderboard, Pareto plot, rank agreement) is in sweeps/report/files.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweeps.config import SelectionConfig
from sweeps.selection_rules import RULE_SPECS
from sweeps.selection_rules.base import (
    POST_TS,
    TrialRecord,
    check_inputs,
    method_family,
    not_worse_than,
    pareto_front,
)
from sweeps.selection_rules.choice import Choice

if TYPE_CHECKING:
    from sweeps.decide.uncertainty import Replicates

# what the rest of the service reads from here (the candidates and their helpers live beside the rules)
__all__ = [
    "POST_TS",
    "RULES",
    "Choice",
    "SelectionRule",
    "TrialRecord",
    "choose",
    "method_family",
    "not_worse_than",
    "on_top_candidates",
    "pareto_front",
    "select",
    "trial_errors",
]


def on_top_candidates(records: list[TrialRecord], prefix: str) -> list[TrialRecord]:
    """The "+ TS" candidate of every completed trial that reported temperature-scaling-on-top metrics (keys
    `prefix` + val_/test_...): same run, checkpoint and params, its own metrics."""
    out = []
    for r in records:
        metrics = {k.removeprefix(prefix): v for k, v in r.metrics.items() if k.startswith(prefix)}
        if r.status != "completed" or "val_accuracy" not in metrics or r.post:
            continue
        out.append(
            TrialRecord(
                trial_id=f"{r.trial_id}+{POST_TS}",
                label=f"{r.label} + TS",
                status=r.status,
                metrics=metrics,
                params=r.params,
                run_id=r.run_id,
                checkpoint=r.checkpoint,
                post=POST_TS,
                base_id=r.trial_id,
            )
        )
    return out


@dataclass(frozen=True)
class SelectionRule:
    """One way to pick the champion: its function, whether it needs the bootstrap replicates (read once every
    trial finished), what it does in a line (docs, --help), and the selection.* settings it reads (recorded
    with its choice in selection.json)."""

    name: str
    pick: Callable[[list[TrialRecord], SelectionConfig, Replicates | None], Choice]
    needs_replicates: bool
    summary: str
    settings: tuple[str, ...] = ()


def choose(records: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None = None) -> Choice:
    """The configured rule's decision: the champion, every completed candidate's standing (what the leaderboard
    writes) and the sentence saying why and what it trades, read from those standings."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.trial_id)
    if not ok:
        raise ValueError("no trial completed with finite validation metrics: nothing to select")
    check_inputs(ok, cfg, reps, RULE_SPECS[cfg.rule])  # the refusal every rule shares, once
    choice = RULES[cfg.rule].pick(ok, cfg, reps)
    if set(choice.standings) != {r.trial_id for r in ok}:  # the leaderboard writes one standing per candidate
        raise ValueError(f"selection.rule {cfg.rule} judged other candidates than the {len(ok)} it was given")
    return choice


def select(records: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None = None) -> tuple[TrialRecord, str]:
    """Pick the champion by the configured rule; return it and a sentence saying why and what it trades."""
    choice = choose(records, cfg, reps)
    return choice.champion, choice.sentence


# Each rule of sweeps/selection_rules/ as the service runs it.
RULES: dict[str, SelectionRule] = {
    name: SelectionRule(name, spec.pick, spec.needs_replicates, spec.summary, spec.reads)
    for name, spec in RULE_SPECS.items()
}


def trial_errors(records: list[TrialRecord]) -> list[dict[str, str]]:
    """The trials that did not complete (errored, diverged, stopped): id, label, status and reason, for people."""
    return [
        {"trial_id": r.trial_id, "label": r.label, "status": r.status, "reason": " ".join((r.reason or "").split())}
        for r in records
        if r.status not in ("completed", "stopped_early")
    ]

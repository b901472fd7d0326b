"""The smallest conformal prediction sets at the target coverage among the candidates within the accuracy margin."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from pydantic import Field

from sweeps.contract import conformal_key
from sweeps.selection_rules.base import Replicates, TrialRecord, ci, pct, points
from sweeps.selection_rules.choice import Choice
from sweeps.selection_rules.margin import judge
from sweeps.selection_rules.spec import RuleSpec, Settings


class SmallestSetsSettings(Settings):
    """Which sets the rule compares: a conformal method and a miscoverage level the sweep measured."""

    sets_method: Literal["lac", "aps", "aps_randomized", "raps"] = Field(
        default="lac",
        description="smallest_sets rule: the conformal method whose validation mean set size is compared (one of "
        "evaluation.conformal_methods)",
    )
    sets_alpha: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="smallest_sets rule: the miscoverage level (target coverage 1 - alpha; one of "
        "evaluation.conformal_alphas)",
    )


def size_key(cfg: Any) -> str:
    """The validation mean set size the rule minimises (cross-fitted on validation), e.g. val_cp_lac_a10_size."""
    return f"val_{conformal_key(cfg.sets_method, cfg.sets_alpha, 'size')}"


def pick(ok: list[TrialRecord], cfg: Any, reps: Replicates | None) -> Choice:
    """The champion by this rule (the margin rule's eligible set), every standing, and the sentence read from them."""
    assert reps is not None  # (select() refused a missing one: RULE needs the replicates)
    key = size_key(cfg)
    missing = [r.trial_id for r in ok if key not in r.metrics]
    if missing:
        raise ValueError(
            f"selection.rule smallest_sets compares {key}, missing from candidates {missing}: list "
            f"{cfg.sets_alpha:g} in evaluation.conformal_alphas and {cfg.sets_method} in evaluation.conformal_methods"
        )
    best_acc, standings = judge(ok, cfg, reps)
    choice = Choice(best_acc, best_acc, standings)
    kept = choice.eligible(ok)
    best = min(kept, key=lambda r: (r.metrics[key], r.metrics.get("val_nll", math.inf), r.trial_id))
    choice = Choice(best, best_acc, standings)
    lines = (head_line(choice, cfg, reps), trade_line(choice, cfg), rule_line(ok, choice, cfg, reps))
    return replace(choice, sentence="\n".join(lines))


def head_line(choice: Choice, cfg: Any, reps: Replicates) -> str:
    """The champion, its set size and coverage at the target, its accuracy, with intervals."""
    best, key = choice.champion, size_key(cfg)
    cov = key.removesuffix("_size") + "_coverage"
    coverage = f", val coverage {pct(best.metrics[cov])}{ci(reps, best, cov)}" if cov in best.metrics else ""
    return (
        f"{best.label} ({best.family}): val mean {cfg.sets_method} set size {best.metrics[key]:.2f}"
        f"{_interval(reps, best, key)} at target coverage {100 * (1 - cfg.sets_alpha):g} %{coverage}, val acc "
        f"{pct(best.metrics['val_accuracy'])}{ci(reps, best, 'val_accuracy')} ({100 * reps.level:.0f} % bootstrap "
        "intervals; sets cross-fitted on validation)"
    )


def _interval(reps: Replicates, r: TrialRecord, key: str) -> str:
    if not reps.has(r.trial_id, key):
        return ""
    lo, hi = reps.interval(r.trial_id, key)
    return f" [{lo:.2f}, {hi:.2f}]"


def trade_line(choice: Choice, cfg: Any) -> str:
    """What the champion gives up against the most accurate candidate, and the set sizes it trades for."""
    best, top, key = choice.champion, choice.most_accurate, size_key(cfg)
    if best is top:
        return "Trade: none, it is also the most accurate candidate."
    gap = choice.standings[best.trial_id].accuracy_gap
    if gap == 0:  # the same val accuracy: nothing is given up, the smaller sets come free
        return (
            f"Trade: none, it ties the most accurate candidate {top.label} ({top.family}) on val accuracy, with a val "
            f"mean set size of {best.metrics[key]:.2f} against its {top.metrics[key]:.2f}."
        )
    return (
        f"Trade: {points(gap, cfg.max_accuracy_loss)} pt less accurate on validation than the most accurate candidate "
        f"{top.label} ({top.family}), for a val mean set size of {best.metrics[key]:.2f} against its "
        f"{top.metrics[key]:.2f}."
    )


def rule_line(ok: list[TrialRecord], choice: Choice, cfg: Any, reps: Replicates) -> str:
    """The criterion in words, and the counts read from the standings."""
    margin = f"{cfg.max_accuracy_loss:g} pt"
    kept = choice.eligible(ok)
    return (
        f"Rule: smallest val mean {cfg.sets_method} set size at alpha {cfg.sets_alpha:g} among the {len(kept)} of "
        f"{len(ok)} candidates shown to be within {margin} of the most accurate candidate's val accuracy (one-sided "
        f"{100 * reps.level:.0f} % paired bootstrap lower bound of the difference above -{margin}; "
        "selection.max_accuracy_loss, selection.sets_method, selection.sets_alpha)."
    )


RULE = RuleSpec(
    "smallest_sets",
    "smallest validation mean conformal set size (selection.sets_method at selection.sets_alpha, cross-fitted on "
    "validation) among the candidates shown to be within selection.max_accuracy_loss points of the most accurate's "
    "val accuracy",
    SmallestSetsSettings,
    ("max_accuracy_loss", "confidence", "num_resamples"),
    True,
    pick,
    order=5,
)

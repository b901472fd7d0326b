"""The selection rules, one table: each rule's name, its sentence, the settings it reads and its own settings model.

`sweeps.config.SelectionConfig` takes its rule-specific fields from the rules' models here (their defaults, bounds
and descriptions) and accepts exactly the names of this table; `sweeps.decide.selection` pairs each entry with the
function that picks (refusing at import a rule without one, or a function without a rule); the progress line
reads `needs_replicates`; `selection.json` records the values of `reads`; `python sweeps/launch.py --help` ends with
it (`describe`; docs/extending.md points there). A new rule is one entry here and one function there.

Layer 0: imports pydantic only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

# Settings every rule may read: what it minimises or maximises and how the bootstrap judges differences.
SHARED = ("metric", "mode", "confidence", "num_resamples")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MarginSettings(_Settings):
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


class NoiseAwareSettings(_Settings):
    """The previous default's own settings."""

    # The most accurate trial is the maximum of noisy estimates; Bonferroni over the M - 1 comparisons with it keeps
    # the chance of wrongly excluding any trial below 1 - confidence (benchmarks/results/selection.md).
    multiple_comparisons: Literal["none", "bonferroni"] = "bonferroni"
    # mode min: a trial with less than this factor times the champion's metric and accuracy not significantly
    # below the champion's replaces it (None: off).
    dominance_factor: float | None = Field(default=0.5, gt=0.0, lt=1.0)


class ParetoSettings(_Settings):
    """The Pareto rule's own setting."""

    accuracy_tolerance: float = Field(default=0.005, ge=0.0, le=1.0, description="0.005 = 0.5 points (pareto rule)")


class NoSettings(_Settings):
    """A rule with no setting of its own."""


@dataclass(frozen=True)
class RuleSpec:
    """One selection rule as configs and people see it: its name, what it does in a sentence, its own settings
    (a model: defaults, bounds, descriptions), the shared settings it also reads, and whether it needs the
    bootstrap replicates (read once every trial finished)."""

    name: str
    summary: str
    settings: type[BaseModel]
    shared: tuple[str, ...]
    needs_replicates: bool

    @property
    def reads(self) -> tuple[str, ...]:
        """Every selection.* setting the rule reads: its own, then the shared ones."""
        return (*self.settings.model_fields, *self.shared)


RULE_SPECS: dict[str, RuleSpec] = {
    r.name: r
    for r in (
        RuleSpec(
            "margin",
            "lowest val calibration error among the candidates whose val accuracy is non-inferior to the most "
            "accurate's within selection.max_accuracy_loss points (one-sided paired bootstrap lower bound)",
            MarginSettings,
            SHARED,
            True,
        ),
        RuleSpec(
            "noise_aware",
            "lowest val calibration error among the trials not significantly less accurate than the most accurate "
            "(one-sided paired bootstrap, Bonferroni), then a dominance step that may leave that set",
            NoiseAwareSettings,
            SHARED,
            True,
        ),
        RuleSpec(
            "pareto_min_ece_near_best_accuracy",
            "lowest val ECE on the Pareto front within selection.accuracy_tolerance of the best val accuracy",
            ParetoSettings,
            (),
            False,
        ),
        RuleSpec("min_metric", "the best selection.metric, nothing else", NoSettings, ("metric", "mode"), False),
    )
}
DEFAULT_RULE = "margin"


def rule_setting(rule: str, name: str) -> Any:
    """The field (default, bounds, description) of `rule`'s own setting `name`, for SelectionConfig's flat form."""
    field: FieldInfo = RULE_SPECS[rule].settings.model_fields[name]
    return FieldInfo.merge_field_infos(field)


def check_rule(name: str) -> str:
    """`name` if it is a rule; a ValueError naming every rule otherwise."""
    if name not in RULE_SPECS:
        raise ValueError(f"{name!r} is not a selection rule; the rules: {', '.join(RULE_SPECS)}")
    return name


def describe() -> str:
    """The table for people: each rule, its sentence and the settings it reads."""
    lines = []
    for name, spec in RULE_SPECS.items():
        lines.append(f"{name}{' (default)' if name == DEFAULT_RULE else ''}: {spec.summary}")
        lines.append(f"  reads: {', '.join(f'selection.{s}' for s in spec.reads)}")
    return "\n".join(lines)

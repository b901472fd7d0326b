"""The selection rules, one table made from one module per rule.

Each module of this package that defines `RULE` (a `spec.RuleSpec`: name, sentence, own settings model, shared
settings it reads, whether it needs the bootstrap replicates, the function that picks, its place in the table) is a
rule; `base.py` holds what rules share (the candidates, the Pareto front, the accuracy comparisons, number
formats). `sweeps.config.SelectionConfig` takes its rule-specific fields from the rules' models here (defaults,
bounds, descriptions) and accepts exactly the names of this table; `sweeps.decide.selection.select` calls the
rule's function; the progress line reads `needs_replicates`; `selection.json` records the values of `reads`;
`python sweeps/launch.py --help` ends with `describe()`. A new rule is one new module here (and its test).

Layer 0: pydantic, numpy and the standard library.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from pydantic.fields import FieldInfo

from sweeps.selection_rules.spec import SHARED, RuleSpec

DEFAULT_RULE = "most_accurate_ts"  # selection_v4 (benchmarks/results/selection_v4.md), before it "margin"


def _discover() -> dict[str, RuleSpec]:
    """Every rule module's RULE, in table order; a name defined twice, or a setting two rules define, refused."""
    specs: list[RuleSpec] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if isinstance(getattr(module, "RULE", None), RuleSpec):
            specs.append(module.RULE)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ImportError(f"selection rules defined twice: {sorted(n for n in names if names.count(n) > 1)}")
    owners: dict[str, str] = {}
    for s in specs:
        for field in s.settings.model_fields:
            if field in owners or field in ("rule", *SHARED):
                raise ImportError(f"selection.{field} is defined by rule {s.name} and by {owners.get(field, 'all')}")
            owners[field] = s.name
    return {s.name: s for s in sorted(specs, key=lambda s: (s.order, s.name))}


RULE_SPECS: dict[str, RuleSpec] = _discover()
if DEFAULT_RULE not in RULE_SPECS:
    raise ImportError(f"the default selection rule {DEFAULT_RULE!r} is not among {sorted(RULE_SPECS)}")


def rule_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """Every rule's own settings as fields of SelectionConfig's flat form: name -> (annotation, field)."""
    return {
        name: (field.annotation, FieldInfo.merge_field_infos(field))
        for spec in RULE_SPECS.values()
        for name, field in spec.settings.model_fields.items()
    }


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
        lines.append(f"  reads: {', '.join(f'selection.{s}' for s in spec.reads) or 'no selection.* setting'}")
    return "\n".join(lines)


__all__ = ["DEFAULT_RULE", "RULE_SPECS", "SHARED", "RuleSpec", "check_rule", "describe", "rule_fields"]

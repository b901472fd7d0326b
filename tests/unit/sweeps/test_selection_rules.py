"""The selection rules come from one table made from one module a rule (sweeps/selection_rules/, issue #33 item 3):
the config accepts exactly its names and takes each rule's own settings from the rule's model, the picking
functions pair with it one to one, people read it from the table itself (`python sweeps/launch.py --help` ends
with it), and a new rule is one new module."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sweeps.cli import build_parser
from sweeps.config import SelectionConfig, load_sweep_config
from sweeps.decide.selection import RULES
from sweeps.selection_rules import DEFAULT_RULE, RULE_SPECS, SHARED
from tests.paths import ROOT

DOC = ROOT / "docs" / "extending.md"


def test_the_config_accepts_exactly_the_tables_rules_and_names_them_when_refusing() -> None:
    assert SelectionConfig().rule == DEFAULT_RULE == "most_accurate_ts"
    for name in RULE_SPECS:
        assert SelectionConfig(rule=name).rule == name
    with pytest.raises(ValidationError) as err:
        SelectionConfig(rule="lowest_ece")
    message = str(err.value)
    assert "'lowest_ece' is not a selection rule" in message and all(n in message for n in RULE_SPECS)


def test_each_rules_own_settings_are_the_configs_fields_with_the_same_default_and_bounds() -> None:
    fields = SelectionConfig.model_fields
    own = {name: rule for rule, spec in RULE_SPECS.items() for name in spec.settings.model_fields}
    # every field of the config is the rule, a shared setting, or one rule's own (no setting without a rule)
    assert set(fields) == {"rule", *SHARED, *own}
    for name, rule in own.items():
        model_field = RULE_SPECS[rule].settings.model_fields[name]
        assert fields[name].default == model_field.default, name
        assert fields[name].metadata == model_field.metadata, name  # bounds
        assert fields[name].description == model_field.description, name
    # the bounds of the rule's model hold in the config: a margin below 0, a dominance factor of 1
    for bad in ({"max_accuracy_loss": -1}, {"dominance_factor": 1.0}, {"accuracy_tolerance": 2}):
        with pytest.raises(ValidationError):
            SelectionConfig(**bad)


def test_a_rules_own_setting_is_set_from_a_sweep_config_as_before(tmp_path) -> None:
    cfg = load_sweep_config(None, ["selection.rule=noise_aware", "selection.dominance_factor=null"])
    assert cfg.selection.rule == "noise_aware" and cfg.selection.dominance_factor is None
    assert cfg.selection.rule_settings()["dominance_factor"] is None


def test_the_picking_functions_are_the_tables_rules() -> None:
    assert list(RULES) == list(RULE_SPECS)
    for name, spec in RULE_SPECS.items():
        rule = RULES[name]
        assert (rule.summary, rule.needs_replicates, rule.settings) == (spec.summary, spec.needs_replicates, spec.reads)


def test_people_read_the_rules_from_the_table_itself() -> None:
    """--help ends with the table (docs/extending.md points there): no copy to drift."""
    assert "python sweeps/launch.py --help" in DOC.read_text()
    text = build_parser().format_help()
    lines = text[text.index("selection rules (--set selection.rule=NAME):") :].splitlines()[1:]
    assert len(lines) == 2 * len(RULE_SPECS)
    for (head, reads), (name, spec) in zip(zip(lines[::2], lines[1::2], strict=True), RULE_SPECS.items(), strict=True):
        assert head == f"{name}{' (default)' if name == DEFAULT_RULE else ''}: {spec.summary}"
        assert reads == "  reads: " + (", ".join(f"selection.{s}" for s in spec.reads) or "no selection.* setting")


NEW_RULE = """
\"\"\"A rule planted by the test: the lowest val NLL among candidates of val accuracy >= min_accuracy.\"\"\"

from pydantic import Field

from sweeps.selection_rules.base import accuracy_gaps, most_accurate
from sweeps.selection_rules.choice import Choice, Standing
from sweeps.selection_rules.spec import RuleSpec, Settings


class LowestNllSettings(Settings):
    min_accuracy: float = Field(default=0.5, ge=0.0, le=1.0, description="lowest_nll rule: the val accuracy floor")


def pick(ok, cfg, reps):
    pool = [r for r in ok if r.metrics["val_accuracy"] >= cfg.min_accuracy] or ok
    best = min(pool, key=lambda r: (r.metrics["val_nll"], r.trial_id))
    top = most_accurate(ok)
    gap = accuracy_gaps(ok, top)
    standings = {r.trial_id: Standing(gap[r.trial_id], r in pool) for r in ok}
    return Choice(best, top, standings, f"{best.label}: lowest val NLL of {len(pool)}")


RULE = RuleSpec(
    "lowest_nll", "the lowest val NLL above selection.min_accuracy", LowestNllSettings, ("metric",), False, pick, 9
)
"""

CHECK_NEW_RULE = r"""
import json
from pydantic import ValidationError
from sweeps.cli import build_parser
from sweeps.config import SelectionConfig, load_sweep_config
from sweeps.decide.selection import RULES, TrialRecord, select

cfg = load_sweep_config(None, ["selection.rule=lowest_nll", "selection.min_accuracy=0.8"])
records = [
    TrialRecord("a", "A", "completed", {"val_accuracy": 0.90, "val_ece": 0.05, "val_nll": 0.40}),
    TrialRecord("b", "B", "completed", {"val_accuracy": 0.85, "val_ece": 0.02, "val_nll": 0.30}),
    TrialRecord("c", "C", "completed", {"val_accuracy": 0.70, "val_ece": 0.01, "val_nll": 0.10}),
]
champion, why = select(records, cfg.selection)
try:
    SelectionConfig(min_accuracy=2)
    refused = False
except ValidationError:
    refused = True
print(json.dumps({
    "champion": champion.trial_id, "why": why, "refused": refused,
    "reads": cfg.selection.rule_settings(),
    "help": "lowest_nll: the lowest val NLL above selection.min_accuracy" in build_parser().format_help(),
}))
"""


def test_a_new_rule_is_one_new_module(tmp_path) -> None:
    """A copy of sweeps/ with one module added to selection_rules/ and nothing else changed: the config takes the
    rule and its own setting (with its bounds), select() picks by it, --help lists it."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "sweeps", tmp_path / "sweeps", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "sweeps" / "selection_rules" / "lowest_nll.py").write_text(NEW_RULE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_NEW_RULE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # by hand: A and B clear the 0.8 floor, B has the lower NLL (C's lower NLL is below the floor)
    assert out["champion"] == "b" and out["why"] == "B: lowest val NLL of 2"
    assert out["refused"] and out["help"]
    assert out["reads"] == {"min_accuracy": 0.8, "metric": "val_ece"}

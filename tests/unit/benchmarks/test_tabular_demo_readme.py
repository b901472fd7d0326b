"""The README's tabular demo numbers come from benchmarks/results/tabular_demo.json (issue #34, "its numbers in the
README generated from a result file"): the block is regenerated from the file and compared, a changed number changes
it, and the file says where it came from."""

from __future__ import annotations

import copy
import json
import re

from benchmarks import readme_results
from benchmarks.common import RESULTS_DIR, ROOT


def _record() -> dict:
    return json.loads((RESULTS_DIR / "tabular_demo.json").read_text())


def test_the_readme_block_is_the_result_file_rendered():
    text = (ROOT / readme_results.HOLDERS["tabular_demo"]).read_text()
    block = re.search(r"<!-- generated:tabular_demo -->\n(.*?)\n<!-- /generated:tabular_demo -->", text, re.S)
    assert block is not None
    assert block.group(1) == readme_results.tabular_demo(), "run: python -m benchmarks.readme_results"


def test_the_result_file_records_its_run_and_the_sweeps_own_choice():
    rec = _record()
    assert rec["command"] in ("python benchmarks/tabular_demo.py", "python -m benchmarks.tabular_demo")
    assert rec["demo_command"] == "python sweeps/launch.py --config sweeps/configs/tabular_demo.yaml"
    assert rec["provenance"]["git_commit"] and rec["provenance"]["torch"]
    # the champion is the one the sweep selected on validation and printed, not one picked here
    assert rec["selection"].startswith(f"Selection: {rec['champion']['label']} ")
    assert rec["registered"].startswith("Registered: models:/calibrated-breast_cancer@champion")
    assert rec["champion"] in rec["candidates"]
    assert sum(rec["splits"].values()) == 569  # the whole bundled table, split three ways


def test_a_changed_number_changes_the_block(tmp_path):
    rec = _record()
    (tmp_path / "tabular_demo.json").write_text(json.dumps(rec))
    a = readme_results.tabular_demo(tmp_path)
    changed = copy.deepcopy(rec)
    changed["champion"]["test_ece"]["value"] += 0.001
    (tmp_path / "tabular_demo.json").write_text(json.dumps(changed))
    assert readme_results.tabular_demo(tmp_path) != a


def test_the_temperature_scaling_sentence_follows_the_candidates(tmp_path):
    rec = _record()
    champ = {**rec["champion"], "trial_id": "t1+ts", "label": "T + TS", "family": "one-go + TS"}
    base = {**rec["champion"], "trial_id": "t1", "label": "T", "family": "one-go"}
    base["val_ece"] = {"value": 0.05, "lo": 0.01, "hi": 0.09}
    base["test_ece"] = {"value": 0.04, "lo": 0.0, "hi": 0.08}
    champ["val_ece"] = {"value": 0.02, "lo": 0.0, "hi": 0.05}
    champ["test_ece"] = {"value": 0.03, "lo": 0.0, "hi": 0.06}
    (tmp_path / "tabular_demo.json").write_text(json.dumps({**rec, "champion": champ, "candidates": [champ, base]}))
    text = readme_results.tabular_demo(tmp_path)
    assert "on top of that trial (T;" in text
    assert "validation ECE from 5.0 % to 2.0 % and its test ECE from 4.0 % to 3.0 %" in text
    # a champion without its "+ TS" twin (temperature scaling on top turned off): no such sentence
    (tmp_path / "tabular_demo.json").write_text(json.dumps({**rec, "champion": base, "candidates": [base]}))
    assert "Temperature scaling on top" not in readme_results.tabular_demo(tmp_path)


def test_no_result_file_says_so(tmp_path):
    assert "No tabular demo run recorded yet" in readme_results.tabular_demo(tmp_path)

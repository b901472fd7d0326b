"""benchmarks/compare_runs.py: the before/after check of a refactor counts every differing value
and ignores only timings."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.compare_runs import differences, main


def _raw(path: Path, ece: float, wall: float, extra: dict | None = None) -> Path:
    run = {"key": "ce", "seed": 0, "dataset": "mnist1d", "wall_s": wall, "test": {"ece": ece, "accuracy": 0.5}}
    run.update(extra or {})
    path.write_text(json.dumps({"runs": [run, {**run, "seed": 1}]}))
    return path


def test_timings_do_not_count_and_metrics_do(tmp_path, capsys):
    a = _raw(tmp_path / "a.json", 0.1, 1.0)
    assert differences(a, _raw(tmp_path / "b.json", 0.1, 9.0)) == []
    assert main([str(a), str(tmp_path / "b.json")]) == 0
    c = _raw(tmp_path / "c.json", 0.1 + 1e-12, 1.0)
    diff = differences(a, c)
    assert len(diff) == 2 and all("test.ece" in d for d in diff)  # both seeds, however small the change
    assert main([str(a), str(c)]) == 1
    assert "2 differences" in capsys.readouterr().out


def test_a_value_on_one_side_only_is_a_difference(tmp_path):
    a = _raw(tmp_path / "a.json", 0.1, 1.0)
    b = _raw(tmp_path / "b.json", 0.1, 1.0, {"posthoc_stage_fits": 3})
    assert len(differences(a, b)) == 2

"""benchmarks/perf/bench_sampler.py's measures on small synthetic tables with known answers, and its quick run."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.perf.bench_sampler import (
    BOUNDED,
    TPE,
    _first_difference,
    budgets_for,
    main,
    search_metrics,
    summarise_quality,
    summarise_times,
    verdict,
)
from benchmarks.studies.bench_search import Table, cell_key, grid_cells, lr_grid

CALS = ["temperature", "none"]


def _table() -> Table:
    """temperature@1e-3 is the best cell (ECE 0.01, accuracy 0.95); every other cell ECE 0.10, accuracy 0.90."""
    lrs = lr_grid(1e-4, 1e-2, 3)
    cells = {}
    for c, lr in grid_cells(CALS, lrs):
        k = cell_key(c, lr)
        cells[k] = {"calibrator": c, "lr": lr, "status": "completed", "val_accuracy": 0.90, "val_ece": 0.10}
    cells[cell_key("temperature", 1e-3)].update(val_accuracy=0.95, val_ece=0.01)
    return Table(CALS, lrs, cells)


def test_budgets_and_first_difference():
    assert budgets_for(128) == [32, 64, 128] and budgets_for(2) == [1, 2]
    assert _first_difference(["a", "b", "c"], ["a", "b", "d"]) == 2
    assert _first_difference(["a", "b"], ["a", "b"]) is None


def test_search_metrics_single_and_multi():
    t = _table()
    best, other = cell_key("temperature", 1e-3), "none"
    visited = [other, other, best, other, best]
    hits = {best}
    single = search_metrics(t, visited, "single", hits, [2, 5], engaged=3)
    assert single["best@2"] == pytest.approx(10.0) and single["best@5"] == pytest.approx(1.0)
    assert single["trials_to_hit"] == 3 and single["late_hit_share"] == pytest.approx(0.5)  # visited[3:]
    multi = search_metrics(t, visited, "multi", hits, [2, 5], engaged=5)
    assert multi["best@2"] == pytest.approx(0.0) and multi["best@5"] == pytest.approx(1.0)  # the best cell dominates
    assert math.isnan(multi["late_hit_share"])  # the bound never engaged


def test_paired_summary_counts_a_miss_as_the_cap():
    rows = {
        TPE: [
            {"best@4": 1.0, "trials_to_hit": 2, "late_hit_share": 0.5},
            {"best@4": 1.2, "trials_to_hit": None, "late_hit_share": 0.0},
        ],
        BOUNDED: [
            {"best@4": 1.0, "trials_to_hit": 3, "late_hit_share": 0.5},
            {"best@4": 1.0, "trials_to_hit": 4, "late_hit_share": 0.5},
        ],
    }
    s = summarise_quality(rows, [TPE, BOUNDED], [4], cap=8)
    assert s["trials_to_hit"][TPE][0] == pytest.approx(5.0)  # (2 + 8) / 2
    assert s["trials_to_hit"]["difference"][0] == pytest.approx((1 - 4) / 2)
    assert s["best@4"]["difference"][0] == pytest.approx(-0.1)


def test_times_summary_and_verdict_words():
    s = summarise_times([10.0] * 9 + [100.0])
    assert s["median"] == 10.0 and s["p90"] == pytest.approx(19.0) and s["asks"] == 10
    fast, slow = summarise_times([20.0] * 5), summarise_times([200.0] * 5)
    data = {
        "bounded_label": BOUNDED,
        "timing": {
            "memory": {
                "multi": {
                    "10000": {"summary": {TPE: {"wall": slow, "cpu": slow}, BOUNDED: {"wall": fast, "cpu": fast}}}
                }
            }
        },
        "quality": [
            {
                "dataset": "d",
                "objective": "single",
                "window": 4,
                "first_difference": [None, 7],
                "summary": {"best@8": {"difference": [0.05, 0.01, 0.09]}},
            }
        ],
    }
    text = "\n".join(verdict(data))
    assert "10.0x faster; it meets the aim" in text
    assert "worse (the paired interval excludes 0) in: d single W=4 best@8" in text and "d single W=4: 8" in text


def test_quick_run_writes_its_report(tmp_path):
    assert main(["--quick", "--ns", "30,60", "--quality", "4,1,12,2,mnist1d", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_sampler.json").read_text())
    assert set(data["timing"]["memory"]) == {"multi", "single"} and "sqlite" not in data["timing"]
    for run in data["quality"]:  # identical searches until the bound can act
        assert all(d is None or d >= run["engaged_at_trial"] - 1 for d in run["first_difference"])
    assert "## Verdict" in (tmp_path / "bench_sampler.md").read_text()

"""The sweep report's pieces (sweeps/report/html.py) on fabricated trials: the parallel coordinates put each trial
where its values say (a log axis for the learning rate), the champion on top in red, and text is escaped."""

from __future__ import annotations

import re

import pandas as pd

from sweeps.decide.selection import TrialRecord
from sweeps.report.html import ReportLinks, parallel_coordinates, render_report


def _rec(tid: str, cal: str, lr: float, acc: float, ece: float, status: str = "completed") -> TrialRecord:
    return TrialRecord(
        trial_id=tid,
        label=f"{cal} lr={lr:.0e}",
        status=status,
        metrics={"val_accuracy": acc, "val_ece": ece},
        params={"calibrator": cal, "calibrator_lr": lr},
        run_id=f"run{tid}",
    )


RECORDS = [
    _rec("a", "temperature", 1e-4, 0.80, 0.05),
    _rec("b", "vector", 1e-3, 0.85, 0.10),
    _rec("c", "temperature", 1e-2, 0.90, 0.02),
    _rec("d", "vector", 1e-2, float("nan"), float("nan"), status="errored"),
]


def _points(svg: str) -> dict[str, list[tuple[float, float]]]:
    out = {}
    for m in re.finditer(r'<polyline class="([^"]+)" data-trial="([^"]+)"[^>]* points="([^"]+)"', svg):
        out[m.group(2)] = [tuple(float(v) for v in p.split(",")) for p in m.group(3).split()]
    return out


def test_each_trial_is_drawn_where_its_values_are():
    svg = parallel_coordinates(RECORDS, RECORDS[2], [])
    pts = _points(svg)
    assert set(pts) == {"a", "b", "c"}  # the errored trial has no line
    y = {t: [p[1] for p in v] for t, v in pts.items()}
    # log10 lr: 1e-3 lies halfway between 1e-4 (bottom) and 1e-2 (top)
    assert abs(y["b"][1] - (y["a"][1] + y["c"][1]) / 2) < 0.05
    assert y["c"][1] < y["a"][1]  # larger values higher up (smaller y)
    # accuracy axis: 0.85 halfway between 0.80 and 0.90
    assert abs(y["b"][2] - (y["a"][2] + y["c"][2]) / 2) < 0.05
    # categorical axis: both temperature trials on the same height
    assert y["a"][0] == y["c"][0] != y["b"][0]
    assert "log10 calibrator_lr" in svg and ">val ECE<" in svg


def test_the_champion_is_red_and_drawn_last():
    svg = parallel_coordinates(RECORDS, RECORDS[0], [])
    order = re.findall(r'data-trial="([^"]+)"', svg)
    assert order[-1] == "a"
    champ = re.search(r'<polyline class="trial champion" data-trial="a"[^>]*>', svg).group(0)
    assert 'stroke="#d62728"' in champ


def test_text_is_escaped_and_nothing_is_fetched(tmp_path):
    evil = _rec("e", "<script>alert(1)</script>", 1e-3, 0.7, 0.1)
    board = pd.DataFrame(
        [
            {"label": evil.label, "status": "completed", "val_accuracy": 0.7, "val_ece": 0.1, "run_id": "r1"},
        ]
    )
    text = render_report(
        title="Sweep <x>",
        summary="s & t",
        records=[evil],
        champion=evil,
        most_accurate=evil,
        why="line one\nline two <b>",
        gate="",
        level=0.95,
        board=board,
        pareto_png=tmp_path / "missing.png",
        diagrams={},
        importances=None,
        importance_note="",
        params=[],
        links=ReportLinks(mlflow_root="http://127.0.0.1:5000/", experiment_id="3"),
    )
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "Sweep &lt;x&gt;" in text and "line two &lt;b&gt;" in text
    assert 'href="http://127.0.0.1:5000/#/experiments/3/runs/r1"' in text
    assert 'href="http://127.0.0.1:5000/#/experiments/3?workflowType=machine_learning"' in text


def test_the_reports_first_line_counts_trials_not_their_candidates():
    """A sweep of 4 trials, one failed, each completed one with its "+ TS" candidate: 4 trials, 3 completed, and the 7
    candidates said as such (the report said "7 trials (6 completed)", counting the + TS candidates as trials)."""
    from sweeps.config import SweepConfig
    from sweeps.decide.selection import POST_TS
    from sweeps.finish import report_summary

    metrics = {"val_accuracy": 0.9, "val_ece": 0.05}
    records = []
    for i in range(4):
        status = "failed" if i == 3 else "completed"
        records.append(TrialRecord(f"t{i}", f"trial {i}", status, metrics if i < 3 else {}))
        if i < 3:
            records.append(TrialRecord(f"t{i}+ts", f"trial {i} + TS", status, metrics, post=POST_TS, base_id=f"t{i}"))
    line = report_summary(records, SweepConfig())
    assert line.startswith("4 trials (3 completed; 7 candidates with those on top) of "), line
    assert report_summary([r for r in records if not r.post], SweepConfig()).startswith("4 trials (3 completed) of ")

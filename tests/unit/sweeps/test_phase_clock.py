"""The sweep's one clock (sweeps/report/timing.py) and its one SweepResult factory (sweeps/finish.build_result)."""

from __future__ import annotations

import pytest

from sweeps.config import SweepConfig
from sweeps.report import timing


def test_phase_clock_times_each_phase_from_the_end_of_the_one_before(monkeypatch):
    now = iter([100.0, 103.5, 160.0, 161.0, 161.25, 162.0, 162.5, 170.0])  # start, then each phase's end
    rss = iter([500.0, 900.0, 950.0, 1000.0, 1100.0, 1200.0, 1400.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(now))
    monkeypatch.setattr(timing, "peak_rss_mb", lambda: next(rss))
    clock = timing.PhaseClock()
    for phase, _, _ in timing.PhaseClock.PHASES:
        clock.end(phase)
    t = clock.timings()
    # hand-computed from the times above
    assert t["ray_start_s"] == 3.5 and t["trials_s"] == 56.5 and t["closing_s"] == 1.0
    # registration before the report files: the champion is registered first
    assert t["bootstrap_s"] == 0.25 and t["select_s"] == 0.75 and t["registration_s"] == 0.5 and t["report_s"] == 7.5
    assert t["selection_registration_s"] == 10.0  # closing included, as the line says
    assert t["champion_s"] == 2.5  # closing, bootstrap, rule, registration
    assert t["peak_rss_mb_trials"] == 900.0 and t["peak_rss_mb_end"] == 1400.0
    assert clock.line() == (
        "Timing: start (Ray, stores, tuner) 3.5s, trials 56.5s, selection and registration 10.0s "
        "(closing the trials 1.0s, bootstrap 0.2s, rule 0.8s, registration 0.5s, report files 7.5s); "
        "the champion 2.5s after the last trial; driver peak RSS 1.40 GB (0.90 GB before selection)"
    )


def test_the_benchmarks_read_the_timing_line(monkeypatch):
    """bench_scale, bench_sweep and bench_reference_arms parse the line as the clock writes it."""
    from benchmarks.perf import bench_reference_arms, bench_scale, bench_sweep

    now = iter([100.0, 103.5, 160.0, 161.0, 161.25, 162.0, 162.5, 170.0])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(now))
    monkeypatch.setattr(timing, "peak_rss_mb", lambda: 1000.0)
    clock = timing.PhaseClock()
    for phase, _, _ in timing.PhaseClock.PHASES:
        clock.end(phase)
    line = clock.line()
    phases = dict(zip(bench_scale.PHASES, (float(g) for g in bench_scale.TIMING.search(line).groups())))
    assert phases == {
        "ray_start": 3.5,
        "trials": 56.5,
        "finish": 10.0,
        "closing": 1.0,
        "bootstrap": 0.2,
        "rule": 0.8,
        "registration": 0.5,
        "report": 7.5,
    }
    assert [float(g) for g in bench_sweep.TIMING.search(line).groups()] == [3.5, 56.5, 10.0]
    assert bench_reference_arms.TIMING.search(line).group("bootstrap") == "0.2"
    # lines recorded before the first phase was renamed ("Ray start") still read
    old = line.replace("Timing: start (Ray, stores, tuner) ", "Timing: Ray start ")
    assert old != line and [float(g) for g in bench_sweep.TIMING.search(old).groups()] == [3.5, 56.5, 10.0]


def test_phase_clock_refuses_an_unknown_phase():
    clock = timing.PhaseClock()
    with pytest.raises(ValueError, match="unknown phase 'trail'.*trials"):
        clock.end("trail")


def test_build_result_derives_what_follows_from_the_config():
    from sweeps.finish import build_result

    cfg = SweepConfig.model_validate(
        {"name": "s1", "tracking": {"uri": "sqlite:///x.db", "registered_model": "m"}, "search": {"storage": "memory"}}
    )
    res = build_result(
        cfg,
        champion=("run9", "t3", "temperature"),
        version="4",
        board=None,
        why="because",
        intervals={},
        confidence=0.95,
        parent_id="p",
        experiment_id="1",
        best_config={},
        errors=[],
    )
    assert (res.model_uri, res.champion_uri) == ("models:/m/4", "models:/m@champion")
    assert (res.champion_run_id, res.champion_trial_id, res.champion_label) == ("run9", "t3", "temperature")
    assert res.tracking_uri == "sqlite:///x.db" and res.study is None and res.alias == "champion"

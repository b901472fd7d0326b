"""The margin rule (selection.rule: margin): the champion is never outside the non-inferiority set, and its
sentence states the margin, the trade and the winning family (issue #35 item 2)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sweeps.config import SelectionConfig
from sweeps.decide.selection import POST_TS, RULES, TrialRecord, on_top_candidates, select
from sweeps.decide.uncertainty import Replicates


def _leaderboard(acc: list[float], ece: list[float], noise: list[float], seed: int) -> tuple[list, Replicates]:
    """Candidates with given validation accuracy and ECE, and bootstrap replicates scattered around them
    (accuracy replicates share a common component, as paired resamples of one split do)."""
    rng = np.random.default_rng(seed)
    n = 400
    common = rng.normal(0.0, 0.01, n)
    reps = Replicates(level=0.95, num_resamples=n)
    records = []
    for i, (a, e, s) in enumerate(zip(acc, ece, noise)):
        tid = f"t{i:02d}"
        reps.values[tid] = {
            "val_accuracy": a + common + rng.normal(0.0, s, n),
            "val_ece": e + rng.normal(0.0, 0.005, n),
        }
        reps.points[tid] = {"val_accuracy": a, "val_ece": e}
        calibrator = "ce_es" if i % 3 == 0 else "temperature"
        records.append(
            TrialRecord(
                tid,
                f"trial {i}",
                "completed",
                {"val_accuracy": a, "val_ece": e, "val_nll": 1.0},
                params={"calibrator": calibrator},
            )
        )
    return records, reps


def _lower_bound(reps: Replicates, a: str, b: str, level: float) -> float:
    """By hand: the one-sided lower bound of acc(a) - acc(b), from the centred paired replicates."""
    d = reps.values[a]["val_accuracy"] - reps.values[b]["val_accuracy"]
    d = d - d.mean() + (reps.points[a]["val_accuracy"] - reps.points[b]["val_accuracy"])
    return float(np.sort(d)[int(np.floor((1 - level) * (len(d) - 1)))])


@settings(max_examples=60, deadline=None)
@given(
    acc=st.lists(st.floats(0.6, 0.95), min_size=2, max_size=9),
    margin=st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]),
    seed=st.integers(0, 10_000),
    data=st.data(),
)
def test_the_champion_never_lies_outside_the_margin(acc: list[float], margin: float, seed: int, data) -> None:
    m = len(acc)
    ece = data.draw(st.lists(st.floats(0.001, 0.2), min_size=m, max_size=m))
    noise = data.draw(st.lists(st.floats(0.0, 0.02), min_size=m, max_size=m))
    records, reps = _leaderboard(acc, ece, noise, seed)
    cfg = SelectionConfig(rule="margin", max_accuracy_loss=margin)
    chosen, why = select(records, cfg, reps)
    best = max(records, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))
    if chosen is not best:
        # quantile interpolation differs from the order statistic by at most one resample's step
        assert _lower_bound(reps, chosen.trial_id, best.trial_id, 0.95) > -margin / 100 - 0.01
        assert chosen.metrics["val_accuracy"] >= best.metrics["val_accuracy"] - margin / 100 - 1e-12
    # nothing with a lower ECE was admissible by a clear distance
    for r in records:
        if r.metrics["val_ece"] < chosen.metrics["val_ece"] and r is not best:
            assert _lower_bound(reps, r.trial_id, best.trial_id, 0.95) <= -margin / 100 + 0.01
    assert f"{margin:g} pt" in why
    assert "Won by family" in why


def test_a_much_less_accurate_but_better_calibrated_trial_is_not_picked() -> None:
    records, reps = _leaderboard([0.90, 0.85, 0.899], [0.05, 0.001, 0.03], [0.001, 0.001, 0.001], 0)
    chosen, why = select(records, SelectionConfig(rule="margin", max_accuracy_loss=1.0), reps)
    assert chosen.trial_id == "t02"  # 0.1 pt below the best, lower ECE; t01 is 5 pt below
    assert "Trade: 0.1 pt less accurate" in why
    chosen, _ = select(records, SelectionConfig(rule="margin", max_accuracy_loss=10.0), reps)
    assert chosen.trial_id == "t01"  # a wide margin admits it


def test_each_rule_declares_the_settings_it_reads() -> None:
    """A rule's settings are selection.* fields, and changing one it declares can change its pick: the margin rule
    reads max_accuracy_loss (recorded in selection.json), the Pareto rule accuracy_tolerance and not the margin."""
    for rule in RULES.values():
        assert set(rule.settings) <= set(SelectionConfig.model_fields), rule.name
    assert RULES["most_accurate_ts"].settings == ()  # reads no setting: val accuracy, then val NLL, then the id
    cfg = SelectionConfig(rule="margin", max_accuracy_loss=1.5)
    assert cfg.rule_settings()["max_accuracy_loss"] == 1.5
    assert "max_accuracy_loss" not in RULES["pareto_min_ece_near_best_accuracy"].settings
    records, reps = _leaderboard([0.90, 0.85, 0.899], [0.05, 0.001, 0.03], [0.001, 0.001, 0.001], 0)
    picks = {select(records, SelectionConfig(rule="margin", max_accuracy_loss=x), reps)[0].trial_id for x in (1, 10)}
    assert picks == {"t01", "t02"}


def test_temperature_on_top_candidates_share_the_trial_and_have_their_own_metrics() -> None:
    trained = TrialRecord(
        "a",
        "temperature lr=1e-3",
        "completed",
        {"val_accuracy": 0.9, "val_ece": 0.05, "ts_val_accuracy": 0.9, "ts_val_ece": 0.01, "ts_test_ece": 0.02},
        params={"calibrator": "temperature"},
        run_id="r1",
    )
    failed = TrialRecord("b", "x", "diverged", {"ts_val_accuracy": 0.5}, params={"calibrator": "none"})
    (ts,) = on_top_candidates([trained, failed], "ts_")
    assert ts.trial_id == "a+ts" and ts.trial == "a" and ts.post == POST_TS and ts.run_id == "r1"
    assert ts.metrics == {"val_accuracy": 0.9, "val_ece": 0.01, "test_ece": 0.02}
    assert ts.family == "one-go + TS" and trained.family == "one-go"
    assert TrialRecord("c", "", "completed", {}, params={"calibrator": "ce_es"}).family == "CE with early stopping"


def test_reference_points_alone_run_once_each_and_more_trials_are_refused() -> None:
    import pytest
    from pydantic import ValidationError

    from sweeps.config import SearchConfig

    s = SearchConfig(calibrators=["none", "posthoc_temperature", "temperature"], num_samples=6)
    assert s.reference_arms() == ["ce_es", "none", "posthoc_temperature"]  # each once, never drawn again
    assert s.sampled_calibrators() == ["temperature"]
    with pytest.raises(ValidationError, match="num_samples 8 exceeds the 2 reference arm"):
        SearchConfig(calibrators=["none"], num_samples=8)
    assert SearchConfig(calibrators=["none"], num_samples=2).reference_arms() == ["ce_es", "none"]
    # with another value searched, a reference point is a draw like any other (its runs differ)
    from sweeps.config import ExtraParam

    s = SearchConfig(
        calibrators=["none"], num_samples=8, params={"train.lr": ExtraParam(type="loguniform", low=1e-4, high=1e-2)}
    )
    assert s.sampled_calibrators() == ["none"] and s.reference_arms() == ["ce_es"]

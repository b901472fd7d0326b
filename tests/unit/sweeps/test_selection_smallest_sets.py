"""The smallest_sets rule: the smallest validation mean set size within the accuracy margin, never outside it, with
its sentence read from its own Choice."""

from __future__ import annotations

import numpy as np
import pytest

from sweeps.config import SelectionConfig
from sweeps.decide.selection import TrialRecord, choose
from sweeps.decide.uncertainty import Replicates

SIZE, COV = "val_cp_lac_a10_size", "val_cp_lac_a10_coverage"


def _candidates(acc: list[float], size: list[float]) -> tuple[list[TrialRecord], Replicates]:
    rng = np.random.default_rng(0)
    n = 400
    common = rng.normal(0.0, 0.01, n)
    reps = Replicates(level=0.95, num_resamples=n)
    records = []
    for i, (a, s) in enumerate(zip(acc, size)):
        tid = f"t{i}"
        reps.values[tid] = {"val_accuracy": a + common + rng.normal(0, 0.002, n), SIZE: s + rng.normal(0, 0.05, n)}
        reps.points[tid] = {"val_accuracy": a, SIZE: s}
        metrics = {"val_accuracy": a, "val_ece": 0.05, "val_nll": 0.5, SIZE: s, COV: 0.9}
        records.append(TrialRecord(tid, f"trial {i}", "completed", metrics, params={"calibrator": "temperature"}))
    return records, reps


def test_smallest_sets_within_the_margin_and_its_sentence() -> None:
    # t0 most accurate; t1 within 2 pt with smaller sets; t2 has the smallest sets but is 10 pt less accurate
    records, reps = _candidates([0.90, 0.895, 0.80], [2.4, 1.9, 1.2])
    cfg = SelectionConfig(rule="smallest_sets")
    choice = choose(records, cfg, reps)
    assert choice.champion.trial_id == "t1"  # not t2: outside the margin, whatever its sets
    assert [r.trial_id for r in choice.eligible(records)] == ["t0", "t1"]
    head, trade, rule = choice.sentence.splitlines()
    assert head.startswith("trial 1 (one-go): val mean lac set size 1.90 [") and "target coverage 90 %" in head
    assert "0.5 pt less accurate" in trade and "1.90 against its 2.40" in trade
    kept = sum(s.eligible for s in choice.standings.values())
    assert f"among the {kept} of {len(records)} candidates" in rule and "within 2 pt" in rule


def test_margin_zero_keeps_the_most_accurate_and_a_missing_size_is_named() -> None:
    records, reps = _candidates([0.90, 0.85], [2.4, 1.0])
    assert choose(records, SelectionConfig(rule="smallest_sets", max_accuracy_loss=0.0), reps).champion.trial_id == "t0"
    with pytest.raises(ValueError, match="val_cp_aps_a20_size, missing from candidates"):
        choose(records, SelectionConfig(rule="smallest_sets", sets_method="aps", sets_alpha=0.2), reps)


def test_a_tie_on_accuracy_is_no_trade() -> None:
    # t1 ties the most accurate t0 on val accuracy with smaller sets: nothing is given up, and the line must not say
    # "0.0 pt less accurate" (issue #48's e2e run printed that)
    records, reps = _candidates([0.90, 0.90], [2.4, 1.9])
    choice = choose(records, SelectionConfig(rule="smallest_sets"), reps)
    assert choice.champion.trial_id == "t1" and choice.most_accurate.trial_id == "t0"
    trade = choice.sentence.splitlines()[1]
    assert trade.startswith("Trade: none, it ties the most accurate candidate trial 0") and "less accurate" not in trade
    assert "1.90 against its 2.40" in trade

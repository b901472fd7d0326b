"""The default rule, most_accurate_ts: the service's pick is the pre-registered study's (selection_v4) on every one of
its 180 recorded sweeps, ties and all; its sentence counts what it judged; without "+ TS" candidates it says so."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.studies import selection_v4 as v4
from sweeps.config import SelectionConfig
from sweeps.decide.selection import POST_TS, TrialRecord, choose
from sweeps.selection_rules import DEFAULT_RULE

TABLE = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "selection_v4"


def _record(tid: int, ts: bool, acc: float, nll: float, calibrator: str = "temperature") -> TrialRecord:
    base = f"t{tid:02d}"
    metrics = {"val_accuracy": acc, "val_ece": 0.05, "val_nll": nll}
    post, base_id = (POST_TS, base) if ts else ("", None)
    label = f"trial {tid}{' + TS' if ts else ''}"
    tid_s = f"{base}+{POST_TS}" if ts else base
    return TrialRecord(
        tid_s, label, "completed", metrics, params={"calibrator": calibrator}, post=post, base_id=base_id
    )


def test_it_is_the_default() -> None:
    assert DEFAULT_RULE == "most_accurate_ts" and SelectionConfig().rule == "most_accurate_ts"


def test_the_service_picks_what_the_study_recorded_in_all_180_sweeps() -> None:
    """The study's own rule ran on dict rows (benchmarks/studies/selection_v4.py); the service's on TrialRecords."""
    cands = pd.read_csv(TABLE / "candidates.csv.gz", dtype={"candidate": str})
    sweeps = pd.read_csv(TABLE / "sweeps.csv.gz", dtype={"most_accurate_ts_candidate": str})
    assert len(sweeps) == 180
    for (regime, seed), rows in cands.groupby(["regime", "seed"]):
        records = [
            _record(int(r.trial), bool(r.ts), float(r.val_accuracy), float(r.val_nll)) for r in rows.itertuples()
        ]
        champion = choose(records, SelectionConfig()).champion
        recorded = sweeps[(sweeps.regime == regime) & (sweeps.seed == seed)].most_accurate_ts_candidate.item()
        assert (int(champion.trial[1:]), champion.post == POST_TS) == (int(recorded.split("+")[0]), "+" in recorded)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    trials=st.integers(1, 12),
    with_ts=st.floats(0.0, 1.0),
)
def test_the_pick_equals_the_protocols_rule_on_random_sweeps(seed: int, trials: int, with_ts: float) -> None:
    """Coarse accuracies and NLLs (ties), a "+ TS" twin for some trials: the pick is the study's function's."""
    rng = np.random.default_rng(seed)
    records, rows = [], []
    for i in range(trials):
        acc = rng.integers(80, 84) / 100
        for ts in (False, True) if rng.random() < with_ts or i == 0 else (False,):
            nll = rng.integers(1, 4) / 10
            records.append(_record(i, ts, acc, nll))
            rows.append({"trial": i, "ts": ts, "val_accuracy": acc, "val_nll": nll, "candidate": records[-1].trial_id})
    choice = choose(records, SelectionConfig())
    assert choice.champion.trial_id == v4.most_accurate_ts(rows)["candidate"]
    head, trade, rule = choice.sentence.splitlines()
    n_ts = sum(r["ts"] for r in rows)
    noun = "candidate" if n_ts == 1 else "candidates"
    assert f"the most accurate of the {n_ts} {noun} with temperature scaling on top (of {len(rows)}" in rule
    top = max(r["val_accuracy"] for r in rows)
    tied = [r for r in rows if r["ts"] and r["val_accuracy"] == max(x["val_accuracy"] for x in rows if x["ts"])]
    assert (f"{len(tied)} tied on val accuracy" in rule) == (len(tied) > 1)
    gap = 100 * (top - choice.champion.metrics["val_accuracy"])
    if gap > 0:  # only where the most accurate trial has no twin
        assert f"Trade: {gap:.1f} pt less accurate" in trade and "no candidate with temperature scaling" in trade
    else:
        assert trade.startswith("Trade: none")
    assert (
        head.startswith(f"{choice.champion.label} (")
        and f"val acc {100 * choice.champion.metrics['val_accuracy']:.1f} %" in head
    )
    assert [r.trial_id for r in choice.eligible(records)] == [r.trial_id for r in records if r.post == POST_TS]


def test_without_temperature_on_top_it_takes_the_most_accurate_as_trained_and_says_why() -> None:
    records = [_record(0, False, 0.80, 0.3), _record(1, False, 0.85, 0.5), _record(2, False, 0.85, 0.4)]
    choice = choose(records, SelectionConfig())
    assert choice.champion.trial_id == "t02"  # tie on accuracy: the lower val NLL
    rule = choice.sentence.splitlines()[2]
    assert "most accurate of all 3 candidates" in rule and "evaluation.temperature_on_top is off" in rule
    assert "2 tied on val accuracy" in rule


def test_a_candidate_without_val_nll_loses_the_tie_break() -> None:
    a, b = _record(0, True, 0.9, 0.2), _record(1, True, 0.9, 0.1)
    b.metrics["val_nll"] = math.nan
    assert choose([a, b], SelectionConfig()).champion.trial_id == "t00+ts"


@pytest.mark.parametrize("interval", [True, False])
def test_the_head_carries_intervals_where_the_bootstrap_made_them(interval: bool) -> None:
    from sweeps.decide.uncertainty import Replicates

    records = [_record(0, False, 0.9, 0.2), _record(0, True, 0.9, 0.15)]
    reps = None
    if interval:
        reps = Replicates(level=0.95, num_resamples=4)
        for r in records:
            reps.values[r.trial_id] = {"val_accuracy": np.array([0.88, 0.89, 0.91, 0.92])}
            reps.points[r.trial_id] = {"val_accuracy": 0.9}
    head = choose(records, SelectionConfig(), reps).sentence.splitlines()[0]
    assert head.startswith("trial 0 + TS (")
    assert ("val acc 90.0 % [" in head and "95 % bootstrap intervals" in head) == interval

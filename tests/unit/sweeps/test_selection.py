"""Selection rule, Pareto front and rank agreement on hand-built trial tables."""

from __future__ import annotations

import math

import pytest
from scipy.stats import spearmanr

from sweeps.config import SelectionConfig
from sweeps.decide.selection import TrialRecord, pareto_front, select
from sweeps.report.files import leaderboard, pareto_plot, rank_agreement

PARETO = "pareto_min_ece_near_best_accuracy"


def rec(tid, acc, ece, status="completed", **extra):
    return TrialRecord(
        trial_id=tid,
        label=tid,
        status=status,
        metrics={"val_accuracy": acc, "val_ece": ece, **extra},
        params={"calibrator": "t"},
    )


def test_pareto_front_hand_computed():
    rs = [
        rec("a", 0.90, 0.05),
        rec("b", 0.92, 0.08),
        rec("c", 0.89, 0.06),  # dominated by a
        rec("d", 0.92, 0.09),  # dominated by b
        rec("e", 0.85, 0.01),
    ]
    assert sorted(rs[i].trial_id for i in pareto_front(rs)) == ["a", "b", "e"]


def test_default_rule_lowest_ece_within_tolerance_of_best_accuracy():
    rs = [rec("a", 0.916, 0.030), rec("b", 0.920, 0.050), rec("e", 0.850, 0.010)]
    chosen, why = select(rs, SelectionConfig(rule=PARETO, accuracy_tolerance=0.005))
    assert chosen.trial_id == "a"  # 0.916 >= 0.920 - 0.005, lower ECE than b
    assert "Pareto" in why and "0.9200" in why
    chosen, _ = select(rs, SelectionConfig(rule=PARETO, accuracy_tolerance=0.0))
    assert chosen.trial_id == "b"
    chosen, _ = select(rs, SelectionConfig(rule=PARETO, accuracy_tolerance=0.1))
    assert chosen.trial_id == "e"


def test_failed_and_nan_trials_never_selected():
    rs = [rec("x", 0.99, 0.001, status="diverged"), rec("y", math.nan, math.nan), rec("z", 0.5, 0.2)]
    chosen, _ = select(rs, SelectionConfig(rule=PARETO))
    assert chosen.trial_id == "z"
    with pytest.raises(ValueError, match="nothing to select"):
        select(rs[:2], SelectionConfig(rule=PARETO))


def test_min_metric_rule_and_missing_metric():
    rs = [rec("a", 0.9, 0.05, val_nll=0.4), rec("b", 0.8, 0.02, val_nll=0.3)]
    chosen, why = select(rs, SelectionConfig(rule="min_metric", metric="val_nll"))
    assert chosen.trial_id == "b" and "val_nll" in why
    with pytest.raises(ValueError, match="val_sce"):
        select(rs, SelectionConfig(rule="min_metric", metric="val_sce"))


def test_selection_independent_of_input_order():
    rs = [rec(t, a, e) for t, a, e in [("a", 0.9, 0.05), ("b", 0.9, 0.05), ("c", 0.88, 0.01)]]
    first = select(rs, SelectionConfig(rule=PARETO))[0].trial_id
    assert select(list(reversed(rs)), SelectionConfig(rule=PARETO))[0].trial_id == first == "a"


def test_rank_agreement_matches_scipy_and_is_symmetric():
    vals = [(0.1, 0.2, 0.3), (0.2, 0.1, 0.5), (0.3, 0.4, 0.1), (0.4, 0.3, 0.2)]
    rs = [
        rec(str(i), 0.9, e, val_sce=s, val_ace=a, val_tace=a, val_nll=e, val_brier=s)
        for i, (e, s, a) in enumerate(vals)
    ]
    table = rank_agreement(rs)
    expect = spearmanr([v[0] for v in vals], [v[1] for v in vals]).statistic
    assert table.loc["val_ece", "val_sce"] == pytest.approx(expect)
    assert table.loc["val_ece", "val_nll"] == pytest.approx(1.0)
    assert (table.values == table.values.T).all()


def test_leaderboard_and_plot(tmp_path):
    rs = [rec("a", 0.9, 0.05), rec("b", 0.92, 0.08), rec("c", 0.89, 0.06)]
    board = leaderboard(rs)
    assert list(board["trial_id"]) == ["a", "c", "b"]
    assert dict(zip(board["trial_id"], board["pareto"])) == {"a": True, "b": True, "c": False}
    png = pareto_plot(rs, rs[0], tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trial_errors_lists_the_trials_that_did_not_complete_with_their_reason():
    from sweeps.decide.selection import trial_errors

    rs = [
        TrialRecord("a", "temperature lr=1e-2", "completed", {"val_accuracy": 0.9, "val_ece": 0.02}),
        TrialRecord("b", "matrix lr=3e-1", "diverged", {}, reason="loss nan at epoch 2\n(calibrator)"),
        TrialRecord("c", "vector lr=1e-3", "stopped_early", {}, reason="stopped early by ASHA at epoch 3"),
    ]
    assert trial_errors(rs) == [
        {"trial_id": "b", "label": "matrix lr=3e-1", "status": "diverged", "reason": "loss nan at epoch 2 (calibrator)"}
    ]


def test_sweep_result_repr_is_short():
    import pandas as pd

    from sweeps.contract import SweepResult

    board = pd.DataFrame({"label": ["x"] * 500, "val_ece": [0.1] * 500})
    r = SweepResult(
        name="s",
        champion_run_id="0" * 32,
        champion_trial_id="7",
        champion_label="temperature lr=1.0e-02",
        model_uri="models:/m/3",
        model_version="3",
        leaderboard=board,
        selection="x" * 5000,
        intervals={str(i): {"val_ece": (0.0, 1.0)} for i in range(500)},
        confidence=0.95,
        parent_run_id="1" * 32,
        experiment_id="1",
        tracking_uri="sqlite:////tmp/x.db",
        study_storage="memory",
        errors=[{"trial_id": "1", "label": "l", "status": "errored", "reason": "r"}],
    )
    text = repr(r)
    assert text == (
        "SweepResult(name='s', champion='temperature lr=1.0e-02' (trial 7), model_uri='models:/m/3', "
        "trials=500, errors=1)"
    )
    assert r.study is None and r.champion_uri == "models:/m@champion"


def test_the_rank_agreement_sentence_counts_the_candidates_it_ranked():
    """The sentence says over how many candidates the Spearman figure was computed: a sweep of 2 trials ranks its 4
    candidates (each trial with temperature scaling on top too), not 'trials' (2 points give only +-1)."""
    from sweeps.report.summary import rank_summary

    vals = [(0.1, 0.2, 0.3), (0.2, 0.1, 0.5), (0.3, 0.4, 0.1), (0.4, 0.3, 0.2)]
    rs = [
        rec(str(i), 0.9, e, val_sce=s, val_ace=a, val_tace=a, val_nll=e, val_brier=s)
        for i, (e, s, a) in enumerate(vals)
    ]
    line = rank_summary(rank_agreement(rs))
    lowest = spearmanr([v[1] for v in vals], [v[2] for v in vals]).statistic  # SCE (and Brier) vs ACE (and TACE)
    assert "(Spearman over 4 candidates): lowest " in line and f" {lowest:+.2f} (" in line, line
    two = rank_summary(rank_agreement(rs[:2]))
    assert two == "Rank agreement between metrics: too few candidates to rank (2; 3 needed)", two
    failed = TrialRecord("x", "matrix lr=3e-1", "diverged", {}, reason="nan")
    assert "over 4 candidates" in rank_summary(rank_agreement([*rs, failed]))  # only completed ones are ranked

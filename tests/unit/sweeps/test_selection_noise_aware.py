"""The noise-aware champion rule on simulated sweeps whose trials' true accuracy and
calibration are known, the leaderboard's intervals and flags, and stored predictions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calib_core.evaluation import prediction_arrays
from calib_core.metrics import compute_all
from sweeps.config import SelectionConfig
from sweeps.decide.selection import TrialRecord, select
from sweeps.decide.uncertainty import compute_replicates, load_predictions
from sweeps.report.files import format_leaderboard, leaderboard, pareto_plot

K = 10
NAMES = ("accuracy", "ece", "nll")  # the rule's inputs; every metric's replicates are tested elsewhere


def _trial(rng: np.random.Generator, y: np.ndarray, acc: float, gap: float) -> np.ndarray:
    """Top confidence ~ U(acc + gap -+ 0.08); right with probability confidence - gap, so the
    trial's accuracy is about `acc` and its true ECE about |gap|."""
    n = len(y)
    conf = np.clip(rng.uniform(acc + gap - 0.08, acc + gap + 0.08, n), 1.0 / K + 0.01, 0.999)
    right = rng.random(n) < conf - gap
    pred = np.where(right, y, (y + rng.integers(1, K, n)) % K)
    p = np.tile(((1 - conf) / (K - 1))[:, None], (1, K))
    p[np.arange(n), pred] = conf
    return p


def _sweep(n: int, specs: dict[str, tuple[float, float]], seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    records, preds = [], {}
    for tid, (acc, gap) in specs.items():
        p = _trial(rng, y, acc, gap)
        m = compute_all(p, y)
        records.append(
            TrialRecord(
                trial_id=tid,
                label=f"cal-{tid}",
                status="completed",
                metrics={f"val_{k}": v for k, v in m.items()},
                params={"calibrator": tid, "calibrator_lr": 0.01},
            )
        )
        preds[tid] = {"val": [(None, p, y)]}
    reps = compute_replicates(preds, num_bins=15, num_resamples=1000, level=0.95, seed=1, names=NAMES)
    return records, reps


SPECS = {"A": (0.91, 0.06), "B": (0.895, 0.0), "C": (0.75, 0.0), "D": (0.895, 0.12)}


def test_small_validation_set_prefers_the_calibrated_trial_within_noise() -> None:
    records, reps = _sweep(900, SPECS, seed=2)
    acc = {r.trial_id: r.metrics["val_accuracy"] for r in records}
    assert acc["A"] > acc["B"] > acc["C"]  # A is the most accurate as simulated
    chosen, why = select(records, SelectionConfig(rule="noise_aware"), reps)
    assert chosen.trial_id == "B", why
    assert "below the most accurate candidate cal-A" in why and "not significant" in why
    assert "val ECE" in why and "[" in why and "%" in why
    # the old rule collapses to the most accurate trial
    old, _ = select(records, SelectionConfig(rule="pareto_min_ece_near_best_accuracy"), reps)
    assert old.trial_id == "A"


def test_large_validation_set_makes_the_accuracy_gap_significant() -> None:
    records, reps = _sweep(20000, SPECS)
    chosen, why = select(records, SelectionConfig(rule="noise_aware"), reps)
    assert chosen.trial_id == "A", why
    assert "it is also the most accurate candidate" in why


def test_champion_is_never_dominated_within_noise() -> None:
    """No trial has less than half the champion's val ECE with a val accuracy not significantly
    below the champion's (the default's test: one-sided, Bonferroni over the M - 1 comparisons)."""
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        specs = {str(i): (float(rng.uniform(0.80, 0.93)), float(rng.uniform(-0.02, 0.12))) for i in range(8)}
        records, reps = _sweep(900, specs, seed=seed)
        chosen, _ = select(records, SelectionConfig(rule="noise_aware"), reps)
        for r in records:
            if r is not chosen and r.metrics["val_ece"] < 0.5 * chosen.metrics["val_ece"]:
                _, p = reps.significantly_greater(chosen.trial_id, r.trial_id, "val_accuracy")
                assert p < 0.05 / (len(records) - 1), (seed, r.trial_id, chosen.trial_id)


def test_dominance_step_moves_to_a_tied_trial_with_half_the_ece() -> None:
    """A is the luckiest (most accurate); B is kept and chosen by the pool; C is barely less accurate
    than B (tied) but significantly below A, with a far lower ECE: the default moves to C."""
    records, reps = _sweep(900, {"A": (0.93, 0.08), "B": (0.905, 0.06), "C": (0.895, 0.0)}, seed=5)
    acc = {r.trial_id: r.metrics["val_accuracy"] for r in records}
    _, p_ca = reps.significantly_greater("A", "C", "val_accuracy")
    _, p_cb = reps.significantly_greater("B", "C", "val_accuracy")
    pool_only, _ = select(records, SelectionConfig(rule="noise_aware", dominance_factor=None), reps)
    if not (p_ca < 0.025 <= p_cb and pool_only.trial_id == "B"):
        pytest.skip(f"simulation did not produce the scenario (acc {acc}, p {p_ca:.3f} {p_cb:.3f})")
    chosen, why = select(records, SelectionConfig(rule="noise_aware"), reps)
    assert chosen.trial_id == "C" and "replaced by this trial" in why and "that was cal-B" in why
    assert "significant)" in why
    assert len(why.splitlines()) == 3, why


def test_ties_broken_by_nll_and_rule_needs_replicates() -> None:
    records, reps = _sweep(900, {"A": (0.9, 0.0), "B": (0.9, 0.0)})
    for r in records:
        r.metrics["val_ece"] = 0.05
    records[0].metrics["val_nll"], records[1].metrics["val_nll"] = 0.5, 0.4
    assert select(records, SelectionConfig(rule="noise_aware"), reps)[0].trial_id == "B"
    with pytest.raises(ValueError, match="needs bootstrap replicates"):
        select(records, SelectionConfig(rule="noise_aware"))


def test_leaderboard_intervals_flags_and_plot(tmp_path) -> None:
    records, reps = _sweep(900, SPECS, seed=2)
    chosen, _ = select(records, SelectionConfig(rule="noise_aware"), reps)
    board = leaderboard(records, chosen, reps, SelectionConfig(rule="noise_aware"))
    assert {
        "calibrator",
        "calibrator_lr",
        "champion",
        "not_worse_than_champion",
        "val_ece_ci_low",
        "val_ece_ci_high",
        "val_accuracy_ci_low",
    } <= set(board.columns)
    assert board["champion"].sum() == 1 and board.loc[board["champion"], "trial_id"].item() == chosen.trial_id
    assert (board["val_ece_ci_low"] <= board["val_ece"]).all() and (board["val_ece"] <= board["val_ece_ci_high"]).all()
    flags = dict(zip(board["trial_id"], board["not_worse_than_champion"]))
    assert flags["B"] and not flags["C"] and not flags["D"]  # C far less accurate, D far worse ECE
    text = format_leaderboard(board)
    assert "val_ece %" in text and "[" in text and "*" in text
    png = pareto_plot(records, chosen, tmp_path / "p.png", reps)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stored_multitask_predictions_give_per_task_and_mean_replicates(tmp_path) -> None:
    rng = np.random.default_rng(3)
    n = 400
    labels = np.stack([rng.integers(0, 2, n), rng.integers(0, 3, n)], axis=1)
    labels[rng.random(n) < 0.2, 1] = -1  # missing labels in task 1
    probs = [torch.softmax(torch.tensor(rng.normal(size=(n, k))), 1).float() for k in (2, 3)]
    result = SimpleNamespace(
        val_probs=probs[0],
        val_labels=torch.tensor(labels[:, 0]),
        test_probs=probs[0],
        test_labels=torch.tensor(labels[:, 0]),
        task_val_probs=probs,
        task_val_labels=torch.tensor(labels),
        task_test_probs=probs,
        task_test_labels=torch.tensor(labels),
    )
    data = SimpleNamespace(tasks=[("smile", 2), ("hair", 3)])
    np.savez_compressed(
        tmp_path / "p.npz",
        **prediction_arrays(result, [str(t[0]) for t in data.tasks] if getattr(data, "tasks", None) else None),
    )
    loaded = load_predictions(tmp_path / "p.npz")
    assert [t for t, _, _ in loaded["val"]] == ["smile", "hair"]
    reps = compute_replicates({"t": loaded}, num_bins=15, num_resamples=200)
    v = reps.values["t"]
    np.testing.assert_allclose(v["val_ece"], (v["val_smile_ece"] + v["val_hair_ece"]) / 2)
    # the point estimate of task 1 on its labelled rows sits inside its interval
    keep = labels[:, 1] >= 0
    point = compute_all(probs[1].numpy()[keep], labels[keep, 1])["ece"]
    lo, hi = reps.interval("t", "val_hair_ece")
    assert lo <= point <= hi


def test_bonferroni_keeps_more_trials_than_the_plain_test() -> None:
    """With the M - 1 comparisons adjusted, a trial excluded at p < 0.05 but kept at p >= 0.05/(M-1)
    becomes a candidate; the rule never keeps fewer trials."""
    for seed in range(4):
        records, reps = _sweep(
            900, {"A": (0.91, 0.06), "B": (0.875, 0.0), "C": (0.90, 0.08), "D": (0.6, 0.0)}, seed=seed
        )
        plain, why_plain = select(records, SelectionConfig(rule="noise_aware", multiple_comparisons="none"), reps)
        adj, why_adj = select(records, SelectionConfig(rule="noise_aware", multiple_comparisons="bonferroni"), reps)
        n_plain = int(why_plain.split(" among the ")[1].split(" of ")[0])
        n_adj = int(why_adj.split(" among the ")[1].split(" of ")[0])
        assert n_adj >= n_plain and "Bonferroni over 3 comparisons" in why_adj
        assert adj.metrics["val_ece"] <= plain.metrics["val_ece"]


def test_leaderboard_flags_with_a_metric_that_has_no_replicates() -> None:
    """val_shift_ece is measured once per trial, without bootstrap replicates: the tied flag then
    rests on accuracy alone instead of failing."""
    records, reps = _sweep(900, SPECS, seed=2)
    for i, r in enumerate(records):
        r.metrics["val_shift_ece"] = 0.1 + 0.01 * i
    cfg = SelectionConfig(rule="min_metric", metric="val_shift_ece")
    chosen, _ = select(records, cfg, reps)
    board = leaderboard(records, chosen, reps, cfg)
    flags = dict(zip(board["trial_id"], board["not_worse_than_champion"]))
    assert chosen.trial_id == "A" and flags["A"] and not flags["C"]


def test_sentence_prints_nll_intervals_in_nll_units() -> None:
    records, reps = _sweep(900, SPECS, seed=2)
    chosen, why = select(records, SelectionConfig(rule="min_metric", metric="val_nll"), reps)
    lo, hi = reps.interval(chosen.trial_id, "val_nll")
    assert f"[{lo:.4f}, {hi:.4f}]" in why

"""Large sweeps: every metric's bootstrap only for the trials worth a closer look (issue #26 item 2). On a
simulated sweep of 60 trials the two-phase replicates give the champion, its intervals and every trial's
accuracy and ECE intervals exactly as the full computation does, and the champion has every metric."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from calib_core.metrics import METRIC_NAMES
from sweeps.config import SweepConfig
from sweeps.decide.selection import TrialRecord, select
from sweeps.decide.uncertainty import FULL_DETAIL_TRIALS, compute_replicates, detail_ids, load_predictions
from sweeps.finish import add_detail, sweep_replicates


class _Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def as_directory(self):
        yield str(self.path)


def _sweep(tmp_path: Path, n_trials: int = 45, rows: int = 200) -> list[TrialRecord]:
    rng = np.random.default_rng(0)
    y_val, y_test = rng.integers(0, 10, rows), rng.integers(0, 10, rows)
    records = []
    for i in range(n_trials):
        acc, conf = rng.uniform(0.5, 0.9), rng.uniform(0.4, 0.99)
        arrays = {}
        for split, y in (("val", y_val), ("test", y_test)):
            right = rng.random(rows) < acc
            top = np.where(right, y, (y + rng.integers(1, 10, rows)) % 10)
            p = np.full((rows, 10), (1 - conf) / 9)
            p[np.arange(rows), top] = conf
            arrays[f"{split}_probs"], arrays[f"{split}_labels"] = p, y
        d = tmp_path / f"t{i:02d}"
        d.mkdir()
        np.savez(d / "predictions.npz", **arrays)
        val_acc = float((arrays["val_probs"].argmax(1) == y_val).mean())
        val_ece = abs(conf - val_acc)
        records.append(
            TrialRecord(
                trial_id=f"t{i:02d}",
                label=f"trial {i}",
                status="completed",
                metrics={"val_accuracy": val_acc, "val_ece": val_ece, "val_nll": 1.0},
                checkpoint=_Checkpoint(d),
            )
        )
    return records


def test_two_phase_replicates_change_nothing_selection_reads(tmp_path):
    records = _sweep(tmp_path)
    assert len(records) > FULL_DETAIL_TRIALS
    cfg = SweepConfig.model_validate({"selection": {"num_resamples": 200}})
    reps = sweep_replicates(records, cfg)
    full = compute_replicates(
        {r.trial_id: load_predictions(Path(r.checkpoint.path) / "predictions.npz") for r in records},
        num_bins=cfg.run.train.num_bins,
        num_resamples=200,
        level=cfg.selection.confidence,
        seed=cfg.search.seed,
    )
    for r in records:  # what selection and the leaderboard read: identical, interval for interval
        for key in ("val_accuracy", "val_ece", "test_accuracy", "test_ece"):
            np.testing.assert_array_equal(reps.values[r.trial_id][key], full.values[r.trial_id][key])
            assert reps.interval(r.trial_id, key) == full.interval(r.trial_id, key)
    a, why_a = select(records, cfg.selection, reps)
    b, why_b = select(records, cfg.selection, full)
    assert a.trial_id == b.trial_id and why_a == why_b
    add_detail(reps, records, cfg, a.trial_id)
    for m in METRIC_NAMES:
        assert reps.interval(a.trial_id, f"test_{m}") == full.interval(a.trial_id, f"test_{m}")
    detailed = {t for t in reps.values if reps.has(t, "val_ace")}  # a metric outside core_metrics
    assert a.trial_id in detailed and len(detailed) < len(records)  # the saving is real


def test_detail_set_holds_the_front_and_both_ends():
    points = {
        "a": {"val_accuracy": 0.9, "val_ece": 0.2},
        "b": {"val_accuracy": 0.8, "val_ece": 0.01},
        "c": {"val_accuracy": 0.85, "val_ece": 0.05},  # on the Pareto front between a and b
        "d": {"val_accuracy": 0.5, "val_ece": 0.3},  # dominated
    }
    assert detail_ids(points, k=1) == {"a", "b", "c"}
    assert detail_ids(points, k=4) == {"a", "b", "c", "d"}


def test_unlabelled_rows_are_left_out_of_the_resamples_they_would_weigh():
    """Rows with label -1 drop out: a task's replicates are bootstrap_metrics on its labelled rows under
    the same resample counts' labelled columns (the columns a full split's resamples give those rows)."""
    import torch

    from calib_core.metrics import bootstrap_metrics, resample_counts

    rng = np.random.default_rng(3)
    n, k = 150, 4
    y = rng.integers(0, k, n)
    y[rng.random(n) < 0.3] = -1
    p = rng.dirichlet(np.ones(k), n)
    reps = compute_replicates(
        {"t": {"val": [("a", p, y)]}}, num_bins=10, num_resamples=300, seed=2, names=("accuracy", "ece"), null_draws=0
    )
    keep = y >= 0
    counts = resample_counts(n, 300, seed=2 * 2)[:, torch.from_numpy(np.flatnonzero(keep))]
    want = bootstrap_metrics(p[keep], y[keep], counts, num_bins=10, names=("accuracy", "ece"))
    for m in ("accuracy", "ece"):
        np.testing.assert_array_equal(reps.values["t"][f"val_a_{m}"], want[m].numpy())

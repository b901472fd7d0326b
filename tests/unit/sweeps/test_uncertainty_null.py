"""The sweep's intervals of top-label calibration errors (sweeps.decide.uncertainty): a trial whose predictions are
calibrated by construction gets a val ECE interval that reaches 0, a clearly miscalibrated one
does not, per task for multi-task trials and for the mean over tasks; other metrics keep the
bootstrap interval."""

from __future__ import annotations

import numpy as np
import torch

from calib_core.metrics import centered_interval
from sweeps.decide.uncertainty import compute_replicates


def _split(rng: np.random.Generator, n: int, gap: float, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    conf = rng.uniform(0.4, 1.0, n)
    pred = rng.integers(0, k, n)
    p = np.tile(((1 - conf) / (k - 1))[:, None], (1, k))
    p[np.arange(n), pred] = conf
    y = np.where(rng.random(n) < conf - gap, pred, (pred + rng.integers(1, k, n)) % k)
    return p.astype(np.float32), y


def test_calibrated_trial_interval_reaches_zero_and_miscalibrated_does_not():
    rng = np.random.default_rng(0)
    preds = {}
    for name, gap in (("calibrated", 0.0), ("off", 0.15)):
        val, test = _split(rng, 1500, gap), _split(rng, 1500, gap)
        preds[name] = {"val": [(None, *val)], "test": [(None, *test)]}
    reps = compute_replicates(preds, num_bins=15, num_resamples=300, seed=3, names=("accuracy", "ece", "sce"))
    lo, hi = reps.interval("calibrated", "val_ece")
    assert lo == 0.0 < reps.points["calibrated"]["val_ece"] < hi
    lo, hi = reps.interval("off", "val_ece")
    assert 0.10 < lo < reps.points["off"]["val_ece"] < hi
    # accuracy has no null: the bootstrap interval, unchanged
    r = reps.values["calibrated"]["val_accuracy"]
    assert reps.interval("calibrated", "val_accuracy") == centered_interval(
        torch.from_numpy(r), reps.points["calibrated"]["val_accuracy"], 0.95
    )
    # top-label errors only: SCE (class-conditional) keeps the bootstrap interval
    assert set(reps.nulls["calibrated"]) == {"val_ece", "test_ece"}


def test_multitask_nulls_per_task_and_for_the_mean():
    rng = np.random.default_rng(1)
    parts = {}
    for split in ("val", "test"):
        (p0, y0), (p1, y1) = _split(rng, 1200, 0.0), _split(rng, 1200, 0.2)
        y1[:100] = -1  # missing labels of task 1
        parts[split] = [("a", p0, y0), ("b", p1, y1)]
    reps = compute_replicates({"t": parts}, num_bins=15, num_resamples=200, names=("ece",), null_draws=100)
    assert reps.interval("t", "val_a_ece")[0] == 0.0
    assert reps.interval("t", "val_b_ece")[0] > 0.1
    assert reps.nulls["t"]["val_ece"].shape == (100,)
    assert reps.interval("t", "val_ece")[0] > 0.0  # the mean over tasks is clearly miscalibrated


def test_no_null_draws_means_plain_bootstrap_intervals():
    rng = np.random.default_rng(2)
    val, test = _split(rng, 800, 0.0), _split(rng, 800, 0.0)
    reps = compute_replicates(
        {"t": {"val": [(None, *val)], "test": [(None, *test)]}},
        num_bins=15,
        num_resamples=200,
        names=("ece",),
        null_draws=0,
    )
    assert reps.nulls["t"] == {}
    assert reps.interval("t", "val_ece")[0] > 0.0

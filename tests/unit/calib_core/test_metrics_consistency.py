"""Consistency resampling: null replicates against the metrics on materialised relabellings, the
p-value's size under "calibrated", and interval coverage of a calibrated model's ECE of 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_core.metrics import compute_all, ece
from calib_core.metrics.bootstrap import bootstrap_metrics, centered_interval, resample_counts
from calib_core.metrics.consistency import (
    CALIBRATION_ERRORS,
    calibrated_null,
    calibration_interval,
    calibration_p_value,
)


def _model(rng: np.random.Generator, n: int, gap: float, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence uniform on [0.35, 1]; correct with probability confidence - gap (true ECE = gap)."""
    conf = rng.uniform(0.35, 1.0, n)
    pred = rng.integers(0, k, n)
    p = np.tile(((1 - conf) / (k - 1))[:, None], (1, k))
    p[np.arange(n), pred] = conf
    y = np.where(rng.random(n) < conf - gap, pred, (pred + rng.integers(1, k, n)) % k)
    return p, y


@pytest.mark.parametrize("n,k,round_to", [(300, 5, None), (120, 3, 2), (64, 2, 1)])
def test_null_replicates_equal_metrics_of_the_materialised_relabellings(n: int, k: int, round_to: int | None) -> None:
    rng = np.random.default_rng(n)
    p = np.exp(rng.normal(size=(n, k)) * 2.0)
    p /= p.sum(1, keepdims=True)
    if round_to is not None:  # ties and exact zeros
        p = np.round(p, round_to)
        p[p.sum(1) == 0, 0] = 1.0
        p /= p.sum(1, keepdims=True)
    p = p.astype(np.float32)
    y = rng.integers(0, k, n)
    draws, seed = 12, 5
    null = calibrated_null(p, y, num_draws=draws, seed=seed)
    # The documented draw: inverse CDF of each row with the generator seeded by `seed`.
    u = np.random.default_rng(seed).random((draws, n))
    cum = np.cumsum(p.astype(np.float64), axis=1)
    for b in range(draws):
        yb = np.minimum((u[b][:, None] > cum).sum(1), k - 1)
        ref = compute_all(torch.from_numpy(p), torch.from_numpy(yb))
        for m in CALIBRATION_ERRORS:
            assert float(null[m][b]) == pytest.approx(ref[m], abs=2e-6), (m, b)


def test_relabelled_data_follow_the_model_probabilities() -> None:
    """The documented draw (checked against the module above) picks each class with its
    probability: a binomial check per cell over many draws."""
    p = np.array([[0.7, 0.2, 0.1], [0.05, 0.05, 0.9]])
    draws = 4000
    u = np.random.default_rng(1).random((draws, 2))
    cum = np.cumsum(p, axis=1)
    drawn = [np.minimum((u[:, i, None] > cum[i]).sum(1), 2) for i in range(2)]
    freq = np.stack([np.bincount(d, minlength=3) for d in drawn]) / draws
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / draws))


def test_p_value_is_uniformish_under_calibration_and_small_under_miscalibration() -> None:
    rng = np.random.default_rng(3)
    calibrated = []
    for i in range(60):
        p, y = _model(rng, 500, gap=0.0)
        null = calibrated_null(p, y, num_draws=100, seed=i, names=("ece",))["ece"]
        calibrated.append(calibration_p_value(null, float(ece(p, y))))
    # size: a 5 % test rejects a calibrated model rarely (binomial(60, 0.05) >= 9 has p < 0.01)
    assert sum(pv <= 0.05 for pv in calibrated) <= 8
    p, y = _model(rng, 2000, gap=0.10)
    null = calibrated_null(p, y, num_draws=100, seed=0, names=("ece",))["ece"]
    assert calibration_p_value(null, float(ece(p, y))) == pytest.approx(1 / 101)


def test_interval_covers_a_calibrated_models_ece_of_zero() -> None:
    """95 % intervals cover the true ECE 0 of a calibrated model in 90-98 % of 200 simulated sets;
    the bootstrap interval alone (centred) almost never does."""
    rng = np.random.default_rng(11)
    n, reps = 1000, 200
    counts = resample_counts(n, 300, seed=7)
    hits = {"centred": 0, "calibration": 0}
    for i in range(reps):
        p, y = _model(rng, n, gap=0.0)
        r = bootstrap_metrics(p, y, counts, names=("ece",))["ece"]
        point = float(ece(p, y))
        null = calibrated_null(p, y, num_draws=100, seed=i, names=("ece",))["ece"]
        lo, hi = centered_interval(r, point)
        hits["centred"] += lo <= 0.0 <= hi
        lo, hi = calibration_interval(r, point, null)
        hits["calibration"] += lo <= 0.0 <= hi
    assert 0.90 <= hits["calibration"] / reps <= 0.98, hits
    assert hits["centred"] / reps < 0.10, hits


def test_interval_is_the_bootstrap_interval_when_calibration_is_rejected() -> None:
    rng = np.random.default_rng(2)
    p, y = _model(rng, 2000, gap=0.08)
    counts = resample_counts(2000, 200, seed=0)
    r = bootstrap_metrics(p, y, counts, names=("ece",))["ece"]
    point = float(ece(p, y))
    null = calibrated_null(p, y, num_draws=100, seed=0, names=("ece",))["ece"]
    assert calibration_interval(r, point, null) == centered_interval(r, point)


def test_bad_input() -> None:
    p = np.full((4, 2), 0.5)
    y = np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match="accuracy.*not a calibration error"):
        calibrated_null(p, y, names=("accuracy",))
    with pytest.raises(ValueError, match="num_draws must be >= 1"):
        calibrated_null(p, y, num_draws=0)
    with pytest.raises(ValueError, match="shape|labels"):
        calibrated_null(p, np.array([0, 1]))


@pytest.mark.parametrize("n,k,round_to", [(300, 5, None), (120, 3, 2), (64, 2, 1), (40_000, 10, None), (500, 10, 1)])
def test_the_top_label_draw_is_the_full_draw_compared_with_the_class(n: int, k: int, round_to: int | None) -> None:
    """_drawn_is (two cumulative bounds per row) says exactly where _draw_labels (all K) drew the class: for the
    top label and for any class, with ties, exact zeros, one-hot rows and float32 rows off 1 by rounding."""
    from calib_core.metrics.consistency import _draw_labels, _drawn_is

    rng = np.random.default_rng(k * n)
    p = np.exp(rng.normal(size=(n, k)) * 2.0)
    p /= p.sum(1, keepdims=True)
    if round_to is not None:
        p = np.round(p, round_to)
        p[p.sum(1) == 0, 0] = 1.0
        p /= p.sum(1, keepdims=True)
    p[: n // 10] = np.eye(k)[rng.integers(0, k, n // 10)]  # one-hot rows
    p = torch.from_numpy(p.astype(np.float32))
    drawn = _draw_labels(p, 30, 7)
    for classes in (p.argmax(dim=1).numpy(), rng.integers(0, k, n), np.full(n, k - 1), np.zeros(n, dtype=np.int64)):
        np.testing.assert_array_equal(_drawn_is(p, classes, 30, 7), drawn == classes[None, :])

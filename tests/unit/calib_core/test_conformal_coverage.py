"""Coverage of the service's conformal sets over many random splits lies in its finite-sample bound
[1 - alpha, 1 - alpha + 1 / (n + 1)), and a quantile one rank off (planted) breaks it."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from calib_core import conformal as cp
from calib_core.conformal import quantile

N_CAL, N_TEST, SPLITS, K = 19, 50, 1000, 5
ALPHA = 0.12  # (n + 1)(1 - alpha) = 17.6: rank 18, coverage 18/20 = 0.90, strictly inside [0.88, 0.93)


@lru_cache(maxsize=4)
def _rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exchangeable rows: labels from a Dirichlet world, the model's probabilities a sharpened, noisy view of it."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.distributions.Dirichlet(torch.full((K,), 0.7)).sample((SPLITS * (N_CAL + N_TEST),))
    y = torch.multinomial(truth, 1, generator=g).squeeze(1)
    logits = 2.0 * truth.clamp_min(1e-6).log() + 0.5 * torch.randn(truth.shape, generator=g)
    return logits.softmax(1).double(), y


@lru_cache(maxsize=8)
def _scores(method: str, seed: int) -> torch.Tensor:
    """Every row's score at its label, (SPLITS, N_CAL + N_TEST)."""
    p, y = _rows(seed)
    u = cp.uniform_draws(len(y), seed) if cp.METHODS[method].randomized else None
    return cp.calibration_scores(method, p, y, u=u).reshape(SPLITS, N_CAL + N_TEST)


def mean_coverage(method: str, seed: int = 0) -> float:
    """The mean coverage of `method`'s test sets over SPLITS random calibration/test splits. Every row's score is
    computed once (scores are row-wise); a row is covered when its label's score is at most its split's quantile,
    which is what the sets hold (test_covered_is_score_below_quantile)."""
    scores = _scores(method, seed)
    q = torch.tensor([cp.conformal_quantile(row[:N_CAL], ALPHA) for row in scores])
    return float((scores[:, N_CAL:] <= q.unsqueeze(1)).double().mean())


@pytest.mark.parametrize("method", list(cp.METHODS))
def test_covered_is_score_below_quantile(method: str) -> None:
    p, y = _rows(2)
    p, y = p[:400], y[:400]
    u = cp.uniform_draws(400, 3) if cp.METHODS[method].randomized else None
    q = cp.calibrate(method, p[:100], y[:100], ALPHA, u=None if u is None else u[:100])
    sets = cp.prediction_sets(method, p[100:], q, u=None if u is None else u[100:])
    below = cp.calibration_scores(method, p[100:], y[100:], u=None if u is None else u[100:]) <= q
    assert torch.equal(cp.covered(sets, y[100:]), below)


def check_bound(coverage: float) -> None:
    """The finite-sample guarantee: 1 - alpha <= coverage < 1 - alpha + 1 / (n + 1) (its Monte Carlo standard error
    over 1,000 splits is about 0.0025, eight times below either margin)."""
    assert 1 - ALPHA <= coverage < 1 - ALPHA + 1 / (N_CAL + 1), f"coverage {coverage:.4f}"


@pytest.mark.parametrize("method", list(cp.METHODS))
@pytest.mark.parametrize("offset", [0, -1, 1])
def test_coverage_bound_and_planted_off_by_one(method: str, offset: int, monkeypatch: pytest.MonkeyPatch) -> None:
    exact = quantile.finite_sample_rank
    monkeypatch.setattr(quantile, "finite_sample_rank", lambda n, a: exact(n, a) + offset)
    coverage = mean_coverage(method)
    if offset == 0:
        check_bound(coverage)
    else:  # rank 17 covers 17/20 = 0.85 < 0.88; rank 19 covers 0.95 >= 0.93: the property test must catch both
        with pytest.raises(AssertionError):
            check_bound(coverage)


def test_too_few_rows_cover_everything() -> None:
    p, y = _rows(1)
    q = cp.calibrate("lac", p[:5], y[:5], 0.1)  # rank ceil(6 * 0.9) = 6 > 5
    assert cp.prediction_sets("lac", p[5:50], q).all()

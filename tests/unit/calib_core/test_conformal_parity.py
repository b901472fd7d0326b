"""calib_core.conformal against the libraries people use, on the same probabilities and calibration rows, each under
its own convention (calib_core/conformal/quantile.py and split.py): MAPIE 1.6's LAC and randomised APS, and
torch-uncertainty 0.13's ConformalClsTHR / ConformalClsAPS(randomized=False) / ConformalClsRAPS(randomized=False)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calib_core import conformal as cp

ALPHAS = (0.05, 0.1, 0.2, 0.3)


def _problems(seed: int, count: int = 12) -> list[tuple[np.ndarray, np.ndarray, int, float]]:
    """Random problems: (probs (n + 200, K) float64, labels, n calibration rows, alpha)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        k, n = int(rng.integers(3, 9)), int(rng.integers(40, 300))
        p = rng.dirichlet(np.ones(k) * rng.uniform(0.3, 3.0), size=n + 200)
        y = (p.cumsum(1) > rng.uniform(size=(len(p), 1))).argmax(1)  # labels drawn from the rows
        out.append((p, y, n, ALPHAS[i % len(ALPHAS)]))
    return out


@pytest.fixture(scope="module")
def mapie_classifier() -> type:
    pytest.importorskip("mapie", minversion="1.6")
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Proba(ClassifierMixin, BaseEstimator):
        """A fitted classifier whose inputs are its own probabilities."""

        def __init__(self, k: int = 3) -> None:
            self.k = k

        def fit(self, x: np.ndarray, y: np.ndarray) -> Proba:
            self.classes_ = np.arange(self.k)
            self.n_features_in_ = self.k
            return self

        def predict_proba(self, x: np.ndarray) -> np.ndarray:
            return np.asarray(x, dtype=np.float64)

        def predict(self, x: np.ndarray) -> np.ndarray:
            return np.asarray(x).argmax(1)

    return Proba


def _mapie_sets(
    proba: type, p: np.ndarray, y: np.ndarray, n: int, alpha: float, score: str, seed: int, last: object
) -> np.ndarray:
    from mapie.classification import SplitConformalClassifier

    est = proba(p.shape[1]).fit(p, y)
    m = SplitConformalClassifier(est, confidence_level=1 - alpha, conformity_score=score, random_state=seed)
    m.conformalize(p[:n], y[:n])
    return m.predict_set(p[n:], conformity_score_params={"include_last_label": last})[1][:, :, 0]


def test_lac_equals_mapie(mapie_classifier: type) -> None:
    for p, y, n, alpha in _problems(0):
        expected = _mapie_sets(mapie_classifier, p, y, n, alpha, "lac", 0, True)
        q = cp.calibrate("lac", p[:n], y[:n], alpha, convention="mapie")
        assert np.array_equal(cp.prediction_sets("lac", p[n:], q, convention="mapie").numpy(), expected)
        # MAPIE's quantile is the finite-sample one: the service's sets are the same sets (no tolerance needed here)
        assert q == cp.calibrate("lac", p[:n], y[:n], alpha)


@pytest.mark.parametrize("last", [True, "randomized"])
def test_randomised_aps_equals_mapie_given_its_draws(mapie_classifier: type, last: object) -> None:
    """MAPIE draws one uniform per calibration row from RandomState(seed) and, with include_last_label="randomized",
    one per test row from a fresh RandomState(seed); with True it keeps the label whose mass crosses the quantile."""
    for i, (p, y, n, alpha) in enumerate(_problems(1)):
        expected = _mapie_sets(mapie_classifier, p, y, n, alpha, "aps", 100 + i, last)
        u_cal = np.random.RandomState(100 + i).uniform(size=n)
        q = cp.calibrate("aps_randomized", p[:n], y[:n], alpha, convention="mapie", u=u_cal)
        u_test = None if last is True else np.random.RandomState(100 + i).uniform(size=len(p) - n)
        ours = cp.prediction_sets("aps_randomized", p[n:], q, convention="mapie", u=u_test)
        assert np.array_equal(ours.numpy(), expected)


@pytest.fixture(scope="module")
def tu_post() -> object:
    pytest.importorskip("torch_uncertainty", minversion="0.13")
    from torch_uncertainty import post_processing  # imports lightning: tens of seconds on a loaded machine

    return post_processing


@pytest.mark.parametrize(
    ("method", "cls", "kwargs", "options"),
    [
        ("lac", "ConformalClsTHR", {}, {}),
        ("aps", "ConformalClsAPS", {"randomized": False}, {}),
        ("raps", "ConformalClsRAPS", {"randomized": False}, {}),
        ("raps", "ConformalClsRAPS", {"randomized": False, "penalty": 0.03, "regularization_rank": 3}, {}),
    ],
)
def test_equals_torch_uncertainty(tu_post: object, method: str, cls: str, kwargs: dict, options: dict) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    if "penalty" in kwargs:
        options = {"penalty": kwargs["penalty"], "k_reg": kwargs["regularization_rank"]}
    g = torch.Generator().manual_seed(2)
    for i in range(12):
        k, n = int(torch.randint(3, 12, (1,), generator=g)), int(torch.randint(20, 300, (1,), generator=g))
        alpha = ALPHAS[i % len(ALPHAS)]
        z = torch.randn(n + 200, k, generator=g) * (0.5 + 4 * float(torch.rand(1, generator=g)))
        p = z.softmax(-1)  # what torch-uncertainty computes from its model's logits
        y = torch.multinomial(p, 1, generator=g).squeeze(1)
        tu = getattr(tu_post, cls)(alpha, model=torch.nn.Identity(), enable_ts=False, **kwargs)
        tu.fit(DataLoader(TensorDataset(z[:n], y[:n]), batch_size=n))
        q = cp.calibrate(method, p[:n], y[:n], alpha, convention="torch_uncertainty", **options)
        assert q == tu.quantile.item()
        ours = cp.prediction_sets(method, p[n:], q, convention="torch_uncertainty", **options)
        assert torch.equal(ours, tu.conformal(z[n:]) > 0)

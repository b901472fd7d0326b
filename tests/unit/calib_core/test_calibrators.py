"""Calibrators: identity at init, known-temperature recovery, argmax invariance, post-hoc fits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from calib_core.calibrators import (
    Calibrator,
    DirichletCalibrator,
    TemperatureScaling,
    create_calibrator,
    fit_posthoc,
    list_calibrators,
)

K = 5  # classes (K >= 3, N != K everywhere)
N = 4000
T_TRUE = 2.5


def _synthetic(t_true: float = T_TRUE, n: int = N, k: int = K, seed: int = 0):
    """Logits z and labels sampled from softmax(z / t_true): the right temperature is t_true."""
    g = torch.Generator().manual_seed(seed)
    z = 4.0 * torch.randn(n, k, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / t_true, dim=1), 1, generator=g).squeeze(1)
    return z.float(), y


def _head(d: int = 7, k: int = K) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(d, k)


@pytest.mark.parametrize("name", ["temperature", "vector", "matrix", "dirichlet", "mlp"])
def test_logit_calibrators_start_at_identity(name):
    cal = create_calibrator(name, K)
    assert isinstance(cal, Calibrator) and cal.input_kind == "logits"
    z = 3 * torch.randn(11, K)
    assert torch.equal(cal(z), z)
    assert cal.describe()["num_params"] == sum(p.numel() for p in cal.parameters())
    assert float(cal.regularization().detach()) == 0.0


def test_last_layer_is_the_head_with_no_extra_params():
    head = _head()
    cal = create_calibrator("last_layer", K, head=head, feature_dim=7)
    assert cal.input_kind == "features"
    f = torch.randn(13, 7)
    assert torch.equal(cal(f), head(f))
    assert cal.describe()["num_params"] == 0
    assert {id(p) for p in cal.parameters()} == {id(p) for p in head.parameters()}


def test_mlp_on_features_is_head_at_init_and_does_not_own_the_head():
    head = _head()
    cal = create_calibrator("mlp", K, feature_dim=7, head=head, input="features")
    assert cal.input_kind == "features"
    f = torch.randn(13, 7)
    assert torch.equal(cal(f), head(f))
    assert not ({id(p) for p in cal.parameters()} & {id(p) for p in head.parameters()})


def test_create_calibrator_errors():
    with pytest.raises(ValueError, match="allowed: .*temperature.*last_layer"):
        create_calibrator("platt", K)
    with pytest.raises(ValueError, match="head"):
        create_calibrator("last_layer", K)
    with pytest.raises(ValueError, match="unexpected keyword"):
        create_calibrator("temperature", K, bogus=1)
    with pytest.raises(ValueError, match=r"\(N, 5\)"):
        create_calibrator("vector", K)(torch.randn(4, 3))
    assert set(list_calibrators()) == {"temperature", "vector", "matrix", "dirichlet", "mlp", "last_layer"}


def test_posthoc_temperature_recovers_known_temperature():
    z, y = _synthetic()
    cal = TemperatureScaling(K)
    out = fit_posthoc(cal, z, y)
    t = cal.describe()["temperature"]
    assert abs(t - T_TRUE) / T_TRUE < 0.08, t
    assert out["nll_after"] < out["nll_before"]
    assert cal.log_t.dtype == torch.float32  # cast back after the float64 fit
    # and a model that is under-confident (T_true < 1) gets T < 1
    z2, y2 = _synthetic(t_true=0.5, seed=1)
    cal2 = TemperatureScaling(K)
    fit_posthoc(cal2, z2, y2)
    assert abs(cal2.describe()["temperature"] - 0.5) < 0.06


@pytest.mark.parametrize("name", ["vector", "matrix", "dirichlet"])
def test_richer_calibrators_reduce_nll(name):
    z, y = _synthetic()
    cal = create_calibrator(name, K)
    nll_id = float(F.cross_entropy(z, y))
    out = fit_posthoc(cal, z, y)
    assert out["nll_before"] == pytest.approx(nll_id, rel=1e-5)
    with torch.no_grad():
        nll = float(F.cross_entropy(cal(z), y))
    assert nll < nll_id - 0.05, (nll, nll_id)
    # about as good as the right temperature (within sampling noise of extra parameters)
    with torch.no_grad():
        nll_true = float(F.cross_entropy(z / T_TRUE, y))
    assert nll < nll_true + 0.02


def test_last_layer_posthoc_fit_reduces_nll():
    g = torch.Generator().manual_seed(3)
    f = torch.randn(600, 7, generator=g)
    w = torch.randn(K, 7, generator=g)
    y = torch.multinomial(torch.softmax(f @ w.T, 1), 1, generator=g).squeeze(1)
    head = _head()
    cal = create_calibrator("last_layer", K, head=head)
    out = fit_posthoc(cal, f, y, max_iter=50)
    assert out["nll_after"] < out["nll_before"] - 0.1
    assert head.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_temperature_never_changes_argmax(dtype):
    g = torch.Generator().manual_seed(0)
    cal = TemperatureScaling(K)
    for trial in range(50):
        n, k = 97, 3 + trial % 8
        cal = TemperatureScaling(k)
        scale = float(torch.empty(1).uniform_(0.1, 30, generator=g))
        z = (scale * torch.randn(n, k, generator=g)).to(dtype)
        t = float(torch.empty(1).uniform_(-3, 3, generator=g))  # log T in [-3, 3]
        with torch.no_grad():
            cal.log_t.fill_(t)
            out = cal(z)
        assert torch.equal(out.argmax(1), z.argmax(1))
        assert cal.describe()["temperature"] > 0


def test_dirichlet_matches_kull_parametrisation_and_odir():
    cal = DirichletCalibrator(K, lambda_od=0.3, lambda_b=0.2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        cal.delta.copy_(0.3 * torch.randn(K, K, generator=g))
        cal.bias.copy_(torch.randn(K, generator=g))
    z = torch.randn(9, K, generator=g, dtype=torch.float64)
    cal = cal.double()
    w, b = cal.weight, cal.bias
    want = torch.softmax(torch.log_softmax(z, 1) @ w.T + b, 1)
    torch.testing.assert_close(torch.softmax(cal(z), 1), want)
    off = w - torch.diag(torch.diagonal(w))
    reg = 0.3 * off.pow(2).sum() / (K * (K - 1)) + 0.2 * b.pow(2).sum() / K
    torch.testing.assert_close(cal.regularization(), reg)


def test_fit_posthoc_rejects_bad_input():
    cal = TemperatureScaling(K)
    z = torch.randn(10, K)
    with pytest.raises(ValueError, match="labels"):
        fit_posthoc(cal, z, torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        fit_posthoc(cal, z, torch.full((10,), K))
    bad = z.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fit_posthoc(cal, bad, torch.zeros(10, dtype=torch.long))


def test_calibrators_are_differentiable_and_trainable_with_sgd():
    z, y = _synthetic(n=1000)
    cal = create_calibrator("temperature", K)
    opt = torch.optim.Adam(cal.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        F.cross_entropy(cal(z), y).backward()
        opt.step()
    assert abs(cal.describe()["temperature"] - T_TRUE) < 0.4

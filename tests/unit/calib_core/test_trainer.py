"""The one-go trainer: calibration gain on an over-confident problem, the unrolled
hypergradient, bit-for-bit resume, divergence, the calibrator data sources, holdout hygiene."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from calib_core.calibrators import create_calibrator
from calib_core.config import RunConfig
from calib_core.data import DataSplits, Split
from calib_core.trainer import EpochReport, Trainer, TrainResult
from calib_core.trainer.hypergradient import unrolled_loss

K = 3  # classes; sample counts are never K
D = 10
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _blobs(n: int, seed: int, noise: float = 0.3) -> Split:
    """Gaussian blobs with a fraction `noise` of labels flipped at random (Bayes error > 0)."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(K, D, generator=torch.Generator().manual_seed(123)) * 1.2
    y = torch.randint(0, K, (n,), generator=g)
    x = centers[y] + torch.randn(n, D, generator=g)
    flip = torch.rand(n, generator=g) < noise
    y = torch.where(flip, torch.randint(0, K, (n,), generator=g), y)
    return Split(x, y)


@pytest.fixture(scope="module")
def data() -> DataSplits:
    return DataSplits(
        train=_blobs(500, 1), val=_blobs(700, 2), test=_blobs(700, 3), num_classes=K, input_shape=(D,), name="blobs"
    )


def _cfg(**train) -> RunConfig:
    base = dict(epochs=3, batch_size=64, lr=3e-3, lr_schedule="none", calibrator_lr=0.05)
    base.update(train)
    return RunConfig.model_validate(
        {"seed": 0, "device": "cpu", "model": {"name": "mlp", "kwargs": {"hidden_dims": [64, 64]}}, "train": base}
    )


def _params(trainer: Trainer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in trainer.model.state_dict().values()]
    if trainer.calibrator is not None:
        out += [p.detach().clone() for p in trainer.calibrator.state_dict().values()]
    return out


# ---------------------------------------------------------------------------- calibration gain
def test_onego_temperature_reduces_ece_of_overconfident_model(data):
    """An MLP trained long with CE on a small noisy set is over-confident; one-go temperature
    scaling with a holdout learns T > 1 and gets a lower val and test ECE."""
    common = dict(epochs=40, lr=1e-2, batch_size=50)
    ce = Trainer(_cfg(method="ce", **common), data).fit()
    og = Trainer(
        _cfg(method="onego", calibrator="temperature", calibrator_data="holdout:0.2", calibrator_lr=0.05, **common),
        data,
    ).fit()
    ph = Trainer(
        _cfg(method="posthoc", posthoc_calibrator="temperature", calibrator_data="holdout:0.2", **common), data
    ).fit()
    assert ce.status == og.status == ph.status == "completed"
    assert ce.val_metrics["ece"] > 0.1, ce.val_metrics  # the baseline really is over-confident
    assert og.calibrator_info["temperature"] > 1.5
    assert og.val_metrics["ece"] < 0.6 * ce.val_metrics["ece"], (og.val_metrics, ce.val_metrics)
    assert og.test_metrics["ece"] < 0.6 * ce.test_metrics["ece"], (og.test_metrics, ce.test_metrics)
    assert og.test_metrics["nll"] < ce.test_metrics["nll"]
    assert ph.calibrator_info["temperature"] > 1.5
    assert ph.test_metrics["ece"] < ce.test_metrics["ece"]


# ---------------------------------------------------------------------------- hypergradient
@pytest.mark.parametrize("name", ["temperature", "vector", "matrix", "dirichlet"])
def test_unrolled_hypergradient_matches_finite_differences(name):
    torch.manual_seed(0)
    backbone = torch.nn.Linear(4, K).double()
    cal = create_calibrator(name, K).double()
    with torch.no_grad():  # away from the identity so every term is non-trivial
        for p in cal.parameters():
            p.add_(0.2 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    xb, xc = torch.randn(7, 4, generator=g, dtype=torch.float64), torch.randn(9, 4, generator=g, dtype=torch.float64)
    yb, yc = torch.randint(0, K, (7,), generator=g), torch.randint(0, K, (9,), generator=g)
    eta = 0.7

    def objective() -> torch.Tensor:
        return unrolled_loss(cal, backbone(xc), yc, backbone(xb), yb, eta)

    params = list(backbone.parameters())
    grads = torch.autograd.grad(objective(), params)
    # the hypergradient is not the first-order one: the look-ahead term matters
    first_order = torch.autograd.grad(F.cross_entropy(cal(backbone(xb)), yb), params)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, first_order)) > 1e-4
    h = 1e-6
    for p, gp in zip(params, grads):
        flat = p.data.view(-1)
        for i in range(flat.numel()):
            old = float(flat[i])
            flat[i] = old + h
            up = float(objective().detach())
            flat[i] = old - h
            down = float(objective().detach())
            flat[i] = old
            assert (up - down) / (2 * h) == pytest.approx(float(gp.view(-1)[i]), abs=1e-7, rel=1e-5)


def test_unrolled_trainer_runs_and_differs_from_first_order(data):
    a = Trainer(_cfg(calibrator="matrix", hypergradient="unrolled", epochs=2), data).fit()
    b = Trainer(_cfg(calibrator="matrix", hypergradient="first_order", epochs=2), data).fit()
    assert a.status == b.status == "completed"
    assert a.val_metrics != b.val_metrics


# ---------------------------------------------------------------------------- resume (bit for bit: see
# test_trainer_strategies.py)
def test_resume_with_a_different_config_is_refused(data):
    states = []
    Trainer(_cfg(epochs=1), data).fit(on_epoch=lambda r: states.append(r.state()))
    with pytest.raises(ValueError, match="train.calibrator_lr"):
        Trainer(_cfg(epochs=1, calibrator_lr=0.5), data).fit(resume_state=states[0])


def test_same_seed_same_run(data):
    a = Trainer(_cfg(calibrator="vector", epochs=2), data).fit()
    b = Trainer(_cfg(calibrator="vector", epochs=2), data).fit()
    assert a.val_metrics == b.val_metrics and torch.equal(a.val_probs, b.val_probs)


# ---------------------------------------------------------------------------- divergence
@pytest.mark.parametrize(
    "train",
    [
        dict(calibrator_lr=1e6, calibrator_optimizer="sgd"),
        dict(calibrator_lr=1e6),
        dict(lr=1e6, optimizer="sgd"),
        dict(lr=1e6),  # Adam: finite but astronomically large losses -> divergence_loss
        dict(lr=1e6, method="ce", calibrator="none"),
    ],
)
def test_divergence_stops_the_run(data, train):
    seen = []
    res = Trainer(_cfg(epochs=3, **train), data).fit(on_epoch=seen.append)
    assert res.status == "diverged"
    assert res.reason and ("non-finite" in res.reason or "exploded" in res.reason)
    assert res.val_metrics == {} and res.test_metrics == {} and res.test_probs is None
    assert res.epochs_run == len(seen) < 3


# ---------------------------------------------------------------------------- data sources
def test_divergence_limit_can_be_switched_off(data):
    res = Trainer(_cfg(epochs=1, lr=1e6, method="ce", calibrator="none", divergence_loss=None), data).fit()
    assert res.status == "completed"  # finite garbage: only NaN/inf would stop it now


@pytest.mark.parametrize("source", ["same", "lookahead", "holdout:0.15"])
@pytest.mark.parametrize("calibrator", ["temperature", "last_layer"])
def test_calibrator_data_sources_run(data, source, calibrator):
    t = Trainer(_cfg(calibrator=calibrator, calibrator_data=source, calibrator_steps=2, epochs=2), data)
    t.trace = []
    res = t.fit()
    assert res.status == "completed"
    cal_steps = [i for kind, i in t.trace if kind == "calibrator"]
    bb_steps = [i for kind, i in t.trace if kind == "backbone"]
    assert len(cal_steps) == 2 * len(bb_steps)
    if source == "same":
        assert all(torch.equal(c, b) for c, b in zip(cal_steps[1::2], bb_steps))
    if source == "lookahead":  # the calibrator sees each batch one step before the backbone does
        assert all(torch.equal(c, b) for c, b in zip(cal_steps[1::2][:-1], bb_steps[1:]))


def test_backbone_never_sees_holdout(data):
    t = Trainer(_cfg(calibrator="temperature", calibrator_data="holdout:0.2", epochs=3), data)
    t.trace = []
    t.fit()
    holdout = set(t.holdout_idx.tolist())
    assert len(holdout) == 100  # round(0.2 * 500)
    bb = set(torch.cat([i for k, i in t.trace if k == "backbone"]).tolist())
    cal = set(torch.cat([i for k, i in t.trace if k == "calibrator"]).tolist())
    assert not (bb & holdout)
    assert cal == holdout  # the calibrator cycles through the whole holdout
    assert bb == set(range(500)) - holdout
    # posthoc uses the same kind of holdout for its fit
    p = Trainer(_cfg(method="posthoc", calibrator_data="holdout:0.2", epochs=1), data)
    p.trace = []
    p.fit()
    assert not (set(torch.cat([i for k, i in p.trace if k == "backbone"]).tolist()) & set(p.holdout_idx.tolist()))


@pytest.mark.parametrize(
    "calibrator, kwargs",
    [
        ("vector", {}),
        ("matrix", {}),
        ("dirichlet", {"lambda_od": 0.01, "lambda_b": 0.01}),
        ("mlp", {}),
        ("mlp", {"input": "features", "hidden": 8}),
    ],
)
def test_every_calibrator_trains(data, calibrator, kwargs):
    t = Trainer(_cfg(calibrator=calibrator, calibrator_kwargs=kwargs, epochs=2), data)
    before = [p.detach().clone() for p in t.calibrator.parameters()]
    res = t.fit()
    assert res.status == "completed"
    assert res.calibrator_info["num_params"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, t.calibrator.parameters()))
    if kwargs.get("input") == "features":  # the head stays a backbone parameter
        assert not {id(p) for p in t.calibrator.parameters()} & {id(p) for p in t.model.head.parameters()}
        assert {id(p) for p in t.model.head.parameters()} <= {id(p) for p in t.feature_params}


def test_bad_calibrator_kwargs_are_a_value_error(data):
    with pytest.raises(ValueError, match="lambda_bogus"):
        Trainer(_cfg(calibrator="dirichlet", calibrator_kwargs={"lambda_bogus": 1}), data)


def test_warmup_freezes_calibrator_and_last_layer_head_trains_in_warmup(data):
    t = Trainer(_cfg(calibrator="temperature", warmup_epochs=2, epochs=2), data)
    res = t.fit()
    assert res.calibrator_info["temperature"] == 1.0  # not updated during warm-up
    t = Trainer(_cfg(calibrator="last_layer", warmup_epochs=1, epochs=1), data)
    t.trace = []
    w0 = t.model.head.weight.detach().clone()
    t.fit()
    assert not torch.equal(w0, t.model.head.weight)  # trained with the backbone in warm-up
    assert not [k for k, _ in t.trace if k == "calibrator"]


# ---------------------------------------------------------------------------- the result
def test_train_result_and_epoch_reports(data):
    reports: list[EpochReport] = []
    res = Trainer(_cfg(calibrator="temperature", epochs=2), data).fit(on_epoch=reports.append)
    assert isinstance(res, TrainResult) and res.status == "completed" and res.reason is None
    assert [r.epoch for r in reports] == [1, 2]
    keys = {"train_loss", "epoch_time"} | {
        f"val_{k}" for k in ("accuracy", "nll", "brier", "ece", "sce", "ace", "tace", "mce", "rmsce", "aurc")
    }
    assert keys <= set(reports[0].metrics)
    assert all(isinstance(v, float) for v in reports[0].metrics.values())
    pickle.dumps(reports[-1].state())
    assert res.val_probs.shape == (700, K) and res.val_labels.shape == (700,) and res.test_probs.device.type == "cpu"
    probs = res.predict_proba(data.test.x[:11])
    torch.testing.assert_close(probs.sum(1), torch.ones(11))
    torch.testing.assert_close(probs, res.test_probs[:11])
    assert len(res.epoch_times) == 2 and res.wall_time >= sum(res.epoch_times) * 0.99
    assert set(res.test_metrics) >= {"accuracy", "nll", "ece"}
    assert res.calibrator_info["temperature"] != 1.0


# ---------------------------------------------------------------------------- head_lr
def _sgd(**train) -> RunConfig:
    return _cfg(method="ce", optimizer="sgd", momentum=0.0, lr=0.1, epochs=1, **train)


def test_head_lr_equal_to_lr_changes_nothing(data):
    a = Trainer(_sgd(), data)
    a.fit()
    b = Trainer(_sgd(head_lr=0.1), data)
    b.fit()
    for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()):
        assert torch.equal(p, q)


def test_head_lr_with_last_layer_calibrator_is_refused_without_warmup():
    with pytest.raises(ValueError, match="head_lr has no effect.*last_layer"):
        _cfg(calibrator="last_layer", head_lr=1e-3)
    _cfg(calibrator="last_layer", head_lr=1e-3, warmup_epochs=1)  # the warm-up trains the head


# ---------------------------------------------------------------------------- the calibrator's effective parameters
def test_infinite_temperature_is_divergence_although_log_t_is_finite(data):
    """T = exp(log T) overflows to inf for log T > ~88.7 while log T itself is finite: the
    calibrated logits are then all 0 (uniform probabilities, finite losses and metrics), so only
    a check of the effective temperature sees it. The warm-up keeps the calibrator from
    stepping (its gradient would be NaN), so nothing else stops the run."""
    t = Trainer(_cfg(calibrator="temperature", warmup_epochs=2, epochs=2), data)
    with torch.no_grad():
        t.calibrator.log_t.fill_(200.0)
    res = t.fit()
    assert res.status == "diverged"
    assert "temperature" in res.reason and "inf" in res.reason and "epoch 1" in res.reason, res.reason
    assert res.val_metrics == {} and res.test_metrics == {} and res.epochs_run == 0


def test_zero_temperature_is_divergence(data):
    t = Trainer(_cfg(calibrator="temperature", warmup_epochs=1, epochs=1), data)
    with torch.no_grad():
        t.calibrator.log_t.fill_(-200.0)  # T = exp(-200) underflows to 0
    res = t.fit()
    assert res.status == "diverged" and "temperature" in res.reason, res.reason


def test_huge_calibrator_lr_drives_temperature_to_inf_and_the_run_diverges():
    """calibrator_lr=1e3 with Adam: after one warm-up epoch the (over-confident) model makes
    the single calibrator step of the last epoch (one batch per epoch) push log T up by ~1000,
    T = inf. That run used to end "completed" with uniform predictions and temperature inf."""
    from calib_core.data import load_dataset

    cfg = RunConfig.model_validate(
        {
            "seed": 3,
            "device": "cpu",
            "num_threads": 1,
            "data": {"name": "mnist1d", "num_samples": 600},
            "model": {"name": "mlp", "kwargs": {"hidden_dims": [32]}},
            "train": {
                "epochs": 2,
                "warmup_epochs": 1,
                "batch_size": 4096,
                "lr": 0.003,
                "calibrator": "temperature",
                "calibrator_data": "holdout:0.1",
                "calibrator_lr": 1e3,
            },
        }
    )
    t = Trainer(cfg, load_dataset(cfg.data, cfg.seed))
    res = t.fit()
    assert float(t.calibrator.log_t.detach()) > 88  # the scenario: a finite log T, an infinite T
    assert res.status == "diverged"
    assert "temperature" in res.reason and "inf" in res.reason and "epoch 2" in res.reason, res.reason
    assert res.epochs_run == 1 and res.val_metrics == {} and res.test_probs is None

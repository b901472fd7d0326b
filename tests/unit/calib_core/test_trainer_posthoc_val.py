"""Post-hoc calibration fitted on the validation split (cross-fitted validation metrics) and
early stopping on validation NLL (best-epoch model returned, resumable)."""

from __future__ import annotations

import pytest
import torch

from calib_core.calibrators import create_calibrator, fit_posthoc
from calib_core.config import ConfigError, RunConfig, build_model
from calib_core.data import DataSplits, Split
from calib_core.metrics import compute_all
from calib_core.trainer import CountingFit, MultiTaskTrainer, Trainer
from calib_core.trainer.calibrator_batches import kfold_indices
from tests.resume_harness import crash_then_resume
from tests.unit.calib_core.test_trainer import D, K, _blobs  # the same noisy Gaussian blobs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def data() -> DataSplits:
    return DataSplits(
        train=_blobs(300, 1), val=_blobs(253, 2), test=_blobs(400, 3), num_classes=K, input_shape=(D,), name="blobs"
    )


def _cfg(**train) -> RunConfig:
    base = dict(epochs=3, batch_size=50, lr=1e-2, lr_schedule="none")
    base.update(train)
    return RunConfig.model_validate(
        {"seed": 0, "device": "cpu", "model": {"name": "mlp", "kwargs": {"hidden_dims": [64, 64]}}, "train": base}
    )


def test_kfold_indices_partition():
    folds = kfold_indices(23, 5, seed=4)
    assert sorted(len(f) for f in folds) == [4, 4, 5, 5, 5]
    assert torch.equal(torch.cat(folds).sort().values, torch.arange(23))
    assert all(torch.equal(a, b) for a, b in zip(folds, kfold_indices(23, 5, seed=4)))
    with pytest.raises(ValueError):
        kfold_indices(3, 5, seed=0)


def test_posthoc_split_config():
    ok = build_model(RunConfig, {"train": {"method": "posthoc", "posthoc_split": "val", "calibrator_data": "same"}})
    assert ok.train.posthoc_split == "val" and ok.train.posthoc_folds == 5
    # validation is the default split; fitting on the holdout needs one
    assert (
        build_model(RunConfig, {"train": {"method": "posthoc", "calibrator_data": "same"}}).train.posthoc_split == "val"
    )
    with pytest.raises(ConfigError, match="holdout"):
        build_model(RunConfig, {"train": {"method": "posthoc", "posthoc_split": "holdout", "calibrator_data": "same"}})
    with pytest.raises(ConfigError, match="posthoc_folds"):
        build_model(RunConfig, {"train": {"posthoc_folds": 1}})
    with pytest.raises(ConfigError, match="early_stopping_patience"):
        build_model(RunConfig, {"train": {"early_stopping_patience": 0}})


@pytest.mark.parametrize("name", ["temperature", "vector"])
def test_posthoc_on_validation_cross_fits_val_metrics(data, name):
    tr = Trainer(_cfg(method="posthoc", posthoc_calibrator=name, posthoc_split="val", posthoc_folds=4, epochs=4), data)
    assert len(tr.backbone_idx) == len(data.train) and len(tr.holdout_idx) == 0  # the whole training split trains
    res = tr.fit()
    assert res.status == "completed"

    # recompute by hand from the backbone's raw validation logits
    with torch.no_grad():
        tr.model.eval()
        z = tr.model(data.val.x)
    full = create_calibrator(name, K)
    fit_posthoc(full, z, data.val.y)
    oof = torch.empty_like(z)
    for fold in kfold_indices(len(data.val), 4, seed=0):
        rest = torch.ones(len(z), dtype=torch.bool)
        rest[fold] = False
        cal = create_calibrator(name, K)
        fit_posthoc(cal, z[rest], data.val.y[rest])
        with torch.no_grad():
            oof[fold] = cal(z[fold])
    expect_val = compute_all(oof, data.val.y, from_logits=True)
    assert res.val_metrics["ece"] == pytest.approx(float(expect_val["ece"]), abs=1e-5)
    assert res.val_metrics["nll"] == pytest.approx(float(expect_val["nll"]), abs=1e-5)
    # the returned calibrator is the one fitted on the whole validation split
    for a, b in zip(full.state_dict().values(), res.model.calibrator.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-5)
    with torch.no_grad():
        expect_test = compute_all(full(tr.model(data.test.x)), data.test.y, from_logits=True)
    assert res.test_metrics["ece"] == pytest.approx(float(expect_test["ece"]), abs=1e-5)
    # in-sample (calibrator fitted on the same rows) would be optimistic: the val NLL is not that
    with torch.no_grad():
        in_sample = float(compute_all(full(z), data.val.y, from_logits=True)["nll"])
    assert res.val_metrics["nll"] >= in_sample - 1e-6


def test_posthoc_on_validation_resume_is_bit_for_bit(data):
    cfg = _cfg(method="posthoc", posthoc_split="val", epochs=3)
    full = Trainer(cfg, data).fit()
    _, res, _ = crash_then_resume(lambda: Trainer(cfg, data), crash_after=1)
    assert res.val_metrics == full.val_metrics and res.test_metrics == full.test_metrics


def test_early_stopping_returns_the_best_epoch(data):
    # a large lr on small noisy data: validation NLL rises after a few epochs
    cfg = _cfg(method="ce", calibrator="none", epochs=30, lr=3e-2, early_stopping_patience=2)
    states = {}
    res = Trainer(cfg, data).fit(on_epoch=lambda r: states.__setitem__(r.epoch, r.state()["model"]))
    nll = [h["val_nll"] for h in res.history]
    best = min(range(len(nll)), key=nll.__getitem__) + 1
    assert res.epochs_run < 30 and res.epochs_run == best + 2
    assert res.best["epoch"] == best
    assert res.val_metrics["nll"] == pytest.approx(nll[best - 1], abs=1e-6)  # the best epoch's model
    for k, v in res.model.model.state_dict().items():
        assert torch.equal(v, states[best][k])
    plain = Trainer(_cfg(method="ce", calibrator="none", epochs=res.epochs_run, lr=3e-2), data).fit()
    assert plain.val_metrics["nll"] > res.val_metrics["nll"]  # the last epoch is worse


def test_early_stopping_resume_is_bit_for_bit(data):
    cfg = _cfg(
        method="onego", calibrator="temperature", calibrator_lr=0.05, epochs=30, lr=3e-2, early_stopping_patience=2
    )
    full_t = Trainer(cfg, data)
    full = full_t.fit()
    assert full.epochs_run < 30
    _, res, _ = crash_then_resume(lambda: Trainer(cfg, data), crash_after=full.epochs_run - 1)
    assert res.epochs_run == full.epochs_run
    assert res.val_metrics == full.val_metrics and res.test_metrics == full.test_metrics
    # resumed exactly at the stopping epoch: nothing more is trained
    _, again, reports = crash_then_resume(lambda: Trainer(cfg, data), crash_after=full.epochs_run)
    assert reports == [] and again.val_metrics == full.val_metrics


def test_multitask_posthoc_on_validation():
    tasks = (("a", 3), ("b", 2))

    def split(n: int, seed: int) -> Split:
        g = torch.Generator().manual_seed(seed)
        s = _blobs(n, seed)
        y = torch.stack([s.y, (s.x[:, 0] > 0).long()], 1)
        y[torch.rand(n, 2, generator=g) < 0.2] = -1
        return Split(s.x, y)

    d = DataSplits(
        train=split(300, 1),
        val=split(250, 2),
        test=split(200, 3),
        num_classes=3,
        input_shape=(D,),
        name="blobs_mtl",
        tasks=tasks,
    )
    tr = MultiTaskTrainer(_cfg(method="posthoc", posthoc_split="val", epochs=2), d)
    assert len(tr.holdout_idx) == 0
    res = tr.fit()
    assert res.status == "completed" and res.calibration_stages == 2
    # validation metrics are cross-fitted, not those of the calibrators fitted on all of validation
    tr._crossfit_val = None
    in_sample = tr.evaluate(tr.val_split, "validation").metrics
    assert res.val_metrics["nll"] >= in_sample["nll"] - 1e-6
    assert res.val_metrics["a_nll"] != in_sample["a_nll"]


@pytest.mark.parametrize("split", ["holdout", "val"])
def test_posthoc_refit_at_the_end_equals_the_last_epoch_refit(data, split):
    common = dict(method="posthoc", posthoc_split=split, posthoc_folds=3, epochs=3, calibrator_data="holdout:0.2")
    every_fits, end_fits = CountingFit(), CountingFit()
    every = Trainer(_cfg(**common), data, posthoc_fit=every_fits).fit()
    end = Trainer(_cfg(posthoc_refit="end", **common), data, posthoc_fit=end_fits).fit()
    per_fit = 4 if split == "val" else 1  # 3 folds + the fit on all rows
    assert len(every_fits.reports) == 3 * per_fit and len(end_fits.reports) == per_fit
    assert end.val_metrics == every.val_metrics and end.test_metrics == every.test_metrics
    assert end.history[-1]["val_nll"] != every.history[-1]["val_nll"]  # per-epoch metrics are uncalibrated

"""The trainer loop's behaviours, once per strategy (single-task and multi-task): bit-for-bit resume,
the last-layer calibrator's head discipline after warm-up, per-group head learning rates, a
calibrator's own divergence report, and the post-hoc fits (one per task and epoch; cross-fitted
validation logits equal to a by-hand out-of-fold refit)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from calib_core.calibrators import create_calibrator, fit_posthoc
from calib_core.config import RunConfig
from calib_core.data import DataSplits
from calib_core.trainer import CountingFit, MultiTaskTrainer, Trainer, make_trainer
from calib_core.trainer.calibrator_batches import kfold_indices
from tests.resume_harness import crash_then_resume
from tests.unit.calib_core.test_multitask_trainer import TASKS, _same, _state
from tests.unit.calib_core.test_multitask_trainer import _data as mtl_data
from tests.unit.calib_core.test_trainer import K, _blobs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STRATEGIES = ("single", "multi")


@dataclass(frozen=True)
class Case:
    """One strategy's data and the handles on its model the tests need."""

    kind: str
    data: DataSplits

    @property
    def num_tasks(self) -> int:
        return len(TASKS) if self.kind == "multi" else 1

    def cfg(self, **train: Any) -> RunConfig:
        base = dict(epochs=2, batch_size=64, lr=3e-3, lr_schedule="none", calibrator_lr=0.05)
        base.update(train)
        return RunConfig.model_validate(
            {"seed": 0, "device": "cpu", "model": {"name": "mlp", "kwargs": {"hidden_dims": [32]}}, "train": base}
        )

    def trainer(self, cfg: RunConfig, **kwargs: Any) -> Trainer:
        t = make_trainer(cfg, self.data, **kwargs)
        assert isinstance(t, MultiTaskTrainer) == (self.kind == "multi")
        return t

    def heads(self, t: Trainer) -> torch.nn.Module:
        return t.model.heads if self.kind == "multi" else t.model.head

    def temperature(self, t: Trainer, task: int) -> torch.nn.Module:
        return t.calibrator[task] if self.kind == "multi" else t.calibrator

    def labels(self, y: torch.Tensor, task: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Task `task`'s labelled rows (indices) of split labels `y` and those labels."""
        if self.kind == "single":
            return torch.arange(len(y)), y
        rows = (y[:, task] >= 0).nonzero().squeeze(1)
        return rows, y[rows, task]

    def test_probs(self, res: Any) -> list[torch.Tensor]:
        return list(res.task_test_probs) if self.kind == "multi" else [res.test_probs]


def _case(kind: str, missing: float = 0.0) -> Case:
    if kind == "multi":
        return Case(kind, mtl_data(missing=missing))
    return Case(
        kind,
        DataSplits(
            train=_blobs(301, 1),
            val=_blobs(211, 2),
            test=_blobs(205, 3),
            num_classes=K,
            input_shape=(10,),
            name="blobs",
        ),
    )


@pytest.fixture(scope="module", params=STRATEGIES)
def case(request: pytest.FixtureRequest) -> Case:
    return _case(request.param)


# ---------------------------------------------------------------------------- resume
RESUME_CASES = {
    "temperature-holdout-adam-cosine": dict(calibrator="temperature", lr_schedule="cosine", calibrator_steps=2),
    "last_layer-lookahead-warmup-sgd-step": dict(
        calibrator="last_layer",
        calibrator_data="lookahead",
        warmup_epochs=1,
        optimizer="sgd",
        lr=0.05,
        lr_schedule="step",
        calibrator_optimizer="sgd",
    ),
    "dirichlet-unrolled-same": dict(calibrator="dirichlet", calibrator_data="same", hypergradient="unrolled"),
    "posthoc-vector": dict(method="posthoc", posthoc_calibrator="vector"),
    "posthoc-val-temperature": dict(method="posthoc", posthoc_split="val", posthoc_folds=3),
    "focal": dict(method="focal", calibrator="none"),  # single-task only: multi-task data refuses focal
}


@pytest.mark.parametrize(
    ("kind", "name"), [(k, n) for n in RESUME_CASES for k in STRATEGIES if not (n == "focal" and k == "multi")]
)
def test_resume_is_bit_for_bit(kind, name):
    c = _case(kind, missing=0.2)
    cfg = c.cfg(epochs=3, **RESUME_CASES[name])
    cfg.model.kwargs["dropout"] = 0.2
    full_t = c.trainer(cfg)
    full = full_t.fit()
    res_t, res, reports = crash_then_resume(lambda: c.trainer(cfg), crash_after=1)
    assert [r.epoch for r in reports] == [2, 3]
    assert _same(_state(full_t.model), _state(res_t.model))
    if full_t.calibrator is not None:
        assert _same(_state(full_t.calibrator), _state(res_t.calibrator))
    assert res.val_metrics == full.val_metrics and res.test_metrics == full.test_metrics
    assert all(torch.equal(a, b) for a, b in zip(c.test_probs(res), c.test_probs(full)))
    drop = lambda h: {k: v for k, v in h.items() if k != "epoch_time"}  # noqa: E731
    assert [drop(h) for h in res.history] == [drop(h) for h in full.history]


# ---------------------------------------------------------------------------- last_layer after warm-up
@pytest.mark.parametrize("warmup", [0, 1])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_last_layer_heads_move_only_by_the_calibrator_step_after_warmup(case, warmup, optimizer):
    """With `last_layer` the head(s) ARE the calibrator(s): after warm-up only the calibrator
    optimizer may move them, never the backbone optimizer (which held them for the warm-up) with
    stale gradients. One batch per epoch and K_c = 1: a copy of the trainer that takes the epoch's
    calibrator step alone ends with the same heads."""
    cfg = case.cfg(
        calibrator="last_layer",
        calibrator_data="holdout:0.2",
        warmup_epochs=warmup,
        epochs=warmup + 1,
        batch_size=512,
        optimizer=optimizer,
        momentum=0.9,
        calibrator_optimizer=optimizer,
    )
    t = case.trainer(cfg)
    for e in range(warmup):
        t.train_epoch(e)
    alone = copy.deepcopy(t)
    feat0 = [p.detach().clone() for p in t.feature_params]
    heads0 = _state(case.heads(t))
    t.trace = []
    t.train_epoch(warmup)
    (cal_idx,) = [i for kind, i in t.trace if kind == "calibrator"]
    assert len([k for k, _ in t.trace if k == "backbone"]) == 1
    alone._calibrator_step(cal_idx, warmup, 0)
    assert not _same(feat0, [p.detach().clone() for p in t.feature_params])  # the backbone stepped
    assert not _same(heads0, _state(case.heads(t)))  # the calibrators stepped
    for p, q in zip(case.heads(t).parameters(), case.heads(alone).parameters()):
        assert torch.equal(p, q), float((p - q).detach().abs().max())


def test_last_layer_heads_are_frozen_after_warmup_with_zero_calibrator_lr(case):
    """Whole epochs after warm-up with the calibrator's learning rate at 0: the heads stay put (the
    backbone still trains); in the warm-up itself the heads train with the backbone."""
    t = case.trainer(case.cfg(calibrator="last_layer", warmup_epochs=1, epochs=3))
    heads0 = _state(case.heads(t))
    t.train_epoch(0)
    heads1 = _state(case.heads(t))
    assert not _same(heads0, heads1)
    for g in t.calibrator_opt.param_groups:
        g["lr"] = 0.0
    feat1 = [p.detach().clone() for p in t.feature_params]
    t.train_epoch(1)
    t.train_epoch(2)
    assert _same(heads1, _state(case.heads(t)))
    assert not _same(feat1, [p.detach().clone() for p in t.feature_params])


def test_head_lr_moves_the_heads_at_their_own_rate(case):
    # plain SGD: each step moves a parameter by -lr * grad, so heads at 1e-9 x the rate stay put
    cfg = case.cfg(method="ce", optimizer="sgd", momentum=0.0, lr=0.1, epochs=1, head_lr=1e-10)
    t = case.trainer(cfg)
    heads0 = _state(case.heads(t))
    feat0 = [p.detach().clone() for p in t.feature_params]
    t.fit()
    head_moves = max(float((p - q).abs().max()) for p, q in zip(_state(case.heads(t)), heads0))
    feat_moves = max(float((p.detach() - q).abs().max()) for p, q in zip(t.feature_params, feat0))
    assert head_moves < 1e-8 < 1e-3 < feat_moves
    groups = t.backbone_opt.param_groups
    assert [g["lr"] for g in groups] == [0.1, 1e-10]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in case.heads(t).parameters()}


# ---------------------------------------------------------------------------- a calibrator's own divergence
def test_an_infinite_temperature_makes_the_run_diverge_and_is_named(case):
    """T = exp(log T) = inf with a finite log T: predictions are uniform with finite losses, so only
    the calibrator's own check ends the run; a multi-task run names the task."""
    t = case.trainer(case.cfg(calibrator="temperature", warmup_epochs=2, epochs=2))
    task = case.num_tasks - 1
    with torch.no_grad():
        case.temperature(t, task).log_t.fill_(200.0)
    res = t.fit()
    assert res.status == "diverged" and "temperature overflowed to inf" in res.reason, res.reason
    if case.kind == "multi":
        assert f"task {TASKS[task][0]!r}" in res.reason
    else:
        assert "task" not in res.reason
    assert res.val_metrics == {} and res.test_metrics == {}


# ---------------------------------------------------------------------------- post-hoc fits
@pytest.mark.parametrize("kind", STRATEGIES)
def test_posthoc_fits_once_per_task_and_epoch_on_labelled_rows(kind):
    c = _case(kind, missing=0.3)
    fits = CountingFit()
    seen: list[int] = []

    def fit(cal, inputs, labels):
        assert bool((labels >= 0).all())
        seen.append(cal.num_classes)
        return fits(cal, inputs, labels)

    res = c.trainer(c.cfg(method="posthoc", posthoc_split="holdout", epochs=2), posthoc_fit=fit).fit()
    assert res.status == "completed"
    classes = [k for _, k in TASKS] if kind == "multi" else [K]
    assert seen == classes * 2
    assert all(r["nll_after"] <= r["nll_before"] + 1e-9 for r in fits.reports)


@pytest.mark.parametrize("kind", STRATEGIES)
def test_crossfitted_validation_logits_are_out_of_fold(kind):
    """posthoc_split 'val': each labelled validation row is calibrated by a calibrator refitted
    (here by hand, with calib_core's LBFGS) on the other folds' rows of its task."""
    c = _case(kind, missing=0.2)
    folds = 3
    t = c.trainer(c.cfg(method="posthoc", posthoc_split="val", posthoc_folds=folds, epochs=1))
    res = t.fit()
    assert res.status == "completed"
    inputs = t._cached_inputs(t.val_split.x)
    y = t.val_split.y
    for task in range(c.num_tasks):
        rows, labels = c.labels(y, task)
        x = inputs[task][rows]
        k = TASKS[task][1] if kind == "multi" else K
        expect = torch.empty(len(rows), k, dtype=torch.float64)
        for fold in kfold_indices(len(rows), folds, t.seed + 7919 * task):
            rest = torch.ones(len(rows), dtype=torch.bool)
            rest[fold] = False
            cal = create_calibrator("temperature", k)
            fit_posthoc(cal, x[rest], labels[rest])
            with torch.no_grad():
                expect[fold] = cal(x[fold].double()).double()
        got = t._crossfit_val[task][rows].double()
        assert torch.allclose(got, expect, atol=1e-5), float((got - expect).abs().max())

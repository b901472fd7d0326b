"""Multi-task one-go calibration: per-task calibrators learn only from their own task, missing
labels are masked out of losses and metrics, resume is bit-for-bit, post-hoc needs one stage
per task, and the dispatch picks the multi-task trainer for multi-task data."""

from __future__ import annotations

import pytest
import torch

from calib_core.config import RunConfig
from calib_core.data import DataSplits, Split
from calib_core.metrics import compute_all
from calib_core.models import create_model
from calib_core.models.multitask import MultiTaskClassifier
from calib_core.trainer import MultiTaskTrainer, Trainer, make_trainer
from calib_core.trainer.multitask import masked_cross_entropy, multitask_metrics

TASKS = (("a", 3), ("b", 2), ("c", 4))  # K >= 3, a binary task, and no sample count is a K
D = 8
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _split(n: int, seed: int, missing: float = 0.0) -> Split:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(12, D, generator=torch.Generator().manual_seed(7)) * 1.5
    z = torch.randint(0, 12, (n,), generator=g)  # latent cluster; the tasks are views of it
    x = centers[z] + torch.randn(n, D, generator=g)
    y = torch.stack([z % 3, (z >= 6).long(), z % 4], dim=1)
    flip = torch.rand(n, 3, generator=g) < 0.15
    y = torch.where(flip, torch.stack([torch.randint(0, k, (n,), generator=g) for _, k in TASKS], 1), y)
    if missing:
        y[torch.rand(n, 3, generator=g) < missing] = -1
    return Split(x, y)


def _data(missing: float = 0.0) -> DataSplits:
    return DataSplits(
        train=_split(301, 1, missing),
        val=_split(211, 2, missing),
        test=_split(205, 3, missing),
        num_classes=3,
        input_shape=(D,),
        name="blobs_mtl",
        tasks=TASKS,
    )


@pytest.fixture(scope="module")
def data() -> DataSplits:
    return _data()


def _cfg(**train) -> RunConfig:
    base = dict(epochs=2, batch_size=64, lr=3e-3, lr_schedule="none", calibrator_lr=0.05)
    base.update(train)
    return RunConfig.model_validate(
        {"seed": 0, "device": "cpu", "model": {"name": "mlp", "kwargs": {"hidden_dims": [32]}}, "train": base}
    )


def _state(module: torch.nn.Module) -> list[torch.Tensor]:
    return [v.detach().clone() for v in module.state_dict().values()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------- the model
def test_model_shares_the_backbone_and_has_one_head_per_task():
    torch.manual_seed(0)
    single = create_model("mlp", 3, (D,), hidden_dims=[16])
    torch.manual_seed(0)
    m = MultiTaskClassifier.create("mlp", TASKS, (D,), hidden_dims=[16])
    assert torch.equal(m.heads[0].weight, single.head.weight)  # task 0 starts as the single-task model
    x = torch.randn(5, D)
    out = m(x)
    assert [o.shape for o in out] == [torch.Size([5, k]) for _, k in TASKS]  # binary task: 2 logits
    assert torch.equal(out[1], m.heads[1](m.features(x)))
    assert not any(p is q for p in m.backbone.parameters() for q in m.heads.parameters())


# ---------------------------------------------------------------------------- per-task calibrators
def test_cross_task_calibrator_gradients_are_zero(data):
    tr = MultiTaskTrainer(_cfg(calibrator="vector"), data)
    idx = torch.arange(0, 50)
    inp = tr._cal_inputs(data.train.x[idx])
    y = data.train.y[idx]
    for a in range(3):
        loss_a = masked_cross_entropy(tr.calibrator[a](inp[a]), y[:, a])
        for b in range(3):
            grads = torch.autograd.grad(loss_a, tr.task_cal_params[b], retain_graph=True, allow_unused=True)
            if a == b:
                assert all(g is not None and g.abs().sum() > 0 for g in grads)
            else:
                assert all(g is None or not g.any() for g in grads)


@pytest.mark.parametrize("calibrator", ["vector", "last_layer"])
def test_backbone_loss_is_the_sum_of_masked_per_task_losses(data, calibrator):
    tr = MultiTaskTrainer(_cfg(calibrator=calibrator), data)
    with torch.no_grad():  # move the calibrators off the identity
        for p in tr.cal_params:
            p.add_(0.1 * torch.randn_like(p))
    x, y = data.train.x[:40], data.train.y[:40].clone()
    y[::2, 0] = -1
    y[:, 1] = -1  # a task without labels in the batch contributes 0
    logits = tr.calibrated_model(x)
    ref = sum(torch.nn.functional.cross_entropy(logits[t][y[:, t] >= 0], y[y[:, t] >= 0, t]) for t in (0, 2))
    assert torch.allclose(tr.backbone_loss(x, y), ref)


@pytest.mark.parametrize("calibrator", ["temperature", "last_layer"])
def test_a_task_without_calibrator_labels_keeps_its_calibrator(calibrator):
    """Task b has no label on the calibrator's holdout: its calibrator (with last_layer: its
    head) never moves and never holds a gradient, while the other tasks' calibrators learn."""
    d = _data()
    tr = MultiTaskTrainer(_cfg(calibrator=calibrator), d)
    tr.train_split.y[tr.holdout_idx, 1] = -1  # the trainer's own copy of the labels
    before = [_state(c) for c in tr.calibrator]
    res = tr.fit()
    assert res.status == "completed", res.reason
    after = [_state(c) for c in tr.calibrator]
    assert _same(before[1], after[1])
    assert all(p.grad is None for p in tr.task_cal_params[1])
    assert not any(p in tr.calibrator_opt.state for p in tr.task_cal_params[1])
    assert not _same(before[0], after[0]) and not _same(before[2], after[2])


def test_calibrator_step_moves_only_the_labelled_tasks(data):
    tr = MultiTaskTrainer(_cfg(calibrator="temperature"), data)
    idx = tr.holdout_idx
    tr.train_split = Split(tr.train_split.x, tr.train_split.y.clone())
    tr.train_split.y[idx, 0] = -1
    tr.train_split.y[idx, 2] = -1
    before = [_state(c) for c in tr.calibrator]
    for _ in range(3):
        tr._calibrator_step(idx, 0, 0)
    after = [_state(c) for c in tr.calibrator]
    assert _same(before[0], after[0]) and _same(before[2], after[2]) and not _same(before[1], after[1])


# ---------------------------------------------------------------------------- missing labels
def test_masked_loss_is_zero_without_labels_and_ignores_missing_rows():
    z = torch.randn(6, 3, requires_grad=True)
    none = masked_cross_entropy(z, torch.full((6,), -1))
    assert none.item() == 0.0
    (g,) = torch.autograd.grad(none, z)
    assert torch.isfinite(g).all() and not g.any()
    y = torch.tensor([0, -1, 2, -1, 1, 1])
    keep = y >= 0
    ref = torch.nn.functional.cross_entropy(z[keep], y[keep])
    assert torch.allclose(masked_cross_entropy(z, y), ref)


def test_missing_labels_are_masked_in_training_and_metrics():
    d = _data(missing=0.4)
    d.val.y[:, 2] = torch.where(torch.arange(len(d.val)) % 2 == 0, -1, d.val.y[:, 2])
    res = MultiTaskTrainer(_cfg(calibrator="temperature", calibrator_data="same", batch_size=8), d).fit()
    assert res.status == "completed", res.reason
    assert all(torch.isfinite(torch.tensor(v)) for v in res.val_metrics.values())
    logits = [z.float() for z in res.model.predict_logits(d.val.x)]
    for t, (name, _) in enumerate(TASKS):
        keep = d.val.y[:, t] >= 0
        ref = compute_all(logits[t][keep], d.val.y[keep, t], from_logits=True)
        for k in ("ece", "accuracy", "nll", "brier"):
            assert res.val_metrics[f"{name}_{k}"] == pytest.approx(float(ref[k]), abs=1e-6)
    for k in ("ece", "accuracy", "nll"):
        assert res.val_metrics[k] == pytest.approx(sum(res.val_metrics[f"{n}_{k}"] for n, _ in TASKS) / 3)
    assert res.history[-1]["val_c_ece"] == res.val_metrics["c_ece"]
    # the single-task views: task 0's labelled rows
    keep0 = d.val.y[:, 0] >= 0
    assert res.val_labels.shape == (int(keep0.sum()),) and res.val_probs.shape == (int(keep0.sum()), 3)
    assert [p.shape[1] for p in res.predict_proba(d.val.x)] == [k for _, k in TASKS]


def test_a_task_without_any_label_in_a_split_is_left_out_of_the_means():
    y = torch.tensor([[0, -1], [1, -1], [1, -1]])
    logits = [torch.randn(3, 2), torch.randn(3, 2)]
    m = multitask_metrics(logits, y, (("p", 2), ("q", 2)))
    assert "q_ece" not in m and m["ece"] == m["p_ece"]


# ---------------------------------------------------------------------------- dispatch
def test_make_trainer_dispatches_on_tasks(data):
    assert type(make_trainer(_cfg(), data)) is MultiTaskTrainer
    single = DataSplits(
        train=Split(data.train.x, data.train.y[:, 0]),
        val=Split(data.val.x, data.val.y[:, 0]),
        test=Split(data.test.x, data.test.y[:, 0]),
        num_classes=3,
        input_shape=(D,),
        name="blobs",
    )
    assert type(make_trainer(_cfg(), single)) is Trainer
    with pytest.raises(ValueError, match="multi-task"):
        MultiTaskTrainer(_cfg(), single)
    with pytest.raises(ValueError, match="focal"):
        MultiTaskTrainer(_cfg(method="focal", calibrator="none"), data)


def test_registered_multitask_dataset_trains_end_to_end():
    cfg = RunConfig.model_validate(
        {
            "seed": 0,
            "device": "cpu",
            "data": {"name": "digits_mtl"},
            "model": {"name": "mlp", "kwargs": {"hidden_dims": [16]}},
            "train": {"epochs": 1, "batch_size": 128, "calibrator": "last_layer"},
        }
    )
    from calib_core.data import load_dataset

    d = load_dataset(cfg.data, cfg.seed)
    res = make_trainer(cfg, d).fit()
    assert res.status == "completed"
    assert {"val_ece", "val_digit_ece", "val_prime_accuracy"} <= set(res.history[0])

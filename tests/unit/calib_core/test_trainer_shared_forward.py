"""`calibrator_data: same` on a mode-free backbone reuses the backbone's training forward for the
calibrator's inputs (trainer/modes.py): same numbers, bit for bit, as the separate eval-mode
forward; models whose forward depends on the mode (BatchNorm, dropout, unknown layers) and
augmented batches keep the separate forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calib_core.config import RunConfig
from calib_core.data import DataSplits, Split
from calib_core.models import create_model
from calib_core.models.multitask import MultiTaskClassifier
from calib_core.trainer import MultiTaskTrainer, Trainer
from calib_core.trainer.modes import ModeSwitch, forward_is_mode_free
from tests.resume_harness import crash_then_resume

K, D = 3, 10
TASKS = (("a", 3), ("b", 2))
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _split(n: int, seed: int, tasks: bool = False) -> Split:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(6, D, generator=torch.Generator().manual_seed(5)) * 1.2
    z = torch.randint(0, 6, (n,), generator=g)
    x = centers[z] + torch.randn(n, D, generator=g)
    y = torch.stack([z % 3, (z >= 3).long()], 1) if tasks else z % K
    return Split(x, y)


@pytest.fixture(scope="module")
def data() -> DataSplits:
    return DataSplits(
        train=_split(301, 1), val=_split(211, 2), test=_split(205, 3), num_classes=K, input_shape=(D,), name="blobs"
    )


@pytest.fixture(scope="module")
def mtl_data() -> DataSplits:
    return DataSplits(
        train=_split(301, 1, True),
        val=_split(211, 2, True),
        test=_split(205, 3, True),
        num_classes=3,
        input_shape=(D,),
        name="blobs_mtl",
        tasks=TASKS,
    )


def _cfg(model: str = "mlp", kwargs: dict | None = None, **train) -> RunConfig:
    base = dict(epochs=2, batch_size=64, lr=3e-3, lr_schedule="none", calibrator_lr=0.05, calibrator_data="same")
    base.update(train)
    return RunConfig.model_validate(
        {
            "seed": 0,
            "device": "cpu",
            "model": {"name": model, "kwargs": kwargs or {"hidden_dims": [32, 32]}},
            "train": base,
        }
    )


def _state(t: Trainer) -> list[torch.Tensor]:
    out = list(t.model.state_dict().values())
    if t.calibrator is not None:
        out += list(t.calibrator.state_dict().values())
    return [v.detach().clone() for v in out]


def test_mode_free_models():
    assert forward_is_mode_free(create_model("mlp", K, (D,)))
    assert forward_is_mode_free(create_model("mlp", K, (D,), hidden_dims=()))
    assert not forward_is_mode_free(create_model("mlp", K, (D,), dropout=0.1))
    assert not forward_is_mode_free(create_model("cnn1d", K, (40,)))  # BatchNorm
    assert forward_is_mode_free(MultiTaskClassifier.create("mlp", TASKS, (D,)))

    class Custom(nn.Module):  # may read self.training: not trusted
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, K)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * (2.0 if self.training else 1.0)

    assert not forward_is_mode_free(Custom())
    mlp = create_model("mlp", K, (D,))
    mlp.body.append(Custom())
    assert not forward_is_mode_free(mlp)
    hooked = create_model("mlp", K, (D,))
    torch.nn.utils.spectral_norm(hooked.head)  # a pre-hook that iterates in train mode only
    assert not forward_is_mode_free(hooked)


def test_mode_switch_sets_every_flag_like_train():
    model = create_model("cnn1d", K, (40,), dropout=0.2)
    switch = ModeSwitch(model)
    assert switch.flat
    switch.set(False)
    assert not any(m.training for m in model.modules())
    switch.set(True)
    assert all(m.training for m in model.modules())


@pytest.mark.parametrize(
    "train",
    [
        dict(calibrator="temperature"),
        dict(calibrator="last_layer"),
        dict(calibrator="vector", calibrator_steps=2),
        dict(calibrator="mlp"),
        dict(calibrator="dirichlet", calibrator_kwargs={"lambda_od": 1e-2, "lambda_b": 1e-2}),
        dict(calibrator="temperature", hypergradient="unrolled"),
        dict(calibrator="last_layer", warmup_epochs=1, calibrator_optimizer="sgd", max_grad_norm=0.5),
    ],
)
def test_shared_forward_is_bit_identical_to_the_eval_forward(data, train):
    shared = Trainer(_cfg(**train), data)
    assert shared.shared_forward
    separate = Trainer(_cfg(**train), data)
    separate.shared_forward = False
    shared.trace, separate.trace = [], []
    a, b = shared.fit(), separate.fit()
    assert a.status == b.status == "completed"
    assert all(torch.equal(x, y) for x, y in zip(_state(shared), _state(separate)))
    assert [{k: v for k, v in h.items() if k != "epoch_time"} for h in a.history] == [
        {k: v for k, v in h.items() if k != "epoch_time"} for h in b.history
    ]
    assert [(k, i.tolist()) for k, i in shared.trace] == [(k, i.tolist()) for k, i in separate.trace]


def test_shared_forward_resumes_bit_for_bit(data):
    cfg = _cfg(calibrator="vector", epochs=4)
    full_t = Trainer(cfg, data)
    full = full_t.fit()
    res_t, res, _ = crash_then_resume(lambda: Trainer(cfg, data), crash_after=2)
    assert res_t.shared_forward
    assert all(torch.equal(x, y) for x, y in zip(_state(full_t), _state(res_t)))
    assert res.val_metrics == full.val_metrics


@pytest.mark.parametrize("calibrator", ["temperature", "last_layer"])
def test_shared_forward_multitask_is_bit_identical(mtl_data, calibrator):
    shared = MultiTaskTrainer(_cfg(calibrator=calibrator), mtl_data)
    assert shared.shared_forward
    separate = MultiTaskTrainer(_cfg(calibrator=calibrator), mtl_data)
    separate.shared_forward = False
    shared.fit(), separate.fit()
    assert all(torch.equal(x, y) for x, y in zip(_state(shared), _state(separate)))


@pytest.mark.parametrize(
    "model,kwargs,train",
    [
        ("mlp", {"hidden_dims": [32], "dropout": 0.2}, {}),  # dropout: train and eval forwards differ
        ("cnn1d", {"channels": [4], "kernel_sizes": [3]}, {}),  # BatchNorm
        ("mlp", {"hidden_dims": [32]}, {"calibrator_data": "lookahead"}),
        ("mlp", {"hidden_dims": [32]}, {"calibrator_data": "holdout:0.1"}),
    ],
)
def test_separate_eval_forward_is_kept_where_the_modes_differ(model, kwargs, train):
    split = (lambda n, s: Split(_split(n, s).x[:, :8].clone(), _split(n, s).y)) if model == "cnn1d" else _split
    d = DataSplits(
        train=split(150, 1),
        val=split(90, 2),
        test=split(90, 3),
        num_classes=K,
        input_shape=(8,) if model == "cnn1d" else (D,),
        name="blobs",
    )
    t = Trainer(_cfg(model, kwargs, epochs=1, **train), d)
    assert not t.shared_forward
    assert t.fit().status == "completed"

"""Pretrained weights from a local file (`run.model.weights`, calib_core/models/pretrained.py) and `run.model.freeze`:
state dicts and TorchScript files load exactly, a checkpoint that does not fit is one line (in the library and
before a sweep's first write), a frozen backbone stays as loaded while the head and calibrator train."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calib_core.config import ConfigError, ModelConfig, RunConfig, build_model
from calib_core.data import load_dataset
from calib_core.models import build_model as build_net
from calib_core.models import create_model, load_weights
from calib_core.models.pretrained import read_state_dict
from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"
SHAPE = (30,)


def _mlp(classes: int = 2, hidden: tuple[int, ...] = (16, 8), seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("mlp", classes, SHAPE, hidden_dims=hidden)


def _same(a: torch.nn.Module, b: torch.nn.Module, prefix: str = "") -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if k.startswith(prefix))


def test_a_state_dict_file_loads_exactly(tmp_path):
    src = _mlp(seed=1)
    torch.save(src.state_dict(), tmp_path / "w.pt")
    net = build_net({"name": "mlp", "kwargs": {"hidden_dims": [16, 8]}, "weights": str(tmp_path / "w.pt")}, 2, SHAPE)
    assert _same(net, src)
    assert not _same(_mlp(seed=2), src)  # the load did something
    # a training checkpoint holding it under "state_dict", saved from DataParallel ("module." keys)
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "c.pt")
    assert _same(load_weights(_mlp(seed=3), tmp_path / "c.pt"), src)


def test_a_torchscript_file_loads_exactly(tmp_path):
    src = _mlp(seed=4).eval()
    torch.jit.save(torch.jit.trace(src, torch.zeros(2, *SHAPE)), str(tmp_path / "w.ts"))
    net = build_net({"name": "mlp", "kwargs": {"hidden_dims": [16, 8]}, "weights": str(tmp_path / "w.ts")}, 2, SHAPE)
    assert _same(net, src)
    x = torch.randn(5, *SHAPE)
    assert torch.equal(net.eval()(x), src(x))


def test_a_backbone_checkpoint_without_the_head_loads_and_keeps_a_fresh_head(tmp_path):
    src = _mlp(classes=10, seed=5)
    backbone = {k: v for k, v in src.state_dict().items() if not k.startswith("head.")}
    torch.save(backbone, tmp_path / "b.pt")
    net = load_weights(_mlp(classes=3, seed=6), tmp_path / "b.pt")
    assert all(torch.equal(net.state_dict()[k], v) for k, v in backbone.items())
    assert net.head.weight.shape == (3, 8)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda sd: {k: v for k, v in sd.items() if k != "body.1.weight"}, r"missing keys body\.1\.weight"),
        (lambda sd: {**sd, "extra.weight": torch.zeros(2)}, r"unexpected keys extra\.weight"),
        (lambda sd: _mlp(hidden=(16, 4)).state_dict(), r"body\.3\.weight \(4, 16\) in the file, \(8, 16\)"),
        (
            lambda sd: _mlp(classes=10).state_dict(),
            r"head trained for 10 classes, the data has 2; drop the head's keys",
        ),
    ],
    ids=["missing", "unexpected", "shape", "classes"],
)
def test_a_checkpoint_that_does_not_fit_is_one_line_naming_the_file(tmp_path, make, message):
    torch.save(make(_mlp().state_dict()), tmp_path / "w.pt")
    target = _mlp(seed=9)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=message) as info:
        load_weights(target, tmp_path / "w.pt")
    line = str(info.value)
    assert "\n" not in line and line.startswith("run.model.weights: ") and str(tmp_path / "w.pt") in line
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())  # nothing half-loaded


def test_files_that_are_not_weights_are_refused_safely(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="cannot read .*evil.pt as a state dict") as info:
        read_state_dict(tmp_path / "evil.pt")
    assert "\n" not in str(info.value) and not (tmp_path / "pwned").exists()
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="does not hold a state dict"):
        read_state_dict(tmp_path / "list.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.pt is empty"):
        read_state_dict(tmp_path / "empty.pt")
    with pytest.raises(ValueError, match="does not exist"):
        read_state_dict(tmp_path / "nope.pt")


def test_freeze_head_only_needs_weights_and_takes_no_other_value():
    with pytest.raises(ConfigError, match="freeze 'head_only' needs model.weights"):
        build_model(ModelConfig, {"name": "mlp", "freeze": "head_only"})
    with pytest.raises(ConfigError, match="freeze: Input should be 'none' or 'head_only'"):
        build_model(ModelConfig, {"name": "mlp", "weights": "w.pt", "freeze": "all"})


def _train(tmp_path: Path, freeze: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the loaded model before training, the trained model) of a 3-epoch one-go run on breast_cancer."""
    from calib_core.trainer import Trainer

    src = _mlp(seed=11)
    torch.save(src.state_dict(), tmp_path / "w.pt")
    cfg = RunConfig.model_validate(
        {
            "device": "cpu",
            "data": {"name": "breast_cancer"},
            "model": {"name": "mlp", "kwargs": {"hidden_dims": [16, 8]}, "weights": str(tmp_path / "w.pt")}
            | {"freeze": freeze},
            "train": {"epochs": 3, "batch_size": 32, "calibrator": "temperature", "lr": 0.01},
        }
    )
    data = load_dataset(cfg.data, cfg.seed)
    net = build_net(cfg.model, data.num_classes, data.input_shape)
    result = Trainer(cfg, data, model=net).fit()
    assert result.val_metrics["accuracy"] > 0.5
    return src, net


def test_frozen_backbone_stays_as_loaded_while_the_head_trains(tmp_path):
    src, net = _train(tmp_path, "head_only")
    assert _same(net, src, prefix="body.")
    assert not torch.equal(net.head.weight, src.head.weight)
    assert [n for n, _ in net.named_parameters()] == ["head.weight", "head.bias"]  # the rest are buffers now
    fresh = _mlp(seed=12)  # the exported model is rebuilt unfrozen: the frozen one's state dict loads into it
    fresh.load_state_dict(net.state_dict())
    x = torch.randn(4, *SHAPE)
    assert torch.equal(fresh.eval()(x), net.eval()(x))


def test_fine_tuning_trains_the_loaded_backbone(tmp_path):
    src, net = _train(tmp_path, "none")
    assert not torch.equal(net.state_dict()["body.1.weight"], src.state_dict()["body.1.weight"])
    assert all(p.requires_grad for p in net.parameters())


def test_frozen_batch_norm_keeps_the_loaded_running_statistics():
    from calib_core.models import freeze_backbone

    torch.manual_seed(0)
    net = create_model("cnn2d", 3, (1, 8, 8))
    bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        pytest.skip("cnn2d has no batch norm")
    freeze_backbone(net)
    before = [b.running_mean.clone() for b in bns]
    net.train()(torch.randn(16, 1, 8, 8) * 5 + 3)
    assert all(torch.equal(b.running_mean, m) for b, m in zip(bns, before))


def test_frozen_backbone_computes_in_inference_mode_while_the_head_trains():
    """A linear probe learns on the features it is evaluated on: the frozen batch norms use their running
    statistics in train mode too (a batch's own statistics would give features evaluation never sees)."""
    from calib_core.models import freeze_backbone
    from calib_core.trainer.modes import ModeSwitch

    torch.manual_seed(0)
    net = freeze_backbone(create_model("cnn2d", 3, (1, 8, 8)))
    x = torch.randn(16, 1, 8, 8) * 5 + 3
    with torch.no_grad():
        want = net.eval()(x)
        assert torch.equal(net.train()(x), want) and net.training and net.head.training
        switch = ModeSwitch(net)
        switch.set(True)
        assert torch.equal(net(x), want)
    assert all(not m.training for m in net.modules() if m is not net and m is not net.head)


def test_a_mismatched_checkpoint_stops_the_sweep_before_anything_is_written(tmp_path):
    torch.save(_mlp(classes=10, hidden=(64, 64)).state_dict(), tmp_path / "w.pt")
    (tmp_path / "c.yaml").write_text(
        "name: pre\nrun:\n  data: {name: breast_cancer}\n  model: {name: mlp, kwargs: {hidden_dims: [64, 64]}, "
        "weights: w.pt, freeze: head_only}\n  train: {epochs: 1}\n"
        "search: {num_samples: 1, calibrators: [temperature]}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), "--config", "c.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: run.model.weights: "), proc.stderr
    assert "head trained for 10 classes, the data has 2" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "w.pt"]


def test_the_pre_run_check_accepts_a_fitting_checkpoint_only_where_the_trainer_applies_it(tmp_path):
    """sweeps/checks/model_fit.measure: a checkpoint that fits passes when the trainer's model builder applies
    weights and freeze (calib_core.models.build_model), and is refused in one line when it would train from
    scratch instead."""
    import inspect

    from calib_core.trainer import SingleTask
    from sweeps.checks.model_fit import measure

    torch.save(_mlp(hidden=(64, 64)).state_dict(), tmp_path / "w.pt")
    model = {"name": "mlp", "kwargs": {"hidden_dims": [64, 64]}, "weights": str(tmp_path / "w.pt")}
    answer = measure({**model, "freeze": "head_only"}, "breast_cancer", [], data={"name": "breast_cancer"})
    if "build_model" in inspect.getsource(SingleTask.create_model):
        net = _mlp(hidden=(64, 64))
        # every weight, and the head's alone trained under freeze=head_only (the disk check's optimizer moments)
        assert answer == {
            "params": sum(p.numel() for p in net.parameters()),
            "trainable": sum(p.numel() for p in net.head.parameters()),
        }
    else:
        assert answer["error"].startswith("run.model.weights: this trainer does not apply run.model.weights")


def test_a_frozen_backbone_with_the_last_layer_calibrator_is_refused_in_one_line(tmp_path):
    import pytest

    from calib_core.config import ConfigError
    from sweeps.config import load_sweep_config

    weights = tmp_path / "w.pt"
    weights.write_bytes(b"")  # the schema only names the file; its content is the pre-run check's business
    with pytest.raises((ConfigError, ValueError), match="leaves the backbone player nothing to train"):
        load_sweep_config(
            None,
            [
                f"run.model.weights={weights}",
                "run.model.freeze=head_only",
                "search.calibrators=[temperature,last_layer]",
            ],
        )
    ok = load_sweep_config(
        None, [f"run.model.weights={weights}", "run.model.freeze=head_only", "search.calibrators=[temperature]"]
    )
    assert ok.run.model.freeze == "head_only"


def test_frozen_features_are_computed_once_per_image():
    """A linear probe's backbone is a fixed function: each image's features are computed once (FeatureMemo), and
    what comes back equals a plain forward whatever the batch holds."""
    from calib_core.models import freeze_backbone

    torch.manual_seed(0)
    plain = create_model("cnn2d", 3, (1, 8, 8)).eval()
    net = freeze_backbone(create_model("cnn2d", 3, (1, 8, 8)))
    net.load_state_dict(plain.state_dict())
    x = torch.randn(20, 1, 8, 8)
    memo = net.features
    with torch.no_grad():
        first = net.train()(x[:12])
        assert (memo.computed, memo.hits) == (12, 0)
        again = net(x[torch.tensor([3, 15, 0, 19, 7])])  # three seen rows, two new ones
        assert (memo.computed, memo.hits) == (14, 3)
        torch.testing.assert_close(first, plain(x[:12]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(again, plain(x[torch.tensor([3, 15, 0, 19, 7])]), rtol=1e-5, atol=1e-6)

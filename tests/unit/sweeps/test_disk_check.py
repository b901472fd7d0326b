"""The local disk check before a sweep: epoch checkpoints hold every weight, and Adam's two moments of the trained
ones only (a frozen backbone's weights have none), computed by hand here."""

from __future__ import annotations

from collections import namedtuple

import pytest

from calib_core.config import ConfigError
from sweeps.checks import preflight
from sweeps.checks.model_fit import measure
from sweeps.config import load_sweep_config

Usage = namedtuple("Usage", "total used free")


def test_the_model_check_counts_the_trained_parameters():
    frozen = measure(
        {"name": "torchvision/resnet18", "freeze": "head_only", "weights": "w.pth"}, "cifar10", [], weights=False
    )
    whole = measure({"name": "torchvision/resnet18", "freeze": "none"}, "cifar10", [])
    assert frozen["params"] == whole["params"] == whole["trainable"] > 11_000_000
    assert frozen["trainable"] == 512 * 10 + 10  # resnet18's head on CIFAR-10's 10 classes: weight and bias


@pytest.mark.parametrize(("trainable", "refused"), [(None, True), (5_130, False)])
def test_the_disk_check_counts_moments_of_the_trained_parameters_only(tmp_path, monkeypatch, trainable, refused):
    cfg = load_sweep_config(None, ["run.train.epochs=10"], {"search.num_samples": 4, "storage_path": str(tmp_path)})
    params = 11_181_642
    whole = 4 * 10 * 3 * params * 4  # 40 checkpoints of the weights and two moments of each, float32
    frozen = 4 * 10 * (params + 2 * 5_130) * 4
    monkeypatch.setattr("shutil.disk_usage", lambda p: Usage(10 * whole, 0, (whole + frozen) // 2))
    if refused:
        with pytest.raises(ConfigError, match=r"keep about 5\.0 GiB of checkpoints \(11181642 parameters, 10 per"):
            preflight.check_disk_fits(cfg, params, trainable)
    else:
        preflight.check_disk_fits(cfg, params, trainable)
        monkeypatch.setattr("shutil.disk_usage", lambda p: Usage(10 * whole, 0, frozen - 1))
        with pytest.raises(ConfigError, match=r"11181642 parameters, 5130 of them trained, 10 per trial"):
            preflight.check_disk_fits(cfg, params, trainable)

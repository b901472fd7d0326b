"""A pretrained backbone from a local file, frozen and fine-tuned, through `python sweeps/launch.py` end to end
(issue #34, "one with a fabricated pretrained checkpoint, frozen and fine-tuned").

The checkpoint is fabricated here: a registered `cnn2d` (batch norm in its body) trained for a few steps on the
digits train split and saved with `torch.save(model.state_dict())`, once whole and once without the head's keys.
Two real sweeps on the bundled digits then load it (`run.model.weights`):
- `freeze: head_only` (the whole file, head included): the registered champion's backbone, every weight and every
  batch-norm running statistic, equals the file's exactly, while its head moved away from the file's head;
- `freeze: none` (the backbone file: a fresh head): every backbone weight changed from the file's.
Both champions are loaded back from MLflow (`models:/<name>/<version>`) and predict on raw digits (sklearn's 0..16
pixel values) what their own network gives on the loader's inputs. The network is read from the logged model itself
(its `weights` artifact rebuilt by champion_pyfunc: `unwrap_python_model().module`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.sweep_helpers import ROOT, launch, store, sweep_runs

pytestmark = pytest.mark.slow

DIGITS = ROOT / "sweeps" / "configs" / "digits_demo.yaml"
KWARGS = {"channels": [8, 16]}
SETS = [
    "run.model.name=cnn2d",
    "run.model.kwargs={channels: [8, 16]}",
    "run.train.epochs=3",
    "search.calibrators=[temperature, vector]",  # last_layer would leave a frozen backbone's player nothing
    "search.scheduler=none",
    "resources.max_failures=0",
]


def _checkpoint(d: Path) -> tuple[dict[str, torch.Tensor], Path, Path]:
    """A briefly trained cnn2d's state dict; written whole (full.pt) and without the head (backbone.pt)."""
    from calib_core.config import DataConfig
    from calib_core.data import load_dataset
    from calib_core.models import create_model

    torch.manual_seed(123)  # not the sweep's seed: loaded weights must differ from the trial's own init
    data = load_dataset(DataConfig(name="digits"), 0)
    net = create_model("cnn2d", 10, tuple(data.input_shape), **KWARGS)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    net.train()
    for xb, yb in zip(data.train.x.split(64), data.train.y.split(64)):  # one epoch: features worth probing
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
    sd = {k: v.detach().clone() for k, v in net.state_dict().items()}
    full, backbone = d / "full.pt", d / "backbone.pt"
    torch.save(sd, full)
    torch.save({k: v for k, v in sd.items() if not k.startswith("head.")}, backbone)
    return sd, full, backbone


def _sweep(d: Path, name: str, weights: Path, freeze: str):
    """Run the sweep in `d`; the registered champion's pyfunc model (loaded from the store) and the stdout."""
    import mlflow

    d.mkdir()
    sets = [*SETS, f"run.model.weights={weights}", f"run.model.freeze={freeze}"]
    args = [a for s in sets for a in ("--set", s)]
    proc = launch(d, "--config", str(DIGITS), "--name", name, "--num-samples", "2", *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"Registered: models:/(\S+)@champion \(version (\d+)\)", proc.stdout)
    assert found, proc.stdout[-3000:]
    parents, children = sweep_runs(store(d), name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(r.data.tags.get("calib.status") == "completed" for r in children)
    assert all(r.data.params["model.freeze"] == freeze for r in children)
    mlflow.set_tracking_uri(f"sqlite:///{d.resolve()}/mlflow.db")
    return mlflow.pyfunc.load_model(f"models:/{found.group(1)}/{found.group(2)}"), proc.stdout


def _backbone(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The champion's registered-model state dict by the model's own keys: a CalibratedModel holds it under
    `model.`, wrapped in `inner.` when the champion is a trial with temperature scaling on top."""
    sd = {k.removeprefix("inner."): v for k, v in module.state_dict().items()}
    return {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")}


def _predicts_on_raw_digits(model) -> None:
    """Raw sklearn digits (0..16 pixels, (N, 8, 8)) in: the champion network's probabilities on the loader's
    inputs out, for the test rows as the loader splits them; better than chance."""
    from sklearn.datasets import load_digits

    from calib_core.config import DataConfig
    from calib_core.data import load_dataset
    from calib_core.data.splits import train_val_test_indices

    data = load_dataset(DataConfig(name="digits"), 0)
    bunch = load_digits()
    rows = train_val_test_indices(
        len(bunch.target), val_fraction=0.15, test_fraction=0.15, seed=0, labels=torch.as_tensor(bunch.target)
    )[2].numpy()
    np.testing.assert_array_equal(bunch.target[rows], data.test.y.numpy())  # the same rows, in the same order
    raw = bunch.images[rows].astype(np.float32)[:, None]  # (N, 1, 8, 8): the model's own shape
    got = np.asarray(model.predict(raw))
    py = model.unwrap_python_model()
    with torch.no_grad():
        want = torch.softmax(py.module.eval()(data.test.x).double(), dim=-1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # sklearn's flat float64 rows (N, 64), the other layout the model's description names, through MLflow's predict
    np.testing.assert_allclose(np.asarray(model.predict(bunch.data[rows])), want, atol=1e-6, rtol=0)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-9)
    assert (got.argmax(axis=1) == data.test.y.numpy()).mean() > 0.3  # chance is 0.1


def test_a_pretrained_backbone_frozen_and_fine_tuned(tmp_path):
    ckpt, full, backbone_only = _checkpoint(tmp_path)
    body = [k for k in ckpt if not k.startswith("head.")]
    assert any("running_mean" in k for k in body)  # batch norm: its statistics are part of what stays frozen

    frozen, out = _sweep(tmp_path / "frozen", "e2e-frozen", full, "head_only")
    _predicts_on_raw_digits(frozen)
    got = _backbone(frozen.unwrap_python_model().module)
    assert set(got) == set(ckpt)
    # every weight and running statistic of the body is the file's, bit for bit (num_batches_tracked is only a
    # counter: train-mode batch norm counts batches even at momentum 0, and it feeds nothing at momentum 0)
    unequal = [k for k in body if not k.endswith("num_batches_tracked") and not torch.equal(got[k], ckpt[k])]
    assert not unequal, unequal
    assert not torch.equal(got["head.weight"], ckpt["head.weight"])  # the probe trained the head
    assert not torch.equal(got["head.bias"], ckpt["head.bias"])

    tuned, _ = _sweep(tmp_path / "tuned", "e2e-tuned", backbone_only, "none")
    _predicts_on_raw_digits(tuned)
    got = _backbone(tuned.unwrap_python_model().module)
    assert set(got) == set(ckpt)
    weights = [k for k in body if k.endswith(".weight")]  # convolutions and batch-norm scales
    same = [k for k in weights if torch.equal(got[k], ckpt[k])]
    assert weights and not same, same  # fine-tuning moved every backbone weight

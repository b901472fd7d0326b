"""The user's own pretrained model on the user's own image folder, through `python sweeps/launch.py`, with no code
of theirs (issue #44 item 1): torchvision's and timm's weights files as those libraries save them, frozen and
fine-tuned, and the registered champion predicting on PIL images.

- docs/pretrained.md runs as written (its command is the README's): its Python blocks and its command, in a
  folder holding the user's images
  (fabricated: three classes of distinct colours, PNG and JPEG, of several sizes, one grey; 30 a class, so
  that the validation split's accuracy interval can clear the majority class's rate and the champion is
  registered as `@champion`);
- torchvision ResNet-18 fine-tuned and timm ResNet-18 (.safetensors) frozen and fine-tuned, at 64 px to keep the
  tier short: the frozen champion's backbone is the file's, tensor for tensor; a fine-tuned one moved from the
  file, and stayed at most half as far from it as a fresh draw at its scale is (it started from the file).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.sweep_helpers import ROOT, launch

pytestmark = pytest.mark.slow
DOC = ROOT / "docs" / "pretrained.md"
CONFIG = ROOT / "sweeps" / "configs" / "pretrained_image_folder.yaml"
CLASSES = ("cat", "dog", "fox")


def _images(root: Path, per_class: int = 30) -> list[Path]:
    """An image folder as a user has one: one sub-folder per class, PNG and JPEG of several sizes, one grey."""
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for k, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            h, w = 40 + 4 * (i % 3), 48 + 2 * (i % 4)
            colour = np.zeros(3)
            colour[k] = 200.0
            a = np.clip(colour + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
            img = Image.fromarray(a).convert("L") if (k, i) == (0, 0) else Image.fromarray(a)
            f = root / name / f"{i:03d}.{'jpg' if i % 2 else 'png'}"
            img.save(f)
            files.append(f)
    return files


def _blocks(text: str, lang: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)]


def test_docs_pretrained_walkthrough_runs_as_written(tmp_path):
    _images(tmp_path / "pets")
    text = DOC.read_text()
    save, predict = _blocks(text, "python")
    commands = [re.sub(r"\\\n\s*", " ", b).strip() for b in _blocks(text, "bash")]
    assert len(commands) == 1 and commands[0].startswith("python sweeps/launch.py --config ")
    # the README's pretrained command is this one, so running it runs the README's as written
    readme = re.sub(r"\\\n\s*", " ", (ROOT / "README.md").read_text())
    assert commands[0] in readme
    (tmp_path / "save_weights.py").write_text(save)
    (tmp_path / "predict.py").write_text(predict)
    proc = subprocess.run([sys.executable, "save_weights.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    args = shlex.split(commands[0])[2:]  # after `python sweeps/launch.py`: the config path from the repository
    args[args.index("--config") + 1] = str(CONFIG)
    proc = launch(tmp_path, *args, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Registered: models:/pets@champion" in proc.stdout, proc.stdout[-3000:]
    out = subprocess.run([sys.executable, "predict.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "(4, 3) [1. 1. 1. 1.]", out.stdout


def _weights(tmp_path: Path, library: str) -> tuple[dict[str, torch.Tensor], Path, str]:
    """A randomly initialised ResNet-18 of `library`, saved as that library's users save it."""
    torch.manual_seed(11)
    if library == "torchvision":
        import torchvision

        sd = torchvision.models.resnet18(weights=None).state_dict()
        path = tmp_path / "resnet18.pth"
        torch.save(sd, path)
        return sd, path, "torchvision/resnet18"
    import timm
    from safetensors.torch import save_file

    sd = timm.create_model("resnet18", pretrained=False).state_dict()
    path = tmp_path / "resnet18.safetensors"
    save_file(sd, str(path))
    return sd, path, "timm/resnet18"


@pytest.mark.parametrize(
    "library,freeze", [("torchvision", "none"), ("timm", "head_only"), ("timm", "none")], ids=lambda v: str(v)
)
def test_library_weights_frozen_and_fine_tuned(tmp_path, library, freeze):
    import mlflow
    from PIL import Image

    files = _images(tmp_path / "pets", per_class=12)  # any alias will do here: the backbone is what is checked
    sd, path, name = _weights(tmp_path, library)
    proc = launch(
        tmp_path,
        *("--config", str(CONFIG), "--model-name", "pets", "--num-samples", "2"),
        *("--set", "run.data.path=pets", "--set", f"run.model.weights={path.name}", "--set", f"run.model.name={name}"),
        *("--set", f"run.model.freeze={freeze}", "--set", "run.data.image_size=64", "--set", "run.train.epochs=3"),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    found = re.search(r"Registered: models:/pets@(\S+) \(version (\d+)\)", proc.stdout)
    assert found, proc.stdout[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    champion = mlflow.pyfunc.load_model(f"models:/pets/{found.group(2)}")
    probs = np.asarray(champion.predict([Image.open(f) for f in files[:5]]))
    assert probs.shape == (5, 3) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    # a CalibratedModel holds the backbone under `model.`, wrapped in `inner.` for a champion with TS on top
    own = {k.removeprefix("inner."): v for k, v in champion.unwrap_python_model().module.state_dict().items()}
    body = {k.removeprefix("model.body."): v for k, v in own.items() if k.startswith("model.body.")}
    file_body = {k: v for k, v in sd.items() if k in body}
    assert set(file_body) == set(body) and len(body) > 100
    if freeze == "head_only":
        assert all(torch.equal(body[k], v) for k, v in file_body.items())
        return
    weights = [k for k in body if k.endswith(".weight") and body[k].dim() == 4]
    moved = sum(float((body[k] - file_body[k]).norm()) for k in weights)
    torch.manual_seed(12345)  # a fresh draw at the file's scale: how far a backbone that did not start there is
    reference = sum(float((torch.randn_like(file_body[k]) * file_body[k].std() - file_body[k]).norm()) for k in weights)
    assert 0 < moved < 0.5 * reference, (moved, reference)  # fine-tuned at lr 0.01 it moved 0.23 of it here

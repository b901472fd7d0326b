"""torchvision/<arch> and timm/<arch> backbones from the library's own weights file (calib_core/models/library.py).

The references are the libraries themselves: a randomly initialised torchvision or timm model is saved the way
that library saves it, and the backbone built from the file must hold exactly the file's tensors; the input size
and normalisation are the values torchvision's and timm's documentation give for those architectures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from calib_core.config import RunConfig
from calib_core.models import build_model, create_model
from calib_core.models.classifier import Classifier

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")


def _tv_file(tmp_path: Path, arch: str = "resnet18") -> tuple[dict[str, torch.Tensor], Path]:
    torch.manual_seed(7)
    sd = getattr(torchvision.models, arch)(weights=None).state_dict()
    path = tmp_path / f"{arch}.pth"
    torch.save(sd, path)
    return sd, path


def test_torchvision_file_loads_exactly_and_the_head_is_new(tmp_path):
    sd, path = _tv_file(tmp_path)
    net = build_model({"name": "torchvision/resnet18", "weights": str(path)}, 5, (3, 64, 64))
    assert isinstance(net, Classifier) and net.feature_dim == 512 and net.head.out_features == 5
    own = net.state_dict()
    body = {k: v for k, v in sd.items() if not k.startswith("fc.")}
    assert all(torch.equal(own["body." + k], v) for k, v in body.items())
    assert {k for k in own if k.startswith("body.")} == {"body." + k for k in body}
    # features are torchvision's own penultimate output: the file's model without its fc layer
    ref = torchvision.models.resnet18(weights=None)
    ref.load_state_dict(sd)
    ref.fc = torch.nn.Identity()
    x = torch.randn(3, 3, 64, 64)
    net.eval(), ref.eval()  # a forward in train mode would move the batch norms' running statistics
    with torch.no_grad():
        assert torch.allclose(net.features(x), ref(x), atol=1e-6)
        assert net(x).shape == (3, 5)


def test_frozen_backbone_trains_head_only(tmp_path):
    _, path = _tv_file(tmp_path)
    net = build_model({"name": "torchvision/resnet18", "weights": str(path), "freeze": "head_only"}, 3, (3, 32, 32))
    assert [n for n, _ in net.named_parameters()] == ["head.weight", "head.bias"]


def test_timm_pth_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    src = timm.create_model("resnet18", pretrained=False)
    sd = src.state_dict()
    torch.save(sd, tmp_path / "t.pth")
    save_file(sd, str(tmp_path / "t.safetensors"))
    for f in ("t.pth", "t.safetensors"):
        net = build_model({"name": "timm/resnet18", "weights": str(tmp_path / f)}, 4, (3, 48, 48))
        own = net.state_dict()
        assert all(torch.equal(own["body." + k], v) for k, v in sd.items() if not k.startswith("fc."))
        assert net.head.out_features == 4 and net.feature_dim == src.num_features


def test_features_of_other_heads():
    # heads at other places: Sequential classifiers, a transformer's heads.head, auxiliary classifiers off
    for arch, dim, side in (("mobilenet_v3_small", 1024, 64), ("googlenet", 1024, 64), ("vit_b_16", 768, 224)):
        net = create_model(f"torchvision/{arch}", 3, (3, side, side)).eval()
        assert net.feature_dim == dim
        with torch.no_grad():
            assert net(torch.zeros(1, 3, side, side)).shape == (1, 3)


def test_refusals_are_one_line_with_their_advice_whole(tmp_path):
    _, path = _tv_file(tmp_path)
    with pytest.raises(ValueError) as exc:
        build_model({"name": "torchvision/resnet34", "weights": str(path)}, 5, (3, 64, 64))
    msg = str(exc.value)
    assert "\n" not in msg and "…" not in msg
    assert msg.endswith("save it with torch.save(model.state_dict(), path) from the same architecture")
    assert "missing layer1.2.conv1.weight" in msg  # resnet34 has 3 blocks in layer1, resnet18 two
    with pytest.raises(ValueError, match=r"did you mean resnet18"):
        create_model("torchvision/resnet19", 3, (3, 32, 32))
    with pytest.raises(ValueError, match=r"no linear classification head"):
        create_model("torchvision/squeezenet1_0", 3, (3, 64, 64))
    with pytest.raises(ValueError, match=r"takes 3-channel images"):
        create_model("torchvision/resnet18", 3, (1, 32, 32))
    with pytest.raises(ValueError, match=r"run.model.kwargs"):
        create_model("timm/resnet18", 3, (3, 32, 32), no_such_option=1)


def test_image_folder_takes_the_weights_input(tmp_path):
    raw = {
        "data": {"name": "image_folder", "path": str(tmp_path)},
        "model": {"name": "torchvision/inception_v3"},
    }
    cfg = RunConfig.model_validate(raw)
    # torchvision's Inception v3 weights: 299 px crops, ImageNet's mean and std (torchvision docs)
    assert cfg.data.image_size == (299, 299) and cfg.data.normalize == "model"
    assert cfg.data.mean == (0.485, 0.456, 0.406) and cfg.data.std == (0.229, 0.224, 0.225)
    assert RunConfig.model_validate(cfg.model_dump()).data == cfg.data  # a dumped config resolves the same
    vit = RunConfig.model_validate({**raw, "model": {"name": "timm/vit_tiny_patch16_224"}}).data
    assert (vit.image_size, vit.mean, vit.std) == ((224, 224), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    own = RunConfig.model_validate({**raw, "data": {**raw["data"], "normalize": "train", "image_size": 64}}).data
    assert (own.normalize, own.image_size, own.mean) == ("train", 64, None)  # what the user set stays
    with pytest.raises(ValueError, match=r"image_mode 'L'.*3-channel"):
        RunConfig.model_validate({**raw, "data": {**raw["data"], "image_mode": "L"}})
    with pytest.raises(ValueError, match=r"normalize 'model' needs data.mean"):
        RunConfig.model_validate({"data": {"name": "image_folder", "path": str(tmp_path), "normalize": "model"}})


def test_exported_spec_rebuilds_the_library_model(tmp_path):
    from calib_core.calibrators import create_calibrator
    from calib_core.export import build_calibrated_model, load_calibrated_model, model_spec
    from calib_core.trainer.result import CalibratedModel

    _, path = _tv_file(tmp_path)
    run = RunConfig.model_validate({"model": {"name": "torchvision/resnet18", "weights": str(path)}})
    backbone = build_model(run.model, 3, (3, 32, 32))
    module = CalibratedModel(backbone, create_calibrator("temperature", 3)).eval()
    spec = model_spec(module, run.model_dump(mode="json"), (3, 32, 32))
    again = load_calibrated_model(spec, module.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(again(x), module(x))
    assert type(build_calibrated_model(spec).model).__name__ == "LibraryBackbone"

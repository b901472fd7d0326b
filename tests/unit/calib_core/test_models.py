"""Model registry and backbones: shapes, the features/head contract, isinstance, errors, sizes."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from calib_core.models import (
    CNN1D,
    CNN2D,
    MLP,
    Classifier,
    ResNet18,
    ResNet34,
    ResNet50,
    ViT,
    WideResNet,
    create_model,
    get_model_class,
    list_models,
    register_model,
)
from calib_core.registry import MODELS

N, K = 5, 7  # N != K so a transposed output cannot pass

# name, input_shape, tiny kwargs (fast on 2 shared cores), expected class
CASES = [
    ("mlp", (40,), {"hidden_dims": (16, 8)}, MLP),
    ("mlp", (1, 8, 8), {}, MLP),
    ("cnn1d", (40,), {}, CNN1D),
    ("cnn1d", (2, 40), {"channels": (4, 8), "kernel_sizes": (5, 3)}, CNN1D),
    ("cnn2d", (1, 8, 8), {}, CNN2D),
    ("cnn2d", (3, 32, 32), {"channels": (4, 8)}, CNN2D),
    ("resnet18", (3, 8, 8), {"base_width": 4}, ResNet18),
    ("resnet34", (3, 8, 8), {"base_width": 4}, ResNet34),
    ("resnet50", (3, 8, 8), {"base_width": 4}, ResNet50),
    ("wrn28_10", (3, 8, 8), {"depth": 10, "width": 1}, WideResNet),
    ("vit_small", (3, 8, 8), {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2}, ViT),
    ("vit_small", (1, 8, 8), {"patch_size": 2, "embed_dim": 8, "depth": 2, "num_heads": 2}, ViT),
]


def test_config_accepts_exactly_the_registered_models():
    """Model names come from the registry (no list in calib_core/config.py to keep in step)."""
    from calib_core.config import ConfigError
    from calib_core.plugins import build_run_config

    for name in list_models():
        assert build_run_config({"model": {"name": name}}).model.name == name
    with pytest.raises(ConfigError, match="model.name: unknown model 'resnet9'; registered: cnn1d, cnn2d"):
        build_run_config({"model": {"name": "resnet9"}})
    assert list_models() == sorted(list_models())


@pytest.mark.parametrize("name,shape,kwargs,cls", CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}" for c in CASES])
def test_forward_features_head_contract(name, shape, kwargs, cls):
    torch.manual_seed(0)
    model = create_model(name, K, shape, **kwargs)
    assert type(model) is cls and isinstance(model, get_model_class(name)) and isinstance(model, Classifier)
    assert model.num_classes == K and model.input_shape == shape
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (model.feature_dim, K)
    model.eval()
    x = torch.randn(N, *shape)
    with torch.no_grad():
        logits = model(x)
        feats = model.features(x)
        assert logits.shape == (N, K) and logits.dtype == torch.float32
        assert feats.shape == (N, model.feature_dim)
        torch.testing.assert_close(logits, model.head(feats), rtol=0, atol=0)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name,shape,kwargs", [(c[0], c[1], c[2]) for c in CASES[::2]])
def test_backward_reaches_every_parameter(name, shape, kwargs):
    torch.manual_seed(0)
    model = create_model(name, K, shape, **kwargs).train()
    loss = nn.functional.cross_entropy(model(torch.randn(N, *shape)), torch.arange(N) % K)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_cnn1d_accepts_flat_and_channel_inputs():
    model = create_model("cnn1d", K, (40,)).eval()
    x = torch.randn(N, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x.unsqueeze(1)), rtol=0, atol=0)
    assert model.feature_dim == 64 * 5


def test_same_seed_same_weights():
    torch.manual_seed(3)
    a = create_model("cnn2d", K, (1, 8, 8))
    torch.manual_seed(3)
    b = create_model("cnn2d", K, (1, 8, 8))
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), na


@pytest.mark.parametrize(
    "name,expected",
    [
        ("resnet18", 11_173_962),  # ~11.2M, the usual CIFAR ResNet-18
        ("resnet34", 21_282_122),
        ("resnet50", 23_520_842),
        ("wrn28_10", 36_479_194),  # ~36.5M, Zagoruyko & Komodakis
    ],
)
def test_parameter_counts_of_full_size_models(name, expected):
    # built on the meta device: real architecture, no memory, no forward pass
    with torch.device("meta"):
        model = create_model(name, 10, (3, 32, 32))
    assert model.num_parameters() == expected


def test_full_size_feature_dims():
    with torch.device("meta"):
        dims = {
            n: create_model(n, 10, (3, 32, 32)).feature_dim for n in ("resnet18", "resnet50", "wrn28_10", "vit_small")
        }
    assert dims == {"resnet18": 512, "resnet50": 2048, "wrn28_10": 640, "vit_small": 192}


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError) as e:
        create_model("resnet9000", 10, (3, 32, 32))
    msg = str(e.value)
    assert "resnet9000" in msg and all(n in msg for n in list_models())


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, "10", True, None])
def test_bad_num_classes(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        create_model("mlp", bad, (40,))


@pytest.mark.parametrize("bad", [(), (0,), (3, -1, 8), (3, 8.0, 8), "abc", 40, None])
def test_bad_input_shape(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        create_model("mlp", 10, bad)


@pytest.mark.parametrize(
    "name,shape",
    [("cnn2d", (40,)), ("resnet18", (1, 40)), ("wrn28_10", (40,)), ("vit_small", (40,)), ("cnn1d", (3, 32, 32))],
)
def test_wrong_input_rank_is_named(name, shape):
    with pytest.raises(ValueError, match=re.escape(repr(shape))):
        create_model(name, 10, shape)


@pytest.mark.parametrize(
    "name,shape,kwargs,pattern",
    [
        ("mlp", (40,), {"hidden": 3}, r"unknown keyword.*hidden.*hidden_dims"),
        ("wrn28_10", (3, 8, 8), {"depth": 27}, r"depth.*27"),
        ("vit_small", (3, 30, 30), {}, r"patch_size.*30x30"),
        ("vit_small", (3, 8, 8), {"embed_dim": 10, "num_heads": 3}, r"embed_dim"),
        ("cnn1d", (40,), {"channels": (4, 4), "kernel_sizes": (3,)}, r"equal length"),
        ("cnn2d", (1, 8, 8), {"channels": ()}, r"channels"),
        ("resnet18", (3, 8, 8), {"base_width": 0}, r"base_width.*0"),
        ("mlp", (40,), {"dropout": 1.5}, r"dropout.*1.5"),
    ],
)
def test_bad_kwargs(name, shape, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        create_model(name, 10, shape, **kwargs)


def test_register_model_returns_class_and_refuses_duplicates():

    class Tiny(Classifier):
        def __init__(self, num_classes, input_shape):
            super().__init__(num_classes, input_shape)
            self._make_head(int(torch.tensor(input_shape).prod()))

        def features(self, x):
            return x.flatten(1)

    try:
        assert register_model("_tiny_test")(Tiny) is Tiny
        m = create_model("_tiny_test", 3, (2, 2))
        assert type(m) is Tiny and m(torch.randn(N, 2, 2)).shape == (N, 3)
        with pytest.raises(ValueError, match="already registered"):
            register_model("mlp")(Tiny)
        with pytest.raises(TypeError):
            register_model("_not_a_classifier")(nn.Linear)
    finally:
        MODELS.remove("_tiny_test")
    assert "_tiny_test" not in list_models()

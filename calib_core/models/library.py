"""Backbones from torchvision and timm by name: `run.model.name: torchvision/resnet50` or `timm/convnext_atto`.

    run:
      model: {name: torchvision/resnet18, weights: /models/resnet18.pth, freeze: head_only}

The library builds its own architecture with no weights (nothing is downloaded: torchvision's `weights=None`,
timm's `pretrained=False`); its classification head is taken off, and a fresh `head` (nn.Linear, feature_dim -> K)
takes its place, so the model is a `Classifier` like every other: `features(x)` is the library's pooled
penultimate output, and the `last_layer` and `mlp` calibrators work on it. `run.model.kwargs` go to the library's
builder (torchvision.models.get_model / timm.create_model), e.g. `{drop_rate: 0.1}` for timm.

A weights file is read as the library saves it (calib_core/models/pretrained.py reads the tensors: torchvision's
`torch.save(model.state_dict())` .pth, timm's .pth or .safetensors) and mapped here (`adapt_state_dict`): every
tensor of the architecture but its head must be in the file with its shape; the library's head is dropped (the
model's head is always new, for the data's K classes and in the data's class order); auxiliary classifiers
(GoogLeNet, Inception v3) are dropped too. A file already in this model's own layout (`body.*`, `head.*`: a
state dict of a trained model of ours) loads as it is, head included.

`input_spec(name)` is the input the library's weights expect: the size (torchvision's crop size of the
architecture's default weights, timm's `pretrained_cfg.input_size`) and the per-channel mean/std. With an
`image_folder` dataset they become the data's defaults (calib_core.config.RunConfig), so training and the
exported champion resize and normalise as the weights were trained.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor, nn

from calib_core.models.classifier import Classifier, check_input_shape
from calib_core.registry import split_library_name as split_name

FIELD = "run.model.name"
# torchvision builders that add auxiliary classifiers by default (their outputs are not logits alone)
_AUX = {"googlenet": ("aux1.", "aux2."), "inception_v3": ("AuxLogits.",)}


def _unknown(library: str, arch: str, names: list[str]) -> ValueError:
    close = difflib.get_close_matches(arch, names, n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    lister = (
        "torchvision.models.list_models(module=torchvision.models)"
        if library == "torchvision"
        else "timm.list_models()"
    )
    return ValueError(
        f"{FIELD}: {library} has no classification architecture {arch!r}{hint} ({len(names)} in {lister})"
    )


@dataclass(frozen=True)
class InputSpec:
    """What the library's weights of an architecture expect: (height, width) and per-channel mean and std."""

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@lru_cache(maxsize=32)
def input_spec(name: str) -> InputSpec:
    """The input size and normalisation the library's default weights of `name` were trained with."""
    parts = split_name(name)
    if parts is None:
        raise ValueError(f"{FIELD}: {name!r} is not a torchvision/ or timm/ name")
    library, arch = parts
    if library == "torchvision":
        import torchvision.models as tvm

        names = tvm.list_models(module=tvm)
        if arch not in names:
            raise _unknown(library, arch, names)
        t = tvm.get_model_weights(arch).DEFAULT.transforms()
        crop = int(t.crop_size[0])
        return InputSpec((crop, crop), _three(t.mean), _three(t.std))
    import timm

    if not timm.is_model(arch):
        raise _unknown(library, arch, timm.list_models())
    cfg = timm.get_pretrained_cfg(arch)
    if cfg is None:  # an architecture with no published weights: timm's defaults
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        return InputSpec((224, 224), _three(IMAGENET_DEFAULT_MEAN), _three(IMAGENET_DEFAULT_STD))
    _, h, w = cfg.input_size
    return InputSpec((int(h), int(w)), _three(cfg.mean), _three(cfg.std))


def _three(v: Any) -> tuple[float, float, float]:
    a, b, c = (float(x) for x in v)
    return a, b, c


def _torchvision_body(arch: str, kwargs: dict[str, Any]) -> tuple[nn.Module, str, int]:
    """torchvision's `arch` without weights and with its head replaced by nn.Identity: (body, head prefix, dim)."""
    import torchvision.models as tvm

    names = tvm.list_models(module=tvm)
    if arch not in names:
        raise _unknown("torchvision", arch, names)
    if arch in _AUX:
        kwargs = {"aux_logits": False, "init_weights": True, **kwargs}
    try:
        body = tvm.get_model(arch, weights=None, **kwargs)
    except TypeError as exc:
        raise ValueError(f"run.model.kwargs: torchvision/{arch} refused them: {' '.join(str(exc).split())}") from None
    out = int(getattr(body, "num_classes", 1000))
    heads = [(n, m) for n, m in body.named_modules() if isinstance(m, nn.Linear) and m.out_features == out]
    if not heads:
        raise ValueError(
            f"{FIELD}: torchvision/{arch} has no linear classification head (a convolutional head, as in "
            "SqueezeNet); choose another architecture"
        )
    qual, head = heads[-1]
    parent_name, _, attr = qual.rpartition(".")
    setattr(body.get_submodule(parent_name) if parent_name else body, attr, nn.Identity())
    return body, qual + ".", int(head.in_features)


def _timm_body(arch: str, kwargs: dict[str, Any]) -> tuple[nn.Module, str | tuple[str, ...], int]:
    """timm's `arch` without weights and without its classifier: (body, classifier prefix(es), feature dim)."""
    import timm

    if not timm.is_model(arch):
        raise _unknown("timm", arch, timm.list_models())
    try:
        body = timm.create_model(arch, pretrained=False, num_classes=0, **kwargs)
    except TypeError as exc:
        raise ValueError(f"run.model.kwargs: timm/{arch} refused them: {' '.join(str(exc).split())}") from None
    cfg: dict[str, Any] = dict(getattr(body, "pretrained_cfg", None) or {})
    classifier = cfg.get("classifier") or "head"
    prefixes = tuple(c + "." for c in ((classifier,) if isinstance(classifier, str) else classifier))
    dim: Any = getattr(body, "head_hidden_size", None) or getattr(body, "num_features", 0)
    return body, prefixes, int(dim)


class LibraryBackbone(Classifier):
    """A torchvision or timm architecture (its head off) under a fresh `head` for the data's classes."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...], *, name: str, **kwargs: Any) -> None:
        super().__init__(num_classes, input_shape)
        parts = split_name(name)
        if parts is None:
            raise ValueError(f"{FIELD}: {name!r} is not a torchvision/ or timm/ name")
        library, arch = parts
        shape = check_input_shape(input_shape, ndims=(3,), model=name)
        if shape[0] != 3:
            raise ValueError(
                f"{FIELD}: {name} takes 3-channel images, the data has {shape[0]} (for an image folder set "
                "run.data.image_mode: RGB; grey images become 3 equal channels)"
            )
        self.model_name = name
        builder = _torchvision_body if library == "torchvision" else _timm_body
        body, prefixes, dim = builder(arch, dict(kwargs))
        self.body = body
        self._library_head = (prefixes,) if isinstance(prefixes, str) else prefixes
        self._drop = _AUX.get(arch, ()) if library == "torchvision" else ()
        self._make_head(dim)

    def features(self, x: Tensor) -> Tensor:
        """The library's pooled penultimate output, (N, feature_dim)."""
        out = self.body(x)
        return out if out.dim() == 2 else torch.flatten(out, 1)

    def adapt_state_dict(self, sd: dict[str, Tensor], source: str) -> dict[str, Tensor]:
        """The library's state dict (as it saves it) in this model's layout: body.* for the architecture, the
        library's head and auxiliary classifiers dropped; missing or unknown keys one ValueError line."""
        if all(k.startswith(("body.", "head.")) for k in sd):
            return dict(sd)
        order = list(self.body.state_dict())
        own = set(order)
        dropped = self._library_head + self._drop
        unexpected = [k for k in sd if k not in own and not k.startswith(dropped)]
        missing = [k for k in order if k not in sd]
        if unexpected or missing:
            parts = ([f"missing {_some(missing)}"] if missing else []) + (
                [f"not in the architecture {_some(unexpected)}"] if unexpected else []
            )
            raise ValueError(
                f"run.model.weights: {source} is not a {self.model_name} state dict ({'; '.join(parts)}); save it "
                f"with torch.save(model.state_dict(), path) from the same architecture"
            )
        return {"body." + k: v for k, v in sd.items() if k in own}


def _some(keys: list[str], limit: int = 3) -> str:
    shown = ", ".join(k if len(k) <= 60 else k[:57] + "..." for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")

"""Pretrained weights from a local file (`run.model.weights`) and a frozen backbone (`run.model.freeze`).

    run:
      model: {name: resnet18, weights: /models/resnet18_pets.pt, freeze: head_only}

The file is read on the CPU, nothing is downloaded:
- a state dict saved with `torch.save(model.state_dict(), path)` (read with `torch.load(weights_only=True)`, which
  refuses pickled code); a checkpoint dict holding it under "state_dict" or "model" is accepted, and a
  "module." prefix (DataParallel, DDP) is removed;
- a TorchScript file (`torch.jit.save(torch.jit.script(model), path)`), read with `torch.jit.load`; its
  parameters and buffers are the state dict;
- a safetensors file (`safetensors.torch.save_file(model.state_dict(), path)`, timm's and Hugging Face's format),
  read with `safetensors.torch.load_file` (tensors only, by design).

A torchvision or timm architecture (`run.model.name: torchvision/<arch>`, `timm/<arch>`) takes the file as that
library saves it; calib_core/models/library.py maps its keys (`LibraryBackbone.adapt_state_dict`).

The keys must be the model's: a missing key, an unexpected key or a shape that differs is a ValueError of one
line naming the file, the keys and the shapes, before anything is loaded. The head's keys (`head.weight`,
`head.bias`) may be absent (a backbone checkpoint: the head starts fresh); present with another class count they
are refused ("trained for 10 classes, the data has 3"), saying how to drop them.

`freeze: head_only` (a linear probe with the one-go calibrator on top) turns every parameter outside `model.head`
into a buffer of the same name (same state-dict keys, so checkpoints and the exported model load as before; the
trainer's optimizers see the head only) and keeps every module outside it in inference mode, whatever mode the
model is put in: batch norms normalise with the file's running statistics and leave them as they are, dropout is
off. The head then learns on the features it is evaluated on (a linear probe on fixed features); in train mode a
frozen batch norm would otherwise normalise each batch with that batch's statistics, features the evaluation never
sees (on a small batch of a small dataset, far from them). Being a fixed function, the backbone's features are
computed once per image (calib_core/models/feature_memo.py).
With the `last_layer` calibrator the head is the calibrator's, so nothing is left for the backbone player: use
another calibrator (temperature, vector, matrix, dirichlet) with a frozen backbone;
`freeze: none` fine-tunes everything (`train.lr` for the backbone, `train.head_lr` for the head).
"""

from __future__ import annotations

import types
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from calib_core.models.registry import create_model

HEAD_PREFIX = "head."
FIELD = "run.model.weights"


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _some(keys: list[str], limit: int = 3) -> str:
    """At most `limit` keys, each at most 60 characters: the list is shortened so the advice after it stays whole."""
    shown = ", ".join(k if len(k) <= 60 else k[:57] + "..." for k in keys[:limit])
    return shown + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def _is_safetensors(path: Path) -> bool:
    """A safetensors file starts with an 8-byte little-endian header length and a JSON header."""
    if path.suffix == ".safetensors":
        return True
    with path.open("rb") as fh:
        head = fh.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < path.stat().st_size


def _is_torchscript(path: Path) -> bool:
    """A TorchScript archive holds code/ and constants.pkl; a torch.save file holds data.pkl only."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any(n.split("/", 1)[-1].startswith("code/") for n in names) and any(
        n.endswith("constants.pkl") for n in names
    )


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a weights file (module docstring); ValueError of one line naming the file otherwise."""
    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise ValueError(f"{FIELD}: {p} does not exist")
    if not p.is_file():
        raise ValueError(f"{FIELD}: {p} is not a file")
    if p.stat().st_size == 0:
        raise ValueError(f"{FIELD}: {p} is empty")
    obj: Any
    try:
        if _is_torchscript(p):
            obj = torch.jit.load(str(p), map_location="cpu").state_dict()
        elif _is_safetensors(p):
            from safetensors.torch import load_file

            obj = load_file(str(p), device="cpu")
        else:
            obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling and archive errors come in many types
        first = " ".join(str(exc).split())[:160]
        raise ValueError(
            f"{FIELD}: cannot read {p} as a state dict (torch.save, weights_only), safetensors or TorchScript "
            f"file ({type(exc).__name__}: {first})"
        ) from None
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(
            f"{FIELD}: {p} does not hold a state dict (a mapping of parameter names to tensors; "
            f"got {type(obj).__name__})"
        )
    sd = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in sd):
        sd = {k.removeprefix("module."): v for k, v in sd.items()}
    return sd


def check_state_dict(model: nn.Module, sd: Mapping[str, Tensor], source: str) -> None:
    """ValueError (one line) when `sd` does not fit `model`: missing or unexpected keys, shapes, class count."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd and not k.startswith(HEAD_PREFIX)]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = ([f"missing keys {_some(missing)}"] if missing else []) + (
            [f"unexpected keys {_some(unexpected)}"] if unexpected else []
        )
        raise ValueError(
            f"{FIELD}: {source} does not fit model {getattr(model, 'model_name', type(model).__name__)!r}: "
            f"{'; '.join(parts)} (is it a checkpoint of this architecture and these run.model.kwargs?)"
        )
    head_w = sd.get(HEAD_PREFIX + "weight")
    own_w = own.get(HEAD_PREFIX + "weight")
    if head_w is not None and own_w is not None and head_w.dim() == 2 and head_w.shape[0] != own_w.shape[0]:
        raise ValueError(
            f"{FIELD}: {source} has a head trained for {head_w.shape[0]} classes, the data has {own_w.shape[0]}; "
            "drop the head's keys (head.weight, head.bias) from the file to train a new head"
        )
    wrong = [
        f"{k} {_shape(sd[k])} in the file, {_shape(own[k])} in the model" for k in sd if sd[k].shape != own[k].shape
    ]
    if wrong:
        raise ValueError(f"{FIELD}: {source} has tensors of other shapes than the model: {_some(wrong, 3)}")


def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Load the weights file into `model` (in place, checked first) and return it."""
    sd = read_state_dict(path)
    source = str(Path(path).expanduser().absolute())
    adapt = getattr(model, "adapt_state_dict", None)  # a library's architecture: its own key layout
    if callable(adapt):
        sd = adapt(sd, source)
    check_state_dict(model, sd, source)
    own = model.state_dict()
    with torch.no_grad():
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in sd.items()}, strict=False)
    return model


FROZEN_ATTR = "_calib_frozen"  # set on a module that freeze_backbone keeps in inference mode


def _stay_in_inference(self: nn.Module, mode: bool = True) -> nn.Module:
    """`train` of a frozen module: it stays in inference mode (its children were put there when it was frozen)."""
    self.training = False
    return self


def freeze_backbone(model: nn.Module) -> nn.Module:
    """Only `model.head` trains: every other parameter becomes a buffer of the same name (so it is in the state
    dict under its key, moves with the model, and is in no optimizer and no gradient), and every module outside
    the head stays in inference mode whatever `model.train()` says (module docstring). Returns `model`."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"run.model.freeze: model {type(model).__name__} has no `head` to train")
    head_modules = {id(m) for m in head.modules()}
    for m in model.modules():
        if id(m) in head_modules:
            continue
        for name, p in list(m._parameters.items()):
            if p is not None:
                del m._parameters[name]
                m.register_buffer(name, p.detach().requires_grad_(False))
        if any(c is head for c in m.modules()):  # the model itself (or a module holding the head) keeps its mode
            continue
        m.training = False
        m.train = types.MethodType(_stay_in_inference, m)  # type: ignore[method-assign]
        setattr(m, FROZEN_ATTR, True)
    if callable(getattr(model, "features", None)):  # a fixed function now: each image's features computed once
        from calib_core.models.feature_memo import FeatureMemo

        model.features = FeatureMemo(model.features)  # type: ignore[method-assign,arg-type,assignment]
    return model


def build_model(model_cfg: Any, num_classes: int, input_shape: tuple[int, ...] | list[int]) -> nn.Module:
    """`create_model` for a `ModelConfig` (or its dict): the registry's model, then `weights` and `freeze`."""
    get = model_cfg.get if isinstance(model_cfg, Mapping) else lambda k, d=None: getattr(model_cfg, k, d)
    net = create_model(str(get("name")), num_classes, tuple(input_shape), **(get("kwargs") or {}))
    weights = get("weights")
    if weights:
        load_weights(net, weights)
    if (get("freeze") or "none") == "head_only":
        freeze_backbone(net)
    return net

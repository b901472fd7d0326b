"""A trained calibrated classifier as plain data: a JSON spec plus a tensors-only state_dict.

`model_spec(module, run_config, input_shape)` describes a trained `CalibratedModel` or
`MultiTaskCalibratedModel` (backbone name and kwargs, calibrator kind and kwargs, number of
classes or the task list, input shape) as JSON-serialisable data;
`build_calibrated_model(spec)` rebuilds the same module from calib_core's registries, and
`load_calibrated_model(spec, state_dict)` loads the weights strictly (every key, every shape).
Nothing here unpickles Python objects: the weights load with `torch.load(weights_only=True)`
(`load_tensors`), which refuses a file naming any other Python object with `UnsafeFileError`
instead of running it.

`with_conformal(spec, record)` adds the optional key `conformal` (calib_core.conformal.served.served_record: the
quantiles of the model's prediction sets, calibrated on its validation rows); like `preprocessing` it changes nothing
the module computes.

`with_preprocessing(spec, record)` adds the optional key `preprocessing` (calib_core.preprocess.input_record: how
raw inputs on disk become the module's inputs); the exported model then takes raw inputs by default
(calib_core.preprocess.apply_record) and standardised ones on request. The key changes nothing the module
computes, so the format version stays: a loader that ignores it rebuilds the same module, which takes
standardised inputs as it always did (nothing is misread; such a loader just offers no raw-input path).

`prepare_inputs(x, input_shape)` turns what a caller passes (numpy array, pandas DataFrame,
torch tensor, nested lists) into a finite float32 array (N, *input_shape), or raises
`InvalidInputError` naming the expected and the received shape, or the non-finite values.
"""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from calib_core.models.classifier import Classifier

SPEC_FORMAT = "calib_core.calibrated_classifier"
SPEC_VERSION = 2  # 2: an optional `temperature_on_top` (per-task temperatures dividing the output logits)
# the optional key of the model's conformal quantiles (calib_core.conformal.served; sweeps.contract.CONFORMAL_SPEC_KEY)
CONFORMAL_KEY = "conformal"


class InvalidInputError(ValueError):
    """The input cannot be fed to the model (wrong shape, not numeric, NaN or inf)."""


class UnsafeFileError(ValueError):
    """A file that should hold only tensors and plain data names other Python objects (a pickled
    module, a class with `__reduce__`, ...): it is refused, and nothing in it is run."""


def load_tensors(path: str | Path) -> Any:
    """`torch.load(path, weights_only=True)` on the CPU: tensors, dicts, lists, tuples and
    primitives only. Anything else raises `UnsafeFileError` naming the file and what it holds;
    torch's restricted unpickler never imports or calls it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(
            r"Unsupported (?:global: GLOBAL \S+|operand \S+|class \S+)|Trying to \S+ .*?(?=\n|$)", str(exc)
        )
        what = (found.group(0) if found else str(exc).splitlines()[-1]).rstrip(".")
        raise UnsafeFileError(
            f"refusing to load {path}: it holds more than tensors and plain data ({what}); it is not "
            "unpickled, since that could run code (a file written by an older version must be made again)"
        ) from None


# ---------------------------------------------------------------------------- the spec
def _calibrator_name(cal: nn.Module) -> str:
    from calib_core.calibrators import CALIBRATORS

    for name, cls in CALIBRATORS.items():
        if type(cal) is cls:
            return name
    raise ValueError(f"cannot export calibrator of type {type(cal).__qualname__}: not one of {', '.join(CALIBRATORS)}")


def model_spec(module: nn.Module, run_config: Mapping[str, Any], input_shape: Sequence[int]) -> dict[str, Any]:
    """The JSON spec of a trained `CalibratedModel` / `MultiTaskCalibratedModel`.

    `run_config` is the run's `RunConfig` as JSON (`model_dump(mode="json")`): the backbone's
    name and kwargs and the calibrator's kwargs come from it; the calibrator kind, the number
    of classes and the tasks come from the module itself.
    """
    from calib_core.trainer.multitask import MultiTaskCalibratedModel
    from calib_core.trainer.result import CalibratedModel

    model_cfg = run_config["model"]
    train_cfg = run_config["train"]
    shape = [int(s) for s in input_shape]
    if isinstance(module, MultiTaskCalibratedModel):
        cals = list(module.calibrators) if module.calibrators is not None else []
        tasks: list[list[Any]] | None = [[str(n), int(k)] for n, k in module.tasks]
        num_classes = None
    elif isinstance(module, CalibratedModel):
        cals = [module.calibrator] if module.calibrator is not None else []
        tasks = None
        num_classes = int(cast("Classifier", module.model).num_classes)  # the backbone is a Classifier
    else:
        raise TypeError(f"expected a CalibratedModel or MultiTaskCalibratedModel, got {type(module).__qualname__}")
    calibrator = None
    if cals:
        names = {_calibrator_name(c) for c in cals}
        if len(names) != 1:
            raise ValueError(f"the tasks use different calibrator kinds {sorted(names)}")
        # only the one-go calibrator takes kwargs (the post-hoc ones are built with none)
        kwargs = dict(train_cfg.get("calibrator_kwargs") or {}) if train_cfg.get("method") == "onego" else {}
        calibrator = {"name": names.pop(), "kwargs": kwargs}
    return {
        "format": SPEC_FORMAT,
        "format_version": 1,  # 2 only with temperature_on_top (with_temperature_on_top)
        "model": {"name": str(model_cfg["name"]), "kwargs": dict(model_cfg.get("kwargs") or {})},
        "input_shape": shape,
        "num_classes": num_classes,
        "tasks": tasks,
        "calibrator": calibrator,
        # modules that registered models or calibrators (calib_core/plugins.py): imported again on load
        **({"plugins": list(_loaded_plugins())} if _loaded_plugins() else {}),
    }


def _loaded_plugins() -> list[str]:
    from calib_core.plugins import _loaded

    return list(_loaded)


def output_classes(spec: Mapping[str, Any]) -> list[tuple[str | None, int]]:
    """[(task name, K_t)] for a multi-task spec, [(None, K)] for a single-task one."""
    if spec.get("tasks"):
        return [(str(n), int(k)) for n, k in spec["tasks"]]
    return [(None, int(spec["num_classes"]))]


def class_names(spec: Mapping[str, Any]) -> list[str]:
    """Class k's name for a single-task spec: its preprocessing record's (a table's label values, an image folder's
    sub-folders, calib_core.preprocess), else "k"."""
    k = output_classes(spec)[0][1]
    names = [str(n) for n in ((spec.get("preprocessing") or {}).get("class_names") or ())]
    return names if len(names) == k and len(set(names)) == k else [str(i) for i in range(k)]


def build_calibrated_model(spec: Mapping[str, Any]) -> nn.Module:
    """A freshly initialised module with the structure `spec` describes (eval mode)."""
    from calib_core.plugins import load_plugins

    load_plugins(spec.get("plugins") or ())  # a plugin's model or calibrator (importable where it loads)
    from calib_core.calibrators import create_calibrator
    from calib_core.models import create_model
    from calib_core.models.multitask import MultiTaskClassifier
    from calib_core.trainer.multitask import MultiTaskCalibratedModel
    from calib_core.trainer.result import CalibratedModel

    if spec.get("format") != SPEC_FORMAT or int(spec.get("format_version", -1)) > SPEC_VERSION:
        raise ValueError(
            f"not a {SPEC_FORMAT} spec of version <= {SPEC_VERSION}: "
            f"format={spec.get('format')!r}, format_version={spec.get('format_version')!r}"
        )
    name, kwargs = spec["model"]["name"], dict(spec["model"].get("kwargs") or {})
    shape = tuple(int(s) for s in spec["input_shape"])
    cal = spec.get("calibrator")
    if spec.get("tasks"):
        tasks = [(str(n), int(k)) for n, k in spec["tasks"]]
        backbone = MultiTaskClassifier.create(name, tasks, shape, **kwargs)
        cals = None
        if cal:
            cals = nn.ModuleList(
                [
                    create_calibrator(
                        cal["name"],
                        k,
                        feature_dim=backbone.feature_dim,
                        head=backbone.heads[t],
                        **cal.get("kwargs", {}),
                    )
                    for t, (_, k) in enumerate(tasks)
                ]
            )
        module: nn.Module = MultiTaskCalibratedModel(backbone, cals, tasks)
    else:
        k = int(spec["num_classes"])
        model = create_model(name, k, shape, **kwargs)
        calibrator = None
        if cal:
            calibrator = create_calibrator(
                cal["name"], k, feature_dim=model.feature_dim, head=model.head, **cal.get("kwargs", {})
            )
        module = CalibratedModel(model, calibrator)
    if spec.get("temperature_on_top"):
        from calib_core.posthoc_on_top import TemperatureOnTopModel

        module = TemperatureOnTopModel(module, [float(t) for t in spec["temperature_on_top"]])
    return module.eval()


def with_temperature_on_top(spec: Mapping[str, Any], temperatures: Sequence[float]) -> dict[str, Any]:
    """The spec of the same model with temperature scaling on top (calib_core.posthoc_on_top); a loader older
    than format version 2 refuses it instead of silently dropping the temperatures."""
    return {**spec, "format_version": 2, "temperature_on_top": [float(t) for t in temperatures]}


def with_preprocessing(spec: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with its raw-input preprocessing record (calib_core.preprocess); the format version is unchanged:
    the module is the same, the record only says how raw inputs become its inputs."""
    return {**spec, "preprocessing": dict(record)}


def with_conformal(spec: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with its conformal quantiles (calib_core.conformal.served.served_record) under CONFORMAL_KEY; the
    format version is unchanged: the module is the same, the record only lets the model answer prediction sets."""
    return {**spec, CONFORMAL_KEY: dict(record)}


def load_calibrated_model(spec: Mapping[str, Any], weights: Mapping[str, torch.Tensor] | str | Path) -> nn.Module:
    """`build_calibrated_model(spec)` with `weights` (a state_dict, or a file saved with
    torch.save holding one: loaded with weights_only=True) loaded strictly, in eval mode."""
    if isinstance(weights, (str, Path)):
        state: Mapping[str, torch.Tensor] = load_tensors(weights)
    else:
        state = weights
    module = build_calibrated_model(spec)
    module.load_state_dict(dict(state), strict=True)
    return module.eval()


def state_dict_for_export(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state_dict as contiguous CPU tensors (what `load_calibrated_model` reads)."""
    return {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}


# ---------------------------------------------------------------------------- inputs
def _fmt(shape: Sequence[int]) -> str:
    return "(N, " + ", ".join(str(int(s)) for s in shape) + ")"


def accepted_input_shapes(input_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Per-example shapes `prepare_inputs` accepts: the model's own, plus (1, L) for a 1-D
    signal (one channel) or the flat vector (prod(input_shape),) otherwise."""
    shape = tuple(int(s) for s in input_shape)
    flat = (int(math.prod(shape)),)
    if len(shape) == 1:
        return [shape, (1, shape[0])]
    return [shape, flat] if flat != shape else [shape]


def expected_input_text(input_shape: Sequence[int]) -> str:
    """'(N, 40) or (N, 1, 40)': the accepted shapes, for error messages and descriptions."""
    return " or ".join(_fmt(s) for s in accepted_input_shapes(input_shape))


def _as_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if hasattr(x, "to_numpy"):  # pandas DataFrame / Series
        x = x.to_numpy()
    try:
        return np.asarray(x)
    except ValueError as exc:  # ragged nested lists
        raise InvalidInputError(f"input is not a rectangular array: {exc}") from None


def prepare_inputs(x: Any, input_shape: Sequence[int]) -> np.ndarray:
    """`x` as a finite float32 array of shape (N, *input_shape), else `InvalidInputError`."""
    shape = tuple(int(s) for s in input_shape)
    arr = _as_array(x)
    got = tuple(int(s) for s in arr.shape)
    if not any(got[1:] == s for s in accepted_input_shapes(shape)):
        raise InvalidInputError(f"expected input of shape {expected_input_text(shape)}; got {got}")
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.number) and not np.issubdtype(arr.dtype, np.complexfloating)
    ):
        raise InvalidInputError(f"expected real numbers (float32); got dtype {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32).reshape((got[0], *shape))
    finite = np.isfinite(out)
    if not finite.all():
        n_nan = int(np.isnan(out).sum())
        n_inf = int(out.size - finite.sum()) - n_nan
        row = int(np.argwhere(~finite)[0][0])
        raise InvalidInputError(
            f"input has {n_nan} NaN and {n_inf} infinite value(s) (first in row {row}); "
            "every value must be finite (and within float32 range)"
        )
    return out


__all__ = [
    "CONFORMAL_KEY",
    "InvalidInputError",
    "SPEC_FORMAT",
    "UnsafeFileError",
    "SPEC_VERSION",
    "accepted_input_shapes",
    "build_calibrated_model",
    "class_names",
    "expected_input_text",
    "load_calibrated_model",
    "load_tensors",
    "model_spec",
    "output_classes",
    "prepare_inputs",
    "state_dict_for_export",
    "with_conformal",
    "with_preprocessing",
    "with_temperature_on_top",
]

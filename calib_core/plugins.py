"""Models, datasets and calibrators from outside the package, and the names the configs accept.

A plugin is a module that registers what it adds when it is imported:

    from calib_core.calibrators import Calibrator, register_calibrator
    from calib_core.data import register_dataset
    from calib_core.models import Classifier, register_model

    @register_model("tiny_mlp")
    class TinyMLP(Classifier): ...

Configs name plugins in `plugins: [my_plugin]` (the sweep config; Ray's trial processes import
them too) or in the environment variable CALIB_PLUGINS (comma-separated module names; also read
by `python -m calib_core.train` and when a champion model is loaded). docs/extending.md walks
through each kind.

`run.data.name`, `run.model.name`, `run.train.calibrator` and the sweep's calibrators are checked
against the registries (calib_core.registry: built-in names are known there without importing torch)
once the rest of a config is valid; plugins are imported only for a name the registries lack.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from calib_core.config import ConfigError, RunConfig, apply_overrides, build_model, read_yaml
from calib_core.registry import REGISTRIES, library_name_problem, split_library_name

PLUGINS_ENV = "CALIB_PLUGINS"
KINDS = ("model", "dataset", "calibrator")
_loaded: list[str] = []


def plugin_modules(modules: Iterable[str] = ()) -> list[str]:
    """`modules` followed by those named in $CALIB_PLUGINS, without repeats."""
    names = [*modules, *(m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))]
    return list(dict.fromkeys(m for m in names if m))


def load_plugins(modules: Iterable[str] = ()) -> list[str]:
    """Import each plugin module (and those in $CALIB_PLUGINS) once; return their names.

    A module that cannot be imported is a ConfigError naming it (e.g. not on PYTHONPATH)."""
    names = plugin_modules(modules)
    for name in names:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or an error in the plugin's own code
            raise ConfigError(
                f"plugins: cannot import {name!r} ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                "it must be importable here and on every Ray node (installed, or on PYTHONPATH)"
            ) from None
        _loaded.append(name)
    return names


_EPOCH_HOOKS: list[Callable[[int], None]] = []


def on_epoch_end(fn: Callable[[int], None]) -> Callable[[int], None]:
    """Register `fn(epoch)` to run in a sweep's trial process after each epoch's report and checkpoint (a
    plugin's monitoring; the fault-injection tests kill a trial there). Returns `fn` (a decorator)."""
    if fn not in _EPOCH_HOOKS:
        _EPOCH_HOOKS.append(fn)
    return fn


def epoch_hooks() -> list[Callable[[int], None]]:
    """The functions registered with on_epoch_end, in registration order."""
    return list(_EPOCH_HOOKS)


def registered(kind: str) -> list[str]:
    """The names registered for `kind` ('model', 'dataset' or 'calibrator'), plugins included."""
    if kind not in REGISTRIES:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    load_plugins()
    names = REGISTRIES[kind].names()
    return names if kind == "calibrator" else sorted(names)  # calibrators in the order a sweep searches them


def name_problem(kind: str, field: str, name: str) -> str | None:
    """'field: unknown kind 'name'; registered: ...' when `name` is not registered, else None."""
    if name in REGISTRIES[kind]:  # a built-in, or a plugin already loaded: no import needed
        return None
    if kind == "model" and split_library_name(name) is not None:  # torchvision/<arch>, timm/<arch>
        return library_name_problem(name, field)
    names = registered(kind)
    if name in names:
        return None
    listed = ", ".join([*names, "torchvision/<arch>", "timm/<arch>"] if kind == "model" else names)
    return f"{field}: unknown {kind} {name!r}; registered: {listed} (a plugin adds more: docs/extending.md)"


def run_config_problems(run: Any, prefix: str = "") -> list[str]:
    """The names of a RunConfig checked against the registries (calibrator 'none' means plain CE)."""
    problems = [
        name_problem("dataset", f"{prefix}data.name", run.data.name),
        name_problem("model", f"{prefix}model.name", run.model.name),
    ]
    if run.train.calibrator != "none":
        problems.append(name_problem("calibrator", f"{prefix}train.calibrator", run.train.calibrator))
    return [p for p in problems if p]


def build_run_config(raw: dict[str, Any]) -> RunConfig:
    """A RunConfig from a raw dict: the schema, then its dataset, model and calibrator names against the
    registries (plugins included), every problem in one ConfigError line."""
    cfg = build_model(RunConfig, raw)
    problems = run_config_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML plus `--set` overrides, names checked (build_run_config)."""
    return build_run_config(apply_overrides(read_yaml(path), overrides or []))

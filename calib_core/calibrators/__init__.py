"""Calibrators: modules that map logits (or features) to calibrated logits, identity at init.

`create_calibrator(name, num_classes, *, feature_dim=None, head=None, **kwargs)` builds one by
name; `fit_posthoc` fits one with full-batch LBFGS on cached logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from calib_core.registry import CALIBRATORS

from .base import Calibrator
from .dirichlet import DirichletCalibrator
from .last_layer import LastLayerCalibrator
from .matrix import MatrixScaling
from .mlp import MLPCalibrator
from .posthoc import fit_posthoc
from .temperature import TemperatureScaling
from .vector import VectorScaling


def register_calibrator(name: str):
    """Class decorator: register a `Calibrator` subclass under `name` (a sweep can then search it).

    It is built as `cls(num_classes, **train.calibrator_kwargs)`, plus `feature_dim=` and `head=` when
    its constructor takes them (a calibrator on the backbone's features, like `mlp` or `last_layer`).
    The class is returned unchanged; a name registered to another class is refused."""

    def deco(cls: type[Calibrator]) -> type[Calibrator]:
        if not (isinstance(cls, type) and issubclass(cls, Calibrator)):
            raise TypeError(f"register_calibrator({name!r}) expects a Calibrator subclass, got {cls!r}")
        if name == "none":
            raise ValueError("'none' means no calibrator (plain cross-entropy); pick another name")
        return CALIBRATORS.add(name, cls)

    return deco


def list_calibrators() -> list[str]:
    """Registered calibrator names (built-in ones first)."""
    return CALIBRATORS.names()


def create_calibrator(
    name: str,
    num_classes: int,
    *,
    feature_dim: int | None = None,
    head: nn.Module | None = None,
    **kwargs,
) -> Calibrator:
    """Build a calibrator by name. `head`/`feature_dim` are used by `last_layer` (and `mlp` on
    features); other kwargs go to the calibrator (e.g. Dirichlet's lambda_od, lambda_b)."""
    if name not in CALIBRATORS:
        raise ValueError(f"unknown calibrator {name!r}; allowed: {', '.join(CALIBRATORS)}")
    cls: Callable[..., Calibrator] = CALIBRATORS.get(name)  # each calibrator's constructor takes its own kwargs
    try:
        if name == "last_layer":
            return cls(num_classes, head=head, feature_dim=feature_dim, **kwargs)
        if name == "mlp":
            return cls(num_classes, feature_dim=feature_dim, head=head, **kwargs)
        accepted = inspect.signature(cls.__init__).parameters
        extra = {k: v for k, v in (("feature_dim", feature_dim), ("head", head)) if k in accepted}
        return cls(num_classes, **extra, **kwargs)
    except TypeError as exc:  # unknown keyword argument
        raise ValueError(f"calibrator {name!r}: {exc}") from None


__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "DirichletCalibrator",
    "LastLayerCalibrator",
    "MLPCalibrator",
    "MatrixScaling",
    "TemperatureScaling",
    "VectorScaling",
    "create_calibrator",
    "fit_posthoc",
    "list_calibrators",
    "register_calibrator",
]

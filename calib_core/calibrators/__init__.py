"""Calibrators: modules that map logits (or features) to calibrated logits, identity at init.

`create_calibrator(name, num_classes, *, feature_dim=None, head=None, **kwargs)` builds one by
name; `fit_posthoc` fits one with full-batch LBFGS on cached logits.
"""

from __future__ import annotations

from torch import nn

from .base import Calibrator
from .dirichlet import DirichletCalibrator
from .last_layer import LastLayerCalibrator
from .matrix import MatrixScaling
from .mlp import MLPCalibrator
from .posthoc import fit_posthoc
from .temperature import TemperatureScaling
from .vector import VectorScaling

CALIBRATORS: dict[str, type[Calibrator]] = {
    "temperature": TemperatureScaling,
    "vector": VectorScaling,
    "matrix": MatrixScaling,
    "dirichlet": DirichletCalibrator,
    "mlp": MLPCalibrator,
    "last_layer": LastLayerCalibrator,
}


def list_calibrators() -> list[str]:
    return list(CALIBRATORS)


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
    cls = CALIBRATORS[name]
    try:
        if name == "last_layer":
            return cls(num_classes, head=head, feature_dim=feature_dim, **kwargs)
        if name == "mlp":
            return cls(num_classes, feature_dim=feature_dim, head=head, **kwargs)
        return cls(num_classes, **kwargs)
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
]

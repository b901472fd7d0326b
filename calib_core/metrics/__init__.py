"""Calibration metrics: torch-native, vectorised, on the inputs' device.

Public API (docs/interfaces.md):

* :func:`calibration_error` - Nixon et al.'s general calibration error with every knob;
  presets :func:`ece`, :func:`mce`, :func:`rmsce`, :func:`sce`, :func:`ace`, :func:`tace`,
  :func:`classwise_ece`.
* :func:`accuracy`, :func:`nll`, :func:`brier`, :func:`aurc`; :func:`compute_all` for all
  of them at once (shared work; what the trainer calls every epoch).
* :class:`CalibrationAccumulator` - streaming, mergeable even-binned statistics, O(bins x K).
* :func:`reliability_diagram` - PNG reliability diagram with a confidence histogram.

Modules: ``_inputs`` (validation, conversion), ``binning`` (the one binning core),
``calibration_error`` (GCE + presets), ``scores`` (non-binned scores, compute_all),
``streaming`` (accumulator), ``reliability`` (diagram).
"""

from .calibration_error import ace, calibration_error, classwise_ece, ece, mce, rmsce, sce, tace
from .reliability import reliability_diagram
from .scores import METRIC_NAMES, accuracy, aurc, brier, compute_all, nll
from .streaming import CalibrationAccumulator

__all__ = [
    "calibration_error",
    "ece",
    "mce",
    "rmsce",
    "sce",
    "ace",
    "tace",
    "classwise_ece",
    "accuracy",
    "nll",
    "brier",
    "aurc",
    "compute_all",
    "METRIC_NAMES",
    "CalibrationAccumulator",
    "reliability_diagram",
]

"""Calibration metrics: torch-native, vectorised, on the inputs' device.

Public API (docs/interfaces.md):

* :func:`calibration_error` - Nixon et al.'s general calibration error with every knob;
  presets :func:`ece`, :func:`mce`, :func:`rmsce`, :func:`sce`, :func:`ace`, :func:`tace`,
  :func:`classwise_ece`.
* :func:`accuracy`, :func:`nll`, :func:`brier`, :func:`aurc`; :func:`compute_all` for all
  of them at once (shared work; what the trainer calls every epoch).
* :class:`CalibrationAccumulator` - streaming, mergeable even-binned statistics, O(bins x K).
* :func:`reliability_diagram` - PNG reliability diagram with a confidence histogram.
* :func:`resample_counts`, :func:`bootstrap_metrics` - paired bootstrap replicates of every
  metric of ``compute_all`` (same counts for every model on a split), :func:`centered_interval`
  (the bootstrap interval), :func:`percentile_interval`.
* :func:`calibrated_null`, :func:`calibration_interval` - consistency resampling (labels drawn
  from the model's own probabilities) and the interval the service reports for calibration
  errors: the bootstrap interval, reaching down to 0 where "calibrated" is not rejected.

Modules: ``_inputs`` (validation, conversion), ``binning`` (the one binning core),
``calibration_error`` (GCE + presets), ``scores`` (non-binned scores, compute_all),
``streaming`` (accumulator), ``reliability`` (diagram), ``bootstrap`` and ``consistency``
(uncertainty), ``debiased`` (less biased estimators).
"""

from .bootstrap import bootstrap_metrics, centered_interval, percentile_interval, prob_not_greater, resample_counts
from .calibration_error import ace, calibration_error, classwise_ece, ece, mce, rmsce, sce, tace
from .consistency import (
    CALIBRATION_ERRORS,
    TOP_LABEL_ERRORS,
    calibrated_null,
    calibration_interval,
    calibration_p_value,
)
from .debiased import debiased_l2_ce, ece_sweep, smooth_ece
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
    "debiased_l2_ce",
    "ece_sweep",
    "smooth_ece",
    "accuracy",
    "nll",
    "brier",
    "aurc",
    "compute_all",
    "METRIC_NAMES",
    "CalibrationAccumulator",
    "reliability_diagram",
    "resample_counts",
    "bootstrap_metrics",
    "percentile_interval",
    "centered_interval",
    "prob_not_greater",
    "CALIBRATION_ERRORS",
    "TOP_LABEL_ERRORS",
    "calibrated_null",
    "calibration_p_value",
    "calibration_interval",
]

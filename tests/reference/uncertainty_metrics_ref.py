"""Load the reference GCE (google/uncertainty-metrics 0.0.81, numpy) by file path.

Only ``uncertainty_metrics/numpy/general_calibration_error.py`` is loaded, never the
package (its ``__init__`` imports TensorFlow). The module is fetched on first use by
``fetch_uncertainty_metrics.py`` (normally already done by ``make setup``).

If it cannot be had, :func:`load_reference` fails the calling test - it does not skip -
unless the environment variable ``CALIB_ALLOW_NO_REFERENCE=1`` is set, which turns the
failure into a skip (for offline machines).
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

from . import fetch_uncertainty_metrics as fetcher

_MODULE: ModuleType | None = None
_ERROR: str | None = None


def _load() -> ModuleType:
    global _MODULE, _ERROR
    if _MODULE is not None:
        return _MODULE
    if _ERROR is None:
        try:
            path = fetcher.fetch(quiet=True)
            spec = importlib.util.spec_from_file_location("_um_general_calibration_error_0_0_81", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _MODULE = module
            return module
        except Exception as exc:  # noqa: BLE001
            _ERROR = f"{type(exc).__name__}: {exc}"
    message = (
        "reference uncertainty-metrics==0.0.81 unavailable "
        f"({_ERROR}); run `python tests/reference/fetch_uncertainty_metrics.py`"
    )
    if os.environ.get("CALIB_ALLOW_NO_REFERENCE") == "1":
        pytest.skip(message + " [skipped: CALIB_ALLOW_NO_REFERENCE=1]")
    pytest.fail(message + " (set CALIB_ALLOW_NO_REFERENCE=1 to skip instead)", pytrace=False)


def load_reference() -> ModuleType:
    """The reference module (``gce``, ``ece``, ``sce``, ``ace``, ``tace``, ...)."""
    return _load()


def reference_gce(probs, labels, *, num_bins, binning, top_label, class_conditional, norm="l1", threshold=0.0):
    """Our keyword names mapped onto the reference's ``gce(labels, probs, ...)``."""
    mod = _load()
    return float(
        mod.gce(
            labels,
            probs,
            binning_scheme=binning,
            max_prob=top_label,
            class_conditional=class_conditional,
            norm=norm,
            num_bins=num_bins,
            threshold=threshold,
        )
    )

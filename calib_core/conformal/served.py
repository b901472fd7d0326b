"""The conformal quantiles a deployed model carries, and its prediction sets on request.

`served_record(probs, labels, alphas)` calibrates every served method (lac, aps, raps) at every alpha on all the
calibration rows (a sweep's validation split, on the probabilities behind its test numbers: for temperature scaling
on top, the cross-fitted ones) with the service's convention
(finite_sample: the ceil((n + 1)(1 - alpha))-th smallest score; the set {k : score_k <= q}, which may be empty).
The record is plain JSON (calib_core.export.with_conformal puts it in the model's spec):

    {"format_version": 1, "convention": "finite_sample", "calibration_rows": n,
     "raps": {"penalty": 0.1, "k_reg": 1},
     "quantiles": {"lac": {"0.1": q, ...}, "aps": {...}, "raps": {...}}}

with alphas as text (`alpha_text`) and a quantile of null where n is too small for that alpha (fewer than
1 / alpha - 1 rows: no finite quantile guarantees the coverage, so the set is every label).

`served_sets(record, probs, method=..., alpha=...)` is calib_core.conformal.prediction_sets with the stored
quantile; an alpha or method without one is a ValueError of one line naming the stored ones. Randomised APS is not
served: its sets depend on a uniform draw per row, so the same input would get different sets on different calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from . import raps
from .core import check_alpha, check_labels, check_probs
from .quantile import FINITE_SAMPLE, conformal_quantile
from .split import calibration_scores, prediction_sets

SERVED_METHODS = ("lac", "aps", "raps")
DEFAULT_METHOD = "lac"
RECORD_VERSION = 1
NOT_SERVED = {
    "aps_randomized": "randomised APS is not served (its sets depend on a uniform draw per row, so one input would "
    "get different sets on different calls); use aps",
}
# a requested alpha matches a stored one within this (0.1 sent as 0.1000000001 by a client is still 0.1)
ALPHA_ATOL = 1e-9


def alpha_text(alpha: float) -> str:
    """alpha as the record's key: 0.1 -> '0.1', 0.025 -> '0.025' (shortest round-trip form)."""
    return repr(float(alpha))


def with_temperature(probs: Any, temperature: float) -> Tensor:
    """The probabilities of the same logits divided by `temperature` (what a model with temperature scaling on top
    serves): softmax(log p / T), since log p differs from the logits by a constant per row. float64."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    p = check_probs(probs).double()
    return torch.softmax(torch.log(p) / float(temperature), dim=1)


def served_record(
    probs: Any, labels: Any, alphas: Iterable[float], methods: Iterable[str] = SERVED_METHODS
) -> dict[str, Any]:
    """The record of every method's quantile at every alpha on the calibration rows (module docstring)."""
    p = check_probs(probs).double().cpu()
    y = check_labels(labels, p).cpu()
    if len(y) == 0:
        raise ValueError("no calibration rows")
    levels = sorted({check_alpha(a) for a in alphas})
    quantiles: dict[str, dict[str, float | None]] = {}
    for method in methods:
        if method not in SERVED_METHODS:
            raise ValueError(f"conformal method {method!r} is not served; served: {', '.join(SERVED_METHODS)}")
        scores = calibration_scores(method, p, y)
        quantiles[method] = {}
        for a in levels:
            q = conformal_quantile(scores, a, FINITE_SAMPLE)
            quantiles[method][alpha_text(a)] = q if math.isfinite(q) else None
    return {
        "format_version": RECORD_VERSION,
        "convention": FINITE_SAMPLE,
        "calibration_rows": len(y),
        "raps": {"penalty": raps.PENALTY, "k_reg": raps.K_REG},
        "quantiles": quantiles,
    }


def stored_alphas(record: dict[str, Any]) -> list[float]:
    """The alphas the record holds quantiles for, ascending."""
    found = {float(a) for per in (record.get("quantiles") or {}).values() for a in per}
    return sorted(found)


def _fmt_alpha(alpha: Any) -> str:
    return f"{alpha:g}" if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else repr(alpha)


def served_quantile(record: dict[str, Any], method: Any, alpha: Any) -> float:
    """The stored quantile of `method` at `alpha` (+inf: every label), else a ValueError of one line naming the
    stored methods or alphas."""
    if int(record.get("format_version", 0)) > RECORD_VERSION or record.get("convention") != FINITE_SAMPLE:
        raise ValueError(
            f"the stored conformal record (format {record.get('format_version')!r}, convention "
            f"{record.get('convention')!r}) is not one this code reads (format <= {RECORD_VERSION}, {FINITE_SAMPLE})"
        )
    per_method = record.get("quantiles") or {}
    if method in NOT_SERVED:
        raise ValueError(f"params method: {NOT_SERVED[method]}")
    if method not in per_method:
        raise ValueError(f"params method: {method!r} has no stored quantiles; stored: {', '.join(per_method)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"params alpha: {alpha!r} is not a number; stored: {_stored_text(record)}")
    for key, q in per_method[method].items():
        if abs(float(key) - float(alpha)) <= ALPHA_ATOL:
            return math.inf if q is None else float(q)
    raise ValueError(f"params alpha: {_fmt_alpha(alpha)} has no stored quantile; stored: {_stored_text(record)}")


def _stored_text(record: dict[str, Any]) -> str:
    return ", ".join(f"{a:g}" for a in stored_alphas(record)) or "none"


def served_sets(record: dict[str, Any], probs: Any, *, alpha: Any, method: Any = DEFAULT_METHOD) -> Tensor:
    """Each row's prediction set, (N, K) bool, from the stored quantile of `method` at `alpha` (served_quantile's
    refusals); the set rule of the record's convention (calib_core.conformal.split)."""
    q = served_quantile(record, method, alpha)
    options = dict(record.get("raps") or {}) if method == "raps" else {}
    return prediction_sets(method, probs, q, convention=FINITE_SAMPLE, **options)


__all__ = [
    "DEFAULT_METHOD",
    "NOT_SERVED",
    "SERVED_METHODS",
    "alpha_text",
    "served_quantile",
    "served_record",
    "served_sets",
    "stored_alphas",
    "with_temperature",
]

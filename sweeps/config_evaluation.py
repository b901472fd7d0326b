"""The `evaluation` section of a sweep config: what is measured after training besides the trainer's metrics."""

from __future__ import annotations

from typing import Literal, cast

from pydantic import Field, field_validator

from calib_core.config import _Strict
from sweeps.contract import CONFORMAL_METHODS

ConformalMethod = Literal["lac", "aps", "aps_randomized", "raps"]  # sweeps.contract.CONFORMAL_METHODS

MAX_CONFORMAL_ALPHAS = 10


class EvaluationConfig(_Strict):
    """Extra evaluation after training: calibration under dataset shift (calib_core.shift),
    out-of-distribution detection against synthetic inputs (calib_core.evaluation.make_ood_inputs), temperature
    scaling on top and conformal prediction sets (calib_core.conformal)."""

    shift: bool = False
    ood: Literal["none", "gaussian_noise", "permuted"] = "none"
    # Temperature scaling on top of every completed trial: a second candidate per trial, its validation metrics
    # k-fold cross-fitted on the trial's validation logits (fit for selection), its test metrics with the
    # temperature fitted on all validation rows (calib_core.posthoc_on_top). False: off (--no-reference-arms).
    temperature_on_top: bool = True
    temperature_folds: int = Field(default=5, ge=2, le=50)
    shift_corruptions: list[str] | None = None
    shift_severities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])
    # Conformal prediction sets of every candidate at each miscoverage level (split conformal, the finite-sample
    # quantile; validation cross-fitted on temperature_folds folds, test from all validation rows); [] turns it off.
    conformal_alphas: list[float] = Field(default_factory=lambda: [0.1])
    conformal_methods: list[ConformalMethod] = Field(
        default_factory=lambda: list(cast("tuple[ConformalMethod, ...]", CONFORMAL_METHODS)), min_length=1
    )

    @field_validator("shift_severities")
    @classmethod
    def _severities(cls, v: list[int]) -> list[int]:
        if not v or any(s not in (1, 2, 3, 4, 5) for s in v):
            raise ValueError("severities must be a non-empty list drawn from 1..5")
        return v

    @field_validator("conformal_alphas")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < a < 1.0 for a in v):
            raise ValueError(f"conformal alphas are miscoverage levels in (0, 1), got {v}")
        if len(set(v)) != len(v) or len(v) > MAX_CONFORMAL_ALPHAS:
            raise ValueError(f"conformal alphas must be distinct, at most {MAX_CONFORMAL_ALPHAS}, got {v}")
        return sorted(v)

    @field_validator("conformal_methods")
    @classmethod
    def _methods(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

"""Post-hoc fitting as the trainer uses it: the fit function it is given, and k-fold cross-fitting.

The trainer takes the fit as a value (`Trainer(..., posthoc_fit=...)`, default
`calib_core.calibrators.fit_posthoc`, LBFGS) so that a caller can count or time the fits by
passing a wrapper (`CountingFit`) instead of patching module globals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from calib_core.calibrators import Calibrator, fit_posthoc

# (calibrator, inputs, labels) -> the fit's report ({"nll_before", "nll_after", "iterations"})
PosthocFit = Callable[[Calibrator, Tensor, Tensor], dict]
DEFAULT_FIT: PosthocFit = fit_posthoc


class CountingFit:
    """A `PosthocFit` that calls `fit` and keeps every report it returns (`reports`)."""

    def __init__(self, fit: PosthocFit = DEFAULT_FIT) -> None:
        self.fit = fit
        self.reports: list[dict[str, Any]] = []

    def __call__(self, calibrator: Calibrator, inputs: Tensor, labels: Tensor) -> dict:
        """Fit and record the report."""
        report = self.fit(calibrator, inputs, labels)
        self.reports.append(report)
        return report


def crossfit(
    calibrator: Calibrator,
    init_state: dict[str, Any],
    inputs: Tensor,
    labels: Tensor,
    folds: list[Tensor],
    fit: PosthocFit = DEFAULT_FIT,
) -> Tensor:
    """Out-of-fold calibrated logits of a post-hoc calibrator: the rows of each fold are calibrated
    by the calibrator refitted from `init_state` on the other folds' rows. The calibrator is left
    fitted on all rows (the one a final model uses)."""
    out: Tensor | None = None
    for fold in folds:
        rest = torch.ones(len(inputs), dtype=torch.bool, device=inputs.device)
        rest[fold] = False
        calibrator.load_state_dict(init_state)
        fit(calibrator, inputs[rest], labels[rest])
        with torch.no_grad():
            z = calibrator(inputs[fold])
        if out is None:
            out = z.new_empty(len(inputs), z.shape[1])
        out[fold] = z
    calibrator.load_state_dict(init_state)
    fit(calibrator, inputs, labels)
    assert out is not None
    return out

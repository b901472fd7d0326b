"""Which samples each player trains on, and which calibrator the run builds, from the config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from calib_core.config import TrainConfig

from .calibrator_batches import holdout_split


@dataclass(frozen=True)
class RunPlan:
    """The data split between the players and the calibrator to build (None: no calibrator)."""

    method: str
    cal_source: str | None  # the one-go calibrator's batches: 'same', 'lookahead', 'holdout'; else None
    backbone_idx: Tensor  # training-split rows the backbone steps on
    holdout_idx: Tensor  # training-split rows held out for the calibrator (empty when none)
    calibrator: str | None
    calibrator_kwargs: dict[str, Any] = field(default_factory=dict)


def plan_run(tc: TrainConfig, n_train: int, seed: int) -> RunPlan:
    """The plan of a run with `n_train` training samples (the holdout is fixed by `seed`)."""
    method = tc.method
    uses_holdout = (method == "posthoc" and tc.posthoc_split == "holdout") or (
        method == "onego" and tc.calibrator_data.startswith("holdout:")
    )
    cal_source = tc.calibrator_data.split(":")[0] if method == "onego" else None
    backbone_idx, holdout_idx = holdout_split(n_train, tc.holdout_fraction if uses_holdout else 0.0, seed)
    if method == "onego":
        name, kwargs = tc.calibrator, dict(tc.calibrator_kwargs)
    elif method == "posthoc":
        name, kwargs = tc.posthoc_calibrator, {}
    else:
        name, kwargs = None, {}
    return RunPlan(method, cal_source, backbone_idx, holdout_idx, name, kwargs)

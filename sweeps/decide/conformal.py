"""Paired bootstrap intervals of every candidate's conformal coverage and mean set size, from the per-row arrays its
trial stored (sweeps.contract.conformal_rows_key). The resample counts are those of the other metrics
(sweeps.decide.uncertainty.compute_replicates: the same seed per split), so differences between candidates, and
against their accuracy, are paired; a mean of per-row values needs one matrix product per split."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from sweeps.contract import CONFORMAL_ROWS, SPLITS

from .uncertainty import Replicates

# cp_<method>_<alpha tag>_<split>_<what>: what conformal_rows_key writes
_ROWS = re.compile(rf"^(cp_.+_a[0-9p]+)_({'|'.join(SPLITS)})_({'|'.join(CONFORMAL_ROWS)})$")
# a row's covered flag is the coverage's row; its set size the mean set size's
_MEASURE = {"covered": "coverage", "size": "size"}


def load_rows(path: str | Path, prefix: str = "") -> dict[str, dict[str, np.ndarray]]:
    """{split: {metric key without the split (cp_lac_a10_coverage): per-row values}} of one candidate; empty when
    its trial measured no sets."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            m = _ROWS.match(name.removeprefix(prefix)) if name.startswith(prefix) else None
            if m is None or (not prefix and name.startswith("ts_")):
                continue
            stem, split, what = m.groups()
            out.setdefault(split, {})[f"{stem}_{_MEASURE[what]}"] = z[name].astype(np.float64)
    return out


def measure_bounds(key: str, num_classes: int | None) -> tuple[float, float]:
    """The range of a conformal mean: a coverage in [0, 1], a mean set size in [0, K] (K unknown: [0, inf))."""
    if key.endswith("_coverage"):
        return 0.0, 1.0
    return 0.0, math.inf if num_classes is None else float(num_classes)


def conformal_replicates(
    rows: dict[str, dict[str, dict[str, np.ndarray]]],
    *,
    num_resamples: int,
    level: float,
    seed: int,
    num_classes: dict[str, int] | None = None,
) -> Replicates:
    """Replicates of every candidate's conformal means (keyed <split>_<key>), on the resamples of compute_replicates,
    with their ranges (measure_bounds; `num_classes` per candidate), so their intervals stay within them."""
    import torch

    from calib_core.metrics import resample_counts

    reps = Replicates(level=level, num_resamples=num_resamples)
    counts: dict[tuple[int, int], Any] = {}
    for trial_id, splits in rows.items():
        values: dict[str, np.ndarray] = {}
        for s_idx, split in enumerate(SPLITS):
            keys = sorted(splits.get(split, {}))
            if not keys:
                continue
            x = torch.from_numpy(np.stack([splits[split][k] for k in keys], axis=1))  # (n, keys)
            n = x.shape[0]
            if (s_idx, n) not in counts:
                w = resample_counts(n, num_resamples, seed=seed * 2 + s_idx).double()
                counts[(s_idx, n)] = torch.cat((torch.ones(1, n, dtype=torch.float64), w))
            means = counts[(s_idx, n)] @ x / n  # row 0: the estimate itself
            values.update({f"{split}_{k}": means[:, j].numpy() for j, k in enumerate(keys)})
        reps.values[trial_id] = {k: v[1:] for k, v in values.items()}
        reps.points[trial_id] = {k: float(v[0]) for k, v in values.items()}
        k_classes = (num_classes or {}).get(trial_id)
        reps.bounds[trial_id] = {k: measure_bounds(k, k_classes) for k in values}
    return reps

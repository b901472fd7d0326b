"""A completed trial's conformal prediction sets (evaluation.conformal_alphas): for the trial as trained and for its
"+ TS" candidate, every method at every alpha (calib_core.conformal.evaluate), as reported metrics and as the per-row
arrays the driver bootstraps (sweeps.contract's conformal keys)."""

from __future__ import annotations

import numpy as np

from sweeps.config import EvaluationConfig
from sweeps.contract import SPLITS, TS_PREFIX, conformal_key, conformal_rows_key, metric_key


def conformal_scores(
    arrays: dict[str, np.ndarray], evaluation: EvaluationConfig, seed: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(metrics, arrays) of the conformal sets of each candidate whose predictions `arrays` holds (prefix "" and,
    when present, TS_PREFIX); nothing for multi-task predictions (sets are per task: not measured yet)."""
    from calib_core.conformal.evaluate import evaluate_sets

    metrics: dict[str, float] = {}
    rows: dict[str, np.ndarray] = {}
    if not evaluation.conformal_alphas or "tasks" in arrays:
        return metrics, rows
    for prefix in ("", TS_PREFIX):
        if f"{prefix}val_probs" not in arrays:
            continue
        found = evaluate_sets(
            *(arrays[f"{prefix}{split}_{what}"] for split in SPLITS for what in ("probs", "labels")),
            alphas=evaluation.conformal_alphas,
            methods=evaluation.conformal_methods,
            folds=evaluation.temperature_folds,
            seed=seed,
        )
        for e in found:
            for split in SPLITS:
                for measure, value in e.metrics[split].items():
                    metrics[prefix + metric_key(split, conformal_key(e.method, e.alpha, measure))] = float(value)
                covered, size = e.rows[split]
                rows[prefix + conformal_rows_key(e.method, e.alpha, split, "covered")] = covered
                rows[prefix + conformal_rows_key(e.method, e.alpha, split, "size")] = size
    return metrics, rows

"""Paired bootstrap intervals for a sweep's trials, from the predictions each trial stored.

Every trial of a sweep is evaluated on the same validation and test rows, so one set of
resample counts per split (seeded by the sweep) serves every trial: differences between
trials' replicates are replicates of their difference (calib_core.metrics.bootstrap).
Multi-task trials get per-task replicates on each task's labelled rows (the same counts,
restricted) and their means over tasks, which is what `val_<metric>` means for them.

Top-label calibration errors (ECE, MCE, RMSCE) also get a calibrated null (consistency
resampling: labels drawn from the trial's own probabilities, calib_core.metrics.consistency);
their intervals reach down to 0 where the data cannot reject "calibrated", which the bootstrap
interval alone never does. The class-conditional errors (SCE, ACE, TACE, classwise ECE) keep the
bootstrap interval: their null needs K rows per example and would double the selection's cost.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# torch and calib_core.metrics are imported where used: the sweep's driver imports this module
# before its trials start and needs neither until selection.

SPLITS = ("val", "test")


def load_predictions(path: str | Path, prefix: str = "") -> dict[str, list[tuple[str | None, np.ndarray, np.ndarray]]]:
    """Per split, a list of (task name or None, probabilities (N, K), labels (N,) with -1 = missing); `prefix`
    names another candidate's arrays in the same file (sweeps.contract.TS_PREFIX: temperature scaling on top)."""
    with np.load(path, allow_pickle=False) as z:
        files = set(z.files)
        tasks = [str(t) for t in z["tasks"]] if "tasks" in files else None
        out: dict[str, list[tuple[str | None, np.ndarray, np.ndarray]]] = {}
        for split in SPLITS:
            pre = f"{prefix}{split}"
            if tasks:
                labels = z[f"{pre}_task_labels"]
                out[split] = [(name, z[f"{pre}_task{t}_probs"], labels[:, t]) for t, name in enumerate(tasks)]
            else:
                out[split] = [(None, z[f"{pre}_probs"], z[f"{pre}_labels"])]
    return out


def _fingerprint(labels: Iterable[np.ndarray]) -> str:
    h = hashlib.sha1()
    for y in labels:
        h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass
class Replicates:
    """Bootstrap replicates per trial and metric key (e.g. 'val_ece', 'test_task0_accuracy')."""

    level: float
    num_resamples: int
    values: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    points: dict[str, dict[str, float]] = field(default_factory=dict)  # the estimates on the full split
    # trials whose splits hold the same rows share resamples; a difference across groups is unpaired
    groups: dict[str, dict[str, str]] = field(default_factory=dict)
    # calibration errors under "calibrated" (consistency resampling), same keys as `values`
    nulls: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # a metric's own range where it is not an accuracy's [0, 1] or unbounded (a conformal set's coverage [0, 1], its
    # mean size [0, K]): its interval stays within it (calib_core.metrics.centered_interval)
    bounds: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    def has(self, trial_id: str, key: str) -> bool:
        """True when the trial has replicates of `key`."""
        return key in self.values.get(trial_id, {})

    def interval(self, trial_id: str, key: str) -> tuple[float, float]:
        """Interval of one trial's metric at the configured level (centred on its estimate; a
        calibration error's reaches 0 where "calibrated" is not rejected)."""
        from calib_core.metrics import calibration_interval, centered_interval

        reps, point = _tensor(self.values[trial_id][key]), self.points[trial_id][key]
        null = self.nulls.get(trial_id, {}).get(key)
        if null is not None:
            return calibration_interval(reps, point, _tensor(null), self.level)
        bounds = self.bounds.get(trial_id, {}).get(key)
        if bounds is None:
            bounds = (0.0, 1.0) if key.endswith("accuracy") else (-math.inf, math.inf)  # a share of rows
        return centered_interval(reps, point, self.level, bounds)

    def difference(self, a: str, b: str, key: str) -> np.ndarray:
        """Replicates of metric(a) - metric(b), paired when the two trials share their split,
        centred on the observed difference."""
        d = self.values[a][key] - self.values[b][key]
        return d - (d.mean() - (self.points[a][key] - self.points[b][key]))

    def difference_interval(self, a: str, b: str, key: str, level: float | None = None) -> tuple[float, float]:
        """Interval of metric(a) - metric(b) (at `level`, default the configured one)."""
        from calib_core.metrics import percentile_interval

        return percentile_interval(_tensor(self.difference(a, b, key)), self.level if level is None else level)

    def merge(self, other: Replicates) -> None:
        """Add `other`'s keys to the trials (the same resamples: computed with the same seed and level)."""
        for attr in ("values", "points", "nulls", "groups", "bounds"):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            for tid, d in theirs.items():
                mine.setdefault(tid, {}).update(d)

    def significantly_greater(self, a: str, b: str, key: str) -> tuple[bool, float]:
        """One-sided test of metric(a) > metric(b) at the configured level: (significant, p-value),
        p = the share of (centred) replicates in which the difference is <= 0."""
        d = self.difference(a, b, key)
        p = float(np.mean(d <= 0.0))
        return p < 1.0 - self.level, p


def _tensor(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def compute_replicates(
    predictions: dict[str, dict[str, list[tuple[str | None, np.ndarray, np.ndarray]]]],
    *,
    num_bins: int,
    num_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    names: tuple[str, ...] | None = None,
    null_draws: int = 200,
) -> Replicates:
    """Replicates of every metric (`names`, default all: METRIC_NAMES) on every split for each trial (keyed
    by trial id), and the calibrated null of its top-label calibration errors (`null_draws` relabellings; 0: none)."""
    import torch

    from calib_core.metrics import METRIC_NAMES, TOP_LABEL_ERRORS, bootstrap_metrics, calibrated_null, resample_counts

    names = METRIC_NAMES if names is None else names
    reps = Replicates(level=level, num_resamples=num_resamples)
    errors = tuple(m for m in names if m in TOP_LABEL_ERRORS) if null_draws > 0 else ()
    counts_cache: dict[tuple[int, int], Any] = {}
    for trial_id, splits in predictions.items():
        values: dict[str, np.ndarray] = {}
        nulls: dict[str, np.ndarray] = {}
        groups: dict[str, str] = {}
        for s_idx, split in enumerate(SPLITS):
            parts = splits.get(split)
            if not parts:
                continue
            n = len(parts[0][2])
            key = (s_idx, n)
            if key not in counts_cache:
                # row 0 weighs every example once: the estimate itself, from the same code path
                counts_cache[key] = torch.cat(
                    (torch.ones(1, n), resample_counts(n, num_resamples, seed=seed * 2 + s_idx))
                )
            counts = counts_cache[key]
            groups[split] = _fingerprint(y for _, _, y in parts)
            per_task, null_per_task = [], []
            for task, probs, labels in parts:
                keep = labels >= 0
                if not keep.any():
                    continue
                # a numpy index into a torch tensor takes a slow path (~8 ms for 1,000 x 180 counts)
                cols = counts if keep.all() else counts[:, torch.from_numpy(np.flatnonzero(keep))]
                reps_t = bootstrap_metrics(probs[keep], labels[keep], cols, num_bins=num_bins, names=names)
                r = {m: v.numpy() for m, v in reps_t.items()}
                per_task.append(r)
                if errors:
                    z = calibrated_null(
                        probs[keep],
                        labels[keep],
                        num_draws=null_draws,
                        seed=seed * 2 + s_idx,
                        num_bins=num_bins,
                        names=errors,
                    )
                    null_per_task.append({m: v.numpy() for m, v in z.items()})
                if task is not None:
                    values.update({f"{split}_{task}_{m}": v for m, v in r.items()})
                    nulls.update({f"{split}_{task}_{m}": v for m, v in (null_per_task[-1] if errors else {}).items()})
            if not per_task:
                continue
            for m in names:
                values[f"{split}_{m}"] = np.mean([r[m] for r in per_task], axis=0)
            for m in errors:  # the mean over tasks of draws made independently per task
                nulls[f"{split}_{m}"] = np.mean([z[m] for z in null_per_task], axis=0)
        reps.values[trial_id] = {k: v[1:] for k, v in values.items()}
        reps.nulls[trial_id] = nulls
        reps.points[trial_id] = {k: float(v[0]) for k, v in values.items()}
        reps.groups[trial_id] = groups
    return reps


def interval_metrics(reps: Replicates, trial_id: str) -> dict[str, float]:
    """`<key>_ci_low` / `<key>_ci_high` for every replicated key of a trial (for MLflow and tables)."""
    out = {}
    for key in reps.values.get(trial_id, {}):
        lo, hi = reps.interval(trial_id, key)
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = lo, hi
    return out


# Every metric's replicates cost ~70x accuracy and ECE alone; past this many trials only the ones worth a
# closer look get all of them (detail_ids), the rest the metrics selection reads.
FULL_DETAIL_TRIALS = 32


def core_metrics(selection_metric: str) -> tuple[str, ...]:
    """The metrics the selection rule and its sentence read replicates of: accuracy, ECE, NLL (the rules' tie-break,
    with its interval in most_accurate_ts's sentence) and the rule's metric; and Brier, because accuracy, NLL and
    Brier are one matrix product over the rows (calib_core.metrics.bootstrap), whose last bits depend on the columns
    it is asked for: computed together, each is what the computation of every metric gives."""
    from calib_core.metrics import METRIC_NAMES

    name = selection_metric.removeprefix("val_")
    return tuple(dict.fromkeys(("accuracy", "ece", "nll", "brier", *((name,) if name in METRIC_NAMES else ()))))


def detail_ids(points: dict[str, dict[str, float]], k: int = FULL_DETAIL_TRIALS) -> set[str]:
    """The trials worth every metric's interval: the k lowest val ECE, the k most accurate and the Pareto front
    of (val accuracy, val ECE), from their point estimates."""
    ids = [t for t, p in points.items() if "val_accuracy" in p and "val_ece" in p]
    by_ece = sorted(ids, key=lambda t: (points[t]["val_ece"], t))[:k]
    by_acc = sorted(ids, key=lambda t: (-points[t]["val_accuracy"], t))[:k]
    front = {
        t
        for t in ids
        if not any(
            points[o]["val_accuracy"] >= points[t]["val_accuracy"]
            and points[o]["val_ece"] <= points[t]["val_ece"]
            and (points[o]["val_accuracy"], points[o]["val_ece"]) != (points[t]["val_accuracy"], points[t]["val_ece"])
            for o in ids
        )
    }
    return set(by_ece) | set(by_acc) | front

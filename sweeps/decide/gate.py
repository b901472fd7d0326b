"""The champion gate: does a new sweep's pick replace the registered champion? (pure: numpy and torch only)

Both models are scored on the same rows that neither trained on nor was selected on: the new sweep's
test rows minus every row of the current champion's training and validation splits (rows are compared
by a hash of their raw values, before each model's own standardisation, so sweeps with other seeds or
split fractions are comparable). A paired bootstrap over those rows then asks two one-sided questions at
the sweep's confidence level: is the new model less accurate, is it worse calibrated (ECE)? The alias
moves only if neither is significant. Too few shared rows, another task (input shape, classes, a table's input
columns: task_difference), or a preprocessing that cannot be mapped between the two models: the alias stays and
the reason says so.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_ROWS = 100  # fewer held-out rows than this decide nothing
ROUND_DECIMALS = 4  # raw values are rounded before hashing: inverting a standardisation is not bit-exact


@dataclass(frozen=True)
class GateDecision:
    """The gate's answer: promote or not, in one line, with the figures behind it."""

    promote: bool
    reason: str
    rows: int = 0
    new: dict[str, float] | None = None  # accuracy, ece on the gate rows
    old: dict[str, float] | None = None


def _affine(stats: dict[str, Any], ndim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) with model input = raw * scale + shift, broadcastable over (N, ...) of `ndim` dimensions, for a
    split's standardisation (`DataSplits.stats`: none, one scale, or mean/std per channel); None if unknown."""
    if not stats:
        return np.ones(1), np.zeros(1)
    if set(stats) == {"scale"}:
        return np.full(1, float(stats["scale"])), np.zeros(1)
    if {"mean", "std"} <= set(stats):
        mean, std = np.asarray(stats["mean"], dtype=np.float64), np.asarray(stats["std"], dtype=np.float64)
        shape = (1, -1) + (1,) * (ndim - 2) if mean.size > 1 else (1,) * max(ndim, 1)
        return (1.0 / std).reshape(shape), (-mean / std).reshape(shape)
    return None


def raw_inputs(x: np.ndarray, stats: dict[str, Any]) -> np.ndarray | None:
    """Undo a split's standardisation (`DataSplits.stats`): mean/std per channel or one scale; None if unknown."""
    x = np.asarray(x, dtype=np.float64)
    ab = _affine(stats, x.ndim)
    return None if ab is None else (x - ab[1]) / ab[0]


def model_inputs(raw: np.ndarray, stats: dict[str, Any]) -> np.ndarray | None:
    """Apply a model's standardisation to raw rows (the inverse of `raw_inputs`); None if unknown."""
    raw = np.asarray(raw, dtype=np.float64)
    ab = _affine(stats, raw.ndim)
    return None if ab is None else (raw * ab[0] + ab[1]).astype(np.float32)


def row_hashes(raw: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of raw values (rounded to ROUND_DECIMALS), for set membership across sweeps."""
    rows = np.round(np.asarray(raw, dtype=np.float64).reshape(len(raw), -1), ROUND_DECIMALS) + 0.0  # no -0.0
    out = np.empty(len(rows), dtype=np.uint64)
    for i, r in enumerate(rows):
        out[i] = int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little")
    return out


def seen_record(data: Any) -> tuple[np.ndarray, dict[str, Any]] | None:
    """What the gate records for a version trained on `data` (DataSplits): the hashes of the raw rows of its training
    and validation splits (what it trained and was selected on) and its data description (dataset, task_record,
    standardisation); None for multi-task data or a standardisation that cannot be undone."""
    if data.tasks is not None:
        return None  # multi-task models are not gated (yet)
    seen = []
    for split in (data.train, data.val):
        raw = raw_inputs(split.x.numpy(), data.stats)
        if raw is None:
            return None
        seen.append(row_hashes(raw))
    return np.concatenate(seen), {"dataset": data.name, **task_record(data), "stats": data.stats}


def write_seen_record(folder: Path, seen: np.ndarray, desc: dict[str, Any]) -> None:
    """The gate's two files in `folder` (sweeps.contract GATE_ROWS_FILE, GATE_DATA_FILE), as logged under GATE_DIR."""
    from sweeps.contract import GATE_DATA_FILE, GATE_ROWS_FILE

    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / GATE_ROWS_FILE, seen=seen)
    (folder / GATE_DATA_FILE).write_text(json.dumps(desc))


def write_trial_record(folder: Path, data: Any) -> None:
    """A trial's gate record (seen_record) written in `folder` where the trial has its data loaded (the driver
    would otherwise regenerate the splits at registration: seconds for generated data, every file of an image
    folder); a warning instead when it cannot be made (registration then regenerates it): never the trial's loss."""
    try:
        record = seen_record(data)
        if record is not None:
            write_seen_record(folder, *record)
    except Exception as exc:  # noqa: BLE001 - see above
        import logging

        logging.getLogger(__name__).warning("no gate record for this trial (registration makes it): %s", exc)


def held_out_mask(new_test_hashes: np.ndarray, old_seen_hashes: np.ndarray) -> np.ndarray:
    """True for the new test rows the current champion neither trained nor was selected on."""
    return ~np.isin(new_test_hashes, old_seen_hashes)


def task_record(data: Any) -> dict[str, Any]:
    """What task a model was trained for (`DataSplits`): input shape, class count, and, where the data names them,
    the class names and the input columns (a table's), for `task_difference`."""
    record = dict(getattr(data, "preprocessing", None) or {})
    columns = [str(c["name"]) for c in record["columns"]] if record.get("columns") else None
    names = record.get("class_names")
    return {
        "input_shape": [int(s) for s in data.input_shape],
        "num_classes": int(data.num_classes),
        "class_names": [str(c) for c in names] if names else None,
        "columns": columns,
    }


def _clip_list(items: list[Any], keep: int = 4) -> str:
    shown = ", ".join(str(i) for i in items[:keep])
    return f"[{shown}{', ...' if len(items) > keep else ''}] ({len(items)})"


def task_difference(new: dict[str, Any], old: dict[str, Any]) -> str | None:
    """How the new model's task differs from the current champion's (`task_record`s; a record from before class
    names and columns were kept is compared on what it has), in a few words; None when it is the same task."""
    parts = []
    if list(new["input_shape"]) != list(old["input_shape"]):
        parts.append(f"input shape {tuple(new['input_shape'])} vs {tuple(old['input_shape'])}")
    if int(new["num_classes"]) != int(old["num_classes"]):
        parts.append(f"{new['num_classes']} classes vs {old['num_classes']}")
    for key, what in (("class_names", "classes"), ("columns", "input columns")):
        a, b = new.get(key), old.get(key)
        if a is not None and b is not None and list(a) != list(b):
            parts.append(f"{what} {_clip_list(list(a))} vs {_clip_list(list(b))}")
    if not parts:
        return None
    return (
        f"the models differ in input shape or classes, another task ({'; '.join(parts)}): nothing to compare; "
        "a model for other data takes a name of its own (--model-name NAME)"
    )


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def compare(
    new_probs: np.ndarray,
    old_probs: np.ndarray,
    labels: np.ndarray,
    *,
    level: float = 0.95,
    num_resamples: int = 1000,
    num_bins: int = 15,
    seed: int = 0,
    min_rows: int = MIN_ROWS,
) -> GateDecision:
    """Paired bootstrap of the new and the current champion on the same rows: promote unless the new one is
    significantly less accurate or significantly worse calibrated (one-sided, at `level`)."""
    from sweeps.decide.uncertainty import compute_replicates

    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    if new_probs.shape != old_probs.shape or new_probs.shape[0] != n:
        raise ValueError(f"gate: probabilities {new_probs.shape} and {old_probs.shape} for {n} labels")
    if n < min_rows:
        return GateDecision(
            False, f"only {n} rows are held out from both models (at least {min_rows} needed): nothing to compare", n
        )
    reps = compute_replicates(
        {"new": {"test": [(None, new_probs, labels)]}, "old": {"test": [(None, old_probs, labels)]}},
        num_bins=num_bins,
        num_resamples=num_resamples,
        level=level,
        seed=seed,
        names=("accuracy", "ece"),
        null_draws=0,
    )
    new = {m: reps.points["new"][f"test_{m}"] for m in ("accuracy", "ece")}
    old = {m: reps.points["old"][f"test_{m}"] for m in ("accuracy", "ece")}
    less_accurate, p_acc = reps.significantly_greater("old", "new", "test_accuracy")
    worse_calibrated, p_ece = reps.significantly_greater("new", "old", "test_ece")
    lo_a, hi_a = reps.difference_interval("new", "old", "test_accuracy")
    lo_e, hi_e = reps.difference_interval("new", "old", "test_ece")
    figures = (
        f"on {n} rows held out from both: acc {_pct(new['accuracy'])} vs {_pct(old['accuracy'])} "
        f"(difference {100 * (new['accuracy'] - old['accuracy']):+.1f} pt [{100 * lo_a:+.1f}, {100 * hi_a:+.1f}], "
        f"p = {p_acc:.3f}), ECE {_pct(new['ece'])} vs {_pct(old['ece'])} "
        f"(difference {100 * (new['ece'] - old['ece']):+.1f} pt [{100 * lo_e:+.1f}, {100 * hi_e:+.1f}], "
        f"p = {p_ece:.3f})"
    )
    if less_accurate or worse_calibrated:
        what = " and ".join(
            w for w, bad in (("less accurate", less_accurate), ("worse calibrated", worse_calibrated)) if bad
        )
        return GateDecision(False, f"significantly {what} than the current champion {figures}", n, new, old)
    return GateDecision(True, f"not significantly less accurate nor worse calibrated {figures}", n, new, old)

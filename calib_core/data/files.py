"""What the file-format datasets (image_folder.py, table.py, arrays.py) share: the path, the memory estimate
made before a file is read, labels turned into classes, the seeded split and the train-only standardisation.

Every problem is a `DataError` (a ValueError) of one line that names the file and the problem, so the
pre-run check (sweeps/checks/model_fit.py) can print it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calib_core.config import DataConfig
from calib_core.data.splits import DataSplits, Split, train_val_test_indices
from calib_core.memory import available_memory

GIB = 2**30


class DataError(ValueError):
    """A dataset that cannot be used, as one line naming the file and the problem."""


def data_path(cfg: DataConfig) -> Path:
    """`data.path`, expanded and absolute (the schema makes it required for the file formats)."""
    if cfg.path is None:
        raise DataError(f"{cfg.name}: data.path is not set")
    return Path(cfg.path).expanduser().absolute()


def check_fits_memory(what: str, path: Path, need: int, how: str) -> None:
    """DataError when `need` bytes (estimated `how`) exceed the memory available now."""
    avail = available_memory()
    if need > avail:
        raise DataError(
            f"{what}: {path} is too large for memory: it needs about {need / GIB:.1f} GiB ({how}) but "
            f"{avail / GIB:.1f} GiB are available; use a smaller file or a machine with more memory"
        )


def some(items: Sequence[Any], limit: int = 5) -> str:
    """The first `limit` items, comma-separated, saying how many more there are."""
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def integer_labels(values: np.ndarray, what: str, path: Path) -> np.ndarray:
    """Labels as int64: integers, or floats with integral values; anything else is a DataError."""
    v = np.asarray(values)
    if v.dtype == bool:
        return v.astype(np.int64)
    if np.issubdtype(v.dtype, np.integer):
        return v.astype(np.int64)
    if np.issubdtype(v.dtype, np.floating):
        bad = ~np.isfinite(v) | (v != np.round(v))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{what}: labels in {path} are not integers ({int(bad.sum())} rows, the first row {i} holds {v[i]!r})"
            )
        return v.astype(np.int64)
    raise DataError(f"{what}: labels in {path} are not integers (dtype {v.dtype})")


def check_classes(y: np.ndarray, num_classes: int, what: str, path: Path, names: Sequence[str] | None = None) -> None:
    """At least two classes, labels in [0, num_classes), every class with at least one example."""
    if len(y) == 0:
        raise DataError(f"{what}: {path} holds no examples")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        raise DataError(f"{what}: labels in {path} lie outside [0, {num_classes}): min {lo}, max {hi}")
    counts = np.bincount(y, minlength=num_classes)
    if num_classes < 2 or int((counts > 0).sum()) < 2:
        only = names[lo] if names else lo
        raise DataError(f"{what}: {path} has a single class ({only!s}); a classifier needs at least two")
    empty = [names[k] if names else k for k in np.flatnonzero(counts == 0).tolist()]
    if empty:
        raise DataError(f"{what}: {path} has no examples of class(es) {some(empty)} (classes 0..{num_classes - 1})")


def check_finite(x: np.ndarray | Tensor, what: str, path: Path) -> None:
    """DataError naming the rows with NaN or inf features."""
    a = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        return
    bad = ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise DataError(f"{what}: {path} has NaN or inf features in {len(rows)} rows (the first is row {int(rows[0])})")


def split_rows(y: np.ndarray, cfg: DataConfig, seed: int, what: str, path: Path) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded, stratified train / val / test row indices (as the embedded datasets are split)."""
    try:
        return train_val_test_indices(
            len(y), val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction, seed=seed, labels=y
        )
    except ValueError as exc:
        raise DataError(f"{what}: {path}: {len(y)} examples are too few to split ({exc})") from None


def feature_stats(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and std (population, float64) of (N, D) train rows; a constant column gets std 1."""
    mean = x_train.mean(axis=0, dtype=np.float64)
    std = x_train.std(axis=0, dtype=np.float64)
    return mean, np.where(std > 0, std, 1.0)


def make_splits(
    x: Tensor,
    y: Tensor,
    idx: tuple[Tensor, Tensor, Tensor],
    *,
    num_classes: int,
    name: str,
    stats: dict[str, Any],
    preprocessing: dict[str, Any],
) -> DataSplits:
    """The three splits of (already standardised) `x` and `y` with their description."""
    train, val, test = (Split(x[i], y[i]) for i in idx)
    return DataSplits(
        train,
        val,
        test,
        num_classes=num_classes,
        input_shape=tuple(int(s) for s in x.shape[1:]),
        name=name,
        stats=stats,
        preprocessing=preprocessing,
    )


def as_tensor(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))

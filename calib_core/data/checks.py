"""Checks of loaded splits that every dataset must pass, built-in or plugin: at least two classes, integer labels
inside [0, num_classes) (-1 marks a missing label of a multi-task set), every class with a training example
(single-task), finite features, no empty split. The sweep runs them once before any trial
(sweeps/checks/model_fit.py); each problem is one `DataError` line naming the dataset, the split and the rows.
"""

from __future__ import annotations

from typing import Any

import torch

from calib_core.data.files import DataError, some
from calib_core.data.splits import DataSplits


def _where(data: DataSplits) -> str:
    pre = getattr(data, "preprocessing", None)
    source = pre.get("source") if isinstance(pre, dict) else None
    return f"dataset {data.name!r}" + (f" ({source})" if source else "")


def check_splits(data: Any) -> None:
    """DataError (one line) for the first problem of `data` (a DataSplits or anything shaped like one)."""
    where = _where(data)
    k = int(data.num_classes)
    tasks = getattr(data, "tasks", None)
    if tasks is None and k < 2:
        raise DataError(f"{where}: has {k} class; a classifier needs at least two")
    for name in ("train", "val", "test"):
        split = getattr(data, name)
        x, y = split.x, split.y
        if len(y) == 0:
            raise DataError(f"{where}: the {name} split is empty")
        if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
            raise DataError(f"{where}: {name} labels are not integers (dtype {str(y.dtype).removeprefix('torch.')})")
        if tasks is None:
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= k:
                raise DataError(f"{where}: {name} labels lie outside [0, {k}): min {lo}, max {hi}")
        else:
            for t, (task, kt) in enumerate(tasks):
                col = y[:, t] if y.dim() == 2 else y
                bad = (col < -1) | (col >= int(kt))
                if bool(bad.any()):
                    raise DataError(
                        f"{where}: {name} labels of task {task!r} lie outside [0, {kt}) (-1: missing), "
                        f"in {int(bad.sum())} rows"
                    )
        if x.dtype.is_floating_point:
            bad_rows = ~torch.isfinite(x.reshape(len(x), -1)).all(dim=1)
            if bool(bad_rows.any()):
                first = int(bad_rows.nonzero()[0, 0])
                raise DataError(
                    f"{where}: {name} features hold NaN or inf in {int(bad_rows.sum())} rows (the first is row {first})"
                )
    if tasks is None:
        counts = torch.bincount(data.train.y.cpu().long(), minlength=k)
        present = int((counts > 0).sum())
        if present < 2:
            raise DataError(f"{where}: the train split holds a single class; a classifier needs at least two")
        empty = (counts == 0).nonzero().flatten().tolist()
        if empty:
            pre = getattr(data, "preprocessing", None)
            names = pre.get("class_names") if isinstance(pre, dict) else None
            shown = [names[i] if names and i < len(names) else i for i in empty]
            raise DataError(f"{where}: the train split has no examples of class(es) {some(shown)} (of {k})")

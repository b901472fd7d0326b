"""Embedded multi-task datasets: several real label functions of the same inputs, offline.

`digits_mtl` (scikit-learn digits, inputs (1, 8, 8)) and `mnist1d_mtl` (MNIST-1D, inputs
(40,)) keep the inputs, the seeded stratified train / val / test split and the
standardisation of their single-task loaders (`digits`, `mnist1d`) exactly; only the labels
change, from the digit d (N,) to an (N, T) long tensor with one column per task:

    task 0  digit   10 classes  d
    task 1  parity   2 classes  d mod 2            (1 = odd)
    task 2  ge5      2 classes  d >= 5             (1 = yes)
    task 3  prime    2 classes  d in {2, 3, 5, 7}  (1 = yes)

Every task is a deterministic function of the true digit, so tasks 1-3 are coarser views of
task 0: a shared backbone with one head (and calibrator) per task is the intended model.
(MNIST-1D's ten classes are templates of the digit shapes 0-9, so the same label functions
apply.)

Multi-task label convention (shared with calib_core.data.celeba): `y[i, t]` is the class of
sample i for task t, or -1 when that label is missing. Loss and metrics must skip -1 entries
per task. `DataSplits.tasks` lists the tasks as `Task(name, num_classes)` pairs and
`DataSplits.num_classes` is the first task's. `missing_fraction` hides exactly
round(f_t * N) labels of task t (a seeded choice per split) in the splits named by
`missing_splits` (train only by default); a sample may lose every label.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import Tensor

from calib_core.config import DataConfig, DatasetName
from calib_core.data.digits import load_digits_splits
from calib_core.data.mnist1d import load_mnist1d
from calib_core.data.splits import DataSplits, Split

MISSING = -1
PRIMES = (2, 3, 5, 7)


class Task(NamedTuple):
    """One task of a multi-task dataset: its name and number of classes."""

    name: str
    num_classes: int


DIGIT_TASKS: tuple[Task, ...] = (Task("digit", 10), Task("parity", 2), Task("ge5", 2), Task("prime", 2))

_BASES: dict[str, tuple[DatasetName, Callable[[DataConfig, int], DataSplits]]] = {
    "digits_mtl": ("digits", load_digits_splits),
    "mnist1d_mtl": ("mnist1d", load_mnist1d),
}
SPLIT_NAMES = ("train", "val", "test")


def list_multitask() -> list[str]:
    return sorted(_BASES)


def digit_task_labels(digits: Tensor) -> Tensor:
    """(N,) digits in 0..9 -> (N, 4) long labels of DIGIT_TASKS."""
    d = torch.as_tensor(digits).to(torch.long)
    if d.dim() != 1:
        raise ValueError(f"digits must have shape (N,), got {tuple(d.shape)}")
    if d.numel() and (int(d.min()) < 0 or int(d.max()) > 9):
        raise ValueError(f"digits must lie in 0..9, got min {int(d.min())}, max {int(d.max())}")
    primes = torch.tensor(PRIMES, dtype=torch.long, device=d.device)
    return torch.stack([d, d % 2, (d >= 5).long(), torch.isin(d, primes).long()], dim=1)


def mask_labels(y: Tensor, fraction: float | Sequence[float], *, seed: int) -> Tensor:
    """A copy of (N, T) labels with exactly round(f_t * N) labels of task t set to -1.

    Which labels is a seeded choice (a private generator; global RNGs untouched), made
    independently per task among all N rows (already-missing labels may be picked again).
    """
    if y.dim() != 2:
        raise ValueError(f"labels must have shape (N, T), got {tuple(y.shape)}")
    n, t = y.shape
    fr = [float(fraction)] * t if isinstance(fraction, (int, float)) else [float(f) for f in fraction]
    if len(fr) != t:
        raise ValueError(f"missing_fraction has {len(fr)} values for {t} tasks")
    if any(not (0.0 <= f <= 1.0) for f in fr):
        raise ValueError(f"missing_fraction values must lie in [0, 1], got {fr}")
    out = y.clone()
    gen = torch.Generator().manual_seed(int(seed))
    for j, f in enumerate(fr):
        perm = torch.randperm(n, generator=gen)  # drawn for every task, so task j's choice ignores other fractions
        k = int(round(f * n))
        if k:
            out[perm[:k].to(y.device), j] = MISSING
    return out


def _mask_seed(seed: int, split: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(f"mask:{split}".encode())) % (2**63 - 1)


def load_multitask(
    name: str,
    *,
    seed: int,
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    num_samples: int | None = None,
    missing_fraction: float | Sequence[float] = 0.0,
    missing_splits: Sequence[str] = ("train",),
) -> DataSplits:
    """`digits_mtl` or `mnist1d_mtl` as train / val / test with (N, 4) labels (module docstring).

    The split and standardisation equal those of the single-task base set for the same seed
    and fractions. `num_samples` applies to mnist1d_mtl only.
    """
    if name not in _BASES:
        raise ValueError(f"unknown multi-task dataset {name!r}; allowed: {', '.join(list_multitask())}")
    bad = [s for s in missing_splits if s not in SPLIT_NAMES]
    if bad:
        raise ValueError(f"missing_splits: unknown split(s) {bad}; allowed: {', '.join(SPLIT_NAMES)}")
    base_name, loader = _BASES[name]
    if num_samples is not None and base_name != "mnist1d":
        raise ValueError(f"num_samples applies to mnist1d_mtl only, not {name!r}")
    cfg = DataConfig(name=base_name, val_fraction=val_fraction, test_fraction=test_fraction, num_samples=num_samples)
    base = loader(cfg, int(seed))
    splits = {}
    for split_name in SPLIT_NAMES:
        split = getattr(base, split_name)
        y = digit_task_labels(split.y)
        if split_name in missing_splits:
            y = mask_labels(y, missing_fraction, seed=_mask_seed(seed, split_name))
        splits[split_name] = Split(split.x, y)
    return replace(
        base,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        num_classes=DIGIT_TASKS[0].num_classes,
        name=name,
        tasks=DIGIT_TASKS,
    )


def _config_loader(name: str) -> Callable[[DataConfig, int], DataSplits]:
    def load(cfg: DataConfig, seed: int) -> DataSplits:
        return load_multitask(
            name, seed=seed, val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction, num_samples=cfg.num_samples
        )

    load.__name__ = f"load_{name}"
    return load


#: `(cfg: DataConfig, seed) -> DataSplits` loaders in the registry's signature (cfg.name is
#: not read: DataConfig.name does not list these sets unless the registry is extended).
MULTITASK_LOADERS: dict[str, Callable[[DataConfig, int], DataSplits]] = {n: _config_loader(n) for n in _BASES}
# what calib_core.registry declares for these names
load_digits_mtl = MULTITASK_LOADERS["digits_mtl"]
load_mnist1d_mtl = MULTITASK_LOADERS["mnist1d_mtl"]

"""In-memory splits, the seeded disjoint split helper, standardisation and batch augmentation.

Every dataset ends up as three `Split`s (train / val / test) of tensors held in memory, so
training steps index tensors directly: no DataLoader, no per-sample Python work.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

IndexLike = Tensor | Sequence[int] | np.ndarray | slice


@dataclass
class Split:
    """Inputs `x` (N, ...) and labels `y` (N,) (or (N, T) for several tasks), held in memory."""

    x: Tensor
    y: Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.x, Tensor) or not isinstance(self.y, Tensor):
            raise TypeError(f"Split needs tensors, got x={type(self.x).__name__}, y={type(self.y).__name__}")
        if self.x.dim() < 1 or self.y.dim() < 1 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"Split: x and y need the same first dimension, got {tuple(self.x.shape)} and {tuple(self.y.shape)}"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def device(self) -> torch.device:
        return self.x.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Split:
        """A Split on `device` (self when already there)."""
        device = torch.device(device)
        if self.x.device == device and self.y.device == device:
            return self
        return Split(self.x.to(device, non_blocking=non_blocking), self.y.to(device, non_blocking=non_blocking))

    def subset(self, idx: IndexLike) -> Split:
        """Rows `idx` (index tensor, sequence, numpy array, boolean mask or slice)."""
        if isinstance(idx, slice):
            return Split(self.x[idx], self.y[idx])
        idx = torch.as_tensor(np.asarray(idx) if not isinstance(idx, Tensor) else idx)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().flatten()
        idx = idx.to(device=self.x.device, dtype=torch.long)
        return Split(self.x.index_select(0, idx), self.y.index_select(0, idx.to(self.y.device)))


@dataclass(frozen=True)
class CropFlip:
    """Random crop with zero-padding of `padding` pixels and (optionally) a horizontal flip.

    Runs on a whole (N, C, H, W) batch as one gather on the batch's device. `fill` is the value
    per channel used for the padding, in the units of the (standardised) tensor: loaders set it
    to -mean/std so the padding is a black pixel, as in the usual PIL pipeline.
    """

    padding: int = 4
    flip: bool = True
    fill: tuple[float, ...] | None = None

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"augmentation expects a batch (N, C, H, W), got shape {tuple(x.shape)}")
        n, c, h, w = x.shape
        p = self.padding
        gdev = generator.device if generator is not None else torch.device("cpu")
        # random draws happen on the generator's device so a CPU generator gives the same
        # augmentation whatever device the batch is on
        offsets = torch.randint(0, 2 * p + 1, (2, n), generator=generator, device=gdev).to(x.device)
        flips = (torch.rand(n, generator=generator, device=gdev) < 0.5).to(x.device) if self.flip else None
        if p > 0:
            padded = x.new_empty((n, c, h + 2 * p, w + 2 * p))
            if self.fill is None:
                padded.zero_()
            else:
                if len(self.fill) != c:
                    raise ValueError(f"augmentation fill has {len(self.fill)} values for {c} channels")
                padded.copy_(torch.tensor(self.fill, dtype=x.dtype, device=x.device).view(1, c, 1, 1).expand_as(padded))
            padded[:, :, p : p + h, p : p + w] = x
        else:
            padded = x
        ar_h = torch.arange(h, device=x.device)
        ar_w = torch.arange(w, device=x.device)
        rows = offsets[0, :, None] + ar_h  # (N, H)
        cols = ar_w.expand(n, w) if flips is None else torch.where(flips[:, None], (w - 1) - ar_w, ar_w)
        cols = offsets[1, :, None] + cols  # (N, W)
        n_idx = torch.arange(n, device=x.device).view(n, 1, 1, 1)
        c_idx = torch.arange(c, device=x.device).view(1, c, 1, 1)
        return padded[n_idx, c_idx, rows[:, None, :, None], cols[:, None, None, :]]


@dataclass
class DataSplits:
    """Three disjoint splits of one dataset plus what a model needs to know about it.

    `input_shape` excludes the batch dimension. `stats` records the standardisation
    (computed on `train` only). `augmentation` is None unless `data.augment` is on.
    `preprocessing` is how raw inputs become model inputs (file formats; see the field).
    `tasks` is None for single-task data; for multi-task data (labels (N, T), -1 = missing)
    it describes the T tasks, one `(name, num_classes)` pair each (calib_core.data.multitask.Task).
    """

    train: Split
    val: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    augmentation: CropFlip | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    tasks: tuple[tuple[str, int], ...] | None = None
    # how raw inputs become model inputs (JSON-serialisable; {} where `stats` says it all): the file formats
    # record their train statistics, category lists, class names and image transform (calib_core/data/table.py,
    # image_folder.py, arrays.py), so an exported model can apply them to raw inputs
    preprocessing: dict[str, Any] = field(default_factory=dict)

    def augment(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Augment a training batch (identity when augmentation is off). Deterministic given `generator`."""
        if self.augmentation is None:
            return x
        return self.augmentation(x, generator)

    def to(self, device: torch.device | str) -> DataSplits:
        return replace(self, train=self.train.to(device), val=self.val.to(device), test=self.test.to(device))

    def describe(self) -> dict[str, Any]:
        """A flat summary for logging."""
        return {
            "dataset": self.name,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "n_train": len(self.train),
            "n_val": len(self.val),
            "n_test": len(self.test),
            "augment": self.augmentation is not None,
        }


def split_indices(
    n: int, fractions: Sequence[float], *, seed: int, labels: Tensor | np.ndarray | None = None
) -> list[Tensor]:
    """Partition range(n) into len(fractions) disjoint, covering, sorted index tensors.

    Part j >= 1 gets round(n * (f_1 + ... + f_j)) - round(n * (f_1 + ... + f_{j-1})) samples;
    part 0 takes the rest (its fraction is implied). With `labels` the split is stratified:
    samples are ranked by their (random) quantile within their class before cutting, so every
    part holds each class in proportion, to within one sample, even for tiny datasets.
    The result depends on `seed` only (a private torch.Generator; global RNGs are untouched).
    """
    fractions = [float(f) for f in fractions]
    if len(fractions) < 1 or any(f < 0 for f in fractions) or sum(fractions[1:]) >= 1.0:
        raise ValueError(f"cannot split {n} samples by fractions {fractions}")
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=gen)
    if labels is None:
        ranked = perm
    else:
        lab = torch.as_tensor(np.asarray(labels) if not isinstance(labels, Tensor) else labels).to("cpu", torch.long)
        if lab.shape != (n,):
            raise ValueError(f"labels for stratification must have shape ({n},), got {tuple(lab.shape)}")
        lab_p = lab[perm] - lab.min()
        order = torch.sort(lab_p, stable=True).indices  # grouped by class, random order within
        idx_c, lab_c = perm[order], lab_p[order]
        counts = torch.bincount(lab_c)
        rank = torch.arange(n) - (torch.cumsum(counts, 0) - counts)[lab_c]
        quantile = (rank.double() + 0.5) / counts[lab_c].double()
        shuffle = torch.randperm(n, generator=gen)  # ties between classes break at random
        ranked = idx_c[shuffle][torch.sort(quantile[shuffle], stable=True).indices]
    cuts = [0] + [int(round(n * c)) for c in np.cumsum(fractions[1:])]
    out = [ranked[cuts[-1] :]] + [ranked[cuts[j - 1] : cuts[j]] for j in range(1, len(fractions))]
    for j, (f, idx) in enumerate(zip(fractions, out)):
        if (j == 0 or f > 0) and len(idx) == 0:
            raise ValueError(f"split of {n} samples by fractions {fractions} leaves part {j} empty")
    return [torch.sort(idx).values for idx in out]


def train_val_test_indices(
    n: int, *, val_fraction: float, test_fraction: float, seed: int, labels: Tensor | np.ndarray | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded disjoint train / val / test indices for a dataset without an official test split."""
    train, val, test = split_indices(
        n, [1.0 - val_fraction - test_fraction, val_fraction, test_fraction], seed=seed, labels=labels
    )
    return train, val, test


def channel_stats(x: Tensor, *, chunk: int = 8192) -> tuple[Tensor, Tensor]:
    """Mean and std per channel (dim 1 of (N, C, ...)), or one pair for (N, L), in float64.

    Accumulated chunk by chunk so a large uint8 tensor is never converted whole.
    """
    if x.shape[0] == 0:
        raise ValueError("cannot compute statistics of an empty split")
    xc = x if x.dim() > 2 else x.reshape(x.shape[0], 1, -1)
    dims = [0] + list(range(2, xc.dim()))
    total = torch.zeros(xc.shape[1], dtype=torch.float64)
    total_sq = torch.zeros(xc.shape[1], dtype=torch.float64)
    for part in xc.split(chunk):
        p = part.double()
        total += p.sum(dim=dims)
        total_sq += (p * p).sum(dim=dims)
    count = xc.numel() // xc.shape[1]
    mean = total / count
    var = (total_sq / count - mean * mean).clamp_min(0.0)
    std = var.sqrt()
    std = torch.where(std > 0, std, torch.ones_like(std))
    return mean, std


def standardize(x: Tensor, mean: Tensor, std: Tensor, *, scale: float = 1.0) -> Tensor:
    """float32 (x * scale - mean) / std with per-channel mean/std (a new tensor; x is untouched)."""
    shape = (1, -1) + (1,) * (x.dim() - 2) if x.dim() > 2 else (1, 1)
    out = x.to(torch.float32, copy=True)
    if scale != 1.0:
        out.mul_(scale)
    out.sub_(mean.to(torch.float32).view(shape)).div_(std.to(torch.float32).view(shape))
    return out


def iterate_batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None = None,
    drop_last: bool = False,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (x, y) mini-batches of `split`.

    Without shuffling the batches are views (no copy). With shuffling one permutation is drawn
    (on the generator's device, so a CPU generator gives the same order on any device) and each
    batch is one `index_select`: a fresh tensor per batch, never a reused buffer, so a caller
    may keep a batch (e.g. the look-ahead calibrator batch) while taking the next.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(split)
    stop = n - n % batch_size if drop_last else n
    if not shuffle:
        for i in range(0, stop, batch_size):
            yield split.x[i : i + batch_size], split.y[i : i + batch_size]
        return
    gdev = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(n, generator=generator, device=gdev).to(split.x.device)
    perm_y = perm if split.y.device == split.x.device else perm.to(split.y.device)
    for i in range(0, stop, batch_size):
        yield split.x.index_select(0, perm[i : i + batch_size]), split.y.index_select(0, perm_y[i : i + batch_size])

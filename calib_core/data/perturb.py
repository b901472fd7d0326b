"""Harder regimes from any single-task dataset: symmetric label noise and a long-tailed class profile.

Both act on every split alike (train, val and test come from one distribution, so calibration is
measured against the labels the model is trained on), after the loader's seeded split, and are
fixed by the run's seed:

- `label_noise = eta`: each label is replaced with probability eta by one of the *other* K - 1
  classes, uniformly (so P(observed = true) = 1 - eta exactly);
- `imbalance_ratio = rho`: class k keeps a fraction rho ** (-k / (K - 1)) of its examples in every
  split (class 0 all, class K-1 a 1/rho share: the exponential profile of Cui et al. 2019).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from calib_core.data.splits import DataSplits, Split

# offsets of the per-split generators, so the three splits draw independent noise from one seed
_SPLIT_STREAMS = {"train": 1, "val": 2, "test": 3}


def class_keep_fractions(num_classes: int, ratio: float) -> list[float]:
    """The fraction of each class kept under the exponential profile with head/tail ratio `ratio`."""
    if ratio < 1.0:
        raise ValueError(f"imbalance_ratio must be >= 1, got {ratio}")
    if num_classes < 2:
        return [1.0] * num_classes
    return [float(ratio ** (-k / (num_classes - 1))) for k in range(num_classes)]


def _noisy(y: torch.Tensor, eta: float, num_classes: int, gen: torch.Generator) -> torch.Tensor:
    flip = torch.rand(y.shape, generator=gen) < eta
    # a uniform draw among the K - 1 other classes: add 1..K-1 modulo K
    shift = torch.randint(1, num_classes, y.shape, generator=gen)
    return torch.where(flip, (y + shift) % num_classes, y)


def _subsample(split: Split, keep: list[float], gen: torch.Generator) -> Split:
    y = split.y.cpu()
    chosen = []
    for k, frac in enumerate(keep):
        idx = (y == k).nonzero().flatten()
        n_keep = max(1, round(frac * len(idx))) if len(idx) else 0
        chosen.append(idx[torch.randperm(len(idx), generator=gen)[:n_keep]])
    order = torch.cat(chosen).sort().values
    return split.subset(order)


def perturb_splits(data: DataSplits, *, label_noise: float, imbalance_ratio: float | None, seed: int) -> DataSplits:
    """`data` with the long-tailed profile applied first, then the label noise (no-op at 0 / None)."""
    if not label_noise and not imbalance_ratio:
        return data
    if data.tasks is not None or data.train.y.dim() != 1:
        raise ValueError(f"data.label_noise and data.imbalance_ratio apply to single-task datasets, not {data.name!r}")
    if not 0.0 <= label_noise < 1.0 - 1.0 / data.num_classes:
        raise ValueError(f"data.label_noise must be in [0, {1.0 - 1.0 / data.num_classes:.3f}), got {label_noise}")
    out = {}
    for name, stream in _SPLIT_STREAMS.items():
        split: Split = getattr(data, name)
        gen = torch.Generator().manual_seed(int(seed) * 7919 + stream)
        if imbalance_ratio and imbalance_ratio > 1.0:
            split = _subsample(split, class_keep_fractions(data.num_classes, imbalance_ratio), gen)
        if label_noise:
            split = Split(split.x, _noisy(split.y.cpu(), label_noise, data.num_classes, gen).to(split.y.device))
        out[name] = split
    stats = dict(data.stats, label_noise=label_noise, imbalance_ratio=imbalance_ratio)
    return replace(data, train=out["train"], val=out["val"], test=out["test"], stats=stats)

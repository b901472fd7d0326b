"""Where batches come from: the holdout split, the backbone's per-epoch order, and the
calibrator's batch source (`holdout:f`, `lookahead`, `same`).

Every shuffle uses its own torch.Generator seeded from (seed, stream, index), so an order
depends only on the run's seed and its position, never on what ran before: a resumed run
draws exactly the batches the uninterrupted run would have drawn.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_STREAMS = {"holdout": 1, "epoch": 2, "calibrator": 3, "augment": 4, "global": 5, "folds": 6}


def derive_seed(seed: int, stream: str, index: int = 0) -> int:
    """A 63-bit seed for (seed, stream, index), independent across streams and indices."""
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, _STREAMS[stream], int(index)])
    return int(ss.generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)


def generator(seed: int, stream: str, index: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, stream, index))
    return g


def holdout_split(n: int, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """(backbone_idx, holdout_idx): disjoint, sorted, fixed by seed; holdout has round(f*n)
    samples (at least 1, leaving at least 1). fraction 0 gives an empty holdout."""
    if fraction <= 0:
        return torch.arange(n), torch.empty(0, dtype=torch.long)
    if n < 2:
        raise ValueError(f"cannot hold out a fraction of a training split of {n} sample(s)")
    k = min(max(1, round(fraction * n)), n - 1)
    perm = torch.randperm(n, generator=generator(seed, "holdout"))
    return perm[k:].sort().values, perm[:k].sort().values


def kfold_indices(n: int, k: int, seed: int) -> list[Tensor]:
    """k disjoint, sorted folds covering range(n), sizes differing by at most 1, fixed by seed."""
    if not 2 <= k <= n:
        raise ValueError(f"cannot cut {n} sample(s) into {k} folds (need 2 <= k <= n)")
    perm = torch.randperm(n, generator=generator(seed, "folds"))
    return [f.sort().values for f in perm.tensor_split(k)]


def epoch_batches(pool: Tensor, batch_size: int, seed: int, epoch: int) -> list[Tensor]:
    """The backbone's batches for `epoch` (0-based): a seeded shuffle of `pool` cut into batches.
    A final batch of a single sample is dropped (BatchNorm cannot train on it)."""
    perm = pool[torch.randperm(len(pool), generator=generator(seed, "epoch", epoch))]
    batches = list(perm.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches.pop()
    return batches


class HoldoutCycler:
    """Cycles through the holdout indices in seeded shuffles, batch by batch, across epochs.

    Its position (cycle, offset) is part of the trainer's state."""

    def __init__(self, pool: Tensor, batch_size: int, seed: int) -> None:
        if len(pool) == 0:
            raise ValueError("the calibrator's holdout is empty")
        self.pool = pool
        self.batch_size = min(batch_size, len(pool))
        self.seed = seed
        self.cycle = 0
        self.offset = 0
        self._perm: Tensor | None = None

    def _order(self) -> Tensor:
        if self._perm is None:
            g = generator(self.seed, "calibrator", self.cycle)
            self._perm = self.pool[torch.randperm(len(self.pool), generator=g)]
        return self._perm

    def next(self) -> Tensor:
        order = self._order()
        idx = order[self.offset : self.offset + self.batch_size]
        self.offset += self.batch_size
        if self.offset >= len(order) or len(order) - self.offset < 2:  # no tiny leftover batches
            self.cycle, self.offset, self._perm = self.cycle + 1, 0, None
        return idx

    def state_dict(self) -> dict:
        return {"cycle": self.cycle, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.cycle, self.offset, self._perm = int(state["cycle"]), int(state["offset"]), None

"""`FeatureMemo`: a frozen backbone's features remembered per input row, so a linear probe computes them once.

With `run.model.freeze: head_only` the backbone is a fixed function in inference mode (calib_core/models/pretrained.py):
the same image gives the same features in every epoch, in training and in evaluation. Recomputing them is almost all
of a linear probe's time (a ResNet-18 forward at 224 px is tens of milliseconds per image on a CPU; the head is
microseconds), so each row's features are kept under a digest of the row's bytes (blake2b, 16 bytes: well under a
millisecond per image). Rows of a batch that were seen before are looked up; the others are computed in one forward.

Only CPU inputs are remembered (a GPU forward is cheap, and hashing would copy every batch to the host); an input that
needs a gradient is never remembered. The memo is bounded (`max_rows`): past it, new rows are computed, not kept.
Features computed for a smaller batch can differ from a whole batch's in the last bits (the kernels block by batch
size): ~1e-7 relative, far below any metric's resolution.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch import Tensor

MAX_ROWS = 500_000  # 500k rows x 2,048 float32 features = 4 GB at most; typical probes are far below


class FeatureMemo:
    """`features(x)` with each CPU row's result remembered under its bytes' digest (module docstring)."""

    def __init__(self, features: Callable[[Tensor], Tensor], max_rows: int = MAX_ROWS) -> None:
        self.features = features
        self.max_rows = max_rows
        self.rows: dict[bytes, Tensor] = {}
        self.hits = 0
        self.computed = 0

    def __call__(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.requires_grad or torch.is_grad_enabled() and x.grad_fn is not None:
            return self.features(x)
        flat = x.detach().contiguous().reshape(len(x), -1).numpy()
        keys = [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in flat]
        missing = [i for i, k in enumerate(keys) if k not in self.rows]
        fresh: dict[bytes, Tensor] = {}
        if missing:
            with torch.no_grad():
                out = self.features(x if len(missing) == len(keys) else x[missing])
            fresh = {keys[i]: out[j] for j, i in enumerate(missing)}
            room = self.max_rows - len(self.rows)
            for k in list(fresh)[: max(0, room)]:
                self.rows[k] = fresh[k]
        self.computed += len(missing)
        self.hits += len(keys) - len(missing)
        return torch.stack([self.rows[k] if k in self.rows else fresh[k] for k in keys])

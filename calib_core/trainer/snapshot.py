"""Helpers of the trainer's resumable snapshot: detached CPU copies, the global RNG states as
plain data, and config differences.

A snapshot holds only tensors, dicts, lists, tuples and primitives, so it saves with
`torch.save` and loads with `torch.load(weights_only=True)` (no Python object is unpickled)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import Tensor


def cpu_copy(obj: Any) -> Any:
    """Deep copy with every tensor cloned to the CPU (picklable, independent of the live run)."""
    if isinstance(obj, Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def numpy_rng_state() -> dict[str, Any]:
    """numpy's legacy global generator state (`np.random.get_state()`) as a tensor and primitives."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),  # uint32 words, exact in int64
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def set_numpy_rng_state(state: Any) -> None:
    """Restore numpy's global generator from `numpy_rng_state()` (or `np.random.get_state()`'s tuple)."""
    if isinstance(state, dict):
        keys = np.asarray(state["keys"].numpy(), dtype=np.uint32)
        state = (
            state["bit_generator"],
            keys,
            int(state["pos"]),
            int(state["has_gauss"]),
            float(state["cached_gaussian"]),
        )
    np.random.set_state(state)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with dotted keys (`train.lr`)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differing_keys(a: dict, b: dict) -> list[str]:
    """The dotted keys whose values differ between two nested dicts, sorted."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))

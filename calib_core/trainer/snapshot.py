"""Helpers of the trainer's resumable snapshot: detached CPU copies and config differences."""

from __future__ import annotations

import copy
from typing import Any

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

"""The one binning core behind every binned metric (one-shot, streaming and diagrams).

Numerical conventions (docs/design.md section 4), those of the reference library
google/uncertainty-metrics (numpy ``gce``):

* **Even bins.** Upper edges ``np.histogram_bin_edges([], bins=B, range=(0, 1))[1:]`` (float64
  linspace) and ``np.digitize(p, edges, right=False)``: bin k is [e_k, e_{k+1}), so
  p == 1.0 lands in an extra bin of its own (index B). There are B + 1 even bins.
* **Adaptive bins** (equal mass), per group of kept values: with n values sorted ascending,
  edge indices ``round(linspace(0, n, B, endpoint=False))`` (round half to even), clipped to
  n - 1; the first edge is dropped; a value's bin is the number of edges <= it. B bins.
* **Threshold** t keeps only p > t, strictly; ``None`` keeps everything.
* Comparisons are exact for float32 values too: each float64 edge / threshold is turned into
  the float32 number that gives the same answer for every float32 value, so no (N, K) float64
  copy is needed.

The statistics of a group are per-bin ``counts``, sums of confidences and sums of
correctness, always accumulated in float64. :func:`group_errors` and :func:`combine` turn
them into a calibration error, for the one-shot functions and the streaming accumulator
alike. Work is vectorised (bucketize / searchsorted / bincount / scatter_add / sort, the
sort done by numpy on CPU tensors because it is ~10x faster there); the
only Python loops run over row chunks or column blocks of a fixed element budget, which
bounds temporary memory, never over bins or classes one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from . import _fast
from ._backend import argsort_1d, bincount, bucketize_right, sort_values  # noqa: F401  (re-exported)

#: Element budget of one row chunk / column block (bounds temporaries to ~100 MB).
CHUNK_ELEMENTS = 1 << 22

_NP_DTYPE: dict[torch.dtype, type[np.floating]] = {torch.float32: np.float32, torch.float64: np.float64}


def even_upper_edges(num_bins: int) -> np.ndarray:
    """The B float64 upper edges of the even bins, exactly as the reference builds them."""
    return np.histogram_bin_edges(np.array([], dtype=np.float64), bins=num_bins, range=(0.0, 1.0))[1:]


def _ceil_to(dtype: type[np.floating], x: float) -> np.floating:
    """Smallest value of ``dtype`` that is >= x (so v >= x  <=>  v >= result for v in dtype)."""
    f = dtype(x)
    if float(f) < x:
        f = np.nextafter(f, dtype(np.inf))
    return f


def _above_cut(dtype: type[np.floating], t: float) -> np.floating:
    """Smallest value of ``dtype`` that is > t (so v > t  <=>  v >= result for v in dtype)."""
    f = dtype(t)
    if float(f) <= t:
        f = np.nextafter(f, dtype(np.inf))
    return f


def floor_threshold(t: float | None, dtype: torch.dtype) -> float:
    """Largest value of ``dtype`` <= t, so that v > t  <=>  v > result (-inf for None)."""
    if t is None:
        return -np.inf
    npd = _NP_DTYPE[dtype]
    f = npd(t)
    if float(f) > t:
        f = np.nextafter(f, npd(-np.inf))
    return float(f)


# ----------------------------------------------------------------------------------
# even bins
# ----------------------------------------------------------------------------------
class EvenBinner:
    """Even binning with one or more thresholds resolved in a single bucketize pass.

    The B upper edges and one "cut" per numeric threshold form sorted boundaries; a value's
    *sub-bin* is the number of boundaries <= it. Each sub-bin maps to one even bin
    (``sub_bin``) and is either kept or not by each threshold (``sub_kept[i]``), so
    statistics are gathered once per sub-bin and collapsed per threshold afterwards on tiny
    (groups x sub-bins) arrays.
    """

    def __init__(self, num_bins: int, thresholds: Sequence[float | None], dtype: torch.dtype, device):
        self.num_bins = int(num_bins)
        self.thresholds = tuple(thresholds)
        self.dtype, self.device = dtype, torch.device(device)
        npd = _NP_DTYPE[dtype]
        items = [(_ceil_to(npd, float(e)), -1) for e in even_upper_edges(self.num_bins)]
        items += [(_above_cut(npd, t), i) for i, t in enumerate(self.thresholds) if t is not None]
        items.sort(key=lambda it: float(it[0]))
        values = sorted({float(v) for v, _ in items})
        pos = {v: j for j, v in enumerate(values)}  # boundary j -> sub-bins >= j + 1 are above it
        n_sub = len(values) + 1
        edge_hits = np.zeros(n_sub, dtype=np.int64)
        kept = np.ones((len(self.thresholds), n_sub), dtype=bool)
        for v, kind in items:
            j = pos[float(v)] + 1
            if kind < 0:
                edge_hits[j] += 1
            else:
                kept[kind, :j] = False
        self.num_sub = n_sub
        self.boundaries = torch.tensor(np.array(values, dtype=npd), dtype=dtype, device=self.device)
        self.sub_bin = torch.tensor(np.cumsum(edge_hits), dtype=torch.int64, device=self.device)
        self.sub_kept = torch.tensor(kept, device=self.device)

    def sub_index(self, values: Tensor) -> Tensor:
        """Sub-bin index of each value (int64, same shape)."""
        return bucketize_right(values, self.boundaries)

    def collapse(self, sub: Tensor, threshold_index: int | None) -> Tensor:
        """(G, num_sub) per-sub-bin sums -> (G, B + 1) per-bin sums for one threshold.

        ``threshold_index=None`` keeps every sub-bin (no threshold at all).
        """
        cols = self.sub_bin
        src = sub.to(torch.float64)
        if threshold_index is not None:
            mask = self.sub_kept[threshold_index]
            cols, src = cols[mask], src[:, mask]
        out = torch.zeros(sub.shape[0], self.num_bins + 1, dtype=torch.float64, device=sub.device)
        return out.index_add_(1, cols, src)


def even_sub_stats_1d(
    binner: EvenBinner, values: Tensor, groups: Tensor | None = None, num_groups: int = 1, weights: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-(group, sub-bin) counts, value sums and (optional) weight sums, all float64,
    for a 1-D tensor of values. Shapes (num_groups, num_sub)."""
    s = binner.num_sub
    if (weights is None or weights.dtype == torch.bool) and _fast.usable(values, min_elements=_fast.FAST_MIN_VALUES):
        return _fast.even_histogram(values, binner.boundaries, groups, num_groups, weights)
    idx = binner.sub_index(values)
    if groups is not None:
        idx = groups * s + idx
    n_out = num_groups * s
    sums = bincount(idx, weights=values, minlength=n_out).view(num_groups, s)
    wsum = None
    if weights is not None and weights.dtype == torch.bool:
        # one unweighted count of (slot, flag) pairs gives both the counts and the flag sums
        both = bincount(idx + n_out * weights.to(torch.int64), minlength=2 * n_out)
        counts = (both[:n_out] + both[n_out:]).view(num_groups, s)
        wsum = both[n_out:].view(num_groups, s)
    else:
        counts = bincount(idx, minlength=n_out).view(num_groups, s)
        if weights is not None:
            wsum = bincount(idx, weights=weights, minlength=n_out).view(num_groups, s)
    return counts, sums, wsum


def even_sub_stats_2d(binner: EvenBinner, probs: Tensor, *, columns: bool) -> tuple[Tensor, Tensor]:
    """Counts and sums over every entry of an (N, K) matrix, in row chunks.

    ``columns=True``: one group per column -> (K, num_sub); else one pooled group -> (1, num_sub).
    """
    if _fast.usable(probs):
        return _fast.even_histogram_2d(probs, binner.boundaries, columns)
    n, k = probs.shape
    s = binner.num_sub
    g = k if columns else 1
    counts = torch.zeros(g * s, dtype=torch.float64, device=probs.device)
    sums = torch.zeros(g * s, dtype=torch.float64, device=probs.device)
    offsets = torch.arange(k, device=probs.device) * s if columns else None
    step = max(1, CHUNK_ELEMENTS // max(k, 1))
    for r0 in range(0, n, step):
        chunk = probs[r0 : r0 + step]
        idx = binner.sub_index(chunk)
        if offsets is not None:  # columns
            idx += offsets  # entry (i, c) -> slot c * num_sub + sub-bin
        flat = idx.reshape(-1)
        counts += bincount(flat, minlength=g * s)
        sums += bincount(flat, weights=chunk.reshape(-1), minlength=g * s)
    return counts.view(g, s), sums.view(g, s)


# ----------------------------------------------------------------------------------
# adaptive bins
# ----------------------------------------------------------------------------------
def adaptive_edge_offsets(n: Tensor, num_bins: int) -> Tensor:
    """(G, B) indices round(linspace(0, n_g, B, endpoint=False)) clipped to [0, n_g - 1].

    Same float64 arithmetic as numpy's linspace (i * (n / B)) and round-half-to-even.
    """
    step = n.to(torch.float64) / num_bins
    i = torch.arange(num_bins, dtype=torch.float64, device=n.device)
    idx = torch.round(i.unsqueeze(0) * step.unsqueeze(1)).to(torch.int64)
    idx = torch.minimum(idx, (n - 1).unsqueeze(1))
    return idx.clamp_min(0)


@dataclass
class AdaptiveStats:
    counts: Tensor  # (G, B) float64
    sums: Tensor  # (G, B) float64 sums of values
    edges: Tensor  # (G, B - 1) upper edges (values of the working dtype)
    kept: Tensor  # (G,) int64 group sizes after thresholding
    correct: Tensor | None = None  # (G, B) float64 when correctness came with the values


def adaptive_bin_index(values: Tensor, edges: Tensor, groups: Tensor | None = None) -> Tensor:
    """Bin of each value = number of its group's edges <= value (np.digitize, right=False)."""
    if edges.shape[1] == 0:
        return torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    if groups is None:
        return torch.searchsorted(edges[0].contiguous(), values, right=True)
    return torch.searchsorted(edges[groups], values.unsqueeze(1), right=True).squeeze(1)


def adaptive_stats_rows(rows: Tensor, thresholds: Sequence[float | None], num_bins: int) -> list[AdaptiveStats]:
    """Adaptive-bin statistics of each row of ``rows`` (G, L), every row its own group.

    ``rows`` must be sorted ascending along dim 1. Bins are contiguous position ranges of a
    sorted row, so counts come from searchsorted positions and sums from a float64 cumsum:
    O(G*L) work, no per-element bin index.
    """
    g, length = rows.shape
    dev = rows.device
    csum = torch.nn.functional.pad(torch.cumsum(rows, dim=1, dtype=torch.float64), (1, 0))
    full = torch.full((g, 1), length, dtype=torch.int64, device=dev)
    out = []
    for t in thresholds:
        tf = floor_threshold(t, rows.dtype)
        if tf == -np.inf:
            start = torch.zeros(g, dtype=torch.int64, device=dev)
        else:
            q = torch.full((g, 1), tf, dtype=rows.dtype, device=dev)
            start = torch.searchsorted(rows, q, right=True).squeeze(1)
        kept = length - start
        pos = (start.unsqueeze(1) + adaptive_edge_offsets(kept, num_bins)).clamp_max(length - 1)
        edges = rows.gather(1, pos[:, 1:])
        inner = torch.searchsorted(rows, edges, right=False)
        bounds = torch.cat((start.unsqueeze(1), inner, full), dim=1)
        bounds = torch.where((kept > 0).unsqueeze(1), bounds, full)
        counts = (bounds[:, 1:] - bounds[:, :-1]).to(torch.float64)
        sums = csum.gather(1, bounds[:, 1:]) - csum.gather(1, bounds[:, :-1])
        out.append(AdaptiveStats(counts, sums, edges, kept))
    return out


def _sort_1d(values: Tensor) -> tuple[Tensor, Tensor]:
    order = argsort_1d(values)
    return values[order], order


def adaptive_stats_1d(
    values: Tensor,
    correct: Tensor,
    thresholds: Sequence[float | None],
    num_bins: int,
    groups: Tensor | None = None,
    num_groups: int = 1,
    presorted: tuple[Tensor, Tensor] | None = None,
) -> list[AdaptiveStats]:
    """Adaptive-bin statistics of 1-D values (optionally split into groups), with correctness.

    Values are sorted once (``presorted`` = (sorted values, sorting permutation) may be passed), then
    stably re-sorted by group so each group's values are a contiguous ascending segment.
    """
    dev = values.device
    b = num_bins
    if groups is None:
        seg_vals = presorted[0] if presorted is not None else sort_values(values)
        m = torch.tensor([values.numel()], dtype=torch.int64, device=dev)
    else:
        sorted_vals, order = presorted if presorted is not None else _sort_1d(values)
        perm = argsort_1d(groups[order], stable=True)
        seg_vals = sorted_vals[perm]
        m = torch.bincount(groups, minlength=num_groups)
    off = torch.cumsum(m, 0) - m
    last = max(values.numel() - 1, 0)
    out = []
    for t in thresholds:
        keep = values > floor_threshold(t, values.dtype)
        if groups is None:
            kept = keep.sum().reshape(1)
        else:
            kept = torch.bincount(groups[keep], minlength=num_groups)
        start = off + m - kept
        pos = (start.unsqueeze(1) + adaptive_edge_offsets(kept, b)).clamp(0, last)
        edges = seg_vals[pos[:, 1:]]
        idx = adaptive_bin_index(values, edges, groups)
        if groups is not None:
            idx = groups * b + idx
        idx = torch.where(keep, idx, num_groups * b)  # dropped values go to a trash slot
        n_out = num_groups * b + 1
        counts = bincount(idx, minlength=n_out)[:-1].view(num_groups, b)
        sums = bincount(idx, weights=values, minlength=n_out)[:-1].view(num_groups, b)
        corr = bincount(idx, weights=correct, minlength=n_out)[:-1].view(num_groups, b)
        out.append(AdaptiveStats(counts, sums, edges, kept, corr))
    return out


# ----------------------------------------------------------------------------------
# from bin statistics to an error
# ----------------------------------------------------------------------------------
def group_errors(counts: Tensor, conf_sums: Tensor, correct_sums: Tensor, norm: str) -> Tensor:
    """Per-group calibration error from (G, bins) float64 statistics.

    l1:  sum_b |C_b - S_b| / n          (= sum_b n_b/n * |acc_b - conf_b|)
    l2:  sum_b (C_b - S_b)^2 / (n_b n)  (= sum_b n_b/n * (acc_b - conf_b)^2; root taken later)
    max: max_b |C_b - S_b| / n_b        (= max over non-empty bins of |acc_b - conf_b|)
    n = group size after thresholding; empty bins and empty groups add 0.
    """
    diff = correct_sums - conf_sums
    n = counts.sum(dim=1)
    safe_n = n.clamp_min(1.0)
    nonempty = counts > 0
    safe_counts = counts.clamp_min(1.0)
    if norm == "l1":
        err = diff.abs().sum(dim=1) / safe_n
    elif norm == "l2":
        err = torch.where(nonempty, diff.square() / safe_counts, 0.0).sum(dim=1) / safe_n
    elif norm == "max":
        err = torch.where(nonempty, diff.abs() / safe_counts, 0.0).amax(dim=1)
    else:  # pragma: no cover - validated by the callers
        raise ValueError(f"unknown norm {norm!r}")
    return torch.where(n > 0, err, 0.0)


def combine(errors: Tensor, norm: str, class_conditional: bool, num_classes: int) -> Tensor:
    """Class-conditional: sum of the K group errors / K (K = number of columns, even for
    classes without samples). Pooled: the single group's error. l2: one root, at the end."""
    total = errors.sum() / num_classes if class_conditional else errors.reshape(-1)[0]
    return total.sqrt() if norm == "l2" else total

"""Paired bootstrap over examples for every metric of :func:`compute_all`.

A resample is a vector of multinomial counts ``w`` (how often each example is drawn), so a
statistic of the resample is a *weighted* statistic of the original data. Drawing the counts
once per split (:func:`resample_counts`) and evaluating every trial on the same counts makes
the bootstrap *paired*: the difference of two trials' replicates is a replicate of their
difference, with its own confidence interval.

Everything goes through the binning core, without a Python loop over resamples:

* per-row scores (accuracy, NLL, Brier) and even-binned statistics (ECE, MCE, SCE,
  classwise-ECE) are the counts matrix times a design matrix of per-example bin memberships,
  one matrix product (column blocks bound its memory);
* adaptive (equal-mass) bins are re-derived in every resample, as the estimator would do on
  that data: along the sorted values, cumulative counts locate each resample's edge
  positions (``round(linspace(0, n, B))`` of the resample's kept values), and cumulative
  weighted sums give the bin statistics (RMSCE, ACE, TACE);
* AURC keeps the confidence order; tie blocks get the resample's risk of their block.

Replicates are accumulated in float32 (counts are exact integers there; sums carry a relative
error of ~1e-6), which is ample for confidence intervals; point estimates come from
:func:`compute_all` itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import _fast
from . import binning as _binning
from ._inputs import MetricInputs, check_num_bins, prepare
from .binning import EvenBinner, adaptive_edge_offsets, argsort_1d, floor_threshold, group_errors
from .scores import METRIC_NAMES, brier_per_row

__all__ = ["resample_counts", "bootstrap_metrics", "percentile_interval", "centered_interval", "prob_not_greater"]

_WORK = torch.float32
BinStats = tuple[Tensor, Tensor, Tensor]  # (counts, value sums, correctness sums), float64


def resample_counts(n: int, num_resamples: int = 1000, *, seed: int = 0, device: Any = "cpu") -> Tensor:
    """(B, n) multinomial counts of a seeded bootstrap: the same seed and n give the same resamples."""
    if int(n) < 1:
        raise ValueError(f"resample_counts: n must be >= 1, got {n}")
    if int(num_resamples) < 1:
        raise ValueError(f"resample_counts: num_resamples must be >= 1, got {num_resamples}")
    if n >= 1 << 24:
        raise ValueError(f"resample_counts: n = {n} is too large for exact float32 counts (max 2^24 - 1)")
    b, n = int(num_resamples), int(n)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), n, b]))
    draws = rng.integers(0, n, size=(b, n), dtype=np.int64)
    draws += (np.arange(b, dtype=np.int64) * n)[:, None]
    counts = np.bincount(draws.reshape(-1), minlength=b * n).reshape(b, n).astype(np.float32)
    return torch.from_numpy(counts).to(device)


class _Replicates:
    """Bin statistics of M rows (resample x group) for one threshold, either collapsed
    (``stats``, (M, bins) tensors) or per sub-bin from the compiled kernels (``sub``, (M, S)
    float64 arrays, sub-bin s counted in bin ``bin_of[s]`` when ``keep[s]``)."""

    def __init__(
        self,
        stats: BinStats | None = None,
        sub: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        bin_of: np.ndarray | None = None,
        keep: np.ndarray | None = None,
    ):
        self.stats, self.sub, self.bin_of, self.keep = stats, sub, bin_of, keep

    def errors(self, norm: str) -> Tensor:
        """Calibration error of each row, (M,) float64 (binning.group_errors)."""
        if self.sub is not None:
            assert self.bin_of is not None and self.keep is not None
            return _fast.bin_errors(*self.sub, norm, self.bin_of, self.keep, int(self.bin_of.max()) + 1)
        assert self.stats is not None
        return group_errors(*self.stats, norm)


def _even_replicates(w: Tensor, binner: EvenBinner, values: Tensor, correct: Tensor) -> list[_Replicates]:
    """Even-bin (counts, value sums, correctness sums) per resample and column of ``values`` (N, C),
    each column its own group: (B * C, B_bins + 1) per threshold of ``binner``.

    Per threshold, column j's bins occupy slots [j * (B_bins + 1), (j + 1) * (B_bins + 1)) of a
    design matrix per statistic (entries the threshold drops weigh 0), multiplied by the counts;
    column blocks keep each design matrix within the chunk budget."""
    n, c = values.shape
    nb = binner.num_bins + 1
    b = w.shape[0]
    sub = binner.sub_index(values.contiguous())
    if _fast.usable(w, min_elements=1) and values.device.type == "cpu" and bool((correct.sum(dim=1) <= 1).all()):
        # each row is correct in at most one column: one scatter pass per resample, no design matrix
        corr_col = torch.where(correct.any(dim=1), correct.to(torch.int8).argmax(dim=1), -1)
        cnt_s, sums_s, corr_s = _fast.even_replicates_scatter(w, sub, values.contiguous(), corr_col, binner.num_sub)
        flat = tuple(t.numpy().reshape(b * c, binner.num_sub) for t in (cnt_s, sums_s, corr_s))
        bin_of = binner.sub_bin.numpy()
        return [
            _Replicates(sub=flat, bin_of=bin_of, keep=binner.sub_kept[i].numpy())  # type: ignore[arg-type]
            for i in range(len(binner.thresholds))
        ]
    bins = binner.sub_bin[sub]
    out = []
    for i in range(len(binner.thresholds)):
        kept = binner.sub_kept[i][sub].to(_WORK)
        stats = [torch.empty(b, c * nb, dtype=_WORK, device=w.device) for _ in range(3)]
        block = max(1, _binning.CHUNK_ELEMENTS // max(n * nb, 1))
        for c0 in range(0, c, block):
            c1 = min(c, c0 + block)
            slot = bins[:, c0:c1] + torch.arange(c1 - c0, device=w.device) * nb
            k = kept[:, c0:c1]
            srcs = (k, k * values[:, c0:c1].to(_WORK), k * correct[:, c0:c1].to(_WORK))
            for stat, src in zip(stats, srcs, strict=True):
                design = torch.zeros(n, (c1 - c0) * nb, dtype=_WORK, device=w.device).scatter_(1, slot, src)
                stat[:, c0 * nb : c1 * nb] = w @ design
        cnt, sums, corr = (t.reshape(b * c, nb).double() for t in stats)
        out.append(_Replicates(stats=(cnt, sums, corr)))
    return out


def _sorted_group(values: Tensor, thresholds: Sequence[float | None]) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """(order, sorted values, tie-block starts, first kept index per threshold) of one group."""
    order = argsort_1d(values)
    v = values[order]
    tie_start = torch.searchsorted(v, v, right=False)  # first sorted index of each value's tie block
    starts = []
    for t in thresholds:
        tf = floor_threshold(t, v.dtype)
        starts.append(
            0
            if tf == -np.inf
            else int(torch.searchsorted(v, torch.tensor(tf, dtype=v.dtype, device=v.device), right=True))
        )
    return order, v, tie_start, starts


def _adaptive_replicates(
    w: Tensor, groups: Sequence[tuple[Tensor, Tensor]], thresholds: Sequence[float | None], num_bins: int
) -> list[_Replicates]:
    """Adaptive-bin (counts, value sums, correctness sums) of G groups, each given as (N values,
    correctness): (G * B, bins) per threshold (group-major), each resample's edges derived from
    its own kept values. The sort of each group is shared by all resamples."""
    if _fast.usable(w, min_elements=1) and groups[0][0].device.type == "cpu":
        # every group sorted at once in numpy: order, sorted values, tie-block starts, kept starts
        vals = np.stack([values.numpy() for values, _ in groups])
        order_np = np.argsort(vals, axis=1, kind="stable")
        v_np = np.take_along_axis(vals, order_np, axis=1)
        idx = np.broadcast_to(np.arange(v_np.shape[1]), v_np.shape)
        new_block = np.ones(v_np.shape, dtype=bool)
        new_block[:, 1:] = v_np[:, 1:] != v_np[:, :-1]
        tie_np = np.maximum.accumulate(np.where(new_block, idx, 0), axis=1)
        starts_np = np.stack(
            [
                np.zeros(len(groups), np.int64)
                if floor_threshold(t, groups[0][0].dtype) == -np.inf
                else (v_np <= floor_threshold(t, groups[0][0].dtype)).sum(axis=1)
                for t in thresholds
            ],
            axis=1,
        )
        c_np = np.take_along_axis(np.stack([correct.numpy() for _, correct in groups]), order_np, axis=1)
        cnt, sums, corr = _fast.adaptive_replicates_groups(  # compact arrays: fewer bytes per resample
            w,
            torch.from_numpy(order_np.astype(np.int32)),
            torch.from_numpy(np.ascontiguousarray(v_np)),
            torch.from_numpy(c_np.astype(np.float32)),
            torch.from_numpy(tie_np),
            torch.from_numpy(starts_np.astype(np.int64)),
            num_bins,
        )
        b = w.shape[0]
        ident = np.arange(num_bins)
        every = np.ones(num_bins, dtype=bool)
        return [
            _Replicates(
                sub=tuple(t[i].numpy().reshape(len(groups) * b, num_bins) for t in (cnt, sums, corr)),  # type: ignore[arg-type]
                bin_of=ident,
                keep=every,
            )
            for i in range(len(thresholds))
        ]
    sorted_groups = [(_sorted_group(values, thresholds), correct) for values, correct in groups]
    per_group = [
        _adaptive_replicates_torch(w, order, v, correct[order], tie_start, starts, num_bins)
        for (order, v, tie_start, starts), correct in sorted_groups
    ]
    return [
        _Replicates(stats=tuple(torch.cat([g[i][s] for g in per_group]) for s in range(3)))  # type: ignore[arg-type]
        for i in range(len(thresholds))
    ]


def _adaptive_replicates_torch(
    w: Tensor, order: Tensor, v: Tensor, correct: Tensor, tie_start: Tensor, starts: list[int], num_bins: int
) -> list[BinStats]:
    """One group's adaptive-bin replicates by cumulative sums over the sorted order (torch)."""
    n = v.numel()
    c = correct.to(_WORK)
    wv = w[:, order]  # (B, N)
    cw = torch.nn.functional.pad(torch.cumsum(wv, dim=1), (1, 0))  # resample positions before each entry
    cs = torch.nn.functional.pad(torch.cumsum(wv * v.to(_WORK), dim=1), (1, 0))
    cc = torch.nn.functional.pad(torch.cumsum(wv * c, dim=1), (1, 0))
    total = cw[:, -1]
    out = []
    for s0 in starts:
        before = cw[:, s0]
        kept = (total - before).round().to(torch.int64)
        pos = before.unsqueeze(1) + adaptive_edge_offsets(kept, num_bins)[:, 1:].to(_WORK)  # (B, bins - 1)
        # the entry holding resample position q is the first whose cumulative count exceeds q
        src = torch.searchsorted(cw[:, 1:].contiguous(), pos.contiguous(), right=True).clamp_max(n - 1)
        inner = tie_start[src]  # values equal to an edge belong to the bin above it
        b = w.shape[0]
        bounds = torch.cat(
            (
                torch.full((b, 1), s0, dtype=torch.int64, device=w.device),
                inner,
                torch.full((b, 1), n, dtype=torch.int64, device=w.device),
            ),
            dim=1,
        )
        bounds = torch.where((kept > 0).unsqueeze(1), bounds, n)
        cnt, sums, corr = (
            (cum.gather(1, bounds[:, 1:]) - cum.gather(1, bounds[:, :-1])).double() for cum in (cw, cs, cc)
        )
        out.append((cnt, sums, corr))
    return out


def _aurc_replicates(w: Tensor, x: MetricInputs) -> Tensor:
    conf_sorted, order = x.sorted_conf()  # ascending
    err = (~x.correct())[order].to(_WORK)
    if _fast.usable(w, min_elements=1):
        return _fast.aurc_replicates(w, order, err, torch.searchsorted(conf_sorted, conf_sorted, right=False))
    wv = w[:, order]
    cw = torch.nn.functional.pad(torch.cumsum(wv, dim=1), (1, 0))
    ce = torch.nn.functional.pad(torch.cumsum(wv * err, dim=1), (1, 0))
    first = torch.searchsorted(conf_sorted, conf_sorted, right=False)
    accepted = cw[:, -1:] - cw[:, first]  # weight of rows at least as confident as the block
    risk = (ce[:, -1:] - ce[:, first]) / accepted.clamp_min(1.0)
    return ((wv * risk).sum(dim=1) / cw[:, -1]).double()


def _replicates_from_inputs(x: MetricInputs, w: Tensor, num_bins: int, names: Sequence[str]) -> dict[str, Tensor]:
    k, b = x.num_classes, w.shape[0]
    w = w.to(device=x.device, dtype=_WORK)
    out: dict[str, Tensor] = {}
    want = set(names)
    if want & {"accuracy", "nll", "brier"}:
        total = w.sum(dim=1).double()
    rows = {
        "accuracy": lambda: x.correct().to(_WORK),
        "nll": lambda: x.nll_per_row().to(_WORK),
        "brier": lambda: brier_per_row(x).to(_WORK),
    }
    row_names = [name for name in rows if name in want]
    if row_names:
        vals = torch.stack([rows[name]() for name in row_names], dim=1)  # (N, R)
        finite = torch.isfinite(vals)
        means = (w @ torch.where(finite, vals, 0.0)).double() / total.unsqueeze(1)  # one pass over w
        for j, name in enumerate(row_names):
            out[name] = means[:, j].contiguous()
            if not bool(finite[:, j].all()):  # -log 0 = inf in every resample that draws such a row
                out[name][w[:, ~finite[:, j]].sum(dim=1) > 0] = torch.inf
    conf, _ = x.top()
    correct = x.correct()
    if want & {"ece", "mce"}:
        binner = EvenBinner(num_bins, [0.0], x.dtype, x.device)
        (top,) = _even_replicates(w, binner, conf.unsqueeze(1), correct.unsqueeze(1))
        for name, norm in (("ece", "l1"), ("mce", "max")):
            if name in want:
                out[name] = top.errors(norm)
    if want & {"sce", "classwise_ece"}:
        binner = EvenBinner(num_bins, [0.0, None], x.dtype, x.device)
        onehot = x.labels.unsqueeze(1) == torch.arange(k, device=x.device)
        stats = _even_replicates(w, binner, x.probs, onehot)
        for name, st in zip(("sce", "classwise_ece"), stats, strict=True):
            if name in want:
                out[name] = st.errors("l1").view(b, k).sum(dim=1) / k
    if "rmsce" in want:
        (top_adaptive,) = _adaptive_replicates(w, [(conf, correct)], [0.0], num_bins)
        out["rmsce"] = top_adaptive.errors("l2").sqrt()
    if want & {"ace", "tace"}:
        columns = [(x.probs[:, cls].contiguous(), x.labels == cls) for cls in range(k)]
        stats = _adaptive_replicates(w, columns, [0.0, 0.01], num_bins)
        for name, st in zip(("ace", "tace"), stats, strict=True):
            if name in want:
                out[name] = st.errors("l1").view(k, b).sum(dim=0) / k
    if "aurc" in want:
        out["aurc"] = _aurc_replicates(w, x)
    return {name: out[name] for name in names}


def bootstrap_metrics(
    probs: Any,
    labels: Any,
    counts: Tensor,
    *,
    num_bins: int = 15,
    from_logits: bool = False,
    names: Sequence[str] = METRIC_NAMES,
) -> dict[str, Tensor]:
    """Bootstrap replicates (B,) float64 of each metric in ``names`` under the resample ``counts`` (B, N)."""
    num_bins = check_num_bins(num_bins)
    unknown = [m for m in names if m not in METRIC_NAMES]
    if unknown:
        raise ValueError(f"bootstrap_metrics: unknown metric {unknown[0]!r}; allowed: {', '.join(METRIC_NAMES)}")
    x = prepare(probs, labels, from_logits=from_logits)
    if counts.ndim != 2 or counts.shape[1] != x.n:
        raise ValueError(
            f"bootstrap_metrics: counts must have shape (B, {x.n}) for {x.n} examples; got {tuple(counts.shape)}"
        )
    return _replicates_from_inputs(x, counts, num_bins, names)


def percentile_interval(replicates: Tensor, level: float = 0.95) -> tuple[float, float]:
    """Two-sided percentile interval of bootstrap replicates at ``level``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a = (1.0 - level) / 2.0
    q = torch.quantile(replicates.double().cpu(), torch.tensor([a, 1.0 - a], dtype=torch.float64))
    return float(q[0]), float(q[1])


def centered_interval(
    replicates: Tensor, point: float, level: float = 0.95, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> tuple[float, float]:
    """Percentile interval of the replicates shifted so that their mean is the point estimate, kept within the
    metric's own `bounds` (an accuracy's [0, 1]: the shift can push a small split's interval past them).

    Binned calibration errors are biased upwards, and more so on resamples (duplicated rows),
    so plain percentile intervals of a well-calibrated model's ECE can lie entirely above its
    estimate. Removing the bootstrap's bias keeps the spread and centres it on the estimate;
    by simulation (`python -m benchmarks.perf.bench_bootstrap --coverage`) it covers a known ECE at least as
    often as the plain interval, and identically for unbiased metrics such as accuracy.
    """
    r = replicates.double()
    finite = r[torch.isfinite(r)]
    if finite.numel() == 0 or not np.isfinite(point):
        return float(point), float(point)
    lo, hi = percentile_interval(finite - (finite.mean() - point), level)
    return max(lo, bounds[0]), min(hi, bounds[1])


def prob_not_greater(replicates: Tensor) -> float:
    """Bootstrap p-value of the one-sided claim "the quantity is > 0": the share of replicates <= 0."""
    return float((replicates <= 0).double().mean())

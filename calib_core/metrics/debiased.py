"""Calibration-error estimators with less bias than plug-in binned ECE (docs/design.md section 10).

* :func:`debiased_l2_ce` - Kumar, Liang & Ma 2019 ("Verified Uncertainty Calibration"): the
  debiased L2 calibration error over equal-mass bins, numbers of PyPI
  ``uncertainty-calibration`` 0.1.4 (module ``calibration``).
* :func:`ece_sweep` - Roelofs et al. 2022 ("Mitigating Bias in Calibration Error Estimation"):
  equal-mass ECE at the largest bin count whose bin accuracies are monotone.
* :func:`smooth_ece` - Blasiok & Nakkiran 2023 ("Smooth ECE"): kernel-smoothed ECE with the
  automatic bandwidth, numbers of PyPI ``relplot`` 1.0.3 (``relplot.smECE``).

All three are top-label metrics on (confidence = max probability, correct = argmax == label)
pairs (``debiased_l2_ce`` also has ``mode="marginal"``). Inputs are validated by
:func:`calib_core.metrics._inputs.prepare`, so they accept and reject exactly what the other
metrics do; binary (N,) / (N, 1) inputs become (N, 2) rows ``[1 - p, p]`` first, so the
top-label confidence of a binary problem is max(p, 1 - p). Work is torch-native, on the
inputs' device, with float64 statistics; the result is a Python float for numpy input and a
0-dim tensor (input dtype) for torch input. Parity with the references is tested in
tests/unit/calib_core/test_metrics_debiased.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import binning as _binning
from ._inputs import check_bool, check_choice, check_num_bins, prepare
from .binning import bincount, sort_values
from .calibration_error import gce_from_inputs

__all__ = ["debiased_l2_ce", "ece_sweep", "smooth_ece", "DEBIASED_MODES", "SWEEP_NORMS"]

DEBIASED_MODES = ("top-label", "marginal")
SWEEP_NORMS = ("l1", "l2")


# ----------------------------------------------------------------------------------
# Kumar et al. 2019: debiased L2 calibration error
# ----------------------------------------------------------------------------------
def _equal_mass_edges(sorted_rows: Tensor, num_bins: int) -> Tensor:
    """(G, b) upper bin edges of ``calibration.get_equal_bins`` for each sorted row.

    The reference splits the sorted values with ``np.array_split`` into b = min(B, n) parts
    (the first n % b parts one longer), puts an edge half-way between the last value of a
    part and the first of the next, computed in the values' own dtype as it does, and ends
    with 1.0. It then drops duplicate edges; we keep them: a value goes to the first edge
    >= it (``np.searchsorted`` left), so a duplicate edge only adds an empty bin, and empty
    bins add nothing to the error.
    """
    g, n = sorted_rows.shape
    b = min(num_bins, n)
    i = torch.arange(1, b, device=sorted_rows.device)
    starts = i * (n // b) + torch.clamp(i, max=n % b)  # first index of parts 1..b-1
    mids = (sorted_rows[:, starts - 1] + sorted_rows[:, starts]) / 2.0
    return torch.cat((mids, torch.ones(g, 1, dtype=sorted_rows.dtype, device=sorted_rows.device)), dim=1)


def _debiased_square_ce(values: Tensor, targets: Tensor, sorted_rows: Tensor, num_bins: int) -> Tensor:
    """Per-row ``calibration.unbiased_square_ce`` (not clipped, no root), float64, shape (G,).

    Each bin with n_b >= 2 adds (n_b / n) * [(mean conf - mean label)^2 - m (1 - m) / (n_b - 1)]
    with m its mean label; bins with fewer than 2 values add 0 (as the reference does).
    """
    g, n = values.shape
    edges = _equal_mass_edges(sorted_rows, num_bins)
    b = edges.shape[1]
    idx = torch.searchsorted(edges, values.contiguous(), right=False)  # values <= 1.0 = last edge
    idx = (idx + torch.arange(g, device=idx.device).unsqueeze(1) * b).reshape(-1)
    counts = bincount(idx, minlength=g * b).view(g, b)
    conf = bincount(idx, weights=values.reshape(-1), minlength=g * b).view(g, b)
    hits = bincount(idx, weights=targets.reshape(-1), minlength=g * b).view(g, b)
    safe = counts.clamp_min(2.0)
    mean_label = hits / safe
    err = (conf / safe - mean_label).square() - mean_label * (1.0 - mean_label) / (safe - 1.0)
    err = torch.where(counts >= 2, err, 0.0)
    return (counts / n * err).sum(dim=1)


def debiased_l2_ce(
    probs: Any, labels: Any, *, num_bins: int = 15, mode: str = "top-label", from_logits: bool = False
) -> Tensor | float:
    """Debiased L2 calibration error (Kumar et al. 2019) over equal-mass bins; returns the root.

    What it returns, exactly: with the values split into b = min(num_bins, N) equal-mass bins
    as ``calibration.get_equal_bins`` does (edges half-way between neighbouring parts, a value
    on an edge belongs to the lower bin),

        S = sum_b (n_b / N) * [(mean conf_b - acc_b)^2 - acc_b (1 - acc_b) / (n_b - 1)]

    (bins with n_b < 2 add 0), and the result is ``sqrt(max(S, 0))``: the *root* of the
    debiased squared error, clipped at 0, on the scale of RMSCE. This is what
    ``calibration.lower_bound_scaling_ce(probs, labels, p=2, debias=True, num_bins=num_bins,
    binning_scheme=calibration.get_equal_bins, mode=mode)`` returns (uncertainty-calibration
    0.1.4), and so what ``calibration.get_calibration_error(probs, labels)`` returns unless
    its heuristic decides the outputs are discrete (fewer than N/4 distinct values in every
    column), in which case the reference bins by distinct value instead; this function never
    does that.

    Args:
        probs: (N, K) probabilities (or logits with ``from_logits``), or (N,) / (N, 1)
            positive-class probabilities of a binary problem (made (N, 2) first).
        labels: (N,) integer class labels in [0, K).
        num_bins: number of equal-mass bins B >= 1 (at most N are used).
        mode: ``"top-label"`` (confidence = max probability, target = argmax == label) or
            ``"marginal"`` (every class column binned on its own against the one-hot label;
            the result is sqrt(mean over the K columns of max(S_k, 0))).
        from_logits: apply softmax (sigmoid for binary shapes) first.

    Returns:
        Python float for numpy input, 0-dim tensor on the input's device for torch input.

    Raises:
        ValueError: bad input (as every metric), num_bins < 1, or an unknown mode.
    """
    num_bins = check_num_bins(num_bins)
    mode = check_choice("mode", mode, DEBIASED_MODES)
    x = prepare(probs, labels, from_logits=from_logits)
    if mode == "top-label":
        conf, _ = x.top()
        sq = _debiased_square_ce(conf.unsqueeze(0), x.correct().unsqueeze(0), x.sorted_conf()[0].unsqueeze(0), num_bins)
        return x.finish(sq.clamp_min(0.0).sum().sqrt())
    # marginal: column blocks of a fixed element budget bound the (block, N) temporaries
    k, n = x.num_classes, x.n
    block = max(1, _binning.CHUNK_ELEMENTS // max(n, 1))
    parts = []
    for c0 in range(0, k, block):
        cols = x.probs[:, c0 : c0 + block].t().contiguous()
        onehot = x.labels.unsqueeze(0) == torch.arange(c0, c0 + cols.shape[0], device=x.device).unsqueeze(1)
        parts.append(_debiased_square_ce(cols, onehot, sort_values(cols), num_bins))
    sq = torch.cat(parts)
    return x.finish(sq.clamp_min(0.0).mean().sqrt())


# ----------------------------------------------------------------------------------
# Roelofs et al. 2022: ECE_sweep
# ----------------------------------------------------------------------------------
#: Element budget of one batch of candidate bin counts in the sweep.
_SWEEP_BUDGET = 1 << 20
#: Candidate bin counts in the first batch (the chosen count is usually small).
_SWEEP_FIRST = 32


def _monotone(sorted_vals: Tensor, cum_correct: Tensor, bs: Tensor) -> Tensor:
    """For each bin count in ``bs`` (M,), whether the equal-mass bin accuracies are
    non-decreasing in confidence (empty bins skipped). Returns (M,) bool.

    Bins are those of ``binning.adaptive_stats_1d`` (the repo's adaptive binning): edge
    indices round(i * n / b) for i = 1..b-1 (float64, round half to even, as
    ``binning.adaptive_edge_offsets``), value edges, a value's bin = number of edges <= it.
    They are contiguous ranges of the sorted values, so bin counts and correct counts come
    from searchsorted positions and a cumulative sum; the whole batch at once.
    """
    n = sorted_vals.shape[0]
    dev = sorted_vals.device
    bmax = int(bs.max())
    i = torch.arange(1, bmax, dtype=torch.float64, device=dev)
    step = float(n) / bs.to(torch.float64)
    pos = torch.round(i.unsqueeze(0) * step.unsqueeze(1)).to(torch.int64).clamp(0, n - 1)  # (M, bmax - 1)
    inner = torch.searchsorted(sorted_vals, sorted_vals[pos], right=False)  # first position >= each edge
    inner = torch.where(i.unsqueeze(0) < bs.unsqueeze(1), inner, n)  # unused edges of smaller b: empty bins
    zeros = torch.zeros(bs.shape[0], 1, dtype=torch.int64, device=dev)
    bounds = torch.cat((zeros, inner, torch.full_like(zeros, n)), dim=1)
    counts = bounds[:, 1:] - bounds[:, :-1]
    hits = cum_correct[bounds[:, 1:]] - cum_correct[bounds[:, :-1]]
    nonempty = counts > 0
    # correct counts are exact integers in float64 and the division is correctly rounded, so
    # equal fractions compare equal and distinct ones (denominators <= n) keep their order
    acc = torch.where(nonempty, hits / counts.clamp_min(1).to(torch.float64), -math.inf)
    best_before = torch.cummax(acc, dim=1).values[:, :-1]
    drop = nonempty[:, 1:] & (acc[:, 1:] < best_before)
    return ~drop.any(dim=1)


def _sweep_num_bins(sorted_vals: Tensor, sorted_correct: Tensor) -> int:
    """The number of bins of ECE_sweep: scanning b = 1, 2, ..., the last b before the first
    one whose bin accuracies are not monotone (N if none)."""
    n = sorted_vals.shape[0]
    dev = sorted_vals.device
    cum = torch.nn.functional.pad(torch.cumsum(sorted_correct.to(torch.float64), 0), (1, 0))
    # Bins at b = N are the tie blocks; every b <= N merges contiguous tie blocks, and block
    # means of a non-decreasing sequence are non-decreasing, so monotone at N means monotone
    # everywhere (all correct, all wrong, or errors only below every correct prediction).
    if bool(_monotone(sorted_vals, cum, torch.tensor([n], device=dev))[0]):
        return n
    lo, size = 2, _SWEEP_FIRST  # b = 1 is one bin: always monotone
    while lo < n:
        hi = min(n - 1, lo + max(1, min(size, _SWEEP_BUDGET // (lo + size))) - 1)
        bs = torch.arange(lo, hi + 1, device=dev)
        ok = _monotone(sorted_vals, cum, bs)
        if not bool(ok.all()):
            return lo + int((~ok).nonzero()[0, 0]) - 1  # first failing b, minus one
        lo, size = hi + 1, size * 2
    return n - 1  # b = N failed above, every b < N passed


def ece_sweep(
    probs: Any, labels: Any, *, norm: str = "l1", from_logits: bool = False, return_num_bins: bool = False
) -> Tensor | float | tuple[Tensor | float, int]:
    """ECE_sweep (Roelofs et al. 2022): equal-mass top-label ECE at the largest monotone bin count.

    The number of bins b* is found by scanning b = 1, 2, ... and stopping before the first b
    whose bin accuracies (fraction correct per bin, bins in increasing confidence, empty bins
    skipped) are not monotone non-decreasing; b* = N when no b <= N breaks monotonicity. The
    result is the top-label calibration error over b* equal-mass bins:

    * ``norm="l1"`` (default, as our ECE family): sum_b (n_b / N) |acc_b - conf_b|;
    * ``norm="l2"``: sqrt(sum_b (n_b / N) (acc_b - conf_b)^2), the root taken at the end.

    The paper states ECE_sweep for an L_p norm; both choices are offered, l1 by default.
    Equal-mass bins are this package's adaptive bins (``binning="adaptive"``; edges at the
    sorted confidences of indices round(i N / b), a value on an edge in the upper bin, so tied
    confidences always share a bin and the result does not depend on the order of rows); the
    value equals ``calibration_error(..., num_bins=b*, binning="adaptive", top_label=True,
    norm=norm)``. Cost: O(N log N) for the sort plus O(b*^2) for the sweep (candidate counts are
    checked in batches, each in O(b log N) from cumulative sums), so a very large b* is slow.

    Args:
        probs: (N, K) probabilities (or logits with ``from_logits``), or (N,) / (N, 1)
            positive-class probabilities of a binary problem (made (N, 2) first).
        labels: (N,) integer class labels in [0, K).
        norm: ``"l1"`` or ``"l2"``.
        from_logits: apply softmax (sigmoid for binary shapes) first.
        return_num_bins: also return b*, as ``(value, b*)``.

    Returns:
        Python float for numpy input, 0-dim tensor on the input's device for torch input
        (and b* as an int with ``return_num_bins``).

    Raises:
        ValueError: bad input (as every metric) or an unknown norm.
    """
    norm = check_choice("norm", norm, SWEEP_NORMS)
    return_num_bins = check_bool("return_num_bins", return_num_bins)
    x = prepare(probs, labels, from_logits=from_logits)
    sorted_conf, order = x.sorted_conf()
    b = _sweep_num_bins(sorted_conf, x.correct()[order])
    # top-label confidences are >= 1/K > 0, so no threshold is involved
    value = x.finish(
        gce_from_inputs(
            x, num_bins=b, binning="adaptive", top_label=True, class_conditional=False, norm=norm, threshold=None
        )
    )
    return (value, b) if return_num_bins else value


# ----------------------------------------------------------------------------------
# Blasiok & Nakkiran 2023: smooth ECE (relplot 1.0.3 conventions)
# ----------------------------------------------------------------------------------
_SMECE_EPS = 1e-3  # relplot.smECE(eps=0.001): bandwidths below it pass the search untested
_SMECE_REFINE = 10  # relplot.metrics.search_param(refine=10) bisection steps
_SMECE_MESH = 200  # relplot.config.smECE_mesh_pts
_DENSITY_EPS = 1e-4  # relplot.kernels.BaseKernelMixin.smooth(eps=0.0001), added to the density
#: Smallest fixed bandwidth accepted: the grid has ~10 / sigma points (100k at 1e-4), so this bounds
#: memory; the automatic search never goes below 2^-9.
MIN_SIGMA = 1e-4


def _linspace01(num: int, device) -> Tensor:
    """``np.linspace(0, 1, num)`` bit for bit (i * step, last point exactly 1); torch's linspace
    computes the upper half from the end, which differs in the last bits."""
    if num == 1:
        return torch.zeros(1, dtype=torch.float64, device=device)
    t = torch.arange(num, dtype=torch.float64, device=device) * (1.0 / (num - 1))
    t[-1] = 1.0
    return t


def _grid_smooth(f: Tensor, weights: Tensor, sigma: float) -> Tensor:
    """relplot's ``ReflectedGaussianKernel(sigma).apply`` before interpolation, for C weight
    rows at once: (C, N) weights at points f -> (C, E) smoothed values on an E-point grid."""
    e = max(2000, round(20 / sigma)) // 2 + 1
    dev = f.device
    # smooth_round_to_grid: split each weight linearly between its two grid neighbours
    pos = f * (e - 1)
    lo = pos.to(torch.int64).clamp(0, e - 2)  # truncation, as numpy's astype(int), then clip
    frac = pos - lo
    c = weights.shape[0]
    rows = (torch.arange(c, device=dev) * e).unsqueeze(1)
    values = torch.zeros(c * e, dtype=torch.float64, device=dev)
    values.index_add_(0, (rows + lo).reshape(-1), ((1.0 - frac) * weights).reshape(-1))
    values.index_add_(0, (rows + lo + 1).reshape(-1), (frac * weights).reshape(-1))
    values = values.view(c, e)
    # GaussianKernel.kernel_ev: an unnormalised density on linspace(0, 1, e) centred at 0.5
    t = _linspace01(e, dev)
    ker = torch.exp(-(t - 0.5) * (t - 0.5) / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    # reflect at both ends, np.convolve(ext, ker, "valid")[e//2 : e//2 + e]; the full linear
    # convolution by FFT (O(e log e) rather than O(e^2); rounding far below the 1e-6 parity)
    flipped = torch.flip(values, dims=(1,))
    ext = torch.cat((flipped[:, :-1], values, flipped[:, 1:]), dim=1)  # length 3e - 2
    size = ext.shape[1] + e - 1
    full = torch.fft.irfft(torch.fft.rfft(ext, n=size) * torch.fft.rfft(ker, n=size), n=size)
    start = (e - 1) + e // 2  # "valid" output j is full output j + e - 1
    return full[:, start : start + e]


def _interpolate(t: Tensor, y: Tensor) -> Tensor:
    """relplot.kernels.interpolate: linear interpolation of y[:, i] at i / (E - 1), at points t."""
    cnt = y.shape[1]
    bucket = 1 / (cnt - 1)
    inds = (t * (cnt - 1)).to(torch.int64).clamp(0, cnt - 2)
    residual = (t - inds.to(t.dtype) * bucket) / bucket  # int64 * float would be float32 in torch
    return y[:, inds] * (1 - residual) + y[:, inds + 1] * residual


def _smece_at(f: Tensor, residual: Tensor, sigma: float) -> Tensor:
    """relplot.metrics.smooth_ece(f, y, sigma): 0-dim float64 tensor."""
    t = _linspace01(max(round(10 / sigma), _SMECE_MESH), f.device)
    smoothed = _grid_smooth(f, torch.stack((residual, torch.ones_like(residual))), sigma)
    ys, dens = _interpolate(t, smoothed)
    dens = dens + _DENSITY_EPS
    rs = ys / dens
    return (rs.abs() * dens).sum() / dens.sum()


def _check_sigma(sigma: Any) -> float | None:
    if sigma is None:
        return None
    if (
        isinstance(sigma, (bool, np.bool_))
        or not isinstance(sigma, (int, float, np.integer, np.floating))
        or not (MIN_SIGMA <= float(sigma) < math.inf)
    ):
        raise ValueError(f"sigma must be a finite number >= {MIN_SIGMA:g}, or None (automatic); got {sigma!r}")
    return float(sigma)


def smooth_ece(
    probs: Any, labels: Any, *, sigma: float | None = None, from_logits: bool = False, return_sigma: bool = False
) -> Tensor | float | tuple[Tensor | float, float]:
    """Smooth ECE (Blasiok & Nakkiran 2023) of the top label, as ``relplot.smECE`` computes it.

    On pairs (f = confidence, y = 1 if the argmax is the label else 0) the residuals f - y
    and the density are smoothed with a Gaussian kernel of bandwidth sigma, reflected at 0 and
    1 (relplot's ``ReflectedGaussianKernel``: the points are first spread onto a grid of
    max(2000, round(20 / sigma)) // 2 + 1 points, then convolved, then read off linearly at
    max(round(10 / sigma), 200) points t of [0, 1]); the result is

        sum_t |r(t)| d(t) / sum_t d(t),  d = smoothed density + 1e-4,  r = smoothed residual / d.

    With ``sigma=None`` the bandwidth is relplot's automatic choice (``smECE(f, y)``, eps
    0.001): sigma = 1 if smECE(1) > 1, else 10 bisection steps on (0, 1] for the fixed point
    sigma = smECE(sigma), returning the upper end (where sigma >= smECE(sigma)); bandwidths
    below 0.001 count as small enough without evaluation. A given ``sigma`` is relplot's
    ``smECE_sigma(f, y, sigma)``. Everything is float64; the search runs at most 11
    smoothings, each O(N + E log E) (FFT convolution), with one device sync per step.

    Args:
        probs: (N, K) probabilities (or logits with ``from_logits``), or (N,) / (N, 1)
            positive-class probabilities of a binary problem (made (N, 2) first, so the
            confidence is max(p, 1 - p), not p).
        labels: (N,) integer class labels in [0, K).
        sigma: fixed kernel bandwidth (>= 1e-4, ``MIN_SIGMA``), or None for the automatic one.
        from_logits: apply softmax (sigmoid for binary shapes) first.
        return_sigma: also return the bandwidth used, as ``(value, sigma)``.

    Returns:
        Python float for numpy input, 0-dim tensor on the input's device for torch input
        (and sigma as a float with ``return_sigma``).

    Raises:
        ValueError: bad input (as every metric) or a bad sigma.
    """
    sigma = _check_sigma(sigma)
    return_sigma = check_bool("return_sigma", return_sigma)
    x = prepare(probs, labels, from_logits=from_logits)
    conf, _ = x.top()
    f = conf.to(torch.float64)
    residual = f - x.correct().to(torch.float64)
    cache: dict[float, Tensor] = {}

    def at(s: float) -> Tensor:
        if s not in cache:
            cache[s] = _smece_at(f, residual, s)
        return cache[s]

    if sigma is None:

        def small_enough(alpha: float) -> bool:  # relplot's check_smooth_ece
            return alpha < _SMECE_EPS or alpha < float(at(alpha))

        # relplot.metrics.search_param(predicate, start=1, refine=10)
        sigma = 1.0
        if not small_enough(1.0):
            start, end = 1.0, 0.0
            for _ in range(_SMECE_REFINE):  # a few bisection steps, each one smoothing
                mid = (start + end) / 2
                if small_enough(mid):
                    end = mid
                else:
                    start = mid
            sigma = start
    value = x.finish(at(sigma))
    return (value, sigma) if return_sigma else value

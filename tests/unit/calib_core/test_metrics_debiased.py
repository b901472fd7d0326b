"""Parity of calib_core.metrics.debiased with independent references.

* ``debiased_l2_ce`` against PyPI uncertainty-calibration 0.1.4 (module ``calibration``, Kumar
  et al.'s own package): ``lower_bound_scaling_ce(..., p=2, debias=True,
  binning_scheme=get_equal_bins)``, which is what ``get_calibration_error`` computes for
  non-discrete outputs (checked too), top-label and marginal; and a hand-computed case.
* ``smooth_ece`` against PyPI relplot 1.0.3 (Blasiok & Nakkiran's package): ``smECE`` with its
  automatic bandwidth (value and bandwidth) and ``smECE_sigma`` at fixed bandwidths.
* ``ece_sweep`` (no reference package exists): hand-computed bins, and properties checked by a
  plain numpy re-implementation of the rule (every b up to b* monotone, b* + 1 not or b* = N;
  value = equal-mass ECE at b*).

Required tolerance 1e-6 in float64; the tests assert 1e-9 (parity is to rounding). The
reference packages are in the ``test`` extra; a test skips, with the reason, only when its
reference cannot be imported.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import calib_core.metrics as M

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-9


def _reference(module: str, attr: str):
    """Import a reference package, or skip with the reason (pip install line)."""
    pkg = {"calibration": "uncertainty-calibration==0.1.4", "relplot": "relplot==1.0.3"}[module]
    mod = pytest.importorskip(module, reason=f"reference package {pkg} not importable; pip install {pkg}")
    if not hasattr(mod, attr):  # `calibration` is a generic name: make sure it is Kumar et al.'s
        pytest.skip(f"module {module!r} is not the reference {pkg} (no {attr}); pip install {pkg}")
    return mod


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _labels_from(rng, probs, flip=0.0):
    """Labels drawn from the rows (near-calibrated), a fraction ``flip`` replaced at random."""
    n, k = probs.shape
    y = np.minimum((rng.random((n, 1)) > np.cumsum(probs, axis=1)).sum(axis=1), k - 1)
    swap = rng.random(n) < flip
    y[swap] = rng.integers(0, k, swap.sum())
    return y


def _case(name: str):
    """(probs float64 (N, K) or (N,), labels) for each named case."""
    rng = _rng(name)
    if name.startswith("dirichlet_"):  # dirichlet_<n>_<k>
        _, n, k = name.split("_")
        p = rng.dirichlet(np.full(int(k), 0.4), size=int(n))
        return p, _labels_from(rng, p, 0.3)
    if name == "overconfident":  # sharp rows, labels much noisier than the rows say
        p = rng.dirichlet(np.full(10, 0.05), size=1500)
        return p, _labels_from(rng, p, 0.5)
    if name == "ties_quantized":  # many equal confidences
        return rng.multinomial(20, np.full(5, 0.2), size=400) / 20.0, rng.integers(0, 5, 400)
    if name == "ones":  # p == 1.0 exactly in 40 % of the rows
        p = rng.dirichlet(np.full(6, 0.5), size=300)
        hot = rng.random(300) < 0.4
        p[hot] = np.eye(6)[rng.integers(0, 6, hot.sum())]
        return p, _labels_from(rng, p, 0.2)
    if name == "n_below_num_bins":
        p = rng.dirichlet(np.ones(4), size=7)
        return p, rng.integers(0, 4, 7)
    if name == "single_row":
        return np.array([[0.2, 0.5, 0.3]]), np.array([1])
    if name == "two_rows":
        return np.array([[0.1, 0.9], [0.7, 0.3]]), np.array([1, 1])
    if name == "binary_vector":
        p = rng.random(500)
        return p, (rng.random(500) < p).astype(np.int64)
    raise KeyError(name)


CASES = [
    "dirichlet_50_3",
    "dirichlet_333_10",
    "dirichlet_2000_5",
    "overconfident",
    "ties_quantized",
    "ones",
    "n_below_num_bins",
    "single_row",
    "two_rows",
    "binary_vector",
]


def _as_matrix(p):
    """Our binary (N,) convention, spelled out for the references: rows [1 - p, p]."""
    return np.stack([1.0 - p, p], axis=1) if p.ndim == 1 else p


# ----------------------------------------------------------------------------------
# debiased L2 (Kumar et al. 2019) vs uncertainty-calibration
# ----------------------------------------------------------------------------------
def _kumar(p, y, num_bins, mode):
    cal = _reference("calibration", "lower_bound_scaling_ce")
    return float(
        cal.lower_bound_scaling_ce(
            _as_matrix(p), y, p=2, debias=True, num_bins=num_bins, binning_scheme=cal.get_equal_bins, mode=mode
        )
    )


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_l2_matches_uncertainty_calibration(name, mode):
    p, y = _case(name)
    for num_bins in (1, 3, 15, 40):
        ours = M.debiased_l2_ce(p, y, num_bins=num_bins, mode=mode)
        ref = _kumar(p, y, num_bins, mode)
        assert isinstance(ours, float)
        assert abs(ours - ref) <= ATOL, (name, mode, num_bins, ours, ref)


@pytest.mark.parametrize("name", ["dirichlet_333_10", "dirichlet_2000_5", "overconfident"])
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_l2_matches_get_calibration_error(name, mode):
    cal = _reference("calibration", "get_calibration_error")
    p, y = _case(name)
    assert not cal.is_discrete(p)  # continuous outputs: the reference's equal-mass path, 15 bins
    ref = float(cal.get_calibration_error(p, y, p=2, debias=True, mode=mode))
    assert abs(M.debiased_l2_ce(p, y, mode=mode) - ref) <= ATOL


def test_debiased_l2_hand_computed_root_of_debiased_square():
    # binary rows [1 - c, c], label 1 = correct; 2 equal-mass bins of 3 (edge half-way 0.7 | 0.9)
    c = np.array([0.6, 0.65, 0.7, 0.9, 0.95, 1.0])
    y = np.array([0, 0, 1, 0, 0, 0])
    bin1 = (0.65 - 1 / 3) ** 2 - (1 / 3) * (2 / 3) / 2  # mean conf 0.65, accuracy 1/3, n_b = 3
    bin2 = (0.95 - 0.0) ** 2 - 0.0  # mean conf 0.95, accuracy 0
    expected = np.sqrt(0.5 * bin1 + 0.5 * bin2)  # the root of the debiased squared error
    assert bin1 < 0 < expected
    assert abs(M.debiased_l2_ce(c, y, num_bins=2) - expected) <= 1e-12
    # a negative debiased square is clipped at 0 before the root
    assert M.debiased_l2_ce(c[:3], y[:3], num_bins=1) == 0.0
    # one value per bin: every bin has n_b < 2 and adds 0
    assert M.debiased_l2_ce(c, y, num_bins=6) == 0.0


def test_debiased_l2_torch_float32_and_logits():
    p, y = _case("dirichlet_333_10")
    ref = _kumar(p, y, 15, "top-label")
    t = M.debiased_l2_ce(torch.from_numpy(p), torch.from_numpy(y))
    assert isinstance(t, torch.Tensor) and t.ndim == 0 and t.dtype == torch.float64
    assert abs(float(t) - ref) <= ATOL
    t32 = M.debiased_l2_ce(torch.from_numpy(p).float(), torch.from_numpy(y))
    assert t32.dtype == torch.float32 and abs(float(t32) - ref) <= 1e-5
    logits = np.log(p) + 3.0
    assert abs(M.debiased_l2_ce(logits, y, from_logits=True) - ref) <= 1e-9


# ----------------------------------------------------------------------------------
# smooth ECE (Blasiok & Nakkiran 2023) vs relplot
# ----------------------------------------------------------------------------------
def _relplot_pairs(p, y):
    relplot = _reference("relplot", "smECE")
    f, c = relplot.multiclass_logits_to_confidences(_as_matrix(p), y, probs=True)
    return relplot, f, c


@pytest.mark.parametrize("name", CASES)
def test_smooth_ece_matches_relplot(name):
    p, y = _case(name)
    relplot, f, c = _relplot_pairs(p, y)
    ref, ref_sigma = relplot.smECE(f, c, return_width=True)
    ours, sigma = M.smooth_ece(p, y, return_sigma=True)
    assert isinstance(ours, float)
    assert sigma == ref_sigma
    assert abs(ours - float(ref)) <= ATOL, (name, ours, ref)


@pytest.mark.parametrize("sigma", [0.003, 0.02, 0.1, 0.5])
def test_smooth_ece_fixed_sigma_matches_relplot(sigma):
    for name in ("dirichlet_333_10", "ones", "ties_quantized"):
        p, y = _case(name)
        relplot, f, c = _relplot_pairs(p, y)
        ref = float(relplot.smECE_sigma(f, c, sigma))
        assert abs(M.smooth_ece(p, y, sigma=sigma) - ref) <= ATOL, (name, sigma)


def test_smooth_ece_torch_and_edge_values():
    p, y = _case("overconfident")
    relplot, f, c = _relplot_pairs(p, y)
    t = M.smooth_ece(torch.from_numpy(p), torch.from_numpy(y))
    assert isinstance(t, torch.Tensor) and t.ndim == 0 and t.dtype == torch.float64
    assert abs(float(t) - float(relplot.smECE(f, c))) <= ATOL
    # all correct at confidence 1.0: every residual is 0
    one_hot = np.eye(3)[np.arange(30) % 3]
    assert M.smooth_ece(one_hot, np.arange(30) % 3) == 0.0


# ----------------------------------------------------------------------------------
# ECE_sweep (Roelofs et al. 2022): hand-computed bins and properties
# ----------------------------------------------------------------------------------
def _binary_rows(conf, correct):
    """Rows [1 - c, c] with c >= 0.5, so the top-label confidence is c and label 1 = correct."""
    conf = np.asarray(conf, dtype=np.float64)
    return np.stack([1.0 - conf, conf], axis=1), np.asarray(correct, dtype=np.int64)


def test_ece_sweep_hand_computed():
    conf = [0.55, 0.6, 0.7, 0.8, 0.9, 0.95]
    p, y = _binary_rows(conf, [0, 1, 0, 1, 1, 1])
    # equal-mass edges: the sorted values at indices round(i * 6 / b), i = 1..b-1 (half to even)
    # b = 2: edge 0.8               -> {.55 .6 .7} acc 1/3 | {.8 .9 .95} acc 1      monotone
    # b = 3: edges 0.7, 0.9         -> {.55 .6} 1/2 | {.7 .8} 1/2 | {.9 .95} 1      monotone (tie)
    # b = 4: indices 2, 3, 4 (1.5 -> 2, 4.5 -> 4): edges .7 .8 .9 -> {.55 .6} 1/2 | {.7} 0  not
    value, b = M.ece_sweep(p, y, return_num_bins=True)
    assert b == 3
    l1 = (2 / 6) * (abs(0.575 - 0.5) + abs(0.75 - 0.5) + abs(0.925 - 1.0))
    assert abs(value - l1) <= 1e-12
    l2 = np.sqrt((2 / 6) * ((0.575 - 0.5) ** 2 + (0.75 - 0.5) ** 2 + (0.925 - 1.0) ** 2))
    assert abs(M.ece_sweep(p, y, norm="l2") - l2) <= 1e-12


def test_ece_sweep_hand_computed_ties_reach_n():
    # four rows tied at 0.6: ties always share a bin (empty bins are skipped), so every b up to
    # N = 6 is monotone: b* = 6, the bins are the tie blocks {.6 x4} 1/2 | {.8} 1 | {.9} 1
    p, y = _binary_rows([0.6, 0.6, 0.6, 0.6, 0.8, 0.9], [0, 1, 0, 1, 1, 1])
    value, b = M.ece_sweep(p, y, return_num_bins=True)
    assert b == 6
    expected = (4 * abs(0.6 - 0.5) + abs(0.8 - 1) + abs(0.9 - 1)) / 6
    assert abs(value - expected) <= 1e-12
    # the order of tied rows does not matter
    p2, y2 = _binary_rows([0.6, 0.6, 0.6, 0.6, 0.8, 0.9], [1, 1, 0, 0, 1, 1])
    assert M.ece_sweep(p2, y2, return_num_bins=True) == (value, 6)


def _np_equal_mass(conf, correct, b):
    """Plain numpy equal-mass bins (module docstring convention): non-empty bins' counts,
    confidence means and accuracies, in increasing confidence."""
    s = np.sort(conf)
    n = len(s)
    idx = np.minimum(np.round(np.linspace(0, n, b, endpoint=False)).astype(np.int64), n - 1)[1:]
    bins = np.searchsorted(s[idx], conf, side="right")  # number of edges <= value
    out = [
        (np.sum(bins == j), conf[bins == j].mean(), correct[bins == j].mean()) for j in range(b) if np.any(bins == j)
    ]
    return [np.array(v) for v in zip(*out, strict=True)]


def _np_monotone(conf, correct, b):
    return bool(np.all(np.diff(_np_equal_mass(conf, correct, b)[2]) >= 0))


def _sturmian(n):
    """Correctness whose rate rises smoothly with confidence: monotone at coarse bins, broken
    only at fine ones (b* grows like sqrt(N)), so the sweep crosses several batches."""
    i = np.arange(n + 1, dtype=np.float64)
    correct = np.diff(np.floor(i * i / (2 * n)))
    conf = 0.5 + 0.5 * (np.arange(n) + 0.5) / n
    return _binary_rows(conf, correct)


SWEEP_CASES = [
    "dirichlet_50_3",
    "dirichlet_333_10",
    "dirichlet_2000_5",
    "overconfident",
    "ties_quantized",
    "ones",
    "n_below_num_bins",
    "single_row",
    "two_rows",
    "binary_vector",
    "sturmian",
    "all_correct",
]


def _sweep_case(name):
    if name == "sturmian":
        return _sturmian(4000)
    if name == "all_correct":
        p = _rng(name).dirichlet(np.ones(4), size=120)
        return p, p.argmax(axis=1)
    return _case(name)


@pytest.mark.parametrize("name", SWEEP_CASES)
def test_ece_sweep_properties(name):
    p, y = _sweep_case(name)
    pm = _as_matrix(p)
    conf, correct = pm.max(axis=1), (pm.argmax(axis=1) == y).astype(np.float64)
    n = len(conf)
    value, b = M.ece_sweep(p, y, return_num_bins=True)
    assert 1 <= b <= n
    # b* is where the upward scan stops: every b <= b* monotone, b* + 1 not (or b* = N)
    assert all(_np_monotone(conf, correct, k) for k in range(1, b + 1)), name
    assert b == n or not _np_monotone(conf, correct, b + 1), name
    counts, mean_conf, acc = _np_equal_mass(conf, correct, b)
    assert abs(value - np.sum(counts / n * np.abs(acc - mean_conf))) <= ATOL
    l2 = np.sqrt(np.sum(counts / n * (acc - mean_conf) ** 2))
    assert abs(M.ece_sweep(p, y, norm="l2") - l2) <= ATOL
    # the same number as the general calibration error with adaptive bins at b*
    assert abs(value - M.calibration_error(p, y, num_bins=b, binning="adaptive")) <= ATOL
    if name == "sturmian":
        assert b > 40  # several batches of candidate bin counts were needed
    if name == "all_correct":
        assert b == n and abs(value - np.mean(1.0 - conf)) <= ATOL


def test_ece_sweep_torch_and_permutation():
    p, y = _case("dirichlet_333_10")
    value, b = M.ece_sweep(p, y, return_num_bins=True)
    t = M.ece_sweep(torch.from_numpy(p), torch.from_numpy(y))
    assert isinstance(t, torch.Tensor) and t.ndim == 0 and abs(float(t) - value) <= ATOL
    perm = _rng("perm").permutation(len(y))
    v2, b2 = M.ece_sweep(p[perm], y[perm], return_num_bins=True)
    assert b2 == b and abs(v2 - value) <= ATOL


# ----------------------------------------------------------------------------------
# bad input: the same ValueErrors as every metric, plus each function's own options
# ----------------------------------------------------------------------------------
FUNCS = [M.debiased_l2_ce, M.ece_sweep, M.smooth_ece]


@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_bad_input_raises(fn):
    p = np.full((4, 3), 1 / 3)
    y = np.array([0, 1, 2, 0])
    with pytest.raises(ValueError, match="shape mismatch"):
        fn(p, y[:3])
    with pytest.raises(ValueError, match="labels out of range"):
        fn(p, np.array([0, 1, 3, 0]))
    bad = p.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fn(bad, y)
    with pytest.raises(ValueError, match="sum to 1"):
        fn(p * 0.9, y)
    with pytest.raises(ValueError, match="empty"):
        fn(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError, match="labels must be integers"):
        fn(p, y.astype(np.float64))


def test_bad_options_raise():
    p, y = np.full((4, 3), 1 / 3), np.array([0, 1, 2, 0])
    with pytest.raises(ValueError, match="num_bins"):
        M.debiased_l2_ce(p, y, num_bins=0)
    with pytest.raises(ValueError, match="mode"):
        M.debiased_l2_ce(p, y, mode="classwise")
    with pytest.raises(ValueError, match="norm"):
        M.ece_sweep(p, y, norm="max")
    for sigma in (0.0, -0.1, 1e-5, float("nan"), float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="sigma"):
            M.smooth_ece(p, y, sigma=sigma)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    p, y = _case("overconfident")
    pt, yt = torch.from_numpy(p).cuda(), torch.from_numpy(y).cuda()
    for fn, kw in [
        (M.debiased_l2_ce, {}),
        (M.debiased_l2_ce, {"mode": "marginal"}),
        (M.ece_sweep, {}),
        (M.smooth_ece, {}),
    ]:
        out = fn(pt, yt, **kw)
        assert out.device.type == "cuda" and out.ndim == 0
        assert abs(float(out) - fn(p, y, **kw)) <= ATOL, fn.__name__

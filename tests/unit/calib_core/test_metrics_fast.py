"""The compiled CPU path (calib_core.metrics._fast) against the reference and the torch path.

The kernels only run for large CPU inputs; ``force_fast`` lowers the size thresholds so the
small adversarial cases of the reference tests go through them too, and counts the calls so
a test cannot pass by silently taking the torch path.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from concurrency import run_on_threads
from reference.uncertainty_metrics_ref import reference_gce
from test_metrics_reference import CASES, KNOBS, _case, _ref

import calib_core.metrics as M
from calib_core.metrics import _fast

ATOL = 1e-9


@pytest.fixture
def calls(monkeypatch):
    """Lower the size thresholds to 1 and count kernel calls."""
    assert _fast._get() is not None, "numba is a dependency; the compiled kernels must build"
    monkeypatch.setattr(_fast, "FAST_MIN_ELEMENTS", 1)
    monkeypatch.setattr(_fast, "FAST_MIN_VALUES", 1)
    counts = {"scan": 0, "hist": 0, "hist2d": 0}
    scan, hist, hist2d = _fast.scan_rows, _fast.even_histogram, _fast.even_histogram_2d

    def counted_scan(*a, **k):
        counts["scan"] += 1
        return scan(*a, **k)

    def counted_hist(*a, **k):
        counts["hist"] += 1
        return hist(*a, **k)

    def counted_hist2d(*a, **k):
        counts["hist2d"] += 1
        return hist2d(*a, **k)

    monkeypatch.setattr(_fast, "scan_rows", counted_scan)
    monkeypatch.setattr(_fast, "even_histogram", counted_hist)
    monkeypatch.setattr(_fast, "even_histogram_2d", counted_hist2d)
    return counts


def _torch_path(fn, *args, **kwargs):
    previous = _fast.set_enabled(False)
    try:
        return fn(*args, **kwargs)
    finally:
        _fast.set_enabled(previous)


MULTICLASS = [c for c in CASES if not c.startswith("binary")]


@pytest.mark.parametrize("name", MULTICLASS)
def test_compiled_path_matches_reference_every_knob(name, calls):
    p, y, b = _case(name)
    for binning, top, cc, thr in KNOBS:
        ours = M.calibration_error(
            p, y, num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr
        )
        assert abs(ours - _ref(p, y, b, binning, top, cc, thr)) <= ATOL, (name, binning, top, cc, thr)
    assert calls["scan"] == len(KNOBS)
    assert calls["hist"] > 0 and calls["hist2d"] > 0


def test_compiled_streaming_equals_reference(calls):
    p, y, b = _case("ones_and_zeros")
    acc = M.CalibrationAccumulator(p.shape[1], b)
    for r0 in range(0, len(y), 70):
        acc.update(p[r0 : r0 + 70], y[r0 : r0 + 70])
    got = acc.compute()
    for key, (top, cc, thr) in {
        "ece": (True, False, 0.0),
        "sce": (False, True, 0.0),
        "classwise_ece": (False, True, None),
    }.items():
        assert abs(got[key] - _ref(p, y, b, "even", top, cc, thr)) <= ATOL, key
    assert calls["hist2d"] > 0


@pytest.mark.parametrize("name", ["dirichlet_k10", "ties_quantized", "on_bin_edges", "ones_and_zeros"])
def test_compiled_path_float32_matches_reference_on_the_float32_values(name, calls):
    p, y, b = _case(name)
    p32 = p.astype(np.float32)
    p32 /= p32.sum(axis=1, keepdims=True, dtype=np.float32)
    for binning, top, cc, thr in KNOBS:
        ours = M.calibration_error(
            p32, y, num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr
        )
        ref = _ref(p32.astype(np.float64), y, b, binning, top, cc, thr)
        assert abs(ours - ref) <= 1e-6, (name, binning, top, cc, thr)
    assert calls["scan"] == len(KNOBS)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_argmax_among_ties(dtype, calls):
    # row 0: max 0.4 at columns 1 and 3 -> predicted class 1; row 1: three-way tie at 0.25
    p = np.array([[0.1, 0.4, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0]], dtype=dtype)
    for labels, correct in [([1, 0, 2], [1, 1, 1]), ([3, 3, 2], [0, 0, 1])]:
        y = np.array(labels)
        # hand-computed with 2 bins: confidences .4, .25 in [0, .5), 1.0 in the p == 1 bin
        conf_low = (0.4 + 0.25) / 2
        acc_low = (correct[0] + correct[1]) / 2
        expected = 2 / 3 * abs(acc_low - conf_low) + 1 / 3 * abs(correct[2] - 1.0)
        assert M.ece(p, y, num_bins=2) == pytest.approx(expected, abs=1e-7)
        assert M.ece(p, y, num_bins=2) == pytest.approx(
            reference_gce(
                p.astype(np.float64),
                y,
                num_bins=2,
                binning="even",
                top_label=True,
                class_conditional=False,
                norm="l1",
                threshold=0.0,
            ),
            abs=1e-7,
        )
    assert calls["scan"] == 4


def _large(dtype: torch.dtype, seed: int = 0, n: int = 12_000, k: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """A matrix above the real thresholds, with ties, exact 1.0 rows, zeros and quantised rows."""
    assert n >= 2000 and k > 50, "the special rows need n >= 2000 and k > 50"
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64) * 3, dim=1)
    p[:500] = torch.nn.functional.one_hot(torch.randint(0, k, (500,), generator=g), k).double()
    q = torch.randint(0, 4, (1000, k), generator=g).double()
    q[:, 0] += 1
    p[500:1500] = q / q.sum(dim=1, keepdim=True)  # many tied maxima at random columns
    p[1500:2000, :50] = 0.0
    p[1500:2000] /= p[1500:2000].sum(dim=1, keepdim=True)
    p = p.to(dtype)
    p /= p.sum(dim=1, keepdim=True)
    pred = torch.from_numpy(np.argmax(p.numpy(), axis=1))
    rand = torch.randint(0, k, (n,), generator=g)
    return p, torch.where(torch.rand(n, generator=g) < 0.6, pred, rand)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_input_takes_compiled_path_and_agrees_with_torch_path(dtype, monkeypatch):
    p, y = _large(dtype)
    assert p.numel() >= _fast.FAST_MIN_ELEMENTS
    used = []
    scan = _fast.scan_rows
    monkeypatch.setattr(_fast, "scan_rows", lambda *a, **k: used.append(1) or scan(*a, **k))
    fast = M.compute_all(p, y)
    assert used, "the large CPU input did not take the compiled path"
    slow = _torch_path(M.compute_all, p, y)
    assert fast.keys() == slow.keys()
    for key in fast:
        assert float(fast[key]) == pytest.approx(float(slow[key]), abs=1e-12, rel=1e-12), key
    ref = reference_gce(
        p.double().numpy(),
        y.numpy(),
        num_bins=15,
        binning="even",
        top_label=True,
        class_conditional=False,
        norm="l1",
        threshold=0.0,
    )
    assert abs(float(M.ece(p, y)) - ref) <= (1e-9 if dtype == torch.float64 else 1e-6)


def test_thread_count_does_not_change_results():
    p, y = _large(torch.float32, seed=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = {k: float(v) for k, v in M.compute_all(p, y).items()}
        torch.set_num_threads(3)
        three = {k: float(v) for k, v in M.compute_all(p, y).items()}
    finally:
        torch.set_num_threads(before)
    for key in one:
        assert three[key] == pytest.approx(one[key], abs=1e-12), key


def test_concurrent_callers_get_the_same_numbers():
    p, y = _large(torch.float32, seed=2)
    expected = float(M.ece(p, y))
    results = run_on_threads(lambda: [float(M.ece(p, y)) for _ in range(3)], 4)
    assert results == [[expected] * 3] * 4


BAD = {
    "nan": (0, 1, np.nan),
    "inf": (1, 0, np.inf),
    "neg_inf": (1, 2, -np.inf),
    "negative": (2, 1, -0.25),
    "above_one": (0, 0, 1.5),
    "negative_nan": (0, 2, -np.nan),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_values_raise_the_torch_paths_message(case, dtype, calls):
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]], dtype=dtype)
    i, j, v = BAD[case]
    p[i, j] = v
    y = np.array([0, 1, 2])
    with pytest.raises(ValueError) as fast_err:
        M.ece(p, y)
    with pytest.raises(ValueError) as torch_err:
        _torch_path(M.ece, p, y)
    assert str(fast_err.value) == str(torch_err.value)
    assert calls["scan"] == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_sums_off_raise_and_within_tolerance_pass(dtype, calls):
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]], dtype=dtype)
    y = np.array([0, 1, 2])
    bad = p.copy()
    bad[1, 0] += 1e-3
    with pytest.raises(ValueError, match=r"row 1 sums to 1\.001"):
        M.ece(bad, y)
    ok = p.copy()
    ok[1, 0] += 5e-5  # inside ROW_SUM_ATOL = 1e-4
    assert M.ece(ok, y) == pytest.approx(_torch_path(M.ece, ok, y), abs=1e-12)


def test_negative_zero_is_a_valid_zero(calls):
    p = np.array([[0.7, 0.3, -0.0], [0.0, 0.9, 0.1]], dtype=np.float32)
    y = np.array([0, 2])
    # -0.0 fails the kernel's bit test and is re-checked by the torch path, which accepts it
    assert M.sce(p, y) == pytest.approx(_torch_path(M.sce, p, y), abs=1e-12)
    assert calls["scan"] == 1


def test_without_numba_the_torch_path_serves(monkeypatch):
    monkeypatch.setattr(_fast, "_kernels", {})  # as if numba could not be imported
    p, y = _large(torch.float32, seed=3)
    assert not _fast.usable(p)
    ref = reference_gce(
        p.double().numpy(),
        y.numpy(),
        num_bins=15,
        binning="even",
        top_label=True,
        class_conditional=False,
        norm="l1",
        threshold=0.0,
    )
    assert abs(float(M.ece(p, y)) - ref) <= 1e-6


def test_read_only_cache_falls_back_to_uncached_compilation(monkeypatch):
    import numba

    real = numba.njit

    def no_cache_location(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", no_cache_location)

    def add(a, b):
        return a + b

    assert _fast._njit(add)(2, 3) == 5


def test_forked_child_scans_with_a_fresh_thread_pool():
    # (torch's own OpenMP ops hang in a child forked after the parent used them, so the child
    # calls only the compiled scan, which needs our thread pool and no torch parallelism)
    import multiprocessing as mp

    p, _ = _large(torch.float32, seed=4, n=40_000, k=60)  # >= 2 x 16384 rows: two threads
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _fast.scan_rows(p, 1e-4).valid  # the parent's pool now exists
        with mp.get_context("fork").Pool(1) as pool:
            pred = pool.apply_async(_scan_in_child, (p.numpy(),)).get(timeout=60)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(pred, np.argmax(p.numpy(), axis=1))


def _scan_in_child(p: np.ndarray) -> np.ndarray:
    torch.set_num_threads(2)  # the split over two threads needs the pool
    return _fast.scan_rows(torch.from_numpy(p), 1e-4).pred.numpy()


def test_environment_variable_turns_the_kernels_off():
    import subprocess
    import sys

    code = "import torch; from calib_core.metrics import _fast; print(_fast.usable(torch.rand(2048, 1024)))"
    for value, expected in (("1", "False"), ("", "True")):
        env = {**os.environ, _fast.DISABLE_ENV: value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected, (value, out.stderr)


def _adaptive_stats(p, y, num_bins, thresholds, compiled):
    from calib_core.metrics._inputs import prepare
    from calib_core.metrics.calibration_error import binned_stats

    previous = _fast.set_enabled(compiled)
    try:
        x = prepare(p, y)
        return binned_stats(
            x, num_bins=num_bins, binning="adaptive", top_label=False, class_conditional=True, thresholds=thresholds
        )
    finally:
        _fast.set_enabled(previous)


def _adaptive_cases():
    rng = np.random.default_rng(5)
    q = rng.integers(0, 5, (3000, 20)).astype(np.float32)
    q[:, 0] += 1
    onehot = np.zeros((2000, 30), np.float32)
    onehot[np.arange(2000), rng.integers(0, 30, 2000)] = 1.0
    large, large_y = _large(torch.float32)
    return [
        (large, large_y),  # ties, exact 1.0 rows, zeros, quantised rows
        (torch.from_numpy(q / q.sum(1, keepdims=True)), torch.from_numpy(rng.integers(0, 20, 3000))),  # ties at edges
        (torch.from_numpy(onehot), torch.from_numpy(rng.integers(0, 30, 2000))),  # mostly exact zeros
        (torch.softmax(torch.randn(20_000, 3, dtype=torch.float32) * 4, 1), torch.randint(0, 3, (20_000,))),
    ]


@pytest.mark.parametrize("case", range(4))
def test_compiled_adaptive_columns_bin_exactly_as_the_sort_path(case, monkeypatch):
    """The histogram-selection kernel for class-conditional adaptive bins (float32) gives the same
    counts and correctness counts as sorting each column, and the same sums up to float64 rounding,
    for any bin count and thresholds (ties at the edges, zeros, empty groups, > 2 thresholds)."""
    monkeypatch.setattr(_fast, "FAST_MIN_ELEMENTS", 1)
    used = []
    kernel = _fast.adaptive_columns
    monkeypatch.setattr(_fast, "adaptive_columns", lambda *a, **k: used.append(1) or kernel(*a, **k))
    p, y = _adaptive_cases()[case]
    for num_bins in (1, 2, 15, 40):
        for thresholds in ([0.0, 0.01], [None], [0.5, 0.999], [None, 0.0, 0.01, 0.2]):
            fast = _adaptive_stats(p, y, num_bins, thresholds, True)
            slow = _adaptive_stats(p, y, num_bins, thresholds, False)
            for (fc, fs, fk), (sc, ss, sk) in zip(fast, slow, strict=True):
                assert torch.equal(fc, sc) and torch.equal(fk, sk), (num_bins, thresholds)
                assert torch.allclose(fs, ss, rtol=1e-12, atol=1e-9), (num_bins, thresholds)
    assert used


def test_compiled_adaptive_columns_leave_negative_zero_to_the_sort_path(monkeypatch):
    monkeypatch.setattr(_fast, "FAST_MIN_ELEMENTS", 1)
    p = torch.softmax(torch.randn(500, 10), 1)
    p[3] = 0.0
    p[3, 7] = 1.0
    p[3, 5] = -0.0
    y = torch.randint(0, 10, (500,))
    assert _fast.adaptive_columns(p, p[:, 0], y, [0.0], 15) is None
    assert float(M.ace(p, y)) == pytest.approx(float(_torch_path(M.ace, p, y)), abs=1e-12)

"""Parity of calib_core.metrics with independent references.

* google/uncertainty-metrics 0.0.81, numpy ``gce`` (the paper's reference library), for every
  l1 configuration, to 1e-9 in float64 (required: 1e-6). Fetched by
  tests/reference/fetch_uncertainty_metrics.py; if it cannot be had these tests FAIL unless
  CALIB_ALLOW_NO_REFERENCE=1.
* tests/reference/brute.py, a plain loop implementation of docs/design.md section 4, for norm="l2" (the
  PyPI reference predates its L2 fix) and norm="max" (the reference has none).
* hand-computed values for l1, l2 and max.
* torchmetrics' multiclass_calibration_error where its semantics match ours.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from reference.brute import brute_gce
from reference.uncertainty_metrics_ref import load_reference, reference_gce

import calib_core.metrics as M
from calib_core.metrics import binning as binning_core

ATOL = 1e-9

KNOBS = list(itertools.product(["even", "adaptive"], [True, False], [True, False], [0.0, 0.01, 0.3, None]))


def _dirichlet(rng, n, k, alpha):
    return rng.dirichlet(np.full(k, alpha), size=n)


def _labels_from(rng, probs, flip=0.0):
    """Labels drawn from the rows (near-calibrated), a fraction ``flip`` replaced at random."""
    n, k = probs.shape
    cum = np.cumsum(probs, axis=1)
    y = np.minimum((rng.random((n, 1)) > cum).sum(axis=1), k - 1)
    swap = rng.random(n) < flip
    y[swap] = rng.integers(0, k, swap.sum())
    return y


def _case(name):
    """(probs float64 (N, K) or binary, labels, num_bins) for each named case."""
    rng = np.random.default_rng(abs(hash(name)) % (2**32))
    if name == "dirichlet_k10":
        p = _dirichlet(rng, 600, 10, 0.3)
        return p, _labels_from(rng, p, 0.3), 15
    if name == "dirichlet_k3_sharp":
        p = _dirichlet(rng, 1000, 3, 0.05)
        return p, _labels_from(rng, p, 0.1), 10
    if name == "dirichlet_k50":
        p = _dirichlet(rng, 300, 50, 1.0)
        return p, rng.integers(0, 50, 300), 15
    if name == "ties_quantized":  # many equal values, equal confidences across rows
        counts = rng.multinomial(20, np.full(5, 0.2), size=400)
        return counts / 20.0, rng.integers(0, 5, 400), 15
    if name == "on_bin_edges":  # values exactly on the float64 edges used by the reference
        b = 10
        edges = np.linspace(0.0, 1.0, b + 1)
        p1 = edges[rng.integers(0, b + 1, 500)]
        p = np.stack([1.0 - p1, p1], axis=1)
        return p, rng.integers(0, 2, 500), b
    if name == "multiples_of_1_over_b":  # k/B computed by division (may differ from linspace by 1 ulp)
        b = 15
        counts = rng.multinomial(b, np.full(4, 0.25), size=500)
        return counts / b, rng.integers(0, 4, 500), b
    if name == "ones_and_zeros":  # p == 1.0 (its own bin) and exact zeros (dropped by p > 0)
        p = _dirichlet(rng, 300, 6, 0.5)
        hot = rng.random(300) < 0.4
        p[hot] = np.eye(6)[rng.integers(0, 6, hot.sum())]
        return p, rng.integers(0, 6, 300), 15
    if name == "empty_bins":  # every confidence in [0.9, 0.95): most bins empty
        top = rng.uniform(0.9, 0.95, 400)
        p = np.stack([top, (1 - top) / 2, (1 - top) / 2], axis=1)
        return p, rng.integers(0, 3, 400), 15
    if name == "class_never_predicted":  # last class tiny and never a label
        p = _dirichlet(rng, 500, 5, 1.0)
        p[:, 4] = 1e-4 * rng.random(500)
        p /= p.sum(axis=1, keepdims=True)
        return p, rng.integers(0, 4, 500), 15
    if name == "n_below_num_bins":
        p = _dirichlet(rng, 7, 4, 1.0)
        return p, rng.integers(0, 4, 7), 30
    if name == "single_row":
        return np.array([[0.2, 0.5, 0.3]]), np.array([2]), 15
    if name == "binary_vector":  # (N,) positive-class probabilities
        return rng.random(500), rng.integers(0, 2, 500), 15
    if name == "binary_column":  # (N, 1)
        return rng.random((300, 1)), rng.integers(0, 2, 300), 8
    if name == "one_bin":
        p = _dirichlet(rng, 200, 4, 1.0)
        return p, rng.integers(0, 4, 200), 1
    if name == "tiny_probs_k200":  # TACE's 0.01 threshold removes nearly everything
        p = _dirichlet(rng, 100, 200, 5.0)
        return p, rng.integers(0, 200, 100), 15
    raise KeyError(name)


CASES = [
    "dirichlet_k10",
    "dirichlet_k3_sharp",
    "dirichlet_k50",
    "ties_quantized",
    "on_bin_edges",
    "multiples_of_1_over_b",
    "ones_and_zeros",
    "empty_bins",
    "class_never_predicted",
    "n_below_num_bins",
    "single_row",
    "binary_vector",
    "binary_column",
    "one_bin",
    "tiny_probs_k200",
]


def _ref(p, y, b, binning, top, cc, thr, norm="l1"):
    # threshold None (keep all) is threshold -1 for the reference: p > -1 keeps everything
    return reference_gce(
        p,
        y,
        num_bins=b,
        binning=binning,
        top_label=top,
        class_conditional=cc,
        norm=norm,
        threshold=-1.0 if thr is None else thr,
    )


@pytest.mark.parametrize("name", CASES)
def test_gce_l1_matches_reference_every_knob(name):
    p, y, b = _case(name)
    for binning, top, cc, thr in KNOBS:
        ours = M.calibration_error(
            p, y, num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr
        )
        ref = _ref(p, y, b, binning, top, cc, thr)
        assert isinstance(ours, float)
        assert abs(ours - ref) <= ATOL, (name, binning, top, cc, thr, ours, ref)


@pytest.mark.parametrize(
    "name",
    ["dirichlet_k10", "ties_quantized", "ones_and_zeros", "binary_vector", "tiny_probs_k200", "n_below_num_bins"],
)
def test_presets_match_reference_presets(name):
    p, y, b = _case(name)
    ref = load_reference()
    assert abs(M.ece(p, y, num_bins=b) - ref.ece(y, p, num_bins=b)) <= ATOL
    assert abs(M.sce(p, y, num_bins=b) - ref.sce(y, p, num_bins=b)) <= ATOL
    assert abs(M.ace(p, y, num_bins=b) - ref.ace(y, p, num_bins=b)) <= ATOL
    assert abs(M.tace(p, y, num_bins=b) - ref.tace(y, p, num_bins=b)) <= ATOL
    # classwise-ECE = SCE over all N predictions (no p > 0 filter): the reference with threshold < 0
    assert abs(M.classwise_ece(p, y, num_bins=b) - _ref(p, y, b, "even", False, True, None)) <= ATOL


def test_torch_and_float32_inputs_match_reference():
    p, y, b = _case("dirichlet_k10")
    p32 = p.astype(np.float32)
    p32 /= p32.sum(axis=1, keepdims=True)
    for binning, top, cc, thr in KNOBS:
        kw = dict(num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr)
        ref64 = _ref(p, y, b, binning, top, cc, thr)
        got = M.calibration_error(torch.from_numpy(p), torch.from_numpy(y), **kw)
        assert isinstance(got, torch.Tensor) and got.dim() == 0 and got.dtype == torch.float64
        assert abs(float(got) - ref64) <= ATOL
        # float32 values: exact comparisons against float64 edges/thresholds, as on the upcast values
        ref32 = _ref(p32.astype(np.float64), y, b, binning, top, cc, thr)
        assert abs(M.calibration_error(p32, y, **kw) - ref32) <= 1e-6, (binning, top, cc, thr)


def test_from_logits_matches_reference_on_softmax():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(400, 6)) * 3
    y = rng.integers(0, 6, 400)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ref = load_reference()
    assert abs(M.ece(z, y, from_logits=True) - ref.ece(y, p, num_bins=15)) <= 1e-9
    assert abs(M.ace(z, y, from_logits=True) - ref.ace(y, p, num_bins=15)) <= 1e-9
    zb = rng.normal(size=300) * 2
    yb = rng.integers(0, 2, 300)
    pb = 1.0 / (1.0 + np.exp(-zb))
    assert abs(M.sce(zb, yb, from_logits=True) - ref.sce(yb, pb, num_bins=15)) <= 1e-9


def test_chunked_and_blocked_paths_match_reference(monkeypatch):
    """Force many row chunks / column blocks: the memory-bounding loops must not change results."""
    monkeypatch.setattr(binning_core, "CHUNK_ELEMENTS", 64)
    for name in ["dirichlet_k10", "ones_and_zeros", "tiny_probs_k200"]:
        p, y, b = _case(name)
        for binning, top, cc, thr in KNOBS:
            if top:
                continue
            ours = M.calibration_error(
                p, y, num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr
            )
            assert abs(ours - _ref(p, y, b, binning, top, cc, thr)) <= ATOL, (name, binning, cc, thr)
    p, y, b = _case("dirichlet_k10")
    acc = M.CalibrationAccumulator(10, b).update(p, y).compute()
    assert abs(acc["sce"] - load_reference().sce(y, p, num_bins=b)) <= ATOL


# -- l2 and max: hand-computed values and the brute-force implementation -----------------------
# Top label, K = 2, 4 bins ([0,.25) [.25,.5) [.5,.75) [.75,1) {1}):
#   confidences .55 (wrong) .6 .7 (wrong)... see each test for the arithmetic.
HAND_P = np.array([[0.2, 0.8], [0.7, 0.3], [0.45, 0.55], [0.1, 0.9]])
HAND_Y = np.array([1, 1, 1, 1])


def test_hand_computed_top_label_even():
    # conf .8 (correct), .7 (pred 0, wrong), .55 (correct), .9 (correct)
    # bin [.5,.75): {.7 wrong, .55 right}: conf .625, acc .5, gap .125, weight 1/2
    # bin [.75,1):  {.8, .9} both right:   conf .85,  acc 1,  gap .15,  weight 1/2
    kw = dict(num_bins=4, binning="even", top_label=True, class_conditional=False)
    assert M.calibration_error(HAND_P, HAND_Y, norm="l1", **kw) == pytest.approx(0.5 * 0.125 + 0.5 * 0.15, abs=1e-12)
    assert M.calibration_error(HAND_P, HAND_Y, norm="l2", **kw) == pytest.approx(
        np.sqrt(0.5 * 0.125**2 + 0.5 * 0.15**2), abs=1e-12
    )  # 0.1380670...
    assert M.calibration_error(HAND_P, HAND_Y, norm="max", **kw) == pytest.approx(0.15, abs=1e-12)
    assert M.mce(HAND_P, HAND_Y, num_bins=4) == pytest.approx(0.15, abs=1e-12)


def test_hand_computed_rmsce_adaptive():
    # confidences .55 (wrong) .6 .7 .9 (right); B = 2 -> edge indices round([0, 2]) -> upper edge = sorted[2] = .7
    # bin 0: {.55, .6}: conf .575 acc .5 gap .075; bin 1: {.7, .9}: conf .8 acc 1 gap .2; weights 1/2
    p = np.array([[0.45, 0.55], [0.4, 0.6], [0.3, 0.7], [0.1, 0.9]])
    y = np.array([0, 1, 1, 1])
    expected = np.sqrt(0.5 * 0.075**2 + 0.5 * 0.2**2)  # 0.151038...
    assert M.rmsce(p, y, num_bins=2) == pytest.approx(expected, abs=1e-12)
    # the PyPI reference (pre L2 fix) squares the weighted gap instead: sqrt((.5*.075)^2 + (.5*.2)^2)
    buggy = reference_gce(p, y, num_bins=2, binning="adaptive", top_label=True, class_conditional=False, norm="l2")
    assert buggy == pytest.approx(np.sqrt((0.5 * 0.075) ** 2 + (0.5 * 0.2) ** 2), abs=1e-12)


def test_hand_computed_class_conditional_norms():
    # K = 3, B = 2 (bins [0,.5) [.5,1) {1}); rows and labels:
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    y = np.array([0, 2, 2])
    # class 0: {.2,.1} conf .15 acc 0 | {.6} conf .6 acc 1 -> l1 .2333.., l2 (2/3).0225+(1/3).16, max .4
    # class 1: {.3,.1} conf .2  acc 0 | {.5} conf .5 acc 0 -> l1 .3,     l2 (2/3).04+(1/3).25,   max .5
    # class 2: {.1,.3} conf .2 acc .5 | {.8} conf .8 acc 1 -> l1 .2666.., l2 (2/3).09+(1/3).04,  max .3
    l2_per_class = [2 / 3 * 0.0225 + 1 / 3 * 0.16, 2 / 3 * 0.04 + 1 / 3 * 0.25, 2 / 3 * 0.09 + 1 / 3 * 0.04]
    kw = dict(num_bins=2, binning="even", top_label=False, class_conditional=True)
    assert M.calibration_error(p, y, norm="l1", **kw) == pytest.approx(0.8 / 3, abs=1e-12)
    assert M.sce(p, y, num_bins=2) == pytest.approx(0.8 / 3, abs=1e-12)
    # root once, at the end, after averaging the classes
    assert M.calibration_error(p, y, norm="l2", **kw) == pytest.approx(np.sqrt(np.mean(l2_per_class)), abs=1e-12)
    assert M.calibration_error(p, y, norm="max", **kw) == pytest.approx((0.4 + 0.5 + 0.3) / 3, abs=1e-12)
    # top label: conf .6 (right) .5 (pred 1, wrong) .8 (right), all in [.5, 1): gap |2/3 - 1.9/3|
    assert M.ece(p, y, num_bins=2) == pytest.approx(abs(2 / 3 - 1.9 / 3), abs=1e-12)


@pytest.mark.parametrize(
    "name",
    [
        "dirichlet_k10",
        "ties_quantized",
        "ones_and_zeros",
        "binary_vector",
        "class_never_predicted",
        "n_below_num_bins",
        "tiny_probs_k200",
    ],
)
def test_l2_and_max_match_brute_force(name):
    p, y, b = _case(name)
    if p.ndim == 2 and p.shape[0] * p.shape[1] > 3000:  # keep the loop implementation quick
        rows = max(30, 3000 // p.shape[1])
        p, y = p[:rows], y[:rows]
    for binning, top, cc, thr in KNOBS:
        for norm in ("l2", "max", "l1"):
            kw = dict(num_bins=b, binning=binning, top_label=top, class_conditional=cc, threshold=thr, norm=norm)
            assert abs(M.calibration_error(p, y, **kw) - brute_gce(p, y, **kw)) <= ATOL, (name, kw)


def test_matches_torchmetrics_where_semantics_agree():
    """torchmetrics bins [k/B, (k+1)/B) too (it puts p == 1.0 in the last bin, which these
    continuous inputs never hit), top label, l1 / l2 / max with the same weights."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    g = torch.Generator().manual_seed(0)
    z = torch.randn(5000, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 7, (5000,), generator=g)
    p = torch.softmax(z, dim=1)
    for norm in ("l1", "l2", "max"):
        tm = multiclass_calibration_error(p, y, num_classes=7, n_bins=15, norm=norm)
        ours = M.calibration_error(p, y, num_bins=15, norm=norm)
        assert abs(float(tm) - float(ours)) <= 1e-6, norm

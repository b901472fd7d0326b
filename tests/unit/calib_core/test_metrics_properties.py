"""Properties, conventions, streaming, devices, bad input and the reliability diagram.

Expected values come from independent computations (torch/numpy formulas written here,
hand-computed numbers, brute force), never from calib_core's own output, except where a
property relates two of our own results (e.g. streaming == one-shot, numpy == torch).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference.brute import brute_gce

import calib_core.metrics as M
from calib_core.metrics import CalibrationAccumulator

PRESETS = [M.ece, M.mce, M.rmsce, M.sce, M.ace, M.tace, M.classwise_ece]


def _data(n=800, k=6, seed=0, scale=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, k, generator=g, dtype=torch.float64) * scale).to(dtype)
    y = torch.randint(0, k, (n,), generator=g)
    return z, torch.softmax(z, dim=1), y


# -- types, devices, conversions ------------------------------------------------------------
def test_numpy_gives_float_and_torch_gives_0dim_tensor_with_same_value():
    z, p, y = _data()
    for fn in PRESETS + [M.accuracy, M.nll, M.brier, M.aurc]:
        a = fn(p.numpy(), y.numpy())
        t = fn(p, y)
        assert isinstance(a, float)
        assert isinstance(t, torch.Tensor) and t.dim() == 0 and t.device == p.device and t.dtype == torch.float64
        assert a == pytest.approx(float(t), abs=1e-12)
    t32 = M.ece(p.float(), y)
    assert t32.dtype == torch.float32
    assert float(t32) == pytest.approx(M.ece(p, y).item(), abs=1e-5)


def test_from_logits_equals_softmax_and_sigmoid():
    z, p, y = _data()
    for fn in PRESETS + [M.accuracy, M.nll, M.brier, M.aurc]:
        assert float(fn(z, y, from_logits=True)) == pytest.approx(float(fn(p, y)), abs=1e-10)
    zb = z[:, 0]
    yb = y % 2
    pb = torch.sigmoid(zb)
    for fn in PRESETS + [M.nll, M.brier]:
        assert float(fn(zb, yb, from_logits=True)) == pytest.approx(float(fn(pb, yb)), abs=1e-10)
        assert float(fn(zb[:, None], yb, from_logits=True)) == pytest.approx(float(fn(pb, yb)), abs=1e-10)


def test_binary_vector_equals_explicit_two_columns():
    g = torch.Generator().manual_seed(1)
    pb = torch.rand(500, generator=g, dtype=torch.float64)
    yb = torch.randint(0, 2, (500,), generator=g)
    two = torch.stack([1 - pb, pb], dim=1)
    for fn in PRESETS + [M.accuracy, M.nll, M.brier, M.aurc]:
        assert float(fn(pb, yb)) == pytest.approx(float(fn(two, yb)), abs=1e-12)
        assert float(fn(pb[:, None], yb)) == pytest.approx(float(fn(two, yb)), abs=1e-12)
    # binary Brier on (N,) is the 2-column sum: 2 (p - y)^2
    assert float(M.brier(pb, yb)) == pytest.approx(float((2 * (pb - yb) ** 2).mean()), abs=1e-12)


def test_row_permutation_invariance_and_range():
    z, p, y = _data(n=600, k=5, seed=2)
    perm = torch.randperm(600, generator=torch.Generator().manual_seed(0))
    for fn in PRESETS + [M.aurc]:
        v = float(fn(p, y))
        assert 0.0 <= v <= 1.0
        assert float(fn(p[perm], y[perm])) == pytest.approx(v, abs=1e-12)


def test_calibrated_data_has_small_ece_and_overconfident_has_large():
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(20000, 4, generator=g, dtype=torch.float64) * 2, dim=1)
    y = torch.multinomial(p, 1, generator=g).squeeze(1)  # labels drawn from the probabilities
    assert float(M.ece(p, y)) < 0.02
    assert float(M.sce(p, y)) < 0.01
    sharp = torch.softmax(torch.log(p) * 4, dim=1)  # same argmax, overconfident
    assert float(M.ece(sharp, y)) > 0.1


# -- non-binned scores against independent formulas ------------------------------------------
def test_accuracy_nll_brier_against_independent_formulas():
    z, p, y = _data(n=700, k=9, seed=3)
    pn, yn = p.numpy(), y.numpy()
    assert M.accuracy(pn, yn) == pytest.approx(float(np.mean(np.argmax(pn, 1) == yn)), abs=1e-15)
    assert M.nll(z, y, from_logits=True).item() == pytest.approx(F.cross_entropy(z, y).item(), abs=1e-12)
    assert M.nll(pn, yn) == pytest.approx(float(-np.mean(np.log(pn[np.arange(700), yn]))), abs=1e-12)
    onehot = np.eye(9)[yn]
    assert M.brier(pn, yn) == pytest.approx(float(np.mean(np.sum((pn - onehot) ** 2, axis=1))), abs=1e-12)
    # hand: rows [.7 .2 .1] y=0 -> .09+.04+.01 = .14 ; [.5 .5 0] y=2 -> .25+.25+1 = 1.5
    assert M.brier(np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]]), np.array([0, 2])) == pytest.approx(0.82)
    # NLL from probabilities with a true-class probability of exactly 0 is inf (not clipped)
    assert M.nll(np.array([[1.0, 0.0]]), np.array([1])) == float("inf")


def test_aurc_hand_computed_and_against_brute_force():
    # conf .9 .8 .7 .6 with correct, correct, wrong, wrong -> risks 0, 0, 1/3, 2/4
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    y = np.array([0, 0, 0, 0])
    assert M.aurc(p, y) == pytest.approx((0 + 0 + 1 / 3 + 2 / 4) / 4, abs=1e-15)
    # random, no ties: mean over coverage i/N of the error rate of the i most confident
    z, pr, yr = _data(n=300, k=4, seed=7)
    conf, pred = pr.max(1)
    err = (pred != yr).double()[torch.argsort(conf, descending=True)].numpy()
    risks = np.cumsum(err) / np.arange(1, 301)
    assert float(M.aurc(pr, yr)) == pytest.approx(float(risks.mean()), abs=1e-12)
    # ties: the order of tied rows does not matter
    q = np.array([[0.6, 0.4]] * 4 + [[0.9, 0.1]] * 2)
    yq = np.array([0, 1, 1, 0, 0, 1])
    ref = M.aurc(q, yq)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(6)
        assert M.aurc(q[perm], yq[perm]) == pytest.approx(ref, abs=1e-15)
    # tie blocks get their block's risk: 2 rows at .9 (1 error) then 4 at .6 (3 errors in total)
    assert ref == pytest.approx((2 * (1 / 2) + 4 * (3 / 6)) / 6, abs=1e-15)


def test_compute_all_keys_and_values():
    z, p, y = _data(n=500, k=7, seed=11)
    out = M.compute_all(z, y, from_logits=True, num_bins=10)
    assert list(out) == [
        "accuracy",
        "nll",
        "brier",
        "ece",
        "mce",
        "rmsce",
        "sce",
        "ace",
        "tace",
        "classwise_ece",
        "aurc",
    ]
    assert all(isinstance(v, float) for v in out.values())
    pn, yn = p.numpy(), y.numpy()
    for name, fn in [
        ("ece", M.ece),
        ("mce", M.mce),
        ("rmsce", M.rmsce),
        ("sce", M.sce),
        ("ace", M.ace),
        ("tace", M.tace),
        ("classwise_ece", M.classwise_ece),
    ]:
        assert out[name] == pytest.approx(fn(pn, yn, num_bins=10), abs=1e-10), name
    brute = dict(
        ece=dict(binning="even", top_label=True, class_conditional=False, norm="l1"),
        rmsce=dict(binning="adaptive", top_label=True, class_conditional=False, norm="l2"),
        tace=dict(binning="adaptive", top_label=False, class_conditional=True, norm="l1", threshold=0.01),
    )
    for name, kw in brute.items():
        assert out[name] == pytest.approx(brute_gce(pn, yn, num_bins=10, **kw), abs=1e-10), name
    assert out["nll"] == pytest.approx(F.cross_entropy(z, y).item(), abs=1e-12)


def test_sce_drops_exact_zeros_but_classwise_keeps_them():
    p = np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
    y = np.array([0, 1, 2])
    kw = dict(num_bins=5, binning="even", top_label=False, class_conditional=True)
    assert M.sce(p, y, num_bins=5) == pytest.approx(brute_gce(p, y, threshold=0.0, **kw), abs=1e-15)
    assert M.classwise_ece(p, y, num_bins=5) == pytest.approx(brute_gce(p, y, threshold=None, **kw), abs=1e-15)
    assert M.sce(p, y, num_bins=5) != pytest.approx(M.classwise_ece(p, y, num_bins=5))


def test_threshold_removing_everything_gives_zero():
    p = np.full((50, 200), 1 / 200)
    y = np.arange(50) % 200
    assert M.tace(p, y) == 0.0
    assert M.calibration_error(p, y, threshold=0.5) == 0.0
    assert M.calibration_error(p, y, threshold=0.5, binning="adaptive", top_label=False) == 0.0


# -- streaming ---------------------------------------------------------------------------------
def test_streaming_equals_one_shot_and_merge():
    z, p, y = _data(n=3000, k=8, seed=4)
    p[:20] = F.one_hot(y[:20], 8).double()  # p == 1.0 and exact zeros
    one_shot = M.compute_all(p, y)
    acc = CalibrationAccumulator(8, num_bins=15)
    for i in range(0, 3000, 377):
        acc.update(p[i : i + 377], y[i : i + 377])
    streamed = acc.compute()
    assert streamed["n"] == 3000
    for name in ("accuracy", "nll", "brier", "ece", "mce", "sce", "classwise_ece"):
        assert streamed[name] == pytest.approx(one_shot[name], abs=1e-12), name
    a, b = CalibrationAccumulator(8), CalibrationAccumulator(8)
    a.update(p[:1234].numpy(), y[:1234].numpy())
    b.update(p[1234:], y[1234:])
    merged = a.merge(b).compute()
    for name in ("accuracy", "nll", "brier", "ece", "mce", "sce", "classwise_ece"):
        assert merged[name] == pytest.approx(one_shot[name], abs=1e-12), name
    # every even-binned knob combination with threshold 0 / None
    for top in (True, False):
        for cc in (True, False):
            for norm in ("l1", "l2", "max"):
                for thr in (0.0, None):
                    kw = dict(top_label=top, class_conditional=cc, norm=norm, threshold=thr)
                    assert acc.calibration_error(**kw) == pytest.approx(
                        float(M.calibration_error(p, y, **kw)), abs=1e-12
                    ), kw


def test_streaming_logits_state_size_reset_and_state_dict():
    z, p, y = _data(n=1000, k=5, seed=9, dtype=torch.float32)
    acc = CalibrationAccumulator(5, num_bins=10, from_logits=True)
    size = acc.state_nbytes
    assert size == 6 * 5 * 12 * 8 + 4 * 8  # O(bins x K), independent of N
    for i in range(0, 1000, 100):
        acc.update(z[i : i + 100], y[i : i + 100])
    assert acc.state_nbytes == size
    ref = M.compute_all(z, y, from_logits=True, num_bins=10)
    got = acc.compute()
    for name in ("accuracy", "ece", "sce", "nll", "brier"):
        assert got[name] == pytest.approx(ref[name], abs=1e-6), name
    restored = CalibrationAccumulator(5, num_bins=10, from_logits=True).load_state_dict(acc.state_dict())
    assert restored.compute() == got
    acc.reset()
    with pytest.raises(ValueError, match="empty"):
        acc.compute()


def test_streaming_errors():
    acc = CalibrationAccumulator(3)
    with pytest.raises(ValueError, match=r"num_classes=3.*4 classes"):
        acc.update(np.full((2, 4), 0.25), np.array([0, 1]))
    with pytest.raises(ValueError, match="different settings"):
        acc.merge(CalibrationAccumulator(3, num_bins=7))
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        CalibrationAccumulator(1)
    acc.update(np.full((2, 3), 1 / 3), np.array([0, 1]))
    with pytest.raises(ValueError, match="threshold 0.0 or None"):
        acc.calibration_error(threshold=0.01)


# -- devices -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu():
    z, p, y = _data(n=4000, k=10, seed=12)
    for fn in PRESETS + [M.accuracy, M.nll, M.brier, M.aurc]:
        cpu = fn(p, y)
        gpu = fn(p.cuda(), y.cuda())
        assert gpu.device.type == "cuda"
        assert float(gpu) == pytest.approx(float(cpu), abs=1e-10), fn.__name__
    for dtype in (torch.float32, torch.float64):
        zc = z.to(dtype)
        cpu_all = M.compute_all(zc, y, from_logits=True)
        gpu_all = M.compute_all(zc.cuda(), y.cuda(), from_logits=True)
        for k in cpu_all:
            assert gpu_all[k] == pytest.approx(cpu_all[k], abs=1e-5 if dtype == torch.float32 else 1e-10), k
    acc = CalibrationAccumulator(10).update(p.cuda(), y.cuda())
    assert acc.top_counts.device.type == "cuda"
    assert acc.compute()["ece"] == pytest.approx(float(M.ece(p, y)), abs=1e-10)


# -- bad input ---------------------------------------------------------------------------------
GOOD_P = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
GOOD_Y = np.array([0, 1])


@pytest.mark.parametrize(
    "probs, labels, kwargs, pattern",
    [
        (GOOD_P, np.array([0, 1, 2]), {}, r"shape mismatch: probs has shape \(2, 3\).*labels of shape \(3,\)"),
        (GOOD_P, np.array([[0], [1]]), {}, r"shape mismatch.*\(2, 1\)"),
        (np.zeros((2, 3, 1)), GOOD_Y, {}, r"shape \(N, K\), \(N,\) or \(N, 1\); got shape \(2, 3, 1\)"),
        (GOOD_P, np.array([0, 3]), {}, r"labels out of range: expected integers in \[0, 2\].*found 3"),
        (GOOD_P, np.array([-1, 0]), {}, r"labels out of range.*found -1"),
        (np.array([0.2, 0.9]), np.array([0, 2]), {}, r"labels out of range: expected integers in \[0, 1\]"),
        (GOOD_P, np.array([0.0, 1.0]), {}, r"labels must be integers, got dtype torch.float64"),
        (np.array([[0.7, np.nan, 0.3], [0.1, 0.8, 0.1]]), GOOD_Y, {}, r"probs contains NaN.*\(0, 1\)"),
        (np.array([[0.7, np.inf, 0.3], [0.1, 0.8, 0.1]]), GOOD_Y, {}, r"probs contains inf"),
        (np.array([[1.0, np.nan, 0.3], [0.1, 0.8, 0.1]]), GOOD_Y, {"from_logits": True}, r"logits contains NaN"),
        (np.array([[0.7, 0.2, 0.2], [0.1, 0.8, 0.1]]), GOOD_Y, {}, r"sum to 1.*row 0 sums to 1.1\b"),
        (np.array([[1.2, -0.1, -0.1], [0.1, 0.8, 0.1]]), GOOD_Y, {}, r"must lie in \[0, 1\]; found min -0.1"),
        (np.array([0.5, 1.0000001]), GOOD_Y, {}, r"must lie in \[0, 1\].*max 1.0000001"),
        (np.array([[1, 0], [0, 1]]), GOOD_Y, {}, r"floating-point probabilities, got dtype torch.int64"),
        (np.zeros((0, 3)), np.zeros(0, dtype=int), {}, r"empty"),
        (GOOD_P, GOOD_Y, {"num_bins": 0}, r"num_bins must be >= 1, got 0"),
        (GOOD_P, GOOD_Y, {"num_bins": 2.5}, r"num_bins must be an integer"),
        (GOOD_P, GOOD_Y, {"binning": "quantile"}, r"unknown binning='quantile'; allowed values: 'even', 'adaptive'"),
        (GOOD_P, GOOD_Y, {"norm": "L1"}, r"unknown norm='L1'; allowed values: 'l1', 'l2', 'max'"),
        (GOOD_P, GOOD_Y, {"threshold": -0.1}, r"threshold must lie in \[0, 1\]"),
        (GOOD_P, GOOD_Y, {"threshold": float("nan")}, r"threshold must lie in \[0, 1\]"),
        (GOOD_P, GOOD_Y, {"top_label": "yes"}, r"top_label must be True or False"),
        ("abc", GOOD_Y, {}, r"probs must hold numbers"),
    ],
)
def test_bad_input_raises_clear_value_error(probs, labels, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        M.calibration_error(probs, labels, **kwargs)


def test_bad_input_other_entry_points():
    with pytest.raises(ValueError, match="num_bins must be >= 1"):
        M.compute_all(GOOD_P, GOOD_Y, num_bins=0)
    with pytest.raises(ValueError, match="shape mismatch"):
        M.ece(torch.tensor(GOOD_P), torch.tensor([0]))
    with pytest.raises(ValueError, match="sum to 1"):
        M.accuracy(np.array([[0.5, 0.4]]), np.array([0]))
    with pytest.raises(ValueError, match="sum to 1"):
        M.reliability_diagram(np.array([[0.5, 0.4]]), np.array([0]), "/nonexistent/never.png")


def test_row_sum_tolerance_accepts_float32_softmax_of_many_classes():
    z = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0)) * 5
    p = torch.softmax(z, dim=1)  # float32 rounding: rows sum to 1 within ~1e-6
    assert 0.0 <= float(M.sce(p, torch.zeros(64, dtype=torch.long))) <= 1.0


# -- reliability diagram -------------------------------------------------------------------------
def test_reliability_diagram_writes_png(tmp_path):
    import matplotlib

    backend = matplotlib.get_backend()
    z, p, y = _data(n=500, k=4, seed=13)
    p[:5] = F.one_hot(y[:5], 4).double()  # confidence exactly 1.0 is drawn too
    out = M.reliability_diagram(p, y, tmp_path / "sub" / "diagram.png", num_bins=10, title="demo")
    assert out == tmp_path / "sub" / "diagram.png"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    out2 = M.reliability_diagram(z.numpy(), y.numpy(), str(tmp_path / "logits.png"), from_logits=True)
    assert out2.exists()
    assert matplotlib.get_backend() == backend  # no global backend switch


def test_reliability_diagram_lays_out_as_tight_layout_does_pixel_for_pixel(tmp_path, monkeypatch):
    """The margins kept per layout key (calib_core/metrics/reliability.py) against matplotlib's own tight_layout on
    every figure: the same PNG pixels, for count axes of 1 to 6 digits and titles of one and two lines, each drawn
    twice (the second from the kept margins)."""
    from PIL import Image

    import calib_core.metrics.reliability as R

    def drawn(path, p, y, title, reference: bool) -> np.ndarray:
        if reference:
            with monkeypatch.context() as m:
                m.setattr(R, "_lay_out", lambda fig, hx, t: fig.tight_layout())
                R.reliability_diagram(p, y, path, num_bins=15, title=title)
        else:
            R.reliability_diagram(p, y, path, num_bins=15, title=title)
        return np.asarray(Image.open(path))

    rng = np.random.default_rng(0)
    monkeypatch.setattr(R, "_MARGINS", {})
    for n in (9, 360, 20_000, 900_000):
        p = rng.dirichlet(np.ones(10) * 0.3, n).astype(np.float32)
        y = rng.integers(0, 10, n)
        for title in (None, "vector lr=1.2e-03 + TS (validation)"):
            want = drawn(tmp_path / "ref.png", p, y, title, reference=True)
            for _ in range(2):
                got = drawn(tmp_path / "new.png", p, y, title, reference=False)
                assert got.shape == want.shape and (got == want).all(), (n, title)
    assert len(R._MARGINS) == 8  # one tight_layout per key, the repeats from the kept margins

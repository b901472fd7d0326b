"""OOD scores and metrics (calib_core.ood): hand-computed cases and scikit-learn agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score, roc_curve

from calib_core.ood import auroc, entropy_score, fpr_at_tpr, max_softmax_score, ood_report


@pytest.mark.parametrize(
    "s_in,s_out,expected",
    [
        ([3, 4], [1, 2], 1.0),  # perfect separation
        ([1, 2], [3, 4], 0.0),  # inverted
        ([1, 2], [2, 3], 0.125),  # pairs: 0, 0, 1/2 (tie 2 = 2), 0 -> 0.5 / 4
        ([5, 5, 5], [5, 5], 0.5),  # all tied
        ([0.9, 0.8, 0.7], [0.8, 0.1], 0.75),  # 1 + 1 + 1/2 + 1 + 0 + 1 = 4.5 of 6
        ([2], [1, 2, 3], 0.5),  # 1 + 1/2 + 0 = 1.5 of 3
        ([-math.inf, 0.0], [math.inf], 0.0),  # infinities are ordered values
    ],
)
def test_auroc_hand_cases(s_in, s_out, expected):
    assert auroc(np.array(s_in, dtype=float), np.array(s_out, dtype=float)) == expected
    assert auroc(torch.tensor(s_in, dtype=torch.float64), torch.tensor(s_out, dtype=torch.float64)) == expected
    assert auroc(s_in, s_out) == expected  # plain lists too


@pytest.mark.parametrize("seed", range(4))
def test_auroc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    n_in, n_out = rng.integers(1, 3000, size=2)
    s_in = rng.normal(0.5, 1.0, n_in)
    s_out = rng.normal(0.0, 1.0, n_out)
    if seed % 2:  # many ties
        s_in, s_out = np.round(s_in, 1), np.round(s_out, 1)
    ref = roc_auc_score(np.r_[np.ones(n_in), np.zeros(n_out)], np.r_[s_in, s_out])
    assert abs(auroc(s_in, s_out) - ref) < 1e-12
    assert (
        abs(
            auroc(torch.from_numpy(s_in).float(), torch.from_numpy(s_out).float())
            - roc_auc_score(np.r_[np.ones(n_in), np.zeros(n_out)], np.r_[s_in, s_out].astype(np.float32))
        )
        < 1e-12
    )


def test_fpr_at_tpr_hand_cases():
    s_in = np.arange(1.0, 21.0)  # 20 in-samples: k = ceil(0.95 * 20) = 19 -> threshold 2 (19 of 20 >= 2)
    s_out = np.array([0.0, 1.5, 2.0, 2.5, 3.0])
    assert fpr_at_tpr(s_in, s_out) == 3 / 5  # 2.0 (tied with the threshold), 2.5, 3.0
    assert fpr_at_tpr(s_in, s_out, tpr=1.0) == 4 / 5  # threshold = min in-score 1
    assert fpr_at_tpr(s_in, s_out, tpr=0.05) == 0.0  # threshold 20
    # in-sample ties at the threshold: TPR 0.8 >= 0.5, OOD ties are false positives
    assert fpr_at_tpr([5, 5, 5, 5, 1], [5, 4], tpr=0.5) == 0.5
    # 0.7 * 10 = 7.000000000000001 in floating point: 7 in-samples are enough, not 8
    assert fpr_at_tpr(np.arange(1.0, 11.0), [3.5, 4.0], tpr=0.7) == 0.5
    assert fpr_at_tpr(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 2.0])) == 0.0  # perfect separation
    assert fpr_at_tpr([1.0, 2.0], [3.0, 4.0]) == 1.0  # inverted


@pytest.mark.parametrize("seed", range(3))
def test_fpr_at_tpr_matches_roc_curve(seed):
    rng = np.random.default_rng(seed)
    s_in = np.round(rng.normal(1.0, 1.0, 977), 2)
    s_out = np.round(rng.normal(0.0, 1.0, 613), 2)
    fpr, tpr, _ = roc_curve(
        np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], np.r_[s_in, s_out], drop_intermediate=False
    )
    for target in (0.5, 0.9, 0.95, 0.99):
        assert fpr_at_tpr(s_in, s_out, tpr=target) == pytest.approx(fpr[np.argmax(tpr >= target)], abs=1e-15)


def test_scores_hand_cases():
    p = np.array([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0], [0.7, 0.2, 0.1]])
    np.testing.assert_allclose(max_softmax_score(p), [1.0, 1 / 3, 0.5, 0.7])
    ent = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    np.testing.assert_allclose(entropy_score(p), [0.0, -math.log(3), -math.log(2), -ent], atol=1e-15)
    assert isinstance(max_softmax_score(p), np.ndarray)
    t = torch.tensor(p, dtype=torch.float32)
    for fn in (max_softmax_score, entropy_score):
        out = fn(t)
        assert isinstance(out, torch.Tensor) and out.shape == (4,)
        assert out.device == t.device and out.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), fn(p), atol=1e-6)
    # higher = more in-distribution: a confident row beats a uniform row under both scores
    assert entropy_score(p)[0] > entropy_score(p)[1] and max_softmax_score(p)[0] > max_softmax_score(p)[1]


def test_ood_report():
    rng = np.random.default_rng(0)
    logits_in = rng.normal(0, 1, (200, 5))
    logits_in[np.arange(200), rng.integers(0, 5, 200)] += 6.0  # confident
    p_in = np.exp(logits_in) / np.exp(logits_in).sum(1, keepdims=True)
    p_out = np.full((100, 5), 0.2)
    rep = ood_report(p_in, p_out)
    assert set(rep) == {"msp_auroc", "msp_fpr95", "entropy_auroc", "entropy_fpr95"}
    assert all(isinstance(v, float) for v in rep.values())
    assert rep["msp_auroc"] == 1.0 and rep["msp_fpr95"] == 0.0 and rep["entropy_auroc"] == 1.0
    rep_t = ood_report(torch.from_numpy(p_in), torch.from_numpy(p_out))
    assert rep_t == rep
    # a mixed case agrees with the pieces
    q_out = np.exp(rng.normal(0, 2, (150, 5)))
    q_out /= q_out.sum(1, keepdims=True)
    rep = ood_report(p_in, q_out)
    assert rep["entropy_auroc"] == auroc(entropy_score(p_in), entropy_score(q_out))
    assert rep["msp_fpr95"] == fpr_at_tpr(max_softmax_score(p_in), max_softmax_score(q_out), 0.95)


def test_errors():
    good = np.array([[0.5, 0.5]])
    with pytest.raises(ValueError, match="empty"):
        auroc([], [1.0])
    with pytest.raises(ValueError, match="empty"):
        fpr_at_tpr([1.0], np.array([]))
    with pytest.raises(ValueError, match="NaN"):
        auroc([1.0, float("nan")], [0.0])
    with pytest.raises(ValueError, match="1-D"):
        auroc(np.ones((2, 2)), [0.0])
    with pytest.raises(ValueError, match="tpr"):
        fpr_at_tpr([1.0], [0.0], tpr=0.0)
    with pytest.raises(ValueError, match="tpr"):
        fpr_at_tpr([1.0], [0.0], tpr=1.5)
    with pytest.raises(ValueError, match="NaN"):
        max_softmax_score(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="empty"):
        entropy_score(np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        max_softmax_score(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="sum to 1"):
        entropy_score(np.array([[2.0, 3.0]]))  # logits, not probabilities
    with pytest.raises(ValueError, match="negative"):
        entropy_score(np.array([[1.5, -0.5]]))
    with pytest.raises(ValueError, match="shape mismatch"):
        ood_report(good, np.array([[0.2, 0.3, 0.5]]))
    with pytest.raises(ValueError, match="empty"):
        ood_report(good, np.zeros((0, 2)))

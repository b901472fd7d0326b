"""calib_core.conformal against hand-computed cases: scores, quantiles under each convention, sets, measures, and the
refusals of bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from calib_core import conformal as cp

ROW = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
SCORES = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6], dtype=torch.float64)  # 0.1 .. 0.9, shuffled


def test_scores_by_hand() -> None:
    y = torch.tensor([1])
    assert cp.calibration_scores("lac", ROW, y).item() == pytest.approx(0.7)
    assert cp.calibration_scores("aps", ROW, y).item() == pytest.approx(0.8)  # 0.5 + 0.3
    assert cp.calibration_scores("aps_randomized", ROW, y, u=[0.5]).item() == pytest.approx(0.65)  # 0.8 - 0.5 * 0.3
    assert cp.calibration_scores("raps", ROW, y).item() == pytest.approx(0.9)  # 0.8 + 0.1 * (2 - 1)
    assert cp.calibration_scores("raps", ROW, y, penalty=0.2, k_reg=2).item() == pytest.approx(0.8)
    # a label ranked third: APS mass 1.0, RAPS 1.0 + 0.1 * 2
    assert cp.calibration_scores("raps", ROW, torch.tensor([2])).item() == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("alpha", "finite", "mapie", "tu"),
    [
        (0.1, 0.9, 0.9, 0.82),  # rank ceil(10 * 0.9) = 9 of 9; torch.quantile interpolates at 0.9 * 8 = 7.2
        (0.2, 0.8, 0.8, 0.74),  # rank 8 (10 * 0.8 = 8 exactly, not 8.000000000000002 rounded up)
        (0.35, 0.7, 0.7, 0.62),  # rank ceil(6.5) = 7
    ],
)
def test_quantile_conventions_by_hand(alpha: float, finite: float, mapie: float, tu: float) -> None:
    assert cp.conformal_quantile(SCORES, alpha) == pytest.approx(finite)
    assert cp.conformal_quantile(SCORES, alpha, "mapie") == pytest.approx(mapie)
    assert cp.conformal_quantile(SCORES, alpha, "torch_uncertainty") == pytest.approx(tu)


def test_rank_past_n_gives_every_label() -> None:
    # alpha = 0.05 with 9 rows: rank ceil(9.5) = 10 > 9, so no finite score guarantees 95 %
    assert cp.finite_sample_rank(9, 0.05) == 10
    assert cp.conformal_quantile(SCORES, 0.05) == math.inf
    assert cp.prediction_sets("aps", ROW, math.inf).all()
    with pytest.raises(ValueError, match="at least 19 calibration rows"):
        cp.conformal_quantile(SCORES, 0.05, "mapie")  # MAPIE refuses a level above 1


def test_sets_by_hand() -> None:
    def labels(method: str, q: float, convention: str = "finite_sample", **kw: object) -> list[int]:
        return cp.prediction_sets(method, ROW, q, convention=convention, **kw)[0].nonzero().flatten().tolist()

    assert labels("lac", 0.75) == [0, 1]  # 1 - p = 0.5, 0.7, 0.8
    assert labels("aps", 0.75) == [0]  # masses 0.5, 0.8, 1.0
    assert labels("aps", 0.75, "mapie") == [0, 1]  # MAPIE keeps the label whose mass crosses 0.75
    assert labels("aps", 0.4) == []  # the finite-sample set may be empty
    assert labels("aps", 0.4, "torch_uncertainty") == [0]  # torch-uncertainty gives it the lowest-score label
    assert labels("lac", 0.4, "torch_uncertainty") == [0]
    assert labels("raps", 0.85) == [0]  # scores 0.5, 0.9, 1.2
    assert labels("raps", 0.95) == [0, 1]
    assert labels("aps_randomized", 0.75, u=[0.5]) == [0, 1]  # 0.8 - 0.15 = 0.65 <= 0.75; 1.0 - 0.1 > 0.75
    assert labels("aps_randomized", 0.75, u=[0.1]) == [0]  # 0.8 - 0.03 > 0.75


def test_measures_by_hand() -> None:
    sets = torch.tensor([[True, False], [True, True], [False, True], [False, False]])
    y = torch.tensor([0, 0, 0, 1])
    assert cp.covered(sets, y).tolist() == [True, True, False, False]
    assert cp.set_sizes(sets).tolist() == [1, 2, 1, 0]
    cov, rows = cp.class_coverage(cp.covered(sets, y), y, 2)
    assert cov.tolist() == pytest.approx([2 / 3, 0.0]) and rows.tolist() == [3, 1]
    strata, srows = cp.stratum_coverage(cp.covered(sets, y), cp.set_sizes(sets))
    assert strata[0].item() == pytest.approx(1 / 3) and strata[1].item() == 1.0 and srows[:2].tolist() == [3, 1]
    assert math.isnan(strata[2].item())
    s = cp.summary(sets, y, min_rows=1)
    assert s == pytest.approx({"coverage": 0.5, "size": 1.0, "worst_class_coverage": 0.0, "worst_size_coverage": 1 / 3})
    assert math.isnan(cp.summary(sets, y)["worst_class_coverage"])  # no class has the default 10 rows


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cp.calibrate("lac", ROW, [0], 0.0), "alpha must be a number in"),
        (lambda: cp.calibrate("lac", ROW, [0], 1.5), "alpha must be a number in"),
        (lambda: cp.calibrate("lac", ROW, [0], True), "alpha must be a number in"),
        (lambda: cp.calibrate("lac", ROW[0], [0], 0.1), r"probs must be \(N, K\)"),
        (lambda: cp.calibrate("lac", ROW * 2, [0], 0.1), "must sum to 1"),
        (lambda: cp.calibrate("lac", torch.tensor([[2.0, -1.0]]), [0], 0.1), "negative"),
        (lambda: cp.calibrate("lac", torch.tensor([[math.nan, 1.0]]), [0], 0.1), "NaN"),
        (lambda: cp.calibrate("lac", ROW, [3], 0.1), r"labels must lie in \[0, 3\)"),
        (lambda: cp.calibrate("lac", ROW, [0, 1], 0.1), r"labels must be \(N,\)"),
        (lambda: cp.calibrate("lac", ROW, [0.0], 0.1), "labels must be integers"),
        (lambda: cp.calibrate("nope", ROW, [0], 0.1), "unknown conformal method"),
        (lambda: cp.calibrate("lac", ROW, [0], 0.1, convention="x"), "unknown conformal convention"),
        (lambda: cp.calibrate("aps_randomized", ROW, [0], 0.1), "is randomised: pass u"),
        (lambda: cp.calibrate("aps_randomized", ROW, [0], 0.1, u=[0.2, 0.3]), "one uniform draw per row"),
        (lambda: cp.calibrate("aps_randomized", ROW, [0], 0.1, u=[1.5]), r"u must lie in \[0, 1\]"),
        (lambda: cp.calibrate("raps", ROW, [0], 0.1, penalty=-1.0), "penalty must be"),
        (lambda: cp.calibrate("raps", ROW, [0], 0.1, k_reg=0), "k_reg must be"),
        (lambda: cp.calibrate("lac", ROW, [0], 0.1, penalty=0.1), "takes no option"),
        (lambda: cp.prediction_sets("lac", ROW, math.nan), "quantile must be a number"),
        (lambda: cp.conformal_quantile(torch.tensor([]), 0.1), "non-empty"),
    ],
)
def test_bad_inputs_are_named(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_numpy_inputs_and_float32() -> None:
    p = ROW.float().numpy()
    q = cp.calibrate("lac", p, [1], 0.4)  # one row, rank ceil(2 * 0.6) = 2 > 1: every label
    assert q == math.inf
    assert cp.prediction_sets("aps", p, 0.85).dtype == torch.bool

"""The sweep's conformal sets without a sweep: a trial's metrics and rows (sweeps/integrations/ray/conformal_scores.py),
their paired bootstrap (sweeps/decide/conformal.py) and the report's section."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sweeps.config import EvaluationConfig
from sweeps.contract import TS_PREFIX, conformal_key, conformal_rows_key
from sweeps.decide.conformal import conformal_replicates, load_rows
from sweeps.integrations.ray.conformal_scores import conformal_scores


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for split, n in (("val", 300), ("test", 200)):
        p = torch.softmax(2 * torch.randn(n, 4, generator=g), 1)
        y = torch.multinomial(p, 1, generator=g).squeeze(1)
        for prefix, t in (("", 1.0), (TS_PREFIX, 1.5)):
            out[f"{prefix}{split}_probs"] = torch.softmax(p.log() / t, 1).float().numpy()
            out[f"{prefix}{split}_labels"] = y.numpy()
    return out


def test_trial_reports_both_candidates_and_the_bootstrap_reads_them(tmp_path) -> None:
    ev = EvaluationConfig(conformal_alphas=[0.2, 0.1], conformal_methods=["lac", "aps_randomized"])
    metrics, rows = conformal_scores(_arrays(), ev, seed=3)
    for prefix in ("", TS_PREFIX):
        for split in ("val", "test"):
            for m in ("lac", "aps_randomized"):
                for a in (0.1, 0.2):
                    for measure in ("coverage", "size", "worst_class_coverage", "worst_size_coverage"):
                        assert f"{prefix}{split}_{conformal_key(m, a, measure)}" in metrics
                    covered = rows[prefix + conformal_rows_key(m, a, split, "covered")]
                    key = f"{prefix}{split}_{conformal_key(m, a, 'coverage')}"
                    assert covered.mean() == pytest.approx(metrics[key])
    assert metrics["test_cp_lac_a10_coverage"] >= 0.8  # 200 rows: near 0.9, never far below
    np.savez(tmp_path / "p.npz", **_arrays(), **rows)
    loaded = {"t": load_rows(tmp_path / "p.npz"), "t+ts": load_rows(tmp_path / "p.npz", TS_PREFIX)}
    assert set(loaded["t"]["val"]) == {
        f"{conformal_key(m, a, w)}" for m in ("lac", "aps_randomized") for a in (0.1, 0.2) for w in ("coverage", "size")
    }
    reps = conformal_replicates(loaded, num_resamples=200, level=0.95, seed=0)
    for tid, prefix in (("t", ""), ("t+ts", TS_PREFIX)):
        for split in ("val", "test"):
            key = f"{split}_{conformal_key('lac', 0.1, 'size')}"
            assert reps.points[tid][key] == pytest.approx(metrics[prefix + key])
            lo, hi = reps.interval(tid, key)
            assert lo <= reps.points[tid][key] <= hi and hi > lo


def test_off_and_multitask_measure_nothing() -> None:
    assert conformal_scores(_arrays(), EvaluationConfig(conformal_alphas=[]), 0) == ({}, {})
    assert conformal_scores({**_arrays(), "tasks": np.array(["a"])}, EvaluationConfig(), 0) == ({}, {})
    with pytest.raises(ValueError, match="miscoverage levels"):
        EvaluationConfig(conformal_alphas=[1.0])


def test_intervals_stay_within_coverage_and_size_ranges() -> None:
    """A coverage's interval within [0, 1], a mean set size's within [0, K]: centring a small split's replicates on
    an estimate near a bound would otherwise carry the interval past it (as an accuracy's could, d423b3d)."""
    covered = np.array([1, 1, 1, 1, 1, 0, 1], dtype=np.float64)  # 7 rows
    sizes = np.array([4, 4, 4, 3, 4, 4, 1], dtype=np.float64)  # K = 4
    rows = {"t": {"val": {"cp_lac_a10_coverage": covered, "cp_lac_a10_size": sizes}}}
    reps = conformal_replicates(rows, num_resamples=300, level=0.95, seed=0, num_classes={"t": 4})
    assert reps.bounds["t"] == {"val_cp_lac_a10_coverage": (0.0, 1.0), "val_cp_lac_a10_size": (0.0, 4.0)}
    for key, point, (lo_bound, hi_bound) in (
        ("val_cp_lac_a10_coverage", 0.995, (0.0, 1.0)),  # an estimate near the top: the shift passes 1
        ("val_cp_lac_a10_size", 3.99, (0.0, 4.0)),
    ):
        reps.points["t"][key] = point
        lo, hi = reps.interval("t", key)
        assert lo_bound <= lo <= point <= hi == hi_bound, (key, lo, hi)
    reps.points["t"]["val_cp_lac_a10_size"] = 0.05  # near 0: the lower end clipped at 0
    assert reps.interval("t", "val_cp_lac_a10_size")[0] == 0.0
    unknown_k = conformal_replicates(rows, num_resamples=50, level=0.95, seed=0)
    assert unknown_k.bounds["t"]["val_cp_lac_a10_size"] == (0.0, float("inf"))


def test_the_report_table_says_what_its_worst_case_columns_are() -> None:
    """The table's two worst-case figures are named as coverages, and the words under the table give the strata and
    the least rows a group needs (calib_core/conformal/measures.py) as the measures use them."""
    import pandas as pd

    from calib_core.conformal.measures import MIN_ROWS, SIZE_STRATA
    from sweeps.report.conformal import _strata, conformal_table

    key = {w: conformal_key("lac", 0.1, w) for w in ("coverage", "size", "worst_class_coverage", "worst_size_coverage")}
    board = pd.DataFrame(
        [{"label": "a", "champion": True, **{f"{s}_{k}": 0.5 for s in ("val", "test") for k in key.values()}}]
    )
    table = conformal_table(board, [0.1], ["lac"])
    assert "<th>lac: worst class / size-stratum cov %</th>" in table
    assert "<td>50.0 / 50.0</td>" in table
    words = _strata(SIZE_STRATA)
    assert words == "0-1, 2-3, 4-10, 11-100, 101-1000, 1001+" and MIN_ROWS == 10

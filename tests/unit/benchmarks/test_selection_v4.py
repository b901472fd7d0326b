"""selection_v4 (benchmarks/studies/protocols/selection_v4.md): the analysis on a fabricated table against
hand-computed t-test p-values, Holm and the decision rule; the refusal of an incomplete table; a fabricated sweep
through the rules, the tables and the resumable run."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from benchmarks.studies import selection_v3 as v3
from benchmarks.studies import selection_v4 as v4

REGIMES, SEEDS, MARGINS = ("r1", "r2"), (1, 2, 3), {"r1": 0.05, "r2": 0.05}
ZERO = (0.0, 0.0, 0.0)


def _p_t2(t: float) -> float:
    """The t distribution's CDF with 2 degrees of freedom, in closed form: 1/2 + t / (2 sqrt(t^2 + 2))."""
    return 0.5 + t / (2.0 * math.sqrt(t * t + 2.0))


# rule -> criterion -> regime -> paired differences (rule minus current) over the 3 sweeps
DIFFS: dict[str, dict[str, dict[str, tuple[float, ...]]]] = {
    # b: NLL non-inferior in both; gap 3 pt worse in r2 (shown worse)
    "ce_es_ts": {"test_nll": {"r1": ZERO, "r2": (0.01, 0.02, 0.03)}, "gap": {"r1": ZERO, "r2": (0.02, 0.03, 0.04)}},
    # a: NLL p = 0.0371 in both regimes: under 0.05 each, but Holm's first step needs 0.025
    "most_accurate_ts": {"test_nll": {"r1": (0.02, 0.03, 0.04), "r2": (0.02, 0.03, 0.04)}},
    # c: NLL in r2 neither non-inferior nor shown worse (inconclusive)
    "min_val_nll": {"test_nll": {"r1": ZERO, "r2": (-0.01, 0.03, 0.07)}},
    # d: better NLL in r1, no difference elsewhere; ECE worse in r1 (secondary: reported, no effect)
    "point_margin_1": {"test_nll": {"r1": (-0.01, -0.02, -0.03)}, "test_ece": {"r1": (0.02, 0.03, 0.04)}},
}


def _table(diffs: dict[str, Any]) -> list[dict[str, str]]:
    """The per-sweep table as read back from the CSV (strings), the current rule's numbers fixed."""
    rows = []
    for g in REGIMES:
        for i, s in enumerate(SEEDS):
            row = {"regime": g, "seed": str(s), "n_val": "100", "n_test": "200", "git_commit": "abc1234def"}
            base = {"test_nll": 0.5, "gap": 0.01, "test_ece": 0.03}
            for rule in v4.RULES:
                for k, b in base.items():
                    d = diffs.get(rule, {}).get(k, {}).get(g, ZERO)[i] if rule != "current" else 0.0
                    row[f"{rule}_{k}"] = repr(b + d)
                row |= {f"{rule}_candidate": "0+ts", f"{rule}_family": "CE with early stopping + TS"}
            rows.append(row)
    return rows


def test_holm_steps_down_and_stops_at_the_first_non_rejection():
    assert v3.holm({"x": 0.01, "y": 0.04, "z": 0.03}) == {"x": True, "y": False, "z": False}  # 0.03 > 0.05 / 2
    assert v3.holm({"x": 0.01, "y": 0.04, "z": 0.02}) == {"x": True, "y": True, "z": True}


def test_the_analysis_matches_hand_computed_tests_and_decides_by_simplicity():
    res = v4.analyse(_table(DIFFS), REGIMES, SEEDS, MARGINS)
    t = res["tests"]
    # b's NLL in r2: mean 0.02, sd 0.01, t = (0.02 - 0.05) / (0.01 / sqrt 3) = -3 sqrt 3
    assert t["ce_es_ts/test_nll"]["r2"]["p_ni"] == pytest.approx(_p_t2(-3 * math.sqrt(3)), abs=1e-9)
    assert t["ce_es_ts/test_nll"]["r1"]["p_ni"] == 0.0  # all differences 0 < margin (sd 0)
    assert t["ce_es_ts/test_nll"]["r2"]["ni"] and t["ce_es_ts/test_nll"]["r1"]["ni"]
    # b's gap in r2: mean 3 pt over a 1 pt margin; "worse": t = 0.03 / (0.01 / sqrt 3), Holm with r1's p = 1
    gap = t["ce_es_ts/gap"]["r2"]
    assert gap["p_ni"] == pytest.approx(_p_t2(2 * math.sqrt(3)), abs=1e-9) and not gap["ni"]
    assert gap["p_worse"] == pytest.approx(1 - _p_t2(3 * math.sqrt(3)), abs=1e-9) and gap["worse"]
    assert gap["lo"] == pytest.approx(0.03 - 4.302652729911275 * 0.01 / math.sqrt(3), abs=1e-9)  # t(0.975, 2)
    # a: p = 1/2 - sqrt(3/14) = 0.0371 in both regimes: Holm rejects neither
    p = t["most_accurate_ts/test_nll"]["r1"]["p_ni"]
    assert p == pytest.approx(0.5 - math.sqrt(3 / 14), abs=1e-9) and 0.025 < p < 0.05
    assert not t["most_accurate_ts/test_nll"]["r1"]["ni"] and not t["most_accurate_ts/test_nll"]["r2"]["ni"]
    # c: t_ni = -0.02 / (0.04 / sqrt 3), t_worse = 0.03 / (0.04 / sqrt 3)
    c = t["min_val_nll/test_nll"]["r2"]
    assert c["p_ni"] == pytest.approx(_p_t2(-0.5 * math.sqrt(3)), abs=1e-9)
    assert c["p_worse"] == pytest.approx(1 - _p_t2(0.75 * math.sqrt(3)), abs=1e-9) and not c["worse"]
    d = res["decision"]
    assert d["rules"]["ce_es_ts"]["not_shown"] == ["gap in r2 (shown worse)"]
    assert d["rules"]["most_accurate_ts"]["not_shown"] == [
        "test_nll in r1 (shown worse)",
        "test_nll in r2 (shown worse)",
    ]
    assert d["rules"]["min_val_nll"]["not_shown"] == ["test_nll in r2 (inconclusive)"]
    assert d["rules"]["point_margin_1"]["passes"] and d["default"] == "point_margin_1"
    ece = t["point_margin_1/test_ece"]["r1"]  # secondary: t = 0.03 / (0.01 / sqrt 3), Holm with r2's p = 1
    assert ece["p_worse"] == pytest.approx(1 - _p_t2(3 * math.sqrt(3)), abs=1e-9) and ece["worse"]
    text = v4.markdown(_table(DIFFS), res, "python -m benchmarks.studies.selection_v4 --analyse")
    assert "**The default becomes `point_margin_1`**" in text and "shown worse on test ECE (secondary) in r1" in text


def test_when_no_simpler_rule_passes_the_current_rule_stays_and_the_report_says_why():
    diffs = {**DIFFS, "point_margin_1": {"gap": {"r1": (0.02, 0.03, 0.04)}}}
    res = v4.analyse(_table(diffs), REGIMES, SEEDS, MARGINS)
    assert res["decision"]["default"] == "current"
    assert res["decision"]["rules"]["point_margin_1"]["not_shown"] == ["gap in r1 (shown worse)"]
    text = v4.markdown(_table(diffs), res, "cmd")
    assert "stays the default" in text and "gap in r1 (shown worse)" in text


def test_an_incomplete_table_gets_its_progress_and_no_verdict():
    rows = _table(DIFFS)[:-1]
    res = v4.analyse(rows, REGIMES, SEEDS, MARGINS)
    assert "tests" not in res and res["progress"] == {
        "done": 5,
        "expected": 6,
        "per_regime": {"r1": 3, "r2": 2},
        "complete": False,
    }
    text = v4.markdown(rows, res, "cmd")
    assert "Incomplete: 5 of 6 sweeps done" in text and "default" not in text
    with pytest.raises(ValueError, match="twice"):
        v4.analyse([*rows, rows[0]], REGIMES, SEEDS, MARGINS)


def _sweep(regime: str, seed: int, *_: Any) -> dict[str, Any]:
    """A fabricated sweep in selection_v3's form: the CE_es arm, two one-go trials, one failed trial."""
    rng = np.random.default_rng(seed)
    labels = {s: rng.integers(0, 3, 90) for s in ("val", "test")}

    def probs(sharp: float, split: str) -> np.ndarray:
        logits = rng.normal(0, 1, (90, 3)) + sharp * np.eye(3)[labels[split]]
        e = np.exp(logits)
        return (e / e.sum(1, keepdims=True)).astype(np.float32)

    trials: list[dict[str, Any]] = []
    for i, params in enumerate(({"calibrator": "ce_es"}, {"calibrator": "vector", "calibrator_lr": 0.01})):
        t = {"params": params, "status": "completed", "seconds": 0.1}
        for s in ("val", "test"):
            t |= {f"{s}_labels": labels[s], f"{s}_probs": probs(1.0 + i, s), f"ts_{s}_probs": probs(1.5 + i, s)}
        trials.append(t)
    trials.append({"params": {"calibrator": "mlp"}, "status": "diverged", "seconds": 0.1})
    return {"dataset": regime, "seed": seed, "trials": trials}


def test_a_fabricated_sweep_through_the_rules_the_tables_and_the_resumable_run(tmp_path, monkeypatch):
    monkeypatch.setattr(v3, "run_sweep", _sweep)
    assert v4.run(tmp_path, ("digits",), (1, 2), False, 1, False) == 0
    rows = v4.read_table(tmp_path / "sweeps.csv.gz")
    cands = v4.read_table(tmp_path / "candidates.csv.gz")
    assert [(r["regime"], r["seed"]) for r in rows] == [("digits", "1"), ("digits", "2")] and len(cands) == 8
    assert rows[0]["ce_es_ts_candidate"] == "0+ts" and rows[0]["b_fallback"] == "False"
    assert rows[0]["threads"] == "1" and rows[0]["git_commit"] and rows[0]["cpu_model"]
    for row in rows:  # every simpler rule's pick and numbers recomputed from the candidates' table
        mine = [
            {k: (float(v) if k in v4.METRICS else v) for k, v in c.items()} | {"ts": c["ts"] == "True"}
            for c in cands
            if c["seed"] == row["seed"]
        ]
        best = max(c["test_accuracy"] for c in mine)
        assert float(row["best_test_accuracy"]) == best
        for rule in v4.RULES[:-1]:
            chosen, _ = v4.pick(rule, mine)
            assert row[f"{rule}_candidate"] == chosen["candidate"]
            assert float(row[f"{rule}_test_nll"]) == chosen["test_nll"]
            assert float(row[f"{rule}_gap"]) == best - chosen["test_accuracy"]
        assert row["current_candidate"] in {c["candidate"] for c in mine}
    before = (tmp_path / "sweeps.csv.gz").read_bytes()
    monkeypatch.setattr(v3, "run_sweep", lambda *a: pytest.fail("a sweep in the table was trained again"))
    assert v4.run(tmp_path, ("digits",), (1, 2), False, 1, False) == 0
    assert (tmp_path / "sweeps.csv.gz").read_bytes() == before
    with pytest.raises(ValueError, match="refusing to mix commits"):
        for r in rows:
            r["git_commit"] = "0" * 40
        v4.write_table(tmp_path / "sweeps.csv.gz", rows)
        v4.run(tmp_path, ("digits",), (1, 2, 3), False, 1, False)

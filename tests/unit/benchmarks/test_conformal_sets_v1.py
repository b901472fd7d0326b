"""conformal_sets_v1 (benchmarks/studies/protocols/conformal_sets_v1.md): the analysis on a fabricated table against
hand-computed t-test p-values and intervals (2 degrees of freedom: closed forms), Holm per family, the coverage check
and the verdicts; no verdict on an incomplete table; the arms of a fabricated sweep (the one-go pick from validation
alone, ref = 0+ts, missing pairs), and the table written and resumed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from benchmarks.studies import conformal_sets_v1 as cs
from benchmarks.studies import conformal_sets_v1_analysis as an

REGIMES = ("r1", "r2", "r3", "r4", "r5")
SEEDS = (1, 2, 3, 4)  # seed 4: a missing pair in every regime (counted, never analysed)
T975_2 = 4.302652729911275  # t(0.975, 2 df)
T995_2 = 9.924843200918276  # t(0.995, 2 df): the Bonferroni interval at 1 - 0.05 / 5
T95_2 = 2.919985580355516  # t(0.95, 2 df): the coverage check's 90 % interval


def _p_t2(t: float) -> float:
    """The t distribution's CDF with 2 degrees of freedom: 1/2 + t / (2 sqrt(t^2 + 2))."""
    return 0.5 + t / (2.0 * math.sqrt(t * t + 2.0))


# regime -> (D per seed, ref's size, one-go's and ref's test coverage)
CASES: dict[str, tuple[tuple[float, ...], float, float, float]] = {
    "r1": ((-0.21, -0.20, -0.19), 2.0, 0.900, 0.905),  # one-go smaller
    "r2": ((0.004, 0.005, 0.006), 1.0, 0.900, 0.905),  # CE_es + TS smaller, by less than the margin
    "r3": ((-0.05, 0.0, 0.05), 1.0, 0.900, 0.905),  # inconclusive
    "r4": ((-0.21, -0.20, -0.19), 2.0, 0.850, 0.905),  # sizes differ, coverage not held
    "r5": ((-0.001, 0.0, 0.001), 1.0, 0.900, 0.905),  # no practical difference
}


def _table() -> list[dict[str, str]]:
    """The per-sweep table as read back from the CSV (strings)."""
    rows = []
    for g in REGIMES:
        d, ref, cov_onego, cov_ref = CASES[g]
        for i, s in enumerate(SEEDS):
            row = {"regime": g, "seed": str(s), "missing": "ref" if s == 4 else "", "git_commit": "abc1234def"}
            if s == 4:
                rows.append(row | {"onego_lac_test_size": ""})  # nothing to read: a float("") would fail
                continue
            arms = {"ref": (ref, cov_ref), "onego": (ref + d[i], cov_onego), "onego_ts": (ref + d[i] / 2, cov_ref)}
            for arm, (size, cov) in arms.items():
                for m in ("lac", "aps", "raps"):
                    row[f"{arm}_{m}_test_size"] = repr(size + (0.5 if m != "lac" else 0.0))
                    row[f"{arm}_{m}_val_size"] = repr(size + 0.1)
                    row[f"{arm}_{m}_test_coverage"] = repr(cov)
                    row[f"{arm}_{m}_test_worst_class_coverage"] = repr(cov - 0.1)
                row[f"{arm}_test_accuracy"] = repr(0.8)
            rows.append(row)
    return rows


def test_the_analysis_matches_hand_computed_tests_and_intervals():
    res = an.analyse(_table(), REGIMES, SEEDS)
    t = res["tests"]
    assert res["missing"] == dict.fromkeys(REGIMES, 1) and all(t[g]["n"] == 3 for g in REGIMES)
    # r1: mean -0.2, sd 0.01: t = -0.2 / (0.01 / sqrt 3) = -20 sqrt 3
    r1 = t["r1"]
    assert r1["d"]["mean"] == pytest.approx(-0.2, abs=1e-12)
    assert r1["p"]["smaller"] == pytest.approx(_p_t2(-20 * math.sqrt(3)), abs=1e-9)
    assert r1["d"]["lo"] == pytest.approx(-0.2 - T975_2 * 0.01 / math.sqrt(3), abs=1e-9)
    assert r1["d"]["bonferroni"][1] == pytest.approx(-0.2 + T995_2 * 0.01 / math.sqrt(3), abs=1e-9)
    assert r1["delta"] == pytest.approx(0.1) and r1["ref_size"] == pytest.approx(2.0)
    # the TOST's larger p: H0 mean <= -delta, t = (-0.2 + 0.1) / (0.01 / sqrt 3) = -10 sqrt 3
    assert r1["p"]["tost"] == pytest.approx(1 - _p_t2(-10 * math.sqrt(3)), abs=1e-9)
    # r2: mean 0.005, sd 0.001, margin 0.05: "larger" t = 5 sqrt 3; TOST's larger p from H0 mean >= +delta
    r2 = t["r2"]
    assert r2["p"]["larger"] == pytest.approx(1 - _p_t2(5 * math.sqrt(3)), abs=1e-9)
    assert r2["p"]["tost"] == pytest.approx(_p_t2(-45 * math.sqrt(3)), abs=1e-9)
    # r3: mean 0, sd 0.05: TOST p = P(t < -sqrt 3) = 0.1127
    assert t["r3"]["p"]["tost"] == pytest.approx(_p_t2(-math.sqrt(3)), abs=1e-9)
    # the coverage check: C = -0.5 pt in every pair of r1 (held); r4: -5.5 pt and one-go at 85 % (not held)
    assert r1["coverage"]["diff"][0] == pytest.approx(-0.5) and r1["coverage_held"]
    assert not t["r4"]["coverage_held"]
    # secondary: APS and RAPS D as fabricated, one-go + TS half of D, val - test size of the pick 0.1 - 0
    assert r1["secondary"]["aps"][0] == pytest.approx(-0.2) and r1["secondary"]["onego_ts"][0] == pytest.approx(-0.1)
    assert r1["secondary"]["winners_curse"][0] == pytest.approx(0.1)


def test_holm_per_family_and_the_verdicts():
    t = an.analyse(_table(), REGIMES, SEEDS)["tests"]
    # "smaller": r1 and r4 at p = 0.0004 (<= 0.05 / 5, then 0.05 / 4), the next p is 0.5: two rejections
    assert {g for g in REGIMES if t[g]["reject"]["smaller"]} == {"r1", "r4"}
    assert {g for g in REGIMES if t[g]["reject"]["larger"]} == {"r2"}
    # TOST: r2 and r5 tiny, then r3 at 0.1127 > 0.05 / 3: stops
    assert {g for g in REGIMES if t[g]["reject"]["tost"]} == {"r2", "r5"}
    assert {g: t[g]["verdict"] for g in REGIMES} == {
        "r1": "one-go smaller",
        "r2": "CE_es + TS smaller (by less than the margin)",
        "r3": "inconclusive",
        "r4": "coverage not held",
        "r5": "no practical difference",
    }


def test_the_coverage_check_needs_both_the_band_and_88_percent():
    base = {f"{a}_{k}": "1.0" for a in ("ref", "onego", "onego_ts") for k in ("lac_test_size", "aps_test_size")}
    base |= {f"{a}_{k}": "1.0" for a in ("ref", "onego", "onego_ts") for k in ("raps_test_size", "lac_val_size")}
    base |= {f"{a}_{k}": "0.8" for a in ("ref", "onego") for k in ("test_accuracy", "lac_test_worst_class_coverage")}

    def rows(onego: tuple[float, ...], ref: tuple[float, ...]) -> list[dict[str, str]]:
        return [
            base | {"onego_lac_test_coverage": repr(o), "ref_lac_test_coverage": repr(r)}
            for o, r in zip(onego, ref, strict=True)
        ]

    # C = 1, 2, 3 pt: the 90 % interval 2 -+ t(0.95, 2) / sqrt 3 reaches past +2 pt
    s = an.regime_summary(rows((0.91, 0.92, 0.93), (0.90, 0.90, 0.90)), 0.99)
    assert s["coverage"]["lo90"] == pytest.approx(2 - T95_2 / math.sqrt(3), abs=1e-9) and not s["coverage_held"]
    # within the band, but ref's mean coverage 87 % < 88 %
    assert not an.regime_summary(rows((0.87, 0.87, 0.87), (0.87, 0.87, 0.87)), 0.99)["coverage_held"]
    assert an.regime_summary(rows((0.89, 0.89, 0.89), (0.89, 0.89, 0.89)), 0.99)["coverage_held"]


def test_the_report_and_the_readme_sentences():
    rows = _table()
    text = an.markdown(rows, an.analyse(rows, REGIMES, SEEDS), "python -m x --analyse")
    assert "| r1 | 3 (1) | 2.000 | 1.800 | -0.200 [" in text
    assert (
        "- on r1, one-go's LAC sets at alpha 0.1 were smaller than CE_es + TS's by 0.200 labels "
        f"[{0.2 - T975_2 * 0.01 / math.sqrt(3):.3f}, {0.2 + T975_2 * 0.01 / math.sqrt(3):.3f}], coverage held "
        "(one-go had up to 7 tries, CE_es one)."
    ) in text
    assert "- on r2, CE_es + TS's LAC sets at alpha 0.1 were smaller than one-go's by 0.005 labels" in text
    assert ", by less than the 5 % margin." in text
    assert "- on r3, inconclusive at 3 seeds: one-go minus CE_es + TS +0.000 labels [" in text
    assert "- on r4, coverage was not held (one-go's against CE_es + TS's), so no set size claim." in text
    assert "- on r5, no practical difference (within 5 %)" in text
    assert "The regimes disagree: no overall claim." in text


def test_an_incomplete_table_gives_no_verdict():
    rows = _table()[:-1]
    res = an.analyse(rows, REGIMES, SEEDS)
    assert "tests" not in res and res["progress"]["done"] == 19 and not res["progress"]["complete"]
    text = an.markdown(rows, res, "python -m x --analyse")
    assert "**Incomplete: 19 of 20 sweeps done**" in text and "No verdict" in text
    verdicts = ("one-go smaller", "CE_es + TS smaller", "no practical difference", "inconclusive", "README says")
    assert not any(v in text for v in verdicts)
    with pytest.raises(ValueError, match="twice"):
        an.analyse([*rows, rows[0]], REGIMES, SEEDS)


# ---------------------------------------------------------------------------- the arms of a sweep
K, N_VAL, N_TEST = 4, 60, 40


def _probs(top: np.ndarray, p_top: float) -> np.ndarray:
    """Each row p_top on its `top` label, the rest spread evenly (float32, as a trial stores them)."""
    p = np.full((len(top), K), (1 - p_top) / (K - 1), dtype=np.float64)
    p[np.arange(len(top)), top] = p_top
    return p.astype(np.float32)


def _trial(calibrator: str, p_top: float, status: str = "completed", wrong: int = 0) -> dict[str, Any]:
    """A trial whose top label is the true one except on every `wrong`-th row (0: never)."""
    rng = np.random.default_rng(0)
    yv, yt = rng.integers(0, K, N_VAL), rng.integers(0, K, N_TEST)
    t: dict[str, Any] = {"params": {"calibrator": calibrator}, "status": status}
    if status == "completed":
        for prefix, p in (("", p_top), ("ts_", 0.5 * (p_top + 1 / K))):
            for split, y in (("val", yv), ("test", yt)):
                top = y if not wrong else np.where(np.arange(len(y)) % wrong == 0, (y + 1) % K, y)
                t[f"{prefix}{split}_probs"] = _probs(top, p)
        t |= {"val_labels": yv, "test_labels": yt}
    return t


def _sweep(*trials: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": "mnist1d", "seed": 2499, "trials": list(trials)}


def test_the_arms_come_from_validation_alone_and_name_their_candidates(monkeypatch):
    calls: list[bool] = []
    real = cs.sets_of

    def spy(trial, prefix, seed, test):
        calls.append(test)
        return real(trial, prefix, seed, test)

    monkeypatch.setattr(cs, "sets_of", spy)
    sweep = _sweep(
        _trial("ce_es", 0.7),
        _trial("temperature", 0.4, wrong=2),  # one-go, wrong on every second row: every set all four labels
        _trial("vector", 0.97),  # one-go, sharp and right: every LAC set is its label alone
        _trial("none", 0.99),  # plain CE: sharper still, not a one-go trial
        _trial("matrix", 0.99, status="error"),
    )
    row = cs.sweep_row(sweep)
    assert (row["ref_candidate"], row["onego_candidate"], row["onego_ts_candidate"]) == ("0+ts", "2", "2+ts")
    assert row["missing"] == "" and row["onego_completed"] == 3 - 1 and row["completed"] == 4
    # sharp correct rows: the quantile is 1 - 0.97, each set holds the true label alone
    assert row["onego_lac_test_size"] == pytest.approx(1.0) and row["onego_lac_test_coverage"] == 1.0
    # the two one-go trials' validation sets (no test row passed in), then the three arms' sets with their test rows
    assert calls == [False, False, True, True, True]


def test_the_pick_breaks_ties_by_val_accuracy_then_index(monkeypatch):
    sizes = {1: 2.0, 2: 1.5, 3: 1.5, 4: 1.5}
    monkeypatch.setattr(cs, "sets_of", lambda trial, prefix, seed, test: {"lac_val_size": sizes[trial["i"]]})
    accuracy = {1: 0.9, 2: 0.6, 3: 0.8, 4: 0.8}
    monkeypatch.setattr(cs, "_accuracy", lambda probs, labels: accuracy[int(probs)])
    trials = [{"params": {"calibrator": "ce_es"}, "status": "completed", "i": 0, "val_probs": 0, "val_labels": 0}]
    trials += [
        {"params": {"calibrator": "vector"}, "status": "completed", "i": i, "val_probs": i, "val_labels": 0}
        for i in range(1, 5)
    ]
    index, _ = cs.pick_onego(_sweep(*trials))
    assert index == 3  # smallest size 1.5 (2, 3, 4), then higher val accuracy (3, 4), then the lower index


def test_missing_pairs_are_said_and_not_replaced():
    row = cs.sweep_row(_sweep(_trial("ce_es", 0.7, status="error"), _trial("vector", 0.9)))
    assert row["missing"] == "ref" and "ref_candidate" not in row and row["onego_candidate"] == "1"
    row = cs.sweep_row(_sweep(_trial("ce_es", 0.7), _trial("none", 0.9), _trial("vector", 0.9, status="error")))
    assert row["missing"] == "onego" and row["ref_candidate"] == "0+ts" and "onego_candidate" not in row


def test_the_run_writes_a_row_a_sweep_and_resumes(monkeypatch, tmp_path):
    import benchmarks.studies.conformal_sets_v1 as mod

    made = []

    def fake(regime, seed, quick, threads):
        made.append((regime, seed))
        return {**_sweep(_trial("ce_es", 0.7), _trial("vector", 0.9)), "dataset": regime, "seed": seed}

    monkeypatch.setattr(mod.v3, "run_sweep", fake)
    assert mod.run(tmp_path, ("mnist1d", "digits"), (7, 8), True, 1, False) == 0
    assert made == [("mnist1d", 7), ("digits", 7), ("mnist1d", 8), ("digits", 8)]  # seed-major
    rows = mod.read_table(tmp_path / "sweeps.csv.gz")
    assert [(r["regime"], int(r["seed"])) for r in rows] == made
    provenance = {"git_commit", "git_clean", "torch", "numpy", "cpu_model", "threads", "utc", "wall_s", "cpu_s"}
    assert provenance <= set(rows[0]) and rows[0]["onego_candidate"] == "1"
    made.clear()
    assert mod.run(tmp_path, ("mnist1d", "digits"), (7, 8), True, 1, False) == 0 and made == []


def test_the_generated_blocks_state_each_regime_s_answer(monkeypatch, tmp_path):
    """docs/conformal.md's block gives the protocol's sentence per regime and the README's gives each verdict with
    its regimes, both from the table alone; an incomplete table gives progress, no answer."""
    from benchmarks import readme_results as rr
    from benchmarks.studies.selection_v4 import write_table

    monkeypatch.setattr(an, "REGIMES", REGIMES)
    monkeypatch.setattr(an, "SEEDS", SEEDS)
    (tmp_path / "conformal_sets_v1").mkdir()
    write_table(tmp_path / "conformal_sets_v1" / "sweeps.csv.gz", _table())
    block = rr.conformal_sets_v1(tmp_path)
    assert "20 sweeps, 4 per regime" in block
    assert "- on r1, one-go's LAC sets at alpha 0.1 were smaller than CE_es + TS's by 0.200 labels" in block
    assert "- on r4, coverage was not held" in block and "The regimes disagree: no overall claim." in block
    answer = rr.conformal_sets_v1_answer(tmp_path)
    assert answer in block and answer.startswith("- on r1, one-go's LAC sets") and len(answer.splitlines()) == 7
    assert answer.endswith("The regimes disagree: no overall claim.")
    write_table(tmp_path / "conformal_sets_v1" / "sweeps.csv.gz", _table()[:-1])
    assert "19 of 20 sweeps done; no answer" in rr.conformal_sets_v1(tmp_path)
    assert rr.conformal_sets_v1_answer(tmp_path) == rr.conformal_sets_v1(tmp_path)

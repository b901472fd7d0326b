"""Conformal sets v1's analysis and report, from the per-sweep table alone (benchmarks/studies/protocols/
conformal_sets_v1.md, "Measures", "Tests and margin", "What the README says").

Per regime, over its complete pairs: D = size(onego) - size(ref), the paired difference of mean test LAC set sizes at
alpha 0.1 (positive: one-go's sets larger); coverage held when the 90 % t interval of the coverage difference (pt)
lies within (-2, +2) and both arms' mean test coverage is at least 88 %; one-sided paired t-tests "one-go smaller"
and "CE_es + TS smaller" and the TOST within 5 % of ref's mean size, each family Holm-corrected across the five
regimes. No verdict on an incomplete table.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.studies import selection_v3 as v3
from benchmarks.studies.selection_v4 import progress, study_header

# the protocol's sweeps (the command, conformal_sets_v1.py, imports them from here: no import cycle)
SEEDS = tuple(range(2400, 2436))  # new: disjoint from every seed the protocol lists
REGIMES = ("mnist1d", "digits", "mnist1d_overconf", "mnist1d_noise20", "mnist1d_imbalance10")
FAMILY_ALPHA = 0.05
MARGIN = 0.05  # of ref's mean test LAC set size in the regime
COVERAGE_BAND_PT = 2.0
MIN_COVERAGE = 0.88
COVERAGE_LEVEL = 0.90  # the coverage check's two-sided t interval (TOST at 0.05)


def t_interval(d: list[float], level: float) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided t interval of the mean of `d` at `level` (a point for n < 2 or sd 0)."""
    from scipy import stats

    a = np.asarray(d, dtype=np.float64)
    mean = float(a.mean())
    sd = float(a.std(ddof=1)) if len(a) > 1 else 0.0
    if sd == 0.0:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, len(a) - 1)) * sd / math.sqrt(len(a))
    return mean, mean - half, mean + half


def one_sided(d: list[float], delta: float) -> dict[str, float]:
    """The one-sided paired t p-values on D: 'smaller' (H0 mean >= 0), 'larger' (H0 mean <= 0), and the TOST's
    (H0 mean <= -delta and H0 mean >= +delta both rejected: the larger p)."""
    from scipy import stats

    a = np.asarray(d, dtype=np.float64)
    n, mean = len(a), float(a.mean())
    sd = float(a.std(ddof=1)) if n > 1 else 0.0
    if sd == 0.0:  # no spread: each hypothesis is rejected exactly when the mean lies strictly on its far side
        tost = float(not -delta < mean < delta)
        return {"smaller": float(mean >= 0), "larger": float(mean <= 0), "tost": tost}
    se = sd / math.sqrt(n)
    lower = float(stats.t.sf((mean + delta) / se, n - 1))  # H0: mean <= -delta
    upper = float(stats.t.cdf((mean - delta) / se, n - 1))  # H0: mean >= +delta
    return {
        "smaller": float(stats.t.cdf(mean / se, n - 1)),
        "larger": float(stats.t.sf(mean / se, n - 1)),
        "tost": max(lower, upper),
    }


def _values(sub: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in sub]


def _diff(
    sub: list[dict[str, str]], a: str, b: str, key: str, scale: float = 1.0, minus: str | None = None
) -> list[float]:
    """Per pair scale * (a's `key` - b's `minus`, by default b's `key`)."""
    return [scale * (float(r[f"{a}_{key}"]) - float(r[f"{b}_{minus or key}"])) for r in sub]


def regime_summary(sub: list[dict[str, str]], bonferroni: float) -> dict[str, Any]:
    """One regime's complete pairs: D and its tests and intervals, the coverage check, the secondary measures."""
    d = _diff(sub, "onego", "ref", "lac_test_size")
    c = _diff(sub, "onego", "ref", "lac_test_coverage", 100.0)
    cov = {arm: float(np.mean(_values(sub, f"{arm}_lac_test_coverage"))) for arm in ("onego", "ref")}
    _, c_lo, c_hi = t_interval(c, COVERAGE_LEVEL)
    ref_size = float(np.mean(_values(sub, "ref_lac_test_size")))
    delta = MARGIN * ref_size
    mean, lo, hi = t_interval(d, 0.95)
    arms = ("onego", "ref")
    return {
        "n": len(sub),
        "ref_size": ref_size,
        "onego_size": float(np.mean(_values(sub, "onego_lac_test_size"))),
        "delta": delta,
        "d": {"mean": mean, "lo": lo, "hi": hi, "bonferroni": t_interval(d, bonferroni)[1:]},
        "p": one_sided(d, delta),
        "coverage": {"diff": t_interval(c, 0.95), "lo90": c_lo, "hi90": c_hi, "mean": cov},
        "coverage_held": -COVERAGE_BAND_PT < c_lo and c_hi < COVERAGE_BAND_PT and min(cov.values()) >= MIN_COVERAGE,
        "secondary": {
            "aps": t_interval(_diff(sub, "onego", "ref", "aps_test_size"), 0.95),
            "raps": t_interval(_diff(sub, "onego", "ref", "raps_test_size"), 0.95),
            "accuracy_pt": t_interval(_diff(sub, "onego", "ref", "test_accuracy", 100.0), 0.95),
            "onego_ts": t_interval(_diff(sub, "onego_ts", "ref", "lac_test_size"), 0.95),
            "worst_class": {a: float(np.mean(_values(sub, f"{a}_lac_test_worst_class_coverage"))) for a in arms},
            "winners_curse": t_interval(_diff(sub, "onego", "onego", "lac_val_size", minus="lac_test_size"), 0.95),
        },
    }


def verdict(s: dict[str, Any]) -> str:
    """The protocol's verdict of one regime from its Holm-corrected rejections."""
    if not s["coverage_held"]:
        return "coverage not held"
    rej = s["reject"]
    for test, name in (("smaller", "one-go smaller"), ("larger", "CE_es + TS smaller")):
        if rej[test]:
            return name + (" (by less than the margin)" if rej["tost"] else "")
    return "no practical difference" if rej["tost"] else "inconclusive"


def analyse(
    rows: list[dict[str, str]], regimes: tuple[str, ...] = REGIMES, seeds: tuple[int, ...] = SEEDS
) -> dict[str, Any]:
    """Per regime the summary, Holm per family across the regimes and the verdicts; an incomplete table gives its
    progress only."""
    prog = progress(rows, regimes, seeds)
    missing = {g: sum(bool(r["missing"]) for r in rows if r["regime"] == g) for g in regimes}
    if not prog["complete"]:
        return {"progress": prog, "missing": missing}
    bonferroni = 1 - FAMILY_ALPHA / len(regimes)
    tests = {g: regime_summary([r for r in rows if r["regime"] == g and not r["missing"]], bonferroni) for g in regimes}
    for family in ("smaller", "larger", "tost"):
        rejected = v3.holm({g: s["p"][family] for g, s in tests.items()}, FAMILY_ALPHA)
        for g, s in tests.items():
            s.setdefault("reject", {})[family] = rejected[g]
    for s in tests.values():
        s["verdict"] = verdict(s)
    return {"progress": prog, "missing": missing, "tests": tests}


def readme_sentence(g: str, s: dict[str, Any]) -> str:
    """The protocol's README sentence for one regime (numbers from the summary, none typed by hand)."""
    d, v = s["d"], s["verdict"]
    budget = " (one-go had up to 7 tries, CE_es one)"
    if v.startswith("one-go smaller"):
        return (
            f"on {g}, one-go's LAC sets at alpha 0.1 were smaller than CE_es + TS's by {-d['mean']:.3f} labels "
            f"[{-d['hi']:.3f}, {-d['lo']:.3f}], coverage held{_within(v)}{budget}"
        )
    if v.startswith("CE_es + TS smaller"):
        return (
            f"on {g}, CE_es + TS's LAC sets at alpha 0.1 were smaller than one-go's by {d['mean']:.3f} labels "
            f"[{d['lo']:.3f}, {d['hi']:.3f}], coverage held{_within(v)}"
        )
    interval = f"one-go minus CE_es + TS {d['mean']:+.3f} labels [{d['lo']:+.3f}, {d['hi']:+.3f}]"
    if v == "no practical difference":
        return f"on {g}, no practical difference (within 5 %) in LAC set size at alpha 0.1: {interval}"
    if v == "inconclusive":
        return f"on {g}, inconclusive at {s['n']} seeds: {interval}"
    return f"on {g}, coverage was not held (one-go's against CE_es + TS's), so no set size claim"


def _within(verdict_text: str) -> str:
    return ", by less than the 5 % margin" if verdict_text.endswith("(by less than the margin)") else ""


def _header(rows: list[dict[str, str]], command: str) -> list[str]:
    """This study's report head (selection_v4's shape: the same table and provenance columns)."""
    title = "Conformal sets v1: one-go or CE_es + TS, which gives smaller sets?"
    return study_header(rows, command, "conformal_sets_v1", title)


def markdown(rows: list[dict[str, str]], result: dict[str, Any], command: str) -> str:
    """The report: progress only on an incomplete table; else the per-regime tests, the secondary measures, the
    verdicts and the README's sentences."""
    L = _header(rows, command)
    prog = result["progress"]
    if "tests" not in result:
        per = ", ".join(f"{g} {n}" for g, n in prog["per_regime"].items())
        L.append(
            f"**Incomplete: {prog['done']} of {prog['expected']} sweeps done** ({per}). No verdict is declared on an "
            "incomplete table (the protocol); resume with the command above."
        )
        return "\n".join(L) + "\n"
    tests = result["tests"]
    L += _primary_table(tests, result["missing"]) + _secondary_table(tests)
    verdicts = {s["verdict"] for s in tests.values()}
    L += ["## What the README says (generated)", ""]
    L += [f"- {readme_sentence(g, s)}." for g, s in tests.items()]
    L += [
        "",
        "The regimes disagree: no overall claim." if len(verdicts) > 1 else "The five regimes agree.",
        "",
        "The budgets differ: one-go's arm is the best of up to 7 one-go trials by validation set size, CE_es's is one "
        "run (its epoch chosen on validation).",
    ]
    return "\n".join(L) + "\n"


def _primary_table(tests: dict[str, Any], missing: dict[str, int]) -> list[str]:
    """Per regime: pairs, sizes, D with its intervals, the tests after Holm, the coverage check, the verdict."""
    L = [
        "## Primary: D = mean test LAC set size at alpha 0.1, one-go minus CE_es + TS (labels per row)",
        "",
        "| regime | pairs (missing) | ref size | one-go size | D [95 % t] | D [Bonferroni 99 %] | margin | "
        "p one-go smaller | p CE_es + TS smaller | p TOST | coverage diff, pt [90 %] | mean coverage one-go / ref "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g, s in tests.items():
        d, p, rej, cov = s["d"], s["p"], s["reject"], s["coverage"]
        mark = {k: "*" if rej[k] else "" for k in rej}
        L.append(
            f"| {g} | {s['n']} ({missing[g]}) | {s['ref_size']:.3f} | {s['onego_size']:.3f} | {d['mean']:+.3f} "
            f"[{d['lo']:+.3f}, {d['hi']:+.3f}] | [{d['bonferroni'][0]:+.3f}, {d['bonferroni'][1]:+.3f}] | "
            f"{s['delta']:.3f} | {p['smaller']:.4f}{mark['smaller']} | {p['larger']:.4f}{mark['larger']} | "
            f"{p['tost']:.4f}{mark['tost']} | {cov['diff'][0]:+.2f} [{cov['lo90']:+.2f}, {cov['hi90']:+.2f}] | "
            f"{100 * cov['mean']['onego']:.1f} / {100 * cov['mean']['ref']:.1f} % | {s['verdict']} |"
        )
    return [
        *L,
        "",
        "\\* rejected after Holm across the five regimes (familywise 0.05 per family). Margin: 5 % of ref's mean size.",
        "",
    ]


def _secondary_table(tests: dict[str, Any]) -> list[str]:
    """The descriptive measures (no verdict): APS and RAPS D, accuracy, one-go + TS, worst class, winner's curse."""
    L = [
        "## Secondary (descriptive, no verdict)",
        "",
        "| regime | APS D | RAPS D | test acc one-go - ref, pt | one-go + TS - ref, LAC D | worst-class coverage "
        "one-go / ref | one-go pick: val - test size |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, s in tests.items():
        x = s["secondary"]
        ci = lambda t: f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]"  # noqa: E731
        L.append(
            f"| {g} | {ci(x['aps'])} | {ci(x['raps'])} | {ci(x['accuracy_pt'])} | {ci(x['onego_ts'])} | "
            f"{100 * x['worst_class']['onego']:.1f} / {100 * x['worst_class']['ref']:.1f} % | "
            f"{ci(x['winners_curse'])} |"
        )
    return [*L, "", "Means over the regime's complete pairs with 95 % t intervals.", ""]

"""Selection v4 (benchmarks/studies/protocols/selection_v4.md, pre-registered): the current margin rule against four
simpler rules on the same new sweeps, judged by test NLL and the accuracy gap (non-inferiority, Holm across regimes).

    nice -n 19 python -m benchmarks.studies.selection_v4 --threads 1   # train and evaluate; resumable, a row a sweep
    python -m benchmarks.studies.selection_v4 --analyse                 # the report, from the per-sweep table alone
    python -m benchmarks.studies.selection_v4 --power                   # the protocol's power figures, from v3

Sweeps are selection_v3's (`selection_v3.run_sweep`, `selection_v3.candidates`); every rule picks from the same 16
candidates of a sweep. Writes benchmarks/results/selection_v4/{sweeps,candidates}.csv.gz and selection_v4.md.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, ROOT, command_line, utc_now, write_text
from benchmarks.provenance import check_same_commit, provenance
from benchmarks.studies import selection_v3 as v3

SEEDS = tuple(range(2300, 2336))  # new (protocol: every seed of the earlier studies listed there)
REGIMES = ("mnist1d", "digits", "mnist1d_overconf", "mnist1d_noise20", "mnist1d_imbalance10")
CURRENT: dict[str, Any] = {
    "rule": "margin",
    "max_accuracy_loss": 2.0,
    "metric": "val_ece",
    "confidence": 0.95,
    "num_resamples": 1000,
}
DECISION = ("ce_es_ts", "most_accurate_ts", "min_val_nll", "point_margin_1")  # b, a, c, d: simplest first
POINT_MARGINS = {"point_margin_05": 0.005, "point_margin_1": 0.01, "point_margin_2": 0.02}
RULES = (*DECISION, "point_margin_05", "point_margin_2", "current")
ACC_MARGIN = 0.01  # accuracy gap, as a fraction (1 pt)
NLL_MARGINS = {  # 10 % of the current rule's mean test NLL per regime in selection_v3 (nats)
    "mnist1d": 0.0215,
    "digits": 0.0130,
    "mnist1d_overconf": 0.0408,
    "mnist1d_noise20": 0.1676,
    "mnist1d_imbalance10": 0.0951,
}
ALPHA = 0.05
METRICS = ("val_accuracy", "val_ece", "val_nll", "test_accuracy", "test_ece", "test_nll")
OUT = RESULTS_DIR / "selection_v4"


def _key(c: dict[str, Any]) -> tuple[int, bool]:
    """Candidate order for ties: trial index, then as trained before + TS."""
    return int(c["trial"]), bool(c["ts"])


def most_accurate_ts(cands: list[dict[str, Any]]) -> dict[str, Any]:
    """Rule a: the trial with the highest val accuracy, + TS; ties by the + TS candidate's val NLL, then index."""
    ts = [c for c in cands if c["ts"]]
    top = max(c["val_accuracy"] for c in ts)
    return min((c for c in ts if c["val_accuracy"] == top), key=lambda c: (c["val_nll"], _key(c)))


def pick(rule: str, cands: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """A simpler rule's pick among a sweep's completed candidates (validation numbers only), and whether rule b fell
    back to rule a (its reference arm did not complete)."""
    if rule == "ce_es_ts":
        arm = [c for c in cands if c["ts"] and c["family"] == "CE with early stopping + TS"]
        return (arm[0], False) if arm else (most_accurate_ts(cands), True)
    if rule == "most_accurate_ts":
        return most_accurate_ts(cands), False
    if rule == "min_val_nll":
        return min(cands, key=lambda c: (c["val_nll"], _key(c))), False
    best = max(c["val_accuracy"] for c in cands)
    kept = [c for c in cands if c["val_accuracy"] >= best - POINT_MARGINS[rule] - 1e-12]
    return min(kept, key=lambda c: (c["val_ece"], c["val_nll"], _key(c))), False


def sweep_rows(sweep: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One sweep's row of the table (every rule's pick and its test numbers) and its candidates' rows."""
    from sweeps.config import SelectionConfig
    from sweeps.decide.selection import POST_TS, select

    records, reps = v3.candidates(sweep, int(CURRENT["num_resamples"]))
    ok = [r for r in records if r.ok]
    cands = [
        {"candidate": r.trial_id, "trial": int(r.trial), "ts": r.post == POST_TS, "label": r.label, "family": r.family}
        | {k: float(r.metrics[k]) for k in METRICS}
        for r in ok
    ]
    by_id = {c["candidate"]: c for c in cands}
    best = max(c["test_accuracy"] for c in cands)
    first = next(t for t in sweep["trials"] if t["status"] == "completed")
    row: dict[str, Any] = {
        "regime": sweep["dataset"],
        "seed": sweep["seed"],
        "n_val": len(first["val_labels"]),
        "n_test": len(first["test_labels"]),
        "trials": len(sweep["trials"]),
        "candidates": len(cands),
        "best_test_accuracy": best,
    }
    for rule in RULES:
        if rule == "current":
            chosen, fell_back = by_id[select(records, SelectionConfig(**CURRENT), reps)[0].trial_id], False
        else:
            chosen, fell_back = pick(rule, cands)
        if rule == "ce_es_ts":
            row["b_fallback"] = fell_back
        row |= {f"{rule}_candidate": chosen["candidate"], f"{rule}_family": chosen["family"]}
        row |= {f"{rule}_{k}": chosen[k] for k in ("test_nll", "test_accuracy", "test_ece")}
        row[f"{rule}_gap"] = best - chosen["test_accuracy"]
    head = {"regime": sweep["dataset"], "seed": sweep["seed"]}
    return row, [head | c for c in cands]


# ------------------------------------------------------------------------------------------
# the tables: gzip CSV, rewritten whole and atomically after each sweep
# ------------------------------------------------------------------------------------------
def read_table(path: Path) -> list[dict[str, str]]:
    """A gzip CSV's rows as strings (none when the file does not exist)."""
    if not path.is_file():
        return []
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows (floats by repr, so they read back exactly) as a gzip CSV, atomically."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows({k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(buf.getvalue().encode(), compresslevel=9, mtime=0))
    tmp.replace(path)


def run_provenance() -> dict[str, Any]:
    """provenance() at the start of the run (the code this process loaded), with the modified tracked files."""
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = ";".join(line[3:] for line in out.stdout.splitlines()) if out.returncode == 0 else "unknown"
    return {**provenance(), "dirty": dirty}


def run(out: Path, regimes: tuple[str, ...], seeds: tuple[int, ...], quick: bool, threads: int, mixed: bool) -> int:
    """Train and evaluate every (seed, regime) sweep not yet in the table, seed-major, a row appended per sweep."""
    import torch

    assert tuple(v3.regimes()) == REGIMES, "selection_v3's regimes changed: the protocol names these five"
    torch.set_num_threads(threads)  # before provenance() records it
    prov = run_provenance()
    rows, cands = read_table(out / "sweeps.csv.gz"), read_table(out / "candidates.csv.gz")
    check_same_commit((r["git_commit"] for r in rows), prov["git_commit"], mixed)
    done = {(r["regime"], int(r["seed"])) for r in rows}
    todo = [(g, s) for s in seeds for g in regimes if (g, s) not in done]
    print(f"selection_v4: {len(done)} sweeps in the table, {len(todo)} to run", flush=True)
    for regime, seed in todo:
        t0, c0 = time.perf_counter(), time.process_time()
        row, crows = sweep_rows(v3.run_sweep(regime, seed, quick, threads))
        row |= prov | {"utc": utc_now(), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        rows.append(row)
        cands += crows
        write_table(out / "candidates.csv.gz", cands)
        write_table(out / "sweeps.csv.gz", rows)
        print(f"{regime} seed {seed}: {row['wall_s']:.0f} s ({len(rows)} of {len(regimes) * len(seeds)})", flush=True)
    return 0


# ------------------------------------------------------------------------------------------
# the analysis: from the per-sweep table alone
# ------------------------------------------------------------------------------------------
def compare(d: list[float], delta: float) -> dict[str, Any]:
    """Paired differences D (rule minus current; positive = worse): mean, 95 % t interval, the one-sided p of
    non-inferiority (H0: mean >= delta) and of "worse" (H0: mean <= 0)."""
    from scipy import stats

    a = np.asarray(d, dtype=np.float64)
    n, mean = len(a), float(a.mean())
    sd = float(a.std(ddof=1)) if n > 1 else 0.0
    if sd == 0.0:
        return {"mean": mean, "lo": mean, "hi": mean, "n": n, "p_ni": float(mean >= delta), "p_worse": float(mean <= 0)}
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(0.975, n - 1)) * se
    return {
        "mean": mean,
        "lo": mean - half,
        "hi": mean + half,
        "n": n,
        "p_ni": float(stats.t.cdf((mean - delta) / se, n - 1)),
        "p_worse": float(stats.t.sf(mean / se, n - 1)),
    }


def progress(rows: list[dict[str, str]], regimes: tuple[str, ...], seeds: tuple[int, ...]) -> dict[str, Any]:
    """How many of the protocol's (regime, seed) sweeps the table holds; refuses rows outside it or twice."""
    keys = [(r["regime"], int(r["seed"])) for r in rows]
    expected = {(g, s) for g in regimes for s in seeds}
    if len(set(keys)) != len(keys) or not set(keys) <= expected:
        raise ValueError("the table holds a sweep twice or a sweep the protocol does not name")
    per = {g: sum(k[0] == g for k in keys) for g in regimes}
    return {"done": len(keys), "expected": len(expected), "per_regime": per, "complete": set(keys) == expected}


def analyse(
    rows: list[dict[str, str]],
    regimes: tuple[str, ...] = REGIMES,
    seeds: tuple[int, ...] = SEEDS,
    nll_margins: dict[str, float] = NLL_MARGINS,
) -> dict[str, Any]:
    """Per regime and rule the paired comparisons with the current rule; per rule and criterion Holm across regimes;
    the decision. An incomplete table gives its progress only."""
    prog = progress(rows, regimes, seeds)
    if not prog["complete"]:
        return {"progress": prog}
    # ECE is secondary: no margin (its "non-inferior" is never read), only "shown worse"
    margins: dict[str, dict[str, float]] = {
        "test_nll": nll_margins,
        "gap": dict.fromkeys(regimes, ACC_MARGIN),
        "test_ece": dict.fromkeys(regimes, math.inf),
    }
    tests: dict[str, Any] = {}
    for rule in RULES[:-1]:
        for k, delta in margins.items():
            cell = {}
            for g in regimes:
                sub = [r for r in rows if r["regime"] == g]
                d = [float(r[f"{rule}_{k}"]) - float(r[f"current_{k}"]) for r in sub]
                cell[g] = compare(d, delta[g])
            ni = v3.holm({g: c["p_ni"] for g, c in cell.items()}, ALPHA)
            worse = v3.holm({g: c["p_worse"] for g, c in cell.items()}, ALPHA)
            for g, c in cell.items():
                c |= {"ni": ni[g], "worse": worse[g]}
            tests[f"{rule}/{k}"] = cell
    return {"progress": prog, "tests": tests, "decision": decide(tests, regimes)}


def decide(tests: dict[str, Any], regimes: tuple[str, ...]) -> dict[str, Any]:
    """The protocol's rule: the simplest of b, a, c, d shown non-inferior on both criteria in every regime."""
    per: dict[str, Any] = {}
    for rule in DECISION:
        fails = [
            f"{k} in {g} ({'shown worse' if tests[f'{rule}/{k}'][g]['worse'] else 'inconclusive'})"
            for k in ("test_nll", "gap")
            for g in regimes
            if not tests[f"{rule}/{k}"][g]["ni"]
        ]
        per[rule] = {"passes": not fails, "not_shown": fails}
    chosen = next((r for r in DECISION if per[r]["passes"]), "current")
    return {"default": chosen, "rules": per}


# ------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------
def study_header(rows: list[dict[str, str]], command: str, study: str, title: str) -> list[str]:
    """A table study's report head: title, the run and report commands, protocol, commits and the machine, as the
    rows of `benchmarks/results/<study>/sweeps.csv.gz` record them."""
    commits: dict[str, int] = {}
    for r in rows:
        commits[r.get("git_commit", "")[:10]] = commits.get(r.get("git_commit", "")[:10], 0) + 1
    first = rows[0] if rows else {}
    made = ", ".join(f"commit {c} ({n} sweeps)" for c, n in commits.items()) or "no sweep yet"
    clean = sum(r.get("git_clean") == "True" for r in rows)
    return [
        f"# {title} (benchmarks/studies/{study}.py)",
        "",
        f"Command: `python -m benchmarks.studies.{study} --threads 1` (the sweeps, resumable; run at `nice -n 19`), "
        f"then `{command}` (this report, generated {utc_now()} UTC from `benchmarks/results/{study}/sweeps.csv.gz` "
        "alone).  ",
        f"Protocol: `benchmarks/studies/protocols/{study}.md`, committed before any sweep ran. Rows made at {made}; "
        f"{clean} of {len(rows)} from a clean tree; torch {first.get('torch', '-')}, numpy {first.get('numpy', '-')}, "
        f"{first.get('threads', '-')} thread(s), CPU {first.get('cpu_model', '-')}.",
        "",
    ]


def _header(rows: list[dict[str, str]], command: str) -> list[str]:
    """This study's report head."""
    return study_header(rows, command, "selection_v4", "Selection v4: the simplest rule the evidence supports")


def markdown(rows: list[dict[str, str]], result: dict[str, Any], command: str) -> str:
    """The report: progress only on an incomplete table; else per-regime tables, the tests and the decision."""
    L = _header(rows, command)
    prog = result["progress"]
    if "tests" not in result:
        per = ", ".join(f"{g} {n}" for g, n in prog["per_regime"].items())
        L += [
            f"**Incomplete: {prog['done']} of {prog['expected']} sweeps done** ({per}). No verdict is declared on an "
            "incomplete table (the protocol); resume with the command in the protocol.",
        ]
        return "\n".join(L) + "\n"
    regimes = list(prog["per_regime"])
    for g in regimes:
        L += _regime_table(rows, result["tests"], g)
    L += _decision_lines(result["decision"], result["tests"], regimes)
    return "\n".join(L) + "\n"


def _regime_table(rows: list[dict[str, str]], tests: dict[str, Any], g: str) -> list[str]:
    """One regime: each rule's means and its paired differences with the current rule."""
    sub = [r for r in rows if r["regime"] == g]
    mean = lambda k: float(np.mean([float(r[k]) for r in sub]))  # noqa: E731

    def diff(rule: str, k: str, scale: float, fmt: str) -> str:
        c = tests[f"{rule}/{k}"][g]
        mark = " NI" if c.get("ni") and k != "test_ece" else ""
        mark += " worse" if c["worse"] else ""
        return f"{scale * c['mean']:{fmt}} [{scale * c['lo']:{fmt}}, {scale * c['hi']:{fmt}}]{mark}"

    L = [
        f"## {g} ({len(sub)} sweeps, validation n = {sub[0]['n_val']}, test n = {sub[0]['n_test']})",
        "",
        "| rule | same pick as current | acc gap, pt | test NLL | test ECE % | NLL - current | gap - current, pt | "
        "ECE - current, pt | families |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        fams: dict[str, int] = {}
        for r in sub:
            fams[r[f"{rule}_family"]] = fams.get(r[f"{rule}_family"], 0) + 1
        same = sum(r[f"{rule}_candidate"] == r["current_candidate"] for r in sub)
        cells = ["-", "-", "-"]
        if rule != "current":
            cells = [
                diff(rule, "test_nll", 1, "+.4f"),
                diff(rule, "gap", 100, "+.2f"),
                diff(rule, "test_ece", 100, "+.2f"),
            ]
        L.append(
            f"| {rule} | {same}/{len(sub)} | {100 * mean(f'{rule}_gap'):.2f} | {mean(f'{rule}_test_nll'):.4f} | "
            f"{100 * mean(f'{rule}_test_ece'):.2f} | {' | '.join(cells)} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(fams.items()))} |"
        )
    return [*L, ""]


def _decision_lines(decision: dict[str, Any], tests: dict[str, Any], regimes: list[str]) -> list[str]:
    """The decision table and the outcome sentence."""
    L = [
        "Differences are rule minus current, means over sweeps with 95 % t intervals; NI: shown non-inferior (one-sided "
        f"paired t, margin {100 * ACC_MARGIN:g} pt for the gap and the protocol's per-regime NLL margin, Holm across the "
        "regimes); worse: shown worse than the current rule (one-sided, Holm).",
        "",
        "## The decision rule",
        "",
        "| rule (simplest first) | NLL non-inferior in | gap non-inferior in | not shown in | passes |",
        "|---|---|---|---|---|",
    ]
    for rule, v in decision["rules"].items():
        ni = {k: [g for g in regimes if tests[f"{rule}/{k}"][g]["ni"]] for k in ("test_nll", "gap")}
        L.append(
            f"| {rule} | {len(ni['test_nll'])}/{len(regimes)} | {len(ni['gap'])}/{len(regimes)} | "
            f"{'; '.join(v['not_shown']) or '-'} | {'yes' if v['passes'] else 'no'} |"
        )
    L += ["", "## Outcome", ""]
    chosen = decision["default"]
    if chosen == "current":
        L.append(
            "**No simpler rule was shown non-inferior on both co-primary criteria in every regime: the current rule "
            "(margin, 2 pt, paired-bootstrap lower bound) stays the default.** Why, per rule: the cells listed under "
            "'not shown in' above (shown worse, or inconclusive at this n)."
        )
    else:
        worse = [g for g in regimes if tests[f"{chosen}/test_ece"][g]["worse"]]
        L.append(
            f"**The default becomes `{chosen}`**, the simplest rule shown non-inferior to the current rule on test NLL "
            "and the accuracy gap in every regime, as the protocol fixed."
            + (f" It is shown worse on test ECE (secondary) in {', '.join(worse)}." if worse else "")
        )
    return L


# ------------------------------------------------------------------------------------------
# the power calculation of the protocol, from selection_v3's per-sweep results
# ------------------------------------------------------------------------------------------
def power(n: int, pairs: tuple[str, ...], draws: int = 20_000) -> float:
    """P(shown non-inferior on both criteria in all regimes) at true difference 0, SDs of D from v3's pairs of rules
    (the largest per regime, each against margin 2), normal D, the t-test and Holm as the protocol says."""
    from scipy import stats

    from benchmarks.common import read_json

    sweeps = read_json(RESULTS_DIR / "selection_v3.json.gz")["sweeps"]
    rng = np.random.default_rng(0)
    out = 1.0
    for k, margin in (("test_nll", NLL_MARGINS), ("acc_gap_to_best_test", dict.fromkeys(REGIMES, ACC_MARGIN))):
        ps = []
        for g in REGIMES:
            sub = [s["rules"] for s in sweeps if s["dataset"] == g]
            sd = max(float(np.std([r[p][k] - r["margin 2"][k] for r in sub], ddof=1)) for p in pairs)
            x = rng.normal(0.0, sd, (draws, n))
            t = (x.mean(axis=1) - margin[g]) / (x.std(axis=1, ddof=1) / math.sqrt(n))
            ps.append(stats.t.cdf(t, n - 1))
        p = np.sort(np.array(ps).T, axis=1)
        out *= float(np.mean(np.all(p <= ALPHA / (len(REGIMES) - np.arange(len(REGIMES))), axis=1)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the sweeps (resumable), or --analyse the table, or print --power."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--analyse", action="store_true", help="write selection_v4.md from the table alone")
    p.add_argument("--power", action="store_true", help="the protocol's power figures from selection_v3's results")
    p.add_argument("--out-dir", type=Path, default=OUT, help="the study's table folder")
    p.add_argument("--report", type=Path, default=RESULTS_DIR / "selection_v4.md")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny sweeps, first seed, digits (a smoke test)")
    p.add_argument("--allow-mixed-commits", action="store_true", help="resume a table made at another commit")
    a = p.parse_args(argv)
    if a.power:
        same = ("previous default, 16 candidates", "margin 0.5", "margin 1")
        for n in (24, 30, 36, 40):
            print(f"n = {n}: {power(n, same):.2f} (same candidates), {power(n, (v3.REFERENCE,)):.2f} (pessimistic)")
        return 0
    if a.analyse:
        rows = read_table(a.out_dir / "sweeps.csv.gz")
        result = analyse(rows)
        write_text(a.report, markdown(rows, result, command_line(__file__, argv)))
        print(a.report.read_text())
        return 0 if "tests" in result else 3
    if a.quick:  # never into the study's table
        out = Path(tempfile.mkdtemp(prefix="selection_v4_quick_")) if a.out_dir == OUT else a.out_dir
        return run(out, ("digits",), SEEDS[:1], True, a.threads, a.allow_mixed_commits)
    return run(a.out_dir, REGIMES, SEEDS, False, a.threads, a.allow_mixed_commits)


if __name__ == "__main__":
    raise SystemExit(main())

"""Conformal sets v1 (benchmarks/studies/protocols/conformal_sets_v1.md, pre-registered): one-go as trained against
CE_es + TS, paired test mean LAC set size at alpha 0.1 on the five demo regimes.

    nice -n 19 python -m benchmarks.studies.conformal_sets_v1 --threads 1   # the sweeps; resumable, a row a sweep
    python -m benchmarks.studies.conformal_sets_v1 --analyse                 # the report, from the table alone
    python -m benchmarks.studies.conformal_sets_v1 --quick                   # smoke test: seed 2499, scratch folder

Sweeps are selection_v4's (`selection_v3.run_sweep`, imported); sets are `calib_core.conformal.evaluate_sets` on each
candidate's stored probabilities. The arms are fixed from validation numbers alone (the pick's sets are computed with
no test row passed in), then their test sets are computed. Writes benchmarks/results/conformal_sets_v1/sweeps.csv.gz;
the analysis and report are benchmarks/studies/conformal_sets_v1_analysis.py.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, command_line, utc_now, write_text
from benchmarks.provenance import check_same_commit
from benchmarks.studies import conformal_sets_v1_analysis as an
from benchmarks.studies import selection_v3 as v3
from benchmarks.studies.conformal_sets_v1_analysis import REGIMES, SEEDS
from benchmarks.studies.selection_v4 import read_table, run_provenance, write_table

SMOKE_SEED = 2499  # the protocol's smoke-test seed (not a study seed)
ALPHA = 0.1
METHODS = ("lac", "aps", "raps")
FOLDS = 5
ARMS = ("ref", "onego", "onego_ts")  # CE_es + TS; one-go as trained (the pick); the same pick + TS (secondary)
OUT = RESULTS_DIR / "conformal_sets_v1"
REPORT = RESULTS_DIR / "conformal_sets_v1.md"


def sets_of(trial: dict[str, Any], prefix: str, seed: int, test: bool) -> dict[str, float]:
    """A candidate's sets at ALPHA per method: {'<method>_<split>_<measure>': value} for measures coverage, size and
    worst_class_coverage; `test=False` passes no test row in (the validation numbers do not depend on it)."""
    from calib_core.conformal.evaluate import evaluate_sets

    val = (trial[f"{prefix}val_probs"], trial["val_labels"])
    other = (trial[f"{prefix}test_probs"], trial["test_labels"]) if test else val
    found = evaluate_sets(*val, *other, alphas=[ALPHA], methods=METHODS, folds=FOLDS, seed=seed)
    splits = ("val", "test") if test else ("val",)
    measures = ("coverage", "size", "worst_class_coverage")
    return {f"{e.method}_{s}_{m}": float(e.metrics[s][m]) for e in found for s in splits for m in measures}


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))


def pick_onego(sweep: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """The one-go arm (validation only): among the completed one-go trials as trained, the smallest cross-fitted
    mean LAC set size at ALPHA; ties by higher val accuracy, then lower trial index. None when none completed."""
    from sweeps.selection_rules.base import method_family

    scored = []
    for i, t in enumerate(sweep["trials"]):
        if t["status"] == "completed" and method_family(t["params"]) == "one-go":
            val = sets_of(t, "", sweep["seed"], test=False)
            scored.append((val["lac_val_size"], -_accuracy(t["val_probs"], t["val_labels"]), i, val))
    if not scored:
        return None
    _, _, index, val = min(scored, key=lambda s: s[:3])
    return index, val


def _arm(prefix: str, trial: dict[str, Any], seed: int, candidate: str) -> dict[str, Any]:
    found = sets_of(trial, "ts_" if prefix == "ts" else "", seed, test=True)
    probs = trial["ts_test_probs" if prefix == "ts" else "test_probs"]
    return {"candidate": candidate, "test_accuracy": _accuracy(probs, trial["test_labels"]), **found}


def sweep_row(sweep: dict[str, Any]) -> dict[str, Any]:
    """One sweep's row: the arms fixed from validation, then each arm's sets on both splits; `missing` says why a
    pair is incomplete (the protocol counts it and does not replace it)."""
    from sweeps.selection_rules.base import method_family

    trials, seed = sweep["trials"], sweep["seed"]
    ref_trial = trials[0]
    assert method_family(ref_trial["params"]) == "CE with early stopping", "trial 0 must be the ce_es reference arm"
    completed = [t for t in trials if t["status"] == "completed"]
    row: dict[str, Any] = {
        "regime": sweep["dataset"],
        "seed": seed,
        "trials": len(trials),
        "completed": len(completed),
        "onego_completed": sum(method_family(t["params"]) == "one-go" for t in completed),
        "n_val": len(completed[0]["val_labels"]) if completed else 0,
        "n_test": len(completed[0]["test_labels"]) if completed else 0,
    }
    pick = pick_onego(sweep)
    missing = [why for why, gone in (("ref", ref_trial["status"] != "completed"), ("onego", pick is None)) if gone]
    row["missing"] = "+".join(missing)
    arms: dict[str, dict[str, Any]] = {}
    if ref_trial["status"] == "completed":
        arms["ref"] = _arm("ts", ref_trial, seed, "0+ts")
    if pick is not None:  # the arms are fixed: test rows are read from here on
        index, val = pick
        arms["onego"] = _arm("", trials[index], seed, str(index))
        arms["onego_ts"] = _arm("ts", trials[index], seed, f"{index}+ts")
        changed = {k for k, v in val.items() if arms["onego"][k] != v}
        assert not changed, f"the pick's validation sets changed with the test rows passed in: {sorted(changed)}"
    for arm, values in arms.items():
        row |= {f"{arm}_{k}": v for k, v in values.items()}
    return row


def run(out: Path, regimes: tuple[str, ...], seeds: tuple[int, ...], quick: bool, threads: int, mixed: bool) -> int:
    """Train and evaluate every (seed, regime) sweep not yet in the table, seed-major, a row written per sweep."""
    import torch

    assert tuple(v3.regimes()) == REGIMES, "selection_v3's regimes changed: the protocol names these five"
    torch.set_num_threads(threads)  # before run_provenance() records it
    prov = run_provenance()
    rows = read_table(out / "sweeps.csv.gz")
    check_same_commit((r["git_commit"] for r in rows), prov["git_commit"], mixed)
    done = {(r["regime"], int(r["seed"])) for r in rows}
    todo = [(g, s) for s in seeds for g in regimes if (g, s) not in done]
    print(f"conformal_sets_v1: {len(done)} sweeps in the table, {len(todo)} to run", flush=True)
    for regime, seed in todo:
        t0, c0 = time.perf_counter(), time.process_time()
        row = sweep_row(v3.run_sweep(regime, seed, quick, threads))
        row |= prov | {"utc": utc_now(), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        rows.append(row)
        write_table(out / "sweeps.csv.gz", rows)
        print(f"{regime} seed {seed}: {row['wall_s']:.0f} s ({len(rows)} of {len(regimes) * len(seeds)})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the sweeps (resumable), or --analyse the table, or a --quick smoke test in a scratch folder."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--analyse", action="store_true", help="write conformal_sets_v1.md from the table alone")
    p.add_argument("--out-dir", type=Path, default=OUT, help="the study's table folder")
    p.add_argument("--report", type=Path, default=REPORT)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny mnist1d sweep on seed 2499 in a scratch folder")
    p.add_argument("--allow-mixed-commits", action="store_true", help="resume a table made at another commit")
    a = p.parse_args(argv)
    if a.analyse:
        rows = read_table(a.out_dir / "sweeps.csv.gz")
        result = an.analyse(rows)
        write_text(a.report, an.markdown(rows, result, command_line(__file__, argv)))
        print(a.report.read_text())
        return 0 if "tests" in result else 3
    if a.quick:  # never into the study's table; its numbers are not looked at (the protocol): columns only
        out = Path(tempfile.mkdtemp(prefix="conformal_sets_v1_quick_")) if a.out_dir == OUT else a.out_dir
        code = run(out, ("mnist1d",), (SMOKE_SEED,), True, a.threads, a.allow_mixed_commits)
        print(f"{out / 'sweeps.csv.gz'}: columns {', '.join(read_table(out / 'sweeps.csv.gz')[0])}")
        return code
    return run(a.out_dir, REGIMES, SEEDS, False, a.threads, a.allow_mixed_commits)


if __name__ == "__main__":
    raise SystemExit(main())

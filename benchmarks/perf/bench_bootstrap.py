"""Cost of the paired bootstrap: B resamples of N x K for every metric of compute_all.

    python -m benchmarks.perf.bench_bootstrap                   # B=1000, N=10^4, K=10, 8 trials, 5 repeats
    python -m benchmarks.perf.bench_bootstrap --coverage        # plus interval coverage by simulation
    python -m benchmarks.perf.bench_bootstrap --baseline none   # without the earlier implementation
    python -m benchmarks.perf.bench_bootstrap --vs-numpy        # the sweep's bootstrap against plain numpy

Prints a table and writes benchmarks/results/bench_bootstrap.json: seconds per trial per metric
group and for all metrics in one call (what sweeps/decide/uncertainty.py makes), medians of the
repeats, side by side for the compiled kernels, the torch path (CALIB_METRICS_NO_JIT) and the
compiled path of an earlier commit (``--baseline``, default 33ad87f, the code before the
prefix-sum/scatter kernels: its ``calib_core/metrics`` is extracted by ``git archive`` into a
temporary package and timed in the same process, round-robin with the others). Each cell has
wall seconds and CPU seconds of the process (all threads); on a shared machine the CPU seconds
are the steadier figure, and wall seconds on 2 idle cores are about CPU / 2 for the compiled
kernels (they split resamples over the threads). The load average is recorded with the figures.
The aim (issue "Trustworthy selection") is all metrics of 8 trials in < 2 s on 2 cores:
counts once plus 8 one-call trials.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, ROOT, command_line, host_info, median_time, utc_now, write_json
from calib_core.metrics import METRIC_NAMES, _fast, bootstrap_metrics, compute_all, resample_counts

GROUPS = {
    "accuracy, nll, brier": ("accuracy", "nll", "brier"),
    "ece, mce": ("ece", "mce"),
    "sce, classwise_ece": ("sce", "classwise_ece"),
    "rmsce": ("rmsce",),
    "ace, tace": ("ace", "tace"),
    "aurc": ("aurc",),
    "all metrics, one call": METRIC_NAMES,
}
ALL = "all metrics, one call"


def load_baseline(rev: str, into: Path) -> ModuleType:
    """calib_core/metrics of git revision ``rev`` as a separate package (``baseline_metrics``)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "calib_core/metrics"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "calib_core" / "metrics").rename(into / "baseline_metrics")
    sys.path.insert(0, str(into))  # a temporary package of the old code, not this repository's
    return importlib.import_module("baseline_metrics")


def _timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def measure(paths: dict, probs, labels, counts, repeats: int) -> list[dict]:
    """Per group: median wall and CPU seconds of each path. Each repeat times every group and
    path in turn (round-robin), so a burst of load on a shared machine hits all rows alike."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {(g, p): [] for g in GROUPS for p in paths}
    for names in GROUPS.values():
        for run in paths.values():
            run(names)  # warm-up (kernel compile or load, allocator)
    for _ in range(repeats):
        for name, names in GROUPS.items():
            for path, run in paths.items():
                samples[name, path].append(_timed(lambda run=run, names=names: run(names)))
    rows = []
    for name in GROUPS:
        row: dict = {"group": name}
        for path in paths:
            row[path] = statistics.median(w for w, _ in samples[name, path])
            row[path + "_cpu"] = statistics.median(c for _, c in samples[name, path])
            row[path + "_wall_all"] = [w for w, _ in samples[name, path]]
        rows.append(row)
    return rows


def coverage(reps: int = 200, n: int = 1000, resamples: int = 500) -> list[dict[str, float]]:
    """How often 95 % intervals of ECE cover the true ECE of simulated models (known gap between
    confidence and accuracy; the true ECE equals the gap): plain percentile vs centred vs the
    calibration interval the service reports (centred, reaching 0 where a consistency-resampling
    test does not reject "calibrated"; 200 null draws)."""
    from calib_core.metrics import calibrated_null, calibration_interval, centered_interval, ece, percentile_interval

    counts = resample_counts(n, resamples, seed=7)
    rows = []
    for gap in (0.0, 0.01, 0.02, 0.05, 0.08):
        rng = np.random.default_rng(11)
        hits = {"percentile": 0, "centered": 0, "calibration": 0}
        for i in range(reps):
            conf = rng.uniform(0.35, 1.0, n)
            pred = rng.integers(0, 10, n)
            p = np.tile(((1 - conf) / 9)[:, None], (1, 10))
            p[np.arange(n), pred] = conf
            y = np.where(rng.random(n) < conf - gap, pred, (pred + rng.integers(1, 10, n)) % 10)
            r = bootstrap_metrics(p, y, counts, names=("ece",))["ece"]
            lo, hi = percentile_interval(r)
            hits["percentile"] += lo <= gap <= hi
            point = float(ece(p, y))
            lo, hi = centered_interval(r, point)
            hits["centered"] += lo <= gap <= hi
            null = calibrated_null(p, y, num_draws=200, seed=i, names=("ece",))["ece"]
            lo, hi = calibration_interval(r, point, null)
            hits["calibration"] += lo <= gap <= hi
        rows.append({"true_ece": gap, **{k: v / reps for k, v in hits.items()}})
    return rows


def numpy_reference(probs: np.ndarray, labels: np.ndarray, counts: np.ndarray, num_bins: int) -> dict[str, np.ndarray]:
    """Accuracy and ECE of every resample, in plain vectorised numpy: each resample's weights (its counts row) summed
    per bin with one np.bincount over (resample, bin) pairs. The even bins are calib_core's (B upper edges; a
    confidence equal to an edge belongs to the bin above it, 1.0 to a bin of its own)."""
    from calib_core.metrics.binning import even_upper_edges

    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    b, n = counts.shape
    nb = num_bins + 1
    bins = np.searchsorted(even_upper_edges(num_bins), conf.astype(np.float64), side="right")
    flat = (np.arange(b)[:, None] * nb + bins[None, :]).ravel()
    w = counts.astype(np.float64)
    total = w.sum(axis=1)
    gap = np.bincount(flat, weights=(w * (conf - correct)[None, :]).ravel(), minlength=b * nb).reshape(b, nb)
    return {"accuracy": w @ correct / total, "ece": np.abs(gap).sum(axis=1) / total}


def vs_numpy(candidates: int = 16, n: int = 900, k: int = 10, resamples: int = 2000, repeats: int = 5) -> dict:
    """What selection needs (validation accuracy and ECE of every candidate on shared resamples) from the sweep's
    path (sweeps.decide.uncertainty.compute_replicates, names accuracy and ECE, no calibrated null) against
    numpy_reference on the same counts, side by side in this process (alternating, medians of CPU seconds); the
    largest difference of their replicates."""
    from sweeps.decide.uncertainty import compute_replicates

    rng = np.random.default_rng(3)
    labels = rng.integers(0, k, n)
    preds = {}
    for c in range(candidates):
        logits = rng.normal(size=(n, k)) * (1.0 + 0.1 * c)
        logits[np.arange(n), labels] += 1.5
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        preds[f"c{c}"] = {"val": [(None, (p / p.sum(axis=1, keepdims=True)).astype(np.float32), labels)]}
    counts = resample_counts(n, resamples, seed=0).numpy()  # compute_replicates' val counts at seed 0
    settings = {"num_bins": 15, "num_resamples": resamples, "seed": 0, "names": ("accuracy", "ece"), "null_draws": 0}

    def ours() -> Any:
        return compute_replicates(preds, **settings)

    def reference() -> dict:
        return {t: numpy_reference(s["val"][0][1], labels, counts, 15) for t, s in preds.items()}

    got, ref = ours(), reference()  # warm-up, and the same figures or the comparison is void
    worst = max(
        float(np.max(np.abs(got.values[t][f"val_{m}"] - ref[t][m]))) for t in preds for m in ("accuracy", "ece")
    )
    cpu: dict[str, list[float]] = {"sweep": [], "numpy": []}
    for _ in range(repeats):
        for name, fn in (("sweep", ours), ("numpy", reference)):
            cpu[name].append(_timed(fn)[1])
    med = {name: statistics.median(v) for name, v in cpu.items()}
    return {
        "candidates": candidates,
        "n": n,
        "k": k,
        "resamples": resamples,
        "repeats": repeats,
        "cpu_s": med,
        "cpu_s_all": cpu,
        "ratio": med["sweep"] / med["numpy"],
        "largest_difference": worst,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--baseline", default="33ad87f", help="git revision whose compiled path is timed too ('none': skip)")
    p.add_argument("--out", default=str(RESULTS_DIR / "bench_bootstrap.json"))
    p.add_argument("--coverage", action="store_true", help="also simulate interval coverage (about a minute)")
    p.add_argument(
        "--vs-numpy",
        action="store_true",
        help="only the sweep's bootstrap of accuracy and ECE (16 candidates, 900 rows, 2,000 resamples) against plain "
        "numpy on the same resamples, written into the results file as numpy_reference",
    )
    p.add_argument(
        "--coverage-only",
        action="store_true",
        help="only the coverage simulation, written into the existing results file",
    )
    return p.parse_args(argv)


def _print_coverage(cover: list[dict[str, float]]) -> None:
    """The coverage table on stdout."""
    print("Coverage of 95 % ECE intervals, 200 simulated sets of n=1000 (K=10), B=500:")
    print(f"{'true ECE':>9}{'percentile':>12}{'centred':>10}{'calibration':>13}")
    for row in cover:
        print(f"{row['true_ece']:>9.2f}{row['percentile']:>12.3f}{row['centered']:>10.3f}{row['calibration']:>13.3f}")


def _store_coverage(out: Path, cover: list[dict[str, float]] | None, load_start: tuple[float, ...]) -> None:
    """Put the coverage into the results file, keeping the timings already measured there."""
    data = json.loads(out.read_text()) if out.exists() else {}
    data["coverage"] = cover
    data["coverage_load_average"] = [load_start, os.getloadavg()]
    write_json(out, data)


def _ours(
    flag: bool, probs: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor
) -> Callable[[Sequence[str]], dict]:
    """This repository's bootstrap with the compiled kernels on (True) or off (False, the torch path)."""

    def run(names: Sequence[str]) -> dict:
        prev = _fast.set_enabled(flag)
        try:
            return bootstrap_metrics(probs, labels, counts, names=names)
        finally:
            _fast.set_enabled(prev)

    return run


def _time_paths(
    args: argparse.Namespace, probs: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor
) -> tuple[dict[str, Callable], list[dict]]:
    """The timed paths (compiled, torch and, unless --baseline none, the earlier commit's) and their timings."""
    paths = {"compiled": _ours(True, probs, labels, counts), "torch": _ours(False, probs, labels, counts)}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline != "none":
            base = load_baseline(args.baseline, Path(tmp))
            paths["baseline"] = lambda names: base.bootstrap_metrics(probs, labels, counts, names=names)
            # the same replicates, or the comparison is void
            got, ref = paths["compiled"](METRIC_NAMES), paths["baseline"](METRIC_NAMES)
            worst = max(float((got[m] - ref[m]).abs().nan_to_num(0.0).max()) for m in METRIC_NAMES)
            print(f"largest difference from the baseline's replicates: {worst:.1e}")
        rows = measure(paths, probs, labels, counts, args.repeats)
    return paths, rows


def _timings(args: argparse.Namespace) -> dict[str, Any]:
    """Time the resample counts, every path's groups, the point estimates and the totals for --trials trials."""
    rng = np.random.default_rng(0)
    probs = torch.softmax(torch.tensor(rng.normal(size=(args.n, args.k)) * 2), 1).float()
    labels = torch.tensor(rng.integers(0, args.k, args.n))
    counts_s = median_time(lambda: resample_counts(args.n, args.resamples, seed=0), args.repeats)
    counts = resample_counts(args.n, args.resamples, seed=0)
    paths, rows = _time_paths(args, probs, labels, counts)
    point_s = median_time(lambda: compute_all(probs, labels), args.repeats)
    one_call = next(r for r in rows if r["group"] == ALL)
    return {
        "paths": list(paths),
        "rows": rows,
        "counts_s": counts_s,
        "point_s": point_s,
        "total_s": {path: counts_s + args.trials * one_call[path] for path in paths},
        "total_cpu_s": {path: counts_s + args.trials * one_call[path + "_cpu"] for path in paths},
    }


def _print_timings(
    args: argparse.Namespace, t: dict[str, Any], load_start: tuple[float, ...], load_end: tuple[float, ...]
) -> None:
    """The timings table and the totals on stdout."""
    paths, total, total_cpu = t["paths"], t["total_s"], t["total_cpu_s"]
    print(
        f"Paired bootstrap, B={args.resamples}, N={args.n}, K={args.k}, float32 probabilities, "
        f"{torch.get_num_threads()} threads; medians of {args.repeats}; wall s / CPU s per trial; "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end"
    )
    head = "".join(f"{path + ' wall/cpu':>22}" for path in paths)
    print(f"{'metric group':<24}{head}")
    for r in t["rows"]:
        print(f"{r['group']:<24}" + "".join(f"{r[p]:>12.3f}{r[p + '_cpu']:>10.3f}" for p in paths))
    print(
        f"resample counts (once per split): {t['counts_s']:.3f} s; compute_all point estimates: {t['point_s']:.3f} s/trial"
    )
    print(
        f"{args.trials} trials, all metrics (counts + {args.trials} one-call trials): "
        + ", ".join(f"{p} {total[p]:.2f} s wall ({total_cpu[p]:.2f} s CPU)" for p in paths)
        + " (aim < 2 s)"
    )


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    args = _parse_args(argv)
    load_start = os.getloadavg()
    if args.vs_numpy:
        ref = vs_numpy(repeats=args.repeats)
        ref["load_average"] = [load_start, os.getloadavg()]
        ref["threads"] = torch.get_num_threads()
        ref["date"] = utc_now()
        print(
            f"Selection's bootstrap (val accuracy and ECE, {ref['candidates']} candidates, {ref['n']} rows, "
            f"{ref['resamples']} shared resamples): sweep {ref['cpu_s']['sweep']:.3f} s CPU, plain numpy "
            f"{ref['cpu_s']['numpy']:.3f} s CPU (ratio {ref['ratio']:.2f}, aim <= 5); largest difference "
            f"{ref['largest_difference']:.1e}; {ref['threads']} threads, load average {load_start[0]:.1f}"
        )
        out = Path(args.out)
        data = json.loads(out.read_text()) if out.exists() else {}
        data["numpy_reference"] = ref
        write_json(out, data)
        return 0
    cover = coverage() if args.coverage or args.coverage_only else None
    if cover:
        _print_coverage(cover)
    if args.coverage_only:
        _store_coverage(Path(args.out), cover, load_start)
        return 0
    t = _timings(args)
    load_end = os.getloadavg()
    _print_timings(args, t, load_start, load_end)
    write_json(
        Path(args.out),
        {
            "command": command_line(__file__, argv),
            "args": vars(args),
            **{k: t[k] for k in ("rows", "counts_s", "point_s", "total_s", "total_cpu_s")},
            "threads": torch.get_num_threads(),
            "coverage": cover,
            "host": host_info(),
            "load_avg_start": load_start,
            "load_avg_end": load_end,
            "date": utc_now(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

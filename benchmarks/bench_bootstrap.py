"""Cost of the paired bootstrap: B resamples of N x K for every metric of compute_all.

    python benchmarks/bench_bootstrap.py            # B=1000, N=10^4, K=10, 8 trials, 3 repeats
    python benchmarks/bench_bootstrap.py --coverage # plus interval coverage by simulation

Prints a table (seconds per trial per metric group, medians of the repeats, compiled kernels
and the torch path side by side, with compute_all's own time for scale) and writes
benchmarks/results/bench_bootstrap.json. The aim (issue "Trustworthy selection") is all
metrics of 8 trials in < 2 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calib_core.metrics import _fast, bootstrap_metrics, compute_all, resample_counts  # noqa: E402

GROUPS = {"accuracy, nll, brier": ("accuracy", "nll", "brier"), "ece, mce": ("ece", "mce"),
          "sce, classwise_ece": ("sce", "classwise_ece"), "rmsce": ("rmsce",), "ace, tace": ("ace", "tace"),
          "aurc": ("aurc",)}


def _time(fn, repeats: int) -> float:
    fn()  # warm-up (kernel load, allocator)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def coverage(reps: int = 200, n: int = 1000, resamples: int = 500) -> list[dict[str, float]]:
    """How often 95 % intervals of ECE cover the true ECE of simulated models (known gap between
    confidence and accuracy; the true ECE equals the gap): plain percentile vs centred."""
    from calib_core.metrics import centered_interval, ece, percentile_interval

    counts = resample_counts(n, resamples, seed=7)
    rows = []
    for gap in (0.0, 0.02, 0.05, 0.08):
        rng = np.random.default_rng(11)
        hits = {"percentile": 0, "centered": 0}
        for _ in range(reps):
            conf = rng.uniform(0.35, 1.0, n)
            pred = rng.integers(0, 10, n)
            p = np.tile(((1 - conf) / 9)[:, None], (1, 10))
            p[np.arange(n), pred] = conf
            y = np.where(rng.random(n) < conf - gap, pred, (pred + rng.integers(1, 10, n)) % 10)
            r = bootstrap_metrics(p, y, counts, names=("ece",))["ece"]
            lo, hi = percentile_interval(r)
            hits["percentile"] += lo <= gap <= hi
            lo, hi = centered_interval(r, float(ece(p, y)))
            hits["centered"] += lo <= gap <= hi
        rows.append({"true_ece": gap, **{k: v / reps for k, v in hits.items()}})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_bootstrap.json"))
    p.add_argument("--coverage", action="store_true", help="also simulate interval coverage (about a minute)")
    args = p.parse_args(argv)
    cover = coverage() if args.coverage else None
    if cover:
        print("Coverage of 95 % ECE intervals, 200 simulated sets of n=1000 (K=10), B=500:")
        print(f"{'true ECE':>9}{'percentile':>12}{'centred':>10}")
        for row in cover:
            print(f"{row['true_ece']:>9.2f}{row['percentile']:>12.3f}{row['centered']:>10.3f}")
    rng = np.random.default_rng(0)
    probs = torch.softmax(torch.tensor(rng.normal(size=(args.n, args.k)) * 2), 1).float()
    labels = torch.tensor(rng.integers(0, args.k, args.n))
    counts_s = _time(lambda: resample_counts(args.n, args.resamples, seed=0), args.repeats)
    counts = resample_counts(args.n, args.resamples, seed=0)
    rows = []
    for name, names in GROUPS.items():
        row = {"group": name}
        for path, flag in (("compiled", True), ("torch", False)):
            prev = _fast.set_enabled(flag)
            try:
                row[path] = _time(lambda names=names: bootstrap_metrics(probs, labels, counts, names=names), args.repeats)
            finally:
                _fast.set_enabled(prev)
        rows.append(row)
    point_s = _time(lambda: compute_all(probs, labels), args.repeats)
    per_trial = {path: sum(r[path] for r in rows) for path in ("compiled", "torch")}
    total = {path: counts_s + args.trials * per_trial[path] for path in per_trial}
    print(f"Paired bootstrap, B={args.resamples}, N={args.n}, K={args.k}, float32 probabilities, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats}")
    print(f"{'metric group':<24}{'compiled s/trial':>18}{'torch s/trial':>16}")
    for r in rows:
        print(f"{r['group']:<24}{r['compiled']:>18.3f}{r['torch']:>16.3f}")
    print(f"{'all metrics':<24}{per_trial['compiled']:>18.3f}{per_trial['torch']:>16.3f}")
    print(f"resample counts (once per split): {counts_s:.3f} s; compute_all point estimates: {point_s:.3f} s/trial")
    print(f"{args.trials} trials, all metrics: compiled {total['compiled']:.2f} s, torch {total['torch']:.2f} s "
          f"(aim < 2 s)")
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "counts_s": counts_s, "point_s": point_s,
                                          "total_s": total, "threads": torch.get_num_threads(), "coverage": cover,
                                          "date": time.strftime("%Y-%m-%d")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

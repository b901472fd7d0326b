"""Streaming accumulator vs one-shot metrics on the same data, side by side.

    python -m benchmarks.perf.bench_streaming   # N=10^6, K=100, chunks of 10^4 rows, 3 repeats

Both compute the accumulator's metrics (accuracy, NLL, Brier, ECE, MCE, SCE, classwise-ECE)
from float32 probabilities and from logits; the one-shot side calls the metric functions on
the whole matrix, the streaming side feeds ``CalibrationAccumulator.update`` 10^4-row chunks.
Medians of the repeats; also checks the numbers agree (float64 input, 1e-9). Prints a table
and writes benchmarks/results/bench_streaming.json. Aim (issue "Performance"): streaming
throughput >= 0.5x one-shot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS_DIR, median_time
from calib_core import metrics as M

STREAM_KEYS = ("accuracy", "nll", "brier", "ece", "mce", "sce", "classwise_ece")


def one_shot(x: torch.Tensor, y: torch.Tensor, from_logits: bool) -> dict[str, float]:
    """The accumulator's metrics, each by its one-shot function."""
    return {k: float(getattr(M, k)(x, y, from_logits=from_logits)) for k in STREAM_KEYS}


def streamed(x: torch.Tensor, y: torch.Tensor, from_logits: bool, chunk: int) -> dict[str, float]:
    """The same metrics through CalibrationAccumulator in chunks."""
    acc = M.CalibrationAccumulator(x.shape[1], num_bins=15, from_logits=from_logits)
    for i in range(0, x.shape[0], chunk):
        acc.update(x[i : i + chunk], y[i : i + chunk])
    return {k: v for k, v in acc.compute().items() if k in STREAM_KEYS}


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10**6)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--chunk", type=int, default=10**4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS_DIR / "bench_streaming.json"))
    args = p.parse_args(argv)
    load_start = os.getloadavg()
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(args.n, args.k)).astype(np.float32) * 2)
    probs = torch.softmax(logits, 1)
    y = torch.tensor(rng.integers(0, args.k, args.n))
    rows = []
    for name, x, fl in (("probabilities", probs, False), ("logits", logits, True)):
        t_one = median_time(lambda x=x, fl=fl: one_shot(x, y, fl), args.repeats)
        t_str = median_time(lambda x=x, fl=fl: streamed(x, y, fl, args.chunk), args.repeats)
        rows.append({"input": name, "one_shot_s": t_one, "streaming_s": t_str, "throughput_ratio": t_one / t_str})
    # parity in float64 on a slice (the accumulator and one-shot share the binning core)
    x64 = probs[:200_000].double()
    x64 = x64 / x64.sum(1, keepdim=True)
    a, b = one_shot(x64, y[:200_000], False), streamed(x64, y[:200_000], False, args.chunk)
    worst = max(abs(a[k] - b[k]) for k in STREAM_KEYS)
    load_end = os.getloadavg()
    print(
        f"Streaming vs one-shot, N={args.n:,}, K={args.k}, chunks of {args.chunk:,} rows, "
        f"{torch.get_num_threads()} threads, medians of {args.repeats}; "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end"
    )
    print(f"{'input':<15}{'one-shot s':>12}{'streaming s':>13}{'throughput ratio':>18}")
    for r in rows:
        print(f"{r['input']:<15}{r['one_shot_s']:>12.2f}{r['streaming_s']:>13.2f}{r['throughput_ratio']:>18.2f}")
    print(f"largest difference between the two in float64 (N=200,000): {worst:.1e} (aim <= 1e-9)")
    Path(args.out).write_text(
        json.dumps(
            {
                "args": vars(args),
                "rows": rows,
                "float64_max_abs_diff": worst,
                "threads": torch.get_num_threads(),
                "load_avg_start": load_start,
                "load_avg_end": load_end,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

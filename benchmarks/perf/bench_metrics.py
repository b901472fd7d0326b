"""Benchmark calib_core.metrics against torchmetrics and netcal (measured side by side).

    python -m benchmarks.perf.bench_metrics           # full run, writes benchmarks/results/bench_metrics.json
    python -m benchmarks.perf.bench_metrics --quick   # sizes / 100, smoke test, writes nothing unless --out

What is measured, on the same float32 inputs in one process (timings interleaved round-robin,
so a noisy shared machine slows every contender alike):

* ECE (even, 15 bins, top label, l1): ``calib_core.metrics.ece`` (torch tensors),
  ``torchmetrics.functional.classification.multiclass_calibration_error(norm="l1", n_bins=15)``
  (torch tensors, default validate_args=True), ``netcal.metrics.ECE(bins=15).measure``
  (numpy arrays). Also our SCE, ACE and TACE (no counterpart in those libraries), and ACE by
  the per-column sort path (``ace_sort_path``: the code float32 CPU input took before the
  compiled histogram selection of the adaptive edges) side by side with the current ACE. Aim
  (issue "Performance"): ACE <= 1 s at N=10^6, K=100 on 2 cores.
  Configurations: (N=10^6, K=100) and (N=10^5, K=1000).
* time: median of ``--repeats`` runs (default 5; SCE/ACE and netcal: ``--slow-repeats``,
  default 3); ratios are competitor median / our ECE median from the same run.
* peak memory: peak RSS increase during one extra call, from the kernel's high-water mark
  (VmHWM reset by writing "5" to /proc/self/clear_refs, then read from /proc/self/status).
  It counts torch, numpy and Python allocations alike (tracemalloc would miss torch's). It is
  measured after all timings, with glibc told to mmap every block >= 64 KiB and free heap
  memory trimmed before each call (so memory freed earlier is not silently reused and each
  call's peak is its own), on regenerated identical inputs.
* netcal guard: netcal first runs on N/10 rows; if 10x that time exceeds ``--netcal-max-s``
  or 10x its memory exceeds ``--netcal-max-mb`` it is reported as "skipped (reason)".
* agreement: max |our ECE - torchmetrics ECE| and |our ECE - netcal ECE| on each input.
* streaming: ``CalibrationAccumulator`` fed N = 10^4, 10^5, 10^6 rows (K=100) in chunks of
  10^4 logits generated on the fly; state bytes and peak RSS increase should not grow with N.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import calib_core.metrics as M
from benchmarks.common import RESULTS_DIR
from calib_core.metrics import _fast

DEFAULT_OUT = RESULTS_DIR / "bench_metrics.json"


def ace_sort_path(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """ACE by the per-column sort path (what float64 input and the torch path take, and what
    float32 CPU input took before the compiled histogram selection of the edges)."""
    kernel = _fast.adaptive_columns
    _fast.adaptive_columns = lambda *a, **k: None  # type: ignore[assignment]  # declines: the sort path serves
    try:
        return float(M.ace(probs, labels, num_bins=15))
    finally:
        _fast.adaptive_columns = kernel


# ------------------------------------------------------------------------------------------
# measurement helpers
# ------------------------------------------------------------------------------------------
def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def fix_malloc_for_rss() -> bool:
    """Make glibc hand every allocation >= 64 KiB straight to mmap and back on free.

    Otherwise freed blocks stay in the heap (RSS) and a later allocation reusing them shows
    no RSS increase, so peak RSS deltas would undercount whoever runs second.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 1 << 16))  # M_MMAP_THRESHOLD (also disables its dynamic growth)
    except (OSError, AttributeError):
        return False


def _malloc_trim() -> None:
    """Give free heap memory back to the kernel, so reusing it shows up in RSS again."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_delta_mb(fn) -> float | None:
    """Peak RSS increase (MB) while ``fn()`` runs; None where the kernel does not allow it."""
    gc.collect()
    _malloc_trim()
    if not _reset_peak():
        return None
    before = _status_kb("VmRSS")
    fn()
    peak = _status_kb("VmHWM")
    if before is None or peak is None:
        return None
    return max(peak - before, 0) / 1024.0


def make_inputs(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 softmax probabilities of N(0, 3^2) logits; label = argmax with prob. 0.6 else random."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.empty(n, k, dtype=torch.float32)
    step = max(1, (1 << 22) // k)
    for r0 in range(0, n, step):
        rows = min(step, n - r0)
        probs[r0 : r0 + rows] = torch.softmax(torch.randn(rows, k, generator=g) * 3.0, dim=1)
    pred = probs.argmax(dim=1)
    rand = torch.randint(0, k, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.6
    return probs, torch.where(keep, pred, rand)


def _contenders(probs: torch.Tensor, labels: torch.Tensor, args) -> dict:
    """name -> (callable, repeats) on the same inputs (numpy views for netcal)."""
    from netcal.metrics import ECE as NetcalECE
    from torchmetrics.functional.classification import multiclass_calibration_error

    k = probs.shape[1]
    probs_np, labels_np = probs.numpy(), labels.numpy()
    return {
        "calib_core ece": (lambda: M.ece(probs, labels, num_bins=15), args.repeats),
        "torchmetrics multiclass_calibration_error": (
            lambda: multiclass_calibration_error(probs, labels, num_classes=k, n_bins=15, norm="l1"),
            args.repeats,
        ),
        "netcal ECE": (lambda: NetcalECE(bins=15).measure(probs_np, labels_np), args.slow_repeats),
        "calib_core sce": (lambda: M.sce(probs, labels, num_bins=15), args.slow_repeats),
        "calib_core ace": (lambda: M.ace(probs, labels, num_bins=15), args.slow_repeats),
        "calib_core ace (sort path)": (lambda: ace_sort_path(probs, labels), args.slow_repeats),
        "calib_core tace": (lambda: M.tace(probs, labels, num_bins=15), args.slow_repeats),
    }


def run_config_timing(n: int, k: int, args) -> dict:
    from netcal.metrics import ECE as NetcalECE

    print(f"\n## N={n:,} K={k}: timing ...", flush=True)
    probs, labels = make_inputs(n, k, seed=n + k)
    contenders = _contenders(probs, labels, args)
    skipped: dict[str, str] = {}

    # netcal guard: a 10% trial run, projected x10
    sub = max(1, n // 10)
    t0 = time.perf_counter()
    try:
        trial_mem = peak_rss_delta_mb(lambda: NetcalECE(bins=15).measure(probs[:sub].numpy(), labels[:sub].numpy()))
        trial_s = time.perf_counter() - t0
        proj_s, proj_mb = 10 * trial_s, (10 * trial_mem if trial_mem is not None else None)
        if proj_s * args.slow_repeats > args.netcal_max_s:
            skipped["netcal ECE"] = f"projected {proj_s:.1f} s per call from a 10% run > limit {args.netcal_max_s} s"
        elif proj_mb is not None and proj_mb > args.netcal_max_mb:
            skipped["netcal ECE"] = f"projected {proj_mb:.0f} MB peak from a 10% run > limit {args.netcal_max_mb} MB"
    except Exception as exc:  # noqa: BLE001
        skipped["netcal ECE"] = f"error on a 10% run: {type(exc).__name__}: {exc}"

    values: dict[str, float] = {}
    times: dict[str, list[float]] = {name: [] for name in contenders if name not in skipped}
    first_call: dict[str, float] = {}
    for name in times:  # warm-up (imports, allocator, compiling or loading our kernels), also the value
        t0 = time.perf_counter()
        values[name] = float(contenders[name][0]())
        first_call[name] = time.perf_counter() - t0
    max_rep = max(reps for name, (_, reps) in contenders.items() if name in times)
    for rep in range(max_rep):  # round-robin
        for name in times:
            fn, reps = contenders[name]
            if rep < reps:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)

    ours = statistics.median(times["calib_core ece"])
    rows = []
    for name in contenders:
        if name in skipped:
            rows.append({"name": name, "skipped": skipped[name]})
            continue
        med = statistics.median(times[name])
        is_ece = name in ("calib_core ece", "torchmetrics multiclass_calibration_error", "netcal ECE")
        rows.append(
            {
                "name": name,
                "median_s": med,
                "repeats": len(times[name]),
                "times_s": times[name],
                "ratio_to_ours_ece": (med / ours) if is_ece else None,
                "first_call_s": first_call[name],
                "peak_rss_delta_mb": None,
                "value": values[name],
            }
        )
    diffs = {
        "torchmetrics": abs(values["calib_core ece"] - values["torchmetrics multiclass_calibration_error"]),
        "netcal": (abs(values["calib_core ece"] - values["netcal ECE"]) if "netcal ECE" in values else None),
    }
    print(
        f"max |ECE ours - torchmetrics| = {diffs['torchmetrics']:.3g}; "
        f"|ECE ours - netcal| = {diffs['netcal'] if diffs['netcal'] is None else format(diffs['netcal'], '.3g')}"
    )
    return {"N": n, "K": k, "input_mb": n * k * 4 / 2**20, "results": rows, "ece_abs_diff": diffs}


def run_config_memory(cfg: dict, args) -> None:
    """Fill in peak RSS deltas (one extra call each) on freshly generated, identical inputs."""
    print(f"## N={cfg['N']:,} K={cfg['K']}: peak memory ...", flush=True)
    probs, labels = make_inputs(cfg["N"], cfg["K"], seed=cfg["N"] + cfg["K"])
    contenders = _contenders(probs, labels, args)
    for row in cfg["results"]:
        if "skipped" not in row:
            contenders[row["name"]][0]()  # warm-up
            row["peak_rss_delta_mb"] = peak_rss_delta_mb(contenders[row["name"]][0])


def run_streaming(sizes: list[int], k: int, chunk: int, *, memory: bool) -> list[dict]:
    """Feed N rows of logits in chunks; time it (memory=False) or take its peak RSS (memory=True)."""
    out = []
    for i, n in enumerate([chunk] + sizes):  # run 0 is a one-chunk warm-up, not reported
        acc = M.CalibrationAccumulator(k, num_bins=15, from_logits=True)
        g = torch.Generator().manual_seed(n)

        def feed(acc=acc, g=g, n=n):
            for r0 in range(0, n, chunk):
                rows = min(chunk, n - r0)
                acc.update(torch.randn(rows, k, generator=g) * 3.0, torch.randint(0, k, (rows,), generator=g))

        t0 = time.perf_counter()
        mem = peak_rss_delta_mb(feed) if memory else feed()
        elapsed = time.perf_counter() - t0
        res = acc.compute()
        if i == 0:
            continue
        out.append(
            {
                "N": n,
                "K": k,
                "chunk_rows": chunk,
                "state_bytes": acc.state_nbytes,
                "peak_rss_delta_mb": mem,
                "seconds": elapsed,
                "ece": res["ece"],
            }
        )
    return out


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------
def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def markdown(report: dict) -> str:
    lines = [
        "| N | K | implementation | median s (repeats) | time / our ECE | first call s | peak RSS +MB | value |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cfg in report["configs"]:
        for r in cfg["results"]:
            head = f"| {cfg['N']:,} | {cfg['K']} | {r['name']} |"
            if "skipped" in r:
                lines.append(f"{head} skipped ({r['skipped']}) | | | | |")
                continue
            ratio = "" if r["ratio_to_ours_ece"] is None else f"{r['ratio_to_ours_ece']:.2f}x"
            lines.append(
                f"{head} {r['median_s']:.3f} ({r['repeats']}) | {ratio} | {_fmt(r.get('first_call_s'), '.3f')} | "
                f"{_fmt(r['peak_rss_delta_mb'], '.0f')} | {r['value']:.6f} |"
            )
    lines += ["", "| N | max abs diff ECE vs torchmetrics | vs netcal |", "|---|---|---|"]
    for cfg in report["configs"]:
        d = cfg["ece_abs_diff"]
        lines.append(
            f"| {cfg['N']:,} x {cfg['K']} | {d['torchmetrics']:.2e} | "
            f"{'n/a' if d['netcal'] is None else format(d['netcal'], '.2e')} |"
        )
    chunk = report["streaming"][0]["chunk_rows"] if report["streaming"] else 0
    lines += [
        "",
        f"| streaming N (K=100, chunks of {chunk:,} rows) | state bytes | peak RSS +MB | seconds |",
        "|---|---|---|---|",
    ]
    for s in report["streaming"]:
        mem = _fmt(s["peak_rss_delta_mb"], ".1f")
        lines.append(f"| {s['N']:,} | {s['state_bytes']} | {mem} | {s['seconds']:.2f} |")
    return "\n".join(lines)


def goals(report: dict) -> dict:
    cfg = next((c for c in report["configs"] if c["K"] == 100), None)
    if cfg is None:
        return {}
    by = {r["name"]: r for r in cfg["results"]}
    tm = by["torchmetrics multiclass_calibration_error"].get("ratio_to_ours_ece")
    nc = by["netcal ECE"].get("ratio_to_ours_ece")
    ace = {
        c["K"]: next(r for r in c["results"] if r["name"] == "calib_core ace").get("median_s")
        for c in report["configs"]
    }
    return {
        "config": f"N={cfg['N']}, K=100",
        "ace_s": {f"N={c['N']}, K={c['K']}": ace[c["K"]] for c in report["configs"]},
        "ace_at_most_1s": all(v is not None and v <= 1.0 for v in ace.values()),
        "torchmetrics_time_over_ours": tm,
        "at_least_as_fast_as_torchmetrics": (tm is not None and tm >= 1.0),
        "netcal_time_over_ours": nc,
        "at_least_10x_faster_than_netcal": (nc is not None and nc >= 10.0),
    }


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes / 100 (smoke test)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow-repeats", type=int, default=3)
    ap.add_argument("--netcal-max-s", type=float, default=120.0, help="max projected netcal seconds (all repeats)")
    ap.add_argument("--netcal-max-mb", type=float, default=6000.0, help="max projected netcal peak MB")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT} for full runs)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    scale = 100 if args.quick else 1
    configs = [(10**6 // scale, 100), (10**5 // scale, 1000)]
    stream_sizes = [10**4, 10**5, 10**6] if not args.quick else [10**3, 10**4]
    out = args.out if args.out is not None else (None if args.quick else DEFAULT_OUT)

    import netcal
    import torchmetrics

    report = {
        "meta": {
            "command": "python -m benchmarks.perf.bench_metrics"
            + (" --quick" if args.quick else "")
            + (f" --threads {args.threads}" if args.threads is not None else ""),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchmetrics": torchmetrics.__version__,
            "netcal": getattr(netcal, "__version__", "?"),
            "numpy": np.__version__,
            "numba": _numba_version(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_avg_at_start": os.getloadavg(),
            "dtype": "float32",
            "memory_method": (
                "peak RSS delta of one call: VmHWM after minus VmRSS before, VmHWM reset via "
                "/proc/self/clear_refs after malloc_trim(0); measured after all timings, with glibc "
                "M_MMAP_THRESHOLD=64 KiB"
            ),
            "repeats": args.repeats,
            "slow_repeats": args.slow_repeats,
        },
    }
    chunk = 10**4 if not args.quick else 10**3
    # phase 1, timings, with the allocator as users have it
    report["configs"] = [run_config_timing(n, k, args) for n, k in configs]
    report["streaming"] = run_streaming(stream_sizes, 100, chunk, memory=False)
    # phase 2, peak memory, with every allocation >= 64 KiB mmapped (see fix_malloc_for_rss)
    report["meta"]["malloc_mmap_threshold_64k"] = fix_malloc_for_rss()
    for cfg in report["configs"]:
        run_config_memory(cfg, args)
    for row, mem_row in zip(report["streaming"], run_streaming(stream_sizes, 100, chunk, memory=True), strict=True):
        row["peak_rss_delta_mb"] = mem_row["peak_rss_delta_mb"]
    report["meta"]["load_avg_at_end"] = os.getloadavg()
    report["goals"] = goals(report)
    print()
    print(markdown(report))
    print()
    print("goals:", json.dumps(report["goals"]))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far one seed's result moves: repeated runs, thread counts, and the study's stored files (issue #21 item 8).

    python -m benchmarks.studies.reproducibility           # 3 seeds x 3 methods of the v2 `overconf` regime
    python -m benchmarks.studies.reproducibility --quick   # 1 seed, 2 epochs

For each (method, seed) of benchmarks/studies/protocols/method_study_v2.yaml's `overconf` regime (protocol B, so
the one-go calibrator lr is the tuned one when benchmarks/results/method_study_v2/ has it), the run is
trained, in fresh processes:
- twice with 1 torch thread and deterministic algorithms (what the study does): bit-identical?
- once with 2 threads: how far do test ECE and accuracy move?
- and compared with the study's stored file of the same run (another process, another day, and on
  another machine if the study's files were made elsewhere): identical?
Writes benchmarks/results/reproducibility.md and .json.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, command_line, host_line, utc_now, write_json, write_text
from benchmarks.studies.protocol_a import chosen_params, eval_path, execute, load_spec, run_config
from benchmarks.studies.study_compact import raw_or_compact

# the protocol-B runs this script re-runs (their compact form, rebuilt, once the raw folder has left the tree)
RAW = raw_or_compact(RESULTS_DIR / "method_study_v2")
METHODS = ("ce", "ts_val", "onego_ts")


def cpu_model() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


KEYS = ("accuracy", "ece", "nll")


def _job(spec: dict, method: str, seed: int, threads: int, out: Path, quick: bool) -> dict[str, Any]:
    params = chosen_params(spec, "overconf", method, RAW) or {}
    if "tune" in spec["methods"][method] and not params:
        params = {"calibrator_lr": 0.01}  # not tuned yet: a fixed value, the comparison is run against itself
    cfg = run_config(spec, "overconf", method, seed, params)
    cfg["num_threads"] = threads
    if quick:
        cfg["train"]["epochs"] = 2
    return {
        "regime": "overconf",
        "stage": "repro",
        "method": method,
        "seed": seed,
        "params": params,
        "config": cfg,
        "path": str(out / f"{method}_seed{seed}_t{threads}_{len(list(out.glob('*')))}.json"),
    }


def _diff(a: dict, b: dict) -> dict[str, float]:
    return {k: abs(a["test"][k] - b["test"][k]) for k in KEYS}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    return p.parse_args(argv)


def _run_repeats(spec: dict, seeds: list[int], quick: bool) -> tuple[list[dict], list[dict]]:
    """Every (method, seed) trained twice with 1 thread and once with 2, in fresh processes: the jobs and records."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        jobs: list[dict[str, Any]] = []
        for method in METHODS:
            for seed in seeds:
                for threads in (1, 1, 2):
                    j = _job(spec, method, seed, threads, out, quick)
                    j["path"] = str(out / f"{method}_seed{seed}_t{threads}_{len(jobs)}.json")
                    jobs.append(j)
        with mp.get_context("spawn").Pool(2, maxtasksperchild=1) as pool:
            recs = pool.map(execute, jobs)
    return jobs, recs


def _compare_runs(jobs: list[dict], recs: list[dict], quick: bool) -> list[dict[str, Any]]:
    """Per (method, seed): the differences between the repeats, the thread counts and the study's stored run."""
    rows = []
    by: dict[tuple[str, int], list[tuple[int, dict]]] = {}
    for j, r in zip(jobs, recs):
        by.setdefault((j["method"], j["seed"]), []).append((j["config"]["num_threads"], r))
    for (method, seed), runs in by.items():
        one = [r for t, r in runs if t == 1]
        two = [r for t, r in runs if t == 2][0]
        stored = (
            None
            if quick
            else json.loads(path.read_text())
            if (path := eval_path(RAW, "overconf", method, seed)).is_file()
            else None
        )
        rows.append(
            {
                "method": method,
                "seed": seed,
                "repeat_1_thread": _diff(one[0], one[1]),
                "threads_1_vs_2": _diff(one[0], two),
                "vs_stored": _diff(one[0], stored) if stored else None,
                "stored_utc": stored.get("finished_utc") if stored else None,
            }
        )
    return rows


def _pt(v: float | None) -> str:
    """A difference in points (x 100), "0 (identical)" for none at all, "n/a" when not measured."""
    return "n/a" if v is None else ("0 (identical)" if v == 0 else f"{100 * v:.3f}")


def _mx(rs: list[dict[str, Any]], key: str, k: str) -> float | None:
    """The largest difference of metric `k` in column `key` over the rows (None if no row has it)."""
    return max((r[key][k] for r in rs if r[key] is not None), default=None)


def _table_md(rows: list[dict[str, Any]], argv: list[str] | None) -> list[str]:
    """The report's title, the table of differences, the largest ones and what they say."""
    L = [
        "# Reproducibility of one seed's result (benchmarks/studies/reproducibility.py)",
        "",
        f"Command: `{command_line(__file__, argv)}`; {utc_now()} UTC on {host_line()}.",
        "",
        "The v2 study's `overconf` regime (MNIST-1D 3k, cnn1d, 25 epochs): each (method, seed) trained in fresh "
        "processes twice with 1 torch thread and `torch.use_deterministic_algorithms(True)`, once with 2 threads, "
        "and compared with the study's stored run of the same configuration. Absolute differences of the test "
        "metrics, in points (accuracy and ECE) or nats x 100 (NLL):",
        "",
        "| method | seed | repeat, 1 thread: acc / ECE / NLL | 1 vs 2 threads: acc / ECE / NLL | vs the stored study run: acc / ECE / NLL |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            " / ".join(_pt(r[c][k]) for k in KEYS) if r[c] is not None else "n/a"
            for c in ("repeat_1_thread", "threads_1_vs_2", "vs_stored")
        ]
        L.append(f"| {r['method']} | {r['seed']} | {' | '.join(cells)} |")
    L += [
        "",
        "Largest differences: repeat "
        + ", ".join(f"{k} {_pt(_mx(rows, 'repeat_1_thread', k))}" for k in KEYS)
        + "; threads "
        + ", ".join(f"{k} {_pt(_mx(rows, 'threads_1_vs_2', k))}" for k in KEYS)
        + "; stored "
        + ", ".join(f"{k} {_pt(_mx(rows, 'vs_stored', k))}" for k in KEYS)
        + ".",
        "",
        "What this says: with one thread and deterministic algorithms a run is a pure function of its config on "
        "one machine and one torch build (the repeat column). Changing the thread count changes the order of "
        "floating-point reductions, so results are not bit-identical across thread counts, and the same holds "
        "across CPUs with other SIMD widths or BLAS kernels (a machine of another kind): the v2 study fixes 1 thread "
        "and records the machine, and its claims rest on 24 seeds, not on any single seed's digits.",
    ]
    return L


def _stored_md(rows: list[dict[str, Any]]) -> list[str]:
    """How many of the study's stored runs were reproduced here, and what the differences mean (none: no lines)."""
    stored_rows = [r for r in rows if r["vs_stored"] is not None]
    if not stored_rows:
        return []
    same = sum(all(v == 0 for v in r["vs_stored"].values()) for r in stored_rows)
    when = sorted({r["stored_utc"] for r in stored_rows if r["stored_utc"]})
    return [
        "",
        f"Measured across machines: {same} of {len(stored_rows)} stored study runs were reproduced bit for bit here "
        f"(CPU: {cpu_model()}). The stored runs were made in an earlier session ({when[0] if when else '?'} to "
        f"{when[-1] if when else '?'} UTC) on another virtual machine; their run files do not record its CPU "
        "model, so which difference (CPU kind, kernel choice) moved them is not known. In this over-confident "
        "regime (lr 0.01, no weight decay, 25 epochs) a last-bit difference grows into up to "
        f"{_pt(_mx(rows, 'vs_stored', 'accuracy'))} pt of accuracy and {_pt(_mx(rows, 'vs_stored', 'ece'))} pt of ECE "
        "on a single seed, as large as the thread-count effect: one seed's numbers are reproducible only on "
        "the same machine, the seed-averaged verdicts are what carries over.",
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the repeats side by side in fresh processes and write the table."""
    args = _parse_args(argv)
    spec = load_spec()
    seeds = [int(s) for s in args.seeds.split(",")] if not args.quick else [1]
    jobs, recs = _run_repeats(spec, seeds, args.quick)
    rows = _compare_runs(jobs, recs, args.quick)
    text = "\n".join(_table_md(rows, argv) + _stored_md(rows)) + "\n"
    suffix = "_quick" if args.quick else ""
    write_text(Path(args.out_dir) / f"reproducibility{suffix}.md", text)
    write_json(
        Path(args.out_dir) / f"reproducibility{suffix}.json", {"rows": rows, "host": host_line(), "cpu": cpu_model()}
    )
    print(text)
    return 0 if all(math.isfinite(v) for r in rows for v in r["repeat_1_thread"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

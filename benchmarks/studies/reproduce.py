"""Method comparison: one-go calibration vs plain CE, post-hoc TS, label smoothing and focal loss.

    python -m benchmarks.studies.reproduce           # full matrix, both datasets, 5 seeds
    python -m benchmarks.studies.reproduce --dataset mnist1d --seeds 5 --epochs 40
    python -m benchmarks.studies.reproduce --quick   # ~1-minute smoke run, writes to a temp dir

Every run is the real `calib_core.trainer.Trainer` (one process per run, `torch.set_num_threads(1)`,
a pool of `--workers` processes). The matrix per dataset and seed:

* baselines: plain CE; post-hoc temperature scaling (LBFGS on the cached logits of a
  `holdout:0.1` part of the training split, the backbone trains on the other 90%); label
  smoothing (0.1); focal loss (FLSD-53 schedule);
* one-go: calibrator in {temperature, vector, matrix, dirichlet, mlp, last_layer} x
  calibrator_data in {holdout:0.1, lookahead, same} x calibrator_lr in `--cal-lrs`.

Selection hygiene (docs/design.md section 5): for every one-go variant (calibrator, calibrator_data)
one calibrator lr is chosen by the MEAN VALIDATION ECE over seeds (final-epoch model); test
metrics are only reported. Tables: mean +- std over seeds of test accuracy, ECE, ACE, SCE, NLL,
paired (same seed) differences to plain CE (accuracy) and post-hoc TS (ECE), final temperature.

Overhead (docs/design.md section 9): in one process, one thread, trainers for plain CE and the
one-go variants are built on the same data and seed and their epochs are run round-robin
(CE, variant 1, variant 2, ..., CE, ...), after one untimed warm-up epoch each; ratio = median
one-go epoch time / median CE epoch time. Two timings per epoch: the training loop alone
(`Trainer.train_epoch`, the actual step loop) and the full epoch as `fit` runs it
(training loop + scheduler step + validation evaluation).

Outputs (under `--out-dir`, default benchmarks/results): reproduce_<dataset>.md, overhead.md,
reproduce_raw.json.gz (every run's metrics, the selection, the overhead timings). Raw results are
also written incrementally to reproduce_raw.partial.json while the pool runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    QUICK,
    SETTINGS,
    command_line,
    cpu_run_setup,
    float_list,
    fmt_mean_std,
    host_info,
    mean_std,
    merge,
    out_dir,
    read_json,
    reading,
    run_summary,
    run_trainer,
    spawn_pool,
    utc_minute,
    utc_now,
    write_json,
    write_text,
)
from calib_core.registry import CALIBRATORS as REGISTERED_CALIBRATORS

CALIBRATORS = REGISTERED_CALIBRATORS.names(builtin=True)
CAL_DATA = ["holdout:0.1", "lookahead", "same"]
METRICS = ["accuracy", "ece", "ace", "sce", "nll"]
BASELINE_GROUPS = ("ce", "posthoc_ts", "label_smoothing", "focal")
# --quick keeps the baselines and these two one-go variants
QUICK_ONEGO_GROUPS = ("onego/last_layer/holdout:0.1", "onego/temperature/lookahead")


# ------------------------------------------------------------------------------------------
# the matrix
# ------------------------------------------------------------------------------------------
def variants(cal_lrs: list[float]) -> list[dict[str, Any]]:
    """Every method of the matrix as {key, group, label, train overrides}."""
    out = [
        {"key": "ce", "group": "ce", "label": "plain CE", "train": {"method": "ce"}},
        {
            "key": "posthoc_ts",
            "group": "posthoc_ts",
            "label": "post-hoc TS (holdout:0.1)",
            "train": {"method": "posthoc", "posthoc_calibrator": "temperature", "calibrator_data": "holdout:0.1"},
        },
        {
            "key": "label_smoothing",
            "group": "label_smoothing",
            "label": "label smoothing 0.1",
            "train": {"method": "label_smoothing", "label_smoothing": 0.1},
        },
        {
            "key": "focal",
            "group": "focal",
            "label": "focal (FLSD-53)",
            "train": {"method": "focal", "focal_gamma": None},
        },
    ]
    for cal in CALIBRATORS:
        for src in CAL_DATA:
            for lr in cal_lrs:
                out.append(
                    {
                        "key": f"onego/{cal}/{src}/lr={lr:g}",
                        "group": f"onego/{cal}/{src}",
                        "label": f"one-go {cal}, {src}",
                        "cal_lr": lr,
                        "train": {"method": "onego", "calibrator": cal, "calibrator_data": src, "calibrator_lr": lr},
                    }
                )
    return out


# ------------------------------------------------------------------------------------------
# aggregation and tables
# ------------------------------------------------------------------------------------------
def _temperature(r: dict) -> float | None:
    info = r.get("calibrator_info") or {}
    if "temperature" in info:
        return float(info["temperature"])
    if "mean_temperature" in info:
        return float(info["mean_temperature"])
    return None


def choose_lrs(runs: list[dict], dataset: str, select_seeds: list[int], cal_lrs: list[float]) -> dict[str, str]:
    """{group: chosen key}: each one-go variant's calibrator lr by mean VALIDATION ECE over `select_seeds`."""
    vals: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if r["dataset"] == dataset and r["seed"] in select_seeds:
            ok = r["status"] == "completed"
            vals.setdefault(r["group"], {}).setdefault(r["key"], []).append(r["val"]["ece"] if ok else float("inf"))
    out = {}
    for group, cands in vals.items():
        score = {k: (statistics.fmean(v) if len(v) == len(select_seeds) else float("inf")) for k, v in cands.items()}
        out[group] = min(score, key=lambda k: (score[k], k))
    return out


def select_and_aggregate(
    runs: list[dict], dataset: str, seeds: list[int], cal_lrs: list[float], select_seeds: list[int] | None = None
) -> dict[str, Any]:
    """Pick each one-go variant's calibrator lr by mean validation ECE over the selection seeds; aggregate over all seeds."""
    select_seeds = seeds if select_seeds is None else select_seeds
    runs = [r for r in runs if r["dataset"] == dataset]
    by_key: dict[str, list[dict]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    groups: dict[str, dict[str, Any]] = {}
    for v in variants(cal_lrs):
        g = groups.setdefault(v["group"], {"group": v["group"], "label": v["label"], "candidates": {}})
        rs = sorted(by_key.get(v["key"], []), key=lambda r: r["seed"])
        sel = [r for r in rs if r["seed"] in select_seeds]
        # a diverged / failed / missing selection seed makes a candidate ineligible (mean val ECE +inf)
        sel_ok = [r for r in sel if r["status"] == "completed"]
        val_ece = (
            statistics.fmean([r["val"]["ece"] for r in sel_ok])
            if sel_ok and len(sel_ok) == len(select_seeds)
            else float("inf")
        )
        ok = [r for r in rs if r["status"] == "completed"]
        g["candidates"][v["key"]] = {
            "cal_lr": v.get("cal_lr"),
            "runs": rs,
            "n_ok": len(ok),
            "n": len(rs),
            "mean_val_ece": val_ece,
            "n_sel_ok": len(sel_ok),
        }
    ce_test = {r["seed"]: r["test"] for r in by_key.get("ce", []) if r["status"] == "completed"}
    ts_test = {r["seed"]: r["test"] for r in by_key.get("posthoc_ts", []) if r["status"] == "completed"}
    rows = []
    for name, g in groups.items():
        cands = g["candidates"]
        finite = {k: c for k, c in cands.items() if c["n"] > 0}
        if not finite:
            continue
        # baselines have one candidate; one-go: minimum mean val ECE over the selection seeds
        chosen_key = min(finite, key=lambda k: (finite[k]["mean_val_ece"], -finite[k]["n"], k))
        c = finite[chosen_key]
        ok = [r for r in c["runs"] if r["status"] == "completed"]
        row = {
            "group": name,
            "label": g["label"],
            "key": chosen_key,
            "cal_lr": c["cal_lr"],
            "n_ok": c["n_ok"],
            "n": c["n"],
            "val_ece": mean_std([r["val"]["ece"] for r in ok]),
            "lr_grid_val_ece": {
                f"{cc['cal_lr']:g}": (cc["mean_val_ece"], cc["n_sel_ok"], len(select_seeds))
                for cc in cands.values()
                if cc["cal_lr"] is not None
            },
            "failures": [
                f"seed {r['seed']}: {r['status']} ({r['reason']})" for r in c["runs"] if r["status"] != "completed"
            ],
        }
        for m in METRICS:
            row[m] = mean_std([r["test"][m] for r in ok])
        temps = [_temperature(r) for r in ok]
        row["temperature"] = (
            mean_std([t for t in temps if t is not None]) if any(t is not None for t in temps) else None
        )
        row["d_acc_vs_ce"] = mean_std(
            [r["test"]["accuracy"] - ce_test[r["seed"]]["accuracy"] for r in ok if r["seed"] in ce_test]
        )
        row["d_ece_vs_ts"] = mean_std(
            [r["test"]["ece"] - ts_test[r["seed"]]["ece"] for r in ok if r["seed"] in ts_test]
        )
        row["epoch_time"] = mean_std([r.get("median_epoch_time") for r in ok])
        rows.append(row)
    order = {"ce": 0, "posthoc_ts": 1, "label_smoothing": 2, "focal": 3}
    rows.sort(key=lambda r: (order.get(r["group"], 9), r["val_ece"][0] if math.isfinite(r["val_ece"][0]) else 9.0))
    return {"dataset": dataset, "rows": rows, "select_seeds": list(select_seeds)}


def _verdict(row: dict) -> str:
    """'better' / 'worse' / '~' for ECE vs TS and accuracy vs CE, using the paired std as the noise bar."""
    return f"ECE {reading(row['d_ece_vs_ts'], True)} vs TS, acc {reading(row['d_acc_vs_ce'], False)} vs CE"


def table_md(agg: dict, header: list[str]) -> str:
    """One dataset's method table, the calibrator-lr grid and the failed runs, as Markdown."""
    lines = list(header)
    lines.append("")
    lines.append(
        "| method | cal lr | seeds ok | test acc % | test ECE % | test ACE % | test SCE % | test NLL | Δacc vs CE (pp, paired) | ΔECE vs TS (pp, paired) | final T | val ECE % | reading (~: difference within the seed std) |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in agg["rows"]:
        if r["n_ok"] == 0:
            why = "; ".join(r["failures"])[:200]
            lines.append(
                f"| {r['label']} | {r['cal_lr'] if r['cal_lr'] is not None else '–'} | 0/{r['n']} | all failed: {why} |||||||||||"
            )
            continue
        t = r["temperature"]
        lr_s = f"{r['cal_lr']:g}" if r["cal_lr"] is not None else "–"
        lines.append(
            f"| {r['label']} | {lr_s} | {r['n_ok']}/{r['n']} "
            f"| {fmt_mean_std(*r['accuracy'], 100, 2)} | {fmt_mean_std(*r['ece'], 100, 2)} | {fmt_mean_std(*r['ace'], 100, 3)} | {fmt_mean_std(*r['sce'], 100, 3)} "
            f"| {fmt_mean_std(*r['nll'], 1, 3)} | {fmt_mean_std(*r['d_acc_vs_ce'], 100, 2)} | {fmt_mean_std(*r['d_ece_vs_ts'], 100, 2)} "
            f"| {fmt_mean_std(*t, 1, 2) if t else '–'} | {fmt_mean_std(*r['val_ece'], 100, 2)} | {_verdict(r) if r['group'] not in ('ce',) else '(reference)'} |"
        )
    lines.append("")
    lines.append(
        f"Calibrator-lr grid (mean validation ECE % over the selection seeds {agg.get('select_seeds')}, seeds ok/n; the chosen lr is the minimum):"
    )
    lines.append("")
    for r in agg["rows"]:
        if r["lr_grid_val_ece"]:
            grid = ", ".join(
                f"lr={k}: {v[0] * 100:.2f} ({v[1]}/{v[2]})" if math.isfinite(v[0]) else f"lr={k}: n/a ({v[1]}/{v[2]})"
                for k, v in r["lr_grid_val_ece"].items()
            )
            lines.append(f"- {r['label']}: {grid}")
    fails = [(r["label"], f) for r in agg["rows"] for f in r["failures"]]
    if fails:
        lines.append("")
        lines.append("Failed / diverged runs of the chosen configurations:")
        lines += [f"- {lab}: {f}" for lab, f in fails]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# overhead: interleaved epochs in one process
# ------------------------------------------------------------------------------------------
OVERHEAD_VARIANTS = [
    (cal, src) for cal in ("last_layer", "temperature", "matrix") for src in ("holdout:0.1", "lookahead")
] + [("last_layer", "same"), ("temperature", "same")]


def loadavg() -> str | None:
    """/proc/loadavg (1, 5, 15-minute load, ...) where there is one: the machine's load during a timing."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def _overhead_trainers(settings: dict, seed: int) -> dict[str, Any]:
    """Plain CE and every OVERHEAD_VARIANTS trainer on the same data, ready to run epochs one by one."""
    from calib_core.config import RunConfig
    from calib_core.trainer import Trainer

    def make(train_over: dict) -> Any:
        cfg = RunConfig.model_validate(
            {
                "seed": seed,
                "device": "cpu",
                "num_threads": 1,
                **merge(settings, {"train": {**train_over, "epochs": 10_000}}),
            }
        )
        return Trainer(cfg, data, "cpu")

    _, data = cpu_run_setup(seed, settings)
    trainers = {"ce": make({"method": "ce"})}
    for cal, src in OVERHEAD_VARIANTS:
        trainers[f"{cal}/{src}"] = make(
            {"method": "onego", "calibrator": cal, "calibrator_data": src, "calibrator_lr": 1e-2}
        )
    return trainers


EpochTimes = dict[str, list[float]]  # trainer name -> seconds per timed epoch


def _time_epochs(trainers: dict[str, Any], repeats: int) -> tuple[EpochTimes, EpochTimes, EpochTimes]:
    """Interleaved epochs, round by round: training-loop wall, full-epoch wall and loop CPU seconds per trainer."""
    loop: EpochTimes = {k: [] for k in trainers}
    full: EpochTimes = {k: [] for k in trainers}
    cpu: EpochTimes = {k: [] for k in trainers}  # the loop's CPU time (this thread's): what load steals is not in it
    for rep in range(repeats + 1):  # repetition 0 is the untimed warm-up
        for name, tr in trainers.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            tr.train_epoch(rep)
            t1, c1 = time.perf_counter(), time.thread_time()
            tr.scheduler.step()
            tr.evaluate(tr.val_split, "validation")
            t2 = time.perf_counter()
            if rep > 0:
                loop[name].append(t1 - t0)
                full[name].append(t2 - t0)
                cpu[name].append(c1 - c0)
    return loop, full, cpu


def _ratio_iqr(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """Quartiles of the per-round ratios a / b (None for fewer than 4 rounds)."""
    r = [x / y for x, y in zip(a, b)]  # per-round ratios against the CE epoch of the same round, for a spread
    return (statistics.quantiles(r, n=4)[0], statistics.quantiles(r, n=4)[2]) if len(r) >= 4 else None


def _overhead_rows(
    trainers: dict[str, Any], loop: EpochTimes, full: EpochTimes, cpu: EpochTimes
) -> list[dict[str, Any]]:
    """Per one-go variant: its median epoch times and their ratios to plain CE."""
    med_loop = {k: statistics.median(v) for k, v in loop.items()}
    med_full = {k: statistics.median(v) for k, v in full.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    rows = []
    for k in trainers:
        if k == "ce":
            continue
        rows.append(
            {
                "variant": k,
                "loop_ratio": med_loop[k] / med_loop["ce"],
                "full_ratio": med_full[k] / med_full["ce"],
                "loop_ratio_iqr": _ratio_iqr(loop[k], loop["ce"]),
                "cpu_ratio": med_cpu[k] / med_cpu["ce"],
                "cpu_ratio_iqr": _ratio_iqr(cpu[k], cpu["ce"]),
                "loop_ms": med_loop[k] * 1e3,
                "full_ms": med_full[k] * 1e3,
                "cpu_ms": med_cpu[k] * 1e3,
                "backbone_samples": len(trainers[k].backbone_idx),
                "holdout_samples": len(trainers[k].holdout_idx),
                "shared_forward": bool(getattr(trainers[k], "shared_forward", False)),
            }
        )
    return rows


def measure_overhead(dataset: str, settings: dict, repeats: int, seed: int = 0) -> dict[str, Any]:
    """Interleaved epoch timings of plain CE and the OVERHEAD_VARIANTS in this process (one thread)."""
    trainers = _overhead_trainers(settings, seed)
    load_before = loadavg()
    loop, full, cpu = _time_epochs(trainers, repeats)
    rows = _overhead_rows(trainers, loop, full, cpu)
    return {
        "dataset": dataset,
        "repeats": repeats,
        "ce_loop_ms": statistics.median(loop["ce"]) * 1e3,
        "ce_full_ms": statistics.median(full["ce"]) * 1e3,
        "ce_cpu_ms": statistics.median(cpu["ce"]) * 1e3,
        "ce_backbone_samples": len(trainers["ce"].backbone_idx),
        "rows": rows,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "raw_loop_s": loop,
        "raw_full_s": full,
        "raw_cpu_s": cpu,
    }


def overhead_md(results: list[dict], header: list[str]) -> str:
    """The overhead report: one table of ratios to plain CE per dataset."""
    lines = list(header) + [""]

    def span(x: Any) -> str:
        return f"{x[0]:.2f}–{x[1]:.2f}" if x else "–"

    for res in results:
        cpu_ms = f", loop CPU time {res['ce_cpu_ms']:.0f} ms" if "ce_cpu_ms" in res else ""
        lines.append(
            f"### {res['dataset']} ({res['repeats']} interleaved epochs per trainer after 1 warm-up; "
            f"plain CE: training loop {res['ce_loop_ms']:.0f} ms{cpu_ms}, full epoch {res['ce_full_ms']:.0f} ms, "
            f"{res['ce_backbone_samples']} backbone samples/epoch)"
        )
        lines.append("")
        if res.get("loadavg_before"):
            lines += [f"Load (/proc/loadavg) before: {res['loadavg_before']}; after: {res.get('loadavg_after')}.", ""]
        lines.append(
            "| one-go variant | loop time / CE (median) | per-round ratio IQR | loop CPU time / CE (median) | per-round IQR "
            "| full epoch / CE (median) | loop ms | backbone / holdout samples | one forward (same) |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in res["rows"]:
            cpu = f"{r['cpu_ratio']:.2f}x" if "cpu_ratio" in r else "–"
            shared = "yes" if r.get("shared_forward") else "no"
            lines.append(
                f"| {r['variant']} | {r['loop_ratio']:.2f}x | {span(r['loop_ratio_iqr'])} | {cpu} | {span(r.get('cpu_ratio_iqr'))} "
                f"| {r['full_ratio']:.2f}x | {r['loop_ms']:.0f} | {r['backbone_samples']} / {r['holdout_samples']} | {shared} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# main: arguments -> plan -> matrix (selection on validation between its phases) -> tables,
# overhead -> raw JSON
# ------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """What one invocation runs: datasets and their settings, seeds, the lr grid and the variants."""

    command: str
    out_dir: Path
    datasets: list[str]
    settings: dict[str, dict[str, Any]]
    seeds: list[int]
    select_seeds: list[int]
    cal_lrs: list[float]
    variants: list[dict[str, Any]]

    def jobs(self, seeds: list[int], chosen: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
        """The runs of `seeds`; with `chosen` ({dataset: {group: key}}) only each one-go variant's chosen lr."""
        out = []
        for seed in seeds:  # seed-major: a cut-short run still has whole seeds
            for ds in self.datasets:
                for v in self.variants:
                    if chosen is not None and v.get("cal_lr") is not None and chosen[ds].get(v["group"]) != v["key"]:
                        continue
                    out.append(
                        {
                            "dataset": ds,
                            "key": v["key"],
                            "group": v["group"],
                            "seed": seed,
                            "cal_lr": v.get("cal_lr"),
                            "config": merge(self.settings[ds], {"train": v["train"]}),
                        }
                    )
        return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=["mnist1d", "digits", "all"], default="all")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    p.add_argument("--epochs", type=int, default=None, help="override every dataset's epochs")
    p.add_argument("--cal-lrs", type=str, default="1e-3,1e-2", help="comma-separated calibrator lr grid")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--select-seeds",
        type=int,
        default=None,
        help="run the whole lr grid on seeds 0..K-1 only, choose each one-go variant's lr by their mean val ECE, "
        "then run only the chosen lr on the remaining seeds (default: the grid on every seed)",
    )
    p.add_argument(
        "--methods",
        type=str,
        default=None,
        help="only variants whose key contains one of these comma-separated substrings",
    )
    p.add_argument("--overhead-repeats", type=int, default=9)
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--no-matrix", action="store_true", help="only the overhead measurement")
    p.add_argument(
        "--quick",
        action="store_true",
        help="~1-minute smoke run (tiny data, 3 epochs, 2 seeds with the lr grid on seed 0 only, 2 calibrators), writes to a temp dir",
    )
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="reuse the runs of this raw JSON (same dataset, method key and seed are not run again); "
        "with --no-overhead its overhead results are carried over",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="rebuild the tables from a raw (or .partial) JSON instead of running the matrix",
    )
    p.add_argument("--note", type=str, default="", help="extra line for the table headers (e.g. reduced seeds)")
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace, command: str) -> Plan:
    """The plan of `args`: --quick shrinks data, epochs, seeds and variants; --methods filters the variants."""
    datasets = ["mnist1d", "digits"] if args.dataset == "all" else [args.dataset]
    cal_lrs = float_list(args.cal_lrs)
    seeds = list(range(2 if args.quick else args.seeds))
    settings = {}
    for ds in datasets:
        s = SETTINGS[ds]
        if args.quick:
            s = merge(s, QUICK[ds])
        if args.epochs is not None:
            s = merge(s, {"train": {"epochs": args.epochs}})
        settings[ds] = s
    vs = variants(cal_lrs)
    if args.quick:
        vs = [v for v in vs if v["group"] in BASELINE_GROUPS or v["group"] in QUICK_ONEGO_GROUPS]
    if args.methods:
        subs = [s for s in args.methods.split(",") if s]
        vs = [v for v in vs if any(s in v["key"] for s in subs)]
    select = 1 if args.quick and args.select_seeds is None else args.select_seeds
    n_sel = len(seeds) if select is None else max(1, min(select, len(seeds)))
    return Plan(
        command=command,
        out_dir=out_dir(args.out_dir, args.quick, "reproduce_quick_"),
        datasets=datasets,
        settings=settings,
        seeds=seeds,
        select_seeds=seeds[:n_sel],
        cal_lrs=cal_lrs,
        variants=vs,
    )


def load_resume(path: Path, plan: Plan) -> tuple[list[dict], dict[str, Any]]:
    """The runs of the raw JSON at `path` that belong to the plan, and that raw JSON; refuses other settings."""
    old = read_json(path)
    resumed = [r for r in old["runs"] if r["dataset"] in plan.datasets and r["seed"] in plan.seeds]
    if old.get("settings") and any(old["settings"].get(ds) != plan.settings[ds] for ds in plan.datasets):
        raise SystemExit(f"--resume {path}: its settings differ from this run's; refusing to mix them")
    return resumed, old


def new_raw(plan: Plan, resumed: list[dict]) -> dict[str, Any]:
    """The raw JSON record of this invocation, before any run."""
    return {
        "command": plan.command,
        "started_utc": utc_now(),
        **host_info(),
        "settings": plan.settings,
        "seeds": plan.seeds,
        "select_seeds": plan.select_seeds,
        "cal_lrs": plan.cal_lrs,
        "selection": f"calibrator lr per (calibrator, calibrator_data) by mean validation ECE over seeds {plan.select_seeds}; "
        f"only the chosen lr is run on the other seeds",
        "runs": list(resumed),
    }


def rebuild_runs(raw: dict[str, Any], path: Path, plan: Plan) -> str:
    """Take the plan's runs from the raw (or .partial) JSON at `path` instead of running; return the header line saying so."""
    old = read_json(path)
    raw["runs"] = [r for r in old["runs"] if r["dataset"] in plan.datasets and r["seed"] in plan.seeds]
    raw["rebuilt_from"] = {"file": str(path), "command": old.get("command")}
    return f"Runs rebuilt from {path.name}, produced by: `{old.get('command')}`"


def select_on_validation(runs: list[dict], plan: Plan) -> dict[str, dict[str, str]]:
    """{dataset: {group: chosen key}}: each one-go variant's calibrator lr by mean validation ECE over the selection seeds."""
    return {ds: choose_lrs(runs, ds, plan.select_seeds, plan.cal_lrs) for ds in plan.datasets}


def run_matrix(plan: Plan, raw: dict[str, Any], workers: int, t_start: float) -> None:
    """Run the matrix in a pool, appending to raw["runs"]: phase 1 the lr grid on the selection seeds,
    phase 2 only the chosen lrs on the other seeds; runs already in raw["runs"] are not run again."""
    done = {(r["dataset"], r["key"], r["seed"]) for r in raw["runs"]}

    def todo(js: list[dict]) -> list[dict]:
        return [j for j in js if (j["dataset"], j["key"], j["seed"]) not in done]

    partial = plan.out_dir / "reproduce_raw.partial.json"
    rest = plan.seeds[len(plan.select_seeds) :]
    with spawn_pool(workers) as pool:
        phase_jobs = todo(plan.jobs(plan.select_seeds))
        for phase in (1, 2):
            print(f"phase {phase}: {len(phase_jobs)} runs on {workers} workers -> {plan.out_dir}", flush=True)
            for i, r in enumerate(pool.imap_unordered(run_trainer, phase_jobs), 1):
                raw["runs"].append(r)
                print(
                    f"[{phase}: {i}/{len(phase_jobs)} {time.perf_counter() - t_start:6.0f}s] {r['dataset']} {r['key']} seed={r['seed']} "
                    f"{run_summary(r)} ({r['wall_s']:.1f}s)",
                    flush=True,
                )
                if i % 10 == 0 or i == len(phase_jobs):
                    write_json(partial, raw)
            if phase == 2 or not rest:
                break
            chosen = select_on_validation(raw["runs"], plan)
            raw["chosen_after_selection"] = chosen
            print(f"chosen calibrator lrs: {json.dumps(chosen)}", flush=True)
            phase_jobs = todo(plan.jobs(rest, chosen))


def common_header(plan: Plan, args: argparse.Namespace, torch_version: str, extra: list[str]) -> list[str]:
    """The header lines every report of this invocation starts with (command, date, machine, notes)."""
    header = [
        f"Command: `{plan.command}`",
        "",
        f"Generated {utc_minute()}; torch {torch_version}, CPU, 1 thread per run, {args.workers} worker processes.",
    ]
    for line in extra:
        header += ["", line]
    if args.note:
        header += ["", f"**Note:** {args.note}"]
    if args.quick:
        header += ["", "**QUICK SMOKE RUN: tiny data, 3 epochs, 2 seeds; numbers are meaningless.**"]
    return header


def write_method_tables(plan: Plan, raw: dict[str, Any], header_common: list[str]) -> None:
    """Per dataset: select on validation, aggregate over seeds, write and print reproduce_<dataset>.md."""
    raw["aggregates"] = {}
    seeds, select_seeds, cal_lrs = plan.seeds, plan.select_seeds, plan.cal_lrs
    for ds in plan.datasets:
        agg = select_and_aggregate(raw["runs"], ds, seeds, cal_lrs, select_seeds)
        raw["aggregates"][ds] = agg
        s = plan.settings[ds]
        header = (
            [f"# Method comparison on {ds}", ""]
            + header_common
            + [
                "",
                f"Setting: data {json.dumps(s['data'])}, model {json.dumps(s['model'])}, train {json.dumps(s['train'])}.",
                f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}): each seed fixes the data split, the holdout and the initialisation. "
                f"Metrics of the final-epoch model on the test split (15 even bins for ECE/SCE, adaptive for ACE), mean ± std over seeds. "
                f"Calibrator lr per one-go variant chosen from {{{', '.join(f'{x:g}' for x in cal_lrs)}}} by the mean VALIDATION ECE over seeds "
                f"{select_seeds[0]}..{select_seeds[-1]} (never by test metrics)"
                + (
                    "; the grid ran on those seeds only, the other seeds ran the chosen lr alone"
                    if len(select_seeds) < len(seeds)
                    else ""
                )
                + "; the other columns are test metrics of that choice. Δ columns are paired by seed (same split): "
                "Δacc = method − plain CE, ΔECE = method − post-hoc TS; the reading calls a difference only when |mean| > its std over seeds. "
                "'final T' is the learned temperature (temperature calibrators) or the mean 1/scale (vector). Rows: baselines, then one-go by validation ECE.",
            ]
        )
        text = table_md(agg, header)
        write_text(plan.out_dir / f"reproduce_{ds}.md", text)
        print(text, flush=True)


def run_overhead(plan: Plan, repeats: int, header_common: list[str]) -> list[dict[str, Any]]:
    """Measure the per-epoch overhead on every dataset, write and print overhead.md; return the measurements."""
    ov = []
    for ds in plan.datasets:
        t0 = time.perf_counter()
        ov.append(measure_overhead(ds, plan.settings[ds], repeats))
        print(f"overhead {ds}: {time.perf_counter() - t0:.0f}s", flush=True)
    header = (
        ["# One-go overhead per epoch (CPU, 1 thread)", ""]
        + header_common
        + [
            "",
            "Trainers for plain CE and each one-go variant (calibrator lr 1e-2, seed 0, settings as in reproduce_<dataset>.md) are built "
            f"in one process; their epochs run round-robin (CE, variant 1, ..., variant {len(OVERHEAD_VARIANTS)}, CE, ...) so machine noise hits all alike. "
            "Ratios are medians of one-go epoch time over medians of CE epoch time. 'loop' = `Trainer.train_epoch` (the step loop), wall "
            "clock; 'loop CPU time' = the same loop's CPU time (`time.thread_time`), which time lost to other processes on a loaded "
            "machine does not inflate; 'full epoch' adds the scheduler step and the validation evaluation that `fit` does every epoch. "
            "'one forward (same)': the trainer takes the calibrator's inputs from the backbone's training forward (mode-free model, "
            "see calib_core/trainer/modes.py). "
            "With holdout:0.1 the backbone steps on 90% of the training split per epoch (fewer backbone steps than CE), "
            "and the calibrator steps once per backbone step on a holdout batch.",
        ]
    )
    text = overhead_md(ov, header)
    write_text(plan.out_dir / "overhead.md", text)
    print(text, flush=True)
    return ov


def main(argv: list[str] | None = None) -> int:
    """Run the matrix and/or the overhead measurement (or rebuild from a raw JSON) and write the reports."""
    args = parse_args(argv)
    plan = make_plan(args, command_line(__file__, argv))
    resumed: list[dict] = []
    old: dict[str, Any] = {}
    if args.resume is not None:
        resumed, old = load_resume(args.resume, plan)
    raw = new_raw(plan, resumed)
    if args.resume is not None:
        raw["resumed_from"] = {"file": str(args.resume), "command": old.get("command"), "runs_reused": len(resumed)}
    import torch

    raw["torch"] = torch.__version__
    extra_header: list[str] = []
    t_start = time.perf_counter()
    if args.from_json is not None:
        extra_header.append(rebuild_runs(raw, args.from_json, plan))
    elif not args.no_matrix:
        run_matrix(plan, raw, args.workers, t_start)
    raw["matrix_wall_s"] = time.perf_counter() - t_start
    if args.resume is not None:
        extra_header.append(f"Reused {len(resumed)} runs from {args.resume.name}, produced by: `{old.get('command')}`")
    header_common = common_header(plan, args, torch.__version__, extra_header)

    if not args.no_matrix:
        write_method_tables(plan, raw, header_common)
    if args.no_overhead and args.resume is not None and old.get("overhead"):
        raw["overhead"] = old["overhead"]
        raw["overhead_from"] = str(args.resume)
    if not args.no_overhead:
        raw["overhead"] = run_overhead(plan, 2 if args.quick else args.overhead_repeats, header_common)

    raw["finished_utc"] = utc_now()
    write_json(plan.out_dir / ("reproduce_raw.json.gz" if not args.no_matrix else "overhead_raw.json.gz"), raw)
    partial = plan.out_dir / "reproduce_raw.partial.json"
    if partial.exists() and not args.no_matrix:
        partial.unlink()
    print(f"wrote {plan.out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

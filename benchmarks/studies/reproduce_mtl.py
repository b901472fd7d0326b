"""Multi-task one-go calibration vs plain CE and per-task post-hoc TS on mnist1d_mtl.

    python -m benchmarks.studies.reproduce_mtl           # 5 seeds, 25 epochs, calibrator-lr grid 1e-4,1e-3,1e-2
    python -m benchmarks.studies.reproduce_mtl --seeds 3 --epochs 15
    python -m benchmarks.studies.reproduce_mtl --quick   # ~1-minute smoke run, writes to a temp dir

Data, model and training settings are those of benchmarks/studies/reproduce.py on MNIST-1D (3000
samples, val 0.2 / test 0.4, cnn1d, Adam lr 1e-2 constant, batch 64, 25 epochs), with the
labels of `mnist1d_mtl`: digit (10 classes), parity, ge5, prime (2 each), one head per task on
a shared backbone (`calib_core.trainer.make_trainer` -> MultiTaskTrainer). Every run is one
process with `torch.set_num_threads(1)` in a pool of `--workers` (default 2) processes, the
same setup for every method. Methods:

* plain CE;
* post-hoc TS per task (method posthoc, calibrator_data holdout:0.1: the backbone trains on
  90% of the training split; one LBFGS temperature fit per task on the cached logits of the
  holdout, i.e. T = 4 calibration stages for the final model);
* one-go temperature, holdout:0.1 and one-go last_layer, same: the two best one-go variants of
  the single-task MNIST-1D reproduction (benchmarks/results/reproduce_mnist1d.md, which chose
  calibrator lr 1e-2 and 1e-3). Their calibrator lr is RE-SELECTED here from `--cal-lrs` by the
  mean VALIDATION ECE (mean over tasks) over all seeds; the single-task choice is printed next
  to it.

Tables (markdown: reproduce_mtl.md, raw: reproduce_mtl_raw.json.gz, both under --out-dir):
1. per task and mean over tasks: test accuracy and ECE (mean ± std over seeds), paired (same
   seed) deltas vs plain CE and vs post-hoc TS; a reading only when |mean delta| > its std.
2. cost: training + calibration wall time per run (`make_trainer(...).fit()`, median over
   seeds), paired ratio to plain CE, the measured time of the T final post-hoc stages (re-run
   once after training, timed alone), calibration stages and extra calibrator parameters
   (sum over tasks).
3. shift: test ECE and accuracy (mean over tasks, mean over the 1-D corruptions gaussian_noise,
   time_shift, amplitude_scale, time_warp) at severity 0 (clean) .. 5 for plain CE, post-hoc TS
   and the best one-go variant (lowest mean validation ECE over seeds; never test), mean ± std
   over seeds, with paired deltas.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import QUICK as ST_QUICK
from benchmarks.common import SETTINGS as ST_SETTINGS  # the single-task reproduction's settings
from benchmarks.common import (
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
    spawn_pool,
    utc_minute,
    utc_now,
    write_json,
    write_text,
)

TASKS = ["digit", "parity", "ge5", "prime"]
CORRUPTIONS = ["gaussian_noise", "time_shift", "amplitude_scale", "time_warp"]
SEVERITIES = [1, 2, 3, 4, 5]
ONEGO = [("temperature", "holdout:0.1"), ("last_layer", "same")]
SINGLE_TASK_LR = {"onego/temperature/holdout:0.1": 1e-2, "onego/last_layer/same": 1e-3}  # reproduce_mnist1d.md

SETTINGS: dict[str, Any] = merge(ST_SETTINGS["mnist1d"], {"data": {"name": "mnist1d_mtl"}})
QUICK = ST_QUICK["mnist1d"]


def variants(cal_lrs: list[float]) -> list[dict[str, Any]]:
    """Every method of the matrix as {key, group, label, train overrides}."""
    out = [
        {"key": "ce", "group": "ce", "label": "plain CE", "train": {"method": "ce"}},
        {
            "key": "posthoc_ts",
            "group": "posthoc_ts",
            "label": "post-hoc TS per task (holdout:0.1)",
            "train": {"method": "posthoc", "posthoc_calibrator": "temperature", "calibrator_data": "holdout:0.1"},
        },
    ]
    for cal, src in ONEGO:
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


def _slim(m: dict[str, float]) -> dict[str, float]:
    keep = ("accuracy", "ece", "nll", "ace", "sce")
    return {k: v for k, v in m.items() if k in keep or any(k == f"{t}_{x}" for t in TASKS for x in keep)}


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker process (one thread): train (+ calibrate), then evaluate under shift."""
    import torch

    from calib_core.evaluation import shift_metrics
    from calib_core.trainer import CountingFit, make_trainer

    cfg, data = cpu_run_setup(job["seed"], job["config"])
    out: dict[str, Any] = {"loadavg_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    try:
        fits = CountingFit()  # every post-hoc LBFGS fit's report, in order
        tr = make_trainer(cfg, data, "cpu", posthoc_fit=fits)
        res = tr.fit()
        out["wall_s"] = (
            time.perf_counter() - t0
        )  # training + calibration (+ the per-epoch val evaluation every method does)
        info = res.calibrator_info
        out.update(
            {
                "status": res.status,
                "reason": res.reason,
                "epochs_run": res.epochs_run,
                "trainer": type(tr).__name__,
                "val": _slim(res.val_metrics),
                "test": _slim(res.test_metrics),
                "calibrator_info": {k: v for k, v in info.items() if k != "per_task"},
                "median_epoch_time": statistics.median(res.epoch_times) if res.epoch_times else None,
                "backbone_samples": len(tr.backbone_idx),
                "holdout_samples": len(tr.holdout_idx),
            }
        )
        if res.status == "completed" and tr.method == "posthoc":
            # the T final post-hoc stages, timed alone (refit from the identity on the same cached
            # holdout logits: deterministic, so the calibrator ends where fit() left it)
            before = {k: v.clone() for k, v in tr.calibrator.state_dict().items()}
            fits.reports.clear()
            s0 = time.perf_counter()
            tr.fit_posthoc()
            out["posthoc_stage_s"] = time.perf_counter() - s0
            out["posthoc_stage_fits"] = len(fits.reports)
            out["posthoc_lbfgs_iterations"] = [int(f.get("iterations", -1)) for f in fits.reports]
            after = tr.calibrator.state_dict()
            out["posthoc_refit_identical"] = all(torch.equal(before[k], after[k]) for k in before)
        if res.status == "completed":
            s0 = time.perf_counter()
            rows = shift_metrics(res.predict_proba, data, cfg.seed, names=CORRUPTIONS, split="test")
            out["shift_eval_s"] = time.perf_counter() - s0
            out["shift"] = rows
    except Exception as exc:  # a crash is a result too
        out = {
            "status": "error",
            "reason": f"{type(exc).__name__}: {exc}",
            "val": {},
            "test": {},
            "calibrator_info": {},
            "wall_s": time.perf_counter() - t0,
        }
    out["loadavg_end"] = os.getloadavg()[0]
    return {**{k: job[k] for k in ("key", "group", "seed")}, "cal_lr": job.get("cal_lr"), **out}


# ------------------------------------------------------------------------------------------
# selection and aggregation
# ------------------------------------------------------------------------------------------
def choose(runs: list[dict], seeds: list[int], cal_lrs: list[float]) -> dict[str, Any]:
    """Per one-go group: the lr with the lowest mean VALIDATION ECE (mean over tasks) over all seeds
    (a failed seed makes a candidate ineligible); then the best one-go group by the same number."""
    grid: dict[str, dict[str, float]] = {}
    chosen: dict[str, str] = {}
    for v in variants(cal_lrs):
        if v.get("cal_lr") is None:
            continue
        rs = [r for r in runs if r["key"] == v["key"] and r["seed"] in seeds and r["status"] == "completed"]
        score = statistics.fmean(r["val"]["ece"] for r in rs) if len(rs) == len(seeds) else float("inf")
        grid.setdefault(v["group"], {})[v["key"]] = score
    for g, sc in grid.items():
        chosen[g] = min(sc, key=lambda k: (sc[k], k))
    best = min(chosen, key=lambda g: (grid[g][chosen[g]], g)) if chosen else None
    return {"grid_val_ece": grid, "chosen": chosen, "best_onego_group": best}


def _runs_by_seed(runs: list[dict], key: str) -> dict[int, dict]:
    return {r["seed"]: r for r in runs if r["key"] == key and r["status"] == "completed"}


def _paired(a: dict[int, dict], b: dict[int, dict], f) -> tuple[float, float]:
    return mean_std([f(a[s]) - f(b[s]) for s in sorted(a) if s in b])


def shift_curve(r: dict, metric: str) -> dict[int, float]:
    """severity -> mean over the corruptions of the mean-over-tasks `metric`; 0 = clean test."""
    out = {0: r["test"][metric]}
    for s in SEVERITIES:
        vals = [row[metric] for row in r["shift"] if row["severity"] == s]
        out[s] = statistics.fmean(vals)
    return out


def _load_note(runs: list[dict]) -> str:
    la = [r[k] for r in runs for k in ("loadavg_start", "loadavg_end") if r.get(k) is not None]
    if not la:
        return ""
    return (
        f" The machine has {os.cpu_count()} cores and is shared: the 1-minute load average seen at the start/end of the runs was "
        f"{min(la):.2f}–{max(la):.2f} (median {statistics.median(la):.2f}; 2.0 = this benchmark alone), so absolute times are noisy; "
        "the paired ratio to CE is the more robust number."
    )


RowSpec = list[tuple[str, str]]  # (group, run key) per table row
RunsByKey = dict[str, dict[int, dict]]  # run key -> seed -> completed run


def _intro_lines(raw: dict[str, Any]) -> list[str]:
    """The title, the run's header and the settings paragraph."""
    seeds = raw["seeds"]
    L: list[str] = []
    L += ["# Multi-task calibration on mnist1d_mtl: one-go vs per-task post-hoc TS", ""]
    L += raw["header"]
    L += [
        "",
        f"Setting: data {json.dumps(raw['settings']['data'])}, model {json.dumps(raw['settings']['model'])}, "
        f"train {json.dumps(raw['settings']['train'])} (the MNIST-1D settings of benchmarks/studies/reproduce.py, multi-task labels). "
        f"Tasks: digit (10 classes), parity, ge5, prime (2 classes each); one head per task on a shared cnn1d backbone. "
        f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}): each seed fixes the split, the holdout and the initialisation. "
        f"Final-epoch model; ECE = 15 even bins, top-label; 'mean' = mean over the 4 tasks.",
        "",
    ]
    return L


def _selection_lines(sel: dict[str, Any], labels: dict[str, str], cal_lrs: list[float], n_seeds: int) -> list[str]:
    """The calibrator-lr selection paragraph: validation ECE per lr and the chosen lr per one-go variant."""
    L = [
        "**Calibrator lr (selected on validation only).** For each one-go variant the lr was re-selected from "
        f"{{{', '.join(f'{x:g}' for x in cal_lrs)}}} by the mean VALIDATION ECE (mean over tasks) over all {n_seeds} seeds; "
        "test metrics are only reported. Mean validation ECE % per lr:",
        "",
    ]
    for g, sc in sel["grid_val_ece"].items():
        grid = ", ".join(
            f"lr={k.split('lr=')[1]}: {v * 100:.2f}"
            if math.isfinite(v)
            else f"lr={k.split('lr=')[1]}: n/a (a seed failed)"
            for k, v in sc.items()
        )
        ch = sel["chosen"][g].split("lr=")[1]
        edge = " (at the edge of the grid)" if float(ch) in (min(cal_lrs), max(cal_lrs)) and len(cal_lrs) > 1 else ""
        L.append(
            f"- {labels[g]}: {grid} -> chosen lr {ch}{edge}; the single-task MNIST-1D selection chose {SINGLE_TASK_LR[g]:g}."
        )
    best = sel["best_onego_group"]
    if best:
        bv = sel["grid_val_ece"][best][sel["chosen"][best]]
        L += [
            f"- Best one-go variant (lowest mean validation ECE over seeds, used in Table 3): **{labels[best]}, lr {sel['chosen'][best].split('lr=')[1]}** "
            f"(validation ECE {bv * 100:.2f} %)."
        ]
    return L


def _table1_row(task: str, g: str, k: str, runs: list[dict], by: RunsByKey, labels: dict[str, str]) -> str:
    """One row of Table 1: a method's test accuracy and ECE on one task, with paired deltas vs CE and TS."""
    ce, ts = by["ce"], by["posthoc_ts"]
    acc_k = "accuracy" if task == "mean" else f"{task}_accuracy"
    ece_k = "ece" if task == "mean" else f"{task}_ece"
    rs = by[k]
    n_all = sum(1 for r in runs if r["key"] == k)
    if not rs:
        return f"| {task} | {labels[g]} | – | 0/{n_all} | all failed |||||||"
    lr = next(iter(rs.values())).get("cal_lr")
    acc = mean_std([r["test"][acc_k] for r in rs.values()])
    ec = mean_std([r["test"][ece_k] for r in rs.values()])
    test_acc, test_ece = (lambda r, k=acc_k: r["test"][k]), (lambda r, k=ece_k: r["test"][k])
    da_ce, de_ce = _paired(rs, ce, test_acc), _paired(rs, ce, test_ece)
    da_ts, de_ts = _paired(rs, ts, test_acc), _paired(rs, ts, test_ece)
    rd_ce = "(reference)" if g == "ce" else f"{reading(da_ce, False)} / {reading(de_ce, True)}"
    rd_ts = "(reference)" if g == "posthoc_ts" else f"{reading(da_ts, False)} / {reading(de_ts, True)}"
    name = f"**{task}**" if task == "mean" else task
    return (
        f"| {name} | {labels[g]} | {f'{lr:g}' if lr else '–'} | {len(rs)}/{n_all} | {fmt_mean_std(*acc, 100)} | {fmt_mean_std(*ec, 100)} "
        f"| {fmt_mean_std(*da_ce, 100)} | {fmt_mean_std(*de_ce, 100)} | {fmt_mean_std(*da_ts, 100)} | {fmt_mean_std(*de_ts, 100)} | {rd_ce} | {rd_ts} |"
    )


def _temperatures(rs: dict[int, dict]) -> str:
    """Per task: the fitted or learned temperature, mean ± std over seeds."""
    return ", ".join(
        f"{t} {fmt_mean_std(*mean_std([r['calibrator_info'][f'{t}_temperature'] for r in rs.values()]))}" for t in TASKS
    )


def _table1_lines(runs: list[dict], rows_spec: RowSpec, by: RunsByKey, labels: dict[str, str]) -> list[str]:
    """Table 1 (accuracy and ECE per task) and the temperatures of the temperature calibrators."""
    L = [
        "",
        "## Table 1: accuracy and ECE per task (test split, mean ± std over seeds)",
        "",
        "Δ columns are paired by seed (method − reference, percentage points); reading: 'better'/'worse' only when |mean Δ| > its std over seeds, '~' otherwise "
        "(for accuracy higher is better, for ECE lower).",
        "",
        "| task | method | cal lr | seeds ok | test acc % | test ECE % | Δacc vs CE | ΔECE vs CE | Δacc vs TS | ΔECE vs TS | reading vs CE (acc / ECE) | reading vs TS (acc / ECE) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in TASKS + ["mean"]:
        for g, k in rows_spec:
            L.append(_table1_row(task, g, k, runs, by, labels))
    ts = by["posthoc_ts"]
    temps = [r["calibrator_info"].get(f"{t}_temperature") for r in ts.values() for t in TASKS]
    if ts and all(x is not None for x in temps):
        L += ["", "Post-hoc fitted temperatures (mean ± std over seeds): " + _temperatures(ts) + "."]
    for g, k in rows_spec:
        if (
            g.startswith("onego/temperature")
            and by[k]
            and all(f"{t}_temperature" in r["calibrator_info"] for r in by[k].values() for t in TASKS)
        ):
            L += [f"{labels[g]} learned temperatures: " + _temperatures(by[k]) + "."]
    return L


def _cost_row(g: str, k: str, by: RunsByKey, labels: dict[str, str]) -> tuple[dict[str, Any], str]:
    """One method's cost record (kept in the raw JSON) and its Table 2 row."""
    rs, ce = by[k], by["ce"]
    walls = [r["wall_s"] for r in rs.values()]
    ratio = statistics.median([rs[s]["wall_s"] / ce[s]["wall_s"] for s in rs if s in ce]) if ce else float("nan")
    ep = statistics.median([r["median_epoch_time"] for r in rs.values()])
    r0 = next(iter(rs.values()))
    stages = sorted({int(r["calibrator_info"].get("calibration_stages", 0)) for r in rs.values()})
    params = sorted({int(r["calibrator_info"].get("num_params", 0)) for r in rs.values()})
    st = [r["posthoc_stage_s"] for r in rs.values() if "posthoc_stage_s" in r]
    its = [i for r in rs.values() for i in r.get("posthoc_lbfgs_iterations", [])]
    lr = r0.get("cal_lr")
    extra = " (the heads are the calibrators)" if "last_layer" in g else ""
    record = {
        "group": g,
        "key": k,
        "wall_median": statistics.median(walls),
        "ratio_to_ce": ratio,
        "stages": stages,
        "params": params,
        "final_stage_s": statistics.median(st) if st else None,
    }
    line = (
        f"| {labels[g]} | {f'{lr:g}' if lr else '–'} | {statistics.median(walls):.1f} | {min(walls):.1f}–{max(walls):.1f} | {ratio:.2f}x | {ep:.2f} "
        f"| {r0['backbone_samples']} / {r0['holdout_samples']} | {f'{statistics.median(st):.3f}' if st else '–'} "
        f"| {f'{statistics.median(its):g}' if its else '–'} | {'/'.join(map(str, stages))} | {'/'.join(map(str, params))}{extra} |"
    )
    return record, line


def _table2_lines(
    raw: dict[str, Any], rows_spec: RowSpec, by: RunsByKey, labels: dict[str, str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """Table 2 (cost per run) and its rows as records for the raw JSON."""
    epochs = raw["settings"]["train"]["epochs"]
    L = [
        "",
        "## Table 2: cost per run",
        "",
        f"Wall time = `make_trainer(cfg, data).fit()` in one worker process with 1 thread ({raw['workers']} such processes side by side; the same setup "
        f"for every method and seed), i.e. all {epochs} epochs of training, the per-epoch validation evaluation every method does, and "
        "for post-hoc the calibration; the shift evaluation is not included. Median over seeds; 'ratio to CE' is the median of the paired per-seed ratios. "
        "Note: the post-hoc baseline in MultiTaskTrainer refits its T temperatures after EVERY epoch (so per-epoch validation metrics are calibrated), "
        f"so its wall time contains {epochs} × T LBFGS fits; the column 'final T stages' is the measured time of the T fits a final model needs, "
        "re-run once after training and timed alone (it reproduces the fitted temperatures exactly: see 'refit identical' in the raw JSON)."
        + _load_note(raw["runs"]),
        "",
        "| method | cal lr | wall s (median) | wall s (min–max) | ratio to CE (median, paired) | median epoch s | backbone / holdout samples | final T stages: time s (median) | LBFGS iterations per stage (median) | separate calibration stages | extra calibrator params (sum over tasks) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cost_rows = []
    for g, k in rows_spec:
        if not by[k]:
            continue
        record, line = _cost_row(g, k, by, labels)
        cost_rows.append(record)
        L.append(line)
    return L, cost_rows


Curves = dict[str, dict[str, dict[int, dict[int, float]]]]  # group -> metric -> seed -> severity -> value


def _shift_table_lines(curves: Curves, best: str, best_label: str) -> list[str]:
    """Table 3's severity table: ECE and accuracy of CE, post-hoc TS and the best one-go variant."""
    L = [
        f"ECE and accuracy (mean over the 4 tasks, then over the corruptions {', '.join(CORRUPTIONS)}; severity 0 = clean test split) "
        f"per seed, then mean ± std over seeds, in %. One-go = {best_label}, the best one-go variant by mean validation ECE. "
        "Δ columns are paired by seed (pp); a reading is given only when |mean Δ| > its std.",
        "",
        "| severity | ECE plain CE | ECE post-hoc TS | ECE one-go | ΔECE one-go − TS | ΔECE one-go − CE | ΔECE TS − CE | acc plain CE | acc post-hoc TS | acc one-go | Δacc one-go − TS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(g: str, m: str, s: int) -> str:
        return fmt_mean_std(*mean_std([c[s] for c in curves[g][m].values()]), 100)

    def dcell(ga: str, gb: str, m: str, s: int, better_low: bool) -> str:
        a, b = curves[ga][m], curves[gb][m]
        d = mean_std([a[x][s] - b[x][s] for x in a if x in b])
        return f"{fmt_mean_std(*d, 100)} ({reading(d, better_low)})"

    for s in [0] + SEVERITIES:
        L.append(
            f"| {s} | {cell('ce', 'ece', s)} | {cell('posthoc_ts', 'ece', s)} | {cell(best, 'ece', s)} | {dcell(best, 'posthoc_ts', 'ece', s, True)} "
            f"| {dcell(best, 'ce', 'ece', s, True)} | {dcell('posthoc_ts', 'ce', 'ece', s, True)} | {cell('ce', 'accuracy', s)} "
            f"| {cell('posthoc_ts', 'accuracy', s)} | {cell(best, 'accuracy', s)} | {dcell(best, 'posthoc_ts', 'accuracy', s, False)} |"
        )
    return L


def _per_corruption_lines(rows_spec: RowSpec, by: RunsByKey, labels: dict[str, str]) -> list[str]:
    """Table 3's per-corruption breakdown: ECE averaged over severities 1..5, every method of Table 1."""
    L = [
        "",
        "Per corruption (ECE %, mean over severities 1..5 and tasks; mean ± std over seeds), all four methods:",
        "",
        "| corruption | "
        + " | ".join(labels[g] + (f" (lr {k.split('lr=')[1]})" if "lr=" in k else "") for g, k in rows_spec)
        + " |",
        "|---|" + "---|" * len(rows_spec),
    ]
    for c in CORRUPTIONS:
        cells = []
        for _, k in rows_spec:
            vals = [
                statistics.fmean(row["ece"] for row in r["shift"] if row["corruption"] == c)
                for r in by[k].values()
                if r.get("shift")
            ]
            cells.append(fmt_mean_std(*mean_std(vals), 100))
        L.append(f"| {c} | " + " | ".join(cells) + " |")
    return L


def _table3_lines(
    sel: dict[str, Any], rows_spec: RowSpec, by: RunsByKey, labels: dict[str, str]
) -> tuple[list[str], Curves]:
    """Table 3 (calibration under shift) and the shift curves it is computed from."""
    best = sel["best_onego_group"]
    L = ["", "## Table 3: calibration under shift (test split)", ""]
    shift_spec = [("ce", "ce"), ("posthoc_ts", "posthoc_ts")] + ([(best, sel["chosen"][best])] if best else [])
    curves: Curves = {}
    for g, k in shift_spec:
        curves[g] = {m: {s: shift_curve(r, m) for s, r in by[k].items() if r.get("shift")} for m in ("ece", "accuracy")}
    if best:
        bl = f"{labels[best]} (lr {sel['chosen'][best].split('lr=')[1]})"
        L += _shift_table_lines(curves, best, bl)
        L += _per_corruption_lines(rows_spec, by, labels)
    return L, curves


def _failed_lines(runs: list[dict]) -> list[str]:
    """The failed or diverged runs, if any."""
    fails = [
        f"- {r['key']} seed {r['seed']}: {r['status']} ({r.get('reason')})" for r in runs if r["status"] != "completed"
    ]
    return ["", "Failed / diverged runs:"] + fails if fails else []


def build_tables(raw: dict[str, Any]) -> str:
    """The three Markdown tables of the raw record (also stores the selection, cost and shift curves in it)."""
    runs, seeds, cal_lrs = raw["runs"], raw["seeds"], raw["cal_lrs"]
    sel = choose(runs, seeds, cal_lrs)
    raw["selection"] = sel
    labels = {v["group"]: v["label"] for v in variants(cal_lrs)}
    rows_spec = [("ce", "ce"), ("posthoc_ts", "posthoc_ts")] + [(g, k) for g, k in sel["chosen"].items()]
    by = {k: _runs_by_seed(runs, k) for _, k in rows_spec}
    L = _intro_lines(raw)
    L += _selection_lines(sel, labels, cal_lrs, len(seeds))
    L += _table1_lines(runs, rows_spec, by, labels)
    table2, raw["cost"] = _table2_lines(raw, rows_spec, by, labels)
    L += table2
    table3, curves = _table3_lines(sel, rows_spec, by, labels)
    raw["shift_curves"] = {g: {m: {str(s): c for s, c in v.items()} for m, v in d.items()} for g, d in curves.items()}
    L += table3
    L += _failed_lines(runs)
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    p.add_argument("--epochs", type=int, default=None, help="override the epochs (default 25)")
    p.add_argument(
        "--cal-lrs",
        type=str,
        default="1e-4,1e-3,1e-2",
        help="calibrator lr grid for the one-go variants (selected on validation)",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1000 samples, 3 epochs, 2 seeds, lr grid 1e-3,1e-2; writes to a temp dir",
    )
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("--note", type=str, default="", help="extra line for the header (e.g. reduced seeds/epochs)")
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="reuse the runs (same method key and seed) of this raw JSON, which must have the same settings; run only the rest",
    )
    p.add_argument("--from-json", type=Path, default=None, help="rebuild the tables from a raw JSON instead of running")
    return p.parse_args(argv)


def run_all(args: argparse.Namespace, command: str, out: Path) -> dict[str, Any]:
    """Run every (variant, seed) not reused from --resume in a pool; the raw record with its report header."""
    import torch

    settings = merge(SETTINGS, QUICK) if args.quick else SETTINGS
    if args.epochs is not None:
        settings = merge(settings, {"train": {"epochs": args.epochs}})
    seeds = list(range(2 if args.quick else args.seeds))
    cal_lrs = [1e-3, 1e-2] if args.quick else float_list(args.cal_lrs)
    jobs = [
        {
            "key": v["key"],
            "group": v["group"],
            "seed": s,
            "cal_lr": v.get("cal_lr"),
            "config": merge(settings, {"train": v["train"]}),
        }
        for s in seeds
        for v in variants(cal_lrs)
    ]  # seed-major
    reused: list[dict] = []
    old: dict[str, Any] = {}
    if args.resume is not None:
        old = read_json(args.resume)
        if old["settings"] != settings:
            raise SystemExit(f"--resume {args.resume}: its settings differ from this run's; refusing to mix them")
        wanted = {(j["key"], j["seed"]) for j in jobs}
        reused = [r for r in old["runs"] if (r["key"], r["seed"]) in wanted]
        have = {(r["key"], r["seed"]) for r in reused}
        jobs = [j for j in jobs if (j["key"], j["seed"]) not in have]
    raw = {
        "command": command,
        "started_utc": utc_now(),
        **host_info(),
        "torch": torch.__version__,
        "workers": args.workers,
        "settings": settings,
        "seeds": seeds,
        "cal_lrs": cal_lrs,
        "corruptions": CORRUPTIONS,
        "runs": list(reused),
    }
    if args.resume is not None:
        raw["resumed_from"] = {"file": str(args.resume), "command": old.get("command"), "runs_reused": len(reused)}
    partial = out / "reproduce_mtl_raw.partial.json"
    t_start = time.perf_counter()
    print(f"{len(jobs)} runs on {args.workers} workers -> {out}", flush=True)
    with spawn_pool(args.workers) as pool:
        for i, r in enumerate(pool.imap_unordered(run_one, jobs), 1):
            raw["runs"].append(r)
            print(
                f"[{i}/{len(jobs)} {time.perf_counter() - t_start:5.0f}s] {r['key']} seed={r['seed']} {run_summary(r)} "
                f"(fit {r['wall_s']:.1f}s)",
                flush=True,
            )
            if i % 8 == 0:
                write_json(partial, raw)
    raw["total_wall_s"] = time.perf_counter() - t_start
    raw["finished_utc"] = utc_now()
    header = [
        f"Command: `{command}`",
        "",
        f"Generated {utc_minute()}; torch {torch.__version__}, CPU, 1 thread per run, "
        f"{args.workers} worker processes; {len(jobs)} new runs in {raw['total_wall_s']:.0f} s.",
    ]
    if args.resume is not None:
        header += [
            "",
            f"Reused {len(reused)} runs from {args.resume.name}, produced by `{old.get('command')}` "
            f"(same settings; CPU runs are deterministic, so a reused run equals a rerun except for its wall time).",
        ]
    if args.note:
        header += ["", f"**Note:** {args.note}"]
    if args.quick:
        header += ["", "**QUICK SMOKE RUN: 1000 samples, 3 epochs, 2 seeds; numbers are meaningless.**"]
    raw["header"] = header
    if partial.exists():
        partial.unlink()
    return raw


def main(argv: list[str] | None = None) -> int:
    """Run the matrix (or rebuild from a raw JSON), write and print the tables."""
    args = parse_args(argv)
    command = command_line(__file__, argv)
    out = out_dir(args.out_dir, args.quick, "reproduce_mtl_quick_")
    if args.from_json is not None:
        raw = read_json(args.from_json)
        raw["header"] = raw.get("header", []) + ["", f"Tables rebuilt from {args.from_json.name} by `{command}`."]
    else:
        raw = run_all(args, command, out)
    text = build_tables(raw)
    write_text(out / "reproduce_mtl.md", text)
    write_json(out / "reproduce_mtl_raw.json.gz", raw)
    print(text, flush=True)
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

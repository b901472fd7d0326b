"""Search efficiency: does Optuna's TPE find good calibrator / calibrator-lr pairs faster than random?

    python -m benchmarks.studies.bench_search                 # grid (cached, resumable) + replay + report
    python -m benchmarks.studies.bench_search --grid-only     # only train the missing grid cells
    python -m benchmarks.studies.bench_search --replay-only   # only replay against the cached grid

Phase 1 (cached, resumable, the slow part): a tabulated objective. For each demo sweep
(sweeps/configs/mnist1d_demo.yaml, digits_demo.yaml) every cell of the grid
search.calibrators x N log-spaced calibrator lrs spanning search.calibrator_lr low..high (a
baseline choice such as `none` or `posthoc_temperature` has no lr: one cell) is trained once,
in this process and without Ray, on the code path of a sweep trial: sweeps.integrations.optuna.search_space.
resolve_run_config turns the sampled params into the RunConfig, calib_core's trainer trains it
(sweeps.integrations.ray.trainable.train_trial does the same inside Ray). Every finished cell's validation and
test metrics go to benchmarks/results/bench_search_grid.json at once; a re-run skips them.

Phase 2 (seconds, no training): searches replayed against the table. The sampler sees the
sweep's define-by-run space (sweeps.integrations.optuna.search_space.SearchSpace: calibrator categorical, lr
log-uniform low..high); each suggested lr is mapped to the nearest grid lr in log space and the
trial is told that cell's validation metrics (a failed/diverged cell is told FAIL, as the sweep
does). Compared: TPE as the sweep builds it (Ray Tune's OptunaSearch: TPESampler(seed=...) with
Optuna's defaults), random search, a shuffled grid enumeration, and for the multi-objective case
NSGA-II; each over many search seeds. Writes benchmarks/results/bench_search.md and .json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    ROOT,
    command_line,
    host_info,
    host_line,
    utc_minute,
    utc_now,
    write_json,
    write_text,
)

GRID_FILE = RESULTS_DIR / "bench_search_grid.json"
DATASETS = {"mnist1d": "mnist1d_demo.yaml", "digits": "digits_demo.yaml"}
METRICS = ("accuracy", "ece", "nll", "brier")


# ---------------------------------------------------------------------------------------------
# Grid
# ---------------------------------------------------------------------------------------------


def lr_grid(low: float, high: float, n: int) -> list[float]:
    """n log-spaced learning rates from low to high (both ends included), rounded to 4 digits."""
    return [float(f"{v:.4g}") for v in np.geomspace(low, high, n)]


def cell_key(calibrator: str, lr: float | None) -> str:
    return calibrator if lr is None else f"{calibrator}@{lr:.4g}"


def grid_cells(calibrators: list[str], lrs: list[float]) -> list[tuple[str, float | None]]:
    """Every (calibrator, lr) cell: baseline choices (no lr searched) are one cell each."""
    from sweeps.config import BASELINE_CHOICES

    cells: list[tuple[str, float | None]] = []
    for c in calibrators:
        cells += [(c, None)] if c in BASELINE_CHOICES else [(c, lr) for lr in lrs]
    return cells


def load_sweep(dataset: str, epochs: int | None = None) -> Any:
    from sweeps.config import load_sweep_config

    sets = [f"run.train.epochs={epochs}"] if epochs else []
    return load_sweep_config(ROOT / "sweeps" / "configs" / DATASETS[dataset], sets)


def _read_grid(path: Path) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    return {"datasets": {}}


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def train_cell(cfg: Any, data: Any, calibrator: str, lr: float | None) -> dict[str, Any]:
    """One grid cell trained like a sweep trial (resolve_run_config -> trainer.fit), on one CPU thread."""
    from calib_core.trainer import make_trainer
    from sweeps.trial_params import resolve_run_config

    params: dict[str, Any] = {"calibrator": calibrator}
    if lr is not None:
        params["calibrator_lr"] = lr
    run_cfg = resolve_run_config(cfg.run, params).model_copy(update={"device": "cpu", "num_threads": 1})
    t0 = time.perf_counter()
    result = make_trainer(run_cfg, data, "cpu").fit()
    out: dict[str, Any] = {
        "calibrator": calibrator,
        "lr": lr,
        "status": result.status,
        "reason": result.reason or "",
        "epochs_run": int(result.epochs_run),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if result.status == "completed":
        for split, m in (("val", result.val_metrics), ("test", result.test_metrics)):
            for k in METRICS:
                key = k.removeprefix(f"{split}_")
                if key in m or f"{split}_{key}" in m:
                    out[f"{split}_{k}"] = float(m.get(key, m.get(f"{split}_{key}")))
    return out


def run_grid(n_lrs: int, epochs: dict[str, int | None], path: Path = GRID_FILE) -> dict[str, Any]:
    """Train every missing cell of both datasets' grids, caching each one as it finishes.

    Cells at every other grid lr (with an odd n_lrs: the (n_lrs + 1) / 2-point grid over the same
    range) are trained first for both datasets, then the in-between ones: a run cut short still
    leaves a complete coarser grid.
    """
    import torch

    from calib_core.data import load_dataset

    torch.set_num_threads(1)
    grid = _read_grid(path)
    todo: list[tuple[int, str, str, float | None]] = []
    cfgs = {}
    for dataset in DATASETS:
        cfg = cfgs[dataset] = load_sweep(dataset, epochs.get(dataset))
        s = cfg.search
        lrs = lr_grid(s.calibrator_lr.low, s.calibrator_lr.high, n_lrs)
        entry = grid["datasets"].setdefault(dataset, {"cells": {}})
        settings = {
            "config": f"sweeps/configs/{DATASETS[dataset]}",
            "calibrators": list(s.calibrators),
            "lr_low": s.calibrator_lr.low,
            "lr_high": s.calibrator_lr.high,
            "lrs": lrs,
            "epochs": cfg.run.train.epochs,
            "run": cfg.run.model_dump(mode="json"),
        }
        old = {k: entry.get(k) for k in ("lrs", "epochs", "calibrators")}
        if entry["cells"] and old != {k: settings[k] for k in old}:
            raise SystemExit(f"{path}: cached {dataset} grid has other settings {old}; delete it or match them")
        entry.update(settings)
        for calibrator, lr in grid_cells(s.calibrators, lrs):
            if cell_key(calibrator, lr) not in entry["cells"]:
                todo.append((0 if lr is None else lrs.index(lr) % 2, dataset, calibrator, lr))
    todo.sort(key=lambda t: t[0])  # stable: coarse grid of both datasets first
    data: dict[str, Any] = {}
    for _, dataset, calibrator, lr in todo:
        cfg = cfgs[dataset]
        if dataset not in data:
            data[dataset] = load_dataset(cfg.run.data, cfg.run.seed)
        entry = grid["datasets"][dataset]
        row = train_cell(cfg, data[dataset], calibrator, lr)
        entry["cells"][cell_key(calibrator, lr)] = row
        entry["train_seconds"] = round(sum(c["seconds"] for c in entry["cells"].values()), 1)
        grid["host"] = host_line()
        _write_json(path, grid)
        print(
            f"[{time.strftime('%H:%M:%S')}] {dataset} {cell_key(calibrator, lr)}: {row['status']} "
            f"val_acc={row.get('val_accuracy', float('nan')):.4f} val_ece={row.get('val_ece', float('nan')):.4f} "
            f"({row['seconds']:.1f} s)",
            flush=True,
        )
    return grid


# ---------------------------------------------------------------------------------------------
# Replay: searches against the table, no training
# ---------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A tabulated objective: one row of metrics per (calibrator, grid lr) cell."""

    calibrators: list[str]
    lrs: list[float]
    cells: dict[str, dict[str, Any]]

    def nearest_lr(self, lr: float) -> float:
        """The grid lr nearest to `lr` in log space."""
        return nearest_lr(lr, self.lrs)

    def key(self, params: dict[str, Any]) -> str:
        """The cell a sampled configuration lands in (its lr mapped to the nearest grid lr)."""
        lr = params.get("calibrator_lr")
        return cell_key(params["calibrator"], None if lr is None else self.nearest_lr(lr))

    def ok(self, key: str) -> bool:
        c = self.cells[key]
        return c.get("status") == "completed" and all(
            math.isfinite(c.get(m, math.nan)) for m in ("val_accuracy", "val_ece")
        )

    def subgrid(self, step: int) -> Table:
        """The table on every `step`-th grid lr (the coarser grid inside this one)."""
        lrs = self.lrs[::step]
        keep = {cell_key(c, lr) for c, lr in grid_cells(self.calibrators, lrs)}
        return Table(self.calibrators, lrs, {k: v for k, v in self.cells.items() if k in keep})


def nearest_lr(lr: float, lrs: Sequence[float]) -> float:
    """The element of `lrs` nearest to `lr` in log space (ties: the smaller)."""
    logs = np.log(np.asarray(lrs, dtype=np.float64))
    return float(lrs[int(np.argmin(np.abs(logs - math.log(lr))))])


def table_from_grid(entry: dict[str, Any]) -> Table:
    return Table(list(entry["calibrators"]), list(entry["lrs"]), dict(entry["cells"]))


def single_hits(table: Table, rel: float = 0.10) -> set[str]:
    """Cells whose val ECE is within `rel` (relative) of the table's best val ECE."""
    ok = [k for k in table.cells if table.ok(k)]
    best = min(table.cells[k]["val_ece"] for k in ok)
    return {k for k in ok if table.cells[k]["val_ece"] <= (1 + rel) * best}


def multi_hits(table: Table, acc_tol: float = 0.005, rel: float = 0.10) -> set[str]:
    """Cells with val accuracy within `acc_tol` of the best and val ECE within `rel` of the best
    ECE among such near-best-accuracy cells (the sweep's champion rule, without its test)."""
    ok = [k for k in table.cells if table.ok(k)]
    best_acc = max(table.cells[k]["val_accuracy"] for k in ok)
    near = [k for k in ok if table.cells[k]["val_accuracy"] >= best_acc - acc_tol - 1e-12]
    best = min(table.cells[k]["val_ece"] for k in near)
    return {k for k in near if table.cells[k]["val_ece"] <= (1 + rel) * best}


def sampling_mass(table: Table, key: str, lr_low: float, lr_high: float) -> float:
    """Probability that one random-search trial (uniform calibrator, log-uniform lr in
    [lr_low, lr_high], mapped to the nearest grid lr) lands in cell `key`."""
    lr = table.cells[key].get("lr")
    p_cal = 1.0 / len(table.calibrators)
    if lr is None:
        return p_cal
    logs = np.log(np.asarray(table.lrs, dtype=np.float64))
    i = int(np.argmin(np.abs(logs - math.log(lr))))
    lo = math.log(lr_low) if i == 0 else (logs[i - 1] + logs[i]) / 2
    hi = math.log(lr_high) if i == len(logs) - 1 else (logs[i] + logs[i + 1]) / 2
    return p_cal * (hi - lo) / (math.log(lr_high) - math.log(lr_low))


def replay(
    table: Table, space: Callable[[Any], None], sampler: Any, n_trials: int, objective: str, concurrency: int = 1
) -> list[str]:
    """Cells an Optuna sampler visits in `n_trials` ask/tell steps against the table.

    `space` is the sweep's define-by-run space (sweeps.integrations.optuna.search_space.SearchSpace). `concurrency`
    c keeps c trials in flight, as the sweep's resources.max_concurrent does: before each ask
    beyond the first c, the oldest running trial is told (trials finish in ask order). A failed
    cell is told FAIL, as the sweep tells a diverged trial.
    """
    import optuna

    directions = ["minimize"] if objective == "single" else ["maximize", "minimize"]
    study = optuna.create_study(directions=directions, sampler=sampler)
    visited: list[str] = []
    pending: list[tuple[Any, str]] = []

    def tell(trial: Any, key: str) -> None:
        if not table.ok(key):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        c = table.cells[key]
        study.tell(trial, c["val_ece"] if objective == "single" else [c["val_accuracy"], c["val_ece"]])

    for _ in range(n_trials):
        if len(pending) >= concurrency:
            tell(*pending.pop(0))
        trial = study.ask()
        space(trial)
        key = table.key(trial.params)
        visited.append(key)
        pending.append((trial, key))
    for trial, key in pending:
        tell(trial, key)
    return visited


def grid_order(table: Table, seed: int) -> list[str]:
    """Grid search: every cell once, in an order shuffled by `seed`."""
    keys = sorted(table.cells)
    rng = np.random.default_rng(seed)
    return [keys[i] for i in rng.permutation(len(keys))]


def trials_to_hit(visited: Sequence[str], hits: set[str]) -> int | None:
    """1-based index of the first visited cell in `hits`; None if none is."""
    for i, k in enumerate(visited):
        if k in hits:
            return i + 1
    return None


def hypervolume(points: Sequence[tuple[float, float]], ref: tuple[float, float]) -> float:
    """2-D hypervolume of (accuracy up, ECE down) points against ref = (worst accuracy, worst ECE)."""
    # non-dominated staircase, accuracy descending (so ECE descending too); the strip of
    # accuracies [a_next, a] is covered from ECE e (the lowest so far) up to the reference ECE
    staircase: list[tuple[float, float]] = []
    for a, e in sorted(((a, e) for a, e in points if a > ref[0] and e < ref[1]), key=lambda p: (-p[0], p[1])):
        if not staircase or e < staircase[-1][1]:
            staircase.append((a, e))
    hv = 0.0
    for i, (a, e) in enumerate(staircase):
        a_next = staircase[i + 1][0] if i + 1 < len(staircase) else ref[0]
        hv += (a - a_next) * (ref[1] - e)
    return hv


def hv_ratio(table: Table, visited: Sequence[str], ref: tuple[float, float], full: float) -> float:
    pts = [(table.cells[k]["val_accuracy"], table.cells[k]["val_ece"]) for k in visited if table.ok(k)]
    return hypervolume(pts, ref) / full if full > 0 else float("nan")


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------

BUDGETS = (8, 16, 32)
LOOSE = (0.25, 0.50)  # looser hit thresholds (relative to the best val ECE), reported beside the main 10 %
RANDOM = "random (RandomSampler)"
GRID = "grid (shuffled enumeration)"
TPE_SWEEP = "TPE as the sweep builds it"


def samplers(objective: str) -> dict[str, Callable[[int], Any] | None]:
    """Sampler factories by label (None: the grid enumeration, no Optuna). The sweep's TPE is
    Ray Tune's OptunaSearch default, TPESampler(seed=search.seed) with Optuna's defaults
    (n_startup_trials=10, constant_liar=True; multivariate unless multi-objective)."""
    import optuna

    out: dict[str, Callable[[int], Any] | None] = {
        TPE_SWEEP: lambda s: optuna.samplers.TPESampler(seed=s),
        "TPE, n_startup_trials=4 (not the sweep's)": lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=4),
    }
    if objective == "multi":
        out["NSGA-II (Optuna defaults: population 50)"] = lambda s: optuna.samplers.NSGAIISampler(seed=s)
        out["NSGA-II, population_size=8"] = lambda s: optuna.samplers.NSGAIISampler(seed=s, population_size=8)
    out[RANDOM] = lambda s: optuna.samplers.RandomSampler(seed=s)
    out[GRID] = None
    return out


def search_space(calibrators: list[str], low: float, high: float) -> Any:
    """The sweep's define-by-run space for these calibrators and lr range."""
    from sweeps.config import LogRange, SearchConfig
    from sweeps.integrations.optuna.search_space import SearchSpace

    space = SearchSpace(
        SearchConfig(calibrators=calibrators, calibrator_lr=LogRange(low=low, high=high), references=[])
    )
    # the space these studies replayed: every choice drawn by the sampler (they predate the reference arms, which
    # the service runs once each by trial number instead of drawing them)
    space.calibrators, space.references = list(calibrators), []
    return space


def run_seed(
    table: Table,
    space: Any,
    factory: Callable[[int], Any] | None,
    seed: int,
    objective: str,
    cap: int,
    concurrency: int,
) -> list[str]:
    if factory is None:
        return grid_order(table, seed)[:cap]
    return replay(table, space, factory(seed), cap, objective, concurrency)


def hit_sets(table: Table, objective: str) -> dict[float, set[str]]:
    """The hit cells at 10 % (the main threshold) and at the looser LOOSE thresholds."""
    fn = single_hits if objective == "single" else multi_hits
    return {rel: fn(table, rel=rel) for rel in (0.10, *LOOSE)}


def measure(
    table: Table,
    visited: list[str],
    objective: str,
    hits: dict[float, set[str]],
    hv_ref: tuple[float, float],
    hv_full: float,
) -> dict[str, Any]:
    """Per search: trials to the first hit (10 %; and at the LOOSE thresholds); best val ECE
    (single) or hypervolume (multi) at each budget."""
    out: dict[str, Any] = {"trials_to_hit": trials_to_hit(visited, hits[0.10]), "n": len(visited)}
    for rel in LOOSE:
        out[f"trials_to_hit@{rel:g}"] = trials_to_hit(visited, hits[rel])
    best = min(table.cells[k]["val_ece"] for k in table.cells if table.ok(k))
    for b in BUDGETS:
        seen = [k for k in visited[:b] if table.ok(k)]
        if objective == "single":
            out[f"ece_ratio@{b}"] = (min(table.cells[k]["val_ece"] for k in seen) / best) if seen else float("nan")
        else:
            out[f"hv@{b}"] = hv_ratio(table, visited[:b], hv_ref, hv_full)
    return out


def _boot_ci(
    values: np.ndarray, stat: Callable[[np.ndarray], float], n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), (n_boot, len(values)))
    boots = np.array([stat(values[i]) for i in idx])
    return float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def summarise(runs: dict[str, list[dict[str, Any]]], objective: str, cap: int) -> dict[str, Any]:
    """Per sampler: mean trials to hit (censored at cap: counted as cap) with a bootstrap CI and
    standard error, the hit fraction by each budget, paired (same seed) differences to random."""
    out: dict[str, Any] = {}
    ref = runs[RANDOM]
    ref_hit = {
        b: np.array([r["trials_to_hit"] is not None and r["trials_to_hit"] <= b for r in ref], float)
        for b in (*BUDGETS, cap)
    }
    for label, rows in runs.items():
        t = np.array([min(r["trials_to_hit"] or cap, cap) for r in rows], dtype=np.float64)
        censored = sum(r["trials_to_hit"] is None for r in rows)
        s: dict[str, Any] = {
            "seeds": len(rows),
            "mean_trials": float(t.mean()),
            "se_trials": float(t.std(ddof=1) / math.sqrt(len(t))),
            "ci_trials": _boot_ci(t, np.mean),
            "median_trials": float(np.median(t)),
            "censored": censored,
            "hit": {},
            "hit_vs_random": {},
        }
        for b in (*BUDGETS, cap):
            h = np.array([r["trials_to_hit"] is not None and r["trials_to_hit"] <= b for r in rows], float)
            s["hit"][str(b)] = float(h.mean())
            if label != RANDOM and len(h) == len(ref_hit[b]):
                d = h - ref_hit[b]
                s["hit_vs_random"][str(b)] = [float(d.mean()), *_boot_ci(d, np.mean)]
        s["hit_loose"] = {
            f"{rel:g}": {
                str(b): float(
                    np.mean(
                        [r[f"trials_to_hit@{rel:g}"] is not None and r[f"trials_to_hit@{rel:g}"] <= b for r in rows]
                    )
                )
                for b in BUDGETS
            }
            for rel in LOOSE
        }
        key = "ece_ratio" if objective == "single" else "hv"
        for b in BUDGETS:
            v = np.array([r[f"{key}@{b}"] for r in rows], dtype=np.float64)
            s[f"{key}@{b}"] = [float(np.nanmean(v)), *_boot_ci(v[np.isfinite(v)], np.mean)]
        out[label] = s
    return out


def compare(
    table: Table,
    lr_low: float,
    lr_high: float,
    objective: str,
    seeds: int,
    cap: int,
    concurrency: int,
    log: Callable[[str], None] = print,
    visited_out: dict[str, list[list[str]]] | None = None,
) -> dict[str, Any]:
    """Every sampler over `seeds` search seeds against one table, one objective (`visited_out`:
    filled with each sampler's visited cells per seed)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = search_space(table.calibrators, lr_low, lr_high)
    hit_by = hit_sets(table, objective)
    hits = hit_by[0.10]
    ok = [k for k in table.cells if table.ok(k)]
    hv_ref = (min(table.cells[k]["val_accuracy"] for k in ok), max(table.cells[k]["val_ece"] for k in ok))
    hv_full = hypervolume([(table.cells[k]["val_accuracy"], table.cells[k]["val_ece"]) for k in ok], hv_ref)
    p = sum(sampling_mass(table, k, lr_low, lr_high) for k in hits)
    runs: dict[str, list[dict[str, Any]]] = {}
    first8_same = 0
    for label, factory in samplers(objective).items():
        t0 = time.perf_counter()
        runs[label] = []
        for seed in range(seeds):
            visited = run_seed(table, space, factory, seed, objective, cap, concurrency)
            runs[label].append(measure(table, visited, objective, hit_by, hv_ref, hv_full))
            if visited_out is not None:
                visited_out.setdefault(label, []).append(visited)
            if label == TPE_SWEEP:
                runs[label][-1]["first8"] = visited[:8]
            if label == RANDOM:
                first8_same += visited[:8] == runs[TPE_SWEEP][seed].pop("first8")
        log(f"  {objective} {label}: {seeds} seeds in {time.perf_counter() - t0:.1f} s")
    for r in runs[TPE_SWEEP]:
        r.pop("first8", None)
    return {
        "objective": objective,
        "hits": sorted(hits),
        "cells": len(table.cells),
        "ok_cells": len(ok),
        "loose_hits": {f"{rel:g}": sorted(hit_by[rel]) for rel in LOOSE},
        "p_hit_random_trial_loose": {
            f"{rel:g}": sum(sampling_mass(table, k, lr_low, lr_high) for k in hit_by[rel]) for rel in LOOSE
        },
        "p_hit_random_trial": p,
        "expected_random_trials": 1 / p if p > 0 else float("inf"),
        "expected_grid_trials": (len(table.cells) + 1) / (len(hits) + 1),
        "tpe_first8_equals_random": first8_same / seeds,
        "summary": summarise(runs, objective, cap),
        "per_seed": runs,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _trials_cell(s: dict[str, Any], cap: int) -> str:
    ge = "≥ " if s["censored"] else ""
    lo, hi = s["ci_trials"]
    return f"{ge}{s['mean_trials']:.1f} ± {s['se_trials']:.1f} [{lo:.1f}, {hi:.1f}]"


def _diff_cell(d: list[float] | None) -> str:
    if not d:
        return "—"
    return f"{100 * d[0]:+.0f} [{100 * d[1]:+.0f}, {100 * d[2]:+.0f}]"


def table_md(res: dict[str, Any], cap: int) -> list[str]:
    """One Markdown table: the samplers side by side for one dataset and objective."""
    single = res["objective"] == "single"
    key = "ece_ratio" if single else "hv"
    what = "best val ECE / table best" if single else "hypervolume / table's"
    head = (
        f"| sampler | trials to hit: mean ± SE [95 % CI] | median | hit by 8 | by 16 | by 32 | by {cap} | "
        f"hit by 8 − random, pt | by 16 | by 32 | {what} at 8 | at 32 |"
    )
    lines = [head, "|" + "---|" * 12]
    for label, s in res["summary"].items():
        lines.append(
            f"| {label} | {_trials_cell(s, cap)} | {s['median_trials']:.0f} | "
            + " | ".join(_pct(s["hit"][str(b)]) for b in (*BUDGETS, cap))
            + " | "
            + " | ".join(_diff_cell(s["hit_vs_random"].get(str(b))) for b in BUDGETS)
            + " | "
            + " | ".join(f"{s[f'{key}@{b}'][0]:.3f}" for b in (8, 32))
            + " |"
        )
    return lines


def _significant(d: list[float] | None) -> int:
    """+1 / -1 when a paired difference's CI excludes 0 (better / worse than random), else 0."""
    if not d:
        return 0
    return 1 if d[1] > 0 else -1 if d[2] < 0 else 0


def _vs_random(s: dict[str, Any], b: int) -> str:
    d = s["hit_vs_random"].get(str(b))
    word = {1: "above", -1: "below", 0: "not different from"}[_significant(d)]
    return f"{word} random" if d else "random"


def verdict(results: dict[str, dict[str, Any]]) -> list[str]:
    """Plain sentences from the numbers: the sweep's TPE against random at the demo budget and
    beyond, and which default sampler the data support (significance: paired 95 % CI excluding 0)."""
    out = []
    tpe_sig: dict[int, list[int]] = {b: [] for b in BUDGETS}
    for name, by_obj in results.items():
        for objective, res in by_obj.items():
            s = res["summary"]
            tpe, rnd = s[TPE_SWEEP], s[RANDOM]
            for b in BUDGETS:
                tpe_sig[b].append(_significant(tpe["hit_vs_random"].get(str(b))))
            best = max(s, key=lambda lbl: s[lbl]["hit"]["8"])
            out.append(
                f"- **{name}, {objective}-objective** (hit within 10 %): by 8 trials the sweep's TPE "
                f"{_pct(tpe['hit']['8'])}, random {_pct(rnd['hit']['8'])} ({_vs_random(tpe, 8)}; TPE's first 8 "
                f"trials are random's own draws in {_pct(res['tpe_first8_equals_random'])} of seeds); by 16: "
                f"{_pct(tpe['hit']['16'])} vs {_pct(rnd['hit']['16'])} ({_vs_random(tpe, 16)}); by 32: "
                f"{_pct(tpe['hit']['32'])} vs {_pct(rnd['hit']['32'])} ({_vs_random(tpe, 32)}). Highest by 8: "
                f"{best} ({_pct(s[best]['hit']['8'])}, {_vs_random(s[best], 8)})."
            )
    beats8 = any(x > 0 for x in tpe_sig[8])
    hit8 = [s["hit"]["8"] for by_obj in results.values() for res in by_obj.values() for s in res["summary"].values()]
    lo8, hi8 = min(hit8), max(hit8)
    later_better = [b for b in BUDGETS[1:] if any(x > 0 for x in tpe_sig[b])]
    ever_worse = any(x < 0 for b in BUDGETS for x in tpe_sig[b])
    out.append("")
    if beats8:
        out.append(
            "**Verdict: yes**, the sweep's TPE finds a cell within 10 % of the best val ECE more often than "
            "random search within the demos' 8 trials in at least one case above."
        )
    else:
        out.append(
            "**Verdict: no.** At the demos' budget of 8 trials the sweep's TPE does not beat random search "
            "on this objective: with Optuna's default n_startup_trials=10 its first 10 trials *are* "
            "RandomSampler draws (identical, seed for seed), so an 8-trial sweep is a random search "
            f"whatever the sampler; the samplers find a hit by 8 trials in {_pct(lo8)} to {_pct(hi8)} of "
            "seeds."
        )
    out.append("")
    if later_better and not ever_worse:
        out.append(
            f"Past its 10 random start-up trials TPE is never significantly worse than random and better in "
            f"some cases (by {' and '.join(str(b) for b in later_better)} trials): the data support keeping "
            "TPE as the default sampler, with the caveat that it only differs from random search when "
            "`search.num_samples` exceeds 10."
        )
    elif ever_worse and not later_better:
        out.append(
            "TPE is significantly worse than random in some case and better in none: the data support "
            "random search as the default sampler."
        )
    else:
        out.append(
            "TPE is neither consistently better nor consistently worse than random past its start-up "
            "trials: the data support neither default over the other."
        )
    return out


def _setup_md(grid: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The report's title, command and the description of the tabulated objective and of the replay."""
    cap = meta["cap"]
    return [
        "# Search efficiency: TPE vs random vs grid on a tabulated objective (benchmarks/studies/bench_search.py)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Generated {meta['date']} on {meta['host']}; replay {meta['replay_seconds']:.0f} s, no training.",
        "",
        "**Tabulated objective.** Each demo sweep's full grid, trained once (run seed of the config, CPU, "
        "one thread) on the sweep trial's code path (resolve_run_config → calib_core trainer) without Ray: "
        "every calibrator of `search.calibrators` × "
        + ", ".join(
            f"{d}: {len(g['lrs'])} log-spaced lrs {g['lr_low']:g}..{g['lr_high']:g} "
            f"({len(g['cells'])} cells, {g['epochs']} epochs each, training {g.get('train_seconds', 0):.0f} s)"
            for d, g in grid["datasets"].items()
        )
        + "; a baseline choice (`none`, `posthoc_*`) has no lr and is one cell. Digits' ASHA scheduler is "
        "not replayed (every cell ran all its epochs). Grid cache: benchmarks/results/bench_search_grid.json.",
        "",
        "**Replay.** The sampler sees the sweep's define-by-run space (sweeps.integrations.optuna.search_space.SearchSpace: "
        "calibrator categorical, lr continuous log-uniform low..high); each suggested lr is mapped to the "
        "nearest grid lr in log space and the trial is told that cell's validation metrics, with "
        f"{meta['concurrency']} trials in flight as the demos' `resources.max_concurrent` (trials finish "
        "in ask order; a failed cell is told FAIL). "
        f"{meta['seeds']} search seeds per sampler (seeds 0..{meta['seeds'] - 1}), {cap} trials each. "
        "*TPE as the sweep builds it*: Ray Tune's OptunaSearch default `TPESampler(seed=search.seed)`, "
        "Optuna 5.0 defaults: n_startup_trials=10 (the first 10 trials are RandomSampler(seed) draws), "
        "constant_liar=True, multivariate for a single objective and independent for multi-objective; "
        "the multi-objective sweep uses the same TPE (there is no NSGA-II default in the sweep). "
        "*grid*: every cell once, order shuffled by the seed. *NSGA-II* (not the sweep's; for comparison) draws "
        "its first population at random (RandomSampler(seed) draws, 50 by default: random search below 50 "
        "trials); its mutation_prob defaults to 1 / (parameters in the intersection search space), and where "
        "the lr is absent from some cells (digits' `none`, `posthoc_temperature`) that space is the calibrator "
        "alone, so every child is a fresh random draw: NSGA-II is random search there at any population size.",
        "",
    ]


def _definitions_md(cap: int) -> list[str]:
    """The caveats and the definition of a hit and of the reported columns."""
    return [
        "**Caveats.** One training per cell (the config's run seed), so the 10 % hit set is a single cell in "
        "each table: the main metric asks a search to find that one cell; the looser thresholds and the "
        "best-ECE / hypervolume ratios show how close the searches get otherwise. Random search (and TPE's "
        "start-up) draws with replacement and can land in a cell already visited, where the real sweep would "
        "train a nearby lr; grid search never repeats a cell and spreads its trials over cells, not "
        "calibrators (a baseline choice is 1 of digits' 47 cells, but 1 in 5 of random's draws).",
        "",
        "**Hit.** Single objective (minimise val ECE): a trial whose cell's val ECE is within 10 % of the "
        "table's best val ECE. Multi-objective (val accuracy up, val ECE down, the sweep's default): a cell "
        "whose val accuracy is within 0.5 pt of the table's best and whose val ECE is within 10 % of the "
        "best val ECE among such near-best-accuracy cells (the champion rule's intent). *Trials to hit*: "
        f"1-based index of the first hit; a search without a hit in {cap} trials counts as {cap} (the mean is "
        "then a lower bound, marked ≥). Hit fractions by 8 (the demos' num_samples), 16, 32 trials; "
        "'− random': paired by seed, in percentage points with a 95 % bootstrap CI. Single objective: best "
        "val ECE found / table's best; multi-objective: hypervolume of the visited cells / the table's "
        "(reference point: the table's worst val accuracy and worst val ECE).",
        "",
    ]


def _loose_hits_md(res: dict[str, Any]) -> list[str]:
    """The looser hit thresholds of one objective: their hit sets and each sampler's hit fractions."""
    lines = [
        f"Looser hits, same searches: within {' / '.join(f'{100 * r:.0f} %' for r in LOOSE)} of the best "
        "ECE ("
        + "; ".join(
            f"{100 * float(r):.0f} %: {len(h)} cells, p = {res['p_hit_random_trial_loose'][r]:.3f} per random trial"
            for r, h in res["loose_hits"].items()
        )
        + ").",
        "",
        "| sampler | " + " | ".join(f"{100 * r:.0f} %: hit by {b}" for r in LOOSE for b in BUDGETS) + " |",
        "|---|" + "---|" * (len(LOOSE) * len(BUDGETS)),
    ]
    for label, s in res["summary"].items():
        lines.append(
            f"| {label} | " + " | ".join(_pct(s["hit_loose"][f"{r:g}"][str(b)]) for r in LOOSE for b in BUDGETS) + " |"
        )
    return lines


def _objective_md(name: str, objective: str, res: dict[str, Any], cap: int) -> list[str]:
    """One dataset and objective: its hit cells, the main table and the looser hits."""
    lines = [
        f"## {name}, {objective}-objective",
        "",
        f"{res['cells']} cells ({res['ok_cells']} completed); {len(res['hits'])} hit cells: "
        f"{', '.join(res['hits'])}. One random trial hits with p = {res['p_hit_random_trial']:.3f} "
        f"(expected {res['expected_random_trials']:.1f} trials); a shuffled grid needs "
        f"{res['expected_grid_trials']:.1f} on average.",
        "",
    ]
    lines += table_md(res, cap) + [""]
    lines += _loose_hits_md(res)
    lines.append("")
    return lines


def _best_cell_md(name: str, g: dict[str, Any]) -> list[str]:
    """The dataset's best cell by validation ECE."""
    best = min((c for c in g["cells"].values() if c.get("status") == "completed"), key=lambda c: c["val_ece"])
    return [
        f"{name}: best val ECE cell {cell_key(best['calibrator'], best.get('lr'))}: val ECE "
        f"{best['val_ece']:.4f}, val acc {best['val_accuracy']:.4f}, test ECE {best['test_ece']:.4f}.",
        "",
    ]


def _lr_grid_note_md(meta: dict[str, Any]) -> list[str]:
    """Where the other lr grid's report is (the main report points to the sensitivity run and back)."""
    if meta.get("lr_step", 1) == 1:
        return [
            "Sensitivity to the lr grid: `--lr-step 2 --name bench_search_lr8` replays the same searches on the "
            "8-point grid inside this one (benchmarks/results/bench_search_lr8.md).",
            "",
        ]
    return [
        f"This is the sensitivity run: every {meta['lr_step']}-th lr of the cached grid "
        "(the main report is benchmarks/results/bench_search.md).",
        "",
    ]


def markdown(results: dict[str, dict[str, Any]], grid: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report: setup, definitions, one section per dataset and objective, and the verdict."""
    cap = meta["cap"]
    lines = _setup_md(grid, meta) + _definitions_md(cap)
    for name, by_obj in results.items():
        for objective, res in by_obj.items():
            lines += _objective_md(name, objective, res, cap)
        lines += _best_cell_md(name, grid["datasets"][name])
    lines += _lr_grid_note_md(meta)
    lines += ["## Verdict", ""] + verdict(results) + [""]
    return "\n".join(lines) + "\n"


def run_replay(
    grid: dict[str, Any],
    seeds: int,
    cap: int,
    step: int = 1,
    log: Callable[[str], None] = print,
    visited_out: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, g in grid["datasets"].items():
        cfg = load_sweep(name)
        table = table_from_grid(g)
        if step > 1:
            table = table.subgrid(step)
        missing = [cell_key(*c) for c in grid_cells(table.calibrators, table.lrs) if cell_key(*c) not in table.cells]
        if missing:
            raise SystemExit(f"{name}: {len(missing)} grid cells not trained yet (run without --replay-only)")
        log(f"{name}: {len(table.cells)} cells")
        results[name] = {}
        for obj in ("single", "multi"):
            out = None if visited_out is None else visited_out.setdefault(name, {}).setdefault(obj, {})
            results[name][obj] = compare(
                table, g["lr_low"], g["lr_high"], obj, seeds, cap, cfg.resources.max_concurrent, log, out
            )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid-only", action="store_true", help="train the missing grid cells, then stop")
    p.add_argument("--replay-only", action="store_true", help="replay against the cached grid; train nothing")
    p.add_argument("--lrs", type=int, default=15, help="grid points of calibrator_lr (log-spaced low..high)")
    p.add_argument("--mnist1d-epochs", type=int, default=None, help="override the demo's epochs (default: as is)")
    p.add_argument("--digits-epochs", type=int, default=None, help="override the demo's epochs (default: as is)")
    p.add_argument("--grid", type=Path, default=GRID_FILE, help="the grid cache (JSON)")
    p.add_argument("--seeds", type=int, default=100, help="search seeds per sampler")
    p.add_argument("--cap", type=int, default=64, help="trials per replayed search")
    p.add_argument(
        "--lr-step",
        type=int,
        default=1,
        help="replay on every k-th grid lr only (2: the 8-point grid inside the 15-point one)",
    )
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where bench_search.md / .json go")
    p.add_argument("--name", default="bench_search", help="result file stem")
    p.add_argument(
        "--report-only", action="store_true", help="rebuild <name>.md from <name>.json (no replay, no training)"
    )
    p.add_argument("--save-visited", type=Path, default=None, help="also write every search's visited cells (JSON)")
    args = p.parse_args(argv)
    if args.report_only:
        saved = json.loads((args.out / f"{args.name}.json").read_text())
        grid = _read_grid(args.grid)
        md = markdown(saved["results"], _grid_view(grid, saved["meta"].get("lr_step", 1)), saved["meta"])
        write_text(args.out / f"{args.name}.md", md)
        print(md)
        return 0
    if not args.replay_only:
        run_grid(args.lrs, {"mnist1d": args.mnist1d_epochs, "digits": args.digits_epochs}, args.grid)
    if args.grid_only:
        return 0
    grid = _read_grid(args.grid)
    t0 = time.perf_counter()
    visited: dict[str, Any] | None = {} if args.save_visited else None
    results = run_replay(grid, args.seeds, args.cap, args.lr_step, visited_out=visited)
    if args.save_visited:
        write_json(args.save_visited, visited, compact=True)
    meta = {
        "command": command_line(__file__, argv),
        "date": utc_minute(),
        "measured": utc_now(),
        "host": host_line(),
        "host_info": host_info(),
        "grid_host": grid.get("host"),
        "seeds": args.seeds,
        "cap": args.cap,
        "lr_step": args.lr_step,
        "concurrency": ", ".join(sorted({str(load_sweep(d).resources.max_concurrent) for d in grid["datasets"]})),
        "replay_seconds": time.perf_counter() - t0,
    }
    md = markdown(results, _grid_view(grid, args.lr_step), meta)
    print(md)
    summary = {
        d: {o: {k: v for k, v in r.items() if k != "per_seed"} for o, r in by.items()} for d, by in results.items()
    }
    per_seed = {
        d: {o: {lbl: [x["trials_to_hit"] for x in rows] for lbl, rows in r["per_seed"].items()} for o, r in by.items()}
        for d, by in results.items()
    }
    write_text(args.out / f"{args.name}.md", md)
    write_json(args.out / f"{args.name}.json", {"meta": meta, "results": summary, "trials_to_hit_per_seed": per_seed})
    return 0


def _grid_view(grid: dict[str, Any], step: int) -> dict[str, Any]:
    """The grid as the report describes it (with --lr-step: the coarser grid's lrs and cells)."""
    if step == 1:
        return grid
    out = {"datasets": {}}
    for d, g in grid["datasets"].items():
        t = table_from_grid(g).subgrid(step)
        out["datasets"][d] = {
            **g,
            "lrs": t.lrs,
            "cells": t.cells,
            "train_seconds": sum(c["seconds"] for c in t.cells.values()),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())

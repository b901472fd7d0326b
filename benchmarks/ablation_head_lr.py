"""Ablation: is one-go `last_layer, same` just plain CE with a slower head?

    python benchmarks/ablation_head_lr.py                # MNIST-1D, 5 seeds, lr grid 1e-4,1e-3,1e-2
    python benchmarks/ablation_head_lr.py --quick        # smoke run (tiny data, 2 seeds), temp dir

In one-go with the last layer as the calibrator and `calibrator_data: same`, the model's head
is trained only by the calibrator player, at `calibrator_lr`, on eval-mode features of the
same batch, while the backbone trains through it at `lr`. The reproduction table chose
calibrator lr 1e-3 against the backbone's 1e-2, so part (or all) of its calibration gain over
plain CE could come from the head simply moving 10x slower. This runs, side by side on the
settings of `benchmarks/reproduce.py` (MNIST-1D, cnn1d, Adam 1e-2 constant, 25 epochs):

* plain CE (head at lr = 1e-2);
* plain CE with `train.head_lr` in the grid (the head in its own optimizer group);
* one-go `last_layer, same` with `calibrator_lr` in the same grid.

Each of the two tuned methods gets its lr by MEAN VALIDATION ECE over the seeds (the
reproduction's rule); test metrics are only reported, with paired (same seed) differences.
Outputs: ablation_head_lr.md and ablation_head_lr.json under --out-dir (default
benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    QUICK,
    SETTINGS,
    command_line,
    float_list,
    fmt_mean_std,
    mean_std,
    mean_std_str,
    merge,
    out_dir,
    run_trainer,
    spawn_pool,
    utc_minute,
    write_json,
    write_text,
)

DATASET = "mnist1d"
METRICS = ("accuracy", "ece", "nll")


def jobs(seeds: list[int], grid: list[float], quick: bool) -> list[dict[str, Any]]:
    """Every (method, lr, seed) run of the ablation as a common.run_trainer job."""
    base = SETTINGS[DATASET]
    if quick:
        base = merge(base, QUICK[DATASET])
    methods = [("ce", None, {"method": "ce"})]
    methods += [("ce_head_lr", lr, {"method": "ce", "head_lr": lr}) for lr in grid if lr != base["train"]["lr"]]
    methods += [
        (
            "onego_last_layer_same",
            lr,
            {"method": "onego", "calibrator": "last_layer", "calibrator_data": "same", "calibrator_lr": lr},
        )
        for lr in grid
    ]
    return [
        {
            "dataset": DATASET,
            "group": group,
            "key": f"{group}/lr={lr:g}" if lr else group,
            "seed": s,
            "cal_lr": lr,
            "config": merge(base, {"train": train}),
        }
        for group, lr, train in methods
        for s in seeds
    ]


def choose(runs: list[dict], group: str, seeds: list[int]) -> str | None:
    """Key of `group`'s lr with the lowest mean validation ECE over every seed (failures rank last)."""
    score: dict[str, float] = {}
    for key in sorted({r["key"] for r in runs if r["group"] == group}):
        rs = [r for r in runs if r["key"] == key]
        ok = [r for r in rs if r["status"] == "completed"]
        score[key] = statistics.fmean(r["val"]["ece"] for r in ok) if len(ok) == len(seeds) else float("inf")
    return min(score, key=lambda k: (score[k], k)) if score else None


def _paired(a: list[dict], b: list[dict], metric: str) -> tuple[float, float]:
    """Mean +- std over seeds of a - b on the test metric, same seed only."""
    bs = {r["seed"]: r for r in b if r["status"] == "completed"}
    return mean_std(
        [r["test"][metric] - bs[r["seed"]]["test"][metric] for r in a if r["status"] == "completed" and r["seed"] in bs]
    )


def table(runs: list[dict], seeds: list[int], grid: list[float], meta: dict, train: dict) -> str:
    """The markdown report: every lr of both methods, the chosen rows and paired differences."""
    lines = [
        f"# Ablation: one-go `last_layer, same` vs plain CE with a slower head ({DATASET})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Generated {meta['date']}; {len(seeds)} seeds; lr grid {grid}; settings of benchmarks/reproduce.py "
        f"({DATASET}: {json.dumps(train)}). Test metrics, mean ± std over seeds; "
        "each method's lr chosen by mean validation ECE (marked *).",
        "",
        "| method | lr (head / calibrator) | runs ok | val ECE % | test acc % | test ECE % | test NLL |",
        "|---|---|---|---|---|---|---|",
    ]
    chosen = {g: choose(runs, g, seeds) for g in ("ce_head_lr", "onego_last_layer_same")}
    chosen["ce"] = "ce"
    for key in sorted({r["key"] for r in runs}, key=lambda k: (k.split("/")[0], k)):
        rs = [r for r in runs if r["key"] == key]
        ok = [r for r in rs if r["status"] == "completed"]
        mark = " *" if key in chosen.values() else ""
        lr = rs[0]["cal_lr"]
        lines.append(
            f"| {rs[0]['group']}{mark} | {'1e-2 (= lr)' if lr is None else format(lr, 'g')} | {len(ok)}/{len(rs)} | "
            f"{mean_std_str([r['val']['ece'] for r in ok], 100)} | {mean_std_str([r['test']['accuracy'] for r in ok], 100)} | "
            f"{mean_std_str([r['test']['ece'] for r in ok], 100)} | {mean_std_str([r['test']['nll'] for r in ok], 1, 3)} |"
        )
    by = {k: [r for r in runs if r["key"] == k] for k in chosen.values() if k}
    one, head, ce = by.get(chosen["onego_last_layer_same"], []), by.get(chosen["ce_head_lr"], []), by["ce"]
    lines += [
        "",
        "Paired differences on the test split (same seed), chosen lrs:",
        "",
        "| comparison | Δ test ECE (pp) | Δ test acc (pp) |",
        "|---|---|---|",
    ]
    for name, a, b in (
        ("one-go last_layer same − plain CE", one, ce),
        ("CE with head_lr − plain CE", head, ce),
        ("one-go last_layer same − CE with head_lr", one, head),
    ):
        lines.append(
            f"| {name} | {fmt_mean_std(*_paired(a, b, 'ece'), 100)} | {fmt_mean_std(*_paired(a, b, 'accuracy'), 100)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the ablation's runs in a pool, write and print the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--grid", type=str, default="1e-4,1e-3,1e-2", help="comma-separated head / calibrator lr grid")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    seeds = list(range(2 if args.quick else args.seeds))
    grid = float_list(args.grid)
    out = out_dir(args.out_dir, args.quick, "ablation_")
    todo = jobs(seeds, grid, args.quick)
    print(f"{len(todo)} runs on {args.workers} workers ...", flush=True)
    t0 = time.perf_counter()
    with spawn_pool(args.workers) as pool:
        runs = pool.map(run_trainer, todo, chunksize=1)
    meta = {"command": command_line(__file__, argv), "date": utc_minute(), "wall_s": time.perf_counter() - t0}
    train = {k: v for k, v in todo[0]["config"]["train"].items() if k != "method"}
    report = table(runs, seeds, grid, meta, train)
    write_text(out / "ablation_head_lr.md", report)
    write_json(out / "ablation_head_lr.json", {"meta": meta, "runs": runs})
    print(report)
    print(f"wrote {out / 'ablation_head_lr.md'} ({meta['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

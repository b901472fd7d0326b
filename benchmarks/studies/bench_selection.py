"""Which champion rule picks models that are well calibrated *on test*?

    python -m benchmarks.studies.bench_selection           # 20 sweeps x (mnist1d, digits), 8 trials each
    python -m benchmarks.studies.bench_selection --quick   # smoke run: 2 tiny sweeps per dataset

Phase 1 (cached, resumable): for each dataset and seed, a sweep as the service runs it but
without Ray or MLflow: the demo config of sweeps/configs/ (mnist1d_demo.yaml; digits_demo.yaml
with the service's default multi-objective search instead of ASHA), Optuna's seeded
multi-objective TPE over the same search space (sweeps.integrations.optuna.search_space.SearchSpace), 8 trials,
each trained by calib_core's trainer with the sweep's seed. Each trial's validation and test
predictions are stored under --cache (npz, one file per sweep); a second run reuses them.

Phase 2 (seconds): every rule of sweeps.decide.selection picks a champion from validation data only,
with the service's paired bootstrap; we then look at the champion on *test*:
mean test ECE and accuracy over sweeps, and how often the champion is a "good pick": within 1 pt
of the best test accuracy of the sweep and with a test ECE inside the 95 % CI of the best test
ECE among those trials. Writes benchmarks/results/selection.md and selection.json.gz.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, ROOT, command_line, write_json, write_text

DATASETS = {"mnist1d": "mnist1d_demo.yaml", "digits": "digits_demo.yaml"}
# Held-out regimes (benchmarks/studies/protocols/selection_heldout.md): a demo config plus overrides.
REGIMES: dict[str, tuple[str, list[str]]] = {
    "mnist1d": ("mnist1d_demo.yaml", []),
    "digits": ("digits_demo.yaml", []),
    # the over-confident MNIST-1D regime of the method study v2 (3k samples, lr 0.01, no weight decay)
    "mnist1d_overconf": (
        "mnist1d_demo.yaml",
        [
            "run.data.num_samples=3000",
            "run.data.val_fraction=0.2",
            "run.data.test_fraction=0.4",
            "run.train.lr=0.01",
            "run.train.weight_decay=0.0",
            "run.train.lr_schedule=none",
            "run.train.epochs=25",
            "run.train.batch_size=64",
        ],
    ),
    "mnist1d_noise20": (
        "mnist1d_demo.yaml",
        [
            "run.data.num_samples=3000",
            "run.data.val_fraction=0.2",
            "run.data.test_fraction=0.4",
            "run.data.label_noise=0.2",
            "run.train.lr=0.01",
            "run.train.weight_decay=0.0",
            "run.train.lr_schedule=none",
            "run.train.epochs=25",
            "run.train.batch_size=64",
        ],
    ),
}
RULES = {
    # the default's settings written out, frozen by benchmarks/studies/protocols/selection_heldout.md
    "noise_aware (default: Bonferroni, half-ECE dominance)": {
        "rule": "noise_aware",
        "metric": "val_ece",
        "confidence": 0.95,
        "multiple_comparisons": "bonferroni",
        "dominance_factor": 0.5,
    },
    "noise_aware, Bonferroni, no dominance step": {"rule": "noise_aware", "dominance_factor": None},
    "noise_aware, no adjustment": {"rule": "noise_aware", "multiple_comparisons": "none"},
    "noise_aware, no adjustment, no dominance step": {
        "rule": "noise_aware",
        "multiple_comparisons": "none",
        "dominance_factor": None,
    },
    "noise_aware, default on smooth ECE": {"rule": "noise_aware", "metric": "val_smooth_ece"},
    "noise_aware, default on debiased L2": {"rule": "noise_aware", "metric": "val_debiased_l2_ce"},
    "old: Pareto, 0.5 pt of best acc": {"rule": "pareto_min_ece_near_best_accuracy", "accuracy_tolerance": 0.005},
    "min val ECE": {"rule": "min_metric", "metric": "val_ece", "mode": "min"},
    "max val accuracy": {"rule": "min_metric", "metric": "val_accuracy", "mode": "max"},
}


def _sweep_config(dataset: str, seed: int, quick: bool) -> Any:
    from sweeps.config import load_sweep_config

    config, extra = REGIMES[dataset]
    # the studies so far (selection, held-out, confirmation) ran before reference arms existed: none here
    sets = [
        f"run.seed={seed}",
        f"search.seed={seed}",
        "search.objective=multi",
        "search.scheduler=none",
        "search.references=[]",
        *extra,
    ]
    if quick:
        sets += ["run.train.epochs=2", "search.num_samples=3"]
        if dataset.startswith("mnist1d"):
            sets += ["run.data.num_samples=1200"]
    return load_sweep_config(ROOT / "sweeps" / "configs" / config, sets)


def run_sweep_offline(dataset: str, seed: int, quick: bool, threads: int) -> dict[str, Any]:
    """One sweep's trials (Optuna TPE as the service samples them), trained in this process."""
    import optuna
    import torch

    from calib_core.data import load_dataset
    from calib_core.trainer import make_trainer
    from sweeps.integrations.optuna.search_space import SearchSpace
    from sweeps.trial_params import resolve_run_config

    torch.set_num_threads(threads)
    cfg = _sweep_config(dataset, seed, quick)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.TPESampler(seed=cfg.search.seed)
    )
    space = SearchSpace(cfg.search)
    data = load_dataset(cfg.run.data, cfg.run.seed)
    trials = []
    for _ in range(cfg.search.num_samples):
        ot = study.ask()
        space(ot)
        run_cfg = resolve_run_config(cfg.run, ot.params).model_copy(update={"device": "cpu", "num_threads": threads})
        t0 = time.perf_counter()
        result = make_trainer(run_cfg, data, "cpu").fit()
        entry = {"params": dict(ot.params), "status": result.status, "seconds": time.perf_counter() - t0}
        if result.status == "completed":
            entry.update(
                val_probs=result.val_probs.numpy(),
                val_labels=result.val_labels.numpy(),
                test_probs=result.test_probs.numpy(),
                test_labels=result.test_labels.numpy(),
            )
            study.tell(ot, [float(result.val_metrics["accuracy"]), float(result.val_metrics["ece"])])
        else:
            study.tell(ot, state=optuna.trial.TrialState.FAIL)
        trials.append(entry)
    return {"dataset": dataset, "seed": seed, "trials": trials}


PRED_KEYS = ("val_probs", "val_labels", "test_probs", "test_labels")


def _save(path: Path, sweep: dict[str, Any], keys: tuple[str, ...] = PRED_KEYS) -> None:
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for i, t in enumerate(sweep["trials"]):
        meta.append({k: t[k] for k in ("params", "status", "seconds", "temperature") if k in t})
        for k in keys:
            if k in t:
                arrays[f"t{i}_{k}"] = t[k]
    arrays["meta"] = np.array(json.dumps({"dataset": sweep["dataset"], "seed": sweep["seed"], "trials": meta}))
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def _load(path: Path, keys: tuple[str, ...] = PRED_KEYS) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        for i, t in enumerate(meta["trials"]):
            for k in keys:
                if f"t{i}_{k}" in z.files:
                    t[k] = z[f"t{i}_{k}"]
    return meta


def evaluate_sweep(sweep: dict[str, Any], num_resamples: int) -> dict[str, Any]:
    """Apply every rule to one sweep; return each rule's champion and its test numbers."""
    from calib_core import metrics as calib_metrics
    from calib_core.metrics import compute_all
    from sweeps.config import SelectionConfig
    from sweeps.contract import DEBIASED_METRICS
    from sweeps.decide.selection import TrialRecord, select
    from sweeps.decide.uncertainty import compute_replicates
    from sweeps.trial_params import describe_params

    records, preds = [], {}
    for i, t in enumerate(sweep["trials"]):
        metrics: dict[str, float] = {}
        if t["status"] == "completed":
            for split in ("val", "test"):
                metrics.update(
                    {f"{split}_{k}": v for k, v in compute_all(t[f"{split}_probs"], t[f"{split}_labels"]).items()}
                )
            for name in DEBIASED_METRICS:
                metrics[f"val_{name}"] = float(
                    getattr(calib_metrics, name)(t["val_probs"].astype(np.float64), t["val_labels"])
                )
            preds[str(i)] = {s: [(None, t[f"{s}_probs"], t[f"{s}_labels"])] for s in ("val", "test")}
        records.append(
            TrialRecord(
                trial_id=str(i),
                label=describe_params(t["params"]),
                status=t["status"],
                metrics=metrics,
                params=t["params"],
            )
        )
    reps = compute_replicates(
        preds, num_bins=15, num_resamples=num_resamples, seed=sweep["seed"], names=("accuracy", "ece", "nll")
    )
    ok = [r for r in records if r.ok]
    best_test_acc = max(r.metrics["test_accuracy"] for r in ok)
    near = [r for r in ok if r.metrics["test_accuracy"] >= best_test_acc - 0.01]
    target = min(near, key=lambda r: r.metrics["test_ece"])
    target_hi = reps.interval(target.trial_id, "test_ece")[1]
    out = {
        "dataset": sweep["dataset"],
        "seed": sweep["seed"],
        "n_val": len(ok[0].metrics) and int(len(sweep["trials"][int(ok[0].trial_id)]["val_labels"])),
        "trials": len(records),
        "rules": {},
    }
    for name, kw in RULES.items():
        chosen, _ = select(records, SelectionConfig(**kw), reps)
        m = chosen.metrics
        out["rules"][name] = {
            "trial": chosen.label,
            "test_ece": m["test_ece"],
            "test_accuracy": m["test_accuracy"],
            "val_ece": m["val_ece"],
            "val_accuracy": m["val_accuracy"],
            "acc_gap_to_best_test": best_test_acc - m["test_accuracy"],
            # regret: test ECE above the best test ECE among trials within 1 pt of the best test accuracy
            "ece_regret": m["test_ece"] - target.metrics["test_ece"],
            "good_pick": bool(chosen in near and m["test_ece"] <= target_hi),
        }
    return out


def _ci_mean(values: list[float]) -> tuple[float, float, float]:
    """Mean and a 95 % bootstrap CI of the mean over sweeps."""
    a = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(0)
    means = a[rng.integers(0, len(a), (5000, len(a)))].mean(axis=1)
    return float(a.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rule: mean test ECE/accuracy over sweeps with CIs, paired differences to the old rule, good picks."""
    old = "old: Pareto, 0.5 pt of best acc"
    table: dict[str, Any] = {}
    for name in RULES:
        rows = [r["rules"][name] for r in results]
        ece_m = _ci_mean([x["test_ece"] for x in rows])
        acc_m = _ci_mean([x["test_accuracy"] for x in rows])
        d_ece = _ci_mean([x["test_ece"] - r["rules"][old]["test_ece"] for x, r in zip(rows, results)])
        d_acc = _ci_mean([x["test_accuracy"] - r["rules"][old]["test_accuracy"] for x, r in zip(rows, results)])
        table[name] = {
            "test_ece": ece_m,
            "test_accuracy": acc_m,
            "ece_vs_old": d_ece,
            "acc_vs_old": d_acc,
            "ece_ratio_to_old": ece_m[0] / _ci_mean([r["rules"][old]["test_ece"] for r in results])[0],
            "good_picks": sum(x["good_pick"] for x in rows),
            "sweeps": len(rows),
        }
    return table


def markdown(summary: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results table as markdown."""
    counts = ", ".join(f"{d}: {sum(r['dataset'] == d for r in results)}" for d in DATASETS)
    pct = lambda t: f"{100 * t[0]:.2f} [{100 * t[1]:.2f}, {100 * t[2]:.2f}]"  # noqa: E731
    lines = [
        "# Champion rules compared on test (benchmarks/studies/bench_selection.py)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Generated {meta['date']} in {meta['seconds']:.0f} s "
        f"(trial training {meta['train_seconds']:.0f} s, cached under {meta['cache']}).",
        "",
        f"{len(results)} sweeps ({counts})"
        f", {results[0]['trials']} trials each, Optuna multi-objective TPE over the demo search spaces; every rule sees validation "
        f"data only. Test numbers: mean over sweeps [95 % bootstrap CI of the mean, over sweeps]; "
        f"differences are paired by sweep. A *good pick* is within 1 pt of the sweep's best test accuracy "
        f"with a test ECE inside the 95 % CI of the best test ECE among those trials.",
        "",
        "| rule | test ECE % | test acc % | ECE vs old rule, pt | acc vs old rule, pt | ECE ratio to old | good picks |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        lines.append(
            f"| {name} | {pct(row['test_ece'])} | {pct(row['test_accuracy'])} | {pct(row['ece_vs_old'])} | "
            f"{pct(row['acc_vs_old'])} | {row['ece_ratio_to_old']:.2f} | {row['good_picks']}/{row['sweeps']} |"
        )
    for ds in DATASETS:
        sub = [r for r in results if r["dataset"] == ds]
        if not sub:
            continue
        lines += [
            "",
            f"## {ds} only ({len(sub)} sweeps, validation n = {sub[0]['n_val']})",
            "",
            "| rule | test ECE % | test acc % | good picks |",
            "|---|---|---|---|",
        ]
        for name, row in summarise(sub).items():
            lines.append(
                f"| {name} | {pct(row['test_ece'])} | {pct(row['test_accuracy'])} | "
                f"{row['good_picks']}/{row['sweeps']} |"
            )
    return "\n".join(lines) + "\n"


OLD_RULE = "old: Pareto, 0.5 pt of best acc"
DEFAULT_RULE = "noise_aware (default: Bonferroni, half-ECE dominance)"


def _ratio_ci(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Ratio of means sum(num)/sum(den) with a 95 % paired bootstrap CI over sweeps."""
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(a), (5000, len(a)))
    r = a[idx].sum(axis=1) / b[idx].sum(axis=1)
    return float(a.sum() / b.sum()), float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))


def heldout_summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per regime and rule: test ECE, regret, accuracy gap (means with CIs over sweeps), ratio to the old rule."""
    out: dict[str, Any] = {}
    for regime in dict.fromkeys(r["dataset"] for r in results):
        sub = [r for r in results if r["dataset"] == regime]
        rows: dict[str, Any] = {}
        for name in RULES:
            picks = [r["rules"][name] for r in sub]
            rows[name] = {
                "test_ece": _ci_mean([x["test_ece"] for x in picks]),
                "test_accuracy": _ci_mean([x["test_accuracy"] for x in picks]),
                "ece_regret": _ci_mean([x["ece_regret"] for x in picks]),
                "acc_gap": _ci_mean([x["acc_gap_to_best_test"] for x in picks]),
                "ece_ratio_to_old": _ratio_ci(
                    [x["test_ece"] for x in picks], [r["rules"][OLD_RULE]["test_ece"] for r in sub]
                ),
                "good_picks": sum(x["good_pick"] for x in picks),
                "sweeps": len(picks),
            }
        out[regime] = {"n_val": sub[0]["n_val"], "seeds": [r["seed"] for r in sub], "rules": rows}
    return out


def heldout_markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The held-out report: one table per regime."""
    pct = lambda t: f"{100 * t[0]:.2f} [{100 * t[1]:.2f}, {100 * t[2]:.2f}]"  # noqa: E731
    L = [
        "# The selection rule judged out of sample (benchmarks/studies/bench_selection.py --heldout)",
        "",
        "Protocol: `benchmarks/studies/protocols/selection_heldout.md` (committed before these sweeps ran; the rule's settings "
        "were frozen there). The default rule's settings were designed on the 40 sweeps of `selection.md` "
        "(seeds 0-19, mnist1d and digits demos); every sweep here is new (seeds "
        f"{meta['first_seed']}-{meta['first_seed'] + meta['seeds'] - 1}), and two regimes were never used in its design.",
        "",
        f"Command: `{meta['command']}`; generated {meta['date']} in {meta['seconds']:.0f} s (trial training "
        f"{meta['train_seconds']:.0f} s).",
        "",
        "Per sweep: 8 trials, Optuna multi-objective TPE over the demo search space; each rule sees validation data only. "
        "**Regret** = the champion's test ECE minus the lowest test ECE among the sweep's trials within 1 pt of its best "
        "test accuracy; **acc gap** = best test accuracy minus the champion's. Means over sweeps with 95 % bootstrap CIs "
        "(over sweeps); the ratio is mean test ECE over the old rule's, paired bootstrap CI.",
    ]
    for regime, reg in summary.items():
        L += [
            "",
            f"## {regime} ({len(reg['seeds'])} sweeps, validation n = {reg['n_val']})",
            "",
            "| rule | test ECE % | regret, pt | acc gap, pt | ECE ratio to old rule | good picks |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in reg["rules"].items():
            r = row["ece_ratio_to_old"]
            L.append(
                f"| {name} | {pct(row['test_ece'])} | {pct(row['ece_regret'])} | {pct(row['acc_gap'])} | "
                f"{r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}] | {row['good_picks']}/{row['sweeps']} |"
            )
    L += [
        "",
        "## The protocol's decision rule, applied to every rule",
        "",
        "A rule may be the default if it **helps** (ECE ratio CI below 1) in at least one held-out regime, **hurts** "
        "(CI above 1) in none, and its mean accuracy gap is under 1 pt in every regime.",
        "",
        "| rule | helps in | hurts in | largest mean acc gap, pt (regime) | meets the criteria |",
        "|---|---|---|---|---|",
    ]
    crit = heldout_criteria(summary)
    for name, c in crit.items():
        L.append(
            f"| {name} | {', '.join(c['helps']) or '-'} | {', '.join(c['hurts']) or '-'} | "
            f"{100 * c['max_gap']:.2f} ({c['max_gap_regime']}) | {'yes' if c['meets'] else 'no'} |"
        )
    d = crit[DEFAULT_RULE]
    passing = [n for n, c in crit.items() if c["meets"]]
    L += ["", "## Outcome", ""]
    if d["meets"]:
        L.append("The default meets the protocol's criteria on the held-out sweeps: it stays the default.")
    else:
        why = []
        if not d["helps"]:
            why.append("it helps in no regime")
        if d["hurts"]:
            why.append(f"it hurts in {', '.join(d['hurts'])}")
        if d["max_gap"] >= 0.01:
            gaps = ", ".join(f"{r} {100 * g:.2f} pt" for r, g in d["gaps"].items() if g >= 0.01)
            why.append(f"its mean accuracy gap exceeds 1 pt ({gaps})")
        L.append(
            f"The default does **not** meet the protocol's criteria: {'; '.join(why)}. "
            + (
                f"Rules that do: {', '.join(passing)}; the protocol makes one of them the default only after it is "
                "judged again on new seeds."
                if passing
                else "No rule compared here meets them either, so the held-out data support no replacement: the "
                "default is kept for now and the README says that it failed the accuracy criterion."
            )
        )
    return "\n".join(L) + "\n"


def heldout_criteria(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per rule: the regimes where it helps / hurts against the old rule, its mean accuracy gaps, whether it meets
    the decision rule of benchmarks/studies/protocols/selection_heldout.md."""
    out: dict[str, dict[str, Any]] = {}
    for name in next(iter(summary.values()))["rules"]:
        helps, hurts, gaps = [], [], {}
        for regime, reg in summary.items():
            row = reg["rules"][name]
            r = row["ece_ratio_to_old"]
            if r[2] < 1.0:
                helps.append(regime)
            elif r[1] > 1.0:
                hurts.append(regime)
            gaps[regime] = row["acc_gap"][0]
        worst = max(gaps, key=lambda k: gaps[k])
        out[name] = {
            "helps": helps,
            "hurts": hurts,
            "gaps": gaps,
            "max_gap": gaps[worst],
            "max_gap_regime": worst,
            "meets": bool(helps) and not hurts and gaps[worst] < 0.01,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the sweeps' predictions, compare the rules, write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20, help="sweeps per dataset")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--cache", default=str(ROOT / "benchmarks" / ".cache" / "selection"))
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="tiny sweeps (smoke test)")
    p.add_argument("--first-seed", type=int, default=0, help="seed of the first sweep of each dataset")
    p.add_argument(
        "--heldout",
        action="store_true",
        help="the held-out evaluation of benchmarks/studies/protocols/selection_heldout.md: 12 new sweeps (seeds 2000-2011) "
        "per regime, all regimes, written to selection_heldout.md/json",
    )
    p.add_argument(
        "--confirm",
        action="store_true",
        help="the confirmation run of the protocol's addendum: like --heldout on new seeds 2100-2111, written to "
        "selection_confirm.md/json",
    )
    p.add_argument(
        "--v3",
        action="store_true",
        help="benchmarks/studies/protocols/selection_v3.md: the margin rule with reference arms and TS on top, seeds "
        "2200-2211, five regimes, written to selection_v3.md/json",
    )
    p.add_argument("--regimes", default=None, help="--v3: a comma-separated subset of the regimes (resumable)")
    p.add_argument("--report-only", action="store_true", help="--v3: the report from the cached sweeps only")
    args = p.parse_args(argv)
    if args.v3:
        return _main_v3(args, argv)
    if args.confirm:
        args.heldout = True
    if args.heldout:
        args.first_seed, args.seeds = (2100 if args.confirm else 2000), 12 if not args.quick else 1
        if args.datasets == ",".join(DATASETS):
            args.datasets = ",".join(REGIMES)
    t0 = time.perf_counter()
    cache = Path(args.cache) / ("quick" if args.quick else "full")
    cache.mkdir(parents=True, exist_ok=True)
    results, train_seconds = [], 0.0
    for ds in args.datasets.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            path = cache / f"{ds}_seed{seed}.npz"
            if not path.is_file():
                t = time.perf_counter()
                _save(path, run_sweep_offline(ds, seed, args.quick, args.threads))
                print(f"{ds} seed {seed}: trials trained in {time.perf_counter() - t:.0f} s", flush=True)
            sweep = _load(path)
            train_seconds += sum(t["seconds"] for t in sweep["trials"])
            results.append(evaluate_sweep(sweep, args.resamples))
    meta = {
        "command": command_line(__file__, argv),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - t0,
        "train_seconds": train_seconds,
        "cache": str(Path(args.cache).relative_to(ROOT)) if Path(args.cache).is_relative_to(ROOT) else args.cache,
    }
    out = Path(args.out_dir)
    suffix = "_quick" if args.quick else ""
    if args.heldout:
        meta.update(first_seed=args.first_seed, seeds=args.seeds)
        held = heldout_summary(results)
        text = heldout_markdown(held, meta)
        meta["criteria"] = heldout_criteria(held)
        stem = "selection_confirm" if args.confirm else "selection_heldout"
        write_text(out / f"{stem}{suffix}.md", text)
        write_json(out / f"{stem}{suffix}.json.gz", {"meta": meta, "summary": held, "sweeps": results})
        print(text)
        return 0
    summary = summarise(results)
    text = markdown(summary, results, meta)
    write_text(out / f"selection{suffix}.md", text)
    write_json(out / f"selection{suffix}.json.gz", {"meta": meta, "summary": summary, "sweeps": results})
    print(text)
    return 0


def _main_v3(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Selection v3: train (or reuse) the protocol's sweeps, apply its rules, write its report."""
    from benchmarks.studies import selection_v3 as v3

    t0 = time.perf_counter()
    cache = Path(args.cache) / ("v3_quick" if args.quick else "v3")
    cache.mkdir(parents=True, exist_ok=True)
    names = list(v3.regimes()) if args.regimes is None else args.regimes.split(",")
    seeds = v3.SEEDS[:1] if args.quick else v3.SEEDS
    results, train_seconds, missing = [], 0.0, []
    for regime in names:
        for seed in seeds:
            path = cache / f"{regime}_seed{seed}.npz"
            if not path.is_file():
                if args.report_only:
                    missing.append(path.name)
                    continue
                t = time.perf_counter()
                _save(path, v3.run_sweep(regime, seed, args.quick, args.threads), v3.KEYS)
                print(f"{regime} seed {seed}: trials trained in {time.perf_counter() - t:.0f} s", flush=True)
            sweep = _load(path, v3.KEYS)
            train_seconds += sum(t["seconds"] for t in sweep["trials"])
            results.append(v3.evaluate(sweep, args.resamples))
    if missing:
        print(f"not reported: {len(missing)} sweeps not trained yet ({', '.join(missing[:4])}, ...)")
        return 1
    meta = {
        "command": command_line(__file__, argv),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - t0,
        "train_seconds": train_seconds,
        "seeds": list(seeds),
    }
    summary = v3.summarise(results)
    verdict = v3.decide(summary)
    text = v3.markdown(summary, verdict, meta)
    if args.regimes is None or set(names) == set(v3.regimes()):
        suffix = "_quick" if args.quick else ""
        write_text(Path(args.out_dir) / f"selection_v3{suffix}.md", text)
        write_json(
            Path(args.out_dir) / f"selection_v3{suffix}.json.gz",
            {"meta": meta, "summary": summary, "verdict": verdict, "sweeps": results},
        )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

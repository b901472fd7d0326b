"""Selection v3 (benchmarks/studies/protocols/selection_v3.md, pre-registered): the margin rule over every trial and every
trial + TS, with the CE-early-stopping reference arm, judged on new seeds against the previous default.

    python -m benchmarks.studies selection_v3                    # 12 sweeps x 5 regimes (seeds 2200-2211)
    python -m benchmarks.studies selection_v3 --regimes digits   # one regime (resumable: sweeps are cached)
    python -m benchmarks.studies selection_v3 --report-only      # the report from the cached sweeps

Each sweep is trained as the service trained it at the protocol's commit (Optuna's seeded multi-objective TPE over the
demo space, calib_core's trainer in this process, no Ray or MLflow), with the study's first trial the reference arm and
temperature scaling on top of every completed trial (calib_core.posthoc_on_top); the rules of RULES_V3 then pick
from validation data only and the champion is looked at on test. Writes benchmarks/results/selection_v3.md and
.json.gz. (The result files were written by `benchmarks/studies/bench_selection.py --v3`, this study's driver until
issue #45 retired the earlier selection studies: the same code, moved here.) selection_v4 reuses its sweeps and
candidates (`run_sweep`, `candidates`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, ROOT, command_line, write_json, write_text

SEEDS = tuple(range(2200, 2212))  # new to the project (protocol: design 0-19, audit 1000-1011, 2000-2011, 2100-2111)
KEYS = ("val_probs", "val_labels", "test_probs", "test_labels", "ts_val_probs", "ts_test_probs")
# Frozen by the protocol: written out so a later change of the config's defaults cannot change what is judged.
PREVIOUS = {
    "rule": "noise_aware",
    "metric": "val_ece",
    "confidence": 0.95,
    "multiple_comparisons": "bonferroni",
    "dominance_factor": 0.5,
}
RULES_V3: dict[str, dict[str, Any]] = {
    "margin 0.5": {"rule": "margin", "max_accuracy_loss": 0.5, "metric": "val_ece", "confidence": 0.95},
    "margin 1": {"rule": "margin", "max_accuracy_loss": 1.0, "metric": "val_ece", "confidence": 0.95},
    "margin 2": {"rule": "margin", "max_accuracy_loss": 2.0, "metric": "val_ece", "confidence": 0.95},
    "previous default, 16 candidates": PREVIOUS,
}
REFERENCE = "previous default, 8 trials as trained"  # what the service did before the protocol's commit
MARGINS = {"margin 0.5": 0.005, "margin 1": 0.01, "margin 2": 0.02}
# The held-out protocol's four regimes (benchmarks/studies/protocols/selection_heldout.md): a demo config plus overrides.
_OVERCONF = [
    "run.data.num_samples=3000",
    "run.data.val_fraction=0.2",
    "run.data.test_fraction=0.4",
    "run.train.lr=0.01",
    "run.train.weight_decay=0.0",
    "run.train.lr_schedule=none",
    "run.train.epochs=25",
    "run.train.batch_size=64",
]
HELDOUT_REGIMES: dict[str, tuple[str, list[str]]] = {
    "mnist1d": ("mnist1d_demo.yaml", []),
    "digits": ("digits_demo.yaml", []),
    # the over-confident MNIST-1D regime of the method study v2 (3k samples, lr 0.01, no weight decay)
    "mnist1d_overconf": ("mnist1d_demo.yaml", _OVERCONF),
    "mnist1d_noise20": ("mnist1d_demo.yaml", [*_OVERCONF[:3], "run.data.label_noise=0.2", *_OVERCONF[3:]]),
}


def regimes() -> dict[str, tuple[str, list[str]]]:
    """The protocol's five regimes: the held-out protocol's four and mnist1d_imbalance10."""
    overconf = HELDOUT_REGIMES["mnist1d_overconf"]
    return {**HELDOUT_REGIMES, "mnist1d_imbalance10": (overconf[0], [*overconf[1], "run.data.imbalance_ratio=10"])}


def sweep_config(regime: str, seed: int, quick: bool) -> Any:
    """The regime's demo config with the service's defaults of the protocol's commit: the ce_es reference arm."""
    from sweeps.config import load_sweep_config

    config, extra = regimes()[regime]
    sets = [
        f"run.seed={seed}",
        f"search.seed={seed}",
        "search.objective=multi",
        "search.scheduler=none",
        "search.references=[ce_es]",
        "search.reference_patience=5",
        "search.num_samples=8",
        *extra,
    ]
    if quick:
        sets += ["run.train.epochs=2", "search.num_samples=3"]
        if regime.startswith("mnist1d"):
            sets += ["run.data.num_samples=1200"]
    return load_sweep_config(ROOT / "sweeps" / "configs" / config, sets)


def run_sweep(regime: str, seed: int, quick: bool, threads: int) -> dict[str, Any]:
    """One sweep's trials, trained in this process, each with its temperature-on-top predictions."""
    import optuna
    import torch

    from calib_core.data import load_dataset
    from calib_core.posthoc_on_top import temperature_on_top_scores
    from calib_core.trainer import make_trainer
    from sweeps.integrations.optuna.search_space import SearchSpace
    from sweeps.trial_params import resolve_run_config

    torch.set_num_threads(threads)
    cfg = sweep_config(regime, seed, quick)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.TPESampler(seed=cfg.search.seed)
    )
    space = SearchSpace(cfg.search)
    data = load_dataset(cfg.run.data, cfg.run.seed)
    trials = []
    for _ in range(cfg.search.num_samples):
        ot = study.ask()
        params = {**(space(ot) or {}), **ot.params}  # a reference arm's choice is a constant of the trial
        run_cfg = resolve_run_config(cfg.run, params).model_copy(update={"device": "cpu", "num_threads": threads})
        t0 = time.perf_counter()
        trainer = make_trainer(run_cfg, data, "cpu")
        result = trainer.fit()
        entry: dict[str, Any] = {"params": params, "status": result.status}
        if result.status == "completed":
            fit, _, arrays = temperature_on_top_scores(
                result, data, trainer.strategy.metrics, folds=5, seed=run_cfg.seed, num_bins=15
            )
            entry.update(
                val_probs=result.val_probs.numpy(),
                val_labels=result.val_labels.numpy(),
                test_probs=result.test_probs.numpy(),
                test_labels=result.test_labels.numpy(),
                ts_val_probs=arrays["val_probs"],
                ts_test_probs=arrays["test_probs"],
                temperature=float(fit.temperatures[0]),
            )
            study.tell(ot, [float(result.val_metrics["accuracy"]), float(result.val_metrics["ece"])])
        else:
            study.tell(ot, state=optuna.trial.TrialState.FAIL)
        entry["seconds"] = time.perf_counter() - t0
        trials.append(entry)
    return {"dataset": regime, "seed": seed, "trials": trials}


def _candidate_metrics(t: dict[str, Any], prefix: str) -> dict[str, float]:
    from calib_core.metrics import compute_all, debiased_l2_ce

    out: dict[str, float] = {}
    for split in ("val", "test"):
        probs, labels = t[f"{prefix}{split}_probs"], t[f"{split}_labels"]
        out.update({f"{split}_{k}": v for k, v in compute_all(probs, labels).items()})
    out["test_debiased_l2_ce"] = float(debiased_l2_ce(t[f"{prefix}test_probs"].astype(np.float64), t["test_labels"]))
    return out


def candidates(sweep: dict[str, Any], num_resamples: int) -> tuple[list[Any], Any]:
    """The sweep's candidates as selection sees them (every trial, and every completed trial + TS) and their paired
    bootstrap replicates (accuracy, ECE, NLL on validation and test; seeded by the sweep's seed)."""
    from sweeps.decide.selection import POST_TS, TrialRecord
    from sweeps.decide.uncertainty import compute_replicates
    from sweeps.trial_params import describe_params

    records, preds = [], {}
    for i, t in enumerate(sweep["trials"]):
        label = describe_params(t["params"])
        if t["status"] != "completed":
            records.append(TrialRecord(str(i), label, t["status"], {}, params=t["params"]))
            continue
        for prefix, post in (("", ""), ("ts_", POST_TS)):
            tid = f"{i}+{post}" if post else str(i)
            records.append(
                TrialRecord(
                    tid,
                    label + (" + TS" if post else ""),
                    "completed",
                    _candidate_metrics(t, prefix),
                    params=t["params"],
                    post=post,
                    base_id=str(i) if post else None,
                )
            )
            preds[tid] = {s: [(None, t[f"{prefix}{s}_probs"], t[f"{s}_labels"])] for s in ("val", "test")}
    reps = compute_replicates(
        preds, num_bins=15, num_resamples=num_resamples, seed=sweep["seed"], names=("accuracy", "ece", "nll")
    )
    return records, reps


def evaluate(sweep: dict[str, Any], num_resamples: int) -> dict[str, Any]:
    """Every rule's champion on one sweep (validation only), and its test numbers."""
    from sweeps.config import SelectionConfig
    from sweeps.decide.selection import select

    records, reps = candidates(sweep, num_resamples)
    ok = [r for r in records if r.ok]
    best_test_acc = max(r.metrics["test_accuracy"] for r in ok)
    out: dict[str, Any] = {
        "dataset": sweep["dataset"],
        "seed": sweep["seed"],
        "n_val": int(len(sweep["trials"][int(ok[0].trial)]["val_labels"])),
        "trials": len(sweep["trials"]),
        "candidates": len(ok),
        "rules": {},
    }
    trained = [r for r in records if not r.post]
    for name, kw in [*RULES_V3.items(), (REFERENCE, PREVIOUS)]:
        chosen, _ = select(trained if name == REFERENCE else records, SelectionConfig(**kw), reps)
        m = chosen.metrics
        out["rules"][name] = {
            "candidate": chosen.label,
            "family": chosen.family,
            "test_ece": m["test_ece"],
            "test_accuracy": m["test_accuracy"],
            "test_nll": m["test_nll"],
            "test_debiased_l2_ce": m["test_debiased_l2_ce"],
            "acc_gap_to_best_test": best_test_acc - m["test_accuracy"],
        }
    return out


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    """Ratio of means with a 95 % paired bootstrap CI over sweeps and the one-sided p of "not below 1"."""
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(a), (5000, len(a)))
    r = a[idx].sum(axis=1) / b[idx].sum(axis=1)
    return {
        "ratio": float(a.sum() / b.sum()),
        "lo": float(np.quantile(r, 0.025)),
        "hi": float(np.quantile(r, 0.975)),
        "p_better": float(np.mean(r >= 1.0)),
    }


def _ci_mean(values: list[float]) -> tuple[float, float, float]:
    """Mean and a 95 % bootstrap CI of the mean over sweeps."""
    a = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(0)
    means = a[rng.integers(0, len(a), (5000, len(a)))].mean(axis=1)
    return float(a.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per regime and rule: means with CIs over sweeps, the test ECE ratio to the reference, family counts."""
    out: dict[str, Any] = {}
    for regime in dict.fromkeys(r["dataset"] for r in results):
        sub = [r for r in results if r["dataset"] == regime]
        rows = {}
        for name in [*RULES_V3, REFERENCE]:
            picks = [r["rules"][name] for r in sub]
            fams: dict[str, int] = {}
            for x in picks:
                fams[x["family"]] = fams.get(x["family"], 0) + 1
            rows[name] = {
                **{
                    k: _ci_mean([x[k] for x in picks])
                    for k in ("test_ece", "test_accuracy", "test_nll", "test_debiased_l2_ce")
                },
                "acc_gap": _ci_mean([x["acc_gap_to_best_test"] for x in picks]),
                "ece_ratio": _ratio([x["test_ece"] for x in picks], [r["rules"][REFERENCE]["test_ece"] for r in sub]),
                "families": fams,
                "sweeps": len(picks),
            }
        out[regime] = {"n_val": sub[0]["n_val"], "seeds": [r["seed"] for r in sub], "rules": rows}
    return out


def holm(pvalues: dict[str, float], alpha: float = 0.05) -> dict[str, bool]:
    """Holm's step-down rejections (True = rejected) of a family of one-sided tests."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    out = dict.fromkeys(pvalues, False)
    for i, k in enumerate(order):
        if pvalues[k] > alpha / (len(order) - i):
            break
        out[k] = True
    return out


def decide(summary: dict[str, Any]) -> dict[str, Any]:
    """The protocol's decision rule: which margins qualify, and the default it implies."""
    verdict: dict[str, Any] = {"margins": {}}
    for name, m in MARGINS.items():
        gaps = {reg: s["rules"][name]["acc_gap"][0] for reg, s in summary.items()}
        ratios = {reg: s["rules"][name]["ece_ratio"] for reg, s in summary.items()}
        better = holm({reg: r["p_better"] for reg, r in ratios.items()})
        worse = [reg for reg, r in ratios.items() if r["lo"] > 1.0]
        within = all(g <= m + 1e-12 for g in gaps.values())
        verdict["margins"][name] = {
            "gaps": gaps,
            "within_margin_everywhere": within,
            "worse_in": worse,
            "better_in_holm": [reg for reg, b in better.items() if b],
            "mean_test_ece": float(np.mean([s["rules"][name]["test_ece"][0] for s in summary.values()])),
            "qualifies": within and not worse and any(better.values()),
        }
    qualifying = [n for n, v in verdict["margins"].items() if v["qualifies"]]
    if qualifying:
        best = min(qualifying, key=lambda n: (verdict["margins"][n]["mean_test_ece"], MARGINS[n]))
        verdict["default"] = {"margin_pt": 100 * MARGINS[best], "rule": best, "met": True}
    else:
        verdict["default"] = {"margin_pt": 1.0, "rule": "margin 1", "met": False}
    return verdict


def markdown(summary: dict[str, Any], verdict: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report: one table per regime, the decision."""
    pct = lambda t: f"{100 * t[0]:.2f} [{100 * t[1]:.2f}, {100 * t[2]:.2f}]"  # noqa: E731
    L = [
        "# Selection v3: the margin rule with reference arms and TS on top (benchmarks/studies/selection_v3.py)",
        "",
        "Protocol: `benchmarks/studies/protocols/selection_v3.md`, committed before any of these sweeps ran. "
        f"Seeds {meta['seeds'][0]}-{meta['seeds'][-1]} (new); command `{meta['command']}`; generated {meta['date']} "
        f"in {meta['seconds']:.0f} s (trial training {meta['train_seconds']:.0f} s).",
        "",
        "Per sweep: 8 trials (the first the CE-with-early-stopping reference arm, 7 drawn by multi-objective TPE over "
        "the demo space), each a candidate as trained and + TS (5-fold cross-fitted on validation): 16 candidates. "
        "**acc gap** = the best test accuracy among the candidates minus the champion's; the ECE ratio is the "
        f"champion's mean test ECE over the reference's ({REFERENCE}), paired bootstrap CI over sweeps. Means over "
        "sweeps with 95 % bootstrap CIs.",
    ]
    for regime, reg in summary.items():
        L += [
            "",
            f"## {regime} ({len(reg['seeds'])} sweeps, validation n = {reg['n_val']})",
            "",
            "| rule | acc gap, pt | test ECE % | ECE ratio to reference | test NLL | test debiased L2 CE % | families |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in reg["rules"].items():
            r = row["ece_ratio"]
            nll = row["test_nll"]
            fams = ", ".join(f"{k} {v}" for k, v in sorted(row["families"].items()))
            L.append(
                f"| {name} | {pct(row['acc_gap'])} | {pct(row['test_ece'])} | {r['ratio']:.2f} [{r['lo']:.2f}, "
                f"{r['hi']:.2f}] | {nll[0]:.4f} [{nll[1]:.4f}, {nll[2]:.4f}] | {pct(row['test_debiased_l2_ce'])} | "
                f"{fams} |"
            )
    L += [
        "",
        "## The decision rule",
        "",
        "A margin m qualifies if, in every regime, its mean accuracy gap is at most m, its ECE ratio CI is not entirely "
        "above 1, and in at least one regime it is better (Holm over the five regimes, one-sided bootstrap p).",
        "",
        "| margin | largest mean acc gap, pt (regime) | within its margin everywhere | worse in | better in (Holm) | "
        "mean test ECE % | qualifies |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in verdict["margins"].items():
        worst = max(v["gaps"], key=lambda k: v["gaps"][k])
        L.append(
            f"| {name} pt | {100 * v['gaps'][worst]:.2f} ({worst}) | {'yes' if v['within_margin_everywhere'] else 'no'} "
            f"| {', '.join(v['worse_in']) or '-'} | {', '.join(v['better_in_holm']) or '-'} | "
            f"{100 * v['mean_test_ece']:.2f} | {'yes' if v['qualifies'] else 'no'} |"
        )
    d = verdict["default"]
    L += ["", "## Outcome", ""]
    if d["met"]:
        L.append(
            f"The default margin becomes **{d['margin_pt']:g} pt** (the qualifying margin with the lowest mean test "
            "ECE over the regimes), as the protocol fixed."
        )
    else:
        L.append(
            "**No margin met the protocol's criteria.** The provisional 1 pt stays the default; the tables above say, "
            "per regime, what each margin costs in accuracy and gains in calibration, and the user chooses "
            "(`selection.max_accuracy_loss`)."
        )
    return "\n".join(L) + "\n"


def save_sweep(path: Path, sweep: dict[str, Any], keys: tuple[str, ...] = KEYS) -> None:
    """One sweep's trials to a compressed .npz (arrays per trial, the rest as JSON), written atomically."""
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


def load_sweep(path: Path, keys: tuple[str, ...] = KEYS) -> dict[str, Any]:
    """A sweep as `save_sweep` wrote it."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        for i, t in enumerate(meta["trials"]):
            for k in keys:
                if f"t{i}_{k}" in z.files:
                    t[k] = z[f"t{i}_{k}"]
    return meta


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=str(ROOT / "benchmarks" / ".cache" / "selection"))
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="tiny sweeps (smoke test), one seed")
    p.add_argument("--regimes", default=None, help="a comma-separated subset of the regimes (resumable)")
    p.add_argument("--report-only", action="store_true", help="the report from the cached sweeps only")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train (or reuse) the protocol's sweeps, apply its rules, write its report."""
    args = _parse_args(argv)
    t0 = time.perf_counter()
    cache = Path(args.cache) / ("v3_quick" if args.quick else "v3")
    cache.mkdir(parents=True, exist_ok=True)
    names = list(regimes()) if args.regimes is None else args.regimes.split(",")
    seeds = SEEDS[:1] if args.quick else SEEDS
    results, train_seconds, missing = [], 0.0, []
    for regime in names:
        for seed in seeds:
            path = cache / f"{regime}_seed{seed}.npz"
            if not path.is_file():
                if args.report_only:
                    missing.append(path.name)
                    continue
                t = time.perf_counter()
                save_sweep(path, run_sweep(regime, seed, args.quick, args.threads))
                print(f"{regime} seed {seed}: trials trained in {time.perf_counter() - t:.0f} s", flush=True)
            sweep = load_sweep(path)
            train_seconds += sum(t["seconds"] for t in sweep["trials"])
            results.append(evaluate(sweep, args.resamples))
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
    summary = summarise(results)
    verdict = decide(summary)
    text = markdown(summary, verdict, meta)
    if args.regimes is None or set(names) == set(regimes()):
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

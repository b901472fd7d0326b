"""A fair method study, run by the sweep service itself (issue #11).

    python -m benchmarks.studies.method_study                 # the CPU study (budget in the config's header / the report)
    python -m benchmarks.studies.method_study --quick         # smoke run of the whole pipeline in a temp dir (~5-10 min)
    python -m benchmarks.studies.method_study --report-only   # rebuild the report from the cache
    python -m benchmarks.studies.method_study --config benchmarks/studies/method_study_configs/cifar10_resnet18.yaml   # GPU

Two phases per regime (dataset and training budget) and method:

1. Tuning, through the sweep service: a generated sweep config (written under the cache dir)
   is run by `sweeps/launch.py`'s `main` in this process (Ray Tune + Optuna's seeded TPE +
   MLflow in the study's own SQLite store and Ray storage under the cache dir). Every method
   gets the same number of trials and the same search over the backbone lr and weight decay
   (one-go also its calibrator lr, the CE control its head lr), on the tuning seed only, with
   `search.objective: single`, `search.metric` = `selection.metric` = validation NLL and the
   `min_metric` rule: the service's champion is the chosen configuration. Post-hoc baselines
   fitted on the validation split report k-fold cross-fitted validation metrics
   (`train.posthoc_split: val`), so that selecting on validation stays honest.
2. Evaluation: the chosen configuration is trained directly with calib_core's trainer
   (`make_trainer(...).fit()`, not through the service) on every evaluation seed (each seed
   fixes the data split, the calibrator holdout and the initialisation; the tuning seed is
   not among them), `workers` processes side by side with one torch thread each.

Statistics (`paired_ci`, `tost`, `matches_verdict`): per comparison the per-seed paired
differences (same seed = same split) with a t interval across seeds, a two one-sided tests
(TOST) equivalence test of the ECE difference with the config's margin (0.5 pt), and
non-inferiority of accuracy with its margin; per seed, a paired bootstrap over the test
examples (calib_core.metrics.bootstrap) gives the within-seed interval of the ECE difference.

Everything is cached per (regime, method, phase, seed) under `--cache-dir` (default
benchmarks/.cache/method_study/<config name>, gitignored): a rerun of the same command skips
what is done, resumes an interrupted sweep (`--resume`) and rebuilds the report. The sweeps keep
every epoch checkpoint (the service's default; about 7 GB for the CPU study): once the study is
finished, `<cache>/service/ray_results` can be deleted (the report needs only tune/ and eval/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS_DIR,
    ROOT,
    command_line,
    host_line,
    mean_std_str,
    run_summary,
    utc_minute,
    utc_now,
    write_json,
)

CONFIG_DIR = ROOT / "benchmarks" / "studies" / "method_study_configs"
DEFAULT_CONFIG = CONFIG_DIR / "cpu.yaml"
DEFAULT_CACHE = ROOT / "benchmarks" / ".cache" / "method_study"
DEFAULT_OUT = RESULTS_DIR


# ==========================================================================================
# statistics (pure; tests/unit/benchmarks/test_method_study.py checks them on hand-computed cases)
# ==========================================================================================
def _t():
    from scipy.stats import t

    return t


def paired_ci(d: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Mean of paired differences `d` with its two-sided t interval at `level` and the
    two-sided one-sample t-test p-value of mean 0."""
    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "se": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan}
    mean = float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else math.nan
    se = sd / math.sqrt(n) if n > 1 else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "sd": sd, "se": se, "lo": math.nan, "hi": math.nan, "p": math.nan}
    t = _t()
    if se == 0.0:
        return {"n": n, "mean": mean, "sd": sd, "se": se, "lo": mean, "hi": mean, "p": 1.0 if mean == 0.0 else 0.0}
    q = float(t.ppf(0.5 + level / 2.0, n - 1))
    p = float(2.0 * t.sf(abs(mean) / se, n - 1))
    return {"n": n, "mean": mean, "sd": sd, "se": se, "lo": mean - q * se, "hi": mean + q * se, "p": p}


def tost(d: Sequence[float], margin: float, alpha: float = 0.05) -> dict[str, Any]:
    """Two one-sided t-tests of equivalence, H0: |mean| >= margin. p = max of the two one-sided
    p-values; `equivalent` when p < alpha, i.e. the (1 - 2 alpha) t interval lies inside
    (-margin, margin)."""
    if margin <= 0:
        raise ValueError("margin must be > 0")
    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    if n < 2:
        return {
            "n": n,
            "p": math.nan,
            "p_lower": math.nan,
            "p_upper": math.nan,
            "lo": math.nan,
            "hi": math.nan,
            "equivalent": False,
            "margin": margin,
        }
    mean, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n)
    t = _t()
    if se == 0.0:
        p_lower = 0.0 if mean > -margin else 1.0
        p_upper = 0.0 if mean < margin else 1.0
        lo = hi = mean
    else:
        p_lower = float(t.sf((mean + margin) / se, n - 1))  # H0: mean <= -margin
        p_upper = float(t.cdf((mean - margin) / se, n - 1))  # H0: mean >= +margin
        q = float(t.ppf(1.0 - alpha, n - 1))
        lo, hi = mean - q * se, mean + q * se
    p = max(p_lower, p_upper)
    return {
        "n": n,
        "p": p,
        "p_lower": p_lower,
        "p_upper": p_upper,
        "lo": lo,
        "hi": hi,
        "equivalent": p < alpha,
        "margin": margin,
    }


def one_sided_lower(d: Sequence[float], alpha: float = 0.05) -> float:
    """The one-sided (1 - alpha) lower t bound of the mean of `d`."""
    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    if n < 2:
        return math.nan
    se = float(x.std(ddof=1)) / math.sqrt(n)
    return float(x.mean()) - float(_t().ppf(1.0 - alpha, n - 1)) * se


def matches_verdict(
    d_ece: Sequence[float], d_acc: Sequence[float], margin_ece: float, margin_acc: float, alpha: float = 0.05
) -> dict[str, Any]:
    """Verdict on "method matches the reference" from paired per-seed differences
    (method - reference): d_ece (lower is better), d_acc (higher is better).

    - refuted: the ECE difference's (1 - alpha) interval lies entirely above +margin_ece
      (worse by more than the margin), or the accuracy difference's lies entirely below
      -margin_acc;
    - established: accuracy is non-inferior (one-sided (1 - alpha) lower bound above
      -margin_acc) and ECE is not worse by the margin: TOST shows the difference within
      +-margin_ece, or, where one-go may be better by more than the margin (TOST fails on
      that side only), the one-sided (1 - alpha) upper bound is below +margin_ece ("matches"
      holds a fortiori);
    - not settled: anything else.
    """
    e = paired_ci(d_ece, 1.0 - alpha)
    a = paired_ci(d_acc, 1.0 - alpha)
    eq = tost(d_ece, margin_ece, alpha)
    acc_lower = one_sided_lower(d_acc, alpha)
    acc_ok = math.isfinite(acc_lower) and acc_lower > -margin_acc
    reasons = []
    if e["n"] < 2:
        verdict = "not settled"
        reasons.append("fewer than 2 paired seeds")
    elif e["lo"] > margin_ece or a["hi"] < -margin_acc:
        verdict = "refuted"
        if e["lo"] > margin_ece:
            reasons.append("ECE worse by more than the margin")
        if a["hi"] < -margin_acc:
            reasons.append("accuracy lower by more than the margin")
    elif eq["equivalent"] and acc_ok:
        verdict = "established"
        reasons.append("ECE equivalent (TOST), accuracy non-inferior")
    elif eq["hi"] < margin_ece and acc_ok:
        verdict = "established"
        reasons.append("ECE not worse by the margin (possibly better by more than it), accuracy non-inferior")
    else:
        verdict = "not settled"
        if not eq["equivalent"]:
            reasons.append(
                "ECE equivalence not shown"
                if eq["hi"] >= margin_ece
                else "ECE not worse by the margin (equivalence not shown)"
            )
        if not acc_ok:
            reasons.append("accuracy non-inferiority not shown")
    return {
        "verdict": verdict,
        "reason": "; ".join(reasons),
        "ece": e,
        "acc": a,
        "tost": eq,
        "acc_lower": acc_lower,
        "acc_noninferior": acc_ok,
    }


def overall_verdict(verdicts: Sequence[str]) -> str:
    """A general claim over several regimes: refuted if refuted in any, established if
    established in all, else not settled."""
    if not verdicts:
        return "not settled"
    if any(v == "refuted" for v in verdicts):
        return "refuted"
    if all(v == "established" for v in verdicts):
        return "established"
    return "not settled"


# ==========================================================================================
# the study spec
# ==========================================================================================
def _merge(base: Any, extra: Any) -> Any:
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for k, v in extra.items():
            out[k] = _merge(base[k], v) if k in base and k != "regimes" else v
        return out
    return extra


def load_spec(path: Path) -> dict[str, Any]:
    """A study config; a config other than cpu.yaml inherits every key it does not set from
    cpu.yaml (`regimes` is replaced as a whole)."""
    import yaml

    spec = yaml.safe_load(path.read_text())
    if path.resolve() != DEFAULT_CONFIG.resolve():
        spec = _merge(yaml.safe_load(DEFAULT_CONFIG.read_text()), spec)
    for k in [k for k in spec if k.startswith("_")]:
        spec.pop(k)
    for r, reg in spec["regimes"].items():
        unknown = [m for m in reg["methods"] if m not in spec["methods"]]
        if unknown:
            raise SystemExit(f"{path}: regime {r}: unknown methods {unknown}")
    return spec


QUICK = {
    "tuning": {"trials": 2},
    "evaluation": {"seeds": [1, 2, 3], "bootstrap_resamples": 200},
    "regimes": {
        "mnist1d_3k": {
            "label": "QUICK: MNIST-1D 1k samples, 3 epochs",
            "methods": ["ce", "ce_es", "ts_val", "onego_ts", "onego_ts_unrolled", "onego_ll"],
            "run": {
                "data": {"name": "mnist1d", "num_samples": 1000, "val_fraction": 0.2, "test_fraction": 0.4},
                "model": {"name": "cnn1d"},
                "train": {"epochs": 3, "batch_size": 64, "optimizer": "adam", "lr_schedule": "none"},
            },
        },
        "mnist1d_mtl": {
            "label": "QUICK: MNIST-1D multi-task 1k samples, 3 epochs",
            "methods": ["ce", "ts_val", "onego_ts"],
            "run": {
                "data": {"name": "mnist1d_mtl", "num_samples": 1000, "val_fraction": 0.2, "test_fraction": 0.4},
                "model": {"name": "cnn1d"},
                "train": {"epochs": 3, "batch_size": 64, "optimizer": "adam", "lr_schedule": "none"},
            },
        },
    },
    "claims": {
        "a": {"regimes": ["mnist1d_3k"]},
        "b": {"regimes": ["mnist1d_3k"]},
        "c": {"regimes": ["mnist1d_mtl"], "secondary": None},
    },
}


# ==========================================================================================
# phase 1: tuning through the sweep service
# ==========================================================================================
def sweep_name(spec: dict, regime: str, method: str) -> str:
    """The sweep's name (also its MLflow tag and Ray Tune directory) for one regime and method."""
    return f"ms-{spec['name']}-{regime}-{method}".replace("_", "-")


def sweep_config(spec: dict, regime: str, method: str, cache: Path) -> dict[str, Any]:
    """The service's sweep config for one (regime, method)."""
    m, reg, tu = spec["methods"][method], spec["regimes"][regime], spec["tuning"]
    run = json.loads(json.dumps(reg["run"]))
    run["seed"] = tu["seed"]
    run["device"] = "auto" if spec.get("device", "cpu") != "cpu" else "cpu"
    run.setdefault("train", {}).update(m.get("train", {}))
    search: dict[str, Any] = {
        "num_samples": reg.get("trials", tu["trials"]),
        "calibrators": list(m["calibrators"]),
        "params": {**spec.get("shared_params", {}), **m.get("params", {})},
        "objective": "single",
        "metric": tu["metric"],
        "mode": "min",
        "scheduler": "none",
        "seed": tu["seed"],
    }
    if "calibrator_lr" in m:
        search["calibrator_lr"] = m["calibrator_lr"]
    service = cache / "service"
    return {
        "name": sweep_name(spec, regime, method),
        "storage_path": str((service / "ray_results").resolve()),
        "run": run,
        "search": search,
        "resources": {
            "cpus_per_trial": tu["cpus_per_trial"],
            "gpus_per_trial": tu["gpus_per_trial"],
            "max_concurrent": tu["max_concurrent"],
            "max_failures": 1,
        },
        "tracking": {
            "uri": f"sqlite:///{(service / 'mlflow.db').resolve()}",
            "experiment": f"method-study-{spec['name']}",
            "registered_model": sweep_name(spec, regime, method),
        },
        "selection": {"rule": "min_metric", "metric": tu["metric"], "mode": "min", "num_resamples": 200},
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer)):
        return _jsonable(v.item())
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _champion(cfg: dict[str, Any]) -> dict[str, Any]:
    """The sweep's champion (run config, searched params, leaderboard) from its MLflow store."""
    import pandas as pd
    from mlflow import MlflowClient

    from sweeps.contract import TAG_ROLE, TAG_SWEEP
    from sweeps.integrations.mlflow.store import find_run

    client = MlflowClient(cfg["tracking"]["uri"])
    exp = client.get_experiment_by_name(cfg["tracking"]["experiment"])
    parent = find_run(client, exp.experiment_id, {TAG_SWEEP: cfg["name"], TAG_ROLE: "parent"})
    run_id = parent.data.tags["calib.champion_run"]
    with tempfile.TemporaryDirectory() as d:
        run_config = json.loads(Path(client.download_artifacts(run_id, "run_config.json", d)).read_text())
        selection = json.loads(
            Path(client.download_artifacts(parent.info.run_id, "sweep/selection.json", d)).read_text()
        )
        board = pd.read_csv(client.download_artifacts(parent.info.run_id, "sweep/leaderboard.csv", d))
    keep = [
        c
        for c in board.columns
        if c in ("trial_id", "label", "status", "champion")
        or (c.startswith(("val_", "test_")) and not c.endswith(("_ci_low", "_ci_high")))
    ]
    rows = [{k: _jsonable(v) for k, v in r.items()} for r in board[keep].to_dict("records")]
    params = {
        k.removeprefix("search."): v for k, v in client.get_run(run_id).data.params.items() if k.startswith("search.")
    }
    return {
        "run_id": run_id,
        "parent_run_id": parent.info.run_id,
        "run_config": run_config,
        "params": params,
        "selection": selection,
        "leaderboard": rows,
    }


def tune_one(spec: dict, regime: str, method: str, cache: Path) -> dict[str, Any]:
    """Tune (regime, method) through the service unless cached; return the cached record."""
    import yaml

    out = cache / "tune" / regime / f"{method}.json"
    if out.is_file():
        return json.loads(out.read_text())
    cfg = sweep_config(spec, regime, method, cache)
    cfg_path = cache / "sweeps" / f"{cfg['name']}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    (cache / "service").mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    from sweeps import cli as launch

    print(f"[tune] {regime} / {method}: python sweeps/launch.py --config {cfg_path} --resume", flush=True)
    t0 = time.perf_counter()
    for attempt in range(1, 4):
        rc = launch.main(["--config", str(cfg_path), "--resume"])
        if rc != 0:
            raise SystemExit(f"sweep {cfg['name']} ended with exit code {rc}; rerun the same command to resume it")
        champion = _champion(cfg)
        errored = [r["trial_id"] for r in champion["leaderboard"] if r.get("status") == "errored"]
        if not errored:
            break
        # an infrastructure failure (e.g. another user's `ray stop --force` killed the trial's worker twice),
        # not an outcome of the configuration: the service's --resume reruns errored trials from their checkpoints,
        # so that every method keeps its full trial budget
        print(
            f"[tune] {regime} / {method}: trials {errored} errored; resuming the sweep (attempt {attempt + 1})",
            flush=True,
        )
    wall = time.perf_counter() - t0
    rec = {
        "regime": regime,
        "method": method,
        "sweep": cfg["name"],
        "sweep_config": str(cfg_path),
        "wall_s": wall,
        "finished_utc": utc_now(),
        **champion,
    }
    write_json(out, rec)
    ok = sum(r.get("status") == "completed" for r in rec["leaderboard"])
    print(
        f"[tune] {regime} / {method}: {ok}/{len(rec['leaderboard'])} trials completed in {wall:.0f}s; chosen "
        f"{rec['params']} (val {spec['tuning']['metric']} {rec['selection']['val_metrics'].get(spec['tuning']['metric'])})",
        flush=True,
    )
    return rec


# ==========================================================================================
# phase 2: evaluation seeds, trained directly with calib_core at the chosen configuration
# ==========================================================================================
_WORKER_DEVICE: str | None = None


def _init_worker(devices: Any) -> None:
    """Pool initializer: with `evaluation.devices`, each worker process takes one device for good."""
    global _WORKER_DEVICE
    _WORKER_DEVICE = devices.get()


def eval_one(job: dict[str, Any]) -> dict[str, Any]:
    """One training run in a worker process: the chosen config on one evaluation seed."""
    import torch

    if _WORKER_DEVICE is not None:
        job = dict(job, device=_WORKER_DEVICE)
    torch.set_num_threads(job["threads"])
    from calib_core.config import RunConfig
    from calib_core.data import load_dataset
    from calib_core.trainer import make_trainer

    raw = dict(job["run_config"], seed=job["seed"], device=job["device"], num_threads=job["threads"])
    cfg = RunConfig.model_validate(raw)
    data = load_dataset(cfg.data, cfg.seed)
    t0 = time.perf_counter()
    res = make_trainer(cfg, data, cfg.device).fit()
    wall = time.perf_counter() - t0
    out = {
        "regime": job["regime"],
        "method": job["method"],
        "seed": job["seed"],
        "status": res.status,
        "reason": res.reason,
        "epochs_run": res.epochs_run,
        "best_epoch": (res.best or {}).get("epoch"),
        "val": res.val_metrics,
        "test": res.test_metrics,
        "wall_s": wall,
        "epoch_times": res.epoch_times,
        "calibrator_info": {k: v for k, v in (res.calibrator_info or {}).items() if isinstance(v, (int, float, str))},
    }
    path = Path(job["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    if res.status == "completed":
        if getattr(res, "task_test_probs", None) is not None:
            arrays = {f"task{t}_probs": p.numpy().astype(np.float32) for t, p in enumerate(res.task_test_probs)}
            arrays["task_labels"] = res.task_test_labels.numpy()
        else:
            arrays = {"probs": res.test_probs.numpy().astype(np.float32), "labels": res.test_labels.numpy()}
        np.savez_compressed(path.with_suffix(".npz"), **arrays)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    tmp.replace(path)  # the json marks the run done, written last
    return out


def eval_path(cache: Path, regime: str, method: str, seed: int) -> Path:
    """Where one evaluation run's result JSON is cached."""
    return cache / "eval" / regime / method / f"seed{seed}.json"


def run_evaluations(spec: dict, regime: str, tuned: dict[str, dict], cache: Path) -> None:
    """Retrain every tuned method on every evaluation seed in a pool, caching each run (cached runs are skipped)."""
    import multiprocessing as mp

    ev = spec["evaluation"]
    jobs = []
    for seed in ev["seeds"]:  # seed-major: a cut-short run has whole seeds
        for method in spec["regimes"][regime]["methods"]:
            p = eval_path(cache, regime, method, seed)
            if not p.is_file():
                jobs.append(
                    {
                        "regime": regime,
                        "method": method,
                        "seed": seed,
                        "run_config": tuned[method]["run_config"],
                        "device": spec.get("device", "cpu"),
                        "threads": ev["threads"],
                        "path": str(p),
                    }
                )
    if not jobs:
        return
    print(f"[eval] {regime}: {len(jobs)} runs on {ev['workers']} workers", flush=True)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    init: tuple[Any, ...] = ()
    if ev.get("devices"):  # one accelerator per worker process
        queue = ctx.Manager().Queue()
        for d in ev["devices"][: ev["workers"]]:
            queue.put(d)
        init = (_init_worker, (queue,))
    with ctx.Pool(ev["workers"], *init) as pool:
        for i, r in enumerate(pool.imap_unordered(eval_one, jobs), 1):
            print(
                f"[eval {i}/{len(jobs)} {time.perf_counter() - t0:5.0f}s] {regime} {r['method']} seed={r['seed']} {run_summary(r)} "
                f"({r['wall_s']:.1f}s)",
                flush=True,
            )


# ==========================================================================================
# report
# ==========================================================================================
def load_evals(cache: Path, regime: str, method: str, seeds: Sequence[int]) -> dict[int, dict]:
    """{seed: result} of the cached evaluation runs of one method."""
    out = {}
    for s in seeds:
        p = eval_path(cache, regime, method, s)
        if p.is_file():
            out[s] = json.loads(p.read_text())
    return out


def _ok(runs: dict[int, dict]) -> dict[int, dict]:
    return {s: r for s, r in runs.items() if r["status"] == "completed"}


def paired(a: dict[int, dict], b: dict[int, dict], key: str, split: str = "test") -> list[float]:
    """Per-seed differences a - b of a metric, over the seeds where both runs completed."""
    seeds = sorted(set(_ok(a)) & set(_ok(b)))
    return [a[s][split][key] - b[s][split][key] for s in seeds]


def top_label_arrays(probs: np.ndarray, labels: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
    """What a stored evaluation run keeps of its test predictions for the top-label ECE: each row's top
    confidence and whether the top class is the label (13x smaller than the probabilities at K = 10)."""
    probs = np.asarray(probs)
    return {
        f"{prefix}conf": probs.max(axis=1).astype(np.float32),
        f"{prefix}correct": probs.argmax(axis=1) == np.asarray(labels),
        f"{prefix}num_classes": np.array(probs.shape[1]),
    }


def stored_predictions(z: Any, prefix: str = "", keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) with the stored runs' top-label confidence and correctness, float64: the full
    probabilities where they were stored, else K columns with the confidence first and the rest spread evenly
    (each at most the confidence, since it is the largest of K), labelled 0 when correct: the same top label,
    confidence and correctness, so the same top-label ECE."""
    sel = slice(None) if keep is None else keep
    if f"{prefix}probs" in z.files:
        labels = z["labels"] if not prefix else z["task_labels"][:, int(prefix[4:-1])]
        return z[f"{prefix}probs"][sel].astype(np.float64), labels[sel]
    conf = z[f"{prefix}conf"][sel].astype(np.float64)
    k = int(z[f"{prefix}num_classes"])
    probs = np.repeat(((1.0 - conf) / (k - 1))[:, None], k, axis=1)
    probs[:, 0] = conf
    return probs, np.where(z[f"{prefix}correct"][sel], 0, 1)


def per_seed_bootstrap(
    cache: Path,
    regime: str,
    m1: str,
    m2: str,
    seeds: Sequence[int],
    resamples: int,
    level: float = 0.95,
    path_fn: Any = None,
) -> list[dict[str, float]]:
    """Per seed: the paired bootstrap over test examples of ECE(m1) - ECE(m2) (mean over tasks
    for multi-task runs), its percentile interval."""
    import torch

    from calib_core.metrics.bootstrap import bootstrap_metrics, percentile_interval, resample_counts

    def ece_reps(z: Any, counts: torch.Tensor) -> torch.Tensor:
        if "labels" in z.files:
            probs, labels = stored_predictions(z, "")
            return bootstrap_metrics(probs, labels, counts, names=["ece"])["ece"]
        task_labels = z["task_labels"]
        reps = []
        for t in range(task_labels.shape[1]):
            keep = task_labels[:, t] >= 0
            probs, labels = stored_predictions(z, f"task{t}_", keep)
            reps.append(bootstrap_metrics(probs, labels, counts[:, torch.from_numpy(keep)], names=["ece"])["ece"])
        return torch.stack(reps).mean(0)

    path_fn = path_fn or eval_path
    out = []
    for s in seeds:
        p1, p2 = (
            path_fn(cache, regime, m1, s).with_suffix(".npz"),
            path_fn(cache, regime, m2, s).with_suffix(".npz"),
        )
        if not (p1.is_file() and p2.is_file()):
            continue
        with np.load(p1) as z1, np.load(p2) as z2:
            n = len(z1["labels"] if "labels" in z1.files else z1["task_labels"])
            counts = resample_counts(n, resamples, seed=1000 + s)
            d = ece_reps(z1, counts) - ece_reps(z2, counts)
        lo, hi = percentile_interval(d, level)
        out.append({"seed": s, "lo": lo, "hi": hi})
    return out


def _pp(v: float, nd: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:+.{nd}f}"


def _pct(v: float, nd: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{100 * v:.{nd}f}"


def _ci_str(c: dict[str, float], scale: float = 100.0, nd: int = 2) -> str:
    if not math.isfinite(c.get("mean", math.nan)):
        return "n/a"
    return f"{scale * c['mean']:+.{nd}f} [{scale * c['lo']:+.{nd}f}, {scale * c['hi']:+.{nd}f}]"


def _hparams(rec: dict) -> str:
    p = rec.get("params", {})
    parts = []
    for k, name in (
        ("train.lr", "lr"),
        ("train.weight_decay", "wd"),
        ("calibrator_lr", "cal lr"),
        ("train.head_lr", "head lr"),
    ):
        if k in p:
            try:
                parts.append(f"{name} {float(p[k]):.2g}")
            except ValueError:
                parts.append(f"{name} {p[k]}")
    return ", ".join(parts)


def _median(vals: Sequence[float]) -> float:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else math.nan


def _sum_wall(runs: dict[int, dict]) -> float:
    return float(sum(r.get("wall_s", 0.0) for r in runs.values()))


def _range_pt(vals: Sequence[float]) -> str:
    vals = [v for v in vals if math.isfinite(v)]
    return f"{100 * min(vals):.2f}-{100 * max(vals):.2f}" if vals else "n/a"


def _trials_text(spec: dict) -> str:
    base = spec["tuning"]["trials"]
    other = {r: reg["trials"] for r, reg in spec["regimes"].items() if reg.get("trials", base) != base}
    return f"{base} trials" + (f" ({', '.join(f'{n} in {r}' for r, n in other.items())})" if other else "")


_Runs = dict[int, dict]
_Tuned = dict[str, dict[str, dict]]
_Evals = dict[str, dict[str, _Runs]]


def _header_lines(spec: dict, cache: Path, command: str, quick: bool, timing: dict[str, Any]) -> list[str]:
    """The report's title, the command that rebuilds it and where it was generated."""
    L = ["# Method study: one-go calibration against tuned baselines (issue #11)", ""]
    if quick:
        L += ["**QUICK SMOKE RUN: tiny data, 3 epochs, 2 tuning trials, 3 seeds; the numbers mean nothing.**", ""]
    cfg_rel = os.path.relpath(spec["_path"], ROOT)
    one = "python -m benchmarks.studies.method_study" + (
        "" if Path(spec["_path"]).resolve() == DEFAULT_CONFIG.resolve() else f" --config {cfg_rel}"
    )
    L += [
        f"One command runs (or resumes) the whole study and writes this file: `{one}{' --quick' if quick else ''}`; with a complete "
        f"cache (`{os.path.relpath(cache, ROOT)}`, per regime, method, phase and seed) it only rebuilds the report. "
        f"This file was written by `{command}`.",
        "",
    ]
    L += [
        f"Generated {utc_minute()} on {host_line()} (shared with other work), torch {timing.get('torch', '?')}, device {spec.get('device', 'cpu')}.",
        "",
    ]
    return L


def _procedure_section(spec: dict, cache: Path) -> list[str]:
    """The "Procedure" section: tuning, the post-hoc and early-stopping baselines, evaluation, statistics."""
    seeds = spec["evaluation"]["seeds"]
    margin, margin_acc, alpha = spec["margin_ece"], spec["margin_acc"], spec["alpha"]
    metric = spec["tuning"]["metric"]
    tu, ev = spec["tuning"], spec["evaluation"]
    sp = ", ".join(f"`{k}` {v['type']} [{v['low']:g}, {v['high']:g}]" for k, v in spec.get("shared_params", {}).items())
    L = ["## Procedure", ""]
    L += [
        f"- **Tuning, by the sweep service itself.** For every regime and method the study writes a sweep config "
        f"(`{os.path.relpath(cache / 'sweeps', ROOT)}/<name>.yaml`) and runs it with `sweeps/launch.py`'s `main(['--config', FILE, '--resume'])`: "
        f"Ray Tune + Optuna (seeded TPE, `search.seed` {tu['seed']}; Optuna's first 10 trials are random draws), MLflow in the study's own SQLite store "
        f"(`{os.path.relpath(cache / 'service' / 'mlflow.db', ROOT)}`) and Ray storage. **{_trials_text(spec)} per method** (the same budget for every "
        f"method of a regime), {tu['max_concurrent']} at a time, {tu['cpus_per_trial']} CPU each, all on the tuning seed {tu['seed']} (its split and initialisation; "
        f"never an evaluation seed). Objective and selection: minimum **validation {metric.removeprefix('val_').upper()}** (`search.objective: single`, "
        f"`selection.rule: min_metric`), a proper score that weighs accuracy and calibration alike for every method; the service's champion "
        f"is the chosen configuration. Searched for every method: {sp}; one-go also its calibrator lr (log-uniform, range in the tables), the CE "
        f"control its head lr. Test metrics are logged by the service but never used to choose."
    ]
    L += [
        f"- **Post-hoc baselines fitted on the validation split** (`train.posthoc_split: val`, `posthoc_refit: end`): the backbone trains "
        f"with CE on the whole training split; after training, TS (or vector scaling) is fitted by LBFGS on the validation split, and that "
        f"calibrator is the one evaluated on test. What tuning sees is the **{spec['methods']['ts_val']['train']['posthoc_folds']}-fold cross-fitted** "
        f"validation metric: each validation example is calibrated by a calibrator fitted on the other folds (nested k-fold on validation), so "
        f"selecting the backbone's lr and weight decay on it does not reward fitting the calibrator to the examples it is scored on."
    ]
    L += [
        "- **CE with early stopping**: after each epoch the validation NLL is measured; training stops after 5 epochs without a new minimum "
        "and the best epoch's model is returned (`train.early_stopping_patience: 5`); lr and weight decay tuned like every other method."
    ]
    L += [
        f"- **Evaluation**: the chosen configuration of each method is trained on **{len(seeds)} evaluation seeds** ({seeds[0]}..{seeds[-1]}) directly "
        f"with calib_core's trainer (`make_trainer(cfg, data).fit()`, not through the service), {ev['workers']} processes side by side, "
        f"{ev['threads']} torch thread each. A seed fixes the data split, the one-go holdout and the initialisation, so methods are paired by seed. "
        "Test metrics of the returned model; ECE = 15 even bins, top-label (for multi-task: the mean over the tasks)."
    ]
    L += [
        f"- **Statistics**: per comparison, the per-seed paired differences (method − reference) with a t interval across seeds "
        f'(95 %); a "matches" claim is decided by **TOST with an equivalence margin of ±{100 * margin:g} pt ECE** at α = {alpha:g} (the 90 % '
        f"interval inside the margin) together with accuracy non-inferiority (one-sided 95 % lower bound above −{100 * margin_acc:g} pt). "
        f"Verdicts: *established* = ECE equivalent (or better by more than the margin) and accuracy non-inferior; *refuted* = ECE worse by more "
        f"than the margin or accuracy lower by more than its margin (95 % interval entirely beyond); *not settled* otherwise. A claim over "
        f"several regimes is established only if established in every one, refuted if refuted in any. Within each seed, a paired bootstrap "
        f"over test examples ({ev['bootstrap_resamples']} resamples, `calib_core.metrics.bootstrap`, the same resamples for both methods) gives the "
        "test-set sampling interval of the ECE difference; it shows how much of the seed-to-seed spread is test-set noise."
    ]
    L += [""]
    return L


def _budget_summary(timing: dict[str, Any], total_t: float, total_e: float, total_cpu: float) -> str:
    """The paragraph under the budget table: total tuning and evaluation time over the command's invocations."""
    invs = timing.get("invocations", [])
    span = ""
    if timing.get("first_started_utc") and timing.get("last_progress_utc"):
        fmt = "%Y-%m-%d %H:%M:%S"
        dt = time.mktime(time.strptime(timing["last_progress_utc"], fmt)) - time.mktime(
            time.strptime(timing["first_started_utc"], fmt)
        )
        span = f"; from the first start ({timing['first_started_utc']} UTC) to the last step: {dt / 60:.1f} min"
    return (
        f"Tuning: {total_t / 60:.1f} min of wall time for all sweeps (each sweep: Ray Tune trials, MLflow logging, the service's "
        f"selection, bootstrap intervals and champion registration; a sweep resumed after an interruption counts the attempt that "
        f"finished it). Evaluation: {total_e / 60:.1f} min of wall time ({total_cpu / 60:.1f} min of single-thread compute summed over "
        f"the runs). Recorded: {timing.get('total_wall_s', math.nan) / 60:.1f} min over {len(invs)} invocation(s) of the command{span}"
        + (f". {timing['note']}" if timing.get("note") else ".")
    )


def _budget_section(spec: dict, cache: Path, timing: dict[str, Any]) -> list[str]:
    """The "Budget and wall time" section: per-regime tuning and evaluation cost, then the totals."""
    seeds = spec["evaluation"]["seeds"]
    L = ["## Budget and wall time", ""]
    ew = timing.get("eval_wall_s", {})
    L += [
        "| regime | methods | tuning: sweeps wall s | tuning trials | evaluation: runs | evaluation: wall s | evaluation: CPU s (sum of runs) |",
        "|---|---|---|---|---|---|---|",
    ]
    total_t = total_e = total_cpu = 0.0
    for regime, reg in spec["regimes"].items():
        recs = [
            json.loads((cache / "tune" / regime / f"{m}.json").read_text())
            for m in reg["methods"]
            if (cache / "tune" / regime / f"{m}.json").is_file()
        ]
        t_wall = sum(r["wall_s"] for r in recs)
        n_trials = sum(len(r["leaderboard"]) for r in recs)
        runs = [load_evals(cache, regime, m, seeds) for m in reg["methods"]]
        cpu = sum(_sum_wall(r) for r in runs)
        n_runs = sum(len(r) for r in runs)
        e_wall = float(ew.get(regime, math.nan))
        total_t += t_wall
        total_e += e_wall if math.isfinite(e_wall) else 0.0
        total_cpu += cpu
        L.append(
            f"| {regime} | {len(reg['methods'])} | {t_wall:.0f} | {n_trials} | {n_runs} | {e_wall:.0f} | {cpu:.0f} |"
            if math.isfinite(e_wall)
            else f"| {regime} | {len(reg['methods'])} | {t_wall:.0f} | {n_trials} | {n_runs} | (cached) | {cpu:.0f} |"
        )
    L += ["", _budget_summary(timing, total_t, total_e, total_cpu)]
    L += [""]
    return L


def _load_results(spec: dict, cache: Path) -> tuple[_Tuned, _Evals]:
    """Every regime's cached tuning records ({regime: {method: record}}) and evaluation runs."""
    seeds = spec["evaluation"]["seeds"]
    tuned: _Tuned = {}
    evals: _Evals = {}
    for regime, reg in spec["regimes"].items():
        tuned[regime] = {
            m: json.loads((cache / "tune" / regime / f"{m}.json").read_text())
            for m in reg["methods"]
            if (cache / "tune" / regime / f"{m}.json").is_file()
        }
        evals[regime] = {m: load_evals(cache, regime, m, seeds) for m in reg["methods"]}
    return tuned, evals


def _claim_comparison(
    spec: dict, cache: Path, evals: _Evals, key: str, regime: str, onego: str, ref: str, primary: bool
) -> tuple[str, dict[str, Any], float]:
    """One row of the claims table (a one-go variant against the reference in one regime), its raw entry and
    the median per-seed bootstrap half-width."""
    margin, margin_acc, alpha = spec["margin_ece"], spec["margin_acc"], spec["alpha"]
    seeds = spec["evaluation"]["seeds"]
    a, b = evals[regime][onego], evals[regime][ref]
    d_ece, d_acc = paired(a, b, "ece"), paired(a, b, "accuracy")
    v = matches_verdict(d_ece, d_acc, margin, margin_acc, alpha)
    boot = per_seed_bootstrap(cache, regime, onego, ref, seeds, spec["evaluation"]["bootstrap_resamples"])
    above = sum(r["lo"] > 0 for r in boot)
    below = sum(r["hi"] < 0 for r in boot)
    hw = _median([(r["hi"] - r["lo"]) / 2 for r in boot])
    e, t_, ac = v["ece"], v["tost"], v["acc"]
    label = f"{spec['methods'][onego]['label']} vs {spec['methods'][ref]['label']}"
    tag = "" if primary else " (secondary)"
    ce_runs = evals[regime].get("ce")
    v_ce = (
        matches_verdict(paired(ce_runs, b, "ece"), paired(ce_runs, b, "accuracy"), margin, margin_acc, alpha)
        if ce_runs
        else None
    )
    ce_cell = f"{_ci_str(v_ce['ece'])}, {v_ce['verdict']}" if v_ce else "–"
    line = (
        f"| ({key}){tag} | {regime} | {label} | {e['n']} | {_ci_str(e)} | {t_['p']:.3f} [{100 * t_['lo']:+.2f}, {100 * t_['hi']:+.2f}] "
        f"| {_ci_str(ac)} | {above} / {below} ({100 * hw:.2f}) | **{v['verdict']}** ({v['reason']}) | {ce_cell} |"
    )
    entry = {
        "regime": regime,
        "onego": onego,
        "reference": ref,
        "d_ece": d_ece,
        "d_acc": d_acc,
        "verdict": v,
        "per_seed_bootstrap": boot,
        "primary": primary,
        "plain_ce_vs_reference": v_ce,
    }
    return line, entry, hw


def _claim_results(
    spec: dict, cache: Path, evals: _Evals, key: str, claim: dict
) -> tuple[list[str], list[dict[str, Any]], list[float], dict[str, Any]]:
    """One claim's table rows, raw entries and bootstrap half-widths over its regimes and one-go variants, and
    its verdict ({overall, per_regime, missing})."""
    L: list[str] = []
    entries: list[dict[str, Any]] = []
    half_widths: list[float] = []
    per_regime = []
    variants = [claim["onego"]] + ([claim["secondary"]] if claim.get("secondary") else [])
    for regime in claim["regimes"]:
        if regime not in evals:
            continue
        for vi, onego in enumerate(variants):
            ref = claim["reference"]
            if onego not in evals[regime] or ref not in evals[regime]:
                continue
            line, entry, hw = _claim_comparison(spec, cache, evals, key, regime, onego, ref, vi == 0)
            half_widths.append(hw)
            L.append(line)
            entries.append(entry)
            if vi == 0:
                v_ce = entry["plain_ce_vs_reference"]
                trivial = v_ce is not None and v_ce["verdict"] == "established"
                per_regime.append(
                    (regime, entry["verdict"]["verdict"] + (" (plain CE matches too)" if trivial else ""))
                )
    missing = [r for r in claim["regimes"] if r not in {reg for reg, _ in per_regime}]
    overall = overall_verdict([v.split(" (")[0] for _, v in per_regime])
    if missing and overall == "established":
        overall = "not settled"  # a regime of the claim has no result (yet)
    return L, entries, half_widths, {"overall": overall, "per_regime": per_regime, "missing": missing}


def _claim_summary(spec: dict, claim_rows: dict[str, dict]) -> list[str]:
    """One bullet per claim with its overall verdict and the verdict in each of its regimes."""
    L = []
    for key, claim in spec["claims"].items():
        cr = claim_rows[key]
        if not claim["regimes"]:
            L.append(f"- **({key}) {claim['text']}**: not part of this study config.")
            continue
        regs = ", ".join([f"{r}: {v}" for r, v in cr["per_regime"]] + [f"{r}: no result" for r in cr["missing"]])
        L.append(
            f"- **({key}) {claim['text']}: {cr['overall'].upper()}** "
            f"(decided by {spec['methods'][claim['onego']]['label']} vs {spec['methods'][claim['reference']]['label']}; {regs})."
        )
    return L + [""]


def _calibration_stages(spec: dict, evals: _Evals) -> list[str]:
    """For claim (c): the calibration stages and calibrator parameters each multi-task method's runs needed."""
    if "c" not in spec["claims"]:
        return []
    stages = []
    for regime in spec["claims"]["c"]["regimes"]:
        for m in spec["regimes"].get(regime, {}).get("methods", []):
            runs = _ok(evals.get(regime, {}).get(m, {}))
            st = sorted({r["calibrator_info"].get("calibration_stages") for r in runs.values()} - {None})
            npar = sorted({r["calibrator_info"].get("num_params") for r in runs.values()} - {None})
            if runs:
                stages.append(f"{spec['methods'][m]['label']}: calibration stages {st}, calibrator parameters {npar}")
    if not stages:
        return []
    return [
        "Calibration stages a final multi-task model needs (from the trainer's `calibrator_info`): "
        + "; ".join(stages)
        + ".",
        "",
    ]


def _claims_section(
    spec: dict, cache: Path, evals: _Evals
) -> tuple[list[str], dict[str, list[dict[str, Any]]], dict[str, dict], list[float]]:
    """The "Verdicts on the seed paper's claims" section, with the claims' raw entries, their verdicts and every
    comparison's median per-seed bootstrap half-width."""
    margin, margin_acc = spec["margin_ece"], spec["margin_acc"]
    L = ["## Verdicts on the seed paper's claims", ""]
    L += [
        f"Paired by seed, test split, method − reference, in percentage points; [95 % t interval across seeds]; TOST p with its 90 % "
        f"interval (equivalence margin ±{100 * margin:g} pt ECE); accuracy non-inferiority margin {100 * margin_acc:g} pt.",
        "",
    ]
    L += [
        "The column 'plain CE vs the reference' applies the same test to plain CE: where CE itself matches the post-hoc "
        'reference, the regime has nothing to calibrate and a "matches" there says little about the calibrator.',
        "",
    ]
    L += [
        "| claim | regime | comparison | seeds | ΔECE pt [95 % CI] | TOST p [90 % CI] | Δacc pt [95 % CI] | per-seed bootstrap: seeds with ΔECE CI > 0 / < 0 (median half-width pt) | verdict | plain CE vs the reference: ΔECE pt [95 % CI], verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    claims_raw: dict[str, list[dict[str, Any]]] = {}
    claim_rows: dict[str, dict] = {}
    half_widths: list[float] = []
    for key, claim in spec["claims"].items():
        rows, entries, hws, claim_rows[key] = _claim_results(spec, cache, evals, key, claim)
        L += rows
        half_widths += hws
        if entries:
            claims_raw[key] = entries
    L += [""]
    L += _claim_summary(spec, claim_rows)
    L += _calibration_stages(spec, evals)
    return L, claims_raw, claim_rows, half_widths


def _regime_row(spec: dict, m: str, rec: dict | None, runs: _Runs, refs: tuple[_Runs, _Runs]) -> str:
    """One method's row of its regime's results table."""
    metric = spec["tuning"]["metric"]
    ok = _ok(runs)
    tv = rec["selection"]["val_metrics"].get(metric) if rec else None
    cells = [
        spec["methods"][m]["label"],
        _hparams(rec) if rec else "(not tuned)",
        f"{tv:.4f}" if tv is not None else "n/a",
        f"{len(ok)}/{len(runs)}",
        mean_std_str([r["test"]["accuracy"] for r in ok.values()], 100),
        mean_std_str([r["test"]["ece"] for r in ok.values()], 100),
        mean_std_str([r["test"]["nll"] for r in ok.values()], 1.0, 3),
    ]
    for ref in refs:
        if ref is runs or not ref:
            cells += ["–", "–"]
        else:
            cells += [
                _ci_str(paired_ci(paired(runs, ref, "ece"))),
                _ci_str(paired_ci(paired(runs, ref, "accuracy"))),
            ]
    cells += [
        f"{_median([r['wall_s'] for r in ok.values()]):.1f}",
        f"{_median([r['epochs_run'] for r in ok.values()]):.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def _method_raw(rec: dict | None, runs: _Runs) -> dict[str, Any]:
    """A method's raw record: its tuning outcome and its runs, each run's epoch times cut to their median."""
    slim = {
        seed: {
            **{k: v for k, v in r.items() if k != "epoch_times"},
            "median_epoch_s": _median(r.get("epoch_times") or []),
        }
        for seed, r in runs.items()
    }
    return {
        "tuned": {k: rec[k] for k in ("params", "run_config", "selection", "leaderboard", "wall_s", "sweep")}
        if rec
        else None,
        "runs": slim,
    }


def _regime_tables(spec: dict, tuned: _Tuned, evals: _Evals) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The "Results per regime" section (one table per regime) and each regime's raw record per method."""
    metric, ev = spec["tuning"]["metric"], spec["evaluation"]
    L = ["## Results per regime", ""]
    L += [
        f"Test metrics of the chosen configuration, mean ± std over the evaluation seeds; Δ columns paired by seed against "
        f"{spec['methods']['ts_val']['label']} and plain CE [95 % t interval]. 'tuned' = the service's champion on validation "
        f"{metric.removeprefix('val_').upper()} (its value on the tuning seed; for post-hoc-on-validation methods the cross-fitted value). "
        f"Wall s = median seconds per evaluation run (1 thread, {ev['workers']} runs side by side on a shared machine); "
        "'epochs' = median epochs run (early stopping)."
    ]
    L += [""]
    regimes_raw: dict[str, dict[str, Any]] = {}
    for regime, reg in spec["regimes"].items():
        L += [f"### {regime}: {reg['label']}", ""]
        L += [f"Run config: `{json.dumps(reg['run'], separators=(',', ':'))}`.", ""]
        L += [
            "| method | tuned (chosen) | tuning val NLL | seeds ok | test acc % | test ECE % | test NLL | ΔECE vs TS-val pt | Δacc vs TS-val pt | ΔECE vs CE pt | Δacc vs CE pt | wall s | epochs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        # the very objects in evals: _regime_row finds the reference's own row by identity (no Δ against itself)
        refs = (evals[regime].get("ts_val", {}), evals[regime].get("ce", {}))
        reg_raw = {}
        for m in reg["methods"]:
            rec = tuned[regime].get(m)
            runs = evals[regime].get(m, {})
            L.append(_regime_row(spec, m, rec, runs, refs))
            reg_raw[m] = _method_raw(rec, runs)
        fails = [
            f"{m} seed {s}: {r['status']} ({r['reason']})"
            for m in reg["methods"]
            for s, r in evals[regime].get(m, {}).items()
            if r["status"] != "completed"
        ]
        if fails:
            L += ["", "Runs that did not complete: " + "; ".join(fails)]
        L += [""]
        regimes_raw[regime] = reg_raw
    return L, regimes_raw


def _task_names(test: dict[str, Any]) -> list[str]:
    """The tasks of a multi-task run's test metrics (those with both `<task>_ece` and `<task>_accuracy`)."""
    tasks = sorted(
        {
            k.removesuffix("_ece")
            for k in test
            if k.endswith("_ece") and k.count("_") == 1 and k.split("_")[0] not in ("classwise",)
        }
    )
    return [t for t in tasks if f"{t}_accuracy" in test]


def _per_task_tables(spec: dict, evals: _Evals) -> list[str]:
    """Per multi-task regime, a table of each task's test accuracy and ECE per method (ΔECE against TS-val)."""
    L: list[str] = []
    for regime, reg in spec["regimes"].items():
        some = next((r for runs in evals[regime].values() for r in _ok(runs).values()), None)
        if some is None:
            continue
        tasks = _task_names(some["test"])
        if not tasks:
            continue
        L += [f"### {regime}: per task (test, mean ± std over seeds; ΔECE vs TS-val paired [95 % CI])", ""]
        L += [
            "| task | " + " | ".join(spec["methods"][m]["label"] for m in reg["methods"]) + " |",
            "|---|" + "---|" * len(reg["methods"]),
        ]
        for t in tasks:
            cells = []
            for m in reg["methods"]:
                ok = _ok(evals[regime][m])
                s = f"acc {mean_std_str([r['test'][f'{t}_accuracy'] for r in ok.values()], 100)}, ECE {mean_std_str([r['test'][f'{t}_ece'] for r in ok.values()], 100)}"
                if m != "ts_val" and evals[regime].get("ts_val"):
                    s += f", ΔECE {_ci_str(paired_ci(paired(evals[regime][m], evals[regime]['ts_val'], f'{t}_ece')))}"
                cells.append(s)
            L.append(f"| {t} | " + " | ".join(cells) + " |")
        L += [""]
    return L


def _hypergradient_section(spec: dict, tuned: _Tuned, evals: _Evals) -> list[str]:
    """The first-order vs unrolled hypergradient comparison (when the config names the pair): accuracy,
    calibration and cost, paired by seed."""
    hg = spec.get("hypergradient")
    if not hg:
        return []
    L = ["## First-order vs unrolled hypergradient (`train.hypergradient`)", ""]
    L += [
        "Both tuned the same way (same trials, same search space), temperature calibrator on `holdout:0.1`. Δ = unrolled − first-order, "
        "paired by seed [95 % CI]; cost = median over seeds of the paired ratio of the runs' wall times (training + per-epoch "
        "validation), and of the median epoch times.",
        "",
    ]
    L += [
        "| regime | chosen (first-order) | chosen (unrolled) | seeds | Δacc pt | ΔECE pt | ΔNLL | wall-time ratio | epoch-time ratio | unrolled / CE epoch-time ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for regime in spec["regimes"]:
        fo, un = evals[regime].get(hg["first_order"]), evals[regime].get(hg["unrolled"])
        if not fo or not un:
            continue
        seeds_c = sorted(set(_ok(fo)) & set(_ok(un)))
        ratio = _median([un[s]["wall_s"] / fo[s]["wall_s"] for s in seeds_c])
        eratio = _median([_median(un[s]["epoch_times"]) / _median(fo[s]["epoch_times"]) for s in seeds_c])
        ce = _ok(evals[regime].get("ce", {}))
        ce_ratio = _median([_median(un[s]["epoch_times"]) / _median(ce[s]["epoch_times"]) for s in seeds_c if s in ce])
        L.append(
            f"| {regime} | {_hparams(tuned[regime][hg['first_order']])} | {_hparams(tuned[regime][hg['unrolled']])} | {len(seeds_c)} "
            f"| {_ci_str(paired_ci(paired(un, fo, 'accuracy')))} | {_ci_str(paired_ci(paired(un, fo, 'ece')))} "
            f"| {_ci_str(paired_ci(paired(un, fo, 'nll')), 1.0, 3)} | {ratio:.2f}x | {eratio:.2f}x | {ce_ratio:.2f}x |"
        )
    L += [""]
    return L


def _caveats_section(spec: dict, half_widths: Sequence[float]) -> list[str]:
    """The "Caveats and what this study does not cover" section."""
    margin = spec["margin_ece"]
    L = ["## Caveats and what this study does not cover", ""]
    all_methods = list(spec["methods"])
    for regime, reg in spec["regimes"].items():
        absent = [m for m in all_methods if m not in reg["methods"]]
        if absent:
            L.append(
                f"- {regime} runs {len(reg['methods'])} of the {len(all_methods)} methods (not: {', '.join(absent)})."
            )
    L += [
        "- Tuning uses one seed (its split and initialisation): the configuration that wins on that seed's validation split "
        "can be fragile on other seeds, and the evaluation seeds show it (a method's 'tuning val NLL' against its test NLL). "
        "All methods are exposed to this alike; tuning on several seeds would cost a multiple of the budget.",
        "- The methods with the same search space (CE, CE + early stopping, the post-hoc baselines) saw the same Optuna "
        "draws (same sampler seed), so their differences come from the method, not the draws; one-go and the head-lr control "
        "search one more dimension with the same number of trials (the extra hyperparameter is part of their cost).",
        "- ECE is the plug-in 15-bin estimator, which is biased upwards for well-calibrated models and noisy at these test "
        f"sizes: the per-seed bootstrap half-widths of the ECE differences are {_range_pt(half_widths)} pt, against an "
        f"equivalence margin of {100 * margin:g} pt, so equivalence can only be shown through the average over seeds, "
        "and only where the test split is large.",
        "- Selection is by validation NLL for every method; a study selecting by validation ECE could rank the methods differently.",
        "- The GPU configs (benchmarks/studies/method_study_configs/cifar10_resnet18.yaml, cifar100_wrn28_10.yaml) were not run here.",
        "",
    ]
    return L


def _tuning_trials_section(spec: dict, tuned: _Tuned) -> list[str]:
    """The "Tuning trials" section: every completed trial's validation metric, per regime and method."""
    metric = spec["tuning"]["metric"]
    L = ["## Tuning trials (validation, tuning seed)", ""]
    L += [
        f"Every trial the service ran, per regime and method: validation {metric.removeprefix('val_').upper()} of the completed trials "
        "(sorted), the champion first. Raw leaderboards (all metrics, test included, never used) are in method_study.json.gz.",
        "",
    ]
    for regime, reg in spec["regimes"].items():
        parts = []
        for m in reg["methods"]:
            rec = tuned[regime].get(m)
            if not rec:
                continue
            vals = sorted(
                r[metric] for r in rec["leaderboard"] if r.get("status") == "completed" and r.get(metric) is not None
            )
            n = len(rec["leaderboard"])
            parts.append(f"{m}: {len(vals)}/{n} completed, val NLL " + ", ".join(f"{v:.3f}" for v in vals))
        L += [f"- **{regime}**: " + "; ".join(parts)]
    L += [""]
    return L


def build_report(spec: dict, cache: Path, command: str, quick: bool, timing: dict[str, Any]) -> tuple[str, dict]:
    """The study's Markdown report and its raw record, from the cache alone."""
    tuned, evals = _load_results(spec, cache)
    L = _header_lines(spec, cache, command, quick, timing)
    L += _procedure_section(spec, cache)
    L += _budget_section(spec, cache, timing)
    claim_lines, claims_raw, verdicts, half_widths = _claims_section(spec, cache, evals)
    L += claim_lines
    tables, regimes_raw = _regime_tables(spec, tuned, evals)
    L += tables
    L += _per_task_tables(spec, evals)
    L += _hypergradient_section(spec, tuned, evals)
    L += _caveats_section(spec, half_widths)
    L += _tuning_trials_section(spec, tuned)
    raw: dict[str, Any] = {
        "spec": spec,
        "command": command,
        "regimes": regimes_raw,
        "claims": claims_raw,
        "timing": timing,
        "verdicts": verdicts,
    }
    return "\n".join(L) + "\n", raw


# ==========================================================================================
# main
# ==========================================================================================
def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="study config (default: the CPU study)")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: tiny data, 2 trials, 3 seeds; cache and report in a temp dir"
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="default benchmarks/.cache/method_study/<config name>")
    p.add_argument("--out-dir", type=Path, default=None, help="default benchmarks/results (a temp dir with --quick)")
    p.add_argument("--regimes", type=str, default=None, help="comma-separated subset of the config's regimes")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the cache, run nothing")
    p.add_argument("--note", type=str, default="", help="a line for the report's budget section")
    return p.parse_args(argv)


def _shown_command(argv: list[str] | None) -> str:
    """The command line for the report, with the --note text replaced by NOTE."""
    raw_args = list(argv if argv is not None else sys.argv[1:])
    shown = [
        ("NOTE" if i > 0 and raw_args[i - 1] == "--note" else a) for i, a in enumerate(raw_args)
    ]  # the note is printed below
    return command_line(__file__, shown)


def _study_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The study config with --quick and --regimes applied."""
    spec = load_spec(args.config)
    if args.quick:
        spec = _merge(spec, QUICK)
        spec["name"] = "quick"
    spec["_path"] = str(args.config.resolve())
    if args.regimes:
        keep = [r for r in args.regimes.split(",") if r]
        spec["regimes"] = {k: v for k, v in spec["regimes"].items() if k in keep}
    return spec


def _study_dirs(args: argparse.Namespace, spec: dict[str, Any]) -> tuple[Path, Path]:
    """The cache and report folders, created (both in a fresh temp dir with --quick unless given)."""
    tmp = Path(tempfile.mkdtemp(prefix="method_study_quick_")) if args.quick else None
    cache = (args.cache_dir or (tmp / "cache" if tmp else DEFAULT_CACHE / spec["name"])).resolve()
    out_dir = args.out_dir or (tmp if tmp else DEFAULT_OUT)
    cache.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    return cache, out_dir


def _load_timing(cache: Path, note: str) -> dict[str, Any]:
    """The cache's timing record, with this invocation's torch version and note."""
    import torch

    # wall times accumulate over the invocations that filled this cache (a resumed study adds up)
    timing_path = cache / "timing.json"
    timing: dict[str, Any] = (
        json.loads(timing_path.read_text())
        if timing_path.is_file()
        else {"tune_wall_s": {}, "eval_wall_s": {}, "invocations": []}
    )
    timing.update({"torch": torch.__version__, "note": note})
    return timing


def _is_complete(spec: dict[str, Any], cache: Path) -> bool:
    """Whether every (regime, method) is tuned and evaluated on every seed in the cache."""
    return all(
        (cache / "tune" / r / f"{m}.json").is_file() and eval_path(cache, r, m, seed).is_file()
        for r, reg in spec["regimes"].items()
        for m in reg["methods"]
        for seed in spec["evaluation"]["seeds"]
    )


def _run_study(spec: dict[str, Any], cache: Path, command: str, timing: dict[str, Any], t_start: float) -> None:
    """Tune and evaluate every regime (cached steps are skipped), recording wall times in the cache's timing.json."""
    timing_path = cache / "timing.json"

    def add(kind: str, regime: str, dt: float) -> None:
        timing[kind][regime] = timing[kind].get(regime, 0.0) + dt
        write_json(timing_path, timing)

    now = utc_now()
    inv = {"started_utc": now, "command": command, "wall_s": 0.0}
    timing["invocations"].append(inv)
    timing.setdefault("first_started_utc", now)

    def progress() -> None:  # an invocation killed from outside keeps the time up to its last step
        inv["wall_s"] = time.perf_counter() - t_start
        timing["last_progress_utc"] = utc_now()
        write_json(timing_path, timing)

    progress()
    for regime, reg in spec["regimes"].items():
        t0 = time.perf_counter()
        tuned = {}
        for m in reg["methods"]:
            tuned[m] = tune_one(spec, regime, m, cache)
            progress()
        add("tune_wall_s", regime, time.perf_counter() - t0)
        import ray

        if ray.is_initialized():
            ray.shutdown()  # the cores go to the evaluation workers
        t0 = time.perf_counter()
        run_evaluations(spec, regime, tuned, cache)
        add("eval_wall_s", regime, time.perf_counter() - t0)
        progress()
        print(
            f"[done] {regime}: tuning {timing['tune_wall_s'][regime]:.0f}s, evaluation {timing['eval_wall_s'][regime]:.0f}s "
            f"(cumulative over invocations)",
            flush=True,
        )


def _write_report(
    spec: dict[str, Any], cache: Path, command: str, quick: bool, timing: dict[str, Any], out_dir: Path
) -> None:
    """Build the report from the cache, write it (Markdown and gzipped raw JSON) to `out_dir` and print it."""
    timing["total_wall_s"] = sum(i["wall_s"] or 0.0 for i in timing["invocations"])
    text, raw = build_report(spec, cache, command, quick, timing)
    stem = "method_study" if spec["name"] == "cpu" else f"method_study_{spec['name']}"
    (out_dir / f"{stem}.md").write_text(text)
    write_json(out_dir / f"{stem}.json.gz", raw, compact=True)  # gzipped: benchmarks/results under 15 MB (issue #31)
    print(text, flush=True)
    print(f"wrote {out_dir / (stem + '.md')}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run (or resume) the study's tuning and evaluations, then write and print the report."""
    args = _parse_args(argv)
    command = _shown_command(argv)
    spec = _study_spec(args)
    cache, out_dir = _study_dirs(args, spec)
    print(f"method study {spec['name']}: cache {cache}, report -> {out_dir}", flush=True)
    timing = _load_timing(cache, args.note)
    t_start = time.perf_counter()
    complete = _is_complete(spec, cache)
    if complete and not args.report_only:
        print("everything is cached: rebuilding the report only", flush=True)
    if not args.report_only and not complete:
        _run_study(spec, cache, command, timing, t_start)
    _write_report(spec, cache, command, args.quick, timing, out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

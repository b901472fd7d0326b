"""Method study v2: calibration methods where calibration matters (issue #21, protocol B).

    python -m benchmarks.studies.method_study_v2                    # check, tune, evaluate, report (resumable)
    python -m benchmarks.studies.method_study_v2 --regimes overconf # one regime
    python -m benchmarks.studies.method_study_v2 --report-only      # rebuild the report from the raw files

The protocol is `benchmarks/studies/protocols/method_study_v2.md` (committed before any result); the
numbers it fixes are in `benchmarks/studies/protocols/method_study_v2.yaml`, the only input here.

Three stages, each run by `--workers` processes side by side (one torch thread each, deterministic
algorithms on):
1. check: plain CE and TS on validation on the check seeds; a regime is kept if CE minus TS is
   >= `check.min_gap` test ECE with a 95 % t interval excluding 0;
2. tune (protocol B: the regime's backbone fixed for every method): the one-go calibrator lr by
   Optuna's seeded TPE (`tuning.startup_trials` random, the rest model-guided), objective the mean
   validation NLL over the tuning seeds; post-hoc methods and CE have nothing to tune;
3. evaluate: every method at its chosen configuration on every evaluation seed.

Every run is one JSON file under benchmarks/results/method_study_<name>/<regime>/<stage>/<method>/
(evaluation runs also an .npz of their test predictions: protocol B's runs the probabilities, later runs
each row's top-label confidence and correctness, all the per-seed ECE bootstrap reads); finished files are never rerun, so the
same command resumes the study, across sessions too (the raw files are committed). The report
(`benchmarks/results/method_study_v2.md` and `.json`) is rebuilt from those files alone, with the
verdict rules of the protocol (`benchmarks/studies/method_study.py`: `matches_verdict`, `overall_verdict`).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    PROTOCOLS,
    RESULTS_DIR,
    ROOT,
    command_line,
    host_line,
    json_path,
    read_json,
    utc_now,
    write_json,
    write_text,
)
from benchmarks.studies.method_study import (
    matches_verdict,
    overall_verdict,
    paired_ci,
    per_seed_bootstrap,
    top_label_arrays,
)
from benchmarks.studies.study_compact import compact_dir, raw_or_compact

PROTOCOL = PROTOCOLS / "method_study_v2.yaml"
CHECK_METHODS = ("ce", "ts_val")


def load_spec(path: Path = PROTOCOL) -> dict[str, Any]:
    """The protocol's YAML, with its claims' regimes checked against its regimes."""
    import yaml

    spec = yaml.safe_load(path.read_text())
    spec["_path"] = str(path.resolve())
    for name, claim in spec["claims"].items():
        unknown = [r for r in claim["regimes"] if r not in spec["regimes"]]
        if unknown or claim["method"] not in spec["methods"] or claim["reference"] not in spec["methods"]:
            raise SystemExit(f"{path}: claim {name} names an unknown regime or method")
    return spec


def protocol_files(spec: dict) -> tuple[Path, Path]:
    """The protocol's YAML and its Markdown text (beside it, same stem)."""
    y = Path(spec.get("_path", PROTOCOL))
    return y, y.with_suffix(".md")


def study_name(spec: dict) -> str:
    """The results' file stem: method_study_<name> (v2 = protocol B, v2a = protocol A)."""
    return f"method_study_{spec['name']}"


def run_path(raw: Path, regime: str, stage: str, method: str, name: str) -> Path:
    """Where one run's JSON lives."""
    return raw / regime / stage / method / f"{name}.json"


def eval_path(raw: Path, regime: str, method: str, seed: int) -> Path:
    """An evaluation run's JSON (its .npz sits beside it); the signature method_study.per_seed_bootstrap expects."""
    return run_path(raw, regime, "eval", method, f"seed{seed}")


def run_config(spec: dict, regime: str, method: str, seed: int, params: dict[str, float] | None = None) -> dict:
    """The calib_core RunConfig (as a dict) of one run: the regime's backbone, the method's trainer options."""
    reg, m = spec["regimes"][regime], spec["methods"][method]
    cfg = json.loads(json.dumps(reg["run"]))
    cfg.update(seed=int(seed), device="cpu", num_threads=int(spec.get("threads", 1)))
    cfg["train"] = {**cfg.get("train", {}), **m["train"], **(params or {})}
    return cfg


# ------------------------------------------------------------------------------------------
# one run (in a worker process)
# ------------------------------------------------------------------------------------------
def _secondary(probs: Any, labels: Any) -> dict[str, float]:
    """Smooth ECE and debiased L2 calibration error of one task's test predictions."""
    from calib_core.metrics import debiased_l2_ce, smooth_ece

    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels)
    return {"smooth_ece": float(smooth_ece(p, y)), "debiased_l2_ce": float(debiased_l2_ce(p, y))}


def task_secondary(probs: Sequence[Any], labels: Any) -> dict[str, float]:
    """`_secondary` per task on its labelled rows (labels (N, T), -1 = missing), averaged over the tasks."""
    labels = np.asarray(labels)
    sec = [_secondary(np.asarray(p)[labels[:, t] >= 0], labels[labels[:, t] >= 0, t]) for t, p in enumerate(probs)]
    return {k: float(np.mean([s[k] for s in sec])) for k in sec[0]}


def execute(job: dict[str, Any]) -> dict[str, Any]:
    """Train one run, write its JSON (and for evaluation runs the test probabilities), return the record."""
    import torch

    torch.set_num_threads(job["config"]["num_threads"])
    torch.use_deterministic_algorithms(True)
    from calib_core.config import RunConfig
    from calib_core.data import load_dataset
    from calib_core.trainer import make_trainer

    cfg = RunConfig.model_validate(job["config"])
    data = load_dataset(cfg.data, cfg.seed)
    t0 = time.perf_counter()
    res = make_trainer(cfg, data, "cpu").fit()
    rec: dict[str, Any] = {
        **{k: job[k] for k in ("regime", "stage", "method", "seed")},
        "params": job.get("params", {}),
        "status": res.status,
        "reason": res.reason,
        "epochs_run": res.epochs_run,
        "best_epoch": (res.best or {}).get("epoch"),
        "val": res.val_metrics,
        "test": dict(res.test_metrics),
        "wall_s": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
        "finished_utc": utc_now(),
    }
    path = Path(job["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    if res.status == "completed" and job["stage"] != "tune":
        if getattr(res, "task_test_probs", None) is not None:
            probs = [p.numpy() for p in res.task_test_probs]
            labels = res.task_test_labels.numpy()
            rec["test"].update(task_secondary(probs, labels))
            arrays = {"task_labels": labels.astype(np.int16)}
            for t, p in enumerate(probs):
                arrays.update(top_label_arrays(p, labels[:, t], f"task{t}_"))
        else:
            rec["test"].update(_secondary(res.test_probs.numpy(), res.test_labels.numpy()))
            labels = res.test_labels.numpy()
            arrays = {"labels": labels.astype(np.int16), **top_label_arrays(res.test_probs.numpy(), labels)}
        if job["stage"] == "eval":
            np.savez_compressed(path.with_suffix(".npz"), **arrays)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, default=str, indent=1))
    tmp.replace(path)  # the JSON marks the run done: written last
    return rec


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _run_pool(jobs: list[dict[str, Any]], workers: int, label: str) -> None:
    jobs = [j for j in jobs if not Path(j["path"]).is_file()]
    if not jobs:
        return
    print(f"[{label}] {len(jobs)} runs on {workers} workers", flush=True)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, maxtasksperchild=40) as pool:
        for i, r in enumerate(pool.imap_unordered(execute, jobs), 1):
            te = r.get("test") or {}
            print(
                f"[{label} {i}/{len(jobs)} {time.perf_counter() - t0:5.0f}s] {r['regime']} {r['method']} "
                f"seed={r['seed']} {r['status']} acc={te.get('accuracy', math.nan):.4f} "
                f"ece={te.get('ece', math.nan):.4f} ({r['wall_s']:.1f}s)",
                flush=True,
            )


# ------------------------------------------------------------------------------------------
# stage 1: the regime check
# ------------------------------------------------------------------------------------------
def check_jobs(spec: dict, regime: str, raw: Path) -> list[dict[str, Any]]:
    """The check runs of one regime: CE and TS on validation on every check seed."""
    return [
        {
            "regime": regime,
            "stage": "check",
            "method": m,
            "seed": s,
            "config": run_config(spec, regime, m, s),
            "path": str(run_path(raw, regime, "check", m, f"seed{s}")),
        }
        for s in spec["check"]["seeds"]
        for m in CHECK_METHODS
    ]


def check_result(spec: dict, regime: str, raw: Path) -> dict[str, Any]:
    """CE minus TS-on-validation test ECE over the check seeds, and whether the regime is kept."""
    runs = {
        m: {s: _load(run_path(raw, regime, "check", m, f"seed{s}")) for s in spec["check"]["seeds"]}
        for m in CHECK_METHODS
    }
    seeds = [
        s
        for s in spec["check"]["seeds"]
        if all(runs[m][s] and runs[m][s]["status"] == "completed" for m in CHECK_METHODS)
    ]
    d = [runs["ce"][s]["test"]["ece"] - runs["ts_val"][s]["test"]["ece"] for s in seeds]
    ci = paired_ci(d)
    done = len(seeds) == len(spec["check"]["seeds"])
    kept = done and ci["mean"] >= spec["check"]["min_gap"] and ci["lo"] > 0
    return {
        "seeds": seeds,
        "complete": done,
        "ce_ece": [runs["ce"][s]["test"]["ece"] for s in seeds],
        "ts_ece": [runs["ts_val"][s]["test"]["ece"] for s in seeds],
        "ce_acc": [runs["ce"][s]["test"]["accuracy"] for s in seeds],
        "diff": ci,
        "kept": kept,
    }


# ------------------------------------------------------------------------------------------
# stage 2: tuning (protocol B)
# ------------------------------------------------------------------------------------------
def _trial_jobs(spec: dict, regime: str, method: str, i: int, params: dict, raw: Path) -> list[dict[str, Any]]:
    return [
        {
            "regime": regime,
            "stage": "tune",
            "method": method,
            "seed": s,
            "params": params,
            "config": run_config(spec, regime, method, s, params),
            "path": str(run_path(raw, regime, "tune", method, f"trial{i:02d}_seed{s}")),
        }
        for s in spec["tuning"]["seeds"]
    ]


def tpe_search(
    ranges: dict[str, Sequence[float]],
    trials: int,
    startup_trials: int,
    sampler_seed: int,
    evaluate: Any,
    replay: Any = None,
) -> list[dict[str, Any]]:
    """Optuna's seeded TPE over log-uniform `ranges` ({name: (lo, hi)}), `trials` trials in order, the first
    `startup_trials` random. `evaluate(i, params) -> value` (inf = failed: told as FAIL); `replay(i)` may return
    stored parameters to enqueue for trial i (protocol A's resumption). Returns [{trial, params, value}]."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=int(sampler_seed), n_startup_trials=int(startup_trials))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    dists = {k: optuna.distributions.FloatDistribution(lo, hi, log=True) for k, (lo, hi) in ranges.items()}
    out = []
    for i in range(int(trials)):
        fixed = replay(i) if replay is not None else None
        if fixed is not None:
            study.enqueue_trial(fixed)
        study_trial = study.ask(dists)
        params = {k: float(v) for k, v in study_trial.params.items()}
        value = float(evaluate(i, params))
        study.tell(
            study_trial,
            value if math.isfinite(value) else None,
            state=None if math.isfinite(value) else optuna.trial.TrialState.FAIL,
        )
        out.append({"trial": i, "params": params, "value": value})
    return out


def tune_study(task: dict[str, Any]) -> dict[str, Any]:
    """Tune one (regime, method) to the end, trials in order, each trial's seeds in this process."""
    spec, regime, method, raw = task["spec"], task["regime"], task["method"], Path(task["raw"])
    tu, ranges = spec["tuning"], spec["methods"][method]["tune"]

    def tfile(i: int) -> Path:
        return raw / regime / "tune" / method / f"trial{i:02d}.json"

    def replay(i: int) -> dict[str, float] | None:
        # resume: the trial's parameters were drawn before it ran; replay them
        return json.loads(tfile(i).read_text())["params"] if tfile(i).is_file() else None

    def evaluate(i: int, ot_params: dict[str, float]) -> float:
        if not tfile(i).is_file():
            write_json(tfile(i), {"trial": i, "params": ot_params, "startup": i < int(tu["startup_trials"])})
        out = []
        for job in _trial_jobs(spec, regime, method, i, ot_params, raw):
            out.append(_load(Path(job["path"])) or execute(job))
        ok = [r for r in out if r["status"] == "completed"]
        value = statistics.fmean(r["val"][tu["metric"]] for r in ok) if len(ok) == len(out) else math.inf
        print(f"[tune] {regime} {method} trial {i}: {ot_params} val {tu['metric']} {value:.4f}", flush=True)
        return value

    found = tpe_search(ranges, tu["trials"], tu["startup_trials"], tu["seeds"][0], evaluate, replay)
    trials = [
        {**t, "runs": [j["path"] for j in _trial_jobs(spec, regime, method, t["trial"], t["params"], raw)]}
        for t in found
    ]
    done = [t for t in trials if math.isfinite(t["value"])]
    best = min(done, key=lambda t: t["value"])
    chosen = {"regime": regime, "method": method, "params": best["params"], "value": best["value"], "trials": trials}
    write_json(raw / regime / "tune" / method / "chosen.json", chosen)
    return chosen


def chosen_params(spec: dict, regime: str, method: str, raw: Path) -> dict[str, float] | None:
    """The tuned parameters of a method ({} for methods with nothing to tune; None while not tuned)."""
    if "tune" not in spec["methods"][method]:
        return {}
    rec = _load(raw / regime / "tune" / method / "chosen.json")
    return rec["params"] if rec else None


# ------------------------------------------------------------------------------------------
# stage 3: evaluation
# ------------------------------------------------------------------------------------------
def eval_jobs(spec: dict, regime: str, raw: Path) -> list[dict[str, Any]]:
    """Every method at its chosen configuration on every evaluation seed (seed-major)."""
    jobs = []
    for s in spec["evaluation"]["seeds"]:
        for m in spec["methods"]:
            params = chosen_params(spec, regime, m, raw)
            if params is None:
                continue
            jobs.append(
                {
                    "regime": regime,
                    "stage": "eval",
                    "method": m,
                    "seed": s,
                    "params": params,
                    "config": run_config(spec, regime, m, s, params),
                    "path": str(eval_path(raw, regime, m, s)),
                }
            )
    return jobs


def load_evals(spec: dict, regime: str, method: str, raw: Path) -> dict[int, dict]:
    """{seed: record} of the finished evaluation runs of one method."""
    out = {}
    for s in spec["evaluation"]["seeds"]:
        r = _load(eval_path(raw, regime, method, s))
        if r is not None:
            out[s] = r
    return out


# ------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------
def _ms(vals: Sequence[float], scale: float = 100.0) -> str:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return "n/a"
    sd = statistics.stdev(vals) if len(vals) > 1 else math.nan
    return f"{scale * statistics.fmean(vals):.2f} ± {scale * sd:.2f}"


def _ci(c: dict[str, float], scale: float = 100.0) -> str:
    if not math.isfinite(c.get("mean", math.nan)) or not math.isfinite(c.get("lo", math.nan)):
        return "n/a"
    return f"{scale * c['mean']:+.2f} [{scale * c['lo']:+.2f}, {scale * c['hi']:+.2f}]"


def better_verdict(d_ece: Sequence[float]) -> dict[str, Any]:
    """'better' claims: established if the 95 % interval of the ECE difference lies below 0, refuted if above."""
    c = paired_ci(d_ece)
    if c["n"] < 2 or not math.isfinite(c["lo"]):
        v = "not settled"
    elif c["hi"] < 0:
        v = "established"
    elif c["lo"] > 0:
        v = "refuted"
    else:
        v = "not settled"
    return {"verdict": v, "ece": c}


def _deviations(spec: dict) -> str:
    text = protocol_files(spec)[1].read_text()
    m = re.search(r"^## Deviations\n(.*)\Z", text, flags=re.S | re.M)
    return m.group(1).strip() if m else "(none)"


def _header_lines(spec: dict, raw: Path, command: str, keep_all: bool, raw_label: str | None) -> list[str]:
    """The report's title and its opening paragraph: protocol, command, raw files, machine, margins."""
    margin, margin_acc, alpha = spec["margin_ece"], spec["margin_acc"], spec["alpha"]
    yaml_path, md_path = protocol_files(spec)
    L = [f"# {spec.get('title', 'Method study v2: where calibration matters (protocol B: backbone fixed)')}", ""]
    if keep_all:
        L += ["**SMOKE RUN (--keep-all): every regime kept whatever its check says; the numbers mean nothing.**", ""]
    L += [
        f"Protocol (committed before any result): `{md_path.relative_to(ROOT)}` and `{yaml_path.relative_to(ROOT)}`. "
        f"Command: `{command}`. Raw per-run files: `{raw_label or os.path.relpath(raw, ROOT) + '/'}`. Machine: {host_line()}. "
        f"Margins: ECE {100 * margin:g} pt (equivalence), accuracy {100 * margin_acc:g} pt (non-inferiority); "
        f"alpha {alpha}.",
        "",
    ]
    return L


def _check_section(spec: dict, raw: Path, keep_all: bool) -> tuple[list[str], dict[str, Any], list[str]]:
    """Section 1, the regime check table; also each regime's check result and the regimes kept."""
    L = [
        "## 1. Regime check: does plain CE need calibration here?",
        "",
        f"Plain CE minus post-hoc TS on validation, test ECE, {len(spec['check']['seeds'])} check seeds "
        f"({spec['check']['seeds'][0]}-{spec['check']['seeds'][-1]}, never used again); kept if the mean is "
        f">= {100 * spec['check']['min_gap']:g} pt and its 95 % interval excludes 0.",
        "",
        "| regime | CE test acc % | CE test ECE % | TS-val test ECE % | CE - TS, pt [95 % CI] | kept |",
        "|---|---|---|---|---|---|",
    ]
    checks: dict[str, Any] = {}
    kept = []
    for r, reg in spec["regimes"].items():
        c = check_result(spec, r, raw)
        c["kept"] = c["kept"] or (keep_all and c["complete"])
        checks[r] = c
        status = "yes" if c["kept"] else ("no (dropped)" if c["complete"] else f"pending ({len(c['seeds'])} seeds)")
        if c["kept"]:
            kept.append(r)
        L.append(
            f"| {r}: {reg['label']} | {_ms(c['ce_acc'])} | {_ms(c['ce_ece'])} | {_ms(c['ts_ece'])} | "
            f"{_ci(c['diff'])} | {status} |"
        )
    return L, checks, kept


def _tuning_section(spec: dict, raw: Path, kept: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Section 2, the tuned methods' chosen parameters per kept regime; also their chosen.json records."""
    L = [
        "",
        f"## 2. Tuning ({spec.get('tuning_label', 'one-go calibrator lr')}; validation NLL, mean over the tuning seeds)",
        "",
        "| regime | method | trials done | chosen | mean val NLL |",
        "|---|---|---|---|---|",
    ]
    tuning: dict[str, Any] = {}
    for r in kept:
        for m, meth in spec["methods"].items():
            if "tune" not in meth:
                continue
            rec = _load(raw / r / "tune" / m / "chosen.json")
            n_done = len(list((raw / r / "tune" / m).glob("trial*_seed*.json"))) // len(spec["tuning"]["seeds"])
            tuning[f"{r}/{m}"] = rec
            lr = ", ".join(f"{k} {v:.3g}" for k, v in rec["params"].items()) if rec else "pending"
            val = f"{rec['value']:.4f}" if rec else "n/a"
            L.append(f"| {r} | {m} | {n_done}/{spec['tuning']['trials']} | {lr} | {val} |")
    return L, tuning


def _methods_section(spec: dict, raw: Path, kept: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Section 3, one table of every method's test metrics per kept regime; also the completed runs' test metrics."""
    n_eval = len(spec["evaluation"]["seeds"])
    L = ["", "## 3. Methods per regime (test split, mean ± sd over evaluation seeds)", ""]
    methods: dict[str, Any] = {}
    for r in kept:
        L += [
            f"### {r}: {spec['regimes'][r]['label']}",
            "",
            "| method | backbone trained on | calibrator fitted on | seeds | test acc % | test ECE % | smooth ECE % | debiased L2 % |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m, meth in spec["methods"].items():
            ev = {s: x for s, x in load_evals(spec, r, m, raw).items() if x["status"] == "completed"}
            methods[f"{r}/{m}"] = {s: x["test"] for s, x in ev.items()}
            col = lambda k, ev=ev: [x["test"].get(k) for x in ev.values()]  # noqa: E731
            L.append(
                f"| {meth['label']} | {meth['backbone_data']} | {meth['calibrator_data']} | {len(ev)}/{n_eval} | "
                f"{_ms(col('accuracy'))} | {_ms(col('ece'))} | {_ms(col('smooth_ece'))} | {_ms(col('debiased_l2_ce'))} |"
            )
        L.append("")
    return L, methods


def _claim_regime(spec: dict, raw: Path, claim: dict, r: str) -> tuple[str, dict[str, Any], str]:
    """One regime's row of a claim's table, its JSON record and its verdict ("pending" while seeds are missing)."""
    n_eval = len(spec["evaluation"]["seeds"])
    margin, margin_acc, alpha = spec["margin_ece"], spec["margin_acc"], spec["alpha"]
    a = {s: x for s, x in load_evals(spec, r, claim["method"], raw).items() if x["status"] == "completed"}
    b = {s: x for s, x in load_evals(spec, r, claim["reference"], raw).items() if x["status"] == "completed"}
    seeds = sorted(set(a) & set(b))
    d = {k: [a[s]["test"][k] - b[s]["test"][k] for s in seeds] for k in ("ece", "accuracy", "smooth_ece")}
    if claim["kind"] == "matches":
        v = matches_verdict(d["ece"], d["accuracy"], margin, margin_acc, alpha)
    else:
        v = better_verdict(d["ece"])
    complete = len(seeds) == n_eval
    verdict = v["verdict"] if complete else f"pending ({v['verdict']} at {len(seeds)} seeds)"
    boots = (
        per_seed_bootstrap(
            raw,
            r,
            claim["method"],
            claim["reference"],
            seeds[:n_eval],
            spec["evaluation"]["bootstrap_resamples"],
            path_fn=eval_path,
        )
        if seeds
        else []
    )
    hw = statistics.median([(x["hi"] - x["lo"]) / 2 for x in boots]) if boots else math.nan
    sm = paired_ci(d["smooth_ece"])
    flag = (
        " (sign differs from ECE)"
        if (
            math.isfinite(sm["lo"])
            and math.isfinite(v["ece"]["lo"])
            and ((sm["lo"] > 0 and v["ece"]["hi"] < 0) or (sm["hi"] < 0 and v["ece"]["lo"] > 0))
        )
        else ""
    )
    acc = paired_ci(d["accuracy"])
    line = f"| {r} | {len(seeds)} | {_ci(v['ece'])} | {_ci(acc)} | {_ci(sm)}{flag} | {100 * hw:.2f} | {verdict} |"
    record = {
        "regime": r,
        "seeds": seeds,
        "d": d,
        "verdict": v["verdict"],
        "complete": complete,
        "bootstrap_half_width": hw,
        "sd_ece": statistics.stdev(d["ece"]) if len(seeds) > 1 else None,
        "sd_acc": statistics.stdev(d["accuracy"]) if len(seeds) > 1 else None,
    }
    return line, record, v["verdict"] if complete else "pending"


def _claim_overall(spec: dict, raw: Path, claim: dict, regs: Sequence[str], per: Sequence[str]) -> str:
    """A claim's overall verdict over its kept regimes, or why it is not decided yet."""
    done = [p for p in per if p != "pending"]
    # a regime whose check has not finished may still join the claim: the claim is not decided before it
    unchecked = [r for r in claim["regimes"] if not check_result(spec, r, raw)["complete"]]
    if not regs:
        return "pending" if unchecked else "no regime passed the check"
    if len(done) < len(per) or unchecked:
        return f"pending ({len(done)} of {len(per) + len(unchecked)} regimes complete)"
    return overall_verdict(done)


def _claims_section(
    spec: dict, raw: Path, kept: Sequence[str]
) -> tuple[list[str], dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Section 4, one table per claim with its overall verdict; also the per-regime records and the verdicts."""
    L = ["## 4. Claims, per regime (method minus reference, paired by seed; 95 % t intervals)", ""]
    claims: dict[str, list[dict[str, Any]]] = {}
    verdicts: dict[str, dict[str, Any]] = {}
    for name, claim in spec["claims"].items():
        regs = [r for r in claim["regimes"] if r in kept]
        L += [
            f"### ({name}) {claim['text']}",
            "",
            f"`{claim['method']}` vs `{claim['reference']}`, kind: {claim['kind']}.",
            "",
            "| regime | seeds | d ECE, pt | d acc, pt | d smooth ECE, pt | per-seed bootstrap half-width, pt (median) | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        per = []
        for r in regs:
            line, record, verdict = _claim_regime(spec, raw, claim, r)
            L.append(line)
            claims.setdefault(name, []).append(record)
            per.append(verdict)
        overall = _claim_overall(spec, raw, claim, regs, per)
        done = [p for p in per if p != "pending"]
        counts = ", ".join(f"{v} in {done.count(v)} of {len(per)}" for v in dict.fromkeys(done))
        verdicts[name] = {"overall": overall, "per_regime": list(zip(regs, per))}
        L += ["", f"**Overall ({claim['text']}): {overall}**" + (f" ({counts})." if counts else "."), ""]
    return L, claims, verdicts


def _precision_note(spec: dict, claims: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The paragraph on how the per-seed bootstrap half-widths compare with the ECE margin (none without any)."""
    margin = spec["margin_ece"]
    widths = [row["bootstrap_half_width"] for rows in claims.values() for row in rows]
    widths = [w for w in widths if math.isfinite(w)]
    if not widths:
        return []
    where = "above" if min(widths) > margin else ("below" if max(widths) < margin else "on both sides of")
    return [
        "**Per-seed precision.** The median per-seed bootstrap half-width of an ECE difference ranges "
        f"{100 * min(widths):.2f}-{100 * max(widths):.2f} pt, {where} the {100 * margin:g} pt margin"
        + (
            ": one seed's test split resolves a difference of the margin's size; "
            if where == "below"
            else ": a single seed's test split cannot settle a claim; "
        )
        + "the verdicts rest on the paired t interval across seeds.",
        "",
    ]


def build_report(
    spec: dict, raw: Path, command: str, keep_all: bool = False, raw_label: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its JSON record, from the raw files alone (`raw_label`: how the report names
    them, when `raw` is the compact form rebuilt in a temporary folder)."""
    L = _header_lines(spec, raw, command, keep_all, raw_label)
    check_lines, checks, kept = _check_section(spec, raw, keep_all)
    tuning_lines, tuning = _tuning_section(spec, raw, kept)
    method_lines, methods = _methods_section(spec, raw, kept)
    claim_lines, claims, verdicts = _claims_section(spec, raw, kept)
    L += check_lines + tuning_lines + method_lines + claim_lines
    L += _precision_note(spec, claims)
    L += _power_section(spec, claims)
    L += _side_by_side(spec, verdicts)
    L += ["## 6. Deviations from the protocol", "", _deviations(spec), ""]
    out: dict[str, Any] = {
        "protocol": str(protocol_files(spec)[0].relative_to(ROOT)),
        "command": command,
        "check": checks,
        "tuning": tuning,
        "methods": methods,
        "claims": claims,
        "verdicts": verdicts,
    }
    return "\n".join(L) + "\n", out


# protocol A's report sets its verdicts beside protocol B's (the committed report of the fixed-backbone study)
COMPARE_WITH = {"v2a": "v2"}


def _side_by_side(spec: dict, verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """Each claim's overall verdict and per-regime verdicts here and in the study this one is compared with."""
    other = COMPARE_WITH.get(spec["name"])
    path = json_path(RESULTS_DIR / f"method_study_{other}.json") if other else None
    if path is None or not path.is_file():
        return []
    theirs = read_json(path)["verdicts"]
    L = [
        f"### Beside protocol B (`{path.relative_to(ROOT)}`)",
        "",
        "| claim | this study (overall; per regime) | protocol B (overall; per regime) |",
        "|---|---|---|",
    ]
    for name, v in verdicts.items():
        t = theirs.get(name, {})
        mine = "; ".join(f"{r}: {x}" for r, x in v["per_regime"])
        them = "; ".join(f"{r}: {x}" for r, x in t.get("per_regime", []))
        L.append(f"| {name} | **{v['overall']}**; {mine} | **{t.get('overall', 'n/a')}**; {them} |")
    return L + [""]


def bound_power(sd: float, n: int, margin: float, alpha: float, draws: int = 20_000, seed: int = 0) -> float:
    """Simulated chance that a one-sided (1 - alpha) bound of a paired mean clears +-margin when the truth is 0."""
    from scipy import stats

    if not (math.isfinite(sd) and sd > 0 and n > 1):
        return math.nan
    d = np.random.default_rng(seed).normal(0.0, sd, size=(draws, n))
    upper = d.mean(axis=1) + stats.t.ppf(1.0 - alpha, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return float(np.mean(upper < margin))


def _power_section(spec: dict, claims: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The measured spread of the paired differences and the power it implies (the protocol's power table, after)."""
    margin, margin_acc, alpha = spec["margin_ece"], spec["margin_acc"], spec["alpha"]
    L = [
        "## 5. Measured spread and the power it implies",
        "",
        "The protocol sized n = 24 from v1's spread (ECE sd 0.13-1.09 pt, accuracy 0.84-3.37 pt). Here the measured "
        "sd of the paired differences, and the simulated chance (true difference 0, 20,000 draws) that the one-sided "
        f"95 % bound clears the margin ({100 * margin:g} pt ECE, {100 * margin_acc:g} pt accuracy) at that sd and n.",
        "",
        "| claim | regime | seeds | sd d ECE, pt | power ECE | sd d acc, pt | power acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in claims.items():
        if spec["claims"][name]["kind"] != "matches":
            continue
        for row in rows:
            n = len(row["seeds"])
            se, sa = row["sd_ece"] or math.nan, row["sd_acc"] or math.nan
            pe, pa = bound_power(se, n, margin, alpha), bound_power(sa, n, margin_acc, alpha)
            L.append(f"| {name} | {row['regime']} | {n} | {100 * se:.2f} | {pe:.2f} | {100 * sa:.2f} | {pa:.2f} |")
    return L + [""]


# ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run the stages that are not done yet, then write the report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--protocol", default=str(PROTOCOL))
    p.add_argument("--raw", default=None, help="where the per-run files go (default: the committed results' folder)")
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    p.add_argument("--regimes", default=None, help="comma-separated subset (default: every regime, in order)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--keep-all", action="store_true", help="smoke runs only: keep every regime, whatever its check")
    p.add_argument("--stop-after", choices=["check", "tune", "eval"], default="eval")
    args = p.parse_args(argv)
    spec = load_spec(Path(args.protocol))
    raw = Path(args.raw or RESULTS_DIR / study_name(spec)).resolve()
    regimes = args.regimes.split(",") if args.regimes else list(spec["regimes"])
    command = command_line(__file__, argv)
    label = None
    if not raw.is_dir() and compact_dir(raw).is_dir():  # a finished study kept in compact form (issue #31)
        if not args.report_only:
            raise SystemExit(f"{raw.name} is stored in compact form ({compact_dir(raw).name}/): --report-only")
        label, raw = os.path.relpath(compact_dir(raw), ROOT) + "/ (compact form)", raw_or_compact(raw)
    if not args.report_only:
        jobs = [j for r in regimes for j in check_jobs(spec, r, raw)]
        _run_pool(jobs, args.workers, "check")
        kept = [r for r in regimes if check_result(spec, r, raw)["kept"] or args.keep_all]
        print(f"[check] kept: {kept}; dropped: {[r for r in regimes if r not in kept]}", flush=True)
        if args.stop_after != "check":
            tasks = [
                {"spec": spec, "regime": r, "method": m, "raw": str(raw)}
                for r in kept
                for m, meth in spec["methods"].items()
                if "tune" in meth and chosen_params(spec, r, m, raw) is None
            ]
            if tasks:
                with mp.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
                    for rec in pool.imap_unordered(tune_study, tasks):
                        print(
                            f"[tune] {rec['regime']} {rec['method']}: chosen {rec['params']} ({rec['value']:.4f})",
                            flush=True,
                        )
        if args.stop_after == "eval":
            _run_pool([j for r in kept for j in eval_jobs(spec, r, raw)], args.workers, "eval")
    text, record = build_report(spec, raw, command, args.keep_all, label)
    out = Path(args.out_dir)
    write_text(out / f"{study_name(spec)}.md", text)
    write_json(out / f"{study_name(spec)}.json.gz", record)  # gzipped: benchmarks/results under 15 MB (issue #31)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

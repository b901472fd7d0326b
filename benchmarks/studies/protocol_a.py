"""Protocols B and A of the method study (issue #21), the part that outlives them: a protocol's spec, one run's
configuration and training, the tuned parameters, the seeded TPE search. Protocol C (`method_study_c_slice.py`,
`method_study_c_full.py`) retrains A's chosen backbones and tunes with A's search; the reproducibility check
(`reproducibility.py`) reruns B's runs; `row_encoding_check.py` reads their specs.

The studies themselves (`method_study_v2.py`, B and A: check, tune, evaluate, report; `method_study.py`, the v1 study
and the verdict rules B and A used) were superseded by protocol C and left the tree (issue #45); their protocols
(`benchmarks/studies/protocols/method_study_v2*.{md,yaml}`) and results stay, and benchmarks/results/INDEX.md names
the commit that reproduces each. The functions below are theirs, moved unchanged (`secondary` was `_secondary`).

A run is a calib_core RunConfig (as a dict) built from the spec: the regime's backbone, the method's trainer options
and its tuned parameters; one thread, on the CPU. A run's record is one JSON file under
`<raw>/<regime>/<stage>/<method>/<name>.json` (an evaluation run's test rows in an .npz beside it: each row's
top-label confidence and correctness); the JSON is written last and marks the run done.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import PROTOCOLS, utc_now

PROTOCOL = PROTOCOLS / "method_study_v2.yaml"  # protocol B; A's is method_study_v2a.yaml


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


def run_path(raw: Path, regime: str, stage: str, method: str, name: str) -> Path:
    """Where one run's JSON lives."""
    return raw / regime / stage / method / f"{name}.json"


def eval_path(raw: Path, regime: str, method: str, seed: int) -> Path:
    """An evaluation run's JSON (its .npz sits beside it); as protocols B and A stored it."""
    return run_path(raw, regime, "eval", method, f"seed{seed}")


def run_config(spec: dict, regime: str, method: str, seed: int, params: dict[str, float] | None = None) -> dict:
    """The calib_core RunConfig (as a dict) of one run: the regime's backbone, the method's trainer options."""
    reg, m = spec["regimes"][regime], spec["methods"][method]
    cfg = json.loads(json.dumps(reg["run"]))
    cfg.update(seed=int(seed), device="cpu", num_threads=int(spec.get("threads", 1)))
    cfg["train"] = {**cfg.get("train", {}), **m["train"], **(params or {})}
    return cfg


def chosen_params(spec: dict, regime: str, method: str, raw: Path) -> dict[str, float] | None:
    """The tuned parameters of a method ({} for methods with nothing to tune; None while not tuned)."""
    if "tune" not in spec["methods"][method]:
        return {}
    path = raw / regime / "tune" / method / "chosen.json"
    return json.loads(path.read_text())["params"] if path.is_file() else None


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


def secondary(probs: Any, labels: Any) -> dict[str, float]:
    """Smooth ECE and debiased L2 calibration error of one task's test predictions."""
    from calib_core.metrics import debiased_l2_ce, smooth_ece

    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels)
    return {"smooth_ece": float(smooth_ece(p, y)), "debiased_l2_ce": float(debiased_l2_ce(p, y))}


def task_secondary(probs: Sequence[Any], labels: Any) -> dict[str, float]:
    """`secondary` per task on its labelled rows (labels (N, T), -1 = missing), averaged over the tasks."""
    labels = np.asarray(labels)
    sec = [secondary(np.asarray(p)[labels[:, t] >= 0], labels[labels[:, t] >= 0, t]) for t, p in enumerate(probs)]
    return {k: float(np.mean([s[k] for s in sec])) for k in sec[0]}


def top_label_arrays(probs: np.ndarray, labels: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
    """What a stored evaluation run keeps of its test predictions for the top-label ECE: each row's top
    confidence and whether the top class is the label (13x smaller than the probabilities at K = 10)."""
    probs = np.asarray(probs)
    return {
        f"{prefix}conf": probs.max(axis=1).astype(np.float32),
        f"{prefix}correct": probs.argmax(axis=1) == np.asarray(labels),
        f"{prefix}num_classes": np.array(probs.shape[1]),
    }


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
            rec["test"].update(secondary(res.test_probs.numpy(), res.test_labels.numpy()))
            labels = res.test_labels.numpy()
            arrays = {"labels": labels.astype(np.int16), **top_label_arrays(res.test_probs.numpy(), labels)}
        if job["stage"] == "eval":
            np.savez_compressed(path.with_suffix(".npz"), **arrays)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, default=str, indent=1))
    tmp.replace(path)  # the JSON marks the run done: written last
    return rec

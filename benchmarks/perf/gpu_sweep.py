"""The sweep of the GPU acceptance run (benchmarks/perf/gpu_acceptance.py): parts (c) and (d), `sweep_parts`.

- `sweep_command`: `sweeps/launch.py` with 4 trials at `--gpus-per-trial 0.5` on the embedded MNIST-1D demo (generated
  offline), the reference arms on (the config's default: CE with early stopping as a trial, TS on top of each);
- `plan_check`: the same command with `--dry-run` (the resolved config and resource plan; runs nothing), read back;
- `GpuSampler`: a thread that samples `nvidia-smi --query-compute-apps` while the sweep runs, to show two trials'
  processes on the device at once;
- `check_champion`: in a process that sees no CUDA device, the champion registered by the sweep loaded with
  mlflow.pyfunc and asked for predictions, and the sweep's leaderboard (for the reference arms' rows, part d).
Without a device, `sweep_parts` runs only `plan_check` and one nvidia-smi sample.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT
from benchmarks.perf.gpu_report import Part, Row, nvidia_smi, run_part

LAUNCH = ROOT / "sweeps" / "launch.py"
SWEEP_NAME = "gpu-acceptance"
TRIALS = 4
GPUS_PER_TRIAL = 0.5
# what the check prints last: one JSON line
CHAMPION_MARK = "CHAMPION_CHECK "


def sweep_args(cpus_per_trial: int = 2) -> list[str]:
    """The launch flags: 4 trials, half a GPU each, two at a time (one device holds both)."""
    return [
        "--num-samples",
        str(TRIALS),
        "--gpus-per-trial",
        str(GPUS_PER_TRIAL),
        "--max-concurrent",
        "2",
        "--cpus-per-trial",
        str(cpus_per_trial),
        "--name",
        SWEEP_NAME,
        "--seed",
        "0",
    ]


def sweep_command(cpus_per_trial: int = 2) -> list[str]:
    """The full command (run in an empty working directory: mlflow.db, optuna.db and ray_results go there)."""
    return [sys.executable, str(LAUNCH), *sweep_args(cpus_per_trial)]


def as_typed(cmd: list[str]) -> str:
    """The command as a reader would type it from the repository root."""
    head = ["python", "sweeps/launch.py"] if cmd[:2] == [sys.executable, str(LAUNCH)] else cmd[:2]
    return " ".join(head + cmd[2:])


def plan_check(cmd: list[str], workdir: Path) -> dict[str, Any]:
    """Run `cmd --dry-run`: whether the launcher accepts it, its resource plan, and whether the reference arms
    (search.references, evaluation.temperature_on_top) are on in the resolved config."""
    import yaml

    proc = subprocess.run([*cmd, "--dry-run"], cwd=workdir, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"launch --dry-run exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    resolved, _, plan = proc.stdout.partition("\n---\n")
    cfg = yaml.safe_load(resolved)
    return {
        "plan": plan.strip(),
        "references": cfg["search"]["references"],
        "temperature_on_top": cfg["evaluation"]["temperature_on_top"],
        "gpus_per_trial": cfg["resources"]["gpus_per_trial"],
        "num_samples": cfg["search"]["num_samples"],
    }


# ------------------------------------------------------------------------------------------
# nvidia-smi
# ------------------------------------------------------------------------------------------
class GpuSampler(threading.Thread):
    """Samples the compute processes on the device (pid, used MiB) every `interval` s until `stop()`; processes
    already there when it was made (this script's own CUDA context, say) are left out of every sample."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[tuple[float, list[tuple[str, str]]]] = []
        self.available = shutil.which("nvidia-smi") is not None
        self._halt = threading.Event()
        self._t0 = time.perf_counter()
        self.before: set[str] = {pid for pid, _ in self._apps() or []}

    def _apps(self) -> list[tuple[str, str]] | None:
        rows = nvidia_smi("--query-compute-apps=pid,used_memory")
        if rows is None:
            self.available = False
            return None
        return [(r[0], r[1]) for r in rows if len(r) >= 2]

    def sample(self) -> None:
        """One sample: the compute apps nvidia-smi lists now, less those there before."""
        apps = self._apps()
        if apps is not None:
            self.samples.append((time.perf_counter() - self._t0, [a for a in apps if a[0] not in self.before]))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def summary(self) -> dict[str, Any]:
        """Most processes seen at once, distinct pids, how many samples, and the busiest sample."""
        if not self.available and not self.samples:
            return {"sampled": False, "why": "nvidia-smi not available"}
        most = max(self.samples, key=lambda s: len(s[1]), default=(0.0, []))
        pids = {pid for _, apps in self.samples for pid, _ in apps}
        return {
            "sampled": True,
            "samples": len(self.samples),
            "max_processes_at_once": len(most[1]),
            "at_s": round(most[0], 1),
            "busiest": [{"pid": p, "used_mib": m} for p, m in most[1]],
            "distinct_pids": len(pids),
            "left_out_before": len(self.before),
        }


# ------------------------------------------------------------------------------------------
# the champion on CPU, and the leaderboard
# ------------------------------------------------------------------------------------------
BOARD_KEYS = ("label", "family", "calibrator", "status", "val_accuracy", "val_ece", "test_accuracy", "test_ece")


def board_rows(board: Any) -> list[dict[str, Any]]:
    """The leaderboard's rows (the columns the report shows), each marked `reference` when it is a reference arm:
    the CE-with-early-stopping trial or a "+ TS" candidate."""
    rows = []
    for rec in board.to_dict("records"):
        row = {k: rec.get(k) for k in BOARD_KEYS}
        row["reference"] = rec.get("calibrator") == "ce_es" or str(rec.get("label", "")).endswith("+ TS")
        rows.append(row)
    return rows


def check_champion(workdir: Path) -> dict[str, Any]:
    """The sweep's result read back from MLflow, its champion loaded with mlflow.pyfunc in this process (which must
    see no CUDA device) and asked for predictions on 16 MNIST-1D-shaped rows."""
    import numpy as np
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("the champion check must run without CUDA (CUDA_VISIBLE_DEVICES='')")
    import mlflow

    from sweeps.api import load_result

    result = load_result(SWEEP_NAME, workdir)
    mlflow.set_tracking_uri(result.tracking_uri)
    dst = workdir / "champion-download"
    dst.mkdir(exist_ok=True)
    model = mlflow.pyfunc.load_model(result.champion_uri, dst_path=str(dst))
    x = np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32)
    probs = np.asarray(model.predict(x))
    return {
        "model_uri": result.model_uri,
        "champion_uri": result.champion_uri,
        "champion": result.champion_label,
        "probs_shape": list(probs.shape),
        "row_sum_max_err": float(np.abs(probs.sum(1) - 1.0).max()),
        "finite": bool(np.isfinite(probs).all()),
        "cuda_available_in_checker": False,
        "leaderboard": board_rows(result.leaderboard),
    }


def champion_on_cpu(workdir: Path, timeout: float = 150) -> dict[str, Any]:
    """Run `check_champion` in a fresh interpreter with CUDA hidden; its JSON."""
    import os

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "benchmarks.perf.gpu_acceptance", "--check-champion", str(workdir)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(CHAMPION_MARK)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the champion check exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(line.removeprefix(CHAMPION_MARK))


def run_sweep(cmd: list[str], workdir: Path, timeout: float) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """Run the sweep with the sampler going; (the finished process, the sampler's summary)."""
    sampler = GpuSampler()
    sampler.start()
    try:
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout)
    finally:
        sampler.stop()
    return proc, sampler.summary()


# ------------------------------------------------------------------------------------------
# the parts (c) and (d)
# ------------------------------------------------------------------------------------------
def _timing_rows(stdout: str, shown: str) -> list[Row]:
    """The phases of the sweep's own `Timing:` line."""
    from benchmarks.perf.bench_reference_arms import TIMING

    m = TIMING.search(stdout)
    if m is None:
        return []
    names = {
        "ray": "Ray start",
        "trials": "trial phase",
        "select": "selection and registration",
        "bootstrap": "bootstrap",
    }
    return [
        {"what": f"sweep: {names[k]}", "figure": f"{float(v):.1f} s", "command": f"{shown} (its Timing line)"}
        for k, v in m.groupdict().items()
    ]


def sharing_row(smi: dict[str, Any], shown: str) -> tuple[Row, tuple[str, bool]]:
    """The sampler's summary as a row, and the check that two trials were on the device at once."""
    cmd = f"nvidia-smi --query-compute-apps=pid,used_memory every 0.5 s during `{shown}`"
    what = "trials on the device at once"
    if not smi.get("sampled"):
        return {"what": what, "figure": smi.get("why", "not sampled"), "command": cmd}, ("nvidia-smi sampled", False)
    apps = ", ".join(f"pid {a['pid']} {a['used_mib']} MiB" for a in smi["busiest"])
    figure = (
        f"{smi['max_processes_at_once']} processes at once (at {smi['at_s']} s: {apps}); "
        f"{smi['distinct_pids']} distinct pids in {smi['samples']} samples"
    )
    if smi.get("left_out_before"):  # this script's own CUDA context, there before the sweep
        figure += f" ({smi['left_out_before']} process(es) on the device before the sweep left out)"
    check = ("two trials shared the device (nvidia-smi saw >= 2 processes at once)", smi["max_processes_at_once"] >= 2)
    return {"what": what, "figure": figure, "command": cmd}, check


def _board_row(r: dict[str, Any]) -> Row:
    """A leaderboard row as a report row: status, validation and test accuracy and ECE in percent."""

    def pct(k: str) -> str:
        v = r.get(k)
        return "-" if v is None or v != v else f"{100 * v:.1f}"

    figure = (
        f"{r['status']}; val acc {pct('val_accuracy')} %, val ECE {pct('val_ece')} %; "
        f"test acc {pct('test_accuracy')} %, test ECE {pct('test_ece')} %"
    )
    return {"what": r["label"], "figure": figure, "command": "the sweep of part (c): its leaderboard"}


def _sweep_dry(c: Part, d: Part, cmd: list[str], skip: str) -> None:
    """Without a device: the launcher accepts the command and resolves the arms on; one nvidia-smi sample."""
    shown = as_typed(cmd)
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-plan-") as wd:
        plan = plan_check(cmd, Path(wd))
    c.skipped = d.skipped = skip
    sampler = GpuSampler()
    sampler.sample()
    c.exercised = (
        f"`{shown} --dry-run` accepted ({plan['plan'].splitlines()[1]}); nvidia-smi sampler: "
        f"{'available' if sampler.available else 'nvidia-smi not available'}"
    )
    c.checks.append((f"the plan asks {GPUS_PER_TRIAL} GPU per trial", plan["gpus_per_trial"] == GPUS_PER_TRIAL))
    d.exercised = (
        f"the resolved config has search.references {plan['references']} and evaluation.temperature_on_top "
        f"{plan['temperature_on_top']}"
    )
    d.checks.append(("the reference arms are on", plan["references"] == ["ce_es"] and plan["temperature_on_top"]))


def _champion_row(champ: dict[str, Any]) -> tuple[Row, tuple[str, bool]]:
    """The CPU load of the champion as a row, and its check."""
    loaded = champ["probs_shape"] == [16, 10] and champ["finite"] and champ["row_sum_max_err"] < 1e-5
    row = {
        "what": f"champion {champ['champion']!r} loaded on CPU",
        "figure": f"predict -> {tuple(champ['probs_shape'])}, rows sum to 1 within {champ['row_sum_max_err']:.1e}",
        "command": "CUDA_VISIBLE_DEVICES= python -m benchmarks.perf.gpu_acceptance --check-champion <sweep dir> "
        f"(mlflow.pyfunc.load_model('{champ['champion_uri']}'))",
    }
    return row, ("the champion loads and predicts on CPU", loaded)


def reference_part(d: Part, champ: dict[str, Any]) -> None:
    """(d) from the sweep's leaderboard: the reference arms' rows, and checks that both arms ran."""
    board = champ["leaderboard"]
    refs = [r for r in board if r["reference"]]
    d.rows = [_board_row(r) for r in refs]
    d.note = f"champion: {champ['champion']}; {len(board)} candidates, {len(refs)} of them reference arms"
    ce_es = any(r["calibrator"] == "ce_es" and r["status"] == "completed" for r in refs)
    d.checks.append(("the CE-with-early-stopping trial completed", ce_es))
    labels = {str(r["label"]) for r in board}
    trials = [r for r in board if r["status"] == "completed" and not str(r["label"]).endswith("+ TS")]
    ts_ok = bool(trials) and all(f"{r['label']} + TS" in labels for r in trials)
    d.checks.append(("every completed trial has its + TS candidate", ts_ok))


def _sweep_on_device(c: Part, d: Part, cmd: list[str], timeout: float) -> None:
    """The sweep with the sampler going, its timings, the champion on CPU, and the reference arms' rows."""
    shown = as_typed(cmd)
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-sweep-") as wd:
        t0 = time.perf_counter()
        proc, smi = run_sweep(cmd, Path(wd), timeout)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            d.failed = "the sweep of part (c) failed"
            raise RuntimeError(f"the sweep exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
        c.rows.append({"what": "sweep wall time, 2 trials at once", "figure": f"{wall:.1f} s", "command": shown})
        c.rows += _timing_rows(proc.stdout, shown)
        row, check = sharing_row(smi, shown)
        c.rows.append(row)
        c.checks.append(check)
        try:
            champ = champion_on_cpu(Path(wd))
        except Exception:
            d.failed = "the sweep's result could not be read back"
            raise
    row, check = _champion_row(champ)
    c.rows.append(row)
    c.checks.append(check)
    reference_part(d, champ)


def sweep_parts(skip: str, timeout: float = 360.0) -> list[Part]:
    """(c) and (d): they share one sweep."""
    c = Part("c", f"{TRIALS}-trial sweep at --gpus-per-trial {GPUS_PER_TRIAL}, champion loaded on CPU")
    d = Part("d", "reference arms on the device (CE with early stopping, TS on top)")
    cmd = sweep_command()
    t0 = time.perf_counter()
    run_part(c, lambda c: _sweep_dry(c, d, cmd, skip) if skip else _sweep_on_device(c, d, cmd, timeout))
    d.seconds = time.perf_counter() - t0
    if c.failed and not d.failed and not d.exercised:
        d.failed = "part (c) failed before its sweep was read"
    print(d.line(), flush=True)
    return [c, d]

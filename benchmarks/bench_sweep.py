"""Service overhead and concurrency speed-up: the same N trials through the sweep service and as a
plain sequential loop calling the trainer, on the same cores, measured side by side.

    python benchmarks/bench_sweep.py [--trials 6] [--repeats 3] [--epochs 4] [--samples 3000]

(a) the service (`sweeps/launch.py`, a subprocess, wall time from start to exit: Python start,
Ray start, Tune, MLflow logging, selection, model registration) with 1 and with 2 trials at a
time; (b) a plain loop in a fresh process that loads the data and runs `Trainer.fit` for the
very configs the service's Optuna sampler drew (read back from MLflow), one thread each.
The service prints its own timing (Ray start, trials, selection and registration), so the
table separates the fixed cost of a sweep from the marginal cost of each trial:
marginal overhead per trial = (service's trial phase with 1 at a time - plain loop) / N.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, ROOT, command_line, write_json

LAUNCH = ROOT / "sweeps" / "launch.py"

PLAIN_LOOP = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from calib_core.config import RunConfig
from calib_core.data import load_dataset
from calib_core.trainer import Trainer
configs = json.load(open(sys.argv[1]))
t0 = time.perf_counter()
per = []
for raw in configs:
    t = time.perf_counter()
    cfg = RunConfig.model_validate(raw)
    data = load_dataset(cfg.data, cfg.seed)
    Trainer(cfg, data, "cpu").fit()
    per.append(time.perf_counter() - t)
print(json.dumps({"wall": time.perf_counter() - t0, "per_trial": per}))
"""


TIMING = re.compile(r"Timing: Ray start ([\d.]+)s, trials ([\d.]+)s, selection and registration ([\d.]+)s")


def run_service(workdir: Path, name: str, trials: int, concurrent: int, extra: list[str]) -> dict[str, float]:
    """Wall seconds of one `launch.py` run (the whole process) and of its phases."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(LAUNCH), "--num-samples", str(trials), "--max-concurrent",
                           str(concurrent), "--cpus-per-trial", "1", "--name", name, "--seed", "0", *extra],
                          cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"service run failed:\n{proc.stderr[-3000:]}")
    m = TIMING.search(proc.stdout)
    if m is None:
        raise SystemExit("the service printed no timing line")
    start, trials_s, finish = (float(g) for g in m.groups())
    return {"wall": wall, "ray_start": start, "trials": trials_s, "finish": finish}


def sampled_configs(workdir: Path, name: str) -> list[dict]:
    """The resolved run configs of the sweep's trials, read back from MLflow."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{workdir.resolve()}/mlflow.db"
    client = MlflowClient(uri)
    mlflow.set_tracking_uri(uri)
    exp = client.get_experiment_by_name("calib-sweeps")
    runs = client.search_runs([exp.experiment_id], f"tags.`calib.sweep` = '{name}' and tags.`calib.role` = 'trial'")
    out = []
    for r in sorted(runs, key=lambda r: r.data.tags["calib.trial_id"]):
        raw = mlflow.artifacts.load_dict(f"runs:/{r.info.run_id}/run_config.json")
        raw.update(device="cpu", num_threads=1)
        out.append(raw)
    return out


def run_plain(configs: list[dict], workdir: Path) -> dict:
    """Wall seconds of the plain sequential loop (fresh process, one thread)."""
    path = workdir / "configs.json"
    path.write_text(json.dumps(configs))
    # calib_core comes from the editable install, as in the service's trial processes
    proc = subprocess.run([sys.executable, "-c", PLAIN_LOOP, str(path)], capture_output=True, text=True, cwd=workdir)
    if proc.returncode != 0:
        raise SystemExit(f"plain loop failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_sweep.json"))
    args = ap.parse_args(argv)
    extra = ["--set", f"run.train.epochs={args.epochs}", "--set", f"run.data.num_samples={args.samples}"]
    rows: dict[str, list] = {"plain": [], "service_1": [], "service_2": []}
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            wd = Path(d)
            rows["service_1"].append(run_service(wd, f"c1-{rep}", args.trials, 1, extra))
            configs = sampled_configs(wd, f"c1-{rep}")
            rows["plain"].append({"wall": run_plain(configs, wd)["wall"]})
            rows["service_2"].append(run_service(wd, f"c2-{rep}", args.trials, 2, extra))
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]['wall']:.1f}s" for k, v in rows.items()),
              flush=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[kind])

    n = args.trials
    plain = med("plain", "wall")
    marginal = (med("service_1", "trials") - plain) / n
    fixed = med("service_1", "wall") - med("service_1", "trials")
    table = [
        "| run | whole process s | Ray start s | trials s | selection + registration s |",
        "|---|---|---|---|---|",
        f"| plain sequential loop (Trainer.fit, 1 thread) | {plain:.1f} | | {plain:.1f} | |",
    ] + [
        f"| service, {c} trial(s) at a time | {med(k, 'wall'):.1f} | {med(k, 'ray_start'):.1f} | "
        f"{med(k, 'trials'):.1f} | {med(k, 'finish'):.1f} |" for c, k in ((1, "service_1"), (2, "service_2"))
    ]
    summary = [
        f"marginal service overhead per trial (trial phase, 1 at a time, vs plain loop): {marginal:.2f} s",
        f"fixed cost per sweep (process start, imports, Ray start, selection, registration): {fixed:.1f} s",
        f"speed-up of the trial phase from concurrency (1 -> 2 at a time): "
        f"{med('service_1', 'trials') / med('service_2', 'trials'):.2f}x",
        f"whole sweep, 2 at a time, vs plain loop: {plain / med('service_2', 'wall'):.2f}x",
    ]
    header = (f"{n} trials (MNIST-1D {args.samples} samples, cnn1d, {args.epochs} epochs), "
              f"median of {args.repeats} repeats, {os.cpu_count()} cores")
    print("\n" + header + "\n" + "\n".join(table) + "\n\n" + "\n".join(summary))
    write_json(Path(args.out), {"command": command_line(__file__, argv), "header": header, "raw": rows,
                                "table": table, "summary": summary,
                                "marginal_overhead_per_trial_s": marginal, "fixed_cost_s": fixed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

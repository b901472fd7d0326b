"""Soak (issue #36, fault 5): a sweep of many short trials on the local Ray cluster while a seeded chaos thread
SIGKILLs a random trial worker every few seconds (a bounded number of times), with the driver's memory sampled
every second.

What it measures: whether the sweep completes with every trial exactly one MLflow run, how many retries Ray
Tune made against how many workers were killed, and the driver's resident memory against the trials finished
(the curve, and its slope in MB per 100 trials over the trial phase). tests/e2e/test_sweep_soak.py runs it and
asserts the promises; this script runs it and keeps the figures:

    python -m benchmarks.perf.soak   # 200 trials, 4 at a time, 20 kills (about 10 min here)
    python -m benchmarks.perf.soak --trials 40 --kills 5 --out /tmp/soak

writes soak.json (figures and provenance), soak.csv (the curve) and soak.png to
benchmarks/results/ (or --out), and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "sweeps" / "launch.py"
RESULTS = ROOT / "benchmarks" / "results"
NAME = "soak"
DONE_LINE = re.compile(r"^\[(\d+)/(\d+) trials done")
LOST_LINE = re.compile(r"(\d+) trial\(s\) ended when their worker died")


MARK_ENV = "CALIB_SOAK_RUN"  # set in the driver's environment; Ray's processes and its trial workers inherit it


def trial_processes(mark: str) -> list[int]:
    """Pids of running Ray trial actors (Ray sets their title to `ray::ImplicitFunc...`) of this soak's own
    sweep only: those whose environment carries MARK_ENV=`mark`. Other sweeps on the machine (tests running
    in parallel, other people's clusters) are never touched."""
    needle = f"{MARK_ENV}={mark}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not cmd.startswith("ray::ImplicitFunc"):
                continue
            if needle in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


class Killer(threading.Thread):
    """Every `low`-`high` seconds (seeded), SIGKILL one random trial process, until `limit` kills or stopped."""

    def __init__(self, seed: int, limit: int, mark: str, low: float = 4.0, high: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.rng, self.limit, self.low, self.high = random.Random(seed), limit, low, high
        self.mark = mark
        self.kills: list[tuple[float, int]] = []  # (wall-clock time, pid)
        self.stopped = threading.Event()

    def run(self) -> None:
        """Kill until the limit or until stopped."""
        while len(self.kills) < self.limit and not self.stopped.wait(self.rng.uniform(self.low, self.high)):
            pids = trial_processes(self.mark)
            if not pids:
                continue
            pid = self.rng.choice(sorted(pids))
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills.append((time.time(), pid))
            except ProcessLookupError:
                pass


def rss_mb(pid: int) -> float | None:
    """A process's resident set size in MB (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Soak:
    """What one soak run measured."""

    returncode: int
    output: str
    elapsed_s: float
    kills: list[dict[str, Any]]  # attribute_kills: when, which worker, which trial, whether it was over
    retries: int  # Tune's num_failures summed over the trials (its newest experiment state)
    lost_worker_rounds: int  # in-process resumes of trials Tune errored for a worker death (tuner.py)
    lost_worker_trials: int  # the trials those resumes took up: Tune counted each one's death twice
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (s since start, trials done, RSS MB)
    trial_phase_end_s: float | None = None  # when the last trial finished (selection follows)


def attribute_kills(exp_dir: Path, kills: list[tuple[float, int]]) -> list[dict[str, Any]]:
    """Each kill with the trial its worker ran (Tune stamps every result with the worker's pid and the time):
    `trial` (None when the worker was killed before its first report), `after_final` (its trial had already
    sent its final result: the trial was over) and the trial's `num_failures` in Tune's newest experiment state."""
    pid_trial: dict[int, str] = {}
    final_at: dict[int, float] = {}  # pid -> when its trial's final result was reported
    for f in exp_dir.glob("train_trial_*/result.json"):
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "pid" in r and "trial_id" in r:
                pid_trial[int(r["pid"])] = str(r["trial_id"])
                if r.get("done") and "timestamp" in r:
                    final_at[int(r["pid"])] = float(r["timestamp"])
    failures = trial_failures(exp_dir)
    out = []
    for when, pid in kills:
        trial = pid_trial.get(pid)
        out.append(
            {
                "time": round(when, 1),
                "pid": pid,
                "trial": trial,
                "after_final": pid in final_at and final_at[pid] <= when,
                "num_failures": failures.get(trial) if trial else None,
            }
        )
    return out


def trial_failures(exp_dir: Path) -> dict[str, int]:
    """Tune's recorded failures (retries) per trial id, from the newest experiment state in `exp_dir`."""
    states = sorted(exp_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return {}
    data = json.loads(states[-1].read_text())
    out = {}
    for t in data["trial_data"]:
        out[str(json.loads(t[0])["trial_id"])] = int(json.loads(t[1]).get("num_failures", 0))
    return out


def soak_args(trials: int, concurrent: int, epochs: int) -> list[str]:
    """The sweep: digits, calibrators and learning rates that cannot diverge (every trial must finish), no
    scheduler, no reference arm, enough retries for every kill to land on one trial."""
    return [
        "--config", str(ROOT / "sweeps/configs/digits_demo.yaml"), "--name", NAME,
        "--num-samples", str(trials), "--max-concurrent", str(concurrent),
        "--set", f"run.train.epochs={epochs}", "--set", "search.scheduler=none",
        "--set", "search.calibrators=[temperature,vector]", "--set", "search.calibrator_lr.high=0.01",
        "--set", "search.references=[]", "--set", "resources.max_failures=8", "--set", "resources.cpus_per_trial=0.5",
    ]  # fmt: skip


def run_soak(
    workdir: Path,
    trials: int,
    concurrent: int,
    epochs: int,
    kills: int,
    seed: int = 7,
    timeout_s: float = 3000,
    kill_every_s: tuple[float, float] = (4.0, 10.0),
) -> Soak:
    """Run the soak sweep in `workdir` (its default stores) with the killer (a kill every `kill_every_s` seconds,
    drawn uniformly) and the memory sampler."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK_ENV: mark}
    cmd = [sys.executable, str(LAUNCH), *soak_args(trials, concurrent, epochs)]
    killer = Killer(seed=seed, limit=kills, mark=mark, low=kill_every_s[0], high=kill_every_s[1])
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    done = [0]
    phase_end: list[float] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            m = DONE_LINE.match(line)
            if m:
                done[0] = int(m.group(1))
                if m.group(1) == m.group(2) and not phase_end:
                    phase_end.append(time.monotonic() - t0)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killer.start()
    curve: list[tuple[float, int, float]] = []
    try:
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout_s:
                proc.kill()
                break
            mb = rss_mb(proc.pid)
            if mb is not None:
                curve.append((round(time.monotonic() - t0, 1), done[0], round(mb, 1)))
            time.sleep(1.0)
        proc.wait()
    finally:
        killer.stopped.set()
        killer.join(timeout=15)
        reader.join(timeout=30)
    out = "".join(lines)
    return Soak(
        returncode=proc.returncode,
        output=out,
        elapsed_s=round(time.monotonic() - t0, 1),
        kills=attribute_kills(workdir / "ray_results" / NAME, killer.kills),
        retries=sum(trial_failures(workdir / "ray_results" / NAME).values()),
        lost_worker_rounds=out.count("ended when their worker died"),
        lost_worker_trials=sum(int(n) for n in LOST_LINE.findall(out)),
        curve=curve,
        trial_phase_end_s=phase_end[0] if phase_end else None,
    )


def trial_phase(soak: Soak) -> list[tuple[float, int, float]]:
    """The samples from the first finished trial to the first with every trial finished (selection follows)."""
    out = []
    total = max((c[1] for c in soak.curve), default=0)
    for c in soak.curve:
        if c[1] >= 1:
            out.append(c)
        if total and c[1] == total:
            break
    return out


def slope_mb_per_100_trials(samples: list[tuple[float, int, float]], skip_first: float = 0.25) -> tuple[float, float]:
    """Least-squares slope of RSS against trials done (MB per 100 trials) with its standard error, over the
    samples after the first `skip_first` share of the trials (start-up: Tune's and MLflow's imports settle)."""
    import numpy as np

    if not samples:
        return float("nan"), float("nan")
    last = max(c[1] for c in samples)
    pts = [(c[1], c[2]) for c in samples if c[1] >= skip_first * last]
    if len(pts) < 3 or len({x for x, _ in pts}) < 2:
        return float("nan"), float("nan")
    x, y = np.array(pts, dtype=float).T
    a, b = np.polyfit(x, y, 1)
    resid = y - (a * x + b)
    se = float(np.sqrt(resid.var(ddof=2) / ((x - x.mean()) ** 2).sum()))
    return float(a * 100), se * 100


def figures(soak: Soak, trials: int, concurrent: int, epochs: int) -> dict[str, Any]:
    """The soak's headline figures (plain values)."""
    phase = trial_phase(soak)
    slope, se = slope_mb_per_100_trials(phase)
    return {
        "trials": trials,
        "concurrent": concurrent,
        "epochs": epochs,
        "kills": len(soak.kills),
        "kills_after_final": sum(k["after_final"] for k in soak.kills),
        "kills_before_first_report": sum(k["trial"] is None for k in soak.kills),
        "retries": soak.retries,
        "lost_worker_rounds": soak.lost_worker_rounds,
        "lost_worker_trials": soak.lost_worker_trials,
        "elapsed_s": soak.elapsed_s,
        "trial_phase_s": soak.trial_phase_end_s,
        "rss_first_trial_mb": phase[0][2] if phase else None,
        "rss_end_of_trials_mb": phase[-1][2] if phase else None,
        "rss_peak_mb": max((c[2] for c in soak.curve), default=None),
        "rss_slope_mb_per_100_trials": round(slope, 1),
        "rss_slope_se": round(se, 1),
    }


def write_results(soak: Soak, figs: dict[str, Any], out: Path) -> None:
    """soak.json (figures + provenance), soak.csv (the curve) and soak.png in `out`."""
    from benchmarks.provenance import provenance

    out.mkdir(parents=True, exist_ok=True)
    from benchmarks.common import command_line, utc_now

    record = {
        **figs,
        "command": command_line(__file__, sys.argv[1:]),
        "date": utc_now(),
        "kill_log": soak.kills,
        "provenance": provenance(),
    }
    (out / "soak.json").write_text(json.dumps(record, indent=1) + "\n")
    with open(out / "soak.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "trials_done", "driver_rss_mb"])
        w.writerows(soak.curve)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.plot([c[0] for c in soak.curve], [c[2] for c in soak.curve], lw=1)
    if soak.trial_phase_end_s is not None:
        ax.axvline(soak.trial_phase_end_s, color="grey", ls="--", lw=0.8, label="last trial done")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("driver RSS (MB)")
    ax.set_title(f"soak: {figs['trials']} trials, {figs['kills']} workers killed", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "soak.png")
    plt.close(fig)


def table(figs: dict[str, Any]) -> str:
    """The figures as a two-column table."""
    width = max(len(k) for k in figs)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in figs.items())


def main(argv: list[str] | None = None) -> int:
    """Run the soak and keep its figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--concurrent", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--workdir", type=Path, default=None, help="where the sweep's stores go (a temporary folder)")
    a = p.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = a.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        soak = run_soak(work, a.trials, a.concurrent, a.epochs, a.kills, a.seed)
    figs = figures(soak, a.trials, a.concurrent, a.epochs)
    print(table(figs))
    if soak.returncode != 0:
        print(soak.output[-4000:], file=sys.stderr)
        return 1
    write_results(soak, figs, a.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

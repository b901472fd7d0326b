"""What a user waits on around the trials, phase by phase, before and after issue #47, with each phase's floor.

    python -m benchmarks.perf.bench_phases --before efb685e [--repeats 2]

In one run, alternately: the default demo (`python sweeps/launch.py`, a fresh working directory each time) from a
worktree of `--before` and from this tree, each with its own code in the driver and the trials (PYTHONPATH); each
phase read from the sweep's own `Timing:` line. Beside them, in the same run, the floors: what each phase cannot go
below on this machine whatever the service does:

- Ray start: a bare `ray.init(include_dashboard=False)` in a fresh process (ray already imported);
- bootstrap: what the choice itself needs, validation accuracy and ECE of 16 candidates on 2,000 shared resamples
  of 900 rows, as the sweep computes them and as plain numpy does (bench_bootstrap.vs_numpy), the faster of the two;
- registration: a version of an already logged model registered with its alias on an existing SQLite store
  (MLflow's `create_model_version` and `set_registered_model_alias`), the model files already written;
- the rule: none measured (it reads the intervals; under 0.01 s in every sweep).

Writes benchmarks/results/phases.json and phases.md; docs/performance.md shows the table (generated block `phases`).
Wall seconds on a shared 2-core machine: the load averages are recorded with each run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, command_line, host_info, utc_now, write_json
from benchmarks.provenance import git_state, provenance

TIMING = re.compile(r"^Timing: (.*)$", re.M)
PHASE = re.compile(r"(Ray start|trials|closing the trials|bootstrap|rule|registration|report files) ([\d.]+)s")
CHAMPION = re.compile(r"the champion ([\d.]+)s after the last trial")
# (key, words in the table); "after_last_trial" is the sum of the phases after the trials
PHASES = [
    ("Ray start", "Ray start"),
    ("closing the trials", "closing the trials (Ray shut down, trial records read)"),
    ("bootstrap", "bootstrap (intervals the choice needs)"),
    ("rule", "rule"),
    ("registration", "registration of the champion"),
    ("report files", "every other interval and the report files"),
    ("champion_after_last_trial", "**the champion, after the last trial**"),
    ("after_last_trial", "**everything, after the last trial**"),
]

RAY_INIT = """
import time, ray
t = time.perf_counter()
ray.init(include_dashboard=False, log_to_driver=False)
print(time.perf_counter() - t)
ray.shutdown()
"""


def parse_timing(stdout: str) -> dict[str, float]:
    """The phases of a sweep's `Timing:` line (both trees print them by these names) and the two totals."""
    line = TIMING.search(stdout)
    if not line:
        raise SystemExit(f"no Timing line in the sweep's output:\n{stdout[-2000:]}")
    phases = re.sub(r"selection and registration [\d.]+s", "", line.group(1))  # their sum, not a phase
    out = {name: float(s) for name, s in PHASE.findall(phases)}
    after = ("closing the trials", "bootstrap", "rule", "registration", "report files")
    out["after_last_trial"] = sum(out[k] for k in after)
    champion = CHAMPION.search(line.group(1))
    # before the champion was registered ahead of the report, it was printed once everything had run
    out["champion_after_last_trial"] = float(champion.group(1)) if champion else out["after_last_trial"]
    return out


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def demo(tree: Path, workdir: Path) -> dict[str, Any]:
    """The default demo from `tree` in `workdir`: its phases, wall seconds and the load before it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    load = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(tree / "sweeps" / "launch.py")], cwd=workdir, capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the demo failed ({tree}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {"phases": parse_timing(proc.stdout), "wall_s": wall, "load_before": load}


def ray_init_floor() -> float:
    """Seconds of a bare ray.init in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", RAY_INIT], capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def registration_floor(repeats: int = 5) -> float:
    """Median seconds to register a version of an already logged model and set its alias (an existing store)."""
    import mlflow
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory() as d:
        mlflow.set_tracking_uri(f"sqlite:///{d}/mlflow.db")
        mlflow.set_registry_uri(f"sqlite:///{d}/mlflow.db")
        with mlflow.start_run() as run:
            (Path(d) / "model").mkdir()
            (Path(d) / "model" / "MLmodel").write_text("flavors: {}\n")
            mlflow.log_artifacts(str(Path(d) / "model"), "model")
        client = MlflowClient()
        source = f"runs:/{run.info.run_id}/model"
        times = []
        for i in range(repeats + 1):  # the first one warms the store's tables up
            t0 = time.perf_counter()
            client.create_registered_model(f"floor-{i}")
            v = client.create_model_version(f"floor-{i}", source, run.info.run_id)
            client.set_registered_model_alias(f"floor-{i}", "champion", v.version)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def bootstrap_floor() -> dict[str, Any]:
    """bench_bootstrap.vs_numpy: the choice's intervals by the sweep's path and by numpy, CPU seconds."""
    from benchmarks.perf.bench_bootstrap import vs_numpy

    return vs_numpy(repeats=3)


def worktree(rev: str, into: Path) -> Path:
    """A detached worktree of `rev` under `into`."""
    path = into / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True, capture_output=True
    )
    return path


def commit() -> str:
    """This tree's short commit, +uncommitted when the tracked files differ (provenance.git_state)."""
    head, clean = git_state()
    return (head or "unknown")[:7] + ("" if clean else "+uncommitted")


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's median over the runs."""
    return {k: statistics.median(r["phases"][k] for r in runs) for k, _ in PHASES}


def table(data: dict[str, Any]) -> str:
    """The phase table: before, after (medians, with the runs' range) and the floor."""
    before, after = data["median_s"]["before"], data["median_s"]["after"]
    fl = data["floors"]
    boot = fl["bootstrap"]
    floors = {
        "Ray start": f"{fl['ray_init_s']:.1f} (a bare `ray.init`)",
        "bootstrap": f"{min(boot['cpu_s'].values()):.2f} CPU (the choice's intervals: sweep {boot['cpu_s']['sweep']:.2f},"
        f" numpy {boot['cpu_s']['numpy']:.2f})",
        "registration": f"{fl['registration_s']:.2f} (a version and its alias, model files written)",
        "champion_after_last_trial": f"{min(boot['cpu_s'].values()) + fl['registration_s']:.2f} (the two above)",
    }

    def span(label: str, key: str) -> str:
        vals = [r["phases"][key] for r in data["runs"][label]]
        return f"{statistics.median(vals):.1f} ({min(vals):.1f}-{max(vals):.1f})"

    rows = [
        f"| phase | before ({data['before']}) s | after ({data['commit']}) s | floor s |",
        "|---|---|---|---|",
    ]
    rows += [
        f"| {words} | {span('before', k)} | {span('after', k)} | {floors.get(k, '')} |"
        for k, words in PHASES
        if k in before and k in after
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run both trees' demos alternately and the floors; write and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit before the work (efb685e: the issue's table)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "phases")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"before": worktree(args.before, Path(scratch)), "after": ROOT}
        try:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for rep in range(args.repeats):
                for label, tree in trees.items():
                    with tempfile.TemporaryDirectory() as work:
                        r = demo(tree, Path(work))
                    runs[label].append(r)
                    print(
                        f"repeat {rep + 1}/{args.repeats} {label}: {r['phases']} wall {r['wall_s']:.1f} s", flush=True
                    )
            floors = {"ray_init_s": ray_init_floor(), "registration_s": registration_floor()}
            floors["bootstrap"] = bootstrap_floor()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])], check=False)
    data = {
        "command": command_line(__file__, argv),
        "date": utc_now(),
        "before": args.before,
        "commit": commit(),
        "host": host_info(),
        "provenance": provenance(),
        "versions": {d: metadata.version(d) for d in ("ray", "mlflow", "optuna", "torch", "numpy", "numba")},
        "runs": runs,
        "median_s": {k: medians(v) for k, v in runs.items()},
        "floors": floors,
    }
    out = Path(args.out)
    write_json(out.with_suffix(".json"), data)
    text = table(data)
    loads = ", ".join(f"{r['load_before'][0]:.1f}" for label in runs for r in runs[label])
    out.with_suffix(".md").write_text(
        f"# What a user waits on after the trials, per phase (benchmarks/perf/bench_phases.py)\n\nCommand: "
        f"`{data['command']}`; {data['date']}, {host_info()['cpu_count']} CPUs; the default demo (8 trials, 16 "
        f"candidates), {args.repeats} runs per tree alternately, wall seconds: median (range); 1-minute load "
        f"averages before the runs: {loads}.\n\n{text}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

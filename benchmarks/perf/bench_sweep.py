"""Service overhead and concurrency speed-up: the same N trials through the sweep service and as a
plain sequential loop calling the trainer, on the same cores, measured side by side.

    python -m benchmarks.perf.bench_sweep [--trials 6] [--repeats 3] [--epochs 4] [--samples 3000]

(a) the service (`sweeps/launch.py`, a subprocess, wall time from start to exit: Python start,
Ray start, Tune, MLflow logging, selection, model registration) with 1 and with 2 trials at a
time; (b) a plain loop in a fresh process that loads the data and runs `Trainer.fit` for the
very configs the service's Optuna sampler drew (read back from MLflow), one thread each.
The service prints its own timing (Ray start, trials, selection and registration), so the
table separates the fixed cost of a sweep from the marginal cost of each trial:
marginal overhead per trial = (service's trial phase with 1 at a time - plain loop) / N.

    python -m benchmarks.perf.bench_sweep --startup [--repeats 3] [--before /tmp/old]

times the demo's start-up instead (process start -> first trial running, phase by phase: imports,
config and preflight, MLflow store, ray.init, Optuna storage, Tune setup, the first trial's process,
entry and imports) into benchmarks/results/startup.md/json; with `--before TREE` (e.g. made by
`git worktree add /tmp/old REV`) that checkout and this one run alternately, each with its own code in
the driver and in the trial processes (PYTHONPATH).
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
from sweeps.report.timing import START_PATTERN

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


TIMING = re.compile(START_PATTERN + r" ([\d.]+)s, trials ([\d.]+)s, selection and registration ([\d.]+)s")


def run_service(workdir: Path, name: str, trials: int, concurrent: int, extra: list[str]) -> dict[str, float]:
    """Wall seconds of one `launch.py` run (the whole process) and of its phases."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(LAUNCH),
            "--num-samples",
            str(trials),
            "--max-concurrent",
            str(concurrent),
            "--cpus-per-trial",
            "1",
            "--name",
            name,
            "--seed",
            "0",
            *extra,
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
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


# --------------------------------------------------------------------------- start-up mode
# A bootstrap run in place of `python sweeps/launch.py`: it notes the time, installs an import hook
# that wraps the sweep's phase functions (when their modules load, so import times are unchanged)
# and runs launch.py as __main__. Every wrapped call appends {event, t} lines to $STARTUP_EVENTS; the
# first trial's wrapper (pickled by value into the trial process) notes the process's start time,
# its entry, and the moment the trial's own modules are imported (= the trial is running).
STARTUP_BOOT = r"""
import json, os, sys, time, functools, importlib.abc
T_BOOT = time.time()
EVENTS = os.environ["STARTUP_EVENTS"]
def note(event, t=None):
    with open(EVENTS, "a") as f:
        f.write(json.dumps({"event": event, "t": time.time() if t is None else t, "pid": os.getpid()}) + "\n")
note("boot", T_BOOT)
def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        note(name + ":start")
        try:
            return fn(*a, **k)
        finally:
            note(name + ":end")
    return wrapper
def trial_probe(fn, events):
    @functools.wraps(fn)
    def probe(*a, **k):
        import json as _j, os as _o, sys, time as _t
        def _note(ev, t=None):
            with open(events, "a") as f:
                f.write(_j.dumps({"event": ev, "t": _t.time() if t is None else t, "pid": _o.getpid()}) + "\n")
        try:
            ticks = _o.sysconf("SC_CLK_TCK")
            start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
            boot = float([ln.split()[1] for ln in open("/proc/stat") if ln.startswith("btime")][0])
            _note("trial:process", boot + start)
        except Exception:
            pass
        _note("trial:entry")
        import torch, calib_core.data, calib_core.trainer  # noqa: F401  what every trial runs first
        _note("trial:running")
        _root = sys.modules[fn.__module__].__file__
        for _ in range(fn.__module__.count(".") + 1):  # up from the module's file to the checkout
            _root = _o.path.dirname(_root)
        _note("trial:code:" + _root)
        return fn(*a, **k)
    return probe
WRAP = {
    "sweeps.checks.preflight": ["check_config"],
    "sweeps.startup": ["preflight"],
    # before the split of service.py (an older checkout with --before) these lived in sweeps.service
    "sweeps.service": ["execute", "_connect_ray", "make_storage", "_build_tuner", "_searcher", "connect_ray", "build_tuner"],
    "sweeps.integrations.ray.tuner": ["make_storage", "make_searcher"],  # before issue #33: the searcher was built here
    "sweeps.integrations.optuna.study": ["make_storage", "make_searcher"],
    "sweeps.integrations.mlflow.store": [],
}
CANONICAL = {"_connect_ray": "connect_ray", "_build_tuner": "build_tuner", "_searcher": "make_searcher"}
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAP:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module
        def wrapped_exec(module, _exec=exec_module, _name=name):
            note("import:" + _name + ":start")
            _exec(module)
            note("import:" + _name + ":end")
            for attr in WRAP[_name]:
                if hasattr(module, attr):
                    setattr(module, attr, timed(CANONICAL.get(attr, attr), getattr(module, attr)))
            if _name == "sweeps.integrations.mlflow.store":
                cls = module.MlflowStore
                cls.ensure_experiment = timed("ensure_experiment", cls.ensure_experiment)
            if _name == "sweeps.service":
                from ray import tune
                tune.Tuner.fit = timed("Tuner.fit", tune.Tuner.fit)
            if hasattr(module, "train_trial") and _name in ("sweeps.service", "sweeps.integrations.ray.tuner"):
                module.train_trial = trial_probe(module.train_trial, EVENTS)
        spec.loader.exec_module = wrapped_exec
        return spec
sys.meta_path.insert(0, Hook())
import runpy
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    note("exit")
"""

# (label, first event, last event) in order; a phase absent in a run (e.g. Optuna in memory) is blank
STARTUP_PHASES = [
    ("interpreter, CLI imports, config load", "spawn", "check_config:start"),
    ("config checks (check_config)", "check_config:start", "check_config:end"),
    ("preflight (paths, store, resources)", "preflight:start", "preflight:end"),
    (
        "driver imports (sweeps.service: Ray Tune, MLflow, ...)",
        "import:sweeps.service:start",
        "import:sweeps.service:end",
    ),
    ("MLflow store creation/migration + experiment", "ensure_experiment:start", "ensure_experiment:end"),
    ("execute() up to ray.init (parent run, callbacks)", "execute:start", "connect_ray:start"),
    ("ray.init", "connect_ray:start", "connect_ray:end"),
    ("Optuna study storage (RDBStorage)", "make_storage:start", "make_storage:end"),
    ("Tune setup (Tuner, searcher)", "build_tuner:start", "build_tuner:end"),
    ("Tuner.fit -> first trial's process started", "Tuner.fit:start", "trial:process"),
    ("Tuner.fit -> first trial's function entered", "Tuner.fit:start", "trial:entry"),
    ("first trial's imports (torch, calib_core)", "trial:entry", "trial:running"),
    ("process start -> first trial running", "spawn", "trial:running"),
]


def startup_run(launch: Path, workdir: Path, name: str, extra: list[str]) -> dict[str, float]:
    """One `launch.py` run under the bootstrap: the seconds from process start to each event (first occurrence)."""
    events = workdir / f"{name}.events"
    boot = workdir / "startup_boot.py"
    boot.write_text(STARTUP_BOOT)
    # the tree's own code in the driver and in the trial processes (else Ray's workers take the editable install)
    tree = launch.resolve().parent.parent
    env = {
        **os.environ,
        "STARTUP_EVENTS": str(events),
        "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    t_spawn = time.time()
    proc = subprocess.run(
        [sys.executable, str(boot), str(launch), "--name", name, *extra],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"service run failed ({launch}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    first: dict[str, float] = {"spawn": 0.0}
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        first.setdefault(ev["event"], ev["t"] - t_spawn)
    code = [e.removeprefix("trial:code:") for e in first if e.startswith("trial:code:")]
    if code != [str(tree)]:
        raise SystemExit(f"the trials ran code from {code}, not from {tree}")
    return {k: v for k, v in first.items() if not k.startswith("trial:code:")}


def startup_table(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """Median seconds of each phase (its start -> end) per tree, and when it ends after process start."""
    labels = list(runs)
    head = "| phase | " + " | ".join(f"{k} s (ends at s)" for k in labels) + " |"
    rows = [head, "|---|" + "---|" * len(labels)]
    for label, a, b in STARTUP_PHASES:
        cells = []
        for k in labels:
            spans = [r[b] - r[a] for r in runs[k] if a in r and b in r]
            ends = [r[b] for r in runs[k] if b in r]
            cells.append(f"{statistics.median(spans):.2f} ({statistics.median(ends):.2f})" if spans else "")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def startup_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Start-up phases of the demo sweep, this tree and (--before REV_TREE) another tree run alternately."""
    trees = {"after": LAUNCH}
    if args.before:
        trees = {"before": Path(args.before).resolve() / "sweeps" / "launch.py", "after": LAUNCH}
    # the demo's config and trials; fewer and shorter trials only shorten the run after start-up
    extra = [
        "--num-samples",
        "2",
        "--set",
        "run.train.epochs=1",
        "--set",
        "run.data.num_samples=1500",
        "--set",
        "selection.num_resamples=100",
        "--seed",
        "0",
    ]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    loads = []
    for rep in range(args.repeats):
        for label, launch in trees.items():
            with tempfile.TemporaryDirectory() as d:
                loads.append(loadavg())
                r = startup_run(launch, Path(d), f"startup-{label}-{rep}", extra)
                runs[label].append(r)
                print(
                    f"repeat {rep + 1}/{args.repeats} {label}: first trial running at "
                    f"{r.get('trial:running', float('nan')):.2f}s (load {loads[-1]})",
                    flush=True,
                )
    table = startup_table(runs)
    header = (
        f"`python sweeps/launch.py` (demo config, fresh working directory: new mlflow.db and optuna.db), "
        f"seconds from process start; median of {args.repeats} runs per tree, run alternately; "
        f"{os.cpu_count()} cores; load averages before each run: {', '.join(loads)}"
    )
    print("\n" + header + "\n" + "\n".join(table))
    out = Path(args.out)
    write_json(
        out.with_suffix(".json"),
        {
            "command": command_line(__file__, argv),
            "header": header,
            "trees": {k: str(v) for k, v in trees.items()},
            "raw": runs,
            "table": table,
        },
    )
    out.with_suffix(".md").write_text(f"# Sweep start-up\n\n{header}\n\n" + "\n".join(table) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--startup",
        action="store_true",
        help="measure the demo's start-up phases instead (benchmarks/results/startup.md/json)",
    )
    ap.add_argument(
        "--before",
        metavar="TREE",
        help="with --startup: another checkout (git worktree add /tmp/old REV) run alternately",
    )
    args = ap.parse_args(argv)
    if args.startup:
        args.out = args.out or str(RESULTS_DIR / "startup.json")
        return startup_main(args, argv)
    args.out = args.out or str(RESULTS_DIR / "bench_sweep.json")
    extra = ["--set", f"run.train.epochs={args.epochs}", "--set", f"run.data.num_samples={args.samples}"]
    rows: dict[str, list] = {"plain": [], "service_1": [], "service_2": []}
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            wd = Path(d)
            rows["service_1"].append(run_service(wd, f"c1-{rep}", args.trials, 1, extra))
            configs = sampled_configs(wd, f"c1-{rep}")
            rows["plain"].append({"wall": run_plain(configs, wd)["wall"]})
            rows["service_2"].append(run_service(wd, f"c2-{rep}", args.trials, 2, extra))
        print(
            f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]['wall']:.1f}s" for k, v in rows.items()),
            flush=True,
        )

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
        f"{med(k, 'trials'):.1f} | {med(k, 'finish'):.1f} |"
        for c, k in ((1, "service_1"), (2, "service_2"))
    ]
    summary = [
        f"marginal service overhead per trial (trial phase, 1 at a time, vs plain loop): {marginal:.2f} s",
        f"fixed cost per sweep (process start, imports, Ray start, selection, registration): {fixed:.1f} s",
        f"speed-up of the trial phase from concurrency (1 -> 2 at a time): "
        f"{med('service_1', 'trials') / med('service_2', 'trials'):.2f}x",
        f"whole sweep, 2 at a time, vs plain loop: {plain / med('service_2', 'wall'):.2f}x",
    ]
    header = (
        f"{n} trials (MNIST-1D {args.samples} samples, cnn1d, {args.epochs} epochs), "
        f"median of {args.repeats} repeats, {os.cpu_count()} cores"
    )
    print("\n" + header + "\n" + "\n".join(table) + "\n\n" + "\n".join(summary))
    write_json(
        Path(args.out),
        {
            "command": command_line(__file__, argv),
            "header": header,
            "raw": rows,
            "table": table,
            "summary": summary,
            "marginal_overhead_per_trial_s": marginal,
            "fixed_cost_s": fixed,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The sweep's closing after its last trial (issue 47 item 1): CPU seconds per phase of the Timing line
(bootstrap, rule, report files, registration), this tree side by side with an earlier commit, on the same saved
trials.

    python -m benchmarks.perf.bench_closing --tune-dir DIR --study-db optuna.db        # this tree vs --base
    python -m benchmarks.perf.bench_closing --tune-dir DIR --study-db optuna.db --candidates 200
    python -m benchmarks.perf.bench_closing --tune-dir DIR --study-db optuna.db --profile out.prof --only this

DIR is a finished sweep's Ray Tune folder (ray_results/<name>: its trials' final checkpoints with predictions,
params.json, result.json), e.g. of `python sweeps/launch.py --num-samples 2 --set run.train.epochs=2 --name
closeprof` run in a scratch folder (checkpoints saved by an earlier commit get the gate record this tree's trials
write, with_gate_records); --study-db that sweep's optuna.db (the report's parameter importances and the
champion's mark read the study). `--set KEY=VALUE` (repeatable) sets a config value for both trees' closing (e.g.
selection.rule=margin, where the trees' default rules differ). `--candidates M` repeats the saved trials to M trials
(each a copy with its probabilities tempered by a seeded factor and its accuracy and ECE recomputed from them), as
at scale.

After one discarded run per tree (a fresh worktree compiles the metrics' numba kernels into its cache, which a
sweep's driver finds there), each repeat runs, in fresh subprocesses and alternating (so a burst of load hits both alike), the closing as the
service runs it (sweeps.service._choose_and_register: bootstrap, rule, report files, registration with the champion
gate, the HTML report, the parent run FINISHED) on a fresh SQLite MLflow store holding the trials' runs and a copy of
the study, once with this tree and once with `--base` (default: the commit before this benchmark's cuts, extracted
with `git worktree`). The phases are the service's own PhaseClock boundaries, in the order the tree runs them
(this tree registers the champion before the report files: "to the champion" is what the user waits on before the
champion is printed, "after the last trial" everything); each phase's CPU seconds are the process's (all threads)
plus its children's, so they stay comparable on a loaded machine where wall seconds are not. The driver modules a
sweep has imported before its closing (sweeps.service and what it imports, MLflow's store) are imported before the
clock starts; what the closing imports itself is counted, as in a sweep. A tree with sweeps/closing_warmup.py makes
the closing's first imports while the trials run: the child runs that warm-up to its end before the clock starts
(the demo's trials last ~20 s, the warm-up ~4 s of CPU) and reports its CPU seconds apart ("warm-up, during the
trials"). Each child also reports the champion and digests of every interval of the sweep's result (in order), of
the terminal's summary from the leaderboard to the "Registered:" line and of the parent run's selection.json and
leaderboard.csv (run ids left out); the .md says whether every run of both trees agrees on each.

Writes benchmarks/results/closing.json and closing.md (medians of the repeats, per phase and tree, with the commit,
package versions, CPU, threads and load average).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("bootstrap", "select", "report", "registration")  # every tree's phases (in this tree's order or not)
ROWS = ("warmup", *PHASES, "to_champion", "total")
ROW_NAMES = {"warmup": "warm-up, during the trials", "to_champion": "to the champion", "total": "after the last trial"}
DEFAULT_BASE = "ae2fef8"  # the tree before issue 47 item 1's cuts
SWEEP = "closeprof"


# ----------------------------------------------------------------------------------------------- the child
def _final_checkpoint(trial_dir: Path) -> Path | None:
    done = [c for c in sorted(trial_dir.glob("checkpoint_*")) if (c / "final.json").is_file()]
    return done[-1] if done else None


def _last_result(trial_dir: Path) -> dict[str, Any]:
    lines = [ln for ln in (trial_dir / "result.json").read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1])


def _tempered(src: Path, dst: Path, factor: float, num_bins: int) -> dict[str, float]:
    """A copy of checkpoint `src` in `dst` whose probabilities are tempered by `factor` (p^f renormalised); the
    recomputed accuracy and ECE by key."""
    import numpy as np

    from calib_core.metrics import compute_all

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "predictions.npz":
            (dst / f.name).symlink_to(f)
    out, metrics = {}, {}
    with np.load(src / "predictions.npz") as z:
        for k in z.files:
            a = z[k]
            if k.endswith("_probs") and a.ndim == 2:
                p = np.power(np.clip(a.astype(np.float64), 1e-12, 1.0), factor)
                a = (p / p.sum(axis=1, keepdims=True)).astype(a.dtype)
            out[k] = a
    np.savez_compressed(dst / "predictions.npz", **out)
    for pre in ("", "ts_"):
        for split in ("val", "test"):
            if f"{pre}{split}_probs" in out:
                m = compute_all(out[f"{pre}{split}_probs"], out[f"{pre}{split}_labels"], num_bins=num_bins)
                metrics.update({f"{pre}{split}_{k}": float(v) for k, v in m.items() if k in ("accuracy", "ece")})
    return metrics


def _trials(tune_dir: Path, work: Path, candidates: int, num_bins: int) -> list[dict[str, Any]]:
    """[{trial_id, config, metrics, checkpoint}] of the saved trials, repeated to `candidates` when given."""
    base = []
    for d in sorted(p for p in tune_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial_")):
        ck = _final_checkpoint(d)
        if ck is None:
            continue
        res = _last_result(d)
        base.append(
            {
                "trial_id": str(res.get("trial_id") or d.name.split("_")[2]),
                "config": json.loads((d / "params.json").read_text()),
                "metrics": res,
                "checkpoint": ck,
            }
        )
    if not candidates or candidates <= len(base):
        return base
    out = list(base)
    for i in range(len(base), candidates):
        b = base[i % len(base)]
        factor = 0.7 + 0.6 * ((i * 0.6180339887) % 1.0)
        ck = work / "synthetic" / f"t{i:05d}"
        metrics = {**b["metrics"], **_tempered(b["checkpoint"], ck, factor, num_bins)}
        out.append({"trial_id": f"s{i:05d}", "config": b["config"], "metrics": metrics, "checkpoint": ck})
    return out


def with_gate_records(tune_dir: Path) -> int:
    """Give each saved trial's final checkpoint the gate record a trial of this tree writes (sweeps.integrations.ray
    .trainable._gate_record: sweeps.decide.gate.seen_record of its splits) where it lacks one (a sweep saved by an
    earlier commit); the count written. An earlier tree ignores the files."""
    from calib_core.config import RunConfig
    from calib_core.data import load_dataset
    from sweeps.contract import GATE_DIR
    from sweeps.decide.gate import seen_record, write_seen_record

    written = 0
    for d in sorted(p for p in tune_dir.iterdir() if p.is_dir() and p.name.startswith("train_trial_")):
        ck = _final_checkpoint(d)
        if ck is None or (ck / GATE_DIR).is_dir():
            continue
        cfg = RunConfig.model_validate(json.loads((ck / "summary.json").read_text())["run_config"])
        record = seen_record(load_dataset(cfg.data, cfg.seed))
        if record is not None:
            write_seen_record(ck / GATE_DIR, *record)
            written += 1
    return written


def _records(args: argparse.Namespace, work: Path, cfg: Any, store: Any, experiment_id: str) -> list[Any]:
    """The saved trials as the driver holds them after its trials, each with a finished MLflow run of its own
    (params, numeric results)."""
    from ray.tune import Checkpoint

    from sweeps.contract import ROLE_TRIAL, SPLITS, TAG_ROLE, TAG_SWEEP, TAG_TRIAL, TS_PREFIX, is_number
    from sweeps.decide.selection import TrialRecord
    from sweeps.trial_params import describe_params

    splits = tuple(f"{p}{s}_" for s in SPLITS for p in ("", TS_PREFIX))
    records = []
    for t in _trials(Path(args.tune_dir), work, args.candidates, cfg.run.train.num_bins):
        numeric = {k: float(v) for k, v in t["metrics"].items() if is_number(v)}
        tags = {TAG_SWEEP: SWEEP, TAG_TRIAL: t["trial_id"], TAG_ROLE: ROLE_TRIAL}
        rid = store.create_run(experiment_id, t["trial_id"], tags)
        store.log_params(rid, t["config"])
        store.log_metrics(rid, numeric, step=int(t["metrics"].get("epoch", 0)))
        store.terminate(rid, "FINISHED")
        records.append(
            TrialRecord(
                trial_id=t["trial_id"],
                label=describe_params(t["config"]),
                status=str(t["metrics"].get("status") or "completed"),
                metrics={k: v for k, v in numeric.items() if k.startswith(splits)},
                params=t["config"],
                run_id=rid,
                checkpoint=Checkpoint.from_directory(str(t["checkpoint"])),
            )
        )
    return records


def _child(args: argparse.Namespace) -> None:
    """One closing, timed per phase; a JSON line on stdout."""
    import resource

    # what the driver has imported when its trials end
    import sweeps.service as service
    from sweeps.config import load_sweep_config
    from sweeps.config_defaults import with_defaults
    from sweeps.integrations.mlflow.store import MlflowStore
    from sweeps.report.timing import PhaseClock

    work = Path(args.work)
    shutil.copy(args.study_db, work / "optuna.db")
    cfg = with_defaults(
        load_sweep_config(None, ["run.train.epochs=2", *args.set], {"name": SWEEP, "search.num_samples": 2}),
        cluster=False,
        workdir=work,
    )
    store = MlflowStore(cfg.tracking.uri)
    experiment_id = store.ensure_experiment(cfg.tracking.experiment)
    parent_id = store.find_or_create_parent(experiment_id, SWEEP, {})
    records = _records(args, work, cfg, store, experiment_id)
    opened = type("Opened", (), {"experiment_id": experiment_id, "parent_id": parent_id})()
    run = type(
        "Run", (), {"cfg": cfg, "store": store, "opened": opened, "exp_path": str(work / "ray_results" / SWEEP)}
    )()

    cpu: dict[str, float] = {}

    def now() -> float:
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    warm = _warm_up()
    marks = {"start": now()}
    order: list[str] = []
    original = PhaseClock.end

    def end(self: Any, phase: str) -> None:
        original(self, phase)
        marks[phase] = now()
        order.append(phase)

    PhaseClock.end = end  # type: ignore[method-assign]
    clock = PhaseClock()
    for p in ("ray_start", "trials", "closing"):
        clock.end(p)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU seconds (of the main thread)
        profiler.enable()
    import inspect

    kwargs: dict[str, Any] = {}
    if "startup" in inspect.signature(service._choose_and_register).parameters:
        from sweeps.start_steps import Startup

        kwargs["startup"] = Startup()
    printed = io.StringIO()
    with _stdout(printed):
        result = service._choose_and_register(run, records, False, False, clock, **kwargs)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    order = order[order.index("closing") :]  # the closing's phases in the order this tree ran them
    wall: dict[str, float] = {}
    for a, b in zip(order, order[1:]):
        cpu[b] = marks[b] - marks[a]
        wall[b] = clock.ends[b] - clock.ends[a]
    upto = order[1 : order.index("registration") + 1]  # the champion is printed once registration has ended
    cpu["to_champion"], wall["to_champion"] = sum(cpu[p] for p in upto), sum(wall[p] for p in upto)
    cpu["total"], wall["total"] = sum(cpu[p] for p in PHASES), sum(wall[p] for p in PHASES)
    cpu["warmup"], wall["warmup"] = warm["cpu"], warm["wall"]
    out = {"cpu": cpu, "wall": wall, "order": order[1:], "warmup_steps": warm["steps"], "candidates": len(records)}
    print(json.dumps({**out, **_outcome(result, printed.getvalue(), store, parent_id)}))


def _warm_up() -> dict[str, Any]:
    """The closing's warm-up (sweeps/closing_warmup.py, in a tree that has it) run to its end, as the sweep runs it
    while its trials run: its CPU seconds (its thread's), wall seconds and the steps done."""
    import sweeps

    # a tree before the warm-up (the editable install would find this checkout's module for it)
    if not (Path(sweeps.__file__).parent / "closing_warmup.py").is_file():
        return {"cpu": 0.0, "wall": 0.0, "steps": []}
    from sweeps.closing_warmup import ClosingWarmup

    t0 = time.perf_counter()
    warmup = ClosingWarmup()
    warmup.start()
    warmup.wait(600)
    return {"cpu": warmup.cpu_s, "wall": time.perf_counter() - t0, "steps": warmup.done, "error": warmup.error}


def _outcome(result: Any, printed: str, store: Any, parent_id: str) -> dict[str, Any]:
    """What must not differ between trees: the champion, digests of every interval of the result, of the terminal's
    summary (leaderboard to the `Registered:` line) and of the parent run's selection.json and leaderboard.csv
    (without the run ids, which every fresh store makes anew)."""
    import pandas as pd

    def sha1(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()

    summary = printed[printed.index("Leaderboard") : printed.index("\n", printed.index("Registered: "))]
    intervals = json.dumps({t: {k: list(v) for k, v in d.items()} for t, d in result.intervals.items()})
    with tempfile.TemporaryDirectory() as d:
        sel = json.loads(Path(store.client.download_artifacts(parent_id, "sweep/selection.json", d)).read_text())
        board = pd.read_csv(store.client.download_artifacts(parent_id, "sweep/leaderboard.csv", d))
    sel["champion_run"] = None
    return {
        "version": result.model_version,
        "champion": result.champion_trial_id,
        "intervals_sha1": sha1(intervals),
        "num_intervals": sum(len(d) for d in result.intervals.values()),
        "summary_sha1": sha1(summary),
        "selection_json_sha1": sha1(json.dumps(sel, indent=1)),
        "leaderboard_csv_sha1": sha1(board.drop(columns=["run_id"]).to_csv(index=False)),
    }


class _stdout:
    """sys.stdout to `f` for the block (the closing prints the sweep's summary)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> None:
        self.saved, sys.stdout = sys.stdout, self.f

    def __exit__(self, *exc: Any) -> None:
        sys.stdout = self.saved


# ----------------------------------------------------------------------------------------------- the parent
def _run_child(tree: Path, args: argparse.Namespace, profile: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-closing-") as work:
        cmd = [
            sys.executable, str(Path(__file__).resolve()),
            "--child", "--work", work, "--tune-dir", str(Path(args.tune_dir).resolve()),
            "--study-db", str(Path(args.study_db).resolve()), "--candidates", str(args.candidates),
            *(f"--set={kv}" for kv in args.set),
        ]  # fmt: skip
        if profile:
            cmd += ["--profile", profile]
        env = {**os.environ, "PYTHONPATH": str(tree)}  # that tree's sweeps and calib_core
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"closing in {tree} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _base_tree(rev: str, into: Path) -> Path:
    path = into / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True, capture_output=True
    )
    return path


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {d: metadata.version(d) for d in ("mlflow", "torch", "numpy", "optuna", "ray", "matplotlib", "numba")}


def _commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def _command(argv: list[str]) -> str:
    """The command line as run, without the --note paragraph (the .md prints it after the table)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--note="):
            skip = False
            continue
        if a == "--note":
            skip = True
            continue
        out.append(shlex.quote(a))
    return " ".join(out)


def _table(data: dict[str, Any]) -> str:
    trees = data["trees"]
    head = "| phase | " + " | ".join(f"{t} CPU s" for t in trees) + " | " + " | ".join(f"{t} wall s" for t in trees)
    lines = [head + " |", "|---" * (1 + 2 * len(trees)) + "|"]
    for p in ROWS:
        cells = [f"{data['median_cpu'][t][p]:.2f}" for t in trees] + [f"{data['median_wall'][t][p]:.2f}" for t in trees]
        name = ROW_NAMES.get(p, p)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _agreement(samples: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """Whether every run of every tree gave the same champion, intervals, terminal summary and report files."""
    runs = [r for rs in samples.values() for r in rs]
    keys = ("champion", "intervals_sha1", "summary_sha1", "selection_json_sha1", "leaderboard_csv_sha1")
    return {k: len({r.get(k) for r in runs}) == 1 for k in keys}


def _write(
    args: argparse.Namespace,
    argv: list[str] | None,
    samples: dict[str, list[dict[str, Any]]],
    trees: list[str],
    load_start: tuple[float, ...],
) -> None:
    """closing.json and closing.md: medians per phase and tree, with the conditions."""
    med_cpu = {t: {ph: statistics.median(s["cpu"][ph] for s in runs) for ph in ROWS} for t, runs in samples.items()}
    med_wall = {t: {ph: statistics.median(s["wall"][ph] for s in runs) for ph in ROWS} for t, runs in samples.items()}
    agree = _agreement(samples)
    import torch

    data = {
        "command": "python -m benchmarks.perf.bench_closing " + _command(argv if argv is not None else sys.argv[1:]),
        "note": args.note,
        "when_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": _commit(),
        "versions": _versions(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": [list(load_start), list(os.getloadavg())],
        "candidates": samples[next(iter(samples))][0]["candidates"],
        "repeats": args.repeats,
        "trees": trees,
        "median_cpu": med_cpu,
        "median_wall": med_wall,
        "order": {t: runs[0]["order"] for t, runs in samples.items()},
        "agreement": agree,
        "champion": samples[next(iter(samples))][0]["champion"],
        "num_intervals": samples[next(iter(samples))][0]["num_intervals"],
        "samples": samples,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    md = (
        f"# The closing after the last trial, per phase (benchmarks/perf/bench_closing.py)\n\n"
        f"Command: `{data['command']}`; {data['when_utc']} UTC, commit {data['commit']}, {data['cpus']} CPUs, "
        f"{data['torch_threads']} torch threads, load average {load_start[0]:.1f} at start and "
        f"{data['load_average'][1][0]:.1f} at end (a shared machine: CPU seconds are the comparable figure, wall "
        f"seconds are inflated by the load). {data['candidates']} trials (and their + TS candidates); medians of "
        f"{args.repeats} alternating "
        f"runs per tree. Versions: "
        + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
        + ".\n\n"
        + _table(data)
        + "\n\n"
        + "Order of the phases: "
        + "; ".join(f"{t}: {', '.join(data['order'][t])}" for t in trees)
        + ".\n"
        + f"Same champion ({data['champion']}) in every run of both trees: {agree['champion']}; the same "
        f"{data['num_intervals']} intervals in the same order (SweepResult.intervals, digest): "
        f"{agree['intervals_sha1']}; the same terminal summary, leaderboard to `Registered:` (digest): "
        f"{agree['summary_sha1']}; the same sweep/selection.json and sweep/leaderboard.csv on the parent run (digests, "
        f"run ids left out): {agree['selection_json_sha1']}, {agree['leaderboard_csv_sha1']}.\n"
        + (f"\n{args.note}\n" if args.note else "")
    )
    out.with_suffix(".md").write_text(md)
    print(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tune-dir", required=True)
    p.add_argument("--study-db", required=True)
    p.add_argument("--candidates", type=int, default=0, help="repeat the saved trials to this many (0: as saved)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config value for both trees' closing"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--base", default=DEFAULT_BASE, help="git revision timed beside this tree ('none': skip)")
    p.add_argument("--only", choices=("this", "base"), default=None)
    p.add_argument("--profile", default="", help="cProfile output of one closing (with --only)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "closing"))
    p.add_argument("--note", default="", help="a paragraph for the .md after the table (how the fixture was made)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    sys.path.insert(0, str(ROOT))
    print(f"gate records added to {with_gate_records(Path(args.tune_dir))} saved checkpoints", flush=True)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-closing-trees-") as tmp:
        trees: dict[str, Path] = {}
        if args.only != "this" and args.base != "none":
            trees[f"base {args.base}"] = _base_tree(args.base, Path(tmp))
        if args.only != "base":
            trees["this tree"] = ROOT
        try:
            if args.profile:
                ((name, tree),) = trees.items()
                print(json.dumps(_run_child(tree, args, str(Path(args.profile).resolve()))))
                return 0
            samples: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
            for tree in trees.values():  # discarded: numba's kernels compiled into a fresh tree's cache
                _run_child(tree, args)
            for i in range(args.repeats):
                for name, tree in trees.items():
                    r = _run_child(tree, args)
                    samples[name].append(r)
                    print(
                        f"repeat {i + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"].items()), flush=True
                    )
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True
                    )
    _write(args, argv, samples, list(trees), load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

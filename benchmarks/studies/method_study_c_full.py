"""Method study, protocol C (issue #31): the full factorial, run by `python -m benchmarks.studies.method_study_c full`.

    python -m benchmarks.studies.method_study_c full --regimes overconf --workers 2   # tune + evaluate what is missing
    python -m benchmarks.studies.method_study_c full --report-only                     # the report from the compact files
    python -m benchmarks.studies.method_study_c full --regimes overconf --retune onego_ts/none   # the edge rule's re-tune

Protocol: `benchmarks/studies/protocols/method_study_c.md` / `.yaml` (4 objectives x 2 posts per regime; R = 3 tuning
replicates of 32 TPE trials each; evaluation of each replicate's chosen configuration on seeds 301-324). Built by
composition: a run is the slice's `stacked_run` (train, then TS on all validation rows with 5-fold cross-fitted
validation NLL), its configuration protocol A's `run_config`, the search protocol A's `tpe_search` (seeded
Optuna TPE), the verdicts the slice's `evaluate_claim` (Holm across regimes, the protocol's rules) fed by a
two-way (pigeonhole) bootstrap over replicates x seeds.

Storage (`benchmarks/results/method_study_c/`): `full_runs.csv.gz`, one row per tuning run and two per evaluation
run (post `none` and `ts`: an evaluation run of a `none` cell records TS stacked on it, one of a `ts` cell its
backbone without TS), every row with `benchmarks.provenance` and the source hash; `full_rows_<regime>.npz`, the
compact test rows (confidence one byte, bin-exact, `row_encoding.py`; the first runs' uint16 still read;
bit-packed correctness) of the cells a claim names, replicate 1, the first 2 evaluation seeds (protocol
deviation 2). New rows are appended to `full_runs.journal.csv` as they finish
(crash-safe: a truncated last line is dropped) and merged into the table when the command ends. A finished run
is a row and is never rerun; a trial whose rows exist is replayed (the TPE sampler is seeded, so re-asking it
after the same history draws the same parameters; a mismatch stops the study). A tuning run whose parameters
and seed equal those of a finished tuning run of the same objective and regime (the two posts of one replicate
share the sampler seed, so their 16 random start-up trials coincide) reuses that run's training (`shared_from`).

`--workers N`: N lanes, each a thread in this process driving one worker process (spawned, one torch thread,
deterministic algorithms); a lane takes one (objective, replicate) tuning task at a time (both posts, the data
of its two tuning seeds cached in its process) and then one evaluation seed at a time; only this process writes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import queue
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ROOT, utc_now
from benchmarks.provenance import FIELDS as PROVENANCE_FIELDS
from benchmarks.provenance import check_same_commit, provenance
from benchmarks.studies import method_study_c_slice as msc
from benchmarks.studies.protocol_a import run_config, tpe_search

STUDY = "full"
KEY = ("regime", "stage", "objective", "cell_post", "round", "replicate", "trial", "seed", "post")
INTS = (*msc.INT_COLUMNS, "round", "replicate", "trial", "chosen_trial")
COLUMNS = (
    *KEY,
    "status",
    "reason",
    "params",
    "chosen_trial",
    "space",
    "epochs_run",
    "best_epoch",
    "temperature",
    "val_objective",
    "val_nll",
    "val_nll_ts_insample",
    "val_nll_ts_crossfit",
    *(f"test_{m}" for m in msc.METRICS),
    "wall_s",
    "ts_wall_s",
    "shared_from",
    "finished_utc",
    *PROVENANCE_FIELDS,
    "optuna",
    "source_sha256",
)
POSTS = ("none", "ts")
TINY = {"num_samples": 600, "epochs": 2, "trials": 4, "startup_trials": 2, "eval_seeds": 2}
REPORT_METRICS = msc.REPORT_METRICS
MEAN_METRICS = ("accuracy", "ece", "debiased_l2_ce", "nll", "brier", "smooth_ece")


def _order(r: dict[str, Any]) -> tuple:
    return (
        r["regime"],
        r["stage"],
        r["objective"],
        r["cell_post"],
        int(r["round"]),
        int(r["replicate"]),
        -1 if r.get("trial") is None else int(r["trial"]),
        int(r["seed"]),
        r["post"],
    )


def _key(r: dict[str, Any]) -> tuple:
    return _order(r)


def journal_path(out: Path) -> Path:
    return out / f"{STUDY}_runs.journal.csv"


def rows_file(out: Path, regime: str) -> Path:
    return msc.rows_path(out, regime, STUDY)


# ------------------------------------------------------------------------------------------
# the per-run table: full_runs.csv.gz + an append-only journal of rows finished since the last merge
# ------------------------------------------------------------------------------------------
def read_rows(out: Path) -> list[dict[str, Any]]:
    """The table's rows and the journal's (a truncated last journal line is dropped), one per key."""
    rows = msc.read_table(msc.table_path(out, STUDY), INTS)
    jp = journal_path(out)
    if jp.is_file():
        text = jp.read_text()
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # a crash mid-write: the partial line is not a row
        rows += msc.parse_rows(csv.DictReader(io.StringIO(text)), INTS)
    return list({_key(r): r for r in rows}.values())


class RunTable:
    """The study's rows in memory; `add` appends to the journal (flushed, fsynced), `merge` rewrites the table."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows = read_rows(out)
        self.lock = threading.RLock()
        self._index()

    def _index(self) -> None:
        self.by_key = {_key(r): r for r in self.rows}
        self.shared: dict[tuple, dict[str, Any]] = {}
        for r in self.rows:
            if r["stage"] == "tune" and not r.get("shared_from"):
                self.shared.setdefault(_share_key(r), r)

    def get(self, **k: Any) -> dict[str, Any] | None:
        return self.by_key.get(_key({"trial": None, **k}))

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        with self.lock:
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
            text = buf.getvalue()
            jp = journal_path(self.out)
            jp.parent.mkdir(parents=True, exist_ok=True)
            with jp.open("a") as f:
                f.write(text if f.tell() == 0 else text.split("\n", 1)[1])
                f.flush()
                os.fsync(f.fileno())
            for r in msc.parse_rows(csv.DictReader(io.StringIO(text)), INTS):  # as a later reader parses them
                self.by_key[_key(r)] = r
                if r["stage"] == "tune" and not r.get("shared_from"):
                    self.shared.setdefault(_share_key(r), r)
            self.rows = list(self.by_key.values())

    def merge(self) -> None:
        """Rewrite full_runs.csv.gz with every row (sorted; reproducible bytes), then drop the journal.

        The rows are read back from disk (the table and the journal), not taken from memory: a stop signal can
        end `add` between its fsynced journal line and its update of `rows`, and that row must not be lost."""
        with self.lock:
            jp = journal_path(self.out)
            if not jp.is_file():
                return
            self.rows = read_rows(self.out)
            msc.write_table(msc.table_path(self.out, STUDY), self.rows, COLUMNS, _order)
            jp.unlink()


def _canon(params: dict[str, float] | str) -> str:
    p = json.loads(params) if isinstance(params, str) else params
    return json.dumps({k: float(v) for k, v in p.items()}, sort_keys=True)


def _share_key(r: dict[str, Any]) -> tuple:
    return (r["regime"], r["objective"], int(r["seed"]), _canon(r["params"]))


# ------------------------------------------------------------------------------------------
# the plan: cells, replicates, seeds, search spaces and the edge rule
# ------------------------------------------------------------------------------------------
def cells(spec: dict) -> list[tuple[str, str]]:
    return [(o, p) for o in spec["objectives"] for p in spec["post"]]


def plan(spec: dict, tiny: bool = False) -> dict[str, Any]:
    tu = spec["tuning"]
    seeds = list(spec["evaluation"]["seeds"])
    return {
        "trials": TINY["trials"] if tiny else int(tu["trials"]),
        "startup_trials": TINY["startup_trials"] if tiny else int(tu["startup_trials"]),
        "replicates": {int(k): v for k, v in tu["replicates"].items()},
        "eval_seeds": seeds[: TINY["eval_seeds"]] if tiny else seeds,
    }


def storage(spec: dict, tiny: bool = False) -> dict[str, Any]:
    """Which evaluation runs keep compact test arrays (deviation 2): the claims' cells, these replicates, the first
    `array_seeds` evaluation seeds."""
    st = spec.get("full_storage", {})
    claim_cells = {tuple(c[x].split("/")) for c in spec["claims"].values() for x in ("method", "reference")}
    return {
        "cells": claim_cells,
        "replicates": [int(k) for k in st.get("array_replicates", [1])],
        "seeds": plan(spec, tiny)["eval_seeds"][: int(st.get("array_seeds", 2))],
        "bootstrap_resamples": int(st.get("bootstrap_resamples", spec["slice"]["bootstrap_resamples"])),
    }


def config(spec: dict, regime: str, objective: str, seed: int, params: dict[str, float], tiny: bool) -> dict:
    """The run's calib_core configuration: protocol A's `run_config` on protocol C's regimes and objectives."""
    spec_a = {"regimes": spec["regimes"], "methods": spec["objectives"], "threads": spec.get("threads", 1)}
    cfg = run_config(spec_a, regime, objective, seed, params)
    if tiny:
        cfg["data"]["num_samples"] = TINY["num_samples"]
        cfg["train"]["epochs"] = TINY["epochs"]
    return cfg


def edge_hits(space: dict[str, Sequence[float]], chosen: dict[int, dict[str, float]], rule: dict) -> list[dict]:
    """Chosen values within `rule['fraction']` of their range's width (log scale) of an edge, per replicate;
    exempt edges (`<param>_low` / `<param>_high`) are skipped."""
    frac, exempt = float(rule["fraction"]), set(rule.get("exempt", []))
    hits = []
    for k, params in sorted(chosen.items()):
        for name, (lo, hi) in space.items():
            if name not in params:
                continue
            pos = (math.log(params[name]) - math.log(lo)) / (math.log(hi) - math.log(lo))
            for edge, near in (("low", pos <= frac), ("high", pos >= 1.0 - frac)):
                if near and f"{name}_{edge}" not in exempt:
                    hits.append({"replicate": k, "param": name, "edge": edge, "value": params[name], "position": pos})
    return hits


def widen(space: dict[str, Sequence[float]], hits: Sequence[dict], rule: dict) -> dict[str, list[float]]:
    """Every edge hit by some replicate widened by `rule['widen_decades']` decades."""
    f = 10.0 ** float(rule.get("widen_decades", 1))
    out = {k: [float(lo), float(hi)] for k, (lo, hi) in space.items()}
    for name, side in sorted({(h["param"], h["edge"]) for h in hits}):
        if side == "low":
            out[name][0] /= f
        else:
            out[name][1] *= f
    return out


def chosen_trials(rows: Sequence[dict], regime: str, objective: str, post: str, rnd: int, k: int, pl: dict) -> dict:
    """One replicate's tuning from its rows: trials done, per-trial value (mean validation objective over the
    replicate's seeds; inf when a run failed) and, once every trial is done, the chosen one (lowest value, first)."""
    seeds = list(pl["replicates"][k]["seeds"])
    got: dict[int, dict[int, dict]] = {}
    for r in rows:
        if (
            r["stage"] == "tune"
            and r["regime"] == regime
            and r["objective"] == objective
            and r["cell_post"] == post
            and int(r["round"]) == rnd
            and int(r["replicate"]) == k
        ):
            got.setdefault(int(r["trial"]), {})[int(r["seed"])] = r
    trials = []
    for i in sorted(got):
        if set(got[i]) != set(seeds):
            continue
        runs = [got[i][s] for s in seeds]
        vals = [r.get("val_objective") for r in runs]
        ok = all(r["status"] == "completed" and v is not None and math.isfinite(v) for r, v in zip(runs, vals))
        value = statistics.fmean(float(v) for v in vals if v is not None) if ok else math.inf
        trials.append({"trial": i, "params": json.loads(runs[0]["params"]), "value": value})
    done = len(trials) >= pl["trials"] and [t["trial"] for t in trials[: pl["trials"]]] == list(range(pl["trials"]))
    rec: dict[str, Any] = {"trials_done": len(trials), "complete": bool(done), "chosen": None}
    if done:
        finite = [t for t in trials[: pl["trials"]] if math.isfinite(t["value"])]
        if finite:
            rec["chosen"] = min(finite, key=lambda t: t["value"])  # ties: the first (as protocol A)
    space = next((json.loads(r["space"]) for i in got for r in got[i].values() if r.get("space")), None)
    rec["space"] = space
    return rec


def current_round(rows: Sequence[dict], regime: str, objective: str, post: str) -> int:
    rounds = [
        int(r["round"])
        for r in rows
        if r["stage"] == "tune" and r["regime"] == regime and r["objective"] == objective and r["cell_post"] == post
    ]
    return max(rounds, default=0)


def space_of(spec: dict, rows: Sequence[dict], regime: str, objective: str, post: str, rnd: int, pl: dict) -> dict:
    """Round 0: the protocol's search space; round r: round r-1's widened at its edge hits (all replicates done)."""
    base = {k: [float(lo), float(hi)] for k, (lo, hi) in spec["objectives"][objective]["tune"].items()}
    if rnd == 0:
        return base
    prev = space_of(spec, rows, regime, objective, post, rnd - 1, pl)
    ch = {k: chosen_trials(rows, regime, objective, post, rnd - 1, k, pl) for k in pl["replicates"]}
    if not all(c["chosen"] for c in ch.values()):
        raise SystemExit(f"{regime} {objective}/{post}: round {rnd - 1} is not complete; it cannot be widened yet")
    hits = edge_hits(prev, {k: c["chosen"]["params"] for k, c in ch.items()}, spec["edge_rule"])
    if not hits:
        raise SystemExit(f"{regime} {objective}/{post}: round {rnd - 1} has no edge hit; nothing to re-tune")
    return widen(prev, hits, spec["edge_rule"])


# ------------------------------------------------------------------------------------------
# lanes: where runs execute
# ------------------------------------------------------------------------------------------
def _job(cfg: dict[str, Any], test: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    return msc.stacked_run(cfg, test=test)


class _Stop(Exception):
    """The run budget (`--limit`) is spent, or another lane failed."""


class Context:
    """What the lanes share: the table, the plan, provenance, the run budget and the stop flag."""

    def __init__(self, spec: dict, out: Path, tiny: bool, limit: int | None, prov: dict[str, Any]) -> None:
        self.spec, self.out, self.tiny, self.prov = spec, out, tiny, prov
        self.pl, self.store = plan(spec, tiny), storage(spec, tiny)
        self.table = RunTable(out)
        self.limit = limit
        self.ran = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.t0 = time.perf_counter()

    def take(self) -> None:
        """Reserve one new run (raises _Stop when the budget is spent or another lane failed)."""
        with self.lock:
            if self.stop.is_set() or (self.limit is not None and self.ran >= self.limit):
                raise _Stop
            self.ran += 1

    def stamp(self) -> dict[str, Any]:
        return {"finished_utc": utc_now(), **self.prov}

    def log(self, text: str) -> None:
        print(f"[full {self.ran} runs {time.perf_counter() - self.t0:6.0f}s] {text}", flush=True)


def tune_run(
    ctx: Context, run: Runner, cell: tuple, rnd: int, k: int, i: int, seed: int, params: dict, space: dict
) -> dict[str, Any]:
    """One tuning run's row: reused from a finished run of the same objective, seed and parameters, or trained."""
    regime, objective, post = cell
    key = {"regime": regime, "stage": "tune", "objective": objective, "cell_post": post, "round": rnd}
    key |= {"replicate": k, "trial": i, "seed": seed, "post": post}
    src = ctx.table.shared.get((regime, objective, int(seed), _canon(params)))
    if src is not None:
        row = {c: src.get(c) for c in COLUMNS} | key
        row["shared_from"] = f"{src['cell_post']} round{src['round']} rep{src['replicate']} trial{src['trial']}"
        row["space"] = json.dumps(space)
        row["val_objective"] = src["val_nll"] if post == "none" else src["val_nll_ts_crossfit"]
        ctx.table.add([row])
        return row
    ctx.take()
    none, ts, _ = run(config(ctx.spec, regime, objective, seed, params, ctx.tiny), False)
    row = {**none, **key, "params": json.dumps(params), "space": json.dumps(space), **ctx.stamp()}
    row["temperature"] = ts.get("temperature")
    row["val_objective"] = none.get("val_nll") if post == "none" else ts.get("val_nll")
    ctx.table.add([row])
    ctx.log(
        f"tune {regime} {objective}/{post} round {rnd} rep {k} trial {i} seed {seed}: {none['status']} "
        f"val objective {msc._f(row['val_objective'])} ({none['wall_s']:.1f}s)"
    )
    return row


def tune_cell(ctx: Context, run: Runner, regime: str, objective: str, post: str, rnd: int, k: int) -> None:
    """One replicate of one cell: protocol A's seeded TPE search, every trial's runs from the table or trained."""
    rows = ctx.table.rows
    if chosen_trials(rows, regime, objective, post, rnd, k, ctx.pl)["complete"]:
        return
    space = space_of(ctx.spec, rows, regime, objective, post, rnd, ctx.pl)
    rep = ctx.pl["replicates"][k]

    def evaluate(i: int, params: dict[str, float]) -> float:
        vals = []
        for seed in rep["seeds"]:
            row = ctx.table.get(
                regime=regime,
                stage="tune",
                objective=objective,
                cell_post=post,
                round=rnd,
                replicate=k,
                trial=i,
                seed=seed,
                post=post,
            )
            if row is not None and _canon(row["params"]) != _canon(params):
                raise RuntimeError(
                    f"{regime} {objective}/{post} round {rnd} replicate {k} trial {i}: the sampler drew {params}, "
                    f"the stored run has {row['params']} (another Optuna version or an altered table?)"
                )
            if row is None:
                row = tune_run(ctx, run, (regime, objective, post), rnd, k, i, seed, params, space)
            v = row.get("val_objective")
            vals.append(v if row["status"] == "completed" and v is not None and math.isfinite(v) else math.inf)
        return statistics.fmean(vals) if all(math.isfinite(v) for v in vals) else math.inf

    tpe_search(space, ctx.pl["trials"], ctx.pl["startup_trials"], rep["sampler_seed"], evaluate)


def eval_run(ctx: Context, run: Runner, regime: str, objective: str, post: str, rnd: int, k: int, seed: int) -> None:
    """Replicate k's chosen configuration of one cell on one evaluation seed: rows `none` and `ts` (and the compact
    test arrays of the cell's own post where deviation 2 keeps them)."""
    ch = chosen_trials(ctx.table.rows, regime, objective, post, rnd, k, ctx.pl)["chosen"]
    key = {"regime": regime, "stage": "eval", "objective": objective, "cell_post": post, "round": rnd}
    key |= {"replicate": k, "seed": seed}
    if ch is None or ctx.table.get(**key, post=post) is not None:
        return
    ctx.take()
    none, ts, arrays = run(config(ctx.spec, regime, objective, seed, ch["params"], ctx.tiny), True)
    if (
        arrays
        and (objective, post) in ctx.store["cells"]
        and k in ctx.store["replicates"]
        and seed in ctx.store["seeds"]
    ):
        with ctx.table.lock:
            rp = rows_file(ctx.out, regime)
            existing = dict(np.load(rp)) if rp.is_file() else {}
            prefix = f"{post}/"
            akey = msc.arrays_key(regime, objective, arrays_post(post, rnd, k), seed)
            existing.update({akey + a[len(prefix) :]: v for a, v in arrays.items() if a.startswith(prefix)})
            buf = io.BytesIO()
            np.savez_compressed(buf, **existing)
            msc._atomic_write(rp, buf.getvalue())
    stamp = {**key, "chosen_trial": ch["trial"], "params": json.dumps(ch["params"]), **ctx.stamp()}
    val_obj = none.get("val_nll") if post == "none" else ts.get("val_nll")
    ctx.table.add([{**none, **stamp, "val_objective": val_obj}, {**ts, **stamp, "val_objective": val_obj}])
    ctx.log(
        f"eval {regime} {objective}/{post} round {rnd} rep {k} seed {seed}: {none['status']} test nll "
        f"{msc._f(none.get('test_nll'))} -> TS {msc._f(ts.get('test_nll'))}, ece {msc._f(none.get('test_ece'))} -> "
        f"{msc._f(ts.get('test_ece'))} ({none['wall_s']:.1f}s)"
    )


def arrays_post(post: str, rnd: int, k: int) -> str:
    """The `post` part of a run's array key: the cell's post, its round (when re-tuned) and replicate."""
    return f"{post}/rep{k}" if rnd == 0 else f"{post}/round{rnd}/rep{k}"


Runner = Callable[[dict[str, Any], bool], tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]]


def run_lanes(ctx: Context, tasks: Sequence[Callable[[Runner], None]], runners: Sequence[Runner]) -> None:
    """Run `tasks` (each gets its lane's runner) on the lanes; the first error stops every lane and is raised."""
    q: queue.Queue = queue.Queue()
    for task in tasks:
        q.put(task)
    errors: list[BaseException] = []

    def lane(run: Runner) -> None:
        while not ctx.stop.is_set():
            try:
                todo = q.get_nowait()
            except queue.Empty:
                return
            try:
                todo(run)
            except _Stop:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors.append(exc)
                ctx.stop.set()
                return

    if len(runners) == 1:
        lane(runners[0])
    else:
        threads = [threading.Thread(target=lane, args=(r,), daemon=True) for r in runners]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if errors:
        raise errors[0]


class _PoolRunner:
    """A lane's runner: `_job` in the lane's own worker process."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def __call__(self, cfg: dict[str, Any], test: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
        return self.pool.submit(_job, cfg, test).result()


def _tune_task(ctx: Context, regime: str, rnd: dict[tuple, int], objective: str, k: int, run: Runner) -> None:
    for post in ctx.spec["post"]:
        tune_cell(ctx, run, regime, objective, post, rnd[(objective, post)], k)


def _eval_task(ctx: Context, regime: str, rnd: dict[tuple, int], seed: int, run: Runner) -> None:
    for o, p in cells(ctx.spec):
        for k in ctx.pl["replicates"]:
            eval_run(ctx, run, regime, o, p, rnd[(o, p)], k, seed)


def run_full(
    spec: dict,
    regimes: Sequence[str],
    out: Path,
    tiny: bool = False,
    workers: int = 1,
    allow_mixed: bool = False,
    limit: int | None = None,
    retune: Sequence[str] = (),
) -> int:
    """Tune and evaluate what is missing in `regimes` (in order); return how many runs were trained."""
    import optuna
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    prov = provenance()  # once, before the first run: the code this process (and its lanes) loaded
    prov["optuna"] = optuna.__version__
    prov["source_sha256"] = msc.source_sha256()
    ctx = Context(spec, out, tiny, limit, prov)
    check_same_commit([r.get("git_commit") for r in ctx.table.rows], prov["git_commit"], allow_mixed)
    targets = _retune_targets(ctx, regimes, retune)
    print(f"[full] {len(ctx.table.rows)} rows in the table; provenance {json.dumps(prov)}", flush=True)
    pools: list[Any] = []
    if workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pools = [ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) for _ in range(workers)]
        runners: list[Runner] = [_PoolRunner(p) for p in pools]
    else:
        runners = [_job]
    try:
        for regime in regimes:
            rnd = {
                (o, p): targets.get((regime, o, p), current_round(ctx.table.rows, regime, o, p)) for o, p in cells(spec)
            }
            # a lane task: one (objective, replicate), both posts (the second reuses the first's start-up runs)
            tune = [
                partial(_tune_task, ctx, regime, rnd, o, k) for o in spec["objectives"] for k in ctx.pl["replicates"]
            ]
            run_lanes(ctx, tune, runners)
            # then one evaluation seed per lane task (its data generated once in the lane's process)
            run_lanes(ctx, [partial(_eval_task, ctx, regime, rnd, s) for s in ctx.pl["eval_seeds"]], runners)
            if ctx.stop.is_set() or (limit is not None and ctx.ran >= limit):
                break
    finally:
        ctx.table.merge()
        for p in pools:
            p.shutdown(cancel_futures=True)
    return ctx.ran


def _retune_targets(ctx: Context, regimes: Sequence[str], retune: Sequence[str]) -> dict[tuple, int]:
    """--retune objective/post: the cell's next round (its current one complete, with an edge hit), per regime."""
    out = {}
    for c in retune:
        o, p = c.split("/")
        if (o, p) not in cells(ctx.spec):
            raise SystemExit(f"--retune {c}: not a cell of the protocol (objective/post)")
        for regime in regimes:
            rnd = current_round(ctx.table.rows, regime, o, p)
            space_of(ctx.spec, ctx.table.rows, regime, o, p, rnd + 1, ctx.pl)  # refuses when not allowed
            out[(regime, o, p)] = rnd + 1
    return out


# ------------------------------------------------------------------------------------------
# statistics: the two-way (pigeonhole) bootstrap over replicates x seeds
# ------------------------------------------------------------------------------------------
def pigeonhole_draws(d: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means of d (replicates x seeds): each draw resamples the rows (replicates) and the columns (seeds)
    independently with replacement and averages d over the crossed sample (Owen 2007)."""
    d = np.asarray(d, dtype=np.float64)
    n_r, n_s = d.shape
    rng = np.random.default_rng(seed)
    ir = rng.integers(0, n_r, size=(resamples, n_r))
    is_ = rng.integers(0, n_s, size=(resamples, n_s))
    wr = np.stack([np.bincount(x, minlength=n_r) for x in ir]).astype(np.float64)
    ws = np.stack([np.bincount(x, minlength=n_s) for x in is_]).astype(np.float64)
    return np.einsum("br,rs,bs->b", wr, d, ws) / (n_r * n_s)


class Pigeonhole:
    """`evaluate_claim`'s tester for the full study: summary = plug-in mean of the R x S grid of paired differences,
    per-replicate means and spread, the bootstrap draws; p = share of draws on the wrong side of the bound;
    intervals = percentile intervals of the draws. Every metric of a (claim, regime) uses the same draws."""

    def __init__(self, resamples: int, seed: int) -> None:
        self.resamples, self.seed = int(resamples), int(seed)

    def summary(self, d: Any) -> dict[str, Any]:
        d = np.asarray(d, dtype=np.float64)
        if d.size == 0:
            return {"n_replicates": 0, "n_seeds": 0, "mean": math.nan, "replicate_means": [], "_draws": None}
        reps = d.mean(axis=1)
        return {
            "n_replicates": int(d.shape[0]),
            "n_seeds": int(d.shape[1]),
            "mean": float(d.mean()),
            "replicate_means": [float(x) for x in reps],
            "replicate_sd": float(reps.std(ddof=1)) if len(reps) > 1 else math.nan,
            "seed_sd": float(d.mean(axis=0).std(ddof=1)) if d.shape[1] > 1 else math.nan,
            "_draws": pigeonhole_draws(d, self.resamples, self.seed),
        }

    def p(self, s: dict[str, Any], test: tuple[str, float]) -> float:
        draws = s["_draws"]
        if draws is None:
            return math.nan
        direction, bound = test
        return float(np.mean(draws >= bound) if direction == "below" else np.mean(draws <= bound))

    def tost(self, s: dict[str, Any], margin: float) -> float:
        return max(self.p(s, ("above", -margin)), self.p(s, ("below", margin)))

    def interval(self, s: dict[str, Any], level: float) -> tuple[float, float]:
        draws = s["_draws"]
        if draws is None:
            return math.nan, math.nan
        lo, hi = np.quantile(draws, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
        return float(lo), float(hi)


# ------------------------------------------------------------------------------------------
# the report's record, from the compact files alone
# ------------------------------------------------------------------------------------------
def _primary(rows: Sequence[dict], regime: str, objective: str, cell_post: str, post: str, rnd: int) -> dict:
    """{(replicate, seed): row} of a cell's completed evaluation rows of one post."""
    return {
        (int(r["replicate"]), int(r["seed"])): r
        for r in rows
        if r["stage"] == "eval"
        and r["status"] == "completed"
        and r["regime"] == regime
        and r["objective"] == objective
        and r["cell_post"] == cell_post
        and r["post"] == post
        and int(r["round"]) == rnd
    }


def _grid(a: dict, b: dict, reps: Sequence[int]) -> tuple[list[int], list[int]]:
    """Replicates with rows in both cells and the seeds every one of them has in both."""
    ks = [k for k in reps if any(kk == k for kk, _ in a) and any(kk == k for kk, _ in b)]
    seeds = None
    for k in ks:
        sk = {s for kk, s in a if kk == k} & {s for kk, s in b if kk == k}
        seeds = sk if seeds is None else seeds & sk
    return ks, sorted(seeds or [])


def _cell_tuning(
    spec: dict, rows: Sequence[dict], cell: tuple[str, str, str], rnd: int, pl: dict, prim: dict
) -> tuple[dict[int, dict], dict[str, Any]]:
    """A cell's replicates' tuning (`chosen_trials`) and the record's tuning entry (search space, chosen
    configurations, evaluation seeds done, edge hits)."""
    r, o, p = cell
    reps = list(pl["replicates"])
    t = {k: chosen_trials(rows, r, o, p, rnd, k, pl) for k in reps}
    space = next((x["space"] for x in t.values() if x["space"]), None) or space_of(spec, [], r, o, p, 0, pl)
    chosen = {k: x["chosen"]["params"] for k, x in t.items() if x["chosen"]}
    hits = edge_hits(space, chosen, spec["edge_rule"]) if len(chosen) == len(reps) else []
    entry = {
        "round": rnd,
        "space": space,
        "replicates": {
            k: {
                "trials_done": x["trials_done"],
                "chosen_trial": x["chosen"]["trial"] if x["chosen"] else None,
                "params": x["chosen"]["params"] if x["chosen"] else None,
                "value": x["chosen"]["value"] if x["chosen"] else None,
                "eval_seeds_done": sum(1 for kk, _ in prim if kk == k),
            }
            for k, x in t.items()
        },
        "edge_hits": hits,
    }
    return t, entry


def _winners_curse(t: dict[int, dict], prim: dict) -> dict[int, dict[str, Any]]:
    """Per replicate: the chosen trial's tuning objective against the same configuration at evaluation."""
    wc = {}
    for k, x in t.items():
        ev = [v for (kk, _), v in prim.items() if kk == k]
        if not x["chosen"] or not ev:
            continue
        ev_val = float(np.mean([v["val_objective"] for v in ev]))
        wc[k] = {
            "tuning_value": x["chosen"]["value"],
            "eval_val_objective": ev_val,
            "eval_test_nll": float(np.mean([v["test_nll"] for v in ev])),
            "optimism": ev_val - x["chosen"]["value"],
            "seeds": len(ev),
        }
    return wc


def _cell_means(rr: dict, reps: Sequence[int]) -> dict[str, Any]:
    """One row of a cell (`_primary` rows of one post): test means overall and per replicate, and their spread."""
    per = {
        k: {m: float(np.mean([v[f"test_{m}"] for (kk, _), v in rr.items() if kk == k])) for m in MEAN_METRICS}
        | {"n": sum(1 for kk, _ in rr if kk == k)}
        for k in reps
        if any(kk == k for kk, _ in rr)
    }
    allm = {m: float(np.mean([v[f"test_{m}"] for v in rr.values()])) for m in MEAN_METRICS} if rr else {}
    spread = {m: float(np.std([per[k][m] for k in per], ddof=1)) if len(per) > 1 else math.nan for m in MEAN_METRICS}
    return {"n": len(rr), "mean": allm, "replicates": per, "spread": spread}


def _regime_check(rows: Sequence[dict], regime: str, rounds: dict[tuple, int], reps: Sequence[int]) -> dict[str, Any]:
    """A's regime check at the tuned backbone: ce/none minus ce/ts, and ce/none minus TS stacked on it."""
    r = regime
    ce_none = _primary(rows, r, "ce", "none", "none", rounds[(r, "ce", "none")])
    ce_ts = _primary(rows, r, "ce", "ts", "ts", rounds[(r, "ce", "ts")])
    ce_stack = _primary(rows, r, "ce", "none", "ts", rounds[(r, "ce", "none")])
    chk = {}
    for name, other in (("ce_none_minus_ce_ts", ce_ts), ("ce_none_minus_its_ts", ce_stack)):
        per_k = {}
        for k in reps:
            ss = [s for kk, s in ce_none if kk == k and (k, s) in other]
            if ss:
                per_k[k] = float(np.mean([ce_none[(k, s)]["test_ece"] - other[(k, s)]["test_ece"] for s in ss]))
        chk[name] = {"replicates": per_k, "mean": float(np.mean(list(per_k.values()))) if per_k else math.nan}
    return chk


def _regime_records(
    spec: dict, rows: Sequence[dict], regime: str, pl: dict, rounds: dict[tuple, int], rec: dict[str, Any]
) -> bool:
    """One regime's tuning, edge hits, winner's curse, means and regime check, into `rec` (each cell's latest
    round into `rounds`); whether every cell of the regime is complete."""
    r = regime
    reps = list(pl["replicates"])
    complete = True
    for o, p in cells(spec):
        rnd = rounds[(r, o, p)] = current_round(rows, r, o, p)
        prim = _primary(rows, r, o, p, p, rnd)
        t, entry = _cell_tuning(spec, rows, (r, o, p), rnd, pl, prim)
        rec["edge_hits"] += [{"regime": r, "cell": f"{o}/{p}", "round": rnd, **h} for h in entry["edge_hits"]]
        rec["tuning"][f"{r}/{o}/{p}"] = entry
        cell_done = all(x["chosen"] for x in t.values()) and len(prim) == len(reps) * len(pl["eval_seeds"])
        complete = complete and cell_done
        rec["winners_curse"][f"{r}/{o}/{p}"] = _winners_curse(t, prim)
        for post in POSTS:  # the cell's own row and its secondary (TS stacked on `none`, `ts` without TS)
            rec["means"][f"{r}/{o}/{p}/{post}"] = _cell_means(_primary(rows, r, o, p, post, rnd), reps)
    rec["regime_check"][r] = _regime_check(rows, r, rounds, reps)
    return complete


def _claim_grids(
    rows: Sequence[dict], regimes: Sequence[str], claim: dict, rounds: dict[tuple, int], reps: Sequence[int]
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, tuple[list[int], list[int]]]]:
    """Per regime: a claim's paired differences (replicates x seeds, each metric) and that grid's replicates and seeds."""
    (ma, pa), (mb, pb) = msc._cell(claim["method"]), msc._cell(claim["reference"])
    diffs, grids = {}, {}
    for r in regimes:
        a = _primary(rows, r, ma, pa, pa, rounds[(r, ma, pa)])
        b = _primary(rows, r, mb, pb, pb, rounds[(r, mb, pb)])
        ks, ss = _grid(a, b, reps)
        if not ks or not ss:
            continue
        grids[r] = (ks, ss)
        diffs[r] = {
            m: np.array([[a[(k, s)][f"test_{m}"] - b[(k, s)][f"test_{m}"] for s in ss] for k in ks])
            for m in REPORT_METRICS
        }
    return diffs, grids


def _claim_half_widths(z: Any, regime: str, claim: dict, rounds: dict[tuple, int], store: dict) -> list[float]:
    """The per-seed ECE bootstrap half-widths of a claim in one regime, over the runs whose arrays are kept."""
    (ma, pa), (mb, pb) = msc._cell(claim["method"]), msc._cell(claim["reference"])
    hws: list[float] = []
    for k in store["replicates"]:
        a_ = (ma, arrays_post(pa, rounds[(regime, ma, pa)], k))
        b_ = (mb, arrays_post(pb, rounds[(regime, mb, pb)], k))
        hws += msc.per_seed_half_widths(z, regime, a_, b_, store["seeds"], store["bootstrap_resamples"])
    return hws


def _full_claim(
    spec: dict,
    out: Path,
    rows: Sequence[dict],
    claim: dict,
    rec: dict[str, Any],
    rounds: dict[tuple, int],
    store: dict,
    tester: Pigeonhole,
    bootstrap: bool,
) -> dict[str, Any]:
    """One claim's record: verdicts per regime from the pigeonhole bootstrap, and the per-seed ECE half-widths."""
    pl = rec["plan"]
    reps = list(pl["replicates"])
    diffs, grids = _claim_grids(rows, rec["regimes"], claim, rounds, reps)
    res = msc.evaluate_claim(diffs, claim["kind"], spec, REPORT_METRICS, tester) if diffs else {}
    for r, x in res.items():
        ks, ss = grids[r]
        x["replicates"], x["seeds"] = ks, ss
        x["complete"] = rec["complete"][r] and len(ks) == len(reps) and len(ss) == len(pl["eval_seeds"])
        x["ece_bootstrap_half_width_median"] = math.nan
        rp = rows_file(out, r)
        if bootstrap and rp.is_file():
            with np.load(rp) as z:
                hws = _claim_half_widths(z, r, claim, rounds, store)
            x["ece_bootstrap_half_width_median"] = float(np.median(hws)) if hws else math.nan
            x["ece_bootstrap_half_width_runs"] = len(hws)
    return msc.claim_entry(res, spec)


def _compute(rows: Sequence[dict], regimes: Sequence[str]) -> dict[str, Any]:
    """Runs trained and their CPU-hours, overall and per regime."""
    # shared tuning rows and the second row of an evaluation run are not counted twice
    trained = [x for x in rows if not x.get("shared_from") and (x["stage"] == "tune" or x["post"] == "none")]
    return {
        "trained_runs": len(trained),
        "shared_tuning_rows": sum(1 for x in rows if x.get("shared_from")),
        "cpu_hours": sum((x.get("wall_s") or 0.0) + (x.get("ts_wall_s") or 0.0) for x in trained) / 3600.0,
        "by_regime": {
            r: {
                "runs": sum(1 for x in trained if x["regime"] == r),
                "cpu_hours": sum(
                    (x.get("wall_s") or 0) + (x.get("ts_wall_s") or 0) for x in trained if x["regime"] == r
                )
                / 3600.0,
            }
            for r in regimes
        },
    }


def _provenance(rows: Sequence[dict]) -> dict[str, list[str]]:
    """The commits, CPUs and versions the rows were made with."""
    return {
        "commits": sorted(
            {(x.get("git_commit") or "?") + (" clean" if x.get("git_clean") else " dirty") for x in rows}
        ),
        "cpus": sorted({f"{x.get('cpu_model')}, {x.get('threads')} thread(s)" for x in rows}),
        "versions": sorted(
            {
                f"python {x.get('python')}, torch {x.get('torch')}, numpy {x.get('numpy')}, optuna {x.get('optuna')}"
                for x in rows
            }
        ),
    }


def full_record(spec: dict, out: Path, tiny: bool = False, bootstrap: bool = True) -> dict[str, Any]:
    """Everything the full report says, from the compact files alone."""
    rows = read_rows(out)
    pl, store = plan(spec, tiny), storage(spec, tiny)
    regimes = [r for r in spec["regimes"] if any(x["regime"] == r for x in rows)]
    rec: dict[str, Any] = {"regimes": regimes, "tiny": tiny, "plan": {k: v for k, v in pl.items()}, "tuning": {}}
    rec["edge_hits"], rec["winners_curse"], rec["means"], rec["regime_check"], rec["claims"] = [], {}, {}, {}, {}
    rounds: dict[tuple, int] = {}
    rec["complete"] = {r: _regime_records(spec, rows, r, pl, rounds, rec) for r in regimes}
    rec["rounds"] = {"/".join(k): v for k, v in rounds.items()}
    tester = Pigeonhole(spec["bootstrap"]["resamples"], spec["bootstrap"]["seed"])
    for name, claim in spec["claims"].items():
        rec["claims"][name] = _full_claim(spec, out, rows, claim, rec, rounds, store, tester, bootstrap)
    rec["compute"] = _compute(rows, regimes)
    rec["provenance"] = _provenance(rows)
    return rec


# ------------------------------------------------------------------------------------------
# the report (benchmarks/results/method_study_c.md / .json)
# ------------------------------------------------------------------------------------------
def _num(v: Any, fmt: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _full_intro(spec: dict, rec: dict[str, Any], out: Path, command: str, tiny: bool) -> list[str]:
    """The report's title, the smoke-run warning, provenance and the design."""
    pl, pv, margins = rec["plan"], rec["provenance"], spec["margins"]
    reps = list(pl["replicates"])
    L = [
        "# Method study, protocol C: training objective x temperature scaling (the full factorial)",
        "",
    ]
    if tiny:
        L += [
            f"**SMOKE RUN (--tiny): {TINY['num_samples']} samples, {TINY['epochs']} epochs, {pl['trials']} trials "
            f"({pl['startup_trials']} random), {len(pl['eval_seeds'])} evaluation seeds; the numbers mean nothing.**",
            "",
        ]
    return L + [
        "Protocol (committed before any run): `benchmarks/studies/protocols/method_study_c.md` / `.yaml`. "
        f"Command: `{command}`, generated {rec['generated']}. Compact results: `{os.path.relpath(out, ROOT)}/` (`{STUDY}_runs.csv.gz`, "
        f"`{STUDY}_rows_<regime>.npz`); this report is generated from them alone. Runs made at commit(s) "
        f"{', '.join(c[:10] + c[40:] for c in pv['commits']) or 'n/a'}; {'; '.join(pv['cpus']) or 'n/a'}; "
        f"{'; '.join(pv['versions']) or 'n/a'}. Dirty means tracked files differed from the commit (other work in "
        "the same tree); `source_sha256` in each row identifies the sources the run loaded.",
        "",
        f"**Design.** 4 training objectives x 2 post-processings (none, TS on all validation rows) per regime; each "
        f"cell tuned separately in {len(reps)} independent replicates (own TPE sampler seed and own 2 tuning data "
        f"seeds; {pl['trials']} trials, the first {pl['startup_trials']} random; objective the mean validation NLL, "
        "5-fold cross-fitted after TS for `ts` cells); each replicate's chosen configuration evaluated on "
        f"{len(pl['eval_seeds'])} evaluation seeds ({pl['eval_seeds'][0]}-{pl['eval_seeds'][-1]}), paired across "
        "cells by replicate index and seed. **Intervals carry the tuning replicates**: two-way (pigeonhole) bootstrap "
        f"of the mean paired difference over replicates x seeds ({spec['bootstrap']['resamples']:,} draws, seed "
        f"{spec['bootstrap']['seed']}), percentile intervals; one-sided p = share of draws on the wrong side of the "
        "bound; Holm across the regimes per claim and metric (alpha "
        f"{spec['alpha']}); adjusted intervals are Bonferroni (matches, calibration metrics: 1 - 2 x 0.05 / 4; "
        f"otherwise 1 - 0.05 / 4). Margins: ECE and debiased L2 {100 * margins['ece']:g} pt, NLL {margins['nll']:g} "
        f"nats, accuracy {100 * margins['accuracy']:g} pt (non-inferiority). Differences are method minus "
        "reference: negative = lower (better) ECE, debiased L2 and NLL; positive = higher accuracy. *Matches* is "
        "established per co-primary metric by the Holm-adjusted one-sided test of d < +margin, which contains the "
        "protocol's TOST route (TOST's p is the larger of two one-sided p's and Holm's adjustment is monotone, so "
        "whenever TOST establishes, this test does); TOST's Holm p is shown beside.",
    ]


def _verdicts_section(spec: dict, rec: dict[str, Any]) -> list[str]:
    """Section 1: every claim's verdict per regime and overall."""
    L = [
        "",
        "## 1. Verdicts per regime",
        "",
        "| claim | " + " | ".join(spec["regimes"]) + " | overall |",
        "|---|" + "---|" * (len(spec["regimes"]) + 1),
    ]
    for name, claim in spec["claims"].items():
        c = rec["claims"][name]
        cols = []
        for r in spec["regimes"]:
            x = c["per_regime"].get(r)
            cols.append(
                "pending" if x is None else (x["verdict"] if x["complete"] else f"pending ({x['verdict']} so far)")
            )
        tag = " (secondary)" if claim.get("secondary") else ""
        L.append(f"| {name}{tag}: {claim['text']} | " + " | ".join(cols) + f" | **{c['overall']}** |")
    return L


def _claim_regime_rows(r: str, x: dict[str, Any]) -> list[str]:
    """A claim's table rows of one regime: the intervals and verdict, then each replicate's mean difference."""
    cols = [msc.claim_cell(x["metrics"][m], m) for m in REPORT_METRICS]
    hw = x.get("ece_bootstrap_half_width_median", math.nan)
    verdict = x["verdict"] if x["complete"] else f"pending ({x['verdict']} so far)"
    per = []
    for m in REPORT_METRICS:
        mm, sc = x["metrics"][m], msc._scale(m)
        per.append(
            f"{m}: "
            + ", ".join(f"rep {k} {msc._pt(v, sc)}" for k, v in zip(x["replicates"], mm["replicate_means"]))
            + (f" (sd {sc * mm['replicate_sd']:.3g})" if math.isfinite(mm.get("replicate_sd", math.nan)) else "")
        )
    return [
        f"| {r} | {len(x['replicates'])} x {len(x['seeds'])} | "
        + " | ".join(cols)
        + f" | {_num(100 * hw if math.isfinite(hw) else hw, '.2f')} | {verdict} |",
        f"| | per replicate | {' | '.join(per)} | | |",
    ]


def _claims_section(spec: dict, rec: dict[str, Any]) -> list[str]:
    """Section 2: each claim's table per regime and its overall verdict."""
    L = ["", "## 2. Claims (paired by replicate and seed; Holm across regimes per claim and metric)", ""]
    for name, claim in spec["claims"].items():
        c = rec["claims"][name]
        L += [
            f"### {name}{' (secondary)' if claim.get('secondary') else ''}: {claim['text']}",
            "",
            f"`{msc._label(claim['method'])}` minus `{msc._label(claim['reference'])}`, kind: {claim['kind']}. "
            "Cells: mean [95 % CI] {adjusted CI}, Holm p (establish / refute"
            + (", TOST" if claim["kind"] == "matches" else "")
            + "); then each replicate's mean difference.",
            "",
            "| regime | replicates x seeds | d ECE, pt | d debiased L2, pt | d NLL, nats | d acc, pt | "
            "ECE per-seed bootstrap half-width, pt (median) | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r, x in c["per_regime"].items():
            L += _claim_regime_rows(r, x)
        L += ["", f"**Overall: {c['overall']}**", ""]
    return L


def _means_section(spec: dict, rec: dict[str, Any]) -> list[str]:
    """Section 3: each cell's test means (its own row and its secondary) and the spread of its replicate means."""
    L = [
        "## 3. Means per cell (test split; mean over replicates and seeds, and the spread of the replicate means)",
        "",
        "Row `X + TS` of a `none` cell is TS stacked on the backbone tuned without TS (the pipeline users run in "
        "practice; secondary); row `X (its backbone without TS)` of a `ts` cell is the backbone tuned with TS in "
        "the loop, not post-processed.",
        "",
        "| regime | cell | row | runs | acc % | ECE % | debiased L2 % | NLL | Brier | smooth ECE % | sd of replicate "
        "means: ECE pt / NLL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rec["regimes"]:
        for o, p in cells(spec):
            for post in (p, "ts" if p == "none" else "none"):
                x = rec["means"][f"{r}/{o}/{p}/{post}"]
                if not x["n"]:
                    continue
                row = (
                    "primary"
                    if post == p
                    else ("secondary: + TS" if post == "ts" else "secondary: its backbone without TS")
                )
                sd = x["spread"]
                L.append(
                    f"| {r} | {o}/{p} | {row} | {x['n']} | {msc.means_cells(x['mean'])} | "
                    f"{_num(100 * sd['ece'], '.2f')} / {_num(sd['nll'], '.4f')} |"
                )
    return L


def _tuning_section(spec: dict, rec: dict[str, Any]) -> list[str]:
    """Section 4: the chosen configuration per replicate, the edge rule, and the re-tunes the edge hits call for."""
    pl = rec["plan"]
    L = [
        "",
        "## 4. Tuning: chosen configuration per replicate, and the edge rule",
        "",
        f"Edge rule: a chosen value within {100 * spec['edge_rule']['fraction']:g} % of its range's width (log "
        f"scale) of an edge (exempt: {', '.join(spec['edge_rule'].get('exempt', [])) or 'none'}) widens that edge by "
        f"{spec['edge_rule']['widen_decades']} decade(s) and the cell is re-tuned in that regime, all replicates "
        "(a deviation). Round 0 is the protocol's search space.",
        "",
        "| regime | cell | round | search space | replicate: trials done, chosen trial, parameters, tuning objective, "
        "evaluation seeds done | edge hits |",
        "|---|---|---|---|---|---|",
    ]
    for key, t in rec["tuning"].items():
        r, o, p = key.split("/")
        space = ", ".join(f"{k} [{lo:.3g}, {hi:.3g}]" for k, (lo, hi) in (t["space"] or {}).items())
        reps_txt = "; ".join(
            f"{k}: {x['trials_done']}/{pl['trials']}, "
            + (
                f"#{x['chosen_trial']} "
                + ", ".join(f"{n} {v:.3g}" for n, v in x["params"].items())
                + f", {x['value']:.4f}"
                if x["params"]
                else "pending"
            )
            + f", {x['eval_seeds_done']}/{len(pl['eval_seeds'])}"
            for k, x in t["replicates"].items()
        )
        hits = ", ".join(f"rep {h['replicate']} {h['param']} {h['edge']} ({h['value']:.3g})" for h in t["edge_hits"])
        L.append(f"| {r} | {o}/{p} | {t['round']} | {space} | {reps_txt} | {hits or '-'} |")
    if rec["edge_hits"]:
        todo: dict[str, list[str]] = {}
        for h in rec["edge_hits"]:
            todo.setdefault(h["regime"], []).append(h["cell"])
        L += [
            "",
            "**Edge hits**: under the protocol these cells are re-tuned (a deviation, to be listed before its result "
            "is used): "
            + "; ".join(
                f"`python -m benchmarks.studies.method_study_c full --regimes {r} --retune {','.join(sorted(set(cs)))}`"
                for r, cs in todo.items()
            )
            + ".",
        ]
    return L


def _winners_curse_section(rec: dict[str, Any]) -> list[str]:
    """Section 5: the chosen trial's tuning objective against the same configuration at evaluation."""
    L = [
        "",
        "## 5. Winner's curse: the chosen trial's tuning objective against the same configuration at evaluation",
        "",
        "Tuning objective: mean over the replicate's 2 tuning seeds (validation NLL; cross-fitted after TS for `ts` "
        "cells). Evaluation: the same objective on the evaluation seeds' validation splits, and the test NLL of the "
        "cell's row. Optimism = evaluation minus tuning validation objective (positive: the search was lucky).",
        "",
        "| regime | cell | replicate | tuning objective | evaluation val objective | optimism | evaluation test NLL "
        "| seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, wc in rec["winners_curse"].items():
        r, o, p = key.split("/")
        for k, x in wc.items():
            L.append(
                f"| {r} | {o}/{p} | {k} | {x['tuning_value']:.4f} | {x['eval_val_objective']:.4f} | "
                f"{x['optimism']:+.4f} | {x['eval_test_nll']:.4f} | {x['seeds']} |"
            )
    return L


def _regime_check_section(rec: dict[str, Any]) -> list[str]:
    """Section 6: protocol A's regime check at the tuned backbone (descriptive)."""
    L = [
        "",
        "## 6. Protocol A's regime check at the tuned backbone (descriptive)",
        "",
        "Test ECE of `ce/none` minus `ce/ts` (the cell tuned with TS) and minus TS stacked on the same `ce/none` "
        "runs, mean over seeds per replicate, pt (A's rule kept a regime at >= 2 pt).",
        "",
        "| regime | ce/none - ce/ts, per replicate | mean | ce/none - (ce/none + TS), per replicate | mean |",
        "|---|---|---|---|---|",
    ]
    for r, chk in rec["regime_check"].items():
        a, b = chk["ce_none_minus_ce_ts"], chk["ce_none_minus_its_ts"]
        fa = ", ".join(f"{k}: {100 * v:+.2f}" for k, v in a["replicates"].items()) or "n/a"
        fb = ", ".join(f"{k}: {100 * v:+.2f}" for k, v in b["replicates"].items()) or "n/a"
        L.append(f"| {r} | {fa} | {_num(100 * a['mean'], '+.2f')} | {fb} | {_num(100 * b['mean'], '+.2f')} |")
    return L


def _compute_and_deviations(rec: dict[str, Any]) -> list[str]:
    """Sections 7 and 8: compute and known limitations; the deviations, re-tunes and mixed commits."""
    comp, n_reps = rec["compute"], len(rec["plan"]["replicates"])
    L = [
        "",
        "## 7. Compute and known limitations",
        "",
        f"{comp['trained_runs']} runs trained ({comp['cpu_hours']:.2f} CPU-hours of `wall_s` + `ts_wall_s`; "
        f"{comp['shared_tuning_rows']} tuning rows reuse a finished run with the same objective, seed and parameters); "
        + "; ".join(f"{r}: {v['runs']} runs, {v['cpu_hours']:.2f} h" for r, v in comp["by_regime"].items())
        + ".",
        "",
        f"With {n_reps} replicates the pigeonhole bootstrap's replicate term has (R-1)/R = "
        f"{(n_reps - 1) / n_reps:.2f} of its plug-in variance (intervals somewhat narrow in the tuning direction); "
        "the per-replicate mean differences in section 2 and the spreads in section 3 show tuning luck directly. "
        "The per-seed ECE bootstrap half-width (test-row sampling, precision diagnostic) is the median over the runs "
        "whose compact arrays are kept (deviation 2).",
        "",
        "## 8. Deviations",
        "",
        msc._deviations(),
        "",
    ]
    retuned = sorted(f"{k} (round {v})" for k, v in rec["rounds"].items() if v > 0)
    if retuned:
        L += ["Re-tuned under the edge rule (the cells' latest round is used): " + ", ".join(retuned) + ".", ""]
    commits = rec["provenance"]["commits"]
    if len({c.split()[0] for c in commits}) > 1:
        L += ["Rows made at more than one commit (`--allow-mixed-commits`): " + ", ".join(commits) + ".", ""]
    return L


def build_full_report(
    spec: dict, out: Path, command: str, tiny: bool = False, bootstrap: bool = True
) -> tuple[str, dict[str, Any]]:
    """The full factorial's report (Markdown) and its record, from the compact files alone."""
    rec = full_record(spec, out, tiny, bootstrap)
    commits = sorted({c.split()[0] for c in rec["provenance"]["commits"]})
    rec = {"command": command, "generated": utc_now(), "git_commit": ", ".join(commits) or None, **rec}
    L = _full_intro(spec, rec, out, command, tiny)
    L += _verdicts_section(spec, rec)
    L += _claims_section(spec, rec)
    L += _means_section(spec, rec)
    L += _tuning_section(spec, rec)
    L += _winners_curse_section(rec)
    L += _regime_check_section(rec)
    L += _compute_and_deviations(rec)
    return "\n".join(L) + "\n", rec


def stop_on_signals() -> None:
    """SIGTERM, and SIGINT even where the shell that started the study in the background set it to be ignored, end
    the study as Ctrl+C does: run_full's `finally` merges the journal into the table before the process exits."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop)


def main_full(args: Any, spec: dict, command: str) -> int:
    """The `full` subcommand of benchmarks/studies/method_study_c.py."""
    from benchmarks.common import write_json, write_text

    out = Path(args.out).resolve()
    regimes = args.regimes.split(",") if args.regimes else list(spec["regimes"])
    unknown = [r for r in regimes if r not in spec["regimes"]]
    if unknown:
        raise SystemExit(f"unknown regime(s): {', '.join(unknown)}")
    if not args.report_only:
        retune = args.retune.split(",") if args.retune else []
        stop_on_signals()
        try:
            run_full(spec, regimes, out, args.tiny, args.workers, args.allow_mixed_commits, args.limit, retune)
        except KeyboardInterrupt:  # run_full merged the journal into the table on its way out
            print(f"stopped; the runs so far are in {out}; the same command resumes", file=sys.stderr, flush=True)
            return 130
    text, rec = build_full_report(spec, out, command, args.tiny, not args.no_bootstrap)
    report_dir = Path(args.report_dir)
    write_text(report_dir / "method_study_c.md", text)
    write_json(report_dir / "method_study_c.json", rec)
    print(text)
    return 0

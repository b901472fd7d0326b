"""Run a sweep end to end: Ray Tune + Optuna trials, MLflow tracking, selection, registration."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from calib_core.config import RunConfig
from calib_core.plugins import plugin_modules
from sweeps.config import SweepConfig
from sweeps.contract import (
    CHAMPION_ALIAS,
    MULTI_OBJECTIVE,
    NOTE_TAG,
    PREDICTIONS_FILE,
    SPLITS,
    SUMMARY_FILE,
    TAG_CALIBRATOR,
    TAG_CHAMPION_RUN,
    TAG_CHAMPION_TRIAL,
    TAG_DATASET,
    TAG_GROWN_TO,
    TAG_LABEL,
    TAG_LOST_TRIALS,
    TAG_METHOD,
    TAG_REASON,
    TAG_SELECTION_RULE,
    TAG_TRIAL,
    SweepError,
    SweepIncomplete,
    SweepResult,
    grow_experiment,
    is_finite_number,
    is_number,
)
from sweeps.decide.selection import TrialRecord, select, trial_errors
from sweeps.decide.uncertainty import Replicates, compute_replicates, interval_metrics, load_predictions
from sweeps.integrations.mlflow.store import MAX_TAG_CHARS, MlflowStore, TrackingUnavailable
from sweeps.integrations.mlflow.tracking import (
    MLflowTrackingCallback,
    experiment_page,
    flatten,
    run_link,
    source_tags,
)
from sweeps.integrations.optuna.search_space import SearchSpace, describe_params, resolve_run_config
from sweeps.integrations.optuna.study import MEMORY, SweepSearch, make_storage, mark_champion
from sweeps.integrations.ray.live_hooks import LiveCallbacks, LiveReporter, installed
from sweeps.integrations.ray.progress import ProgressCallback, StatusReporter, quiet_output
from sweeps.integrations.ray.trainable import train_trial
from sweeps.redaction import redact, redact_values
from sweeps.report.files import SWEEP_FOLDER, format_leaderboard, sweep_report_files


class TrialParams:
    """Maps a trial config to its MLflow params, tags and run config; picklable for Tune's callback state."""

    def __init__(self, base: dict[str, Any], dataset: str) -> None:
        self.base = base
        self.dataset = dataset

    def __call__(self, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
        """Resolve the full run config of a trial: (flat params, tags, the run config as a dict)."""
        run_cfg = resolve_run_config(RunConfig.model_validate(self.base), config)
        resolved = run_cfg.model_dump(mode="json")
        params = flatten(resolved)
        params.update({f"search.{k}": v for k, v in config.items()})
        tags = {
            TAG_DATASET: self.dataset,
            TAG_CALIBRATOR: str(config.get("calibrator", "")),
            TAG_METHOD: run_cfg.train.method,
            TAG_LABEL: describe_params(config),
        }
        return params, tags, resolved


def _connect_ray(cluster: bool, plugins: list[str]) -> str | None:
    """Connect to the cluster, or start a local one; the local cluster's session folder (None otherwise)."""
    # Keeping 2 checkpoints per trial forces frequent experiment snapshots; they are cheap here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Snapshot the experiment often: a trial started after the last snapshot is lost if the
    # driver dies (resume then replaces it). Snapshots of sweeps this size cost milliseconds.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    if ray.is_initialized():
        return None
    if cluster:  # the service owns the connection: plugins shipped to every node even without preflight
        from sweeps.integrations.ray.cluster import connect_cluster, plugin_runtime_env

        connect_cluster(plugin_runtime_env(plugins))
        return None
    # Ray annotates logging_level as int; it takes a level name too
    ctx = ray.init(include_dashboard=False, configure_logging=True, logging_level="WARNING")  # type: ignore[arg-type]
    return str(ctx.address_info["session_dir"])  # type: ignore[attr-defined]  # a RayContext


def _searcher(cfg: SweepConfig, seed_offset: int = 0) -> SweepSearch:
    """Optuna's TPE through Ray Tune, the study named after the sweep in `search.storage` (optuna/study.py).

    A sweep grown past `seed_offset` trials seeds its new sampler with `search.seed + seed_offset`: the same
    seed would draw the start-up trials' parameters again."""
    s = cfg.search
    metric: str | list[str]
    mode: str | list[str]
    if s.objective == "multi":
        metric, mode = [m for m, _ in MULTI_OBJECTIVE], [d for _, d in MULTI_OBJECTIVE]
    else:
        metric, mode = s.metric, s.mode
    return SweepSearch(
        space=SearchSpace(s),
        metric=metric,
        mode=mode,
        seed=s.seed + seed_offset,
        study_name=cfg.name,
        storage=make_storage(s.storage or MEMORY),
        sweep=cfg.name,
    )


def _scheduler(cfg: SweepConfig) -> ASHAScheduler | None:
    """ASHA over epochs for a single objective with `search.scheduler: asha`, else None.

    A trial ends itself after its last epoch, whose report is its final report (done=True, with
    test metrics and the model), and Tune ends a trial on a done report without asking the
    scheduler; so ASHA only stops trials at its rungs before their last epoch, and
    `stop_last_trials=False` keeps it from stopping a trial for reaching max_t (which would
    come before the final report, e.g. if train.epochs is searched past the base value).
    """
    s = cfg.search
    if s.objective != "single" or s.scheduler != "asha":
        return None
    epochs = cfg.run.train.epochs
    return ASHAScheduler(
        time_attr="epoch", max_t=epochs, grace_period=min(s.grace_period, epochs), stop_last_trials=False
    )


def _build_tuner(cfg: SweepConfig, trainable: Any, grow_from: int = 0) -> tune.Tuner:
    """A new Tuner; its callbacks and reporter are stand-ins for the installed ones (integrations/ray/live_hooks.py).

    `grow_from` > 0: the Tuner of the trials that grow a finished sweep of that many trials to
    `search.num_samples`, an experiment of its own (`contract.grow_experiment`) in the same Optuna study."""
    s, r = cfg.search, cfg.resources
    scheduler = _scheduler(cfg)
    metric = mode = None
    if s.objective == "single":
        metric, mode = s.metric, s.mode
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=_searcher(cfg, seed_offset=grow_from),
            scheduler=scheduler,
            metric=metric,
            mode=mode,
            num_samples=s.num_samples - grow_from,
            max_concurrent_trials=r.max_concurrent,
            # a trial process keeps torch, the code and cached data loaded
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=grow_experiment(cfg.name, s.num_samples) if grow_from else cfg.name,
            storage_path=cfg.storage_path,
            callbacks=[LiveCallbacks(cfg.name)],
            failure_config=tune.FailureConfig(max_failures=r.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=r.checkpoints_to_keep),
            progress_reporter=LiveReporter(cfg.name),  # none installed: Tune's default output (--verbose)
            verbose=1,
        ),
    )


def _records(results: Any, store: MlflowStore, experiment_id: str, sweep: str) -> list[TrialRecord]:
    """Every trial Tune knows, as selection sees it, with its MLflow run."""
    records = []
    for res in results:
        m = dict(res.metrics or {})
        tid = m.get("trial_id") or (res.path and Path(res.path).name.split("_")[1])
        run = store.trial_run(experiment_id, sweep, str(tid)) if tid else None
        status = m.get("status") or ("errored" if res.error else "stopped")
        # NaN stays: selection and the leaderboard see a diverged trial's metric as NaN
        metrics = {k: float(v) for k, v in m.items() if is_number(v) and k.startswith(tuple(f"{s}_" for s in SPLITS))}
        records.append(
            TrialRecord(
                trial_id=str(tid),
                label=describe_params(res.config or {}),
                status=status,
                metrics=metrics,
                params=dict(res.config or {}),
                run_id=run.info.run_id if run else None,
                checkpoint=res.checkpoint,
                reason=str(m.get("reason") or (run.data.tags.get(TAG_REASON) if run else None) or res.error or "")
                or None,
            )
        )
    return records


def _replicates(records: list[TrialRecord], cfg: SweepConfig) -> Replicates:
    """Paired bootstrap replicates of every completed trial, from the predictions in its final checkpoint."""
    predictions = {}
    for rec in records:
        if rec.ok and rec.checkpoint is not None:
            with rec.checkpoint.as_directory() as d:
                predictions[rec.trial_id] = load_predictions(Path(d) / PREDICTIONS_FILE)
    return compute_replicates(
        predictions,
        num_bins=cfg.run.train.num_bins,
        num_resamples=cfg.selection.num_resamples,
        level=cfg.selection.confidence,
        seed=cfg.search.seed,
    )


def _log_intervals(store: MlflowStore, records: list[TrialRecord], reps: Replicates) -> None:
    """`<metric>_ci_low/high` on each trial's run (once: a resumed sweep finds them there)."""
    for rec in records:
        if rec.run_id is None or rec.trial_id not in reps.values:
            continue
        have = store.get_run(rec.run_id).data.metrics
        store.log_metrics(
            rec.run_id,
            {
                k: float(v)
                for k, v in interval_metrics(reps, rec.trial_id).items()
                if k not in have and is_finite_number(v)
            },
        )


def _log_selection(
    store: MlflowStore,
    parent_id: str,
    records: list[TrialRecord],
    chosen: TrialRecord,
    why: str,
    reps: Replicates,
    cfg: SweepConfig,
) -> Any:
    """The sweep's report files, the trials' intervals and the champion's tags and metrics on the parent run."""
    with tempfile.TemporaryDirectory() as d:
        board, ranks, files = sweep_report_files(Path(d), records, chosen, why, reps, cfg)
        store.log_artifacts(parent_id, files)
    _log_intervals(store, records, reps)
    tags = {TAG_CHAMPION_TRIAL: chosen.trial_id}
    if chosen.run_id:
        tags[TAG_CHAMPION_RUN] = chosen.run_id
    tags[TAG_SELECTION_RULE] = why[:MAX_TAG_CHARS]
    store.set_tags(parent_id, tags)
    store.log_metrics(parent_id, {f"champion_{k}": v for k, v in chosen.metrics.items()})
    return board, ranks


def _rank_summary(ranks: Any) -> str:
    """One line: the pair of metrics whose trial rankings agree least (the full matrix with --verbose)."""
    names = list(ranks.columns)
    pairs = [(ranks.iloc[i, j], names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    pairs = [p for p in pairs if p[0] == p[0]]  # NaN where a metric is constant over trials
    if not pairs:
        return "Rank agreement between metrics: too few trials to rank"
    rho, a, b = min(pairs)
    return (
        f"Rank agreement between metrics (Spearman over trials): lowest {a} vs {b} {rho:+.2f} "
        "(the metrics can order calibrators differently; --verbose prints the matrix)"
    )


def _print_summary(
    board: Any,
    ranks: Any,
    why: str,
    cfg: SweepConfig,
    version: str,
    alias: str,
    experiment_id: str,
    verbose: bool = False,
) -> None:
    level = f"{100 * cfg.selection.confidence:.0f} %"
    print(
        f"\nLeaderboard (validation decides; test for reference; [{level} bootstrap CI]; "
        "tied = not significantly worse than the champion):"
    )
    print(format_leaderboard(board))
    if verbose:
        print("\nRank agreement between metrics over trials (Spearman):")
        print(ranks.to_string(float_format=lambda v: f"{v:+.2f}"))
    else:
        print(f"\n{_rank_summary(ranks)}")
    print(f"\nSelection: {why}")
    print(f"Registered: models:/{cfg.tracking.registered_model}@{alias} (version {version})")
    uri = cfg.tracking.uri or ""
    page = experiment_page(experiment_id)
    if uri.startswith("sqlite:"):
        ui = f"{_tool('mlflow')} ui --backend-store-uri {redact(uri)}"
        print(f"Compare runs: {ui}   (then open http://127.0.0.1:5000/{page})")
    else:
        print(f"Compare runs: {redact(uri).rstrip('/')}/{page}")
    study = cfg.search.storage or MEMORY
    if study != MEMORY:
        print(f"Optuna study: {_tool('optuna-dashboard')} {redact(study)}   (then open http://127.0.0.1:8080)")


def _sweep_note(
    cfg: SweepConfig,
    experiment_id: str = "",
    chosen: TrialRecord | None = None,
    why: str = "",
    version: str = "",
    alias: str = CHAMPION_ALIAS,
    gate: str = "",
) -> str:
    """The parent run's description (Markdown): what the sweep is; once selected, the champion and why."""
    s, run = cfg.search, cfg.run
    goal = "validation accuracy (max) and validation ECE (min)" if s.objective == "multi" else f"{s.metric} ({s.mode})"
    lines = [
        f"Sweep **{cfg.name}**: {s.num_samples} trials of one-go calibrated training, {run.model.name} on "
        f"{run.data.name} ({run.train.epochs} epochs each). Optuna's TPE sampler (seed {s.seed}) searches the "
        f"calibrator ({', '.join(f'`{c}`' for c in s.calibrators)}) and its learning rate "
        f"({s.calibrator_lr.low:g} to {s.calibrator_lr.high:g}, log scale) for {goal}; the Optuna study "
        f"`{cfg.name}` is in `{redact(s.storage or MEMORY)}`.",
        f"The champion is chosen on validation metrics only (rule `{cfg.selection.rule}`); each child run is "
        "one trial.",
    ]
    if chosen is not None:
        link = run_link(experiment_id, chosen.run_id, chosen.label) if chosen.run_id else chosen.label
        lines.append(
            f"**Champion:** {link} (run `{chosen.run_id}`, trial `{chosen.trial_id}`), registered as "
            f"`models:/{cfg.tracking.registered_model}@{alias}` (version {version})."
        )
        lines.append(f"**Selection:** {why}")
        study, page = cfg.search.storage or MEMORY, experiment_page(experiment_id)
        if study != MEMORY:
            lines.append(
                f"**Optuna study** `{cfg.name}`: `optuna-dashboard {redact(study)}` (each study trial carries its "
                "MLflow run id, `mlflow_run_id`; the study names the champion, `champion_trial_number`). "
                f"All runs of this experiment, classic view: [{page}]({page})."
            )
        if gate:
            lines.append(f"**{gate.split(':', 1)[0]}:**{gate.split(':', 1)[1]}")
    return "\n\n".join(lines)


def _tool(name: str) -> str:
    """How to call a console script installed beside this Python (e.g. .venv/bin/mlflow from the checkout)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _intro(cfg: SweepConfig, exp_path: str, parent_id: str, resumed: bool) -> str:
    """What runs and where everything goes, before the trials start."""
    s, r, run = cfg.search, cfg.resources, cfg.run
    if s.objective == "multi":
        goal = "val accuracy (max) and val ECE (min)"
    else:
        goal = f"{s.metric} ({s.mode})" + (" with ASHA early stopping" if s.scheduler == "asha" else "")
    lr = f"{s.calibrator_lr.low:.0e}..{s.calibrator_lr.high:.0e}"
    extra = "".join(f", {k}" for k in s.params)
    study = s.storage or MEMORY
    return "\n".join(
        [
            f"{'Resuming' if resumed else 'Sweep'} {cfg.name!r}: {s.num_samples} trials "
            f"({min(r.max_concurrent, s.num_samples)} "
            f"at a time) of {run.model.name} on {run.data.name}, {run.train.epochs} epochs each",
            f"Optuna TPE (seed {s.seed}) searches calibrator [{', '.join(s.calibrators)}], calibrator lr {lr}{extra}; "
            f"objectives: {goal}",
            f"Optuna study: {cfg.name!r} in {redact(study) if study != MEMORY else 'memory (Ray Tune state only)'}",
            f"MLflow: experiment {cfg.tracking.experiment!r}, parent run {parent_id} in "
            f"{redact(cfg.tracking.uri or '')}",
            f"Ray Tune results and checkpoints: {exp_path}",
        ]
    )


def execute(
    cfg: SweepConfig, *, cluster: bool, resume: bool, verbose: bool = False, grow: bool = False, promote: bool = False
) -> SweepResult:
    """Run (or resume) a checked sweep (sweeps.checks.preflight ran); the champion is selected and registered.

    Raises SweepIncomplete when trials were left unfinished, SweepError when the sweep failed.
    Output is made for people (sweeps/integrations/ray/progress.py) unless `verbose`, which keeps Ray Tune's default
    output and every library's log lines.

    The sweep name's lock (sweeps/sweep_lock.py) is taken before anything is written and held to
    the end: a second launch of the same name raises SweepRunning (a ConfigError) naming this one."""
    from sweeps import sweep_lock

    with quiet_output(not verbose), _sigterm_as_sigint(), sweep_lock.hold(cfg.storage_path, cfg.name):
        try:
            return _execute(cfg, cluster=cluster, resume=resume, verbose=verbose, grow=grow, promote=promote)
        except TrackingUnavailable as exc:
            raise SweepError(str(exc)) from None


@contextmanager
def _sigterm_as_sigint() -> Iterator[None]:
    """SIGTERM takes Ctrl+C's path while the sweep runs (see _route_sigterm); the previous handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    _route_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _route_sigterm() -> None:
    """SIGTERM takes Ctrl+C's path: Ray Tune's graceful stop while trials run (runs KILLED, resumable),
    KeyboardInterrupt elsewhere. Only in the main thread (where Python runs signal handlers); installed
    again after ray.init, whose core worker puts its own SIGTERM handler (log and exit) in place."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


def _execute(
    cfg: SweepConfig, *, cluster: bool, resume: bool, verbose: bool, grow: bool = False, promote: bool = False
) -> SweepResult:
    from sweeps.integrations.ray.resource_wait import PendingTimeout
    from sweeps.integrations.ray.session import reap_stale
    from sweeps.integrations.ray.session import track as track_session

    assert cfg.tracking.uri and cfg.storage_path
    exp_path = f"{cfg.storage_path.rstrip('/')}/{cfg.name}"
    store = MlflowStore(cfg.tracking.uri, outage_timeout_s=cfg.tracking.outage_timeout_s)
    experiment_id = store.ensure_experiment(cfg.tracking.experiment)
    existing = store.parent_run(experiment_id, cfg.name)
    restoring = _restoring(cfg, exp_path, resume, exists=existing is not None)
    grown = _grown_to(existing)
    sources = source_tags()
    parent_id = _open_parent(cfg, store, experiment_id, sources, new=existing is None)
    r = cfg.resources
    progress = ProgressCallback(max([cfg.search.num_samples, *grown]), cfg.selection)
    callbacks = [
        _tracking_callback(cfg, store, experiment_id, parent_id, sources),
        progress,
        PendingTimeout(r.pending_timeout_s, r.cpus_per_trial, r.gpus_per_trial),
    ]  # end a hopeless wait
    reporter = None if verbose else StatusReporter(list(cfg.search.params))
    trainable = _trainable(cfg, verbose)

    t_start = time.perf_counter()
    if not cluster:  # a SIGKILLed driver's local Ray processes: stopped before this one starts its own
        reap_stale(cfg.storage_path)
    with _runs_closed_on_failure(store, experiment_id, parent_id, cfg.name), installed(cfg.name, callbacks, reporter):
        session_dir = _connect_ray(cluster, cfg.plugins)
        _route_sigterm()
        if session_dir:  # stopped at exit; recorded for the next sweep if this driver is killed
            track_session(cfg.storage_path, session_dir)
        print(_intro(cfg, exp_path, parent_id, resumed=restoring), flush=True)
        tuner = (
            tune.Tuner.restore(exp_path, trainable, resume_unfinished=True, resume_errored=True)
            if restoring
            else _build_tuner(cfg, trainable)
        )
        t_fit = time.perf_counter()
        grids = [_fit_resuming_lost_workers(tuner, exp_path, trainable, cfg.resources.max_failures)]
        grids += _grow(cfg, store, parent_id, grids[0], grown, trainable, progress, grow)
        for results in grids:
            _deliver_missed_completions(results, store, experiment_id, cfg.name, callbacks[0])
        t_trials = time.perf_counter()
        records = [rec for results in grids for rec in _records(results, store, experiment_id, cfg.name)]
        incomplete = _close_trials(cfg, store, experiment_id, parent_id, grids, records)
    if incomplete:
        raise SweepIncomplete(sum(rec.status == "completed" for rec in records), cfg.search.num_samples)
    with _runs_closed_on_failure(store, experiment_id, parent_id, cfg.name):
        try:
            reps = _replicates(records, cfg)
            t_reps = time.perf_counter()
            chosen, why = select(records, cfg.selection, reps)
        except ValueError as exc:
            raise SweepError(str(exc)) from None
        t_select = time.perf_counter()
        board, ranks = _log_selection(store, parent_id, records, chosen, why, reps, cfg)
        t_report = time.perf_counter()
        version, alias, gate_line = _register_champion(cfg, store, chosen, promote)
        mark_champion(cfg.search.storage or MEMORY, cfg.name, chosen.trial_id)
        report_path = _write_report(
            cfg, store, parent_id, experiment_id, exp_path, records, chosen, why, gate_line, reps
        )
        store.set_tags(parent_id, {NOTE_TAG: _sweep_note(cfg, experiment_id, chosen, why, version, alias, gate_line)})
        store.terminate(parent_id, "FINISHED")
        t_end = time.perf_counter()
    _print_summary(board, ranks, why, cfg, version, alias, experiment_id, verbose)
    if gate_line:
        print(gate_line)
    if report_path:
        print(f"Report: {report_path}")
    timings = {
        "ray_start_s": t_fit - t_start,
        "trials_s": t_trials - t_fit,
        "selection_registration_s": t_end - t_trials,
        "bootstrap_s": t_reps - t_trials,
        "select_s": t_select - t_reps,
        "report_s": t_report - t_select,
        "registration_s": t_end - t_report,
    }
    print(
        f"Timing: Ray start {t_fit - t_start:.1f}s, trials {t_trials - t_fit:.1f}s, "
        f"selection and registration {t_end - t_trials:.1f}s (bootstrap {t_reps - t_trials:.1f}s, "
        f"rule {t_select - t_reps:.1f}s, report files {t_report - t_select:.1f}s, "
        f"registration {t_end - t_report:.1f}s)"
    )
    intervals = {tid: {k: _float_pair(reps.interval(tid, k)) for k in reps.values[tid]} for tid in reps.values}
    return SweepResult(
        name=cfg.name,
        champion_run_id=chosen.run_id or "",
        champion_trial_id=chosen.trial_id,
        champion_label=chosen.label,
        model_uri=f"models:/{cfg.tracking.registered_model}/{version}",
        model_version=str(version),
        leaderboard=board,
        selection=why,
        intervals=intervals,
        confidence=reps.level,
        parent_run_id=parent_id,
        experiment_id=experiment_id,
        tracking_uri=cfg.tracking.uri,
        study_storage=cfg.search.storage or MEMORY,
        replicates=reps,
        timings=timings,
        best_config=dict(chosen.params),
        errors=trial_errors(records),
        alias=alias,
        gate=gate_line,
    )


# Extra in-process resume rounds for trials that died with their worker although retries were left.
LOST_WORKER_ROUNDS = 2


def _fit_resuming_lost_workers(tuner: Any, exp_path: str, trainable: Any, max_failures: int) -> Any:
    """`tuner.fit()`, then resume (from their checkpoints) trials that ended in a worker death.

    Ray Tune 2.60 can count one worker death twice: a trial killed while restoring from its
    checkpoint fails both in-flight calls, the first failure re-queues the trial and the second
    finds it PENDING and errors it for good, retries left or not (seen in tests/test_sweep_soak.py).
    Such trials are resumed the way `--resume` would, at most LOST_WORKER_ROUNDS times, when
    retries are allowed at all (`resources.max_failures` > 0); trials whose own code raised are not.
    """
    import ray.exceptions

    results = tuner.fit()
    for _ in range(LOST_WORKER_ROUNDS if max_failures > 0 else 0):
        lost = [r for r in results if isinstance(r.error, ray.exceptions.RayActorError)]
        if not lost:
            break
        print(
            f"{len(lost)} trial(s) ended when their worker died; resuming them from their last checkpoint", flush=True
        )
        results = tune.Tuner.restore(exp_path, trainable, resume_unfinished=True, resume_errored=True).fit()
    return results


def _grown_to(parent: Any | None) -> list[int]:
    """The trial counts an existing sweep was grown to (its parent run's tag), in order."""
    text = parent.data.tags.get(TAG_GROWN_TO, "") if parent is not None else ""
    return [int(x) for x in text.split(",") if x.strip().isdigit()]


def _grow(
    cfg: SweepConfig,
    store: MlflowStore,
    parent_id: str,
    base: Any,
    grown: list[int],
    trainable: Any,
    progress: ProgressCallback,
    grow: bool,
) -> list[Any]:
    """The result grids of the experiments that grew the sweep past its first Tune experiment (`base`).

    Earlier growths are restored (an interrupted one resumes); when `grow` (a trial count given with
    --resume) asks for more trials than all of them hold, one more experiment runs the difference in the
    same Optuna study and MLflow parent run. Nothing grows while an earlier experiment has unfinished trials."""
    grids: list[Any] = []
    done = len(base)
    unfinished = len(base) - base.num_terminated - base.num_errors
    for target in grown:
        if unfinished:
            break
        path = f"{cfg.storage_path.rstrip('/')}/{grow_experiment(cfg.name, target)}"  # type: ignore[union-attr]
        if not tune.Tuner.can_restore(path):
            break  # recorded on the parent, but its driver died before Tune wrote anything: started again below
        progress.continue_from(done)
        g = tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True).fit()
        grids.append(g)
        done += len(g)
        unfinished += len(g) - g.num_terminated - g.num_errors
    if not grow or unfinished or cfg.search.num_samples <= done:
        return grids
    target = cfg.search.num_samples
    if target not in grown:
        store.set_tags(parent_id, {TAG_GROWN_TO: ",".join(str(n) for n in [*grown, target])})
    print(f"Growing {cfg.name!r} from {done} to {target} trials (same Optuna study and MLflow parent run)", flush=True)
    progress.continue_from(done)
    tuner = _build_tuner(cfg, trainable, grow_from=done)
    grids.append(
        _fit_resuming_lost_workers(
            tuner, f"{cfg.storage_path}/{grow_experiment(cfg.name, target)}", trainable, cfg.resources.max_failures
        )
    )
    return grids


def _restoring(cfg: SweepConfig, exp_path: str, resume: bool, exists: bool) -> bool:
    """Whether Tune's experiment is restored; a sweep that `exists` in MLflow or Tune is refused without --resume."""
    can_restore = tune.Tuner.can_restore(exp_path)
    if not resume and (exists or can_restore):
        raise SweepError(
            f"sweep {cfg.name!r} already exists ({exp_path} or MLflow experiment "
            f"{cfg.tracking.experiment!r}); pass --resume to continue it or --name for a new one"
        )
    return resume and can_restore


def _open_parent(cfg: SweepConfig, store: MlflowStore, experiment_id: str, sources: dict[str, str], new: bool) -> str:
    """The sweep's parent run: created (`new`) with the sweep config as params, else reopened (--resume)."""
    parent_id = store.find_or_create_parent(
        experiment_id, cfg.name, {**sources, TAG_DATASET: cfg.run.data.name, NOTE_TAG: _sweep_note(cfg)}
    )
    if new:
        # no password of the MLflow store or the Optuna database in a param (tracking.uri, search.storage)
        flat = flatten(redact_values(cfg.model_dump(mode="json")))
        store.log_params(parent_id, flat)
    return parent_id


def _tracking_callback(
    cfg: SweepConfig, store: MlflowStore, experiment_id: str, parent_id: str, sources: dict[str, str]
) -> tune.Callback:
    """The callback that mirrors every trial into its MLflow child run."""
    return _UntilTrackingStops(
        MLflowTrackingCallback(
            store,
            experiment_id,
            parent_id,
            cfg.name,
            base_tags=sources,
            trial_params=TrialParams(cfg.run.model_dump(mode="json"), cfg.run.data.name),
            num_bins=cfg.run.train.num_bins,
            scheduler="ASHA" if cfg.search.scheduler == "asha" else "the scheduler",
        ),
        store,
    )


class _UntilTrackingStops(tune.Callback):
    """The tracking callback, stopping the sweep when the tracking server has been unreachable past the limit.

    Ray Tune logs (and survives) an error in a trial's completion hook, and its clean-up stops every
    trial through the same hooks; so the first TrackingUnavailable is kept, the hooks go quiet, and it
    is raised from the next step's hook, which ends `tuner.fit()`. A completion missed this way is
    delivered after the resumed sweep's trials (`_deliver_missed_completions`)."""

    def __init__(self, inner: MLflowTrackingCallback, store: MlflowStore) -> None:
        self.inner, self.store = inner, store
        self.outage: TrackingUnavailable | None = None

    def _run(self, hook: str, **info: Any) -> None:
        if self.outage is not None:
            return
        try:
            getattr(self.inner, hook)(**info)
        except TrackingUnavailable as exc:
            self.outage = exc

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.outage is not None:
            raise self.outage

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.on_step_begin(iteration=iteration, trials=trials, **info)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_start", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self._run("on_trial_result", iteration=iteration, trials=trials, trial=trial, result=result, **info)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_complete", iteration=iteration, trials=trials, trial=trial, **info)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_error", iteration=iteration, trials=trials, trial=trial, **info)


def _deliver_missed_completions(
    results: Any, store: MlflowStore, experiment_id: str, sweep: str, tracking: tune.Callback
) -> None:
    """Trials that made their final report while their completion could not reach MLflow (an outage past the
    limit) are TERMINATED for Tune, which never calls their hook again: their still-open runs get it now,
    from Tune's results (idempotent: steps already logged are skipped, the note is appended once)."""
    if not isinstance(tracking, _UntilTrackingStops):
        return
    open_runs = {
        r.data.tags.get(TAG_TRIAL, ""): r for r in store.trial_runs(experiment_id, sweep) if r.info.status == "RUNNING"
    }
    if not open_runs:
        return
    for res in results:
        m = dict(res.metrics or {})
        tid = str(m.get("trial_id") or (res.path and Path(res.path).name.split("_")[1]) or "")
        if tid in open_runs and m.get("status") and not res.error:
            trial = SimpleNamespace(
                trial_id=tid, last_result=m, checkpoint=res.checkpoint, config=dict(res.config or {}), error_file=None
            )
            tracking.inner.on_trial_complete(iteration=0, trials=[], trial=trial)


def _trainable(cfg: SweepConfig, verbose: bool) -> Any:
    """The trial function with its fixed arguments and per-trial resources."""
    r = cfg.resources
    return tune.with_resources(
        tune.with_parameters(
            train_trial,
            base=cfg.run.model_dump(mode="json"),
            evaluation=cfg.evaluation,
            plugins=plugin_modules(cfg.plugins),
            quiet=not verbose,
        ),
        {"cpu": r.cpus_per_trial, "gpu": r.gpus_per_trial},
    )


def _close_trials(
    cfg: SweepConfig,
    store: MlflowStore,
    experiment_id: str,
    parent_id: str,
    grids: list[Any],
    records: list[TrialRecord],
) -> bool:
    """After Tune returns: runs of trials Tune forgot dropped, open runs KILLED; True when trials are left
    unfinished (the parent then ends KILLED, resumable)."""
    lost = store.drop_orphan_runs(experiment_id, cfg.name, {rec.trial_id for rec in records})
    if lost:
        store.set_tags(parent_id, {TAG_LOST_TRIALS: ",".join(lost)})
    store.close_open_runs(experiment_id, cfg.name, "KILLED")
    # ASHA-stopped trials are TERMINATED too; interrupted ones are neither terminated nor errored.
    unfinished = sum(len(g) - g.num_terminated - g.num_errors for g in grids)
    incomplete = bool(unfinished or len(records) < cfg.search.num_samples)
    if incomplete:
        store.terminate(parent_id, "KILLED")
    return incomplete


def _write_report(
    cfg: SweepConfig,
    store: MlflowStore,
    parent_id: str,
    experiment_id: str,
    exp_path: str,
    records: list[TrialRecord],
    chosen: TrialRecord,
    why: str,
    gate: str,
    reps: Replicates,
) -> str | None:
    """The sweep's HTML report (sweeps/report/html.py), logged on the parent run as sweep/report.html and written
    into Ray Tune's experiment folder when that is local; the local path or None."""
    import numpy as np

    from calib_core.metrics import reliability_diagram
    from sweeps.integrations.optuna.study import param_importances
    from sweeps.report.files import leaderboard, pareto_plot, pyplot
    from sweeps.report.html import REPORT_FILE, ReportLinks, render_report

    ok = [r for r in records if r.ok]
    most_accurate = max(ok, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))
    study = cfg.search.storage or MEMORY
    objectives = [m for m, _ in MULTI_OBJECTIVE] if cfg.search.objective == "multi" else [cfg.search.metric]
    importances, note = param_importances(study, cfg.name, objectives)
    uri = cfg.tracking.uri or ""
    if uri.startswith("sqlite:"):
        root, hint = "http://127.0.0.1:5000/", f"MLflow UI: {_tool('mlflow')} ui --backend-store-uri {redact(uri)}"
    elif uri.startswith(("http://", "https://")):
        root, hint = redact(uri).rstrip("/") + "/", ""
    else:
        root, hint = "", f"MLflow store: {redact(uri)}"
    links = ReportLinks(
        mlflow_root=root,
        experiment_id=experiment_id,
        dashboard=f"{_tool('optuna-dashboard')} {redact(study)}" if study != MEMORY else "",
        mlflow_hint=hint,
        tune_folder=exp_path,
    )
    s, run = cfg.search, cfg.run
    summary = (
        f"{len(records)} trials ({len(ok)} completed) of {run.model.name} on {run.data.name}, {run.train.epochs} "
        f"epochs each; Optuna TPE (seed {s.seed}) over calibrator and calibrator lr; rule {cfg.selection.rule}."
    )
    pyplot()
    with tempfile.TemporaryDirectory(prefix="calib-report-") as tmp:
        d = Path(tmp)
        pareto_plot(records, chosen, d / "pareto.png", reps)
        diagrams: dict[str, str | Path | None] = {}
        for role, rec in (("champion", chosen), ("most accurate trial", most_accurate)):
            if role != "champion" and rec.trial_id == chosen.trial_id:
                continue
            if rec.checkpoint is None:
                continue
            with rec.checkpoint.as_directory() as ck:
                z = np.load(Path(ck) / PREDICTIONS_FILE)
                if "test_probs" not in z.files:
                    continue
                path = d / f"reliability_{len(diagrams)}.png"
                reliability_diagram(
                    z["test_probs"], z["test_labels"], path, num_bins=run.train.num_bins, title=f"{role}: {rec.label}"
                )
                diagrams[f"{role}: {rec.label}"] = path
        text = render_report(
            title=f"Sweep {cfg.name}",
            summary=summary,
            records=records,
            champion=chosen,
            most_accurate=most_accurate,
            why=why,
            gate=gate,
            level=reps.level,
            board=leaderboard(records, chosen, reps, cfg.selection),
            pareto_png=d / "pareto.png",
            diagrams=diagrams,
            importances=importances,
            importance_note=note,
            params=list(s.params),
            links=links,
        )
        out = d / REPORT_FILE
        out.write_text(text, encoding="utf-8")
        store.log_artifacts(parent_id, [(out, SWEEP_FOLDER)])
        if "://" not in exp_path or exp_path.startswith("file://"):
            local = Path(exp_path.removeprefix("file://")) / REPORT_FILE
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(text, encoding="utf-8")
            return str(local)
    return None


def _register_champion(
    cfg: SweepConfig, store: MlflowStore, chosen: TrialRecord, promote: bool
) -> tuple[str, str, str]:
    """The champion's portable model logged on its run and registered, then `@champion` moved through the
    champion gate (or `@challenger` set); (version, its alias, the gate's line or "")."""
    from sweeps.integrations.mlflow.champion_gate import move_alias
    from sweeps.integrations.mlflow.model_export import log_and_register

    assert cfg.tracking.uri and chosen.run_id is not None  # the champion's trial logged an MLflow run
    model = cfg.tracking.registered_model
    with chosen.checkpoint.as_directory() as d:
        summary = json.loads((Path(d) / SUMMARY_FILE).read_text())
        # idempotent (a version registered from the run is reused), so retried through an outage
        version = str(
            store.call(
                log_and_register, chosen.run_id, d, tuple(summary["input_shape"]), model, cfg.tracking.uri, alias=None
            )
        )
        alias, line = store.call(
            move_alias,
            store,
            model,
            version,
            chosen.run_id,
            summary["run_config"],
            Path(d) / PREDICTIONS_FILE,
            level=cfg.selection.confidence,
            num_bins=cfg.run.train.num_bins,
            promote=promote,
        )
    return version, alias, line


def _float_pair(interval: tuple[float, float]) -> tuple[float, float]:
    low, high = interval
    return float(low), float(high)


@contextmanager
def _runs_closed_on_failure(store: MlflowStore, experiment_id: str, parent_id: str, sweep: str) -> Iterator[None]:
    """On Ctrl+C the sweep's open runs and its parent end KILLED (resumable); on any other error FAILED."""
    try:
        yield
    except BaseException as exc:
        outage = _outage(exc)
        if outage is not None:
            # the server is unreachable: nothing can be marked now; --resume reattaches the open runs
            raise outage from None
        if isinstance(exc, KeyboardInterrupt):
            store.close_open_runs(experiment_id, sweep, "KILLED")
            store.terminate(parent_id, "KILLED")
        else:
            _fail(store, experiment_id, parent_id, sweep, exc)
        raise


def _outage(exc: BaseException | None) -> TrackingUnavailable | None:
    """The TrackingUnavailable behind `exc` (Ray Tune may wrap what a callback raised), or None."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, TrackingUnavailable):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _fail(store: MlflowStore, experiment_id: str, parent_id: str, sweep: str, exc: BaseException) -> None:
    """Nothing stays RUNNING: open trial runs are KILLED, the sweep FAILED with its reason."""
    store.close_open_runs(experiment_id, sweep, "KILLED")
    store.set_tags(parent_id, {TAG_REASON: f"{type(exc).__name__}: {exc}"[:MAX_TAG_CHARS]})
    store.terminate(parent_id, "FAILED")

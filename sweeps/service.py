"""Run a sweep end to end: Ray Tune + Optuna trials, MLflow tracking, selection, registration."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray import tune

from sweeps.closing_warmup import EXIT_WAIT_S, ClosingWarmup, steps_for
from sweeps.config import SweepConfig
from sweeps.contract import (
    MULTI_OBJECTIVE,
    NOTE_TAG,
    SPLITS,
    SweepError,
    SweepIncomplete,
    SweepResult,
)
from sweeps.decide.selection import TrialRecord, choose, trial_errors
from sweeps.finish import (
    build_result,
    candidates,
    choice_replicates,
    complete_replicates,
    log_selection,
    trial_records,
    write_report,
)
from sweeps.integrations.mlflow.champion_gate import register_champion
from sweeps.integrations.mlflow.sweep_runs import (
    close_trials,
    deliver_missed_completions,
    runs_closed_on_failure,
    tracking_callback,
)
from sweeps.integrations.optuna.study import (
    MEMORY,
    StudyOutageGuard,
    importances_possible,
    make_searcher,
    mark_champion,
)
from sweeps.integrations.ray.live_hooks import installed
from sweeps.integrations.ray.progress import ProgressCallback, StatusReporter, quiet_output
from sweeps.integrations.ray.tuner import (
    StopWatch,
    build_tuner,
    fit_resuming_lost_workers,
    grow_sweep,
    make_trainable,
    result_loggers,
    tune_sigint_undone,
)
from sweeps.outage import Unavailable
from sweeps.report.files import leaderboard, rank_agreement
from sweeps.report.summary import intro, print_summary, sweep_note
from sweeps.report.timing import PhaseClock
from sweeps.service_start import Run, started
from sweeps.start_steps import SIGNALS, Startup


def execute(
    cfg: SweepConfig,
    *,
    cluster: bool,
    resume: bool,
    verbose: bool = False,
    grow: bool = False,
    promote: bool = False,
    startup: Startup | None = None,
) -> SweepResult:
    """Run (or resume) a checked sweep (sweeps.checks.preflight ran); the champion is selected and registered.

    Raises SweepIncomplete when trials were left unfinished, SweepError when the sweep failed, KeyboardInterrupt
    on Ctrl+C or SIGTERM before the trials or after them (its runs KILLED, if it has any yet).
    Output is made for people (sweeps/integrations/ray/progress.py) unless `verbose`, which keeps Ray Tune's default
    output and every library's log lines. `startup`: the start-up's steps so far (sweeps/start_steps.py; the
    CLI's, from the process's start), continued here.

    The sweep name's lock (sweeps/sweep_lock.py) is taken before anything is written and held to
    the end: a second launch of the same name raises SweepRunning (a ConfigError) naming this one."""
    from sweeps import sweep_lock

    startup = startup or Startup()
    stops = StopWatch(quiet=not verbose)
    with SIGNALS.installed(), contextlib.ExitStack() as held_to_the_end:
        with startup.step("lock"):
            held_to_the_end.enter_context(quiet_output(not verbose))
            held_to_the_end.enter_context(_sigterm_as_sigint(stops))
            held_to_the_end.enter_context(sweep_lock.hold(cfg.storage_path, cfg.name))
        try:
            return _execute(
                cfg,
                cluster=cluster,
                resume=resume,
                verbose=verbose,
                grow=grow,
                promote=promote,
                stops=stops,
                startup=startup,
            )
        except Unavailable as exc:  # MLflow or the study's database away past its limit: resumable
            raise SweepError(str(exc)) from None


@contextmanager
def _sigterm_as_sigint(stops: StopWatch) -> Iterator[None]:
    """SIGTERM takes Ctrl+C's path while the sweep runs (see _route_sigterm); the previous handler after.
    `stops` records that a stop signal came (SIGINT or SIGTERM) and, quiet, keeps Ray Tune's stop lines out."""
    tune_logger = logging.getLogger("ray.tune.tune")
    tune_logger.addFilter(stops)
    try:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGTERM)
        _route_sigterm(stops)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        tune_logger.removeFilter(stops)


def _route_sigterm(stops: StopWatch) -> None:
    """SIGTERM takes Ctrl+C's path: Ray Tune's graceful stop while trials run (runs KILLED, resumable),
    KeyboardInterrupt elsewhere. Only in the main thread (where Python runs signal handlers); installed
    again after ray.init, whose core worker puts its own SIGTERM handler (log and exit) in place."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        stops.requested = True
        if stops.on_sigterm is not None:
            stops.on_sigterm()
            stops.on_sigterm = None
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


# After SIGTERM, how long the driver watches its local Ray's GCS and raylet (below Ray's 60 s wait for a lost GCS).
LOST_RAY_WATCH_S = 45.0
# ... of which the first seconds with the main thread held in the signal handler, before Tune's stop runs.
LOST_RAY_HOLD_S = 2.0


def _watch_for_lost_ray(record: Path, close_runs: Callable[[], None]) -> Callable[[], None]:
    """What SIGTERM starts: a watch on the driver's own Ray (GCS and raylet) for LOST_RAY_WATCH_S.

    A stop sent to every process of the service (systemd's stop of its control group, Slurm's scancel of the
    job step) reaches Ray's processes too, whatever their session. The driver would then wait 60 s for the lost
    GCS and exit 1 with its runs RUNNING; instead, once they are gone (and the driver is not ending them
    itself), the runs end KILLED (`close_runs`), one line says how to continue, what is left of the session is
    stopped, and the driver exits 130, as for any stopped sweep.

    The first LOST_RAY_HOLD_S are watched in the signal handler itself, before Tune's stop runs: the driver's
    first call into Ray after its raylet died (a `ray.put`, say, while Tune saves) ends the process at once with
    exit 1 and nothing printed (Ray's "Raylet IPC connection failed and the local Raylet is dead"). Such a stop
    kills the raylet within milliseconds, so holding the main thread (the one that calls Ray) that long decides
    it; a thread watches the rest of the window."""
    from sweeps.integrations.ray.session import alive, core_processes, is_tracked, stop_now

    core = core_processes(record)

    def lost_within(seconds: float) -> bool | None:
        """True once a core process is gone; None when the driver ends Ray itself; False after `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not is_tracked(record):
                return None
            if core and not all(alive(p) for p in core):
                return True
            time.sleep(0.05)
        return False

    def end_here() -> None:
        closer = threading.Thread(target=close_runs, name="close-runs", daemon=True)
        closer.start()
        closer.join(20.0)
        sys.stdout.flush()
        print(
            "sweep stopped (its Ray processes were stopped too); runs marked KILLED; continue with --resume",
            file=sys.stderr,
            flush=True,
        )
        stop_now(record)
        os._exit(130)

    def watch() -> None:
        if not lost_within(LOST_RAY_WATCH_S - LOST_RAY_HOLD_S):
            return
        time.sleep(1.0)  # the driver's own stop may still end Ray first
        if is_tracked(record):
            end_here()

    def on_sigterm() -> None:
        lost = lost_within(LOST_RAY_HOLD_S)
        if lost:
            end_here()
        elif lost is False:
            threading.Thread(target=watch, name="lost-ray-watch", daemon=True).start()

    return on_sigterm


def _execute(
    cfg: SweepConfig,
    *,
    cluster: bool,
    resume: bool,
    verbose: bool,
    grow: bool = False,
    promote: bool = False,
    stops: StopWatch | None = None,
    startup: Startup | None = None,
) -> SweepResult:
    """The sweep's phases in order, on one clock: start (Ray and the parent run), trials, closing, selection
    (bootstrap, rule), registration, report. The closing's first imports are made while the trials run
    (sweeps/closing_warmup.py)."""
    stops = stops or StopWatch()
    startup = startup or Startup()
    clock = PhaseClock()
    warm_steps = steps_for(importances_possible(cfg, more_trials=resume or grow))
    warmup = ClosingWarmup(warm_steps)
    try:
        with started(cfg, cluster, resume, verbose, startup) as run, warmup:
            records, incomplete = _run_trials(run, verbose, grow, stops, clock, startup, warmup)
            if run.owned:  # the trials are over: Ray's processes go (Tune's records once the champion is registered)
                from sweeps.integrations.ray.session import end as end_session

                end_session(run.session)
            clock.end("closing")
            if incomplete:
                raise SweepIncomplete(sum(rec.status == "completed" for rec in records), run.cfg.search.num_samples)
            warmup.finish()  # its step under way ends first: the closing never imports beside it
            return _choose_and_register(run, records, promote, verbose, clock, startup)
    finally:
        # A stop or a failure left the warm-up's step under way (the context's exit only stops the next one). If
        # the interpreter exits during it, Python ends the daemon thread inside torch's C++ code and Ray's terminate
        # handler aborts the process: exit 134 instead of 130, once in six SIGTERMs during a --resume here.
        warmup.wait(EXIT_WAIT_S)


def _run_trials(
    run: Run, verbose: bool, grow: bool, stops: StopWatch, clock: PhaseClock, startup: Startup, warmup: ClosingWarmup
) -> tuple[list[TrialRecord], bool]:
    """Tune's fit (restored, resumed in process after lost workers, grown), its runs delivered and closed: every
    trial's record, and whether trials were left unfinished. `warmup` starts with the first trial."""
    from sweeps.integrations.ray.node_loss import NodeLossCallback
    from sweeps.integrations.ray.resource_wait import PendingTimeout
    from sweeps.integrations.ray.retries import TrialRetryCallback
    from sweeps.integrations.ray.tune_memory import statistics_only_for
    from sweeps.integrations.ray.worker_logs import hide_worker_teardown

    cfg, store, opened = run.cfg, run.store, run.opened
    experiment_id, parent_id = opened.experiment_id, opened.parent_id
    assert cfg.tracking.uri and cfg.storage_path  # as in _start (for the type checker)
    r = cfg.resources
    progress = ProgressCallback(max([cfg.search.num_samples, *opened.grown]), cfg.selection)
    tracking = tracking_callback(cfg, store, experiment_id, parent_id, opened.sources)
    # the study's database away past search.storage_outage_timeout_s ends the fit (integrations/optuna/study.py)
    study_guard = StudyOutageGuard(cfg.name, cfg.search.storage_outage_timeout_s, lambda: stops.requested)
    callbacks = [
        tracking,
        study_guard,
        progress,
        PendingTimeout(r.pending_timeout_s, r.cpus_per_trial, r.gpus_per_trial),  # ends a hopeless wait
        NodeLossCallback(r.max_failures),  # one line per Ray node lost while trials ran
        TrialRetryCallback(r.max_failures),  # one line per failed trial Tune retries
        *result_loggers(),
    ]
    reporter = None if verbose else StatusReporter(list(cfg.search.params))
    searcher = functools.partial(make_searcher, cfg)  # the tuner's search algorithm, by seed offset (a grown sweep)
    if run.session is not None:

        def close_runs(writer: Any = tracking) -> None:
            with contextlib.suppress(Exception):
                writer.flush(5.0)
            writer.close()
            store.close_open_runs(experiment_id, cfg.name, "KILLED")
            store.terminate(parent_id, "KILLED")

        stops.on_sigterm = _watch_for_lost_ray(run.session, close_runs)

    with (
        runs_closed_on_failure(store, experiment_id, parent_id, cfg.name, tracking),
        installed(cfg.name, callbacks, reporter),
        contextlib.closing(study_guard),
        contextlib.nullcontext() if verbose else hide_worker_teardown(),
        tune_sigint_undone(),
        statistics_only_for([*(m for m, _ in MULTI_OBJECTIVE), cfg.search.metric]),  # ~0.4 MB a trial less
    ):
        _route_sigterm(stops)
        print(intro(cfg, run.exp_path, parent_id, resumed=opened.restoring), flush=True)
        # the searcher before the trainable: the config passes through Optuna once, then through Tune
        with startup.step("study"), SIGNALS.held():  # the study's database may be created: not cut short
            first_searcher = None if opened.restoring else searcher(0)
        with startup.step("tuner"), SIGNALS.held():  # the search space's record and Tune's own files
            trainable = make_trainable(cfg, verbose)
            tuner = (
                tune.Tuner.restore(run.exp_path, trainable, resume_unfinished=True, resume_errored=True)
                if first_searcher is None
                else build_tuner(cfg, trainable, first_searcher)
            )
        startup.done()  # from here Ray Tune's fit takes Ctrl+C (a graceful stop), SIGTERM routed to it
        clock.end("ray_start")
        warmup.start()  # the driver idles while the trials run: the closing's first imports now
        grids = [fit_resuming_lost_workers(tuner, run.exp_path, trainable, cfg.resources.max_failures, stops)]
        if not stops.requested:  # an interrupted sweep (a resume too) stops here; it grows only when it finished
            grids += grow_sweep(
                cfg, store, parent_id, grids[0], opened.grown, trainable, searcher, progress, grow, stops
            )
        tracking.flush()  # what the trials reported reaches MLflow (raises the outage that stopped it)
        tracking.close()
        clock.end("trials")
        records, incomplete = _closed_trials(run, grids, tracking, stops.requested)
        # nothing of Tune outlives the trial phase (the loggers' per-trial files)
        del tuner, grids, callbacks, tracking, progress, reporter
    return records, incomplete


def _closed_trials(run: Run, grids: list[Any], tracking: Any, interrupted: bool) -> tuple[list[TrialRecord], bool]:
    """Missed completions delivered to MLflow, every trial's record, the runs Tune forgot dropped and open ones
    KILLED: (records, whether trials were left unfinished). The trial runs are read once for all of it (with
    their metrics, seconds per read at 1,000 trials), again only when missed completions were delivered."""
    cfg, store, opened = run.cfg, run.store, run.opened
    experiment_id = opened.experiment_id
    runs = store.trial_runs(experiment_id, cfg.name)
    delivered = [
        deliver_missed_completions(results, store, experiment_id, cfg.name, tracking, opened.restoring, runs)
        for results in grids
    ]
    if any(delivered):
        runs = store.trial_runs(experiment_id, cfg.name)
    records = [rec for results in grids for rec in trial_records(results, store, experiment_id, cfg.name, runs)]
    incomplete = close_trials(cfg, store, experiment_id, opened.parent_id, grids, records, interrupted, runs)
    return records, incomplete


def _choose_and_register(
    run: Run, records: list[TrialRecord], promote: bool, verbose: bool, clock: PhaseClock, startup: Startup
) -> SweepResult:
    """The champion chosen on validation (the replicates the rule reads, then the rule), registered (the champion
    gate) and printed with the leaderboard; then every other metric's intervals, the report files and the HTML
    report; the parent run FINISHED."""
    cfg, store = run.cfg, run.store
    experiment_id, parent_id = run.opened.experiment_id, run.opened.parent_id
    records = candidates(records, cfg.selection.metric)  # every trial as trained, and + TS where measured
    with runs_closed_on_failure(store, experiment_id, parent_id, cfg.name):
        try:
            reps = choice_replicates(records, cfg)  # accuracy, ECE, the rule's metric, sets: what the choice reads
            clock.end("bootstrap")
            choice = choose(records, cfg.selection, reps)
            chosen, why = choice.champion, choice.sentence
        except ValueError as exc:
            raise SweepError(str(exc)) from None
        clock.end("select")
        # its accuracy intervals by split, to tell a champion from one no better than the majority class
        acc = {
            s: _float_pair(reps.interval(chosen.trial_id, f"{s}_accuracy"))
            for s in SPLITS
            if reps.has(chosen.trial_id, f"{s}_accuracy")
        }
        version, alias, gate_line = register_champion(cfg, store, chosen, promote, acc)
        mark_champion(cfg.search.storage or MEMORY, cfg.name, chosen.trial, cfg.search.storage_outage_timeout_s)
        clock.end("registration")
        # the terminal's leaderboard shows accuracy and ECE intervals only (BOARD_CI_KEYS): all computed already
        shown = leaderboard(records, chosen, reps, cfg.selection, choice)
        print_summary(shown, rank_agreement(records), why, cfg, version, alias, experiment_id, verbose)
        if gate_line:
            print(gate_line)
        print("Writing every metric's intervals and the report (the champion above is registered) ...", flush=True)
        release_memory()  # Tune's records (and Ray's) freed before the other intervals' arrays need memory
        try:
            complete_replicates(reps, records, cfg, chosen.trial_id)
        except ValueError as exc:
            raise SweepError(str(exc)) from None
        board, _ = log_selection(store, parent_id, records, choice, reps, cfg)
        report_path = write_report(
            cfg, store, parent_id, experiment_id, run.exp_path, records, chosen, why, gate_line, reps, board
        )
        # made beside the report (the config's one stay in finish.py); its timings once the report is written
        result = build_result(
            cfg,
            champion=(chosen.run_id or "", chosen.trial_id, chosen.label),
            version=str(version),
            board=board,
            why=why,
            intervals={tid: {k: _float_pair(reps.interval(tid, k)) for k in reps.values[tid]} for tid in reps.values},
            confidence=reps.level,
            parent_id=parent_id,
            experiment_id=experiment_id,
            best_config=dict(chosen.params),
            errors=trial_errors(records),
            replicates=reps,
            alias=alias,
            gate=gate_line,
        )
        store.set_tags(parent_id, {NOTE_TAG: sweep_note(cfg, experiment_id, chosen, why, version, alias, gate_line)})
        store.terminate(parent_id, "FINISHED")
        clock.end("report")
    if report_path:
        print(f"Report: {report_path}")
    print(startup.line())
    print(clock.line())
    result.timings = {**clock.timings(), **startup.timings()}
    return result


def release_memory() -> None:
    """Collect what was freed and hand the heap's free pages back to the system (glibc), so the next phase's
    imports and arrays reuse them instead of raising the peak."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _float_pair(interval: tuple[float, float]) -> tuple[float, float]:
    low, high = interval
    return float(low), float(high)

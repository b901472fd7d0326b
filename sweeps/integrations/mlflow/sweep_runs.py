"""The sweep's runs in MLflow: the parent run, the tracking callback that mirrors each trial into its child run
(stopping the sweep on a long outage), closing runs when trials end or fail, and the intervals on the runs (the
champion's registration through the gate: champion_gate.register_champion)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ray import tune

from calib_core.config import RunConfig
from calib_core.redaction import redact_values
from sweeps.config import SweepConfig
from sweeps.contract import (
    NOTE_TAG,
    TAG_CALIBRATOR,
    TAG_DATASET,
    TAG_LABEL,
    TAG_LOST_TRIALS,
    TAG_METHOD,
    TAG_QUEUE_MAX,
    TAG_QUEUE_WAIT,
    TAG_REASON,
    TAG_TRIAL,
    TS_PREFIX,
    TrackingStore,
    is_finite_number,
    is_number,
)
from sweeps.decide.selection import TrialRecord
from sweeps.decide.uncertainty import Replicates, interval_metrics
from sweeps.integrations.mlflow.retry import TrackingUnavailable
from sweeps.integrations.mlflow.store import MAX_TAG_CHARS, MlflowStore
from sweeps.integrations.mlflow.tracking import (
    MLflowTrackingCallback,
    flatten,
)
from sweeps.outage import Unavailable
from sweeps.report.summary import sweep_note
from sweeps.trial_params import describe_params, resolve_run_config

log = logging.getLogger(__name__)
FLUSH_ON_FAILURE_S = 30.0  # how long a stopping sweep waits for the trials' queued MLflow writes
# The tracking writer's queue holds at most this many hooks. Full, it makes Tune's loop wait (nothing is dropped:
# every hook carries a result that must reach its run once); a hook is a few kB (a result dict, a trial handle),
# so the bound caps the driver's memory when MLflow is slower than the trials for a long time, while a hiccup of
# seconds to minutes (a few hooks a second at most) fits in it without Tune ever waiting.
WRITER_QUEUE_BOUND = 2000


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


def open_parent(cfg: SweepConfig, store: MlflowStore, experiment_id: str, sources: dict[str, str], new: bool) -> str:
    """The sweep's parent run: created (`new`) with the sweep config as params, else reopened (--resume)."""
    parent_id = store.find_or_create_parent(
        experiment_id, cfg.name, {**sources, TAG_DATASET: cfg.run.data.name, NOTE_TAG: sweep_note(cfg)}
    )
    if new:
        # no password of the MLflow store or the Optuna database in a param (tracking.uri, search.storage)
        flat = flatten(redact_values(cfg.model_dump(mode="json")))
        store.log_params(parent_id, flat)
    return parent_id


def tracking_callback(
    cfg: SweepConfig, store: MlflowStore, experiment_id: str, parent_id: str, sources: dict[str, str]
) -> UntilTrackingStops:
    """The callback that mirrors every trial into its MLflow child run (off Tune's event loop)."""
    return UntilTrackingStops(
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


class UntilTrackingStops(tune.Callback):
    """The tracking callback, run off Ray Tune's event loop, stopping the sweep when the tracking server has been
    unreachable past the limit.

    Every hook is queued (bounded, WRITER_QUEUE_BOUND: a full queue makes Tune wait, so nothing is dropped and
    memory stays bounded) and one writer thread replays them in order
    on the MLflow callback, so a slow or unreachable server never stalls Tune's loop: trials keep training
    and reporting through an outage, and their epochs reach the store, stamped when they were measured, once
    it is back. Only the in-place annotation of a scheduler-stopped result is done at once (other callbacks
    read it). The first TrackingUnavailable (an outage past `tracking.outage_timeout_s`) is kept, the queue
    goes quiet, and it is raised from the next step's hook, which ends `tuner.fit()`; `flush` raises it too.
    A completion missed this way is delivered after the resumed sweep's trials (`deliver_missed_completions`).
    How far the writer fell behind is recorded on the parent run when it closes (`TAG_QUEUE_MAX`, `TAG_QUEUE_WAIT`).
    """

    def __init__(self, inner: MLflowTrackingCallback, store: MlflowStore, max_queue: int = WRITER_QUEUE_BOUND) -> None:
        self.inner, self.store = inner, store
        self.outage: TrackingUnavailable | None = None
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize=max_queue)
        self._writer: threading.Thread | None = None
        self.max_queued = 0  # the longest the queue got (hooks waiting for the writer)
        self.waited_s = 0.0  # how long Tune's loop waited on a full queue, in all

    def _run(self, hook: str, **info: Any) -> None:
        if self.outage is not None:
            return
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._drain, name="mlflow-writer", daemon=True)
            self._writer.start()
        try:
            self._queue.put_nowait((hook, info))
        except queue.Full:
            # the writer is a whole queue behind: Tune's loop waits for room (trials pause reporting) rather than
            # drop a result or let the driver's memory grow without end
            start = time.monotonic()
            self._queue.put((hook, info))
            self.waited_s += time.monotonic() - start
        self.max_queued = max(self.max_queued, self._queue.qsize())

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                hook, info = item
                if self.outage is None:
                    try:
                        getattr(self.inner, hook)(**info)
                    except TrackingUnavailable as exc:
                        self.outage = exc
                    except Exception:  # as Tune does for a callback's error: logged, the sweep goes on
                        log.exception("the MLflow callback failed in %s", hook)
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued hook ran (at most `timeout_s`); raise the outage that stopped them, if any."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and self._writer is not None and self._writer.is_alive():
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if self.outage is not None:
            raise self.outage

    def close(self) -> None:
        """Stop the writer once the queue is drained (or at once after an outage); the queue's longest length and
        Tune's wait on it go on the parent run (not after an outage: the server is away)."""
        started = self._writer is not None
        if self._writer is not None and self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(timeout=None if self.outage is None else 5)
        self._writer = None
        if started and self.outage is None:
            try:
                self.store.set_tags(
                    self.inner.parent_run_id,
                    {TAG_QUEUE_MAX: str(self.max_queued), TAG_QUEUE_WAIT: f"{self.waited_s:.1f}"},
                )
            except Exception as exc:  # a statistic: never the reason a sweep fails
                log.warning("could not record the tracking queue's length: %s", exc)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.outage is not None:
            raise self.outage

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.on_step_begin(iteration=iteration, trials=trials, **info)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_start", iteration=iteration, trials=[], trial=trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.inner.annotate_result(result)
        self._run("on_trial_result", iteration=iteration, trials=[], trial=trial, result=dict(result))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_complete", iteration=iteration, trials=[], trial=trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._run("on_trial_error", iteration=iteration, trials=[], trial=trial)


def _trial_id(res: Any) -> str:
    """The Tune trial id of a result (from its metrics, else its folder name)."""
    m = dict(res.metrics or {})
    return str(m.get("trial_id") or (res.path and Path(res.path).name.split("_")[1]) or "")


def _epoch_rows(res: Any) -> list[dict[str, Any]]:
    """Every result the trial reported (Tune's progress file: the runs before a restart too), numbers only."""
    history = getattr(res, "metrics_dataframe", None)
    rows = history.to_dict("records") if history is not None else []
    return [
        {k: v for k, v in row.items() if is_number(v) or k == "status" and isinstance(v, str)}
        for row in rows
        if is_finite_number(row.get("epoch"))
    ]


def _as_trial(tid: str, res: Any) -> SimpleNamespace:
    """What the tracking callback reads of a Tune trial, from its result."""
    return SimpleNamespace(
        trial_id=tid,
        last_result=dict(res.metrics or {}),
        checkpoint=res.checkpoint,
        config=dict(res.config or {}),
        error_file=None,
    )


def _replay(inner: MLflowTrackingCallback, trial: Any, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        inner.on_trial_result(iteration=0, trials=[], trial=trial, result=row)


def deliver_missed_completions(
    results: Any,
    store: MlflowStore,
    experiment_id: str,
    sweep: str,
    tracking: tune.Callback,
    resumed: bool = False,
    runs: list[Any] | None = None,
) -> bool:
    """Make the runs whole from Tune's own record of every result each trial reported (its progress file),
    idempotently (a (metric, step) already logged is skipped, the note is appended once):

    - trials that ended while their hooks could not reach MLflow (an outage past the limit, whose queued hooks
      were dropped) are finished for Tune, which never calls their hooks again: their runs are created or
      reattached now, replayed and completed;
    - in a resumed sweep, epochs whose queued writes died with a killed driver (the writer runs behind Tune,
      so Tune may have recorded a result, and restores the trial after it, that never reached MLflow) are
      logged now; only runs missing an epoch are read in full.

    `runs`: the sweep's trial runs already read (store.trial_runs). True when a run was created, replayed or ended
    here (a later reader of the runs' statuses reads them again).
    """
    if not isinstance(tracking, UntilTrackingStops):
        return False
    inner = tracking.inner
    by_trial = {
        r.data.tags.get(TAG_TRIAL, ""): r for r in (store.trial_runs(experiment_id, sweep) if runs is None else runs)
    }
    wrote = False
    for res in results:
        m = dict(res.metrics or {})
        tid = _trial_id(res)
        run = by_trial.get(tid)
        if not tid:
            continue
        if run is not None and run.info.status != "RUNNING":  # its run ended as it should
            if resumed:
                rows = _epoch_rows(res)
                logged = store.metric_steps(run.info.run_id, "epoch_time")
                missing = [row for row in rows if "epoch_time" in row and int(row["epoch"]) not in logged]
                if missing:
                    _replay(inner, _as_trial(tid, res), missing)
                    wrote = True
            continue
        if not res.error and not m.get("status"):
            continue  # neither finished nor failed: an unfinished trial (resumed later)
        trial = _as_trial(tid, res)
        inner.run_id_for(trial)
        _replay(inner, trial, _epoch_rows(res))  # every reported result, the final one too (its last curves)
        if res.error:
            inner.on_trial_error(iteration=0, trials=[], trial=trial)
        else:
            inner.on_trial_complete(iteration=0, trials=[], trial=trial)
        wrote = True
    return wrote


def close_trials(
    cfg: SweepConfig,
    store: MlflowStore,
    experiment_id: str,
    parent_id: str,
    grids: list[Any],
    records: list[TrialRecord],
    interrupted: bool = False,
    runs: list[Any] | None = None,
) -> bool:
    """After Tune returns: runs of trials Tune forgot dropped, open runs KILLED; True when trials are left
    unfinished or the sweep was `interrupted` (a stop signal: Tune reports the trials it stopped as TERMINATED),
    the parent then ending KILLED, resumable. `runs`: the sweep's trial runs already read, current."""
    lost = store.drop_orphan_runs(experiment_id, cfg.name, {rec.trial_id for rec in records}, runs)
    if lost:
        store.set_tags(parent_id, {TAG_LOST_TRIALS: ",".join(lost)})
    store.close_open_runs(experiment_id, cfg.name, "KILLED")
    # ASHA-stopped trials are TERMINATED too; interrupted ones are neither terminated nor errored.
    unfinished = sum(len(g) - g.num_terminated - g.num_errors for g in grids)
    incomplete = bool(interrupted or unfinished or len(records) < cfg.search.num_samples)
    if incomplete:
        store.terminate(parent_id, "KILLED")
    return incomplete


@contextmanager
def runs_closed_on_failure(
    store: MlflowStore, experiment_id: str, parent_id: str, sweep: str, writer: UntilTrackingStops | None = None
) -> Iterator[None]:
    """On Ctrl+C, or a server other than MLflow unreachable past its limit (sweeps/outage.py: Unavailable), the
    sweep's open runs and its parent end KILLED (resumable); on any other error FAILED. The
    tracking `writer`'s queued hooks are given up to FLUSH_ON_FAILURE_S to land first, then it stops."""
    try:
        yield
    except BaseException as exc:
        outage = outage_behind(exc)
        if writer is not None:
            if outage is None:
                with contextlib.suppress(Exception):
                    writer.flush(FLUSH_ON_FAILURE_S)
            writer.close()
        if outage is not None:
            # the server is unreachable: nothing can be marked now; --resume reattaches the open runs
            raise outage from None
        stopped = outage_behind(exc, Unavailable)  # another server (the study's database) away past its limit
        if isinstance(exc, KeyboardInterrupt) or stopped is not None:
            store.close_open_runs(experiment_id, sweep, "KILLED")
            store.terminate(parent_id, "KILLED")
        else:
            fail_sweep(store, experiment_id, parent_id, sweep, exc)
        if stopped is not None:
            raise stopped from None
        raise


def outage_behind(exc: BaseException | None, kind: type[Unavailable] = TrackingUnavailable) -> Any:
    """The TrackingUnavailable (or other `kind` of Unavailable) behind `exc` (Ray Tune may wrap what a callback
    raised), or None."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, kind):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def fail_sweep(store: MlflowStore, experiment_id: str, parent_id: str, sweep: str, exc: BaseException) -> None:
    """Nothing stays RUNNING: open trial runs are KILLED, the sweep FAILED with its reason."""
    store.close_open_runs(experiment_id, sweep, "KILLED")
    store.set_tags(parent_id, {TAG_REASON: f"{type(exc).__name__}: {exc}"[:MAX_TAG_CHARS]})
    store.terminate(parent_id, "FAILED")


def log_intervals(store: TrackingStore, records: list[TrialRecord], reps: Replicates) -> None:
    """`<metric>_ci_low/high` on each trial's run (once: a resumed sweep finds them there)."""
    for rec in records:
        if rec.run_id is None or rec.trial_id not in reps.values:
            continue
        have = store.get_run(rec.run_id).data.metrics
        prefix = TS_PREFIX if rec.post else ""  # a "+ TS" candidate shares its trial's run: its own keys
        store.log_metrics(
            rec.run_id,
            {
                prefix + k: float(v)
                for k, v in interval_metrics(reps, rec.trial_id).items()
                if prefix + k not in have and is_finite_number(v)
            },
        )

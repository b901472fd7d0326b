"""The Optuna study of a sweep, kept in an RDB storage (one study per sweep name).

Locally the study lives in a SQLite file beside the MLflow store (`optuna.db` next to
`mlflow.db`); on a cluster in a PostgreSQL database (`search.storage`, or the
`CALIB_OPTUNA_STORAGE` environment variable). `optuna-dashboard <storage URL>` then shows the
trials, their parameters and the Pareto front while the sweep runs and after it.

Ray Tune's `OptunaSearch` takes a `storage` object and creates (or loads, `load_if_exists`) the
study named after the sweep. The searcher is also pickled into Tune's experiment state (the
storage by its URL; RDBStorage reconnects when unpickled), so `--resume` continues the same study.
Two gaps between Tune's snapshot and the database are closed here (`SweepSearch`):

- a trial Optuna handed out after Tune's last snapshot is unknown to the resumed searcher (Tune
  samples a replacement), and so is one whose suggestion the database's outage cut short (Optuna's ask wrote it,
  Tune got no trial); its study trial would stay RUNNING for ever, so it goes back to Optuna's queue (WAITING) and
  the replacement takes it over: the study keeps exactly Tune's trials;
- a trial the study recorded as finished after the last snapshot is replayed by Tune on resume;
  telling Optuna again would fail, so it is skipped.

A diverged or errored trial (NaN objectives) is told as FAIL directly, without Optuna's warning
about NaN values.

The database may go away while the sweep runs (a restarted PostgreSQL): every storage call waits for it
(storage.py; Tune's loop waits, the trials wait at their next report) up to `search.storage_outage_timeout_s`.
Past it, what the searcher could not write is kept in its state (`_owed`, pickled into Tune's experiment state
and written when `--resume` restores it) and `StudyOutageGuard`, one of the sweep's callbacks, ends Tune's fit
with StorageUnavailable at its next step: the service stops in one line, resumable.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ray import tune
from ray.tune.search.optuna import OptunaSearch

from sweeps.config import SweepConfig
from sweeps.contract import MEMORY, MULTI_OBJECTIVE, REFERENCE_ATTR  # MEMORY: the study only in Ray Tune's state
from sweeps.integrations.optuna.sampler import make_sampler
from sweeps.integrations.optuna.search_space import SearchSpace
from sweeps.integrations.optuna.storage import RetryingRDBStorage, StorageUnavailable, make_rdb_storage
from sweeps.outage import OutageWaitStopped
from sweeps.run_notes import listen_for_runs, noted_run

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


def make_storage(url: str, outage_timeout_s: float | None = None) -> Any:
    """An Optuna RDBStorage for `url` (None for 'memory') that waits out an unreachable database up to
    `outage_timeout_s` (`search.storage_outage_timeout_s`; None: fails at once, as for checks and reports)."""
    if url == MEMORY:
        return None
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        # The driver is the only writer; wait for a reader (optuna-dashboard) instead of failing.
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 30}}
    return make_rdb_storage(url, outage_timeout_s, **kwargs)


# sweep name -> the guard of the sweep running in this process (the searcher reports to it; not pickled)
_GUARDS: dict[str, StudyOutageGuard] = {}
STORAGE_ERRORS = (StorageUnavailable, OutageWaitStopped)  # a call that gave up waiting for the database
_PROCESS = uuid.uuid4().hex  # this driver process (a pid may repeat across a container's restarts)


class StudyOutageGuard(tune.Callback):
    """Ends Ray Tune's fit (at its next step) once the study's database stayed unreachable past its limit.

    The searcher's hooks cannot end the fit themselves (Tune fails a trial whose completion raised), so they
    report the outage here (`noted`). While installed, the sweep's searcher (restored ones too) waits up to
    `limit_s` and stops waiting at once when `stopping()` says a stop signal came."""

    def __init__(self, sweep: str, limit_s: float, stopping: Callable[[], bool] | None = None) -> None:
        self.sweep, self.limit_s, self.stopping = sweep, limit_s, stopping
        self.outage: StorageUnavailable | None = None
        _GUARDS[sweep] = self

    def noted(self, exc: BaseException) -> None:
        """A storage call gave up: past the limit the fit ends at the next step (a stop needs nothing more)."""
        if isinstance(exc, StorageUnavailable) and self.outage is None:
            self.outage = exc

    def close(self) -> None:
        """The sweep's fit is over: its searcher no longer reports here."""
        if _GUARDS.get(self.sweep) is self:
            del _GUARDS[self.sweep]

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.outage is not None:
            raise self.outage

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.on_step_begin(iteration=iteration, trials=trials, **info)


class SweepSearch(OptunaSearch):
    """OptunaSearch that keeps an RDB study consistent with Tune across driver restarts."""

    def __init__(self, *args: Any, sweep: str = "", **kwargs: Any) -> None:
        self._sweep = sweep
        # what an outage past the limit kept from the database, written on --resume (restore):
        # ("attr", Optuna trial id, key, value) and ("complete", Tune trial id, result, error, MLflow run id)
        self._owed: list[tuple[Any, ...]] = []
        super().__init__(*args, **kwargs)
        self._watch_storage()

    def _watch_storage(self) -> None:
        """This process's limit and stop check for the storage (a restored searcher keeps the first run's)."""
        guard = _GUARDS.get(self._sweep)
        storage = getattr(self, "_storage", None)
        if guard is not None and isinstance(storage, RetryingRDBStorage):
            storage.configure(guard.limit_s, guard.stopping)

    def _gave_up(self, exc: BaseException, owed: tuple[Any, ...] | None = None) -> None:
        """A storage call gave up waiting: keep what it was writing, and end the fit past the limit."""
        if owed is not None:
            self._owed.append(owed)
        guard = _GUARDS.get(self._sweep)
        if guard is not None:
            guard.noted(exc)
        log.debug("Optuna storage call gave up: %s", exc)

    def _set_attr(self, ot_trial: Any, key: str, value: Any) -> None:
        """A user attribute on an open study trial; owed when the database stays away past the limit."""
        try:
            ot_trial.set_user_attr(key, value)
        except STORAGE_ERRORS as exc:
            self._gave_up(exc, ("attr", ot_trial._trial_id, key, value))

    def _record_run(self, trial_id: str, run_id: str) -> None:
        """The study trial records its MLflow run as soon as the run exists (the tracking writer's thread)."""
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or self._storage is None:
            return
        try:
            ot_trial.set_user_attr("mlflow_run_id", run_id)
        except STORAGE_ERRORS as exc:  # on_trial_complete records it too (its owed completion on --resume)
            self._gave_up(exc)
        except Exception:  # noqa: BLE001 - already finished (the writer lagged): on_trial_complete tried first
            log.debug("study trial of %s finished before its MLflow run was noted", trial_id)

    def _setup_study(self, mode: Any) -> None:
        super()._setup_study(mode)
        if self._storage is not None and isinstance(self._metric, list):
            import warnings

            from optuna.exceptions import ExperimentalWarning

            with warnings.catch_warnings():  # set_metric_names is marked experimental
                warnings.simplefilter("ignore", ExperimentalWarning)
                self._ot_study.set_metric_names(list(self._metric))  # the dashboard's axis labels

    def suggest(self, trial_id: str) -> dict | None:
        """Sample a configuration; the study trial records the Tune trial id (shown in the dashboard)."""
        if self._sweep:  # (again after a restore: the listener is this process's, not pickled)
            listen_for_runs(self._sweep, self._record_run)
        if self.__dict__.get("_reconciled_in") != _PROCESS and self._storage is not None:
            self._requeue_unknown()  # a resume that Tune restored no searcher state for (none saved yet)
        try:
            params = super().suggest(trial_id)
        except STORAGE_ERRORS as exc:
            self._ot_trials.pop(trial_id, None)  # Tune makes no trial of this id: resume requeues its study trial
            self._gave_up(exc)
            if isinstance(exc, StorageUnavailable):
                # past the limit the fit ends here, as the guard would end it at the next step: with no trial left
                # running, Tune waits up to 600 s for a suggestion before that step comes
                raise
            return None  # a stop signal came while it waited: the stop ends the fit
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and self._storage is not None:
            self._set_attr(ot_trial, "tune_trial_id", trial_id)
            if self._sweep:
                self._set_attr(ot_trial, "sweep", self._sweep)
        return params

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Optuna's intermediate value (single objective); skipped when the database stays away."""
        try:
            super().on_trial_result(trial_id, result)
        except STORAGE_ERRORS as exc:
            self._gave_up(exc)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Tell the study; skip trials it already finished; NaN objectives (diverged) are FAIL. Kept for --resume
        when the database stays away past the limit (Tune would fail the trial if this raised)."""
        try:
            self._complete(trial_id, result, error)
        except STORAGE_ERRORS as exc:
            self._gave_up(exc, ("complete", trial_id, result, error, noted_run(self._sweep, trial_id)))

    def _complete(self, trial_id: str, result: dict | None, error: bool) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and trial_id not in self._completed_trials and self._storage is not None:
            # set by _setup_study (Ray leaves the attribute unannotated, so it reads as always None)
            study = cast("optuna.Study", self._ot_study)
            frozen = study._storage.get_trial(ot_trial._trial_id)
            if frozen.state.is_finished():  # recorded before the driver went down
                self._completed_trials.add(trial_id)
                return
        if ot_trial is not None and self._storage is not None and trial_id not in self._completed_trials:
            run_id = noted_run(self._sweep, trial_id)
            for _ in range(10):  # the tracking writer may be a moment behind: wait for it, briefly
                if run_id:
                    break
                time.sleep(0.05)
                run_id = noted_run(self._sweep, trial_id)
            if run_id:  # the last moment the study trial is open: it records its MLflow run
                ot_trial.set_user_attr("mlflow_run_id", run_id)
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        if result and any(_is_nan(result.get(m)) for m in metrics):
            result, error = None, True
        if ot_trial is None or trial_id in self._completed_trials:
            super().on_trial_complete(trial_id, result=result, error=error)
            return
        self._tell(trial_id, ot_trial, result, error)

    def _tell(self, trial_id: str, ot_trial: Any, result: dict | None, error: bool) -> None:
        """OptunaSearch.on_trial_complete's tell, except that a storage call that gave up is raised, not logged."""
        from optuna.trial import TrialState

        val: Any = None
        if result:
            val = [result.get(m) for m in self.metric] if isinstance(self.metric, list) else result.get(self.metric)
        state = TrialState.COMPLETE if val is not None else TrialState.FAIL if error else TrialState.PRUNED
        try:
            cast("optuna.Study", self._ot_study).tell(ot_trial, val, state=state)
        except STORAGE_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - as OptunaSearch does (e.g. a missing objective value)
            log.warning(exc)
        self._completed_trials.add(trial_id)

    def _pay_owed(self) -> None:
        """Write what an outage kept from the database: attributes first (a finished trial takes none)."""
        owed, self._owed = self._owed, []
        storage = cast("optuna.Study", self._ot_study)._storage
        for item in sorted(owed, key=lambda o: o[0] != "attr"):
            if item[0] == "attr":
                _, ot_trial_id, key, value = item
                if not storage.get_trial(ot_trial_id).state.is_finished():
                    storage.set_trial_user_attr(ot_trial_id, key, value)
            else:
                _, trial_id, result, error, run_id = item
                ot_trial = self._ot_trials.get(trial_id)
                if run_id and ot_trial is not None and not storage.get_trial(ot_trial._trial_id).state.is_finished():
                    storage.set_trial_user_attr(ot_trial._trial_id, "mlflow_run_id", run_id)
                self._completed_trials.discard(trial_id)
                self.on_trial_complete(trial_id, result=result, error=error)

    def restore(self, checkpoint_path: str) -> None:
        """Restore Tune's searcher state, then requeue the open study trials it does not know (Tune's replacements
        take them over: each replacement is a suggestion beyond the restored snapshot, as each of them was)."""
        super().restore(checkpoint_path)
        self.__dict__.setdefault("_owed", [])  # (a searcher saved before outages were kept)
        self._watch_storage()
        if self._storage is None or self._ot_study is None:
            return
        if self._owed:
            self._pay_owed()
        self._requeue_unknown()

    def _requeue_unknown(self) -> None:
        """Once per process, before its first suggestion: the open study trials this searcher does not know back in
        Optuna's queue (none in a new study; after a sweep stopped before Tune saved a searcher state, all of them)."""
        from optuna.trial import TrialState

        self.__dict__["_reconciled_in"] = _PROCESS
        known = {t._trial_id for t in self._ot_trials.values()}
        study = cast("optuna.Study", self._ot_study)
        storage = study._storage
        for frozen in storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen._trial_id not in known:
                storage.set_trial_user_attr(
                    frozen._trial_id,
                    "requeued",
                    "handed out after Ray Tune's last experiment snapshot (its Tune trial never ran or was lost); "
                    "taken over on resume",
                )
                storage.set_trial_state_values(frozen._trial_id, TrialState.WAITING)  # Optuna's next ask takes it
                log.info(
                    "Optuna trial %d is unknown to Ray Tune's snapshot; requeued for its next trial", frozen.number
                )


def make_searcher(cfg: SweepConfig, seed_offset: int = 0) -> SweepSearch:
    """Optuna's TPE through Ray Tune, the study named after the sweep in `search.storage` (the service hands it to
    the tuner, integrations/ray/tuner.build_tuner, as its `make_searcher`). The sampler is TPE with Optuna's defaults
    shown a bounded history (sampler.make_sampler: the same suggestions up to its bound, an ask in tens of
    milliseconds at 10^4 trials).

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
        sampler=make_sampler(s.seed + seed_offset),  # seeded itself: OptunaSearch takes no seed beside a sampler
        study_name=cfg.name,
        storage=make_storage(s.storage or MEMORY, s.storage_outage_timeout_s),
        sweep=cfg.name,
    )


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def load_study(study_name: str, url: str) -> Any:
    """The sweep's Optuna study loaded from its storage URL (`SweepResult.study`'s loader, which keeps 'memory'
    away)."""
    import optuna

    return optuna.load_study(study_name=study_name, storage=url)


def mark_champion(url: str, study_name: str, champion_trial: str, outage_timeout_s: float | None = None) -> None:
    """Name the champion in the study (`champion_tune_trial_id`, `champion_trial_number`; a finished trial's own
    attributes cannot change, so the study carries it); waits out an outage up to `outage_timeout_s`."""
    if url == MEMORY:
        return
    import optuna

    study = optuna.load_study(study_name=study_name, storage=make_storage(url, outage_timeout_s))
    study.set_user_attr("champion_tune_trial_id", champion_trial)
    for frozen in study.get_trials(deepcopy=False):
        if frozen.user_attrs.get("tune_trial_id") == champion_trial:
            study.set_user_attr("champion_trial_number", frozen.number)
            break


MIN_IMPORTANCE_TRIALS = 4  # completed sampled trials (reference arms left out) below which no importance is given


def importances_possible(cfg: SweepConfig, more_trials: bool) -> bool:
    """Whether this sweep can end with MIN_IMPORTANCE_TRIALS completed sampled trials (`more_trials`: a resumed or
    grown study may already hold others)."""
    return more_trials or cfg.search.num_samples - len(cfg.search.reference_arms()) >= MIN_IMPORTANCE_TRIALS


def param_importances(
    url: str, study_name: str, objectives: list[str], outage_timeout_s: float | None = None
) -> tuple[dict[str, dict[str, float]] | None, str]:
    """Optuna's fANOVA importance of each searched value for each objective (named), and a note; None when the
    study is not in a database or has too few completed trials to say anything. Waits out an outage up to
    `outage_timeout_s`."""
    if url == MEMORY:
        return None, "The study was kept in memory (search.storage: memory): no importances."
    import optuna

    loaded = optuna.load_study(study_name=study_name, storage=make_storage(url, outage_timeout_s))
    # the reference arms (a constant choice, no sampled value) are not part of the searched space: fANOVA over
    # the sampled trials only (Optuna's importances read the parameters every trial has)
    done = [
        t
        for t in loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if REFERENCE_ATTR not in t.user_attrs
    ]
    if len(done) < MIN_IMPORTANCE_TRIALS:
        n = len(done)
        return None, (
            f"Only {n} completed sampled trial{'' if n == 1 else 's'}: too few for parameter importances "
            f"({MIN_IMPORTANCE_TRIALS} needed; the reference arms are not sampled)."
        )
    # fANOVA's random forest imports sklearn and scipy.stats (~1.5 s of CPU): only past the count above
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    study = optuna.create_study(directions=loaded.directions)
    study.add_trials(done)
    out: dict[str, dict[str, float]] = {}

    def objective(i: int) -> Any:
        return None if len(study.directions) == 1 else (lambda t: t.values[i])

    for i, name in enumerate(objectives):
        try:
            imp = get_param_importances(study, target=objective(i), evaluator=FanovaImportanceEvaluator(seed=0))
        except (RuntimeError, ValueError) as exc:  # e.g. every completed trial has the same parameters
            return None, f"No parameter importances: {exc}"
        out[name] = {k: float(v) for k, v in imp.items()}
    return out, (
        f"fANOVA importance (Optuna, seed 0) over the {len(done)} completed sampled trials (reference arms left "
        "out): the share of each objective's "
        "variance over the search space explained by each searched value; with few trials it is a rough guide."
    )

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
  samples a replacement); its study trial would stay RUNNING for ever, so it is marked FAIL;
- a trial the study recorded as finished after the last snapshot is replayed by Tune on resume;
  telling Optuna again would fail, so it is skipped.

A diverged or errored trial (NaN objectives) is told as FAIL directly, without Optuna's warning
about NaN values.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any, cast

from ray.tune.search.optuna import OptunaSearch

from sweeps.contract import MEMORY, REFERENCE_ATTR  # MEMORY: the study only in Ray Tune's state
from sweeps.integrations.ray.live_hooks import listen_for_runs, noted_run

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)


def make_storage(url: str) -> Any:
    """An Optuna RDBStorage for `url` (None for 'memory')."""
    if url == MEMORY:
        return None
    import optuna

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        # The driver is the only writer; wait for a reader (optuna-dashboard) instead of failing.
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 30}}
    return optuna.storages.RDBStorage(url, **kwargs)


class SweepSearch(OptunaSearch):
    """OptunaSearch that keeps an RDB study consistent with Tune across driver restarts."""

    def __init__(self, *args: Any, sweep: str = "", **kwargs: Any) -> None:
        self._sweep = sweep
        super().__init__(*args, **kwargs)

    def _record_run(self, trial_id: str, run_id: str) -> None:
        """The study trial records its MLflow run as soon as the run exists (the tracking writer's thread)."""
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or self._storage is None:
            return
        try:
            ot_trial.set_user_attr("mlflow_run_id", run_id)
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
        params = super().suggest(trial_id)
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and self._storage is not None:
            ot_trial.set_user_attr("tune_trial_id", trial_id)
            if self._sweep:
                ot_trial.set_user_attr("sweep", self._sweep)
        return params

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Tell the study; skip trials it already finished; NaN objectives (diverged) are FAIL."""
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
        super().on_trial_complete(trial_id, result=result, error=error)

    def restore(self, checkpoint_path: str) -> None:
        """Restore Tune's searcher state, then fail the study's trials it no longer knows."""
        super().restore(checkpoint_path)
        if self._storage is None or self._ot_study is None:
            return
        from optuna.trial import TrialState

        known = {t._trial_id for t in self._ot_trials.values()}
        storage = self._ot_study._storage
        for frozen in self._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen._trial_id not in known:
                storage.set_trial_user_attr(
                    frozen._trial_id, "lost", "started after Ray Tune's last experiment snapshot; replaced on resume"
                )
                storage.set_trial_state_values(frozen._trial_id, TrialState.FAIL)
                log.info("Optuna trial %d was lost with the driver; marked FAIL", frozen.number)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def mark_champion(url: str, study_name: str, champion_trial: str) -> None:
    """Name the champion in the study (`champion_tune_trial_id`, `champion_trial_number`; a finished trial's own
    attributes cannot change, so the study carries it)."""
    if url == MEMORY:
        return
    import optuna

    study = optuna.load_study(study_name=study_name, storage=make_storage(url))
    study.set_user_attr("champion_tune_trial_id", champion_trial)
    for frozen in study.get_trials(deepcopy=False):
        if frozen.user_attrs.get("tune_trial_id") == champion_trial:
            study.set_user_attr("champion_trial_number", frozen.number)
            break


def param_importances(
    url: str, study_name: str, objectives: list[str]
) -> tuple[dict[str, dict[str, float]] | None, str]:
    """Optuna's fANOVA importance of each searched value for each objective (named), and a note; None when the
    study is not in a database or has too few completed trials to say anything."""
    if url == MEMORY:
        return None, "The study was kept in memory (search.storage: memory): no importances."
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    loaded = optuna.load_study(study_name=study_name, storage=make_storage(url))
    # the reference arms (a constant choice, no sampled value) are not part of the searched space: fANOVA over
    # the sampled trials only (Optuna's importances read the parameters every trial has)
    done = [
        t
        for t in loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if REFERENCE_ATTR not in t.user_attrs
    ]
    if len(done) < 4:
        return None, f"Only {len(done)} completed sampled trials: too few for parameter importances."
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

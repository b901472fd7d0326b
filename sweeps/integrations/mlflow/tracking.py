"""MLflow tracking of the trials: one parent run per sweep, exactly one child run per trial.

The driver is the only writer. Runs are found by tags before any is created, so trial
retries and `--resume` reattach to the same runs; metrics carry step=epoch and a step that
was already logged is never logged again. Every MLflow call goes through sweeps/integrations/mlflow/store.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ray import tune

from sweeps.contract import (
    GIT_COMMIT_TAG,
    NOTE_TAG,
    PARENT_TAG,
    PREDICTIONS_FILE,
    REPORT_DIR,
    ROLE_TRIAL,
    STOPPED_EARLY,
    SUMMARY_FILE,
    TAG_GIT_COMMIT,
    TAG_LABEL,
    TAG_NODE,
    TAG_REASON,
    TAG_ROLE,
    TAG_STATUS,
    TAG_STOP_REASON,
    TAG_SWEEP,
    TAG_TRIAL,
    TS_PREFIX,
    error_ending,
    failure_reason,
    is_finite_number,
    is_number,
)
from sweeps.integrations.mlflow.store import MAX_TAG_CHARS, LoggedSteps, MlflowStore
from sweeps.report.summary import run_link
from sweeps.run_notes import note_run
from sweeps.trial_params import describe_params

log = logging.getLogger(__name__)


def git_commit() -> str:
    """The current git commit of the code, or 'unknown' outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_tags() -> dict[str, str]:
    """MLflow's standard source tags (user, entry point, type; as mlflow.start_run resolves them) with the
    code's git commit, under MLflow's name and the service's own (`calib.git_commit`, kept for old queries)."""
    from mlflow.tracking.context.registry import resolve_tags

    tags = {k: str(v) for k, v in resolve_tags({}).items() if k.startswith(("mlflow.source.", "mlflow.user"))}
    commit = git_commit()
    tags[TAG_GIT_COMMIT] = commit
    if commit != "unknown":
        tags[GIT_COMMIT_TAG] = commit
    return tags


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into dotted keys."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MLflowTrackingCallback(tune.Callback):
    """Tune callback mirroring trials into MLflow child runs (single writer: the driver)."""

    def __init__(
        self,
        store: MlflowStore,
        experiment_id: str,
        parent_run_id: str,
        sweep: str,
        base_tags: dict[str, str],
        trial_params: Any,
        num_bins: int = 15,
        scheduler: str = "the scheduler",
    ) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep = sweep
        self.base_tags = dict(base_tags)
        self.trial_params = trial_params  # callable: trial config -> (flat params, tags, run config dict)
        self.num_bins = num_bins
        self.scheduler = scheduler  # named in the reason of trials it stops early
        self._runs: dict[str, str] = {}
        self._logged: dict[str, LoggedSteps] = {}
        self._finished: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Caches of runs and logged steps belong to one driver process.
        state = self.__dict__.copy()
        state.update(_runs={}, _logged={}, _finished=set())
        return state

    def run_id_for(self, trial: Any) -> str:
        """The trial's child run: found by tags, created once with params, reopened if needed."""
        tid = trial.trial_id
        if tid in self._runs:
            return self._runs[tid]
        run = self.store.trial_run(self.experiment_id, self.sweep, tid)
        if run is None:
            params, tags, run_config = self.trial_params(trial.config)
            note = (
                f"Trial `{tid}` of sweep {run_link(self.experiment_id, self.parent_run_id, self.sweep)}: "
                f"{describe_run(run_config)}."
            )
            rid = self.store.create_run(
                self.experiment_id,
                tags.get(TAG_LABEL, tid),
                {
                    **self.base_tags,
                    **tags,
                    TAG_SWEEP: self.sweep,
                    TAG_ROLE: ROLE_TRIAL,
                    TAG_TRIAL: tid,
                    PARENT_TAG: self.parent_run_id,
                    NOTE_TAG: note,
                },
            )
            self.store.log_params(rid, params)
            # The exact run config, loadable with RunConfig.model_validate (params are strings).
            self.store.log_dict(rid, run_config, "run_config.json")
            self._logged[rid] = LoggedSteps()
        else:
            rid = run.info.run_id
            self._logged[rid] = self.store.logged_steps(run)
            if run.info.status == "FINISHED":
                # Finished before a driver restart: Tune may replay its final result; keep the run as is.
                self._finished.add(rid)
            elif run.info.status != "RUNNING":
                self.store.reopen(rid)
                # An errored trial resumed: its old ending no longer applies.
                self.store.delete_tags(rid, [TAG_STATUS, TAG_REASON])
        self._runs[tid] = rid
        note_run(self.sweep, tid, rid)  # the Optuna trial records it (integrations/optuna/study.py)
        return rid

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int, timestamp_ms: int | None = None) -> None:
        """Log finite numeric metrics at `step`, skipping (key, step) pairs already logged."""
        seen = self._logged.setdefault(run_id, LoggedSteps())
        new = {k: float(v) for k, v in metrics.items() if is_finite_number(v) and (k, step) not in seen}
        seen.update((k, step) for k in new)
        self.store.log_metrics(run_id, new, step=step, timestamp_ms=timestamp_ms)

    def annotate_result(self, result: dict) -> None:
        """A per-epoch result Tune marked done was stopped by the scheduler: it gets status `stopped_early` and a
        reason, in place (before any other callback reads it: the progress line, the leaderboard)."""
        if result.get("done") and "status" not in result:
            epoch = int(result.get("epoch", result.get("training_iteration", 0)))
            result["status"] = STOPPED_EARLY
            result["reason"] = f"stopped early by {self.scheduler} at epoch {epoch}"

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Create or reopen the trial's run as soon as it starts."""
        self.run_id_for(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """Per-epoch metrics with step=epoch, the last epoch's from the final report (test metrics
        and artifacts are logged on completion). A per-epoch result Tune marked done was stopped
        by the scheduler: it gets status `stopped_early` and a reason, in place, so the trial's
        last result (leaderboard, progress line, this run's tags) says why it ended."""
        epoch = int(result.get("epoch", result.get("training_iteration", 0)))
        self.annotate_result(result)
        keep = {k: v for k, v in result.items() if k.startswith(("val_", "train_")) or k == "epoch_time"}
        # stamped when the trial reported it (Tune's `timestamp`, seconds), not when it reached the store
        when = result.get("timestamp")
        stamp = int(when * 1000) if is_finite_number(when) else None
        self.log_metrics(self.run_id_for(trial), keep, step=epoch, timestamp_ms=stamp)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Final metrics, reliability diagrams, and the terminal status: completed -> FINISHED,
        stopped early by the scheduler -> FINISHED with calib.status=stopped_early and its reason,
        diverged or out of memory -> FAILED with the reason."""
        rid = self.run_id_for(trial)
        if rid in self._finished:
            return
        result = trial.last_result or {}
        status = result.get("status")
        step = int(result.get("epoch", 0))
        if status in (None, STOPPED_EARLY):
            # The scheduler stopped the trial at a rung, before its final report: it ran the
            # epochs it was given, so the run is FINISHED; its status tag and reason say how.
            reason = result.get("reason") or f"stopped early by {self.scheduler} at epoch {step}"
            self.store.set_tags(rid, {TAG_STATUS: STOPPED_EARLY, TAG_STOP_REASON: reason})
            self._terminate(rid, "FINISHED", outcome=f"**Ended:** {reason}.")
            return
        self.store.set_tags(rid, {TAG_STATUS: str(status)})
        if result.get("node_id"):
            self.store.set_tags(rid, {TAG_NODE: str(result["node_id"])})
        final = {
            k: v
            for k, v in result.items()
            if k.startswith(("val_", "test_", "calibrator_", TS_PREFIX)) or k == "wall_time"
        }
        self.log_metrics(rid, final, step=step)
        if status != "completed":
            self._terminate(rid, "FAILED", failure_reason(str(status), str(result.get("reason") or "")))
            return
        try:
            self._log_dataset(rid, trial)
        except Exception as exc:  # the lineage record must not lose the run's status
            log.warning("could not log the dataset input of %s: %s", trial.trial_id, exc)
        try:
            self._log_trial_artifacts(rid, trial)
        except Exception as exc:  # a missing artifact must not lose the run's status
            log.warning("could not log the report artifacts of %s: %s", trial.trial_id, exc)
        self._terminate(rid, "FINISHED", outcome=_outcome(result))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial that exhausted its retries: FAILED with the error's last line, or `out_of_memory` with its
        reason when the error says it ran out of memory (trial_error_reason)."""
        rid = self.run_id_for(trial)
        status, reason = trial_error_reason(trial)
        self.store.set_tags(rid, {TAG_STATUS: status})
        self._terminate(rid, "FAILED", reason)
        # A resumed round may restart this trial: its run is then looked up again and reopened.
        self._runs.pop(trial.trial_id, None)

    def _terminate(self, run_id: str, status: str, reason: str | None = None, outcome: str | None = None) -> None:
        if reason:
            self.store.set_tags(run_id, {TAG_REASON: reason[:MAX_TAG_CHARS]})
        note = outcome or (f"**Ended:** {reason}" if reason else None)
        if note:
            self.store.append_to_note(run_id, note)
        self.store.terminate(run_id, status)

    def _log_dataset(self, run_id: str, trial: Any) -> None:
        """The trial's data as an MLflow dataset input (the runs page's Dataset column, the model's lineage), from
        the lineage its checkpoint's summary records (calib_core.preprocess.dataset_lineage); once per run."""
        ckpt = trial.checkpoint
        if ckpt is None:
            return
        with ckpt.as_directory() as d:
            path = Path(d) / SUMMARY_FILE
            lineage = json.loads(path.read_text()).get("dataset") if path.is_file() else None
        if not lineage:
            return
        entity = dataset_entity(lineage)
        run = self.store.client.get_run(run_id)
        if any(i.dataset.digest == entity.digest for i in (run.inputs.dataset_inputs if run.inputs else [])):
            return
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        self.store.client.log_inputs(run_id, [DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, "train")])])

    def _log_trial_artifacts(self, run_id: str, trial: Any) -> None:
        """The predictions, then the report files the trial drew (REPORT_DIR: <artifact folder>/<file>); a
        checkpoint from before trials drew their own (a resumed older sweep) gets them drawn here."""
        ckpt = trial.checkpoint
        if ckpt is None:
            return
        with ckpt.as_directory() as d, tempfile.TemporaryDirectory() as out:
            # kept with the run so paired statistics and any metric can be recomputed later
            self.store.log_artifacts(run_id, [(Path(d) / PREDICTIONS_FILE, "predictions")])
            drawn = Path(d) / REPORT_DIR
            if drawn.is_dir():
                folders = {f: f.parent.relative_to(drawn).as_posix() for f in sorted(drawn.rglob("*")) if f.is_file()}
                files = [(f, None if folder == "." else folder) for f, folder in folders.items()]
            else:
                from sweeps.report.files import trial_report_files

                title = describe_params(trial.config)
                files = trial_report_files(Path(d), Path(out), trial.last_result or {}, self.num_bins, title)
            self.store.log_artifacts(run_id, files)


def trial_error_reason(trial: Any) -> tuple[str, str]:
    """(status, reason) of a trial Tune ended with an error (contract.error_ending of its error file)."""
    err = trial.error_file
    text = Path(err).read_text(errors="replace") if err and Path(err).is_file() else ""
    return error_ending(text, int(getattr(trial, "num_failures", 0) or 0))


def dataset_entity(lineage: dict[str, Any]) -> Any:
    """An mlflow.entities.Dataset from a trial's lineage record: name, digest (of the split tensors), source (the
    file or folder: source type local; a generator's settings: source type code) and the split sizes as its
    profile."""
    from mlflow.entities import Dataset

    source = str(lineage["source"])
    is_path = source.startswith("/")
    profile = {
        "splits": lineage.get("sizes"),
        "num_classes": lineage.get("num_classes"),
        "input_shape": lineage.get("input_shape"),
        **({"settings": lineage["settings"]} if lineage.get("settings") else {}),
    }
    return Dataset(
        name=str(lineage["name"])[:500],
        digest=str(lineage["digest"])[:36],
        source_type="local" if is_path else "code",
        source=json.dumps({"uri": source} if is_path else {"generator": source}),
        profile=json.dumps(profile),
    )


def describe_run(run_config: dict[str, Any]) -> str:
    """One sentence on what a trial trains, from its resolved run config (the run's description)."""
    data, model, train = run_config["data"], run_config["model"], run_config["train"]
    what = f"{model['name']} on {data['name']}, {train['epochs']} epochs, seed {run_config['seed']}"
    method = train["method"]
    if method == "onego":
        return (
            f"one-go training of {what}, calibrator `{train['calibrator']}` trained with the backbone at "
            f"calibrator lr {train['calibrator_lr']:.2e} on `{train['calibrator_data']}`"
        )
    if method == "posthoc":
        return f"{what}, then post-hoc `{train['posthoc_calibrator']}` scaling (a reference point)"
    if method == "ce" and train.get("early_stopping_patience"):
        return (
            f"cross-entropy training of {what}, stopped after {train['early_stopping_patience']} epochs without a "
            "lower validation NLL, best epoch kept: the reference arm `ce_es`"
        )
    if method == "ce":
        return f"plain cross-entropy training of {what} (a reference point)"
    return f"{method} training of {what}"


def _outcome(result: dict[str, Any]) -> str:
    """The headline numbers of a completed trial, for its description."""

    def pct(key: str) -> str:
        v = result.get(key)
        return f"{100 * float(v):.1f} %" if is_number(v) else "n/a"

    return (
        f"**Result:** val accuracy {pct('val_accuracy')}, val ECE {pct('val_ece')}; test accuracy "
        f"{pct('test_accuracy')}, test ECE {pct('test_ece')}; diagrams under `diagrams/`, predictions under "
        "`predictions/`."
    )

"""MLflow tracking: one parent run per sweep, exactly one child run per trial.

The driver is the only writer. Runs are found by tags before any is created, so trial
retries and `--resume` reattach to the same runs; metrics carry step=epoch and a step that
was already logged is never logged again.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from ray import tune

from sweeps.contract import (  # noqa: F401  (TAG_SWEEP, TAG_ROLE, STOPPED_EARLY, ... re-exported for the benchmarks)
    CLASSIC_ML,
    EXPERIMENT_KIND_TAG,
    GIT_COMMIT_TAG,
    NOTE_TAG,
    PARENT_TAG,
    PREDICTIONS_FILE,
    ROLE_PARENT,
    ROLE_TRIAL,
    SHIFT_FILE,
    SPLITS,
    STOPPED_EARLY,
    SUMMARY_FILE,
    TAG_GIT_COMMIT,
    TAG_LABEL,
    TAG_LOST_FROM_TUNE,
    TAG_NODE,
    TAG_REASON,
    TAG_ROLE,
    TAG_STATUS,
    TAG_STOP_REASON,
    TAG_SWEEP,
    TAG_TRIAL,
    is_finite_number,
    is_number,
)
from sweeps.search_space import describe_params

log = logging.getLogger(__name__)

MAX_BATCH = 900  # MLflow log_batch takes at most 1000 metrics


def git_commit() -> str:
    """The current git commit of the code, or 'unknown' outside a checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
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


def run_link(experiment_id: str, run_id: str, text: str) -> str:
    """A Markdown link to a run, relative to the MLflow UI that shows it (run notes are Markdown)."""
    return f"[{text}](#/experiments/{experiment_id}/runs/{run_id})"


def ensure_experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """Return the experiment id, creating it (artifacts beside a local SQLite store) if needed, tagged
    as a classic ML experiment (`mlflow.experimentKind`) unless someone chose another kind."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, CLASSIC_ML)
        return exp.experiment_id
    artifact_location = None
    if tracking_uri.startswith("sqlite:///"):
        db_path = Path(tracking_uri.removeprefix("sqlite:///"))
        artifact_location = (db_path.parent / "mlartifacts").as_uri()
    return client.create_experiment(name, artifact_location=artifact_location,
                                    tags={EXPERIMENT_KIND_TAG: CLASSIC_ML})


def find_run(client: MlflowClient, experiment_id: str, tags: dict[str, str]) -> Any | None:
    """The single run carrying all `tags`, or None."""
    flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=flt, max_results=2)
    if len(runs) > 1:
        raise RuntimeError(f"more than one MLflow run has tags {tags}: the store was edited by hand")
    return runs[0] if runs else None


def find_or_create_parent(client: MlflowClient, experiment_id: str, sweep: str, tags: dict[str, str]) -> str:
    """The sweep's parent run id; reopened (RUNNING) if it exists."""
    run = find_run(client, experiment_id, {TAG_SWEEP: sweep, TAG_ROLE: ROLE_PARENT})
    if run is None:
        run = client.create_run(experiment_id, run_name=sweep,
                                tags={TAG_SWEEP: sweep, TAG_ROLE: ROLE_PARENT, **tags})
    elif run.info.status != "RUNNING":
        client.update_run(run.info.run_id, status="RUNNING")
    return run.info.run_id


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

    def __init__(self, tracking_uri: str, experiment_id: str, parent_run_id: str, sweep: str,
                 base_tags: dict[str, str], trial_params: Any, num_bins: int = 15,
                 scheduler: str = "the scheduler") -> None:
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.sweep = sweep
        self.base_tags = dict(base_tags)
        self.trial_params = trial_params  # callable: trial config -> (flat params, tags, run config dict)
        self.num_bins = num_bins
        self.scheduler = scheduler  # named in the reason of trials it stops early
        self._client: MlflowClient | None = None
        self._runs: dict[str, str] = {}
        self._logged: dict[str, set[tuple[str, int]]] = {}
        self._finished: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment; live clients and caches stay behind.
        state = self.__dict__.copy()
        state.update(_client=None, _runs={}, _logged={}, _finished=set())
        return state

    @property
    def client(self) -> MlflowClient:
        """A lazily created MLflow client."""
        if self._client is None:
            self._client = MlflowClient(self.tracking_uri)
        return self._client

    def run_id_for(self, trial: Any) -> str:
        """The trial's child run: found by tags, created once with params, reopened if needed."""
        tid = trial.trial_id
        if tid in self._runs:
            return self._runs[tid]
        run = find_run(self.client, self.experiment_id, {TAG_SWEEP: self.sweep, TAG_TRIAL: tid})
        if run is None:
            params, tags, run_config = self.trial_params(trial.config)
            note = (f"Trial `{tid}` of sweep {run_link(self.experiment_id, self.parent_run_id, self.sweep)}: "
                    f"{describe_run(run_config)}.")
            run = self.client.create_run(self.experiment_id, run_name=tags.get(TAG_LABEL, tid), tags={
                **self.base_tags, **tags, TAG_SWEEP: self.sweep, TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: tid,
                PARENT_TAG: self.parent_run_id, NOTE_TAG: note,
            })
            items = [Param(k, str(v)[:6000]) for k, v in params.items()]
            for i in range(0, len(items), 90):
                self.client.log_batch(run.info.run_id, params=items[i:i + 90])
            # The exact run config, loadable with RunConfig.model_validate (params are strings).
            self.client.log_dict(run.info.run_id, run_config, "run_config.json")
            self._logged[run.info.run_id] = set()
        else:
            rid = run.info.run_id
            history = self.client.get_metric_history(rid, "epoch_time")
            self._logged[rid] = {("epoch_time", m.step) for m in history}
            self._logged[rid] |= {(k, m.step) for k in run.data.metrics
                                  for m in ([] if k == "epoch_time" else self.client.get_metric_history(rid, k))}
            if run.info.status == "FINISHED":
                # Finished before a driver restart: Tune may replay its final result; keep the run as is.
                self._finished.add(rid)
            elif run.info.status != "RUNNING":
                self.client.update_run(rid, status="RUNNING")
        self._runs[tid] = run.info.run_id
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: dict[str, Any], step: int) -> None:
        """Log finite numeric metrics at `step`, skipping (key, step) pairs already logged."""
        seen = self._logged.setdefault(run_id, set())
        ts = int(time.time() * 1000)
        batch = []
        for k, v in metrics.items():
            if not is_finite_number(v) or (k, step) in seen:
                continue
            batch.append(Metric(k, float(v), ts, step))
            seen.add((k, step))
        for i in range(0, len(batch), MAX_BATCH):
            self.client.log_batch(run_id, metrics=batch[i:i + MAX_BATCH])

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Create or reopen the trial's run as soon as it starts."""
        self.run_id_for(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """Per-epoch metrics with step=epoch, the last epoch's from the final report (test metrics
        and artifacts are logged on completion). A per-epoch result Tune marked done was stopped
        by the scheduler: it gets status `stopped_early` and a reason, in place, so the trial's
        last result (leaderboard, progress line, this run's tags) says why it ended."""
        epoch = int(result.get("epoch", result.get("training_iteration", 0)))
        if result.get("done") and "status" not in result:
            result["status"] = STOPPED_EARLY
            result["reason"] = f"stopped early by {self.scheduler} at epoch {epoch}"
        keep = {k: v for k, v in result.items() if k.startswith(("val_", "train_")) or k == "epoch_time"}
        self.log_metrics(self.run_id_for(trial), keep, step=epoch)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Final metrics, reliability diagrams, and the terminal status: completed -> FINISHED,
        stopped early by the scheduler -> FINISHED with calib.status=stopped_early and its reason,
        diverged -> FAILED with the reason."""
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
            self.client.set_tag(rid, TAG_STATUS, STOPPED_EARLY)
            self.client.set_tag(rid, TAG_STOP_REASON, reason)
            self._terminate(rid, "FINISHED", outcome=f"**Ended:** {reason}.")
            return
        self.client.set_tag(rid, TAG_STATUS, str(status))
        if result.get("node_id"):
            self.client.set_tag(rid, TAG_NODE, str(result["node_id"]))
        final = {k: v for k, v in result.items()
                 if k.startswith(("val_", "test_", "calibrator_")) or k == "wall_time"}
        self.log_metrics(rid, final, step=step)
        if status != "completed":
            self._terminate(rid, "FAILED", f"{status}: {result.get('reason', '')}")
            return
        try:
            self._log_trial_artifacts(rid, trial)
        except Exception as exc:  # a missing artifact must not lose the run's status
            log.warning("could not log the report artifacts of %s: %s", trial.trial_id, exc)
        self._terminate(rid, "FINISHED", outcome=_outcome(result))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial that exhausted its retries: FAILED with the error's first line."""
        rid = self.run_id_for(trial)
        self.client.set_tag(rid, TAG_STATUS, "errored")
        reason = "trial errored"
        err = trial.error_file
        if err and Path(err).is_file():
            lines = [ln for ln in Path(err).read_text(errors="replace").splitlines() if ln.strip()]
            reason = lines[-1][:500] if lines else reason
        self._terminate(rid, "FAILED", reason)

    def _terminate(self, run_id: str, status: str, reason: str | None = None, outcome: str | None = None) -> None:
        if reason:
            self.client.set_tag(run_id, TAG_REASON, reason[:5000])
        self._add_to_note(run_id, outcome or (f"**Ended:** {reason}" if reason else None))
        self.client.set_terminated(run_id, status=status)

    def _add_to_note(self, run_id: str, text: str | None) -> None:
        """Append a paragraph to the run's description (once: a replayed result adds nothing)."""
        if not text:
            return
        note = self.client.get_run(run_id).data.tags.get(NOTE_TAG, "")
        if text not in note:
            self.client.set_tag(run_id, NOTE_TAG, f"{note}\n\n{text}".strip())

    def _log_trial_artifacts(self, run_id: str, trial: Any) -> None:
        """Reliability diagrams; shift tables and ECE-vs-severity plots; the per-task table."""
        from calib_core.metrics import reliability_diagram
        from sweeps.reports import per_task_table, shift_plot, shift_table

        ckpt = trial.checkpoint
        if ckpt is None:
            return
        with ckpt.as_directory() as d, tempfile.TemporaryDirectory() as out:
            preds = np.load(Path(d) / PREDICTIONS_FILE)
            # kept with the run so paired statistics and any metric can be recomputed later
            self.client.log_artifact(run_id, str(Path(d) / PREDICTIONS_FILE), artifact_path="predictions")
            for split in SPLITS:
                path = Path(out) / f"reliability_{split}.png"
                what = "validation" if split == "val" else "test"
                reliability_diagram(preds[f"{split}_probs"], preds[f"{split}_labels"], path,
                                    num_bins=self.num_bins, title=f"{describe_params(trial.config)} ({what})")
                self.client.log_artifact(run_id, str(path), artifact_path="diagrams")
            if (Path(d) / SHIFT_FILE).is_file():
                tables = json.loads((Path(d) / SHIFT_FILE).read_text())
                for split, rows in tables.items():
                    self.client.log_artifact(run_id, str(shift_table(rows, Path(out) / f"shift_{split}.csv")), "shift")
                    plot = shift_plot(rows, Path(out) / f"shift_ece_{split}.png", f"ECE under shift ({split})")
                    self.client.log_artifact(run_id, str(plot), "shift")
            summary = json.loads((Path(d) / SUMMARY_FILE).read_text())
            tasks = summary.get("tasks")
            if tasks:
                table = per_task_table(trial.last_result or {}, tasks, Path(out) / "per_task.csv")
                self.client.log_artifact(run_id, str(table), "tasks")


def describe_run(run_config: dict[str, Any]) -> str:
    """One sentence on what a trial trains, from its resolved run config (the run's description)."""
    data, model, train = run_config["data"], run_config["model"], run_config["train"]
    what = f"{model['name']} on {data['name']}, {train['epochs']} epochs, seed {run_config['seed']}"
    method = train["method"]
    if method == "onego":
        return (f"one-go training of {what}, calibrator `{train['calibrator']}` trained with the backbone at "
                f"calibrator lr {train['calibrator_lr']:.2e} on `{train['calibrator_data']}`")
    if method == "posthoc":
        return f"{what}, then post-hoc `{train['posthoc_calibrator']}` scaling (a reference point)"
    if method == "ce":
        return f"plain cross-entropy training of {what} (a reference point)"
    return f"{method} training of {what}"


def _outcome(result: dict[str, Any]) -> str:
    """The headline numbers of a completed trial, for its description."""
    def pct(key: str) -> str:
        v = result.get(key)
        return f"{100 * float(v):.1f} %" if is_number(v) else "n/a"

    return (f"**Result:** val accuracy {pct('val_accuracy')}, val ECE {pct('val_ece')}; test accuracy "
            f"{pct('test_accuracy')}, test ECE {pct('test_ece')}; diagrams under `diagrams/`, predictions under "
            "`predictions/`.")


def drop_orphan_runs(client: MlflowClient, experiment_id: str, sweep: str, trial_ids: set[str]) -> list[str]:
    """Deal with child runs of trials Ray Tune no longer knows; return their trial ids.

    A trial that started after Tune's last experiment snapshot is forgotten when the driver
    dies, and on resume Tune samples a replacement. An unfinished run of such a trial would be a
    second, dead run for one slot of the sweep, so it is deleted (soft: `mlflow gc` not run); a
    finished one is real work and stays, tagged `calib.lost_from_tune` (selection ignores it).
    """
    flt = f"tags.`{TAG_SWEEP}` = '{sweep}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'"
    lost = []
    for run in client.search_runs([experiment_id], filter_string=flt, max_results=10000):
        tid = run.data.tags.get(TAG_TRIAL, "")
        if tid in trial_ids:
            continue
        if run.info.status == "FINISHED":
            client.set_tag(run.info.run_id, TAG_LOST_FROM_TUNE, "true")
        else:
            if run.info.status == "RUNNING":
                client.set_terminated(run.info.run_id, status="KILLED")
            client.delete_run(run.info.run_id)
        lost.append(tid)
    return lost


def close_open_runs(client: MlflowClient, experiment_id: str, sweep: str, status: str) -> int:
    """Mark every still-RUNNING trial run of the sweep with `status`; return the count."""
    flt = f"tags.`{TAG_SWEEP}` = '{sweep}' and attributes.status = 'RUNNING'"
    n = 0
    for run in client.search_runs([experiment_id], filter_string=flt, max_results=10000):
        if run.data.tags.get(TAG_ROLE) == ROLE_PARENT:
            continue
        client.set_terminated(run.info.run_id, status=status)
        n += 1
    return n

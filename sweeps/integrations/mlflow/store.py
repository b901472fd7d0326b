"""The sweep's MLflow store: every run, tag, metric, artifact, search and registry call the service makes.

Runs are found by tags before any is created (`find_run`), so trial retries and `--resume` reattach
to the same runs; what a run means (which tags, which notes) is decided by the callers
(sweeps/service.py, integrations/mlflow/tracking.py, integrations/mlflow/model_export.py), which draw
nothing here either:
reports are files written elsewhere (sweeps/report/files.py) and logged through `log_artifacts`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from calib_core.redaction import redact_text
from sweeps.contract import (
    CLASSIC_ML,
    EXPERIMENT_KIND_TAG,
    NOTE_TAG,
    ROLE_PARENT,
    ROLE_TRIAL,
    TAG_EXPORT_COMPLETE,
    TAG_EXPORT_FORMAT,
    TAG_LOST_FROM_TUNE,
    TAG_ROLE,
    TAG_SWEEP,
    TAG_TRIAL,
)
from sweeps.integrations.mlflow.retry import (
    OutageRetry,
    RetryingClient,
    is_forbidden,
    quiet_run_links,
)
from sweeps.integrations.mlflow.sqlite_seed import seed_sqlite_store

MAX_METRICS = 900  # MLflow's log_batch takes at most 1000 metrics
MAX_PARAMS = 90  # ... and at most 100 params
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
MAX_TAG_CHARS = 5000  # what the service keeps of a long tag (a reason, a selection sentence)
ALL_RUNS = 10000  # search_runs page size: a sweep has far fewer runs


def _redacted(tags: dict[str, str]) -> dict[str, str]:
    return {k: redact_text(str(v)) for k, v in tags.items()}


def _active(experiment: Any) -> bool | None:
    return True if experiment is not None and experiment.lifecycle_stage == "active" else None


def _version_of(client: Any, model_name: str, run_id: str, model_id: str) -> Any | None:
    """The version of `model_name` registered from logged model `model_id` of `run_id`, if any."""
    for v in client.search_model_versions(f"run_id = '{run_id}'"):
        if v.name == model_name and (getattr(v, "model_id", None) == model_id or v.source == f"models:/{model_id}"):
            return v
    return None


def find_run(client: MlflowClient, experiment_id: str, tags: dict[str, str]) -> Any | None:
    """The single run carrying all `tags`, or None (more than one: the store was edited by hand)."""
    flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=flt, max_results=2)
    if len(runs) > 1:
        raise RuntimeError(f"more than one MLflow run has tags {tags}: the store was edited by hand")
    return runs[0] if runs else None


class LoggedSteps:
    """Which (metric, step) pairs a run has: every step up to each metric's last one (a trial logs a metric at
    increasing steps), plus pairs added since."""

    def __init__(self, last: dict[str, int] | None = None, pairs: Iterable[tuple[str, int]] = ()) -> None:
        self.last = dict(last or {})
        self.pairs = set(pairs)

    def __contains__(self, pair: object) -> bool:
        if not isinstance(pair, tuple) or len(pair) != 2:
            return False
        key, step = pair
        return bool(step <= self.last.get(key, -1)) or pair in self.pairs

    def update(self, pairs: Iterable[tuple[str, int]]) -> None:
        """Record pairs logged since."""
        self.pairs.update(pairs)


class MlflowStore:
    """One MLflow tracking store (a URI), with the operations the sweep needs; picklable (the client is not kept)."""

    def __init__(
        self,
        tracking_uri: str,
        client: Any = None,
        outage_timeout_s: float | None = None,
        retry: OutageRetry | None = None,
    ) -> None:
        """`outage_timeout_s` (the sweep's `tracking.outage_timeout_s`): how long calls wait out an unreachable
        server; None (checks, reading results) fails at once as MLflow does."""
        self.tracking_uri = tracking_uri
        self.outage_timeout_s = outage_timeout_s
        self._retry = retry
        self._client = self._wrap(client) if client is not None else None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "tracking_uri": self.tracking_uri,
            "outage_timeout_s": self.outage_timeout_s,
            "_client": None,
            "_retry": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"outage_timeout_s": None, "_retry": None, **state})

    @property
    def retry(self) -> OutageRetry | None:
        """The outage policy every client call goes through (None: no waiting)."""
        if self._retry is None and self.outage_timeout_s is not None:
            self._retry = OutageRetry(self.tracking_uri, self.outage_timeout_s)
        return self._retry

    def _wrap(self, client: Any) -> Any:
        retry = self.retry
        return client if retry is None else RetryingClient(client, retry)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) under the outage policy: for an idempotent step that talks to MLflow itself
        (the champion's registration)."""
        retry = self.retry
        return fn(*args, **kwargs) if retry is None else retry.call(fn, *args, **kwargs)

    def _once(self, method: str, settled: Any, *args: Any, **kwargs: Any) -> Any:
        """client.<method>(*args, **kwargs) for a call that must not take effect twice: after a failed attempt it
        is sent again only when `settled(client)` (a look-up, through the client without retries) finds that the
        attempt did not reach the store; otherwise what it finds is the result (OutageRetry.call_checked)."""
        client, retry = self.client, self.retry
        if retry is None or not isinstance(client, RetryingClient):
            return getattr(client, method)(*args, **kwargs)
        raw = client.unwrapped
        return retry.call_checked(getattr(raw, method), lambda: settled(raw), *args, **kwargs)

    @property
    def client(self) -> MlflowClient:
        """The MLflow client, created on first use; calls wait out an unreachable server (OutageRetry)."""
        if self._client is None:
            if self.outage_timeout_s is not None and self.tracking_uri.startswith(("http://", "https://")):
                # MLflow's own retries (7, backoff factor 2: minutes without a word) off, a bounded
                # request timeout: OutageRetry decides how long to wait and says so. A user's setting wins.
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
                os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
            quiet_run_links(self.tracking_uri)
            seed_sqlite_store(self.tracking_uri)
            self._client = self._wrap(MlflowClient(self.tracking_uri))
        return self._client

    # ------------------------------------------------------------------------ experiments
    def experiment_id(self, name: str) -> str | None:
        """The id of experiment `name`, or None when there is none."""
        exp = self.client.get_experiment_by_name(name)
        return exp.experiment_id if exp is not None else None

    def ensure_experiment(self, name: str) -> str:
        """The experiment's id, created if needed (a SQLite store's artifacts beside it), restored if deleted,
        and tagged as a classic ML experiment (`mlflow.experimentKind`) unless someone chose another kind."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                eid = exp.experiment_id
                self._once("restore_experiment", lambda c: _active(c.get_experiment(eid)), eid)
            if EXPERIMENT_KIND_TAG not in exp.tags:
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, CLASSIC_ML)
            return exp.experiment_id
        artifact_location = None
        if self.tracking_uri.startswith("sqlite:///"):
            db_path = Path(self.tracking_uri.removeprefix("sqlite:///"))
            artifact_location = (db_path.parent / "mlartifacts").as_uri()
        return self._once(
            "create_experiment",
            lambda c: getattr(c.get_experiment_by_name(name), "experiment_id", None),
            name,
            artifact_location=artifact_location,
            tags={EXPERIMENT_KIND_TAG: CLASSIC_ML},
        )

    # ------------------------------------------------------------------------ finding runs
    def find_run(self, experiment_id: str, tags: dict[str, str]) -> Any | None:
        """The single run carrying all `tags`, or None."""
        return find_run(self.client, experiment_id, tags)

    def parent_run(self, experiment_id: str, sweep: str) -> Any | None:
        """The sweep's parent run, or None."""
        return self.find_run(experiment_id, {TAG_SWEEP: sweep, TAG_ROLE: ROLE_PARENT})

    def trial_run(self, experiment_id: str, sweep: str, trial_id: str) -> Any | None:
        """The run of one trial of the sweep, or None."""
        return self.find_run(experiment_id, {TAG_SWEEP: sweep, TAG_TRIAL: trial_id})

    def trial_runs(self, experiment_id: str, sweep: str) -> list[Any]:
        """Every trial run of the sweep."""
        flt = f"tags.`{TAG_SWEEP}` = '{sweep}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'"
        return list(self.client.search_runs([experiment_id], filter_string=flt, max_results=ALL_RUNS))

    def trial_runs_by_id(self, experiment_id: str, sweep: str, runs: list[Any] | None = None) -> dict[str, Any]:
        """{trial id: run} of the sweep's trial runs, in one query or from `runs` (trial_runs' answer already read;
        a trial with two runs: the store was edited)."""
        out: dict[str, Any] = {}
        for run in self.trial_runs(experiment_id, sweep) if runs is None else runs:
            tid = run.data.tags.get(TAG_TRIAL, "")
            if tid in out:
                raise RuntimeError(
                    f"more than one MLflow run has tags {{{TAG_TRIAL!r}: {tid!r}}}: the store was edited by hand"
                )
            out[tid] = run
        return out

    def get_run(self, run_id: str) -> Any:
        """The run (info, data: metrics, params, tags)."""
        return self.client.get_run(run_id)

    # ------------------------------------------------------------------------ creating and ending runs
    def find_or_create_parent(self, experiment_id: str, sweep: str, tags: dict[str, str]) -> str:
        """The sweep's parent run id; reopened (RUNNING) if it exists."""
        run = self.parent_run(experiment_id, sweep)
        if run is None:
            run = self._create_run(experiment_id, sweep, {TAG_SWEEP: sweep, TAG_ROLE: ROLE_PARENT, **_redacted(tags)})
        elif run.info.status != "RUNNING":
            self.reopen(run.info.run_id)
        return run.info.run_id

    def create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> str:
        """A new run; its id."""
        return self._create_run(experiment_id, name, _redacted(tags)).info.run_id

    def _create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> Any:
        # a creation whose answer was lost (HTTP 500 after the server stored it, a dropped connection) is found
        # by the tags that name the run (a trial's, a sweep's parent) instead of creating a second run
        names = (TAG_SWEEP, TAG_TRIAL) if TAG_TRIAL in tags else (TAG_SWEEP, TAG_ROLE)
        key = {k: tags[k] for k in names if k in tags}
        settled = (lambda c: find_run(c, experiment_id, key)) if len(key) == 2 else (lambda c: None)
        return self._once("create_run", settled, experiment_id, run_name=name, tags=tags)

    def reopen(self, run_id: str) -> None:
        """Mark the run RUNNING again (a retried or resumed trial, a resumed sweep)."""
        self.client.update_run(run_id, status="RUNNING")

    def delete_tags(self, run_id: str, keys: list[str]) -> None:
        """Remove these tags from the run (those it has)."""
        tags = self.client.get_run(run_id).data.tags
        for key in keys:
            if key in tags:
                # sent again only while the tag is there (a second delete of a deleted tag is an error)
                self._once(
                    "delete_tag", lambda c, k=key: None if k in c.get_run(run_id).data.tags else True, run_id, key
                )

    def terminate(self, run_id: str, status: str, end_time: int | None = None) -> None:
        """End the run with `status` (FINISHED, FAILED, KILLED), at `end_time` (ms) or now."""
        self.client.set_terminated(run_id, status=status, end_time=end_time)

    def close_open_runs(self, experiment_id: str, sweep: str, status: str) -> int:
        """Mark every still-RUNNING trial run of the sweep with `status`; return the count."""
        flt = f"tags.`{TAG_SWEEP}` = '{sweep}' and attributes.status = 'RUNNING'"
        n = 0
        for run in self.client.search_runs([experiment_id], filter_string=flt, max_results=ALL_RUNS):
            if run.data.tags.get(TAG_ROLE) == ROLE_PARENT:
                continue
            self.terminate(run.info.run_id, status)
            n += 1
        return n

    def drop_orphan_runs(
        self, experiment_id: str, sweep: str, trial_ids: set[str], runs: list[Any] | None = None
    ) -> list[str]:
        """Deal with child runs of trials Ray Tune no longer knows; return their trial ids (`runs`: trial_runs'
        answer already read, current as to each run's status).

        A trial that started after Tune's last experiment snapshot is forgotten when the driver
        dies, and on resume Tune samples a replacement. An unfinished run of such a trial would be a
        second, dead run for one slot of the sweep, so it is deleted (soft: `mlflow gc` not run); a
        finished one is real work and stays, tagged `calib.lost_from_tune` (selection ignores it).
        A user who may not delete runs (the cluster's sweep user has EDIT on its experiment, and deleting
        takes MANAGE) leaves the unfinished run KILLED and tagged `calib.lost_from_tune` as well.
        """
        lost = []
        for run in self.trial_runs(experiment_id, sweep) if runs is None else runs:
            tid = run.data.tags.get(TAG_TRIAL, "")
            if tid in trial_ids:
                continue
            rid = run.info.run_id
            if run.info.status == "FINISHED":
                self.set_tags(rid, {TAG_LOST_FROM_TUNE: "true"})
            else:
                if run.info.status == "RUNNING":
                    self.terminate(rid, "KILLED")
                try:
                    self._once(
                        "delete_run",
                        lambda c, r=rid: True if c.get_run(r).info.lifecycle_stage == "deleted" else None,
                        rid,
                    )
                except MlflowException as exc:
                    if not is_forbidden(exc):
                        raise
                    self.set_tags(rid, {TAG_LOST_FROM_TUNE: "true"})
            lost.append(tid)
        return lost

    # ------------------------------------------------------------------------ params, tags, metrics
    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log params as strings (cut to MLflow's limit), in batches."""
        items = [Param(k, redact_text(str(v))[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(run_id, params=items[i : i + MAX_PARAMS])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Set tags on the run, in order (secrets in URIs masked: calib_core/redaction.py)."""
        for key, value in tags.items():
            self.client.set_tag(run_id, key, redact_text(str(value)))

    def append_to_note(self, run_id: str, text: str) -> None:
        """Append a paragraph to the run's description (once: a replayed result adds nothing)."""
        text = redact_text(text)  # as set_tags stores it, so a replay finds it
        note = self.get_run(run_id).data.tags.get(NOTE_TAG, "")
        if text not in note:
            self.set_tags(run_id, {NOTE_TAG: f"{note}\n\n{text}".strip()})

    def log_metrics(
        self, run_id: str, metrics: dict[str, float], step: int = 0, timestamp_ms: int | None = None
    ) -> None:
        """Log every metric as given (callers choose which are worth logging) at `step`, in batches, stamped
        `timestamp_ms` (when it was measured, if known) or now."""
        ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        batch = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(batch), MAX_METRICS):
            self.client.log_batch(run_id, metrics=batch[i : i + MAX_METRICS])

    def metric_steps(self, run_id: str, key: str) -> set[int]:
        """The steps at which the run logged `key`."""
        return {m.step for m in self.client.get_metric_history(run_id, key)}

    def logged_steps(self, run: Any) -> LoggedSteps:
        """The (metric, step) pairs the run already has (a reattached trial never logs a step twice).

        A trial logs each metric at increasing steps, so while its epochs have no gap (epoch_time, logged every
        epoch, at consecutive steps) the last step of each metric, which the run's summary carries, says which
        steps it has: two requests for the run instead of one per metric (each request to an authenticated server
        checks the password; 60 metrics took a minute per reattached trial). With a gap (an epoch whose writes
        died with a killed driver, resumed.deliver_missed_completions fills it), or without the summary's steps
        (an MLflow that no longer keeps them), every metric's history is read."""
        rid = run.info.run_id
        latest = getattr(run.data, "_metric_objs", None)
        if latest is not None and all(hasattr(m, "step") for m in latest):
            epochs = self.metric_steps(rid, "epoch_time")
            if not epochs or epochs == set(range(min(epochs), max(epochs) + 1)):
                return LoggedSteps({m.key: int(m.step) for m in latest})
        # epoch_time is logged every epoch, so its history is asked for even when the summary lacks it
        keys = {"epoch_time", *run.data.metrics}
        return LoggedSteps(pairs={(k, m.step) for k in keys for m in self.client.get_metric_history(rid, k)})

    # ------------------------------------------------------------------------ artifacts
    def log_dict(self, run_id: str, data: dict[str, Any], name: str) -> None:
        """A JSON artifact `name` made from `data`."""
        self.client.log_dict(run_id, data, name)

    def log_artifacts(self, run_id: str, files: Iterable[tuple[str | Path, str | None]]) -> None:
        """Log each (file, artifact folder) pair; folder None = the run's artifact root."""
        for path, folder in files:
            self.client.log_artifact(run_id, str(path), artifact_path=folder)

    def download_artifact(self, run_id: str, path: str, dst: str | Path) -> str:
        """Download the run's artifact `path` into `dst`; the local path."""
        return self.client.download_artifacts(run_id, path, str(dst))

    # ------------------------------------------------------------------------ models and the registry
    def completed_export(self, run_id: str, export_format: str) -> str | None:
        """Id of a logged model in `export_format` an earlier call completed on `run_id`, if any. A model an
        earlier call left half-written (still PENDING: the driver died while logging it) is finalized FAILED
        here, so that no logged model of the run stays PENDING for ever."""
        experiment_id = self.get_run(run_id).info.experiment_id
        models = self.client.search_logged_models(
            experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}'"
        )
        done = [
            m
            for m in models
            if m.tags.get(TAG_EXPORT_COMPLETE) == "true" and m.tags.get(TAG_EXPORT_FORMAT) == export_format
        ]
        for m in models:
            if m.tags.get(TAG_EXPORT_COMPLETE) != "true" and str(getattr(m.status, "value", m.status)) == "PENDING":
                self.client.finalize_logged_model(m.model_id, "FAILED")
        return max(done, key=lambda m: m.creation_timestamp).model_id if done else None

    def mark_export_complete(self, model_id: str) -> None:
        """Tag a logged model as completely written (a later call may register it)."""
        self.client.set_logged_model_tags(model_id, {TAG_EXPORT_COMPLETE: "true"})

    def versions_of_run(self, model_name: str, run_id: str) -> list[Any]:
        """The registered model's versions created from `run_id`, oldest first."""
        found = self.client.search_model_versions(f"run_id = '{run_id}'")
        return sorted((v for v in found if v.name == model_name), key=lambda v: int(v.version))

    def register(self, model_name: str, model_id: str, run_id: str, description: str, tags: dict[str, str]) -> str:
        """A new version of `model_name` (created if needed) from logged model `model_id`; its number."""
        try:
            self.client.create_registered_model(model_name)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
                raise
        mv = self._once(
            "create_model_version",
            lambda c: _version_of(c, model_name, run_id, model_id),
            model_name,
            source=f"models:/{model_id}",
            run_id=run_id,
            model_id=model_id,
            description=redact_text(description),
            tags=_redacted(tags),
        )
        return str(mv.version)

    def describe_version(self, model_name: str, version: str, description: str) -> None:
        """Replace a model version's description."""
        self.client.update_model_version(model_name, version, description=redact_text(description))

    def point_alias(self, model_name: str, alias: str, version: str, tags: dict[str, str]) -> None:
        """Point `alias` at `version` and set the version's `tags`."""
        self.client.set_registered_model_alias(model_name, alias, version)
        for key, value in tags.items():
            self.client.set_model_version_tag(model_name, version, key, redact_text(value))

    def alias_version(self, model_name: str, alias: str) -> str | None:
        """The version `alias` points at, or None."""
        try:
            return str(self.client.get_model_version_by_alias(model_name, alias).version)
        except MlflowException:
            return None

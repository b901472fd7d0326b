"""HTTP 500s from the tracking server (issue #36, fault 4) and the tracking writer's bounded queue (fast).

A 500 is transient: the call is retried with the same arguments, quietly when its first retry delivers it.
A call the server stored before its answer was lost (a 500 after the write) must not take effect twice:
creating a run, an experiment or a model version, deleting a tag or a run look first. 4xx stay errors.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import requests
from mlflow.exceptions import MlflowException, RestException

from sweeps.contract import TAG_QUEUE_MAX, TAG_QUEUE_WAIT
from sweeps.integrations.mlflow.retry import OutageRetry, is_outage, is_server_error
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.sweep_runs import WRITER_QUEUE_BOUND, UntilTrackingStops

# what MLflow 3 raises for a 500 with its HTTP retries off (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0), as measured
SERVER_500 = MlflowException(
    "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with exception "
    "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: /api/2.0/mlflow/runs/log-batch "
    "(Caused by ResponseError('too many 500 error responses'))"
)
BAD_REQUEST = RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad metric"})
ALREADY = RestException({"error_code": "RESOURCE_ALREADY_EXISTS", "message": "exists"})
# what MLflow 3.17's client raises for the basic-auth app's 403 (plain-text body), as measured against a server
DENIED = MlflowException(
    "API request to endpoint /api/2.0/mlflow/runs/delete failed with error code 403 != 200. "
    "Response body: 'Permission denied'"
)


def _http_error(code: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = code
    return requests.HTTPError(f"{code} Server Error: for url: http://x/artifacts/a.txt", response=response)


def test_classification_of_server_errors():
    assert is_server_error(SERVER_500) and is_outage(SERVER_500)
    assert is_server_error(MlflowException("API request to endpoint /x failed with error code 500 != 200. Body: ''"))
    assert is_server_error(RestException({"error_code": "INTERNAL_ERROR", "message": "database is locked"}))
    assert is_server_error(_http_error(500)) and is_outage(_http_error(500))
    # the request's fault: raised at once
    for exc in (
        BAD_REQUEST,
        ALREADY,
        _http_error(400),
        _http_error(404),
        MlflowException("API request to endpoint /x failed with error code 404 != 200. Response body: ''"),
        MlflowException("RESOURCE_DOES_NOT_EXIST: run x"),
    ):
        assert not is_server_error(exc) and not is_outage(exc), exc


class Clock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


class FakeServer:
    """An MLflow client over dicts whose calls fail as scripted: `plan[method]` is a list of fates for its next
    calls, "before" (HTTP 500, nothing stored), "after" (stored, then HTTP 500) or "bad" (HTTP 400)."""

    def __init__(self, plan: dict[str, list[str]]) -> None:
        self.plan = plan
        self.calls: dict[str, int] = {}
        self.runs: dict[str, SimpleNamespace] = {}
        self.experiments: dict[str, SimpleNamespace] = {}
        self.versions: list[SimpleNamespace] = []
        self.batches: list[tuple] = []

    def _do(self, method: str, effect):
        self.calls[method] = self.calls.get(method, 0) + 1
        fates = self.plan.get(method) or []
        fate = fates.pop(0) if fates else ""
        if fate == "before":
            raise SERVER_500
        if fate == "bad":
            raise BAD_REQUEST
        if fate == "denied":
            raise DENIED
        out = effect()
        if fate == "after":
            raise SERVER_500
        return out

    # runs
    def create_run(self, experiment_id, run_name=None, tags=None):
        def effect():
            rid = f"r{len(self.runs)}"
            self.runs[rid] = SimpleNamespace(
                info=SimpleNamespace(run_id=rid, status="RUNNING", lifecycle_stage="active"),
                data=SimpleNamespace(tags=dict(tags or {}), metrics={}),
            )
            return self.runs[rid]

        return self._do("create_run", effect)

    def search_runs(self, experiment_ids, filter_string="", max_results=1000):
        want = dict(re.findall(r"tags\.`([^`]+)` = '([^']*)'", filter_string))
        found = [r for r in self.runs.values() if all(r.data.tags.get(k) == v for k, v in want.items())]
        return self._do("search_runs", lambda: found[:max_results])

    def get_run(self, run_id):
        return self._do("get_run", lambda: self.runs[run_id])

    def delete_tag(self, run_id, key):
        def effect():
            if key not in self.runs[run_id].data.tags:
                raise RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"no tag {key}"})
            del self.runs[run_id].data.tags[key]

        return self._do("delete_tag", effect)

    def delete_run(self, run_id):
        def effect():
            if self.runs[run_id].info.lifecycle_stage == "deleted":
                raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "already deleted"})
            self.runs[run_id].info.lifecycle_stage = "deleted"

        return self._do("delete_run", effect)

    def set_tag(self, run_id, key, value):
        return self._do("set_tag", lambda: self.runs[run_id].data.tags.__setitem__(key, value))

    def set_terminated(self, run_id, status=None, end_time=None):
        return self._do("set_terminated", lambda: setattr(self.runs[run_id].info, "status", status))

    def log_batch(self, run_id, metrics=(), params=()):
        return self._do("log_batch", lambda: self.batches.append((run_id, tuple((m.key, m.step) for m in metrics))))

    # experiments
    def get_experiment_by_name(self, name):
        return self._do("get_experiment_by_name", lambda: self.experiments.get(name))

    def create_experiment(self, name, artifact_location=None, tags=None):
        def effect():
            if name in self.experiments:
                raise ALREADY
            self.experiments[name] = SimpleNamespace(experiment_id=str(len(self.experiments)), tags=dict(tags or {}))
            return self.experiments[name].experiment_id

        return self._do("create_experiment", effect)

    # the registry
    def create_registered_model(self, name):
        return self._do("create_registered_model", lambda: None)

    def create_model_version(self, name, source, run_id=None, model_id=None, description=None, tags=None):
        def effect():
            v = SimpleNamespace(name=name, version=str(len(self.versions) + 1), run_id=run_id, model_id=model_id)
            v.source = source
            self.versions.append(v)
            return v

        return self._do("create_model_version", effect)

    def search_model_versions(self, filter_string):
        run_id = re.search(r"run_id = '([^']*)'", filter_string).group(1)
        return self._do("search_model_versions", lambda: [v for v in self.versions if v.run_id == run_id])


def make(plan: dict[str, list[str]]) -> tuple[MlflowStore, FakeServer, Clock, list[str]]:
    server, clock, lines = FakeServer(plan), Clock(), []
    retry = OutageRetry("http://tracking:5000", 600, say=lines.append, sleep=clock.sleep, clock=clock)
    return MlflowStore("http://tracking:5000", client=server, outage_timeout_s=600, retry=retry), server, clock, lines


def test_a_500_is_retried_with_the_same_arguments_and_quietly_when_one_retry_delivers_it():
    store, server, clock, lines = make({"log_batch": ["before"]})
    store.log_metrics("r1", {"val_ece": 0.1}, step=2)
    assert server.batches == [("r1", (("val_ece", 2),))] and server.calls["log_batch"] == 2
    assert clock.sleeps == [1] and lines == []  # a blip: no line


def test_a_500_after_the_write_is_resent_unchanged():
    # the SQL store keeps identical metric rows once; what matters here is that the retry is the same call
    store, server, _, _ = make({"log_batch": ["after"]})
    store.log_metrics("r1", {"val_ece": 0.1}, step=2, timestamp_ms=1234)
    assert server.batches == [("r1", (("val_ece", 2),))] * 2


def test_a_500_that_persists_is_announced_once_each_way():
    store, server, clock, lines = make({"log_batch": ["before"] * 4})
    store.log_metrics("r1", {"val_ece": 0.1}, step=2)
    assert len(server.batches) == 1 and clock.sleeps == [1, 2, 4, 8]
    assert len(lines) == 2 and "back after" in lines[1], lines
    assert "answers HTTP 500" in lines[0] and "tracking.outage_timeout_s" in lines[0], lines


def test_a_4xx_is_raised_at_once():
    store, server, clock, lines = make({"log_batch": ["bad"]})
    with pytest.raises(RestException, match="bad metric"):
        store.log_metrics("r1", {"val_ece": 0.1}, step=2)
    assert server.calls["log_batch"] == 1 and clock.sleeps == [] and lines == []


@pytest.mark.parametrize("fate", ["before", "after"])
def test_a_run_is_created_once_whatever_the_500(fate):
    store, server, _, _ = make({"create_run": [fate, fate]})
    rid = store.create_run("0", "trial", {"calib.sweep": "s", "calib.role": "trial", "calib.trial_id": "t1"})
    assert list(server.runs) == [rid]
    assert server.calls["create_run"] == (1 if fate == "after" else 3)
    parent = store.find_or_create_parent("0", "s2", {})
    assert server.runs[parent].data.tags["calib.role"] == "parent" and len(server.runs) == 2


@pytest.mark.parametrize("fate", ["before", "after"])
def test_an_experiment_is_created_once(fate):
    store, server, _, _ = make({"create_experiment": [fate]})
    eid = store.ensure_experiment("calib-sweeps")
    assert server.experiments["calib-sweeps"].experiment_id == eid and len(server.experiments) == 1


def test_a_deleted_tag_or_run_is_not_deleted_again():
    store, server, _, _ = make({"delete_tag": ["after"], "delete_run": ["after"]})
    rid = store.create_run("0", "trial", {"calib.sweep": "s", "calib.role": "trial", "calib.trial_id": "t1"})
    server.runs[rid].data.tags["calib.status"] = "errored"
    store.delete_tags(rid, ["calib.status"])  # the second delete would be RESOURCE_DOES_NOT_EXIST
    assert "calib.status" not in server.runs[rid].data.tags and server.calls["delete_tag"] == 1
    assert store.drop_orphan_runs("0", "s", set()) == ["t1"]  # its run is deleted, once
    assert server.runs[rid].info.lifecycle_stage == "deleted" and server.calls["delete_run"] == 1


def test_an_orphan_run_the_user_may_not_delete_is_killed_and_tagged_lost():
    """The cluster's sweep user has EDIT on its experiment: deleting a run takes MANAGE (HTTP 403)."""
    store, server, _, _ = make({"delete_run": ["denied"]})
    rid = store.create_run("0", "trial", {"calib.sweep": "s", "calib.role": "trial", "calib.trial_id": "t1"})
    assert store.drop_orphan_runs("0", "s", set()) == ["t1"]
    run = server.runs[rid]
    assert run.info.lifecycle_stage == "active" and run.info.status == "KILLED"
    assert run.data.tags["calib.lost_from_tune"] == "true" and server.calls["delete_run"] == 1
    # any other refusal is still an error
    store, server, _, _ = make({"delete_run": ["bad"]})
    store.create_run("0", "trial", {"calib.sweep": "s", "calib.role": "trial", "calib.trial_id": "t1"})
    with pytest.raises(RestException):
        store.drop_orphan_runs("0", "s", set())


def test_a_403_is_forbidden_not_an_outage():
    from sweeps.integrations.mlflow.retry import is_forbidden

    assert is_forbidden(DENIED) and not is_outage(DENIED) and not is_server_error(DENIED)
    assert is_forbidden(RestException({"error_code": "PERMISSION_DENIED", "message": "no"}))
    assert not is_forbidden(BAD_REQUEST) and not is_forbidden(SERVER_500)


def test_the_champion_is_registered_once_after_a_500():
    store, server, _, _ = make({"create_model_version": ["after"], "create_registered_model": ["after"]})
    version = store.register("calibrated", "m-1", "r9", "the champion", tags={})
    assert version == "1" and len(server.versions) == 1 and server.calls["create_model_version"] == 1


def test_a_real_client_sees_a_500_as_transient_and_a_400_as_an_error(monkeypatch):
    """MLflow's own client against a server that answers 500 once, then 200; then 400: the messages it really
    raises (its HTTP retries off, as MlflowStore.client sets them)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    answers = [(500, b"Internal Server Error"), (200, b"{}"), (400, json.dumps({"error_code": "BAD_REQUEST"}).encode())]
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            seen.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
            code, body = answers.pop(0)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        clock, lines = Clock(), []
        retry = OutageRetry(url, 600, say=lines.append, sleep=clock.sleep, clock=clock)
        store = MlflowStore(url, outage_timeout_s=600, retry=retry)
        store.log_metrics("abc", {"val_ece": 0.25}, step=1, timestamp_ms=1000)
        assert len(seen) == 2 and seen[0] == seen[1] and clock.sleeps == [1] and lines == []
        with pytest.raises(MlflowException) as info:
            store.log_metrics("abc", {"val_ece": 0.5}, step=2)
        assert not is_outage(info.value) and len(seen) == 3
    finally:
        server.shutdown()
        server.server_close()


class SlowInner:
    """A tracking callback whose hooks wait for `go` (a tracking server slower than the trials)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.seen: list[int] = []
        self.parent_run_id = "parent"

    def on_trial_result(self, iteration, trials, trial, result) -> None:
        self.go.wait(10)
        self.seen.append(result["epoch"])


class TagStore:
    def __init__(self) -> None:
        self.tags: dict[str, dict[str, str]] = {}

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.tags.setdefault(run_id, {}).update(tags)


def test_the_writer_queue_is_bounded_blocks_the_producer_when_full_and_loses_nothing():
    assert WRITER_QUEUE_BOUND == 2000
    inner, store = SlowInner(), TagStore()
    writer = UntilTrackingStops(inner, store, max_queue=3)  # type: ignore[arg-type]
    inner.annotate_result = lambda result: None  # type: ignore[attr-defined]
    done = threading.Event()

    def tune_loop() -> None:
        for epoch in range(8):
            writer.on_trial_result(0, [], SimpleNamespace(trial_id="t"), {"epoch": epoch})
        done.set()

    loop = threading.Thread(target=tune_loop)
    loop.start()
    time.sleep(0.5)
    # the writer holds one hook, the queue three more; the loop waits to put the fifth
    assert not done.is_set() and writer.max_queued == 3
    inner.go.set()
    loop.join(10)
    writer.flush(10)
    writer.close()
    assert done.is_set() and inner.seen == list(range(8))  # every result, in order, once
    assert writer.max_queued == 3 and writer.waited_s > 0.3
    assert store.tags["parent"][TAG_QUEUE_MAX] == "3" and float(store.tags["parent"][TAG_QUEUE_WAIT]) > 0.3


def test_mlflow_retries_its_own_requests_only_while_it_logs_a_model(monkeypatch):
    from sweeps.integrations.mlflow.retry import FLUENT_HTTP_RETRIES, fluent_http_retries

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", raising=False)
    waiting = MlflowStore("http://tracking:5000", outage_timeout_s=600)
    with fluent_http_retries(waiting.tracking_uri, waiting.retry is not None):
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == str(FLUENT_HTTP_RETRIES)
        assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "1"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR" not in os.environ
    # a store that does not wait out outages (checks, reading results) and a SQLite store: MLflow as configured
    for store in (MlflowStore("http://tracking:5000"), MlflowStore("sqlite:///x.db", outage_timeout_s=600)):
        with fluent_http_retries(store.tracking_uri, store.retry is not None):
            assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"

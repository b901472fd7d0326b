"""The cluster sweep's data check (sweeps/checks/staged_data.py): refused before any trial, in one line naming the
staging step, when the dataset is neither under the data root nor staged; passes when either holds."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path

import pytest

from calib_core.config import ConfigError
from calib_core.data import stage, staging
from sweeps.api import resolve
from sweeps.checks.staged_data import check_cluster_data, staged_data_problem
from tests.fixtures_fabricate import fabricate_cifar10

STEP = "make stage-data DATASET=cifar10 DEST="


def test_problem_is_none_when_the_files_are_there_or_staged():
    assert staged_data_problem("cifar10", "/data/datasets", [], None, None) is None
    assert staged_data_problem("cifar10", "/data/datasets", ["a"], "s3://b/datasets", None) is None


def test_problem_names_the_staging_step_and_why_within_one_short_line():
    line = staged_data_problem("cifar10", "/data/datasets", ["a", "b", "c", "d"], None, None)
    assert line is not None and "\n" not in line
    assert line.startswith("run.data.root: cifar10 is neither under /data/datasets (4 files missing) nor staged")
    assert "CALIB_DATASETS_URI is not set" in line and f"`{STEP}s3://<bucket>/datasets`" in line
    src = "s3://calib-sweeps-ray-results/datasets"
    line = staged_data_problem("cifar10", "/data/datasets", ["a"] * 7, src, "no calib-manifest.json in DEST/cifar10/")
    assert line is not None and "nor staged (no calib-manifest.json in DEST/cifar10/);" in line
    assert line.endswith(f"`{STEP}{src}` (deploy/README.md)")
    assert len(line) <= 280, len(line)  # sweeps/cli.py cuts an error line at 300 characters with its frame


def _cfg(tmp_path: Path, root: Path, download: bool = False):
    return resolve(
        None,
        ["run.data.name=cifar10", f"run.data.root={root}", f"run.data.download={str(download).lower()}"],
        workdir=tmp_path,
    )


def test_cluster_check_refuses_absent_data_and_accepts_staged_or_present(tmp_path, monkeypatch):
    root, store = tmp_path / "data", tmp_path / "store"
    monkeypatch.delenv(staging.SOURCE_ENV, raising=False)
    with pytest.raises(ConfigError, match="CALIB_DATASETS_URI is not set"):
        check_cluster_data(_cfg(tmp_path, root))
    monkeypatch.setenv(staging.SOURCE_ENV, str(store))
    with pytest.raises(ConfigError, match=rf"nor staged \(no calib-manifest.json in DEST/cifar10/\).*{STEP}{store}`"):
        check_cluster_data(_cfg(tmp_path, root))
    fabricate_cifar10(tmp_path / "download")
    stage.stage("cifar10", str(store), tmp_path / "download", download=False, verify_checksums=False)
    check_cluster_data(_cfg(tmp_path, root))  # staged: the trials sync it
    assert not root.exists(), "the check writes nothing"
    monkeypatch.delenv(staging.SOURCE_ENV)
    check_cluster_data(_cfg(tmp_path, tmp_path / "download"))  # on the shared volume already
    check_cluster_data(_cfg(tmp_path, root, download=True))  # downloads: opted in (public-https-egress)


def test_cluster_check_waits_for_a_store_that_does_not_answer_then_gives_up(tmp_path, monkeypatch):
    monkeypatch.setenv(staging.SOURCE_ENV, "s3://b/datasets")
    calls = []
    monkeypatch.setattr(staging, "read_manifest", lambda *a: calls.append(1) or __import__("time").sleep(5))
    with pytest.raises(ConfigError, match=r"nor staged \(no answer within 0.2 s, still after 0.5 s\)"):
        check_cluster_data(_cfg(tmp_path, tmp_path / "data"), timeout=0.2, wait_s=0.5)
    assert len(calls) >= 2, "the store was not asked again"


def test_cluster_check_reads_the_answer_of_a_store_that_answers_late(tmp_path, monkeypatch):
    """A store that does not answer in time at first (its Service starting) is asked again: the refusal gives
    what it then says, not the first timeout."""
    monkeypatch.setenv(staging.SOURCE_ENV, "s3://b/datasets")
    calls = []

    def read(*a):
        calls.append(1)
        if len(calls) == 1:
            __import__("time").sleep(5)
        raise FileNotFoundError("no calib-manifest.json at s3://b/datasets/cifar10")

    monkeypatch.setattr(staging, "read_manifest", read)
    with pytest.raises(ConfigError, match=r"nor staged \(no calib-manifest.json in DEST/cifar10/\);"):
        check_cluster_data(_cfg(tmp_path, tmp_path / "data"), timeout=0.2, wait_s=10)


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that refuses every request (403), as a bucket without the pod's access would."""

    def do_HEAD(self):  # noqa: N802 - the handler's API
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args):
        pass


def _s3_env(monkeypatch, endpoint: str) -> None:
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        staging.SOURCE_ENV: "s3://bucket/datasets",
    }.items():
        monkeypatch.setenv(key, value)


def test_a_store_that_refuses_access_is_named_as_such_at_once(tmp_path, monkeypatch):
    """pyarrow's real S3 client against a server answering 403: the reason is the refusal, not a missing manifest,
    and it is not waited for."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _s3_env(monkeypatch, f"http://127.0.0.1:{server.server_port}")
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as err:
            check_cluster_data(_cfg(tmp_path, tmp_path / "data"), timeout=20, wait_s=60)
    finally:
        server.shutdown()
    assert "nor staged (cannot read DEST/cifar10/calib-manifest.json: ACCESS_DENIED);" in str(err.value), str(err.value)
    assert time.monotonic() - t0 < 15, "a refusal was waited for"


def test_a_store_with_nothing_listening_is_a_transient_reason(tmp_path, monkeypatch):
    """pyarrow's real S3 client, nothing listening at the endpoint: a connection problem (waited for on a
    cluster), named as one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _s3_env(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=r"nor staged \(cannot reach the store: .*still after 0 s\)"):
        check_cluster_data(_cfg(tmp_path, tmp_path / "data"), timeout=20, wait_s=0)


def test_startup_runs_the_check_for_cluster_sweeps_only(tmp_path, monkeypatch):
    from sweeps.startup import check_all

    monkeypatch.delenv(staging.SOURCE_ENV, raising=False)
    monkeypatch.setattr("sweeps.startup._environment", lambda cfg, cluster, resume, grow, found, ok: found)
    cfg = resolve(
        None,
        ["run.data.name=cifar10", f"run.data.root={tmp_path / 'data'}", "run.data.download=false"],
        cluster=True,
        workdir=tmp_path,
    )
    cfg = cfg.model_copy(update={"storage_path": "s3://b/tune"})
    cfg.tracking.uri = "https://mlflow:5000"
    found = check_all(cfg, cluster=True)
    assert any(STEP in p for p in found), found

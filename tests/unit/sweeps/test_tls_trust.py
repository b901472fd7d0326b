"""TLS between the sweep and MLflow (issue #37 item 3), without containers: the dev CA of deploy/dev_tls.py signs
certificates every in-cluster name verifies against (and no other name does); the sweep's preflight checks the
server's certificate as the MLflow client will (MLFLOW_TRACKING_SERVER_CERT_PATH, MLflow's own switch
MLFLOW_TRACKING_INSECURE_TLS) and refuses an untrusted one at once, in one line naming the fix; the MLflow
client's certificate error is not taken for an outage (no waiting it out)."""

from __future__ import annotations

import base64
import importlib.util
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from calib_core.config import ConfigError
from sweeps.checks import servers
from tests.paths import ROOT


def _dev_tls():
    spec = importlib.util.spec_from_file_location("dev_tls", ROOT / "deploy" / "dev_tls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """The dev Secrets, rendered as YAML by the script and read back, written out as files."""
    dev_tls = _dev_tls()
    out = tmp_path_factory.mktemp("tls")
    docs = list(yaml.safe_load_all(dev_tls.manifest(dev_tls.issue("team-a"))))
    names = ["mlflow-tls", "postgres-tls", "postgres-ca", "mlflow-metrics-client-tls"]
    assert [d["metadata"]["name"] for d in docs] == names
    for d in docs:
        if d["metadata"]["name"] == "postgres-ca":  # the CA alone, for PostgreSQL's clients
            assert d["type"] == "Opaque" and set(d["data"]) == {"ca.crt"}
            assert d["data"]["ca.crt"] == docs[0]["data"]["ca.crt"]
        else:
            assert d["type"] == "kubernetes.io/tls" and set(d["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        for key, value in d["data"].items():
            (out / d["metadata"]["name"]).mkdir(exist_ok=True)
            (out / d["metadata"]["name"] / key).write_bytes(base64.b64decode(value))
    return out


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path.endswith("/health") else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(certs):
    """An HTTPS server with MLflow's dev certificate, answering /health."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "mlflow-tls" / "tls.crt", certs / "mlflow-tls" / "tls.key")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _handshake(port: int, name: str, ca: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=name):
        pass


def test_every_in_cluster_name_verifies_and_no_other(certs, server):
    port = int(server.rsplit(":", 1)[1])
    ca = certs / "mlflow-tls" / "ca.crt"
    for name in ("mlflow", "mlflow.team-a", "mlflow.team-a.svc", "mlflow.team-a.svc.cluster.local", "localhost"):
        _handshake(port, name, ca)
    for name in ("mlflow.team-b.svc", "postgres", "evil.example"):
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            _handshake(port, name, ca)
    # another CA's certificate is not trusted
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(port, "mlflow", _other_ca(certs))


def _other_ca(certs) -> Path:
    dev_tls = _dev_tls()
    path = certs / "other-ca.crt"
    path.write_bytes(dev_tls.issue("team-a")["mlflow-tls"]["ca.crt"])
    return path


def test_preflight_verifies_the_certificate_as_the_client_will(certs, server, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_INSECURE_TLS", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(certs / "mlflow-tls" / "ca.crt"))
    assert servers._probe_http(server) is None
    servers.check_tracking(server, cluster=True)

    monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
    reason = servers._probe_http(server)
    assert reason.startswith("its TLS certificate is not trusted here") and "MLFLOW_TRACKING_SERVER_CERT_PATH" in reason
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        servers.check_tracking(server, cluster=True)  # a cluster waits for transient reasons: not this one
    assert time.monotonic() - t0 < 10
    message = str(err.value)
    assert "\n" not in message and "set MLFLOW_TRACKING_SERVER_CERT_PATH to its CA's certificate" in message

    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(_other_ca(certs)))
    assert "is " + str(_other_ca(certs)) + " its CA's certificate?" in servers._probe_http(server)

    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(certs / "missing.crt"))
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_SERVER_CERT_PATH: .*missing.crt is not a readable PEM"):
        servers._probe_http(server)

    monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH")
    monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")  # MLflow's own switch: no check
    assert servers._probe_http(server) is None


def test_the_clients_certificate_error_is_not_an_outage(server, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from sweeps.integrations.mlflow.retry import is_outage, is_untrusted_tls

    monkeypatch.delenv("MLFLOW_TRACKING_SERVER_CERT_PATH", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_INSECURE_TLS", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(MlflowException) as err:
        MlflowClient(server).get_experiment_by_name("calib-sweeps")
    assert is_untrusted_tls(err.value) and not is_outage(err.value)
    assert os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") is None


def test_image_health_check_answers_for_https_and_http_servers(server):
    """docker/mlflow-healthcheck (the MLflow image's HEALTHCHECK): 0 for a TLS server (certificate not verified,
    as the kubelet's HTTPS probes), 0 for a plain HTTP one, 1 when nothing answers."""
    import subprocess
    import sys

    script = [sys.executable, str(ROOT / "docker" / "mlflow-healthcheck")]
    assert subprocess.run([*script, server.rsplit(":", 1)[1]], timeout=30).returncode == 0
    plain = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        assert subprocess.run([*script, str(plain.server_address[1])], timeout=30).returncode == 0
    finally:
        plain.shutdown()
        plain.server_close()
    assert subprocess.run([*script, str(plain.server_address[1])], timeout=30).returncode == 1

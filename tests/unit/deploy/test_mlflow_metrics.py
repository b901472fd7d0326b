"""MLflow's own Prometheus metrics (issue #46 item 1): the image locks prometheus-flask-exporter by hash, its
entrypoint passes `--expose-prometheus` (tests/unit/deploy/test_deploy_consistency.py runs it), the pod's `metrics`
container serves what the server's workers write, and the production overlay scrapes it: a ServiceMonitor on the
Service's `metrics` port over HTTPS verified against the mlflow-tls CA, with Prometheus's client certificate (mutual
TLS: the container answers certificates of that CA alone), admitted by a NetworkPolicy to Prometheus alone. The
alerts on these metrics: tests/unit/deploy/test_alerts.py.

Why a container of its own rather than the server's /metrics: under `--app-name basic-auth` MLflow 3.17 answers
/metrics to an admin only (no credential: 401; any other user: 403, its fail-closed default for a route without a
permission validator). The last test (slow tier) shows that on a real `mlflow server` started from this virtualenv
through docker/mlflow-entrypoint.sh, with the sidecar beside it (no container engine needed)."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from deploy import dev_tls
from tests import deploy_checks as dc
from tests import deploy_render as dr
from tests.sweep_helpers import free_port

REPO = dr.REPO_ROOT
LOCK = REPO / "docker" / "locks" / "mlflow-image.txt"
PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
METRICS_PORT = 9464


def _by(resources: list[dict], kind: str, name: str) -> dict:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


@pytest.fixture(scope="module")
def production() -> list[dict]:
    return dr.render(dr.DEPLOY / "overlays" / "gpu-cluster")


@pytest.fixture(scope="module")
def dev() -> list[dict]:
    return dr.render(dr.DEPLOY / "overlays" / "dev")


# ---------------------------------------------------------------------------------------------- the image


def test_the_image_locks_the_exporter_by_hash_and_ships_the_sidecar():
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    for name, version in (("prometheus-flask-exporter", "0.23.2"), ("prometheus-client", "0.26.0")):
        line = next((ln for ln in text.splitlines() if ln.startswith(f"{name}==")), None)
        assert line is not None, f"{name} is not in {LOCK.name}"
        assert line.startswith(f"{name}=={version} ") and re.search(r"--hash=sha256:[0-9a-f]{64}", line), line
    wanted = [ln.strip() for ln in (LOCK.parent / "mlflow-image.in").read_text().splitlines()]
    assert "prometheus-flask-exporter" in wanted
    dockerfile = (REPO / "docker" / "mlflow.Dockerfile").read_text()
    # the build imports what `--expose-prometheus` imports, and installs the sidecar's script
    assert "prometheus_flask_exporter.multiprocess" in dockerfile
    assert "COPY --chmod=0755 docker/mlflow-metrics /usr/local/bin/mlflow-metrics" in dockerfile
    assert "!docker/mlflow-metrics" in (REPO / ".dockerignore").read_text().splitlines()


# ---------------------------------------------------------------------------------------------- the pod


def _containers(resources: list[dict]) -> dict[str, dict]:
    pod = _by(resources, "Deployment", "mlflow")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


@pytest.mark.parametrize("overlay", ["gpu-cluster", "dev"])
def test_the_metrics_container_serves_the_servers_directory_and_sees_nothing_else(overlay):
    resources = dr.render(dr.DEPLOY / "overlays" / overlay)
    containers = _containers(resources)
    assert list(containers) == ["mlflow", "metrics"]
    server, sidecar = containers["mlflow"], containers["metrics"]
    assert sidecar["image"] == server["image"]
    directory = next(e["value"] for e in server["env"] if e["name"] == "PROMETHEUS_MULTIPROC_DIR")
    args = sidecar["command"]
    assert args[0] == "mlflow-metrics"
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    assert opts["--dir"] == directory and opts["--port"] == str(METRICS_PORT)
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    server_mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    # the same volume, written by the server, read-only here
    assert mounts[directory]["name"] == server_mounts[directory]["name"] and mounts[directory].get("readOnly") is True
    assert not server_mounts[directory].get("readOnly")
    # HTTPS with the server's certificate; nothing else mounted (not /tmp, where basic_auth.ini and its DSN live),
    # no Secret in the environment
    tls = server_mounts["/etc/mlflow/tls"]["name"]
    assert set(mounts) == {directory, "/etc/mlflow/tls", "/tmp"} and mounts["/etc/mlflow/tls"]["name"] == tls
    assert mounts["/tmp"]["name"] != server_mounts["/tmp"]["name"]
    assert opts["--certfile"].startswith("/etc/mlflow/tls/") and opts["--keyfile"].startswith("/etc/mlflow/tls/")
    # mutual TLS: a client's certificate must be signed by the CA of the server's own Secret
    assert opts["--client-cafile"] == "/etc/mlflow/tls/ca.crt"
    # and every file it is given is in the Secret volume's items (a missing ca.crt crashed it in the container tier)
    tls_volume = next(
        v for v in _by(resources, "Deployment", "mlflow")["spec"]["template"]["spec"]["volumes"] if v["name"] == tls
    )
    items = {i["path"]: i["key"] for i in tls_volume["secret"]["items"]}
    for flag in ("--certfile", "--keyfile", "--client-cafile"):
        name = opts[flag].removeprefix("/etc/mlflow/tls/")
        assert items.get(name) == name and name in dev_tls.issue("ns")["mlflow-tls"], (flag, items)
    assert not sidecar.get("envFrom") and not any("valueFrom" in e for e in sidecar.get("env", []))
    assert not any(e["name"].startswith(("MLFLOW_AUTH", "MLFLOW_BACKEND", "AWS_")) for e in sidecar.get("env", []))
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"metrics": METRICS_PORT}
    # the pod's readiness (the Service's endpoints for 5000) stays MLflow's: no readiness probe here
    assert "readinessProbe" not in sidecar and sidecar["livenessProbe"]["tcpSocket"]["port"] == "metrics"
    volume = next(
        v
        for v in _by(resources, "Deployment", "mlflow")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mounts[directory]["name"]
    )
    assert "emptyDir" in volume and volume["emptyDir"].get("sizeLimit")
    # the pod hardening every container has (non-root, read-only root, no escalation, requests and limits, ...)
    assert dc.run_checks(resources) == {}


# ---------------------------------------------------------------------------------------------- the scrape


def test_the_production_overlay_scrapes_mlflow_on_its_metrics_port_over_verified_https(production):
    monitor = _by(production, "ServiceMonitor", "mlflow")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    services = [r for r in production if r["kind"] == "Service"]
    chosen = [
        s["metadata"]["name"] for s in services if dc.selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert chosen == ["mlflow"]
    service = _by(production, "Service", "mlflow")
    (endpoint,) = monitor["spec"]["endpoints"]
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert port["port"] == METRICS_PORT and port["targetPort"] == "metrics"
    # the Service's targetPort is the sidecar's named port, on the pods the Service selects
    deployment = _by(production, "Deployment", "mlflow")
    assert dc.selects(
        {"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"]
    )
    assert _containers(production)["metrics"]["ports"][0]["name"] == port["targetPort"]
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert tls["ca"] == {"secret": {"name": "mlflow-tls", "key": "ca.crt"}}
    assert not tls.get("insecureSkipVerify")
    # the name it verifies is on every certificate the overlays use: dev_tls's and cert-manager's
    ns = dr.namespace_of(production)
    cert = next(yaml.safe_load_all((dr.DEPLOY / "components" / "cert-manager" / "certificate.yaml").read_text()))
    assert tls["serverName"] in dev_tls.dns_names("mlflow", ns) and tls["serverName"] in cert["spec"]["dnsNames"]
    # mutual TLS: Prometheus shows the client certificate that dev_tls and cert-manager issue from MLflow's CA
    client = dev_tls.METRICS_CLIENT_TLS
    assert tls["cert"] == {"secret": {"name": client, "key": "tls.crt"}}
    assert tls["keySecret"] == {"name": client, "key": "tls.key"}
    certs = {c["metadata"]["name"]: c for c in yaml.safe_load_all(
        (dr.DEPLOY / "components" / "cert-manager" / "certificate.yaml").read_text()
    )}  # fmt: skip
    issued = [c for c in certs.values() if c["spec"]["secretName"] == client]
    assert len(issued) == 1 and issued[0]["spec"]["usages"] == ["client auth"]
    assert issued[0]["spec"]["issuerRef"] == certs["mlflow"]["spec"]["issuerRef"]
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    secrets = dev_tls.issue(ns)
    ours = x509.load_pem_x509_certificate(secrets[client]["tls.crt"])
    ca = x509.load_pem_x509_certificate(secrets["mlflow-tls"]["ca.crt"])
    ours.verify_directly_issued_by(ca)
    usage = ours.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # no password: the port serves the metrics and nothing else (the server's own /metrics would need the admin's)
    assert "basicAuth" not in endpoint and "authorization" not in endpoint and "bearerTokenSecret" not in endpoint
    assert endpoint["interval"] and endpoint["scrapeTimeout"]


def test_prometheus_alone_reaches_the_metrics_port(production, dev):
    policies = [r for r in production if r["kind"] == "NetworkPolicy"]
    ns = dr.namespace_of(production)
    mlflow = _by(production, "Deployment", "mlflow")["spec"]["template"]["metadata"]["labels"]
    assert dc.policy_allows(policies, ns, PROMETHEUS, mlflow, METRICS_PORT)
    assert not dc.policy_allows(policies, ns, PROMETHEUS, mlflow, 5000)  # not the server itself
    assert not dc.policy_allows(
        policies, ns, ("monitoring", {"app.kubernetes.io/name": "grafana"}), mlflow, METRICS_PORT
    )
    assert not dc.policy_allows(policies, ns, ("other", PROMETHEUS[1]), mlflow, METRICS_PORT)
    # MLflow's clients (the Ray pods) keep 5000 and nothing more
    client = (ns, {"calib-sweeps/mlflow-client": "true", "calib-sweeps/ray-node": "true"})
    assert dc.policy_allows(policies, ns, client, mlflow, 5000)
    assert not dc.policy_allows(policies, ns, client, mlflow, METRICS_PORT)
    # dev has no monitoring component: no ServiceMonitor, and nothing reaches the port
    assert not [r for r in dev if r["kind"] == "ServiceMonitor" and r["metadata"]["name"] == "mlflow"]
    dev_policies = [r for r in dev if r["kind"] == "NetworkPolicy"]
    assert not dc.policy_allows(dev_policies, dr.namespace_of(dev), PROMETHEUS, mlflow, METRICS_PORT)


# ---------------------------------------------------------------------------------------------- a real server


def _client_context(ca: bytes, secret: dict[str, bytes] | None, tmp_path: Path) -> ssl.SSLContext:
    """A context that verifies the server against `ca` and shows the certificate of `secret`, if any."""
    context = ssl.create_default_context(cadata=ca.decode())
    if secret is not None:
        folder = tmp_path / f"client-{os.urandom(4).hex()}"
        folder.mkdir()
        (folder / "tls.crt").write_bytes(secret["tls.crt"])
        (folder / "tls.key").write_bytes(secret["tls.key"])
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    return context


def _get(url: str, context: ssl.SSLContext, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _wait(url: str, context: ssl.SSLContext, procs: list[subprocess.Popen], log: Path, timeout: float = 150) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            if _get(url, context)[0] == 200:
                return
        except OSError:
            pass
        if any(p.poll() is not None for p in procs) or time.time() > deadline:
            raise AssertionError(f"{url} never answered; {log}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _samples(text: str, name: str) -> dict[str, float]:
    """{status: value} of a counter labelled by method and status (summed over methods)."""
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{name}{{[^}}]*status="(\d+)"[^}}]*}} (\S+)$', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _server_env(tmp_path: Path, metrics_dir: Path, admin: tuple[str, str]) -> dict[str, str]:
    """The Deployment's environment for a basic-auth server with a SQLite auth store under `tmp_path`."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth" / "basic_auth.ini"),
        "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path}/auth.db",
        "MLFLOW_AUTH_ADMIN_USERNAME": admin[0],
        "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex(),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }


def _create_user(url: str, context: ssl.SSLContext, admin: tuple[str, str], name: str) -> tuple[str, str]:
    """A new user (not an admin), created by the admin through MLflow's REST API; its (name, password)."""
    password = "Pr0metheus-" + os.urandom(8).hex()
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/users/create",
        data=json.dumps({"username": name, "password": password}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(":".join(admin).encode()).decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        assert json.loads(r.read())["user"]["is_admin"] is False
    return name, password


@pytest.mark.slow  # about 50 s here (three MLflow processes start); `make test-slow`
def test_a_real_server_answers_metrics_to_the_admin_alone_and_the_sidecar_to_its_client_certificate_alone(tmp_path):
    # the test extra installs both (pyproject.toml); without them this fails here, it does not skip
    import flask_wtf  # noqa: F401  (mlflow[auth])
    import prometheus_flask_exporter  # noqa: F401

    issued = dev_tls.issue("calib-sweeps")
    tls = issued["mlflow-tls"]
    for name, data in tls.items():
        (tmp_path / name).write_bytes(data)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_4242.db").write_bytes(b"stale")  # a previous start's: the entrypoint removes it
    admin = ("admin", "Adm1n-" + os.urandom(8).hex())
    port, metrics_port = free_port(), free_port()
    env = _server_env(tmp_path, metrics_dir, admin)
    # the Deployment's arguments, on loopback with a SQLite store
    server_args = ["--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--app-name", "basic-auth"]
    server_args += ["--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    server_args += ["--uvicorn-opts", f"--ssl-certfile={tmp_path}/tls.crt --ssl-keyfile={tmp_path}/tls.key"]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            ["sh", str(REPO / "docker" / "mlflow-entrypoint.sh"), *server_args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sidecar = subprocess.Popen(
            [sys.executable, str(REPO / "docker" / "mlflow-metrics"), "--dir", str(metrics_dir)]
            + ["--address", "127.0.0.1", "--port", str(metrics_port)]
            + ["--certfile", str(tmp_path / "tls.crt"), "--keyfile", str(tmp_path / "tls.key")]
            + ["--client-cafile", str(tmp_path / "ca.crt")],
            env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # clients verify the certificate against the CA (the name `localhost` is on dev_tls's certificate)
        context = ssl.create_default_context(cadata=tls["ca.crt"].decode())
        url = f"https://localhost:{port}"
        try:
            _wait(f"{url}/health", context, [server, sidecar], log)
            assert not (metrics_dir / "counter_4242.db").exists()
            # MLflow's own /metrics: no credential 401, a user without admin 403 (fail-closed), the admin 200
            unauthenticated = [_get(f"{url}/metrics", context)[0] for _ in range(3)]
            assert unauthenticated == [401] * 3
            user = _create_user(url, context, admin, "prometheus")
            assert [_get(f"{url}/metrics", context, user)[0] for _ in range(2)] == [403, 403]
            status, own = _get(f"{url}/metrics", context, admin)
            assert status == 200 and "mlflow_http_request_total" in own
            # the sidecar: no password, HTTPS verified against the same CA both ways (Prometheus's client
            # certificate), and the sum over both workers (each request went to either; both wrote their files)
            pids = {m.group(1) for p in metrics_dir.iterdir() if (m := re.search(r"_(\d+)\.db$", p.name))}
            assert len(pids) >= 2, sorted(p.name for p in metrics_dir.iterdir())
            sidecar_url = f"https://localhost:{metrics_port}/metrics"
            prometheus = _client_context(tls["ca.crt"], issued[dev_tls.METRICS_CLIENT_TLS], tmp_path)
            status, served = _get(sidecar_url, prometheus)
            assert status == 200, served
            counts = _samples(served, "mlflow_http_request_total")
            assert counts.get("401") == 3 and counts.get("403") == 2, counts
            assert 'mlflow_http_request_duration_seconds_count{method="GET",mlflow_version="' in served
            # refused: plain HTTP; no client certificate; one of another CA; the server's own (server auth only)
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            stranger = dev_tls.issue("calib-sweeps")[dev_tls.METRICS_CLIENT_TLS]
            for secret in (None, stranger, tls):
                with pytest.raises(OSError):
                    _get(sidecar_url, _client_context(tls["ca.crt"], secret, tmp_path))
            assert _get(sidecar_url, prometheus)[0] == 200  # and it still answers Prometheus
        finally:
            for proc in (sidecar, server):
                os.killpg(proc.pid, signal.SIGTERM)
            for proc in (sidecar, server):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    assert sidecar.returncode == 0, log.read_text()[-2000:]

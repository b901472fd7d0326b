"""Shared pytest fixtures of the container tests (tests/containers/test_containers_*.py, marker `container`)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from filelock import FileLock

from tests import deploy_render as dr
from tests.containers import images
from tests.containers.harness import WORKER, Cluster, find_template, leftover_networks

# the container tier runs its files on pytest-xdist workers (make test-containers): each worker's session has its own
# CA, stack and logs, so each writes under its own folder (a shared tls/ca.crt would be the other worker's CA)
ARTIFACTS_ROOT = dr.REPO_ROOT / "test-artifacts" / "containers"
ARTIFACTS = ARTIFACTS_ROOT / WORKER if WORKER else ARTIFACTS_ROOT
# pytest keeps one instance of a session fixture per place it is found, and the test modules import
# these fixtures (tests/conftest.py does not): each module would build and start its own. The first
# instance keeps what it made here and tears it down at the end of the session; the others reuse it.
_SESSION: dict[str, object] = {}


def _podman_usable() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (tests/containers/setup_podman.sh installs it)"
    proc = subprocess.run(["podman", "info"], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"podman does not work here: {proc.stderr[-300:]}"


@pytest.fixture(scope="session")
def built_images() -> dict:
    """Base, stand-ins and the project's images, built once per session (layer cache reused)."""
    why = _podman_usable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    if "built_images" in _SESSION:
        return _SESSION["built_images"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # one build at a time across workers (podman's set-up installs packages; the same tags are built): the second
    # finds every layer cached
    with FileLock(str(ARTIFACTS_ROOT / "build.lock")), open(ARTIFACTS / "build.log", "w") as log:
        info = images.build_all(log)
    (ARTIFACTS / "images.json").write_text(json.dumps(info, indent=2) + "\n")
    _SESSION["built_images"] = info
    return info


def _deploy_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, dr.DEPLOY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESTORE_DB = "postgres-restore"


def dev_tls() -> dict[str, dict[str, str]]:
    """The TLS Secrets of deploy/dev_tls.py (mlflow-tls, postgres-tls), issued once per session by one CA."""
    if "tls" not in _SESSION:
        # the restore tests' fresh servers answer as RESTORE_DB (a name of their own, not the Service)
        issued = _deploy_script("dev_tls").issue("calib-sweeps", days=2, extra_names={"postgres": [RESTORE_DB]})
        _SESSION["tls"] = {name: {k: v.decode() for k, v in files.items()} for name, files in issued.items()}
    return _SESSION["tls"]


def trusted_ca() -> Path:
    """The dev CA's certificate as a file: what a client outside the cluster is given to trust MLflow."""
    path = ARTIFACTS / "tls" / "ca.crt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dev_tls()["mlflow-tls"]["ca.crt"])
    return path


def metrics_client_cert() -> tuple[str, str]:
    """Prometheus's client certificate and key for MLflow's metrics port (deploy/dev_tls.py), as files."""
    folder = ARTIFACTS / "tls"
    folder.mkdir(parents=True, exist_ok=True)
    secret = dev_tls()["mlflow-metrics-client-tls"]
    (folder / "client.crt").write_text(secret["tls.crt"])
    (folder / "client.key").write_text(secret["tls.key"])
    return str(folder / "client.crt"), str(folder / "client.key")


def dev_secrets() -> dict[str, dict[str, str]]:
    """The dev overlay's Secrets, filled by deploy/render_secrets.py (random values), and its TLS Secrets."""
    text = _deploy_script("render_secrets").fill(
        (dr.DEPLOY / "overlays" / "dev" / "secrets.example.yaml").read_text(), {}
    )
    docs = {
        d["metadata"]["name"]: {k: str(v) for k, v in d["stringData"].items()} for d in yaml.safe_load_all(text) if d
    }
    return {**docs, **dev_tls()}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def artifacts_dir(name: str) -> Path:
    path = ARTIFACTS / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def http(url: str, auth: tuple[str, str] | None = None, cert: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body); status 0 while nothing answers yet (or a TLS handshake is refused). HTTPS trusts the dev CA
    only (trusted_ca); `cert` (certificate, key) is shown to a server that asks for a client certificate."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    context = ssl.create_default_context(cafile=str(trusted_ca())) if url.startswith("https:") else None
    if context is not None and cert is not None:
        context.load_cert_chain(*cert)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):  # TLS 1.3: a refusal comes on read
        return 0, b""


def start_mlflow(
    cluster: Cluster,
    resources,
    pod: str,
    port: int,
    with_init: bool = True,
    service: bool = True,
    metrics_port: int | None = None,
):
    """The MLflow Deployment's pod; `service=False` keeps it out of the `mlflow` Service's DNS name
    (a second server on the same network would otherwise take the name over, and stopping it
    removes the name for the first one too). The server container alone unless `metrics_port` is given: then the
    pod's `metrics` container too (docker/mlflow-metrics), published there. It reads the server's metrics folder
    (the emptyDir mlflow-metrics, one host folder for both here) but has an address of its own (the harness does
    not share a pod's network) and no Service name (nothing in the stack reaches it; Prometheus is outside)."""
    dep = find_template(resources, "Deployment", "mlflow")
    if not with_init:
        dep["spec"].pop("initContainers")
    if not service:
        dep.setdefault("metadata", {})["labels"] = {}
    names = cluster.run_pod(pod, dep, containers=["mlflow"], publish=[f"127.0.0.1:{port}:5000"])
    if metrics_port is not None:
        sidecar = next(c for c in dep["spec"]["containers"] if c["name"] == "metrics")
        cluster.run_container(
            pod, dep["spec"], sidecar, labels={}, detach=True, publish=[f"127.0.0.1:{metrics_port}:9464"]
        )
    return names["mlflow"], dep["spec"]["containers"][0]


def run_job(cluster: Cluster, resources, job_name: str, pod: str, extra_env: list[dict] = ()):
    """The rendered Job's pod to completion (its first container); the finished podman process."""
    job = find_template(resources, "Job", job_name)
    return cluster.run_container(
        pod,
        job["spec"],
        job["spec"]["containers"][0],
        labels=job["metadata"]["labels"],
        detach=False,
        timeout=300,
        extra_env=extra_env,
    )


@pytest.fixture(scope="session")
def stack(built_images, tmp_path_factory):
    """The dev overlay's MLflow stack (PostgreSQL, MinIO, bucket and Optuna-database Jobs, MLflow),
    started once per session on one podman network standing in for the namespace; the MLflow and
    Ray container tests share it."""
    if "stack" in _SESSION:
        yield _SESSION["stack"]
        return
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    secrets = dev_secrets()
    cluster = Cluster(resources, secrets, tmp_path_factory.mktemp("mlflow-stack"))
    # MLflow speaks TLS: this process and the sweeps it starts trust the dev CA, as `kubectl port-forward` users
    # would be told to (MLflow's client reads MLFLOW_TRACKING_SERVER_CERT_PATH; requests, REQUESTS_CA_BUNDLE)
    ca = trusted_ca()
    trust = {"MLFLOW_TRACKING_SERVER_CERT_PATH": str(ca), "REQUESTS_CA_BUNDLE": str(ca)}
    saved_env = {k: os.environ.get(k) for k in trust}
    os.environ.update(trust)
    logs = artifacts_dir("mlflow-stack")
    t0 = time.monotonic()
    try:
        pg_port = free_port()  # published as `kubectl port-forward pod/postgres-0` would
        for sts, publish in (("postgres", [f"127.0.0.1:{pg_port}:5432"]), ("minio", [])):
            tpl = find_template(resources, "StatefulSet", sts)
            name = cluster.run_pod(f"{sts}-0", tpl, publish=publish)[tpl["spec"]["containers"][0]["name"]]
            cluster.wait_ready(name, tpl["spec"]["containers"][0], timeout=180)
        job_logs = {}
        # The Optuna database Job runs twice: re-applying the overlay must be harmless.
        for job_name, runs in (("minio-buckets", 1), ("optuna-db", 2)):
            for i in range(runs):
                proc = run_job(cluster, resources, job_name, f"{job_name}-{i}")
                job_logs[f"{job_name}-{i}"] = proc.stdout + proc.stderr
                assert proc.returncode == 0, proc.stdout + proc.stderr
        port, metrics_port = free_port(), free_port()
        name, container = start_mlflow(cluster, resources, "mlflow-0", port, metrics_port=metrics_port)
        cluster.wait_ready(name, container, timeout=300)
        # The sweep's own MLflow user (EDIT on its experiment), as `kubectl apply -k` would start it; twice, since
        # every apply runs it again. Every container test then logs in as that user, as the Ray pods do.
        for i in range(2):
            proc = run_job(cluster, resources, "mlflow-sweep-user", f"mlflow-sweep-user-{i}")
            job_logs[f"mlflow-sweep-user-{i}"] = proc.stdout + proc.stderr
            assert proc.returncode == 0, proc.stdout + proc.stderr
        tracking = secrets["mlflow-tracking"]
        # The driver's CALIB_OPTUNA_STORAGE (Secret optuna-storage), pointed at the published port as through
        # `kubectl port-forward` (the certificate carries 127.0.0.1), verifying the server against the dev CA.
        optuna_url = secrets["optuna-storage"]["url"].replace("@postgres:5432/", f"@127.0.0.1:{pg_port}/")
        optuna_url += f"&sslrootcert={ca}"
        _SESSION["stack"] = SimpleNamespace(
            cluster=cluster,
            resources=resources,
            secrets=secrets,
            port=port,
            mlflow=name,
            url=f"https://127.0.0.1:{port}",
            # the pod's `metrics` container (MLflow's Prometheus metrics), published as a port-forward would
            metrics_url=f"https://127.0.0.1:{metrics_port}/metrics",
            ca=ca,
            auth=(tracking["username"], tracking["password"]),
            startup_s=round(time.monotonic() - t0, 1),
            logs=logs,
            job_logs=job_logs,
            optuna_url=optuna_url,
        )
        yield _SESSION["stack"]
    finally:
        _SESSION.pop("stack", None)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for n in list(cluster.containers):
            (logs / f"{n.rsplit('-', 1)[0]}.log").write_text(cluster.logs(n))
        (logs / "init-containers.json").write_text(json.dumps(cluster.init_logs, indent=1))
        cluster.close()
        # every test's Cluster is closed by now: no podman network may be left behind (issue #25 item 8)
        left = leftover_networks()
        assert not left, f"podman networks left behind: {left}"

"""The MLflow stack of the rendered dev overlay in containers (`make test-containers`): the
PostgreSQL and S3 stand-ins, the bucket Job, and the MLflow Deployment's pod with its init
containers (DB wait, `mlflow db upgrade`), the Job creating the Optuna database (twice), each run
from its pod template by tests/containers/harness.py. Checked: basic auth (401 without
credentials), a sweep from outside (this virtualenv, through published ports as `kubectl
port-forward` would) logging with the tracking credentials to a registered champion, its Optuna
study in the stack's PostgreSQL, its artifacts in the S3 bucket, and a database created by an older MLflow
release brought up to date by the migration init container (and refused without it)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from types import SimpleNamespace

import pytest

from tests import deploy_render as dr
from tests.containers import images
from tests.containers.fixtures import artifacts_dir, built_images, dev_secrets, free_port  # noqa: F401
from tests.containers.harness import Cluster, find_template, podman

pytestmark = pytest.mark.container
PREVIOUS_MLFLOW = "3.1.0"


def _http(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body); status 0 while nothing answers yet."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def start_mlflow(cluster: Cluster, resources, pod: str, port: int, with_init: bool = True):
    dep = find_template(resources, "Deployment", "mlflow")
    if not with_init:
        dep["spec"].pop("initContainers")
    names = cluster.run_pod(pod, dep, publish=[f"127.0.0.1:{port}:5000"])
    return names["mlflow"], dep["spec"]["containers"][0]


@pytest.fixture(scope="module")
def stack(built_images, tmp_path_factory):
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    secrets = dev_secrets()
    cluster = Cluster(resources, secrets, tmp_path_factory.mktemp("mlflow-stack"))
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
            job = find_template(resources, "Job", job_name)
            for i in range(runs):
                proc = cluster.run_container(f"{job_name}-{i}", job["spec"], job["spec"]["containers"][0],
                                             labels=job["metadata"]["labels"], detach=False, timeout=300)
                job_logs[f"{job_name}-{i}"] = proc.stdout + proc.stderr
                assert proc.returncode == 0, proc.stdout + proc.stderr
        port = free_port()
        name, container = start_mlflow(cluster, resources, "mlflow-0", port)
        cluster.wait_ready(name, container, timeout=300)
        tracking = secrets["mlflow-tracking"]
        # The driver's CALIB_OPTUNA_STORAGE (Secret optuna-storage), pointed at the published port.
        optuna_url = secrets["optuna-storage"]["url"].replace("@postgres:5432/", f"@127.0.0.1:{pg_port}/")
        yield SimpleNamespace(cluster=cluster, resources=resources, secrets=secrets, port=port, mlflow=name,
                              url=f"http://127.0.0.1:{port}", auth=(tracking["username"], tracking["password"]),
                              startup_s=round(time.monotonic() - t0, 1), logs=logs, job_logs=job_logs,
                              optuna_url=optuna_url)
    finally:
        for n in list(cluster.containers):
            (logs / f"{n.rsplit('-', 1)[0]}.log").write_text(cluster.logs(n))
        (logs / "init-containers.json").write_text(json.dumps(cluster.init_logs, indent=1))
        cluster.close()


def test_migration_and_db_check_ran_before_the_server(stack):
    assert "database is ready" in stack.cluster.init_logs["mlflow-0/wait-for-db"]
    assert "schemas are current" in stack.cluster.init_logs["mlflow-0/db-upgrade"]
    status, _ = _http(f"{stack.url}/health")
    assert status == 200


def test_basic_auth_refuses_requests_without_credentials(stack):
    api = f"{stack.url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _http(api)[0] == 401
    assert _http(api, (stack.auth[0], "wrong-password"))[0] == 401
    assert _http(api, stack.auth)[0] == 200


def test_optuna_db_job_creates_the_study_database_idempotently(stack):
    assert "optuna database ready" in stack.job_logs["optuna-db-0"]
    assert "optuna database ready" in stack.job_logs["optuna-db-1"]
    pg = next(n for n in stack.cluster.containers if n.startswith("postgres-0"))
    owner = podman("exec", pg, "psql", "-U", "mlflow", "-d", "mlflow", "-tAc",
                   "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'optuna'")
    assert owner.stdout.strip() == "optuna"


def test_sweep_from_outside_logs_to_the_stack_and_artifacts_land_in_s3(stack, tmp_path):
    """The sweep as the head's driver runs it: MLflow with the tracking credentials, the Optuna
    study in the stack's PostgreSQL through CALIB_OPTUNA_STORAGE (the DSN of the Secret)."""
    import optuna

    name = f"outside-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, MLFLOW_TRACKING_USERNAME=stack.auth[0], MLFLOW_TRACKING_PASSWORD=stack.auth[1],
               MLFLOW_DISABLE_TELEMETRY="true", RAY_USAGE_STATS_ENABLED="0", CALIB_OPTUNA_STORAGE=stack.optuna_url)
    cmd = [sys.executable, str(dr.REPO_ROOT / "sweeps" / "launch.py"), "--config",
           str(dr.REPO_ROOT / "sweeps" / "configs" / "mnist1d_demo.yaml"), "--num-samples", "2",
           "--max-concurrent", "2", "--set", "run.train.epochs=2", "--tracking-uri", stack.url,
           "--storage-path", str(tmp_path / "ray_results"), "--name", name]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    (stack.logs / "sweep-from-outside.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    alias = "registered-models/alias?name=calibrated-classifier&alias=champion"
    status, body = _http(f"{stack.url}/api/2.0/mlflow/{alias}", stack.auth)
    assert status == 200, body
    version = json.loads(body)["model_version"]
    assert version["source"].startswith(("models:/", "mlflow-artifacts:/")), version["source"]
    listing = stack.cluster.exec(stack.mlflow, "python", "-c", (
        "import boto3, os; s3 = boto3.client('s3', endpoint_url=os.environ['MLFLOW_S3_ENDPOINT_URL']); "
        "keys = [o['Key'] for p in s3.get_paginator('list_objects_v2').paginate(Bucket='mlflow-artifacts') "
        "for o in p.get('Contents', [])]; print('\\n'.join(keys))"))
    keys = listing.stdout.split()
    assert listing.returncode == 0, listing.stderr
    assert any(k.endswith("MLmodel") for k in keys), keys[:20]
    assert any(k.endswith(".png") for k in keys), "reliability diagrams missing from the bucket"
    (stack.logs / "s3-keys.txt").write_text("\n".join(keys))
    study = optuna.load_study(study_name=name, storage=stack.optuna_url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"], study.trials


def test_an_older_mlflow_database_is_migrated_by_the_init_container(stack):
    """A database created by MLflow 3.1.0 (with SQLAlchemy 2.0 and psycopg2, what it ran with; an
    experiment in it) is migrated by the db-upgrade init container, and the server comes up with
    the data. (Without the init container MLflow 3.17's server migrates such a database itself at
    the first request, from each of its --workers processes at once: the init container makes it
    one migration, before any server process.)"""
    pg = next(n for n in stack.cluster.containers if n.startswith("postgres-0"))
    podman("exec", pg, "psql", "-U", "mlflow", "-d", "mlflow", "-c", "CREATE DATABASE mlflow_old")
    password = stack.secrets["postgres-credentials"]["password"]
    old_dsn = f"postgresql://mlflow:{password}@postgres:5432/mlflow_old"
    script = (f"pip install -q 'mlflow=={PREVIOUS_MLFLOW}' 'sqlalchemy<2.1' psycopg2-binary && "
              "python -c \"import os, mlflow; "
              "mlflow.MlflowClient(os.environ['DSN']).create_experiment('made-by-previous-mlflow'); "
              "print('previous', mlflow.__version__)\"")
    proc = images.run_in_network(stack.cluster.network, images.qualify("python:3.11.13-slim-bookworm"),
                                 script, env={"DSN": old_dsn})
    assert "previous " + PREVIOUS_MLFLOW in proc.stdout, proc.stdout[-4000:]
    secrets = json.loads(json.dumps(stack.secrets))
    secrets["mlflow-db"]["backend-store-uri"] = old_dsn
    secrets["mlflow-db"]["auth-database-uri"] = old_dsn
    cluster = Cluster(stack.resources, secrets, stack.cluster.workdir / "old")
    cluster.network = stack.cluster.network  # same namespace: reach postgres and minio
    try:
        port = free_port()
        name, container = start_mlflow(cluster, stack.resources, "mlflow-old", port)
        cluster.wait_ready(name, container, timeout=300)
        upgrade_log = cluster.init_logs["mlflow-old/db-upgrade"]
        assert "upgrading the tracking schema" in upgrade_log, upgrade_log[-3000:]
        assert "schemas are current" in upgrade_log, upgrade_log[-3000:]
        status, body = _http(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name"
                             "?experiment_name=made-by-previous-mlflow", stack.auth)
        assert status == 200, body
    finally:
        (stack.logs / "old-db-init.json").write_text(json.dumps(cluster.init_logs, indent=1))
        for n in list(cluster.containers):
            cluster.stop(n)

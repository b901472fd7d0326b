"""The MLflow stack of the rendered dev overlay in containers (`make test-containers`): the
PostgreSQL and S3 stand-ins, the bucket Job, and the MLflow Deployment's pod with its init
containers (DB wait, `mlflow db upgrade`), the Job creating the Optuna database (twice), each run
from its pod template by tests/containers/harness.py. Checked: basic auth (401 without
credentials), a sweep from outside (this virtualenv, through published ports as `kubectl
port-forward` would) logging with the tracking credentials to a registered champion, its Optuna
study in the stack's PostgreSQL, its artifacts in the S3 bucket, and a database created by an older MLflow
release brought up to date by the migration init container (and refused without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests import deploy_render as dr
from tests.containers import images
from tests.containers.fixtures import built_images, free_port, stack, start_mlflow  # noqa: F401
from tests.containers.fixtures import http as _http
from tests.containers.harness import Cluster, podman

pytestmark = pytest.mark.container
PREVIOUS_MLFLOW = "3.1.0"


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
    owner = podman(
        "exec",
        pg,
        "psql",
        "-U",
        "mlflow",
        "-d",
        "mlflow",
        "-tAc",
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'optuna'",
    )
    assert owner.stdout.strip() == "optuna"


def test_sweep_from_outside_logs_to_the_stack_and_artifacts_land_in_s3(stack, tmp_path):
    """The sweep as the head's driver runs it: MLflow with the tracking credentials, the Optuna
    study in the stack's PostgreSQL through CALIB_OPTUNA_STORAGE (the DSN of the Secret)."""
    import optuna

    name = f"outside-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        MLFLOW_TRACKING_USERNAME=stack.auth[0],
        MLFLOW_TRACKING_PASSWORD=stack.auth[1],
        MLFLOW_DISABLE_TELEMETRY="true",
        RAY_USAGE_STATS_ENABLED="0",
        CALIB_OPTUNA_STORAGE=stack.optuna_url,
    )
    cmd = [
        sys.executable,
        str(dr.REPO_ROOT / "sweeps" / "launch.py"),
        "--config",
        str(dr.REPO_ROOT / "sweeps" / "configs" / "mnist1d_demo.yaml"),
        "--num-samples",
        "2",
        "--max-concurrent",
        "2",
        "--set",
        "run.train.epochs=2",
        "--tracking-uri",
        stack.url,
        "--storage-path",
        str(tmp_path / "ray_results"),
        "--name",
        name,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    (stack.logs / "sweep-from-outside.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    alias = "registered-models/alias?name=calibrated-classifier&alias=champion"
    status, body = _http(f"{stack.url}/api/2.0/mlflow/{alias}", stack.auth)
    assert status == 200, body
    version = json.loads(body)["model_version"]
    assert version["source"].startswith(("models:/", "mlflow-artifacts:/")), version["source"]
    listing = stack.cluster.exec(
        stack.mlflow,
        "python",
        "-c",
        (
            "import boto3, os; s3 = boto3.client('s3', endpoint_url=os.environ['MLFLOW_S3_ENDPOINT_URL']); "
            "keys = [o['Key'] for p in s3.get_paginator('list_objects_v2').paginate(Bucket='mlflow-artifacts') "
            "for o in p.get('Contents', [])]; print('\\n'.join(keys))"
        ),
    )
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
    script = (
        f"pip install -q 'mlflow=={PREVIOUS_MLFLOW}' 'sqlalchemy<2.1' psycopg2-binary && "
        'python -c "import os, mlflow; '
        "mlflow.MlflowClient(os.environ['DSN']).create_experiment('made-by-previous-mlflow'); "
        "print('previous', mlflow.__version__)\""
    )
    proc = images.run_in_network(
        stack.cluster.network, images.qualify("python:3.11.13-slim-bookworm"), script, env={"DSN": old_dsn}
    )
    assert "previous " + PREVIOUS_MLFLOW in proc.stdout, proc.stdout[-4000:]
    secrets = json.loads(json.dumps(stack.secrets))
    secrets["mlflow-db"]["backend-store-uri"] = old_dsn
    secrets["mlflow-db"]["auth-database-uri"] = old_dsn
    # same namespace: the stack's network (postgres and minio), not one of its own
    cluster = Cluster(stack.resources, secrets, stack.cluster.workdir / "old", network=stack.cluster.network)
    try:
        port = free_port()
        name, container = start_mlflow(cluster, stack.resources, "mlflow-old", port, service=False)
        cluster.wait_ready(name, container, timeout=300)
        upgrade_log = cluster.init_logs["mlflow-old/db-upgrade"]
        assert "upgrading the tracking schema" in upgrade_log, upgrade_log[-3000:]
        assert "schemas are current" in upgrade_log, upgrade_log[-3000:]
        status, body = _http(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=made-by-previous-mlflow",
            stack.auth,
        )
        assert status == 200, body
    finally:
        (stack.logs / "old-db-init.json").write_text(json.dumps(cluster.init_logs, indent=1))
        for n in list(cluster.containers):
            cluster.stop(n)

"""The MLflow stack of the rendered dev overlay in containers (`make test-containers`): the
PostgreSQL and S3 stand-ins, the bucket Job, and the MLflow Deployment's pod with its init
containers (DB wait, `mlflow db upgrade`), the Job creating the Optuna database (twice), each run
from its pod template by tests/containers/harness.py. Checked: basic auth (401 without
credentials), a sweep from outside (this virtualenv, through published ports as `kubectl
port-forward` would) logging with the tracking credentials to a registered champion, its Optuna
study in the stack's PostgreSQL, its artifacts in the S3 bucket, and a database created by an older MLflow
release backed up, migrated by the init containers before any server starts (a control without the
migration step stays at the old revision), restored from its backup into a fresh PostgreSQL and served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests import deploy_render as dr
from tests.containers import images
from tests.containers.fixtures import RESTORE_DB, _deploy_script, built_images, dev_tls, free_port, stack, start_mlflow  # noqa: F401
from tests.containers.fixtures import http as _http
from tests.containers.fixtures import metrics_client_cert as _metrics_client_cert
from tests.containers.harness import Cluster, find_template, local_image, podman

pytestmark = pytest.mark.container
PREVIOUS_MLFLOW = "3.1.0"


def test_migration_and_db_check_ran_before_the_server(stack):
    assert "database is ready" in stack.cluster.init_logs["mlflow-0/wait-for-db"]
    # a new database: nothing to back up
    assert "no migration, no backup needed" in stack.cluster.init_logs["mlflow-0/db-plan"]
    assert "no schema change pending: no backup" in stack.cluster.init_logs["mlflow-0/db-backup"]
    assert "schemas are current" in stack.cluster.init_logs["mlflow-0/db-upgrade"]
    status, _ = _http(f"{stack.url}/health")
    assert status == 200


def test_basic_auth_refuses_requests_without_credentials(stack):
    api = f"{stack.url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _http(api)[0] == 401
    assert _http(api, (stack.auth[0], "wrong-password"))[0] == 401
    assert _http(api, stack.auth)[0] == 200


def test_mlflow_metrics_answer_the_admin_alone_and_the_metrics_container_prometheus_alone(stack):
    """MLflow's Prometheus metrics (issue #46 item 1) from the image as built and the dev pod as rendered: the
    server's own /metrics refuses a request without credentials (401) and the sweep's user (403: not an admin), and
    answers the admin; the pod's `metrics` container (docker/mlflow-metrics, the shared emptyDir read-only) serves
    the workers' sum without a password over HTTPS verified against the dev CA both ways: it refuses a client
    without a certificate and answers Prometheus's (mlflow-metrics-client-tls), the 401s above counted."""
    import re

    own = f"{stack.url}/metrics"
    admin = (stack.secrets["mlflow-auth"]["admin-username"], stack.secrets["mlflow-auth"]["admin-password"])
    assert _http(own)[0] == 401
    assert _http(own, stack.auth)[0] == 403
    status, body = _http(own, admin)
    assert status == 200 and b"mlflow_http_request_total" in body
    assert _http(stack.metrics_url)[0] == 0  # the TLS handshake refused: no client certificate
    status, body = _http(stack.metrics_url, cert=_metrics_client_cert())
    assert status == 200, body[-500:]
    text = body.decode()
    unauthorized = sum(
        float(v) for v in re.findall(r'^mlflow_http_request_total{[^}]*status="401"[^}]*} (\S+)$', text, re.M)
    )
    assert unauthorized >= 1, text[-2000:]
    assert "mlflow_http_request_duration_seconds_count" in text


def test_mlflow_speaks_tls_and_a_client_without_the_ca_is_refused(stack, tmp_path):
    """MLflow serves TLS with the certificate of Secret mlflow-tls. In the namespace, a pod given the CA (ca.crt of
    that Secret, as ray-env mounts it) reaches https://mlflow:5000 with verification; one without it is refused,
    and so is plain HTTP. Outside, the sweep's preflight refuses the server in one line naming the fix."""
    import certifi
    import requests

    net, image = stack.cluster.network, images.MLFLOW_IMAGE
    ca_dir = stack.ca.parent
    probe = "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=10); print('verified')"
    base = ["run", "--rm", "--network", net, "-v", f"{ca_dir}:/ca:ro", "--entrypoint", "python"]
    with_ca = podman(
        *base,
        "-e",
        "SSL_CERT_FILE=/ca/ca.crt",
        image,
        "-c",
        probe,
        "https://mlflow:5000/health",
        check=False,
        timeout=120,
    )
    assert with_ca.returncode == 0 and "verified" in with_ca.stdout, with_ca.stderr[-2000:]
    base.append(image)
    without = podman(*base, "-c", probe, "https://mlflow:5000/health", check=False, timeout=120)
    assert without.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in without.stderr, without.stderr[-2000:]
    plain = podman(*base, "-c", probe, "http://mlflow:5000/health", check=False, timeout=120)
    assert plain.returncode != 0, plain.stdout
    # the image's HEALTHCHECK answers for the TLS server
    health = podman("exec", stack.mlflow, "mlflow-healthcheck", check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    # from outside: the system's CAs do not vouch for the server, the dev CA does
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{stack.url}/health", verify=certifi.where(), timeout=10)
    assert requests.get(f"{stack.url}/health", verify=str(stack.ca), timeout=10).status_code == 200
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_SERVER_CERT_PATH", "REQUESTS_CA_BUNDLE")}
    env.update(MLFLOW_TRACKING_USERNAME=stack.auth[0], MLFLOW_TRACKING_PASSWORD=stack.auth[1])
    cmd = [
        sys.executable,
        str(dr.REPO_ROOT / "sweeps" / "launch.py"),
        "--tracking-uri",
        stack.url,
        "--num-samples",
        "1",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "TLS certificate is not trusted" in lines[0] and "MLFLOW_TRACKING_SERVER_CERT_PATH" in lines[0], lines
    assert stack.auth[1] not in proc.stdout + proc.stderr


def test_postgres_speaks_tls_only_and_its_clients_check_the_name(stack, tmp_path):
    """PostgreSQL serves TLS with Secret postgres-tls and admits network connections over TLS alone. A client with
    the CA of Secret postgres-ca (as every client pod mounts it) connects with verify-full; without TLS it is
    refused by the server; trusting another CA, or reaching the server by a name its certificate does not carry,
    the client refuses the server."""
    tpl = find_template(stack.resources, "StatefulSet", "postgres")
    image = local_image(tpl["spec"]["containers"][0]["image"])
    (tmp_path / "ours.crt").write_text(dev_tls()["postgres-ca"]["ca.crt"])
    another_ca = _deploy_script("dev_tls").issue("calib-sweeps", days=1)["postgres-ca"]["ca.crt"]
    (tmp_path / "other.crt").write_bytes(another_ca)
    password = stack.cluster.secrets["postgres-credentials"]["password"]

    def connect(sslmode: str, ca: str = "ours.crt", host: str = "postgres") -> subprocess.CompletedProcess:
        dsn = f"host={host} dbname=mlflow user=mlflow sslmode={sslmode} sslrootcert=/ca/{ca}"
        return podman(
            *("run", "--rm", "--network", stack.cluster.network, "-v", f"{tmp_path}:/ca:ro", "-e"),
            f"PGPASSWORD={password}",
            *("--entrypoint", "sh", image, "-c"),
            f'psql "{dsn}" -tAc "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"',
            check=False,
            timeout=120,
        )

    ok = connect("verify-full")
    assert ok.returncode == 0 and ok.stdout.strip() == "t", ok.stdout + ok.stderr
    plain = connect("disable")
    assert plain.returncode != 0 and "no encryption" in plain.stderr, plain.stdout + plain.stderr
    other = connect("verify-full", ca="other.crt")
    assert other.returncode != 0 and "certificate verify failed" in other.stderr, other.stdout + other.stderr
    by_ip = connect("verify-full", host="$(getent hosts postgres | cut -d' ' -f1)")
    assert by_ip.returncode != 0 and "does not match host name" in by_ip.stderr, by_ip.stdout + by_ip.stderr
    assert password not in ok.stdout + plain.stderr + other.stderr + by_ip.stderr


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
    alias = "registered-models/alias?name=calibrated-mnist1d&alias=champion"
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


def _sql(container: str, db: str, query: str) -> str:
    """One value from psql inside the PostgreSQL container (its local socket)."""
    return podman("exec", container, "psql", "-U", "mlflow", "-d", db, "-tAc", query).stdout.strip()


def _mlflow_pod_with(stack, db: str, root: Path) -> tuple[Cluster, dict, list[dict]]:
    """A Cluster on the stack's network whose Secret mlflow-db points at database `db`, and the MLflow pod."""
    password = stack.secrets["postgres-credentials"]["password"]
    secrets = json.loads(json.dumps(stack.secrets))
    secrets["mlflow-db"]["backend-store-uri"] = f"postgresql://mlflow:{password}@postgres:5432/{db}"
    secrets["mlflow-db"]["auth-database-uri"] = secrets["mlflow-db"]["backend-store-uri"]
    # same namespace: the stack's network (postgres and minio), not one of its own
    cluster = Cluster(stack.resources, secrets, root, network=stack.cluster.network)
    dep = find_template(stack.resources, "Deployment", "mlflow")
    return cluster, dep, dep["spec"]["initContainers"]


def _seed_older_database(stack, pg: str, head: str) -> str:
    """Database mlflow_old as MLflow PREVIOUS_MLFLOW made it (an experiment, a run with a metric), and its copy
    mlflow_ctrl; their schema revision."""
    podman("exec", pg, "psql", "-U", "mlflow", "-d", "mlflow", "-c", "CREATE DATABASE mlflow_old")
    password = stack.secrets["postgres-credentials"]["password"]
    script = (
        f"pip install -q 'mlflow=={PREVIOUS_MLFLOW}' 'sqlalchemy<2.1' psycopg2-binary && "
        "python -c \"import os, mlflow; c = mlflow.MlflowClient(os.environ['DSN']); "
        "e = c.create_experiment('made-by-previous-mlflow'); r = c.create_run(e, run_name='old-run'); "
        "c.log_metric(r.info.run_id, 'val_ece', 0.125); print('previous', mlflow.__version__)\""
    )
    proc = images.run_in_network(
        stack.cluster.network,
        images.python_base(),
        script,
        env={"DSN": f"postgresql://mlflow:{password}@postgres:5432/mlflow_old"},
    )
    assert "previous " + PREVIOUS_MLFLOW in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
    before = _sql(pg, "mlflow_old", "SELECT version_num FROM alembic_version")
    assert before and before != head, (before, head)
    podman("exec", pg, "psql", "-U", "mlflow", "-d", "mlflow", "-c", "CREATE DATABASE mlflow_ctrl TEMPLATE mlflow_old")
    return before


def _check_control_stays_old(
    ctrl: Cluster, dep: dict, inits: list[dict], pg: str, before: str, logs: dict[str, str]
) -> None:
    """The same init containers without the migration step leave the control at the old revision."""
    dep["spec"]["initContainers"] = [c for c in inits if c["name"] != "db-upgrade"]
    ctrl.run_pod("mlflow-ctrl", dep, containers=[])
    logs.update(ctrl.init_logs)
    assert "migration pending" in ctrl.init_logs["mlflow-ctrl/db-plan"], ctrl.init_logs
    assert _sql(pg, "mlflow_ctrl", "SELECT version_num FROM alembic_version") == before


def _migrate_without_server(
    cluster: Cluster, dep: dict, inits: list[dict], pg: str, root: Path, before: str, head: str, logs: dict[str, str]
) -> Path:
    """The init containers as deployed, and no server: planned, backed up, migrated; the PVC's backup folder."""
    assert [c["name"] for c in inits] == ["wait-for-db", "db-plan", "db-backup", "db-upgrade"]
    cluster.run_pod("mlflow-old", dep, containers=[])
    logs.update(cluster.init_logs)
    assert f"tracking schema {before} -> {head}" in cluster.init_logs["mlflow-old/db-plan"], cluster.init_logs
    assert "backup written: /backups/tracking-" in cluster.init_logs["mlflow-old/db-backup"], cluster.init_logs
    assert "schemas are current" in cluster.init_logs["mlflow-old/db-upgrade"], cluster.init_logs
    assert _sql(pg, "mlflow_old", "SELECT version_num FROM alembic_version") == head
    backups = root / "migrated" / "pvc" / "mlflow-db-backups"
    dumps = sorted(backups.glob("tracking-*.dump"))
    assert len(dumps) == 1 and dumps[0].stat().st_size > 0, list(backups.iterdir())
    assert f"{before} -> {head}" in dumps[0].with_name(dumps[0].name + ".txt").read_text()
    assert not (root / "migrated" / "pods" / "mlflow-old" / "db-plan" / "pg_service.conf").exists()
    return backups


def _check_second_start_backs_up_nothing(cluster: Cluster, dep: dict, backups: Path) -> None:
    """A second start finds nothing to do: no new backup."""
    cluster.run_pod("mlflow-old", dep, containers=[])
    assert "no migration, no backup needed" in cluster.init_logs["mlflow-old/db-plan"]
    assert "no schema change pending" in cluster.init_logs["mlflow-old/db-backup"]
    assert len(list(backups.glob("tracking-*.dump"))) == 1


def _restore_into_fresh_postgres(stack, restore_cluster: Cluster, before: str, logs: dict[str, str]) -> None:
    """The backup restored with the restore Job into a fresh PostgreSQL (as deploy/README.md says), read back at the
    old revision with its run; a second restore is refused."""
    password = stack.secrets["postgres-credentials"]["password"]
    tpl = find_template(stack.resources, "StatefulSet", "postgres")
    tpl["metadata"] = {"labels": {}}  # not the `postgres` Service: a server of its own
    fresh = restore_cluster.run_pod("postgres-restore", tpl, aliases=[RESTORE_DB])["postgres"]
    restore_cluster.wait_ready(fresh, tpl["spec"]["containers"][0], timeout=180)
    restore_cluster.secrets["mlflow-db"]["backend-store-uri"] = (
        f"postgresql://mlflow:{password}@{RESTORE_DB}:5432/mlflow?sslmode=verify-full"
    )
    job = yaml.safe_load((images.REPO / "deploy" / "restore" / "mlflow-db-restore-job.yaml").read_text())
    spec = job["spec"]["template"]["spec"]
    out = restore_cluster.run_container("mlflow-db-restore", spec, spec["containers"][0], labels={}, detach=False)
    logs["restore"] = out.stdout + out.stderr
    assert out.returncode == 0 and "restored /backups/tracking-" in out.stdout, logs["restore"]
    assert _sql(fresh, "mlflow", "SELECT version_num FROM alembic_version") == before
    assert _sql(fresh, "mlflow", "SELECT name FROM experiments WHERE name = 'made-by-previous-mlflow'")
    assert _sql(fresh, "mlflow", "SELECT r.name || ':' || m.value FROM runs r JOIN metrics m USING (run_uuid)") == (
        "old-run:0.125"
    )
    again = restore_cluster.run_container("mlflow-db-restore", spec, spec["containers"][0], labels={}, detach=False)
    assert again.returncode != 0 and "restore into an empty database" in again.stderr, again.stderr


def _check_server_serves_migrated(stack, cluster: Cluster) -> None:
    """The server on the migrated database, its init containers already run, serves the old experiment."""
    port = free_port()
    name, container = start_mlflow(cluster, stack.resources, "mlflow-old", port, with_init=False, service=False)
    cluster.wait_ready(name, container, timeout=300)
    admin = stack.secrets["mlflow-auth"]  # this database's only user (the sweep's user is the stack's)
    status, body = _http(
        f"https://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=made-by-previous-mlflow",
        (admin["admin-username"], admin["admin-password"]),
    )
    assert status == 200, body


def test_an_older_database_is_backed_up_migrated_before_any_server_and_restorable(stack):
    """A database created by MLflow 3.1.0 (with SQLAlchemy 2.0 and psycopg2, what it ran with: an experiment and a
    run with a metric) goes through the MLflow pod's init containers alone, no server started: the plan finds the
    pending change, the backup step dumps it to the PVC, the migration brings the schema to this MLflow's head
    revision. The control, a copy of the same database through the same init containers without `db-upgrade`,
    stays at the old revision (so the check fails when the migration is missing; without the init containers
    MLflow 3.17's server would migrate it itself at its first request, from each --workers process and with no
    backup). The dump restores, with the restore Job of deploy/restore, into a fresh PostgreSQL and reads back
    at the old revision with its run; the server then serves the migrated database."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    head = _get_latest_schema_revision()  # this checkout's MLflow: the image's version (a test checks the pin)
    pg = next(n for n in stack.cluster.containers if n.startswith("postgres-0"))
    before = _seed_older_database(stack, pg, head)

    root = stack.cluster.workdir / "old"
    logs: dict[str, str] = {}
    # each Cluster is stopped in `finally` once made, whichever phase fails
    ctrl: Cluster | None = None
    cluster: Cluster | None = None
    restore_cluster: Cluster | None = None
    try:
        # control: the same init containers without the migration step
        ctrl, dep, inits = _mlflow_pod_with(stack, "mlflow_ctrl", root / "control")
        _check_control_stays_old(ctrl, dep, inits, pg, before, logs)

        # the init containers as deployed, and no server
        cluster, dep, inits = _mlflow_pod_with(stack, "mlflow_old", root / "migrated")
        backups = _migrate_without_server(cluster, dep, inits, pg, root, before, head, logs)
        _check_second_start_backs_up_nothing(cluster, dep, backups)

        # restore into a fresh PostgreSQL with the restore Job, as deploy/README.md says
        restore_cluster, _, _ = _mlflow_pod_with(stack, "mlflow", root / "migrated")
        _restore_into_fresh_postgres(stack, restore_cluster, before, logs)

        # the server on the migrated database, its init containers already run
        _check_server_serves_migrated(stack, cluster)
    finally:
        (stack.logs / "old-db-init.json").write_text(json.dumps(logs, indent=1))
        for c in (ctrl, cluster, restore_cluster):
            if c is not None:
                for n in list(c.containers):
                    c.stop(n)

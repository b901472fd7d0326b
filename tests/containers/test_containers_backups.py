"""The scheduled backups of the rendered dev overlay in containers (`make test-containers`; issue #37
item 2): the CronJob mlflow-db-backup's pod (its `dump` init container, PostgreSQL's image, then its
`upload` container, our MLflow image) runs once against the MLflow stack, and the restore Job of
deploy/restore brings each of the three databases back into a fresh PostgreSQL, where a run, a user and
a study trial made before the backup read back.

The dev overlay keeps MLflow's basic-auth tables in the tracking database (the Secret mlflow-db's two
DSNs are equal), and then the CronJob dumps two databases, not three. This test points the Secret's
auth-database-uri at a database of its own (created with psql in the stack's PostgreSQL) and starts an
MLflow pod with that Secret next to the stack's server (init containers included: they create the users
schema there, and the server creates its admin user in it), so the user it creates through the
basic-auth API lives in the third database and all three dumps are exercised. The run is made through
the same server with the stack's tracking credentials, the study in the stack's Optuna database
(the published port, as the sweep's driver reaches it through CALIB_OPTUNA_STORAGE).

Checked: three dumps on the PVC (scheduled/<db>-<stamp>.dump), each with a sha256 file that matches it;
the same three dumps and their sha256 files in the MinIO bucket db-backups (listed and read back with
the upload container's own credentials and endpoint), identical to the PVC's; then, into a fresh
PostgreSQL with empty databases, one restore Job per database (DATABASE=tracking, basic-auth, optuna;
BACKUP_FILE latest: the scheduled dump), each checksum-verified by the Job; the run and its metric (SQL),
the user (SQL on the users table) and the study's trial (optuna.load_study through the fresh server's
published port, as the study's own role) read back; a second restore into each now non-empty database
is refused."""

from __future__ import annotations

import hashlib
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.containers import images
from tests.containers.fixtures import RESTORE_DB, built_images, free_port, stack, start_mlflow, trusted_ca  # noqa: F401
from tests.containers.fixtures import http as _http
from tests.containers.harness import Cluster, find_template, podman

pytestmark = pytest.mark.container
DATABASES = ("tracking", "basic-auth", "optuna")  # the CronJob's and the restore Job's names

# The bucket's objects under BACKUP_S3_URI, {bucket/key: sha256 of the content}, read with the upload
# container's environment (Secret db-backups-s3, ConfigMap db-backup).
LIST_BUCKET = """
import boto3, hashlib, json, os
bucket, _, prefix = os.environ["BACKUP_S3_URI"].removeprefix("s3://").partition("/")
s3 = boto3.client("s3")
out = {}
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for o in page.get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        out[bucket + "/" + o["Key"]] = hashlib.sha256(body).hexdigest()
print(json.dumps(out))
"""


def _psql(container: str, db: str, *args: str) -> str:
    """psql inside a PostgreSQL container (its local socket), as the superuser `mlflow` of the dev overlay."""
    return podman("exec", container, "psql", "-v", "ON_ERROR_STOP=1", "-U", "mlflow", "-d", db, *args).stdout.strip()


def _sql(container: str, db: str, query: str) -> str:
    return _psql(container, db, "-tAc", query)


def _post(url: str, auth: tuple[str, str], body: dict) -> tuple[int, bytes]:
    import base64

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    context = ssl.create_default_context(cafile=str(trusted_ca())) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass(frozen=True)
class _Seeded:
    """What was made before the backup and must read back after each restore."""

    admin: tuple[str, str]
    experiment: str
    run_id: str
    user: str
    study_name: str
    lr: float


@dataclass(frozen=True)
class _Dumps:
    """The CronJob's scheduled dumps on the PVC: their stamp, and their files and sha256 digests by database."""

    stamp: str
    files: dict[str, Path]
    digests: dict[str, str]


def _start_users_mlflow(stack, cluster: Cluster, tag: str, logs: dict[str, str]) -> str:
    """MLflow with the users in their own database, ready; its published URL."""
    port = free_port()
    name, container = start_mlflow(cluster, stack.resources, f"mlflow-users-{tag}", port, service=False)
    cluster.wait_ready(name, container, timeout=300)
    logs.update(cluster.init_logs)
    return f"https://127.0.0.1:{port}"


def _seed_tracking_data(stack, url: str, secrets: dict, pg: str, auth_db: str, tag: str, monkeypatch) -> _Seeded:
    """A run with its metric and a user through that MLflow, a study trial in the stack's Optuna database."""
    import mlflow
    import optuna

    admin = (secrets["mlflow-auth"]["admin-username"], secrets["mlflow-auth"]["admin-password"])
    # a users database of its own: its one user is the admin (the sweep's user lives in the stack's)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
    client = mlflow.MlflowClient(tracking_uri=url)
    experiment = client.create_experiment(f"backed-up-{tag}")
    run = client.create_run(experiment, run_name=f"run-{tag}")
    client.log_metric(run.info.run_id, "val_ece", 0.0625)
    client.set_terminated(run.info.run_id)

    user = f"analyst-{tag}"
    status, body = _post(f"{url}/api/2.0/mlflow/users/create", admin, {"username": user, "password": uuid.uuid4().hex})
    assert status == 200, body
    status, body = _http(f"{url}/api/2.0/mlflow/users/get?username={user}", admin)
    assert status == 200 and json.loads(body)["user"]["username"] == user, body
    # in the users database of its own, not in the tracking database (the stack's users)
    assert _sql(pg, auth_db, f"SELECT username FROM users WHERE username = '{user}'") == user
    assert _sql(pg, "mlflow", f"SELECT count(*) FROM users WHERE username = '{user}'") == "0"

    study_name = f"backed-up-{tag}"
    study = optuna.create_study(study_name=study_name, storage=stack.optuna_url, direction="minimize")
    trial = study.ask()
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    study.tell(trial, 0.25)
    return _Seeded(admin, experiment, run.info.run_id, user, study_name, lr)


def _run_backup_pod(
    stack, cluster: Cluster, tag: str, logs: dict[str, str], timings: dict[str, float]
) -> tuple[str, dict, dict]:
    """The CronJob's pod, once: `dump` (init container) then `upload`; (the pod, its spec, the upload container)."""
    tpl = find_template(stack.resources, "CronJob", "mlflow-db-backup")
    spec = tpl["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["dump"]
    assert [c["name"] for c in spec["containers"]] == ["upload"]
    pod = f"mlflow-db-backup-{tag}"
    t = time.monotonic()
    cluster.run_pod(pod, tpl, containers=[])
    logs["dump"] = cluster.init_logs[f"{pod}/dump"]
    upload = spec["containers"][0]
    out = cluster.run_container(pod, spec, upload, labels={}, detach=False, timeout=300)
    logs["upload"] = out.stdout + out.stderr
    assert out.returncode == 0, logs["upload"][-4000:]
    timings["backup_pod_s"] = round(time.monotonic() - t, 1)
    assert "its tables are in the tracking database" not in logs["dump"], logs["dump"]
    return pod, spec, upload


def _check_scheduled_dumps(root: Path, logs: dict[str, str]) -> _Dumps:
    """The three dumps on the PVC, each non-empty with a sha256 file that matches it and named in the log."""
    scheduled = root / "pvc" / "mlflow-db-backups" / "scheduled"
    stamp = (scheduled / ".stamp").read_text().strip()
    files = {db: scheduled / f"{db}-{stamp}.dump" for db in DATABASES}
    assert sorted(p.name for p in scheduled.glob("*.dump")) == sorted(p.name for p in files.values())
    digests = {}
    for db, dump in files.items():
        assert dump.stat().st_size > 0, dump
        digests[db] = hashlib.sha256(dump.read_bytes()).hexdigest()
        sha_file = dump.with_name(dump.name + ".sha256")
        assert sha_file.read_text().split() == [digests[db], dump.name], sha_file.read_text()
        assert f"backup written: /backups/scheduled/{dump.name}" in logs["dump"], logs["dump"]
    return _Dumps(stamp, files, digests)


def _check_bucket(cluster: Cluster, pod: str, spec: dict, upload: dict, dumps: _Dumps) -> None:
    """The same dumps and sha256 files in the bucket db-backups, read with the upload container's credentials."""
    listing = cluster.run_container(
        f"{pod}-list", spec, upload, labels={}, detach=False, timeout=120, command=["python", "-c", LIST_BUCKET]
    )
    assert listing.returncode == 0, listing.stderr[-3000:]
    objects = json.loads(listing.stdout)
    config = next(e["configMapRef"]["name"] for e in upload["envFrom"] if "configMapRef" in e)  # db-backup-<hash>
    bucket, _, prefix = cluster.config_maps[config]["BACKUP_S3_URI"].removeprefix("s3://").partition("/")
    assert bucket == "db-backups", bucket  # the dev overlay's bucket of its own, not the artifact bucket
    ours = {k: v for k, v in objects.items() if dumps.stamp in k}
    expected = {}
    for db, dump in dumps.files.items():
        key = f"{bucket}/{prefix}/{db}/{dump.name}"
        expected[key] = dumps.digests[db]
        expected[key + ".sha256"] = hashlib.sha256(dump.with_name(dump.name + ".sha256").read_bytes()).hexdigest()
    assert ours == expected, (sorted(objects), sorted(expected))


def _fresh_postgres(
    stack, cluster: Cluster, tag: str, auth_db: str, password: str, optuna_password: str
) -> tuple[str, int]:
    """A fresh PostgreSQL with an empty database for each, the Secrets pointed at it; (its container, its port)."""
    pg_tpl = find_template(stack.resources, "StatefulSet", "postgres")
    pg_tpl["metadata"] = {"labels": {}}  # not the `postgres` Service: a server of its own
    pg_port = free_port()
    # reached as RESTORE_DB, a name its certificate carries (the clients check it: verify-full)
    fresh = cluster.run_pod(
        f"postgres-restore-{tag}", pg_tpl, publish=[f"127.0.0.1:{pg_port}:5432"], aliases=[RESTORE_DB]
    )["postgres"]
    cluster.wait_ready(fresh, pg_tpl["spec"]["containers"][0], timeout=180)
    _psql(fresh, "mlflow", "-c", f"CREATE DATABASE {auth_db}")
    _psql(fresh, "mlflow", "-c", f"CREATE ROLE optuna LOGIN PASSWORD '{optuna_password}'")
    _psql(fresh, "mlflow", "-c", "CREATE DATABASE optuna OWNER optuna")
    # the Secrets as they would be after pointing the service at the new server
    db = f"{RESTORE_DB}:5432"
    cluster.secrets["mlflow-db"]["backend-store-uri"] = f"postgresql://mlflow:{password}@{db}/mlflow"
    cluster.secrets["mlflow-db"]["auth-database-uri"] = f"postgresql://mlflow:{password}@{db}/{auth_db}"
    cluster.secrets["optuna-storage"]["url"] = f"postgresql://optuna:{optuna_password}@{db}/optuna"
    return fresh, pg_port


def _restore_job_spec() -> dict:
    """The pod spec of deploy/restore's restore Job."""
    job = yaml.safe_load((images.REPO / "deploy" / "restore" / "mlflow-db-restore-job.yaml").read_text())
    return job["spec"]["template"]["spec"]


def _restore(cluster: Cluster, job_spec: dict, tag: str, db: str) -> subprocess.CompletedProcess:
    """The restore Job's container, run once for database `db` (its latest backup)."""
    return cluster.run_container(
        f"mlflow-db-restore-{tag}",
        job_spec,
        job_spec["containers"][0],
        labels={},
        detach=False,
        timeout=300,
        extra_env=[{"name": "DATABASE", "value": db}],
    )


def _restore_each(cluster: Cluster, job_spec: dict, tag: str, stamp: str, logs: dict[str, str]) -> None:
    """The restore Job once per database, each from its scheduled dump."""
    for db in DATABASES:
        out = _restore(cluster, job_spec, tag, db)
        logs[f"restore {db}"] = out.stdout + out.stderr
        assert out.returncode == 0, logs[f"restore {db}"][-4000:]
        assert f"restored /backups/scheduled/{db}-{stamp}.dump into the {db} database" in out.stdout, out.stdout
        assert "cannot open" not in out.stderr, out.stderr  # a scheduled dump has no migration note


def _check_restored(fresh: str, pg_port: int, seeded: _Seeded, tag: str, auth_db: str, optuna_password: str) -> None:
    """The run and its metric, the user, the study's trial, read back from the fresh server."""
    import optuna

    got = _sql(
        fresh,
        "mlflow",
        "SELECT r.name || ':' || m.key || '=' || m.value FROM runs r JOIN metrics m USING (run_uuid) "
        f"WHERE r.run_uuid = '{seeded.run_id}'",
    )
    assert got == f"run-{tag}:val_ece=0.0625", got
    assert _sql(fresh, "mlflow", f"SELECT name FROM experiments WHERE experiment_id = {seeded.experiment}") == (
        f"backed-up-{tag}"
    )
    assert _sql(fresh, auth_db, f"SELECT username FROM users WHERE username = '{seeded.user}'") == seeded.user
    assert _sql(fresh, auth_db, f"SELECT username FROM users WHERE username = '{seeded.admin[0]}'") == seeded.admin[0]
    restored = optuna.load_study(
        study_name=seeded.study_name, storage=f"postgresql://optuna:{optuna_password}@127.0.0.1:{pg_port}/optuna"
    )
    assert [(t.state.name, t.params, t.value) for t in restored.trials] == [("COMPLETE", {"lr": seeded.lr}, 0.25)]


def _check_second_restore_refused(cluster: Cluster, job_spec: dict, tag: str, logs: dict[str, str]) -> None:
    """A second restore into a database that now has tables is refused."""
    for db in DATABASES:
        again = _restore(cluster, job_spec, tag, db)
        logs[f"restore again {db}"] = again.stdout + again.stderr
        assert again.returncode != 0 and "restore into an empty database" in again.stderr, again.stderr


def test_the_backup_cronjob_dumps_all_three_databases_and_each_restores(stack, monkeypatch):
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:6]
    pg = next(n for n in stack.cluster.containers if n.startswith("postgres-0"))
    password = stack.secrets["postgres-credentials"]["password"]
    optuna_password = stack.secrets["optuna-storage"]["password"]
    auth_db = f"mlflow_users_{tag}"
    # the dev overlay's users tables share the tracking database: give them one of their own
    assert stack.secrets["mlflow-db"]["auth-database-uri"] == stack.secrets["mlflow-db"]["backend-store-uri"]
    _psql(pg, "mlflow", "-c", f"CREATE DATABASE {auth_db}")
    secrets = json.loads(json.dumps(stack.secrets))
    secrets["mlflow-db"]["auth-database-uri"] = f"postgresql://mlflow:{password}@postgres:5432/{auth_db}"
    root = stack.cluster.workdir / f"backups-{tag}"
    # same namespace: the stack's network (postgres, minio); the PVC mlflow-db-backups is root/pvc/...
    cluster = Cluster(stack.resources, secrets, root, network=stack.cluster.network)
    logs: dict[str, str] = {}
    timings: dict[str, float] = {}
    try:
        url = _start_users_mlflow(stack, cluster, tag, logs)
        timings["mlflow_started_s"] = round(time.monotonic() - t0, 1)
        seeded = _seed_tracking_data(stack, url, secrets, pg, auth_db, tag, monkeypatch)

        pod, spec, upload = _run_backup_pod(stack, cluster, tag, logs, timings)
        dumps = _check_scheduled_dumps(root, logs)
        _check_bucket(cluster, pod, spec, upload, dumps)

        t = time.monotonic()
        fresh, pg_port = _fresh_postgres(stack, cluster, tag, auth_db, password, optuna_password)
        job_spec = _restore_job_spec()
        _restore_each(cluster, job_spec, tag, dumps.stamp, logs)
        timings["restore_s"] = round(time.monotonic() - t, 1)

        _check_restored(fresh, pg_port, seeded, tag, auth_db, optuna_password)
        _check_second_restore_refused(cluster, job_spec, tag, logs)
        timings["total_s"] = round(time.monotonic() - t0, 1)
    finally:
        (stack.logs / "backups.json").write_text(json.dumps({"timings": timings, "logs": logs}, indent=1))
        cluster.close()
        podman(
            "exec", pg, "psql", "-U", "mlflow", "-d", "mlflow", "-c", f"DROP DATABASE IF EXISTS {auth_db}", check=False
        )

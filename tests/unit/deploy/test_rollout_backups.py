"""Scheduled backups (issue #37 item 2, the manifests): the CronJob backing up MLflow's tracking and auth
databases and the Optuna studies, rendered in every overlay (schedule, no overlap, the node of the RWO
volume, the policies letting it reach PostgreSQL and the object store, its Secret's template), and its
scripts and the restore Job's run here against stand-in pg_dump / psql / pg_restore and a stand-in boto3:
file names, checksums, retention on the volume and in the bucket, and the restore of each database."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import deploy_checks as dc
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()
IDS = [p.name for p in OVERLAYS]
RESTORE = dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml"


def cronjob(resources: list[dict]) -> dict:
    return next(r for r in resources if r["kind"] == "CronJob" and r["metadata"]["name"] == "mlflow-db-backup")


def _pod(cj: dict) -> dict:
    return cj["spec"]["jobTemplate"]["spec"]["template"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_backup_cronjob_is_scheduled_and_reaches_what_it_needs(overlay):
    resources = dr.render_with_addresses(overlay)  # the placeholder address ranges set, as a user sets them
    cj = cronjob(resources)
    spec = cj["spec"]
    assert len(spec["schedule"].split()) == 5 and spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid" and spec["startingDeadlineSeconds"] > 0
    pod = _pod(cj)
    ps = pod["spec"]
    dump, upload = ps["initContainers"][0], ps["containers"][0]
    assert (dump["name"], upload["name"]) == ("dump", "upload")  # the copy starts after every dump is written
    # the three databases, from their Secrets
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in dump["env"] if "valueFrom" in e}
    assert refs == {
        "TRACKING_URI": {"name": "mlflow-db", "key": "backend-store-uri"},
        "AUTH_URI": {"name": "mlflow-db", "key": "auth-database-uri"},
        "OPTUNA_URI": {"name": "optuna-storage", "key": "url"},
    }
    # the RWO backups volume, on the MLflow pod's node; read-only for the copy
    claim = next(v for v in ps["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"]["claimName"] == "mlflow-db-backups"
    assert [m.get("readOnly", False) for m in upload["volumeMounts"] if m["name"] == claim["name"]] == [True]
    term = ps["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    mlflow = next(r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "mlflow")
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert dc.selects(term["labelSelector"], mlflow["spec"]["template"]["metadata"]["labels"])
    # a bucket of its own, with a key of its own: never the artifact bucket MLflow serves to its users
    config = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"].startswith("db-backup"))
    bucket = config["data"]["BACKUP_S3_URI"].removeprefix("s3://").split("/")[0]
    artifacts = next(
        e["value"]
        for e in mlflow["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "MLFLOW_ARTIFACTS_DESTINATION"
    )
    assert bucket != artifacts.removeprefix("s3://").split("/")[0]
    s3_key = {e["valueFrom"]["secretKeyRef"]["name"] for e in upload["env"] if "valueFrom" in e}
    assert s3_key == {"db-backups-s3"}
    templates = [d for d in yaml.safe_load_all((overlay / "secrets.example.yaml").read_text()) if d]
    assert any(t["metadata"]["name"] == "db-backups-s3" for t in templates)
    # the network: PostgreSQL on 5432, the object store (dev: MinIO; gpu-cluster: HTTPS outside the cluster)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    ns = dr.namespace_of(resources)
    labels = pod["metadata"]["labels"]
    postgres = next((r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "postgres"), None)
    if postgres is not None:
        pg = postgres["spec"]["template"]["metadata"]["labels"]
        assert dc.policy_allows_egress(policies, ns, labels, ("pod", ns, pg), 5432)
        assert dc.policy_allows(policies, ns, (ns, labels), pg, 5432)
        minio = next(r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "minio")
        assert dc.policy_allows_egress(
            policies, ns, labels, ("pod", ns, minio["spec"]["template"]["metadata"]["labels"]), 9000
        )
        assert "db-backups" in next(
            e["value"]
            for r in resources
            if r["kind"] == "Job" and r["metadata"]["name"] == "minio-buckets"
            for e in r["spec"]["template"]["spec"]["containers"][0]["env"]
            if e["name"] == "BUCKETS"
        ).split(",")
    else:  # the managed database's subnet and the object store's range (dr.EXAMPLE_ADDRESSES)
        assert dc.policy_allows_egress(policies, ns, labels, ("ip", "10.20.0.5"), 5432)
        assert dc.policy_allows_egress(policies, ns, labels, ("ip", "52.216.1.1"), 443)
        assert not dc.policy_allows_egress(policies, ns, labels, ("ip", "203.0.113.7"), 443)
    assert {k: v for k, v in dc.run_checks(resources).items() if v} == {}


# ----------------------------------------------------------------------------- the scripts, run here


def _script(container: dict) -> str:
    return container["command"][-1]


def _tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(stat.S_IRWXU)


@pytest.fixture
def dev_cronjob():
    return cronjob(dr.render(dr.DEPLOY / "overlays" / "dev"))


def _dump_env(tmp: Path, bin_dir: Path, **extra) -> dict:
    _tool(
        bin_dir,
        "pg_dump",
        'for a; do case "$a" in --file=*) f="${a#--file=}";; --dbname=*) d="${a#--dbname=}";; esac; done\n'
        'printf "dump of %s\\n" "$d" > "$f"\n',
    )
    # one stamp per run, one second apart (the real `date -u +%Y%m%dT%H%M%SZ`)
    _tool(
        bin_dir,
        "date",
        f"n=$(cat {tmp}/clock 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp}/clock\n"
        'printf "20261202T0230%02dZ\\n" "$n"\n',
    )
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "BACKUP_DIR": str(tmp / "backups"),
        "BACKUP_KEEP": "2",
        "TRACKING_URI": "postgresql+psycopg://mlflow:pw@postgres:5432/mlflow",
        "AUTH_URI": "postgresql://mlflow:pw@postgres:5432/mlflow",
        "OPTUNA_URI": "postgresql://optuna:pw@postgres:5432/optuna",
        **extra,
    }


def test_dump_writes_each_database_with_its_checksum_and_keeps_the_newest(tmp_path, dev_cronjob):
    script = _script(_pod(dev_cronjob)["spec"]["initContainers"][0])
    env = _dump_env(tmp_path, tmp_path / "bin", AUTH_URI="postgresql://mlflow:pw@postgres:5432/mlflow_auth")
    for _ in range(3):
        out = subprocess.run(["sh", "-ceu", script], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    d = tmp_path / "backups" / "scheduled"
    names = sorted(p.name for p in d.iterdir())
    # BACKUP_KEEP=2: runs 2 and 3 kept, of each database, each with its checksum; the last stamp recorded
    assert names == [".stamp"] + sorted(
        f"{db}-20261202T0230{n:02d}Z.dump{ext}"
        for db in ("basic-auth", "optuna", "tracking")
        for n in (2, 3)
        for ext in ("", ".sha256")
    )
    assert (d / ".stamp").read_text().strip() == "20261202T023003Z"
    # the driver suffix is gone before libpq sees the DSN; the checksum file checks
    assert (d / "tracking-20261202T023003Z.dump").read_text() == "dump of postgresql://mlflow:pw@postgres:5432/mlflow\n"
    check = subprocess.run(
        ["sha256sum", "-c", "optuna-20261202T023003Z.dump.sha256"], cwd=d, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert not list(d.glob("*.partial"))


def test_dump_takes_the_auth_tables_with_the_tracking_database_when_they_share_it(tmp_path, dev_cronjob):
    script = _script(_pod(dev_cronjob)["spec"]["initContainers"][0])
    env = _dump_env(tmp_path, tmp_path / "bin", AUTH_URI="postgresql+psycopg://mlflow:pw@postgres:5432/mlflow")
    env["AUTH_URI"] = env["TRACKING_URI"]
    out = subprocess.run(["sh", "-ceu", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "in that dump" in out.stdout
    assert sorted(p.name.split("-2026")[0] for p in (tmp_path / "backups" / "scheduled").glob("*.dump")) == [
        "optuna",
        "tracking",
    ]


def test_a_failed_dump_fails_the_job_and_leaves_no_file(tmp_path, dev_cronjob):
    script = _script(_pod(dev_cronjob)["spec"]["initContainers"][0])
    env = _dump_env(tmp_path, tmp_path / "bin")
    _tool(tmp_path / "bin", "pg_dump", "echo 'connection refused' >&2; exit 1\n")
    out = subprocess.run(["sh", "-ceu", script], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert not [p for p in (tmp_path / "backups" / "scheduled").iterdir() if p.name.endswith(".dump")]


FAKE_BOTO3 = """
import json, os, pathlib
STORE = pathlib.Path(os.environ["FAKE_S3"])
def _load():
    return json.loads(STORE.read_text()) if STORE.exists() else {}
def _save(d):
    STORE.write_text(json.dumps(d))
class _Client:
    def upload_file(self, path, bucket, key):
        d = _load(); d[f"{bucket}/{key}"] = pathlib.Path(path).read_text(); _save(d)
    def head_object(self, Bucket, Key):
        return {"ContentLength": len(_load()[f"{Bucket}/{Key}"].encode())}
    def list_objects_v2(self, Bucket, Prefix):
        keys = [k for k in sorted(_load()) if k.startswith(f"{Bucket}/{Prefix}")]
        return {"Contents": [{"Key": k.split("/", 1)[1]} for k in keys]}
    def delete_objects(self, Bucket, Delete):
        d = _load()
        for o in Delete["Objects"]:
            d.pop(f"{Bucket}/{o['Key']}", None)
        _save(d)
def client(name):
    assert name == "s3"
    return _Client()
"""


def test_upload_copies_this_runs_dumps_and_keeps_the_newest_in_the_bucket(tmp_path, dev_cronjob):
    pod = _pod(dev_cronjob)["spec"]
    script_dump, script_up = _script(pod["initContainers"][0]), _script(pod["containers"][0])
    env = _dump_env(tmp_path, tmp_path / "bin", BACKUP_KEEP="5")
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / "boto3.py").write_text(FAKE_BOTO3)
    store = tmp_path / "s3.json"
    up_env = {
        **env,
        "PYTHONPATH": str(tmp_path / "py"),
        "FAKE_S3": str(store),
        "BACKUP_S3_URI": "s3://db-backups/mlflow",
        "BACKUP_S3_KEEP": "2",
    }
    for _ in range(3):
        assert subprocess.run(["sh", "-ceu", script_dump], env=env, capture_output=True).returncode == 0
        out = subprocess.run([sys.executable, "-c", script_up], env=up_env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
    keys = sorted(json.loads(store.read_text()))
    # the volume keeps 3 (BACKUP_KEEP=5), the bucket the newest 2 per database, each with its checksum
    assert keys == sorted(
        f"db-backups/mlflow/{db}/{db}-20261202T0230{n:02d}Z.dump{ext}"
        for db in ("basic-auth", "optuna", "tracking")
        for n in (2, 3)
        for ext in ("", ".sha256")
    )
    assert "removed old s3://db-backups/mlflow/tracking/tracking-20261202T023001Z.dump" in out.stdout
    assert len(list((tmp_path / "backups" / "scheduled").glob("*.dump"))) == 9


# ------------------------------------------------------------------------------------------ restore


def _restore_env(tmp: Path, tables: int = 0) -> dict:
    bin_dir = tmp / "bin"
    _tool(bin_dir, "psql", f"echo {tables}\n")
    _tool(bin_dir, "pg_restore", f'echo "$@" > {tmp}/restored\n')
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "BACKUP_DIR": str(tmp / "backups"),
        "BACKUP_FILE": "latest",
        "TRACKING_URI": "postgresql+psycopg://mlflow:pw@db/mlflow",
        "AUTH_URI": "postgresql://mlflow:pw@db/mlflow_auth",
        "OPTUNA_URI": "postgresql://optuna:pw@db/optuna",
    }


def _backups(tmp: Path) -> None:
    d = tmp / "backups"
    (d / "scheduled").mkdir(parents=True)
    for rel, age in (
        ("tracking-20261201T000000Z.dump", 300),
        ("scheduled/tracking-20261202T023000Z.dump", 100),
        ("scheduled/optuna-20261202T023000Z.dump", 100),
        ("basic-auth-20261201T000000Z.dump", 50),
    ):
        f = d / rel
        f.write_text(f"dump {rel}\n")
        subprocess.run(["sha256sum", f.name], cwd=f.parent, stdout=open(f"{f}.sha256", "w"), check=True)
        os.utime(f, (1_800_000_000 - age, 1_800_000_000 - age))


@pytest.mark.parametrize(
    "database, newest, target",
    [
        ("tracking", "scheduled/tracking-20261202T023000Z.dump", "postgresql://mlflow:pw@db/mlflow"),
        ("optuna", "scheduled/optuna-20261202T023000Z.dump", "postgresql://optuna:pw@db/optuna"),
        ("basic-auth", "basic-auth-20261201T000000Z.dump", "postgresql://mlflow:pw@db/mlflow_auth"),
    ],
)
def test_restore_takes_the_newest_dump_of_the_database_named(tmp_path, database, newest, target):
    job = yaml.safe_load(RESTORE.read_text())
    c = job["spec"]["template"]["spec"]["containers"][0]
    _backups(tmp_path)
    env = {**_restore_env(tmp_path), "DATABASE": database}
    out = subprocess.run(["sh", "-ceu", _script(c)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"restored {tmp_path}/backups/{newest} into the {database} database" in out.stdout
    assert (tmp_path / "restored").read_text().split()[-3:] == ["-d", target, f"{tmp_path}/backups/{newest}"]


def test_restore_refuses_a_bad_checksum_a_full_database_and_an_unknown_name(tmp_path):
    job = yaml.safe_load(RESTORE.read_text())
    c = job["spec"]["template"]["spec"]["containers"][0]
    env_names = [e["name"] for e in c["env"]]
    assert env_names[:2] == ["DATABASE", "BACKUP_FILE"] and {"TRACKING_URI", "AUTH_URI", "OPTUNA_URI"} <= set(env_names)
    _backups(tmp_path)
    script = _script(c)
    (tmp_path / "backups" / "scheduled" / "optuna-20261202T023000Z.dump").write_text("tampered\n")
    bad = subprocess.run(
        ["sh", "-ceu", script], env={**_restore_env(tmp_path), "DATABASE": "optuna"}, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "does not match its sha256" in bad.stderr
    full = subprocess.run(
        ["sh", "-ceu", script],
        env={**_restore_env(tmp_path, tables=12), "DATABASE": "tracking"},
        capture_output=True,
        text=True,
    )
    assert full.returncode != 0 and "restore into an empty database" in full.stderr
    unknown = subprocess.run(
        ["sh", "-ceu", script], env={**_restore_env(tmp_path), "DATABASE": "mlflow"}, capture_output=True, text=True
    )
    assert unknown.returncode != 0 and "DATABASE must be" in unknown.stderr
    none = subprocess.run(
        ["sh", "-ceu", script],
        env={**_restore_env(tmp_path), "DATABASE": "tracking", "BACKUP_FILE": "nope.dump"},
        capture_output=True,
        text=True,
    )
    assert none.returncode != 0 and "no backup of tracking" in none.stderr
    assert not (tmp_path / "restored").exists()

"""Identity (issue #46 item 3): every workload runs under a ServiceAccount of its own (never `default`), no account
or pod mounts a token but the Ray head's autoscaler sidecar (a projected, expiring one), the accounts that reach a
bucket can carry a cloud identity (components/workload-identity) with the static keys then optional, and the MLflow
admin's password reaches only the MLflow server and the Job that creates the sweep's user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests import deploy_checks as dc
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()
IDS = [p.name for p in OVERLAYS]
COMPONENT = dr.DEPLOY / "components" / "workload-identity"

# where -> its account (the RayJob's and the interactive RayCluster's Ray pods alike)
EXPECTED = {
    "Deployment/mlflow": "mlflow",
    "CronJob/mlflow-db-backup": "db-backup",
    "Job/mlflow-sweep-user": "mlflow-admin",
    "RayJob/calib-sweep/submitter": "ray-job-submitter",
    "RayJob/calib-sweep/head": "ray-head",
    "RayCluster/calib-interactive/head": "ray-head",
    "StatefulSet/postgres": "postgres",
    "StatefulSet/minio": "minio",
    "Job/minio-buckets": "dev-setup",
    "Job/optuna-db": "dev-setup",
}
S3_SECRETS = {"tune-storage-s3", "mlflow-artifacts-s3", "db-backups-s3"}


def accounts(resources: list[dict]) -> dict[str, str | None]:
    return {where: spec.get("serviceAccountName") for r in resources for where, spec in dr.pod_specs(r)}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_every_workload_has_its_own_account_without_a_token(overlay):
    resources = dr.render(overlay)
    sas = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ServiceAccount"}
    found = accounts(resources)
    for where, sa in found.items():
        assert sa not in (None, "", "default"), where
        assert sa in sas, f"{where}: ServiceAccount {sa} is not in the overlay"
        want = EXPECTED.get(where) or ("ray-worker" if "/worker:" in where else None)
        assert want is not None, f"{where}: no expected account (add it to EXPECTED)"
        assert sa == want, (where, sa)
    for name, sa in sas.items():
        assert sa.get("automountServiceAccountToken") is False, name
    for r in resources:
        for where, spec in dr.pod_specs(r):
            assert spec.get("automountServiceAccountToken") is False, where
    # distinct workloads, distinct accounts: the server, the driver, the trials, the backups, the admin Job
    roles = {found[w] for w in ("Deployment/mlflow", "RayJob/calib-sweep/head", "CronJob/mlflow-db-backup")}
    roles |= {found["Job/mlflow-sweep-user"], found["RayJob/calib-sweep/submitter"]}
    roles |= {sa for w, sa in found.items() if "/worker:" in w}
    assert len(roles) == 6, roles


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_only_the_autoscaler_sidecar_holds_a_kubernetes_token(overlay):
    """The projected token the autoscaler needs is the head's account's (KubeRay binds its Role to it, and adds the
    sidecar with autoscalerOptions.volumeMounts); no container of any pod template mounts one."""
    for r in dr.render(overlay):
        for where, spec in dr.pod_specs(r):
            projected = {
                v["name"]
                for v in spec.get("volumes", [])
                for s in (v.get("projected") or {}).get("sources", [])
                if "serviceAccountToken" in s
            }
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                assert not ({m["name"] for m in c.get("volumeMounts", [])} & projected), (where, c["name"])
            if projected:
                assert where.endswith("/head") and spec["serviceAccountName"] == "ray-head", where
                cluster = dr.ray_cluster_spec(r)
                mounts = {m["name"] for m in cluster["autoscalerOptions"].get("volumeMounts", [])}
                assert projected <= mounts, where


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_the_admin_password_reaches_only_mlflow_and_the_user_job(overlay):
    holders = set()
    for r in dr.render(overlay):
        for where, spec in dr.pod_specs(r):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                for e in c.get("env", []):
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
                    if ref.get("name") == "mlflow-auth" and ref.get("key") == "admin-password":
                        holders.add(where)
                for src in c.get("envFrom", []):
                    assert (src.get("secretRef") or {}).get("name") != "mlflow-auth", where
            for v in spec.get("volumes", []):
                assert (v.get("secret") or {}).get("secretName") != "mlflow-auth", where
    assert holders <= {"Deployment/mlflow", "Job/mlflow-sweep-user"}, holders


def s3_key_refs(resources: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for r in resources:
        for where, spec in dr.pod_specs(r):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                for e in c.get("env", []):
                    ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
                    if ref.get("name") in S3_SECRETS:
                        out.append((f"{where}/{c['name']}/{e['name']}", ref))
    return out


def test_workload_identity_annotates_the_bucket_accounts_and_the_keys_are_optional(tmp_path):
    d = tmp_path / "wi"
    d.mkdir()
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(dr.DEPLOY / "overlays" / "gpu-cluster", d)],
                "components": [os.path.relpath(COMPONENT, d)],
            }
        )
    )
    resources = dr.render(d)
    sas = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ServiceAccount"}
    annotated = {
        n for n, sa in sas.items() if "eks.amazonaws.com/role-arn" in (sa["metadata"].get("annotations") or {})
    }
    assert annotated == {"mlflow", "ray-head", "ray-worker", "db-backup"}
    # every pod that reaches a bucket runs under an annotated account, and its static keys are optional
    refs = s3_key_refs(resources)
    assert len(refs) >= 10
    assert all(ref.get("optional") is True for _, ref in refs), [w for w, ref in refs if not ref.get("optional")]
    users = {where.rsplit("/", 2)[0] for where, _ in refs}
    found = accounts(resources)
    assert {found[u] for u in users} <= annotated, {u: found[u] for u in users}
    # the accounts without a bucket stay bare: the submitter, the admin Job
    assert not (sas["ray-job-submitter"]["metadata"].get("annotations") or {})
    assert not (sas["mlflow-admin"]["metadata"].get("annotations") or {})
    problems = {k: v for k, v in dc.run_checks(resources).items() if v}
    assert problems == {}, problems


def test_restore_job_runs_as_the_backup_account():
    job = yaml.safe_load((dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml").read_text())
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "db-backup" and spec["automountServiceAccountToken"] is False


def test_accounts_are_in_the_base_and_dev(tmp_path):
    base = {r["metadata"]["name"] for r in dr.render(dr.DEPLOY / "base") if r["kind"] == "ServiceAccount"}
    assert base == {"mlflow", "ray-head", "ray-worker", "ray-job-submitter", "db-backup", "mlflow-admin"}
    assert Path(dr.DEPLOY / "overlays" / "dev" / "serviceaccounts.yaml").exists()

"""Every check of tests/deploy_checks.py passes on every overlay, and the persistent/ part of each
overlay (Namespace, dataset cache) is what the service refers to."""

from __future__ import annotations

import pytest
import yaml

from tests import deploy_checks as dc
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()


@pytest.mark.parametrize("check", sorted(dc.CHECKS))
@pytest.mark.parametrize("overlay", OVERLAYS, ids=[o.name for o in OVERLAYS])
def test_check_passes(overlay, check):
    assert dc.CHECKS[check](dr.render(overlay)) == []


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[o.name for o in OVERLAYS])
def test_persistent_part_holds_namespace_dataset_cache_and_backups(overlay):
    persistent = dr.render(dr.persistent_dir(overlay))
    kinds = {(r["kind"], r["metadata"]["name"]) for r in persistent}
    resources = dr.render(overlay)
    ns = dr.namespace_of(resources)
    assert ("Namespace", ns) in kinds
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for _, _, spec in dc.pod_templates(resources)
        for v in spec.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    assert claims == {"ray-datasets", "mlflow-db-backups"}
    for claim in claims:
        pvc = next(r for r in persistent if r["kind"] == "PersistentVolumeClaim" and r["metadata"]["name"] == claim)
        assert pvc["metadata"]["namespace"] == ns
        if claim == "mlflow-db-backups":
            continue  # one pod (Recreate) writes it
        modes = pvc["spec"]["accessModes"]
        max_workers = max(
            g["maxReplicas"] for r in dc.ray_objects(resources) for g in dr.ray_cluster_spec(r)["workerGroupSpecs"]
        )
        # Workers on several nodes share it: RWX; dev (one node) gets by with RWO.
        rwo_ok = overlay.name == "dev" and modes == ["ReadWriteOnce"]
        assert "ReadWriteMany" in modes or rwo_ok, (overlay.name, modes)
        assert max_workers == 1 or "ReadWriteMany" in modes
    ns_obj = next(r for r in persistent if r["kind"] == "Namespace")
    assert ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    assert ns_obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_statefulset_volumes_are_retained():
    for overlay in OVERLAYS:
        for r in dr.render(overlay):
            if r["kind"] == "StatefulSet" and r["spec"].get("volumeClaimTemplates"):
                policy = r["spec"]["persistentVolumeClaimRetentionPolicy"]
                assert policy == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_quantity_parser():
    assert dc.quantity("10Gi") == 10 * 2**30 and dc.quantity("500m") == 0.5 and dc.quantity(3) == 3.0
    assert dc.quantity("2000000000") == 2e9 and dc.quantity("1G") == 1e9


def test_restore_job_is_hardened_valid_and_reaches_the_database():
    """deploy/restore's Job (applied by hand) passes the same hardening and schema checks as the overlays, mounts
    the backups PVC read-only, and carries the label the overlays' egress policies to PostgreSQL select."""
    job = yaml.safe_load((dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml").read_text())
    assert dc.check_pod_hardening([job]) == []
    assert dc.check_schemas([job]) == []
    spec = job["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    claim = next(v for v in spec["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"]["claimName"] == "mlflow-db-backups" and mounts[claim["name"]]["readOnly"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    for overlay in OVERLAYS:
        selectors = [
            r["spec"]["podSelector"].get("matchLabels", {})
            for r in dr.render(overlay)
            if r["kind"] == "NetworkPolicy"
            and any(p.get("port") == 5432 for e in r["spec"].get("egress", []) for p in e.get("ports", []))
        ]
        assert any(sel and all(labels.get(k) == v for k, v in sel.items()) for sel in selectors), overlay.name

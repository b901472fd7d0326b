"""Mutation test of the deploy checks: each planted mistake, applied to the rendered manifests
(to both Ray objects, the RayJob's cluster and the interactive RayCluster, where it concerns Ray,
so that the test keeping the two in sync cannot be what catches it), must make some check of
tests/deploy_checks.py fail. The first 15 are the review's list (8 of them went unnoticed before);
the rest guard the fixes of issue #14."""

from __future__ import annotations

import copy

import pytest

from tests import deploy_checks as dc
from tests import deploy_render as dr

OVERLAYS = {o.name: o for o in dr.overlay_dirs()}


def _ray(resources):
    return dc.ray_objects(resources)


def _head(obj):
    return dr.ray_cluster_spec(obj)["headGroupSpec"]


def _workers(obj):
    return dr.ray_cluster_spec(obj)["workerGroupSpecs"]


def _groups(obj):
    return [_head(obj), *_workers(obj)]


def _head_port(obj, name):
    return next(p for p in _head(obj)["template"]["spec"]["containers"][0]["ports"] if p["name"] == name)


def _named(resources, kind, name):
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)


def gcs_port_6380(rs):
    for r in _ray(rs):
        _head_port(r, "gcs-server")["containerPort"] = 6380


def dashboard_port_renamed(rs):
    for r in _ray(rs):
        _head_port(r, "dashboard")["name"] = "dash"


def dshm_not_in_memory(rs):
    for r in _ray(rs):
        for g in _groups(r):
            next(v for v in g["template"]["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"].pop("medium")


def object_store_larger_than_shm(rs):
    for r in _ray(rs):
        for g in _workers(r):
            g["rayStartParams"]["object-store-memory"] = "12000000000"


def wrong_node_selector_label(rs):
    for r in _ray(rs):
        for g in _workers(r):
            g["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.presnt": "true"}


def ray_policy_three_ports(rs):
    policy = _named(rs, "NetworkPolicy", "ray-same-namespace-only")
    policy["spec"]["ingress"][0]["ports"] = [{"protocol": "TCP", "port": p} for p in (6379, 8265, 10001)]


def service_target_port_typo(rs):
    _named(rs, "Service", "mlflow")["spec"]["ports"][0]["targetPort"] = "htpp"


def wrong_tracking_uri(rs):
    _named(rs, "ConfigMap", "ray-env")["data"]["MLFLOW_TRACKING_URI"] = "http://mlflow:5001"


def worker_without_token(rs):
    for r in _ray(rs):
        for g in _workers(r):
            c = g["template"]["spec"]["containers"][0]
            c["env"] = [e for e in c["env"] if e["name"] != "RAY_AUTH_TOKEN"]


def token_secret_key_typo(rs):
    for r in _ray(rs):
        env = _head(r)["template"]["spec"]["containers"][0]["env"]
        next(e for e in env if e["name"] == "RAY_AUTH_TOKEN")["valueFrom"]["secretKeyRef"]["key"] = "auth-token"


def ray_version_mismatch(rs):
    for r in _ray(rs):
        dr.ray_cluster_spec(r)["rayVersion"] = "2.59.0"


def head_root_filesystem_writable(rs):
    for r in _ray(rs):
        _head(r)["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False


def mlflow_open_to_namespace(rs):
    _named(rs, "NetworkPolicy", "mlflow-from-ray-and-ingress")["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]


def gpu_workers_without_toleration(rs):
    for r in _ray(rs):
        for g in _workers(r):
            g["template"]["spec"].pop("tolerations")


def entrypoint_misspelled_field(rs):
    for r in _ray(rs):
        spec = dr.ray_cluster_spec(r)
        spec["enableInTreeAutoScaling"] = spec.pop("enableInTreeAutoscaling")


# ---- regressions of the issue #14 fixes


def gfd_node_selector(rs):
    for r in _ray(rs):
        for g in _workers(r):
            g["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}


def no_db_migration(rs):
    spec = _named(rs, "Deployment", "mlflow")["spec"]["template"]["spec"]
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] != "db-upgrade"]


def image_by_tag_only(rs):
    for r in _ray(rs):
        for g in _groups(r):
            c = g["template"]["spec"]["containers"][0]
            c["image"] = c["image"].split("@")[0] + ":0.1.0"


def no_ephemeral_storage(rs):
    for r in _ray(rs):
        for g in _workers(r):
            for part in ("requests", "limits"):
                g["template"]["spec"]["containers"][0]["resources"][part].pop("ephemeral-storage")


def head_evictable(rs):
    for r in _ray(rs):
        _head(r)["template"]["metadata"].pop("annotations")


def telemetry_on(rs):
    data = _named(rs, "ConfigMap", "ray-env")["data"]
    data.pop("MLFLOW_DISABLE_TELEMETRY")
    data.pop("DO_NOT_TRACK")


def datasets_in_empty_dir(rs):
    for r in _ray(rs):
        for g in _workers(r):
            v = next(v for v in g["template"]["spec"]["volumes"] if v["name"] == "data")
            v.pop("persistentVolumeClaim")
            v["emptyDir"] = {"sizeLimit": "100Gi"}


def mlflow_served_without_tls(rs):
    args = _named(rs, "Deployment", "mlflow")["spec"]["template"]["spec"]["containers"][0]["args"]
    i = args.index("--uvicorn-opts")
    del args[i : i + 2]


def clients_trust_nothing(rs):
    _named(rs, "ConfigMap", "ray-env")["data"]["MLFLOW_TRACKING_INSECURE_TLS"] = "true"


def server_key_mounted_in_ray_pods(rs):
    for r in _ray(rs):
        for g in _groups(r):
            for v in g["template"]["spec"]["volumes"]:
                if v["name"] == "mlflow-ca":
                    v["secret"].pop("items")


def db_client_without_verify_full(rs):
    spec = _named(rs, "Deployment", "mlflow")["spec"]["template"]["spec"]
    env = next(c for c in spec["initContainers"] if c["name"] == "wait-for-db")["env"]
    next(e for e in env if e["name"] == "PGSSLMODE")["value"] = "require"


def db_ca_not_mounted_on_the_head(rs):
    for r in _ray(rs):
        c = _head(r)["template"]["spec"]["containers"][0]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "postgres-ca"]


def namespace_in_overlay(rs):
    rs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "calib-sweeps"}})


# ---- regressions of the issue #44 fix (data the cluster can reach)


def entrypoint_downloads_without_egress(rs):
    for r in rs:
        if r["kind"] == "RayJob":
            r["spec"]["entrypoint"] = r["spec"]["entrypoint"].replace("download=false", "download=true")


def staged_datasets_not_named(rs):
    _named(rs, "ConfigMap", "ray-env")["data"].pop("CALIB_DATASETS_URI")


REVIEW = [
    gcs_port_6380,
    dashboard_port_renamed,
    dshm_not_in_memory,
    object_store_larger_than_shm,
    wrong_node_selector_label,
    ray_policy_three_ports,
    service_target_port_typo,
    wrong_tracking_uri,
    worker_without_token,
    token_secret_key_typo,
    ray_version_mismatch,
    head_root_filesystem_writable,
    mlflow_open_to_namespace,
    gpu_workers_without_toleration,
    entrypoint_misspelled_field,
]
ISSUE_14 = [
    gfd_node_selector,
    no_db_migration,
    image_by_tag_only,
    no_ephemeral_storage,
    head_evictable,
    telemetry_on,
    datasets_in_empty_dir,
    namespace_in_overlay,
]
ISSUE_37 = [
    mlflow_served_without_tls,
    clients_trust_nothing,
    server_key_mounted_in_ray_pods,
    db_client_without_verify_full,
    db_ca_not_mounted_on_the_head,
]
ISSUE_44 = [entrypoint_downloads_without_egress, staged_datasets_not_named]
MUTATIONS = REVIEW + ISSUE_14 + ISSUE_37 + ISSUE_44


def test_the_review_list_has_fifteen_mistakes():
    assert len(REVIEW) == 15 and len({m.__name__ for m in MUTATIONS}) == len(MUTATIONS)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_unmutated_overlays_pass_every_check(overlay):
    assert dc.run_checks(dr.render(OVERLAYS[overlay])) == {}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_planted_mistake_is_caught(overlay, mutation):
    resources = copy.deepcopy(dr.render(OVERLAYS[overlay]))
    before = copy.deepcopy(resources)
    mutation(resources)
    assert resources != before, f"{mutation.__name__} changed nothing"
    found = dc.run_checks(resources)
    assert found, f"{overlay}: no deploy check noticed {mutation.__name__}"


def _postgres(rs):
    return _named(rs, "StatefulSet", "postgres")["spec"]["template"]["spec"]


def postgres_without_ssl(rs):
    args = _postgres(rs)["containers"][0]["args"]
    args[args.index("ssl=on")] = "ssl=off"


def postgres_admits_plain_connections(rs):
    hba = next(r for r in rs if r["kind"] == "ConfigMap" and r["metadata"]["name"].startswith("postgres-hba"))
    hba["data"]["pg_hba.conf"] += "host all all all scram-sha-256\n"


def postgres_key_from_another_secret(rs):
    v = next(v for v in _postgres(rs)["volumes"] if v["name"] == "tls")
    v["secret"]["secretName"] = "mlflow-tls"


@pytest.mark.parametrize(
    "mutation", [postgres_without_ssl, postgres_admits_plain_connections, postgres_key_from_another_secret]
)
def test_the_dev_databases_tls_mistakes_are_caught(mutation):
    """The in-cluster PostgreSQL is the dev overlay's alone (gpu-cluster's database is external)."""
    resources = copy.deepcopy(dr.render(OVERLAYS["dev"]))
    mutation(resources)
    assert dc.check_postgres_tls(resources), mutation.__name__

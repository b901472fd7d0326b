"""Operations (issue #37 item 4, the manifests): pod priorities from deploy/cluster, PodDisruptionBudgets for
MLflow and PostgreSQL, the Ray log shipper (its mounts in the pods as KubeRay builds them, and the script
run against a local directory), the monitoring component (PodMonitors selecting the pods KubeRay builds,
Prometheus admitted to the metrics port and nothing else) and the GCS fault tolerance component."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import deploy_checks as dc
from tests import deploy_render as dr
from tests.containers import kuberay as kr

OVERLAYS = dr.overlay_dirs()


def built_pod(obj: dict, node_type: str) -> dict:
    """The pod KubeRay builds (tests/containers/kuberay.py), for its labels, ports, mounts and env."""
    return kr.build_pod(yaml.safe_load(yaml.safe_dump(obj)), node_type, "c-abcde")


IDS = [p.name for p in OVERLAYS]
EXAMPLES = dr.DEPLOY / "examples"
SHIPPER = dr.DEPLOY / "base" / "ray" / "ship_ray_logs.py"
SERVICES = {("Deployment", "mlflow"), ("StatefulSet", "postgres"), ("StatefulSet", "minio")}


def _cluster_objects() -> list[dict]:
    return dr.render(dr.DEPLOY / "cluster")


# ---------------------------------------------------------------------------------------------- priorities


def test_cluster_layer_holds_the_two_priority_classes_and_nothing_namespaced():
    objs = _cluster_objects()
    assert all(o["kind"] in dr.CLUSTER_SCOPED and "namespace" not in o["metadata"] for o in objs)
    classes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PriorityClass"}
    assert set(classes) == {"calib-sweeps-services", "calib-sweeps-batch"}
    batch, services = classes["calib-sweeps-batch"], classes["calib-sweeps-services"]
    # a sweep waits for capacity and never evicts another team's pods; the services outrank it
    assert batch["preemptionPolicy"] == "Never" and batch["value"] < 0 < services["value"]
    assert not batch.get("globalDefault") and not services.get("globalDefault")
    assert dc.check_schemas(objs) == []


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_every_pod_names_a_priority_class_of_the_cluster_layer(overlay):
    classes = {o["metadata"]["name"] for o in _cluster_objects() if o["kind"] == "PriorityClass"}
    restore = yaml.safe_load((dr.DEPLOY / "restore" / "mlflow-db-restore-job.yaml").read_text())
    seen = 0
    for r in [*dr.render(overlay), restore]:
        for where, spec in dr.pod_specs(r):
            name = spec.get("priorityClassName")
            assert name in classes, f"{where}: priorityClassName {name!r}"
            want = (
                "calib-sweeps-services" if (r["kind"], r["metadata"].get("name")) in SERVICES else "calib-sweeps-batch"
            )
            assert name == want, where
            seen += 1
    assert seen >= 6


# ---------------------------------------------------------------------------------------------- disruption


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_disruption_budgets_cover_mlflow_and_the_in_cluster_postgres(overlay):
    resources = dr.render(overlay)
    pdbs = {r["metadata"]["name"]: r for r in resources if r["kind"] == "PodDisruptionBudget"}
    workloads = {r["metadata"]["name"]: r for r in resources if r["kind"] in ("Deployment", "StatefulSet")}
    want = {"mlflow"} | ({"postgres"} if "postgres" in workloads else set())
    assert set(pdbs) == want
    for name, pdb in pdbs.items():
        labels = workloads[name]["spec"]["template"]["metadata"]["labels"]
        assert dc.selects(pdb["spec"]["selector"], labels), name
        # it selects that workload's pods only
        others = [w for n, w in workloads.items() if n != name]
        assert not any(dc.selects(pdb["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"]) for w in others)
        # never blocking a drain of the one replica (issue #46; tests/unit/deploy/test_rollout_portability.py)
        assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert "minAvailable" not in pdb["spec"]
    assert dc.check_schemas(list(pdbs.values())) == []


# ---------------------------------------------------------------------------------------------- Ray logs


def _volume_at(container: dict, path: str) -> tuple[str, str] | None:
    """(volume, sub-path) the container sees at PATH: the mount with the longest matching prefix."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (best is None or len(mp) > len(best[2])):
            best = (m["name"], path[len(mp) :], mp)
    return None if best is None else best[:2]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_log_shipper_sees_rays_session_directory_in_every_ray_pod(overlay):
    resources = dr.render(overlay)
    config = {r["metadata"]["name"]: r for r in resources if r["kind"] == "ConfigMap"}
    assert config["ray-logs-shipper"]["data"]["ship_ray_logs.py"] == SHIPPER.read_text()
    logs_uri = config["ray-env"]["data"]["RAY_LOGS_URI"]
    job = next(r for r in resources if r["kind"] == "RayJob")
    storage = dc.entrypoint_options(job)["--storage-path"][0]
    assert logs_uri.startswith("s3://") and logs_uri.split("/")[2] == storage.split("/")[2], (logs_uri, storage)
    pods = 0
    for obj in (r for r in resources if r["kind"] in ("RayJob", "RayCluster")):
        for node_type in ("head", "worker"):
            pod = kr.build_pod(obj, node_type, "calib-sweep-abcde")
            containers = {c["name"]: c for c in pod["spec"]["containers"]}
            ray, shipper = pod["spec"]["containers"][0], containers["ray-logs"]
            assert ray["name"] in ("ray-head", "ray-worker")
            assert _volume_at(shipper, "/tmp/ray") == _volume_at(ray, "/tmp/ray") is not None, (obj["kind"], node_type)
            for m in shipper["volumeMounts"]:
                assert m.get("readOnly") is True, m  # it reads, never writes, what Ray writes
            assert shipper["command"] == ["python", "/opt/calib/ship_ray_logs.py"]
            env = {e["name"]: e for e in shipper["env"]}
            assert env["RAY_CLUSTER"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['ray.io/cluster']"
            assert {
                e["secretKeyRef"]["name"] for e in (v.get("valueFrom", {}) for v in env.values()) if "secretKeyRef" in e
            } == {
                "tune-storage-s3",
                "ray-auth-token",
            }
            vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "ray-logs-shipper")
            assert vol["configMap"]["name"] == "ray-logs-shipper"
            pods += 1
    assert pods == 4


def _session(root: Path) -> Path:
    logs = root / "ray" / "session_2026-12-02_10-00-00_000000_1" / "logs"
    logs.mkdir(parents=True)
    (root / "ray" / "session_latest").symlink_to(logs.parent)
    return logs


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_log_shipper_copies_new_and_changed_files_and_once_more_on_sigterm(tmp_path):
    logs = _session(tmp_path)
    (logs / "raylet.out").write_text("started\n")
    (logs / "old").mkdir()
    (logs / "old" / "worker-1.err").write_text("trace\n")
    dest = tmp_path / "store"
    env = {
        **os.environ,
        "RAY_LOGS_URI": f"file://{dest}",
        "RAY_TMP": str(tmp_path / "ray"),
        "RAY_CLUSTER": "calib-sweep-abcde",
        "POD_NAME": "calib-sweep-abcde-head-x",
        "RAY_LOGS_INTERVAL": "0.3",
    }
    proc = subprocess.Popen(
        [sys.executable, str(SHIPPER)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out = dest / "calib-sweep-abcde" / "calib-sweep-abcde-head-x" / logs.parent.name
        _wait(lambda: (out / "raylet.out").exists() and (out / "old" / "worker-1.err").exists())
        assert (out / "raylet.out").read_text() == "started\n"
        with open(logs / "raylet.out", "a") as f:
            f.write("more\n")
        _wait(lambda: (out / "raylet.out").read_text() == "started\nmore\n")
        # the last lines before the pod stops: written, then SIGTERM at once (no interval passes)
        (logs / "raylet.out").write_text("started\nmore\nlast\n")
        (logs / "gcs_server.out").write_text("bye\n")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert (out / "raylet.out").read_text() == "started\nmore\nlast\n" and (
        out / "gcs_server.out"
    ).read_text() == "bye\n"
    # one copy per session (the session_latest link is not walked twice)
    assert sorted(p.name for p in (dest / "calib-sweep-abcde" / "calib-sweep-abcde-head-x").iterdir()) == [
        logs.parent.name
    ]


def test_log_shipper_without_a_destination_waits_and_stops_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_LOGS_URI"}
    proc = subprocess.Popen([sys.executable, str(SHIPPER)], env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "RAY_LOGS_URI is not set" in err


# ---------------------------------------------------------------------------------------------- monitoring

PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})


@pytest.fixture(scope="module")
def operations():
    return dr.render(EXAMPLES / "gpu-cluster-operations")


def test_operations_example_passes_every_check_and_adds_only_the_components(operations):
    # the components' objects land in the sweep's namespace too (a component's resources get the including
    # kustomization's namespace, not the overlay's below it)
    assert {r["metadata"].get("namespace") for r in operations if r["kind"] not in dr.CLUSTER_SCOPED} == {
        "calib-sweeps"
    }
    assert {k: v for k, v in dc.run_checks(operations).items() if v} == {}
    base = {dr.resource_id(r) for r in dr.render(dr.DEPLOY / "overlays" / "gpu-cluster")}
    added = {(r["kind"], r["metadata"]["name"]) for r in operations if dr.resource_id(r) not in base}
    # monitoring is the production overlay's own now (issue #46): the example adds GCS fault tolerance only
    assert added == {("NetworkPolicy", "ray-head-to-gcs-redis")}
    assert {("PodMonitor", "ray-head"), ("PodMonitor", "ray-workers"), ("PrometheusRule", "calib-sweeps-alerts")} <= {
        (r["kind"], r["metadata"]["name"]) for r in operations
    }


def test_pod_monitors_select_the_ray_pods_kuberay_builds_on_their_metrics_port(operations):
    monitors = {r["metadata"]["name"]: r for r in operations if r["kind"] == "PodMonitor"}
    for obj in (r for r in operations if r["kind"] in ("RayJob", "RayCluster")):
        for node_type, monitor in (("head", "ray-head"), ("worker", "ray-workers")):
            pod = built_pod(obj, node_type)
            labels = pod["metadata"]["labels"]
            chosen = [n for n, m in monitors.items() if dc.selects(m["spec"]["selector"], labels)]
            assert chosen == [monitor], (obj["kind"], node_type, chosen)
            ports = {p.get("name"): p["containerPort"] for p in pod["spec"]["containers"][0].get("ports", [])}
            want = {"metrics": 8080} | ({"as-metrics": 44217, "dash-metrics": 44227} if node_type == "head" else {})
            scraped = {ep["port"]: ports.get(ep["port"]) for ep in monitors[monitor]["spec"]["podMetricsEndpoints"]}
            assert scraped == want, (node_type, scraped)
    # nothing else of the namespace is scraped by them
    for r in operations:
        if r["kind"] in ("Deployment", "StatefulSet"):
            labels = r["spec"]["template"]["metadata"]["labels"]
            assert not any(dc.selects(m["spec"]["selector"], labels) for m in monitors.values())
    for m in (r for r in operations if r["kind"] in ("PodMonitor", "ServiceMonitor")):
        assert m["metadata"]["labels"]["release"] == "prometheus" and m["metadata"]["namespace"] == "calib-sweeps"


def test_prometheus_reaches_the_metrics_port_and_nothing_else(operations):
    policies = [r for r in operations if r["kind"] == "NetworkPolicy"]
    ns = dr.namespace_of(operations)
    job = next(r for r in operations if r["kind"] == "RayJob")
    recorded = json.loads((dr.REPO_ROOT / "tests" / "containers" / "ray_ports.json").read_text())
    recorded = {int(p) for role in ("head", "worker") for p in recorded[role]["fixed"]}
    for node_type in ("head", "worker"):
        labels = built_pod(job, node_type)["metadata"]["labels"]
        # Ray's metrics everywhere; the autoscaler's (44217) and the dashboard's (44227) on the head only
        scraped = {8080} | ({44217, 44227} if node_type == "head" else set())
        for port in scraped:
            assert dc.policy_allows(policies, ns, PROMETHEUS, labels, port), (node_type, port)
        for port in recorded | {6379, 8265, 10001, 52365, 44217, 44227}:
            if port not in scraped:
                assert not dc.policy_allows(policies, ns, PROMETHEUS, labels, port), (node_type, port)
        # only Prometheus of the monitoring namespace, not any pod there, nor Prometheus elsewhere
        assert not dc.policy_allows(policies, ns, ("monitoring", {"app": "grafana"}), labels, 8080)
        assert not dc.policy_allows(policies, ns, ("other", PROMETHEUS[1]), labels, 8080)
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    assert dc.policy_allows(policies, ns, PROMETHEUS, operator, 8080)
    mlflow = next(r for r in operations if r["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not dc.policy_allows(policies, ns, PROMETHEUS, mlflow, 5000)
    # without the component (dev), Prometheus reaches nothing
    plain = [r for r in dr.render(dr.DEPLOY / "overlays" / "dev") if r["kind"] == "NetworkPolicy"]
    head = built_pod(job, "head")["metadata"]["labels"]
    assert not dc.policy_allows(plain, ns, PROMETHEUS, head, 8080)


# ---------------------------------------------------------------------------------------------- GCS FT


def test_gcs_fault_tolerance_uses_the_redis_secret_and_only_the_head_reaches_redis(operations):
    secret = yaml.safe_load((dr.DEPLOY / "components" / "gcs-ft" / "secrets.example.yaml").read_text())
    assert secret["metadata"]["name"] == "ray-gcs-redis" and "password" in secret["stringData"]
    for obj in (r for r in operations if r["kind"] in ("RayJob", "RayCluster")):
        ft = dr.ray_cluster_spec(obj)["gcsFaultToleranceOptions"]
        assert re.fullmatch(r"[\w.-]+:6379", ft["redisAddress"])
        assert ft["redisPassword"]["valueFrom"]["secretKeyRef"] == {"name": "ray-gcs-redis", "key": "password"}
        assert "value" not in ft["redisPassword"]  # never a literal password in a manifest
    assert dc.check_schemas([r for r in operations if r["kind"] in ("RayJob", "RayCluster")]) == []
    policies = [r for r in operations if r["kind"] == "NetworkPolicy"]
    ns = dr.namespace_of(operations)
    job = next(r for r in operations if r["kind"] == "RayJob")
    head = built_pod(job, "head")["metadata"]["labels"]
    worker = built_pod(job, "worker")["metadata"]["labels"]
    assert dc.policy_allows_egress(policies, ns, head, ("ip", "10.1.2.3"), 6379)
    assert not dc.policy_allows_egress(policies, ns, worker, ("ip", "10.1.2.3"), 6379)
    plain = [r for r in dr.render(dr.DEPLOY / "overlays" / "gpu-cluster") if r["kind"] == "NetworkPolicy"]
    assert not dc.policy_allows_egress(plain, ns, head, ("ip", "10.1.2.3"), 6379)


def test_kuberay_wires_the_head_to_redis_and_lets_the_workers_wait_for_a_restarted_gcs(operations):
    """What KubeRay's configureGCSFaultTolerance (ray-operator/controllers/ray/common/pod.go, Redis backend) adds,
    as tests/containers/kuberay.py translates it for the container test: the head's GCS stores its tables in
    Redis under the cluster's namespace, with the password from the Secret passed as --redis-password; the
    workers wait 600 s (not 60) for the GCS to come back."""
    job = next(r for r in operations if r["kind"] == "RayJob")
    head, worker = built_pod(job, "head"), built_pod(job, "worker")
    env = {e["name"]: e for e in head["spec"]["containers"][0]["env"]}
    ft = dr.ray_cluster_spec(job)["gcsFaultToleranceOptions"]
    assert env["RAY_REDIS_ADDRESS"]["value"] == ft["redisAddress"]
    assert env["REDIS_PASSWORD"]["valueFrom"] == ft["redisPassword"]["valueFrom"]
    assert env["RAY_external_storage_namespace"]["value"]
    assert "--redis-password=$REDIS_PASSWORD" in head["rayStartCommand"]
    assert head["metadata"]["annotations"]["ray.io/ft-enabled"] == "true"
    wenv = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert wenv["RAY_gcs_rpc_server_reconnect_timeout_s"] == "600"
    assert "RAY_REDIS_ADDRESS" not in wenv and "REDIS_PASSWORD" not in wenv  # only the head talks to Redis
    plain = built_pod(
        next(r for r in dr.render(dr.DEPLOY / "overlays" / "gpu-cluster") if r["kind"] == "RayJob"), "head"
    )
    assert "redis" not in plain["rayStartCommand"] and plain["metadata"]["annotations"]["ray.io/ft-enabled"] == "false"


def test_a_literal_redis_password_is_refused_by_the_schema(operations):
    job = next(r for r in operations if r["kind"] == "RayJob")
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["spec"]["rayClusterSpec"]["gcsFaultToleranceOptions"]["redisPasword"] = {"value": "x"}  # misspelt field
    assert dc.check_schemas([bad])

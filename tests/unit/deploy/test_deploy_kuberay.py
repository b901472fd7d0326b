"""tests/containers/kuberay.py, the translation of KubeRay's pod and submitter generation that the
container tests run: KubeRay's own unit-test expectations (ray-operator/controllers/ray/common/
pod_test.go TestGenerateRayStartCommand, job_test.go TestBuildJobSubmitCommandWithK8sJobMode) and
hand-checked commands for the rendered dev overlay."""

from __future__ import annotations

import shlex

import pytest

from tests import deploy_render as dr
from tests.containers import kuberay as kr

CLUSTER = "calib-sweep-abcde"  # a RayJob's cluster: <rayjob>-<5 random characters>
SVC = f"{CLUSTER}-head-svc.calib-sweeps.svc.cluster.local"


@pytest.fixture(scope="module")
def dev():
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    return {r["kind"]: r for r in resources if r["kind"] in ("RayJob", "RayCluster")}


# pod_test.go TestGenerateRayStartCommand (a selection), verbatim.
@pytest.mark.parametrize(
    ("node_type", "params", "limits", "expected"),
    [
        ("worker", {}, {"nvidia.com/gpu": "1"}, "ray start  --num-gpus=1 "),
        ("worker", {}, {"nvidia.com/mig-2g.32gb": "1"}, "ray start  --num-gpus=1 "),
        ("worker", {}, {"google.com/tpu": "4"}, "ray start  --resources='{\"TPU\":4}' "),
        ("head", {}, {"aws.amazon.com/neuroncore": "4"}, "ray start --head  --resources='{\"neuron_cores\":4}' "),
        (
            "head",
            {},
            {"aws.amazon.com/neuroncore": "4", "nvidia.com/gpu": "1"},
            "ray start --head  --num-gpus=1  --resources='{\"neuron_cores\":4}' ",
        ),
        (
            "head",
            {"resources": "'{\"custom_resource\":2}'"},
            {"aws.amazon.com/neuroncore": "4"},
            'ray start --head  --resources=\'{"custom_resource":2,"neuron_cores":4}\' ',
        ),
    ],
)
def test_ray_start_command_matches_kuberay_unit_tests(node_type, params, limits, expected):
    assert kr.generate_ray_start_command(node_type, dict(params), {"limits": limits}) == expected


def test_submit_command_matches_kuberay_unit_test():
    """job_test.go TestBuildJobSubmitCommandWithK8sJobMode (its rayJobTemplate's fields)."""
    job = {
        "kind": "RayJob",
        "metadata": {"name": "x"},
        "spec": {
            "entrypoint": "echo no quote 'single quote' \"double quote\"",
            "runtimeEnvYAML": "test: test",
            "metadata": {"testKey": "testValue"},
            "entrypointNumCpus": 1,
            "entrypointNumGpus": 0.5,
            "entrypointResources": '{"Custom_1": 1, "Custom_2": 5.5}',
        },
    }
    health = kr.BASE_PYTHON_HEALTH_COMMAND % ("http://127.0.0.1:8265/api/gcs_healthz", 10)
    expected = [
        "until",
        health,
        ">/dev/null",
        "2>&1",
        ";",
        "do",
        "echo",
        '"Waiting for Ray Dashboard GCS to become healthy at http://127.0.0.1:8265 ..."',
        ";",
        "sleep",
        "2",
        ";",
        "done",
        ";",
        "if",
        "!",
        "ray",
        "job",
        "status",
        "--address",
        "http://127.0.0.1:8265",
        "testJobId",
        ">/dev/null",
        "2>&1",
        ";",
        "then",
        "ray",
        "job",
        "submit",
        "--address",
        "http://127.0.0.1:8265",
        "--no-wait",
        "--runtime-env-json",
        '"{\\"test\\":\\"test\\"}"',
        "--metadata-json",
        '"{\\"testKey\\":\\"testValue\\"}"',
        "--submission-id",
        "testJobId",
        "--entrypoint-num-cpus",
        "1.000000",
        "--entrypoint-num-gpus",
        "0.500000",
        "--entrypoint-resources",
        '"{\\"Custom_1\\": 1, \\"Custom_2\\": 5.5}"',
        "--",
        "echo no quote 'single quote' \"double quote\"",
        ";",
        "fi",
        ";",
        "ray",
        "job",
        "logs",
        "--address",
        "http://127.0.0.1:8265",
        "--follow",
        "testJobId",
    ]
    assert kr.submit_command(job, "127.0.0.1:8265", "testJobId") == expected


def test_dev_rayjob_head_pod(dev):
    pod = kr.build_pod(dev["RayJob"], "head", CLUSTER)
    # rayStartParams (dashboard-host, num-cpus 0, num-gpus 0, object store) + KubeRay's: --block,
    # the agent and metrics ports, --memory from the 8Gi limit, --no-monitor (in-tree autoscaling).
    assert pod["rayStartCommand"] == (
        "ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  "
        "--memory=8589934592  --metrics-export-port=8080  --no-monitor  --num-cpus=0  --num-gpus=0  "
        "--object-store-memory=2000000000 "
    )
    ray, shipper, autoscaler = pod["spec"]["containers"]  # KubeRay appends its autoscaler after ours
    assert shipper["name"] == "ray-logs"
    assert ray["command"] == ["/bin/bash", "-c", "--"]
    assert ray["args"] == ["ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; " + pod["rayStartCommand"]]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in ray["env"]}
    assert env["RAY_ADDRESS"] == "127.0.0.1:6379" and env["RAY_PORT"] == "6379"
    assert env["KUBERAY_GEN_RAY_START_CMD"] == pod["rayStartCommand"]
    assert env["RAY_USAGE_STATS_KUBERAY_IN_USE"] == "1"
    assert env["RAY_USAGE_STATS_EXTRA_TAGS"] == "kuberay_version=nightly;kuberay_crd=RayJob"
    assert env["RAY_CLUSTER_NAME"] == {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}
    assert "FQ_RAY_IP" not in env
    # The template's own token entry wins (KubeRay adds one only when missing): one RAY_AUTH_TOKEN.
    assert [e["name"] for e in ray["env"]].count("RAY_AUTH_TOKEN") == 1
    assert env["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"key": "auth_token", "name": "ray-auth-token"}}
    assert ray["readinessProbe"]["httpGet"] == {"path": "/api/healthz", "port": 52365}
    assert any(m["mountPath"] == "/tmp/ray" for m in ray["volumeMounts"])  # shared with the autoscaler
    # one volume at /tmp/ray for Ray, its autoscaler and the log shipper (ours: KubeRay adds none of its own)
    for c in (ray, shipper, autoscaler):
        assert [m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp/ray"] == ["ray-logs"], c["name"]
    assert [v["name"] for v in pod["spec"]["volumes"]].count("ray-logs") == 1
    assert autoscaler["args"][0].startswith("ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME)")
    assert {"name": "RAY_AUTH_MODE", "value": "token"} in autoscaler["env"]
    labels = pod["metadata"]["labels"]
    assert labels["ray.io/cluster"] == CLUSTER and labels["ray.io/node-type"] == "head"
    assert labels["ray.io/group"] == "headgroup" and labels["calib-sweeps/ray-node"] == "true"


def test_dev_rayjob_worker_pod(dev):
    pod = kr.build_pod(dev["RayJob"], "worker", CLUSTER)
    # --num-cpus 4 and --memory 24Gi from the limits, --num-gpus 1 from nvidia.com/gpu, --address of
    # the RayCluster's head Service.
    assert pod["rayStartCommand"] == (
        f"ray start  --address={SVC}:6379  --block  --dashboard-agent-listen-port=52365  "
        "--memory=25769803776  --metrics-export-port=8080  --num-cpus=4  --num-gpus=1  "
        "--object-store-memory=4000000000 "
    )
    ray = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in ray["env"]}
    assert env["FQ_RAY_IP"] == SVC and env["RAY_IP"] == f"{CLUSTER}-head-svc"
    assert env["RAY_ADDRESS"] == f"{SVC}:6379"
    assert "RAY_USAGE_STATS_EXTRA_TAGS" not in env
    init = pod["spec"]["initContainers"][-1]
    assert init["name"] == "wait-gcs-ready" and init["command"] == ["/bin/bash", "-c", "--"]
    assert f"ray health-check --address {SVC}:6379" in init["args"][0]
    assert {"name": "FQ_RAY_IP", "value": SVC} in init["env"]
    assert init["resources"]["limits"] == {"cpu": "200m", "memory": "256Mi"}
    assert "envFrom" not in init  # a copy of the Ray container's env list only
    assert pod["metadata"]["labels"]["ray.io/group"] == "gpu"


def test_dev_rayjob_submitter(dev):
    job = dev["RayJob"]
    pod = kr.submitter_pod(job, CLUSTER, "calib-sweep-xyz12")
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["/bin/bash", "-ce", "--"]
    script = c["args"][0]
    url = f"http://{SVC}:8265"
    health = f"until python -c \"import urllib.request; r=urllib.request.urlopen('{url}/api/gcs_healthz'"
    assert script.startswith(health)
    assert f"if ! ray job status --address {url} calib-sweep-xyz12 >/dev/null 2>&1 ; then " in script
    assert f"ray job submit --address {url} --no-wait --submission-id calib-sweep-xyz12 -- python " in script
    assert script.endswith(f"; fi ; ray job logs --address {url} --follow calib-sweep-xyz12")
    # The entrypoint goes into the script as it is written (KubeRay does not quote it).
    assert " ".join(job["spec"]["entrypoint"].split()) in script
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["RAY_DASHBOARD_ADDRESS"] == f"{SVC}:8265" and env["RAY_JOB_SUBMISSION_ID"] == "calib-sweep-xyz12"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"key": "auth_token", "name": "ray-auth-token"}}


def test_service_names_and_generated_names(dev):
    job, rc = dev["RayJob"], dev["RayCluster"]
    name = kr.cluster_name(job)
    assert name.startswith("calib-sweep-") and len(name) == len("calib-sweep-") + 5
    assert kr.cluster_name(rc) == "calib-interactive"
    assert kr.head_service_name("calib-interactive", kr.cluster_spec(rc)) == "calib-interactive-head-svc"
    assert kr.rayjob_head_service_name(job) == "calib-sweep-head-svc"
    assert kr.dashboard_url(CLUSTER, kr.cluster_spec(job), "calib-sweeps") == f"{SVC}:8265"


def test_interactive_raycluster_pods(dev):
    rc = dev["RayCluster"]
    head = kr.build_pod(rc, "head", "calib-interactive")
    assert "--head" in head["rayStartCommand"] and "--block" in head["rayStartCommand"]
    worker = kr.build_pod(rc, "worker", "calib-interactive")
    assert "--address=calib-interactive-head-svc.calib-sweeps.svc.cluster.local:6379" in worker["rayStartCommand"]
    assert shlex.split(worker["spec"]["containers"][0]["args"][0])[:3] == [
        "ulimit",
        "-n",
        "${RAY_START_ULIMIT_OPEN_FILES:-65536};",
    ]

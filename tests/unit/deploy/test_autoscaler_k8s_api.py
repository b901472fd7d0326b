"""Ray's own KubeRay autoscaler code (ray.autoscaler._private.kuberay, the code the autoscaler sidecar
runs) against the stand-in Kubernetes API (tests/containers/k8s_api.py) with each overlay's rendered
RayJob cluster: the autoscaling config it derives from our manifests (worker group, its resources and
bounds, the idle timeout), the pods it lists, and the RayCluster patches by which it scales a worker
group up and back down (replicas, workersToDelete, cleaned up once the pod is gone). It runs in a child
process: the provider reads the API's address from the environment when imported. No Ray cluster, no
containers: the container tier runs the sidecar itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests import deploy_render as dr
from tests.containers import kuberay as kr
from tests.containers.k8s_api import KubeAPI, PatchError, json_patch, merge_patch

PROVIDER = textwrap.dedent(
    """
    import json, sys
    from ray.autoscaler._private.kuberay import node_provider as kp
    from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, NODE_KIND_WORKER

    sa, name, ns, group, worker = sys.argv[1:6]
    kp.IN_CLUSTER_TOKEN_PATH, kp.IN_CLUSTER_CA_CERT_PATH = sa + "/token", sa + "/ca.crt"
    config = AutoscalingConfigProducer(name, ns)()
    provider = kp.KubeRayNodeProvider(config["provider"], name)
    out = {"config": config, "before": provider.non_terminated_nodes({})}
    provider.create_node({}, {TAG_RAY_USER_NODE_TYPE: group, TAG_RAY_NODE_KIND: NODE_KIND_WORKER}, 1)
    provider.post_process()
    print(json.dumps(out), flush=True)
    input()  # the test registers the worker pod the operator would start
    out = {"listed": provider.non_terminated_nodes({})}
    out["worker_ip"] = provider.internal_ip(worker)
    provider.terminate_node(worker)
    provider.post_process()
    # the autoscaler's next update: the pod is still there, so it waits for the operator
    provider.non_terminated_nodes({})
    out["safe_while_listed"] = provider.safe_to_scale()
    print(json.dumps(out), flush=True)
    input()  # the test removes the pod, as the operator does
    out = {"after": provider.non_terminated_nodes({})}
    out["safe_after"] = provider.safe_to_scale()  # and clears workersToDelete
    print(json.dumps(out), flush=True)
    """
)


def _raycluster(overlay) -> tuple[dict, str]:
    rayjob = next(r for r in dr.render(overlay) if r["kind"] == "RayJob")
    cluster = kr.raycluster_for(rayjob, suffix="abcde")
    return cluster, cluster["metadata"]["name"]


@pytest.mark.parametrize("overlay", dr.overlay_dirs(), ids=lambda p: p.name)
def test_ray_autoscaler_scales_our_worker_group_up_and_down_through_the_api(overlay, tmp_path):
    cluster, name = _raycluster(overlay)
    ns = cluster["metadata"]["namespace"]
    group = cluster["spec"]["workerGroupSpecs"][0]
    gname = group["groupName"]
    head = f"{name}-head"
    worker = f"{name}-{gname}-worker-x1y2z"
    labels = {"ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": kr.HEAD_GROUP_LABEL_VALUE}
    with KubeAPI(cluster, tmp_path, hosts=["127.0.0.1"], bind="127.0.0.1") as api:
        api.add_pod(head, labels, "10.0.0.2")
        env = {
            **os.environ,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT_HTTPS": str(api.port),
            "RAY_HEAD_POD_NAME": head,
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", PROVIDER, str(api.service_account.folder), name, ns, gname, worker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            first = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read()[-3000:])
            # the config Ray derives from our manifests: the group's bounds, resources and idle timeout
            types = first["config"]["available_node_types"]
            assert set(types) == {"headgroup", gname}
            assert types["headgroup"]["resources"].get("CPU", 0) == 0  # the head runs no trials
            w = types[gname]
            assert (w["min_workers"], w["max_workers"]) == (group["minReplicas"], group["maxReplicas"])
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert w["resources"]["CPU"] == kr.quantity_value(limits["cpu"])
            assert w["resources"].get("GPU", 0) == int(limits.get("nvidia.com/gpu", 0))
            idle = dr.ray_cluster_spec({"kind": "RayCluster", "spec": cluster["spec"]})["autoscalerOptions"]
            assert first["config"]["idle_timeout_minutes"] == pytest.approx(idle["idleTimeoutSeconds"] / 60)
            assert first["before"] == [head]
            # scale-up: the replicas of our group, by a JSON patch on the RayCluster
            assert api.raycluster()["spec"]["workerGroupSpecs"][0]["replicas"] == group.get("replicas", 0) + 1
            api.add_pod(worker, {**labels, "ray.io/node-type": "worker", "ray.io/group": gname}, "10.0.0.3")
            proc.stdin.write("\n")
            proc.stdin.flush()
            second = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read()[-3000:])
            assert sorted(second["listed"]) == sorted([head, worker]) and second["worker_ip"] == "10.0.0.3"
            assert second["safe_while_listed"] is False
            spec = api.raycluster()["spec"]["workerGroupSpecs"][0]
            assert spec["replicas"] == group.get("replicas", 0)
            assert spec["scaleStrategy"]["workersToDelete"] == [worker]
            api.remove_pod(worker)
            proc.stdin.write("\n")
            proc.stdin.flush()
            third = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read()[-3000:])
            assert third["after"] == [head] and third["safe_after"] is True
            assert api.raycluster()["spec"]["workerGroupSpecs"][0]["scaleStrategy"]["workersToDelete"] == []
        finally:
            proc.kill()
            proc.wait(timeout=30)
        assert {s for _, _, s in api.log} <= {200}, api.log  # every call the provider made was understood
        assert any(m == "PATCH" for m, _, _ in api.log)


def test_the_stand_in_refuses_a_wrong_token_and_a_stale_patch(tmp_path):
    import requests

    cluster, name = _raycluster(dr.overlay_dirs()[0])
    ns = cluster["metadata"]["namespace"]
    with KubeAPI(cluster, tmp_path, hosts=["127.0.0.1"], bind="127.0.0.1") as api:
        url = f"https://127.0.0.1:{api.port}/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}"
        ca = str(api.service_account.ca)
        assert requests.get(url, verify=ca, timeout=10).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer nope"}, verify=ca, timeout=10).status_code == 401
        ok = {"Authorization": f"Bearer {api.service_account.token}"}
        version = requests.get(url, headers=ok, verify=ca, timeout=10).json()["metadata"]["resourceVersion"]
        stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}]
        r = requests.patch(url, json=stale, headers={**ok, "Content-Type": "application/json-patch+json"}, verify=ca)
        assert r.status_code == 422 and api.raycluster()["metadata"]["resourceVersion"] == version
        with pytest.raises(requests.exceptions.SSLError):  # the server's certificate is the stand-in CA's only
            requests.get(url, headers=ok, timeout=10)


def test_json_and_merge_patch_follow_the_rfcs():
    doc = {"a": {"b": [1, 2]}, "c": 1}
    assert json_patch(doc, [{"op": "add", "path": "/a/b/-", "value": 3}])["a"]["b"] == [1, 2, 3]
    assert json_patch(doc, [{"op": "replace", "path": "/a/b/0", "value": 9}])["a"]["b"] == [9, 2]
    assert json_patch(doc, [{"op": "remove", "path": "/c"}]) == {"a": {"b": [1, 2]}}
    assert doc == {"a": {"b": [1, 2]}, "c": 1}  # a copy is patched
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "test", "path": "/c", "value": 2}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "replace", "path": "/missing", "value": 2}])
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}

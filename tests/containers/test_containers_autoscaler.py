"""Ray's autoscaler sidecar, as KubeRay builds it from the dev RayJob, scales the cluster from zero workers and
back (`make test-containers`). There is no Kubernetes here, so the sidecar talks to a stand-in of the
Kubernetes API (tests/containers/k8s_api.py: the RayCluster and pod calls of Ray's KubeRay node provider,
over TLS, with the service-account token projected into the sidecar only), and the test plays KubeRay's
operator: it serves the RayCluster the operator would create for the RayJob, starts a worker pod (its
wait-gcs init container, then `ray start`, as tests/containers/kuberay.py generates them) when the
autoscaler raises the group's replicas, and removes the pods the autoscaler names in workersToDelete.

The head starts with no worker (the group's replicas: 0) and 0 CPUs, so the sweep's trials cannot run until
the autoscaler asks for a worker; after the sweep the idle worker must go. Substitutions: the sweep as in
tests/containers/test_containers_ray.py (demo config, 2 trials of 2 epochs, no GPU per trial), and the idle timeout
shortened from the manifests' 120 s to 30 s to keep the test short. The sidecar shares the head container's
network namespace, as the containers of one pod do."""

from __future__ import annotations

import json
import shlex
import threading
import time
from types import SimpleNamespace

import pytest

from tests.containers import kuberay as kr
from tests.containers.fixtures import artifacts_dir, built_images, http, stack  # noqa: F401
from tests.containers.harness import podman
from tests.containers.k8s_api import KubeAPI
from tests.containers.test_containers_ray import _submit

pytestmark = pytest.mark.container
IDLE_TIMEOUT_S = 30
MODEL = "calibrated-classifier-autoscaled"


def _ip(container: str, network: str) -> str:
    fmt = "{{(index .NetworkSettings.Networks " + json.dumps(network) + ").IPAddress}}"
    return podman("inspect", "--format", fmt, container).stdout.strip()


def _gateway(network: str) -> str:
    out = podman("network", "inspect", "--format", "{{range .Subnets}}{{.Gateway}} {{end}}", network).stdout
    return out.split()[0]


class Operator:
    """KubeRay's part, polled: worker pods follow the RayCluster's replicas and workersToDelete."""

    def __init__(self, cluster, api: KubeAPI, job: dict, name: str, ns: str) -> None:
        self.cluster, self.api, self.job, self.name, self.ns = cluster, api, job, name, ns
        self.workers: dict[str, str] = {}  # pod name -> container name
        self.events: list[tuple[float, str, str]] = []  # (time.time(), "up" | "down", pod)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Operator:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        for container in list(self.workers.values()):
            self.cluster.stop(container)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as exc:  # recorded; the test fails on it
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(1.0)

    def _reconcile(self) -> None:
        group = self.api.raycluster()["spec"]["workerGroupSpecs"][0]
        delete = set((group.get("scaleStrategy") or {}).get("workersToDelete") or [])
        for pod in [p for p in self.workers if p in delete]:
            self.cluster.stop(self.workers.pop(pod))
            self.api.remove_pod(pod)
            self.events.append((time.time(), "down", pod))
        while len(self.workers) < int(group.get("replicas") or 0) and not self._stop.is_set():
            template = kr.build_pod(self.job, "worker", self.name)
            pod = kr.pod_name(self.name, "worker", group["groupName"])
            names = self.cluster.run_pod(
                pod, template, containers=["ray-worker"], fields=kr.pod_fields(template, pod, self.ns)
            )
            self.workers[pod] = names["ray-worker"]
            self.api.add_pod(pod, template["metadata"]["labels"], _ip(names["ray-worker"], self.cluster.network))
            self.events.append((time.time(), "up", pod))


@pytest.fixture(scope="module")
def autoscaled(stack, tmp_path_factory):
    cluster = stack.cluster
    job = json.loads(json.dumps(next(r for r in stack.resources if r["kind"] == "RayJob")))
    # a sweep and a registered model of its own: the session's stack also keeps those of
    # tests/containers/test_containers_ray.py, whose champion alias must stay that sweep's
    words = shlex.split(job["spec"]["entrypoint"])
    words[words.index("--name") + 1] += "-autoscaled"
    words += ["--set", f"tracking.registered_model={MODEL}"]
    job["spec"]["entrypoint"] = shlex.join(words)
    spec = kr.cluster_spec(job)
    assert spec["workerGroupSpecs"][0].get("replicas", 0) == 0, "the dev RayJob starts without workers"
    spec["autoscalerOptions"]["idleTimeoutSeconds"] = IDLE_TIMEOUT_S
    ns = job["metadata"]["namespace"]
    raycluster = kr.raycluster_for(job)
    name = raycluster["metadata"]["name"]
    head = kr.build_pod(job, "head", name)
    head_pod = kr.pod_name(name, "head")
    aliases = [
        *cluster.dns_names(kr.head_service_name(name, spec)),
        *cluster.dns_names(kr.rayjob_head_service_name(job)),
    ]
    gateway = _gateway(cluster.network)
    logs = artifacts_dir("autoscaler")
    with KubeAPI(raycluster, tmp_path_factory.mktemp("k8s-api"), hosts=[gateway]) as api:
        cluster.service_account = api.service_account.folder
        started: list[str] = []
        try:
            fields = kr.pod_fields(head, head_pod, ns)
            names = cluster.run_pod(head_pod, head, containers=["ray-head"], aliases=aliases, fields=fields)
            started.append(names["ray-head"])
            cluster.wait_ready(names["ray-head"], head["spec"]["containers"][0], timeout=300)
            api.add_pod(head_pod, head["metadata"]["labels"], _ip(names["ray-head"], cluster.network))
            sidecar = next(c for c in head["spec"]["containers"] if c["name"] == "autoscaler")
            k8s_env = [
                {"name": "KUBERNETES_SERVICE_HOST", "value": gateway},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
                {"name": "KUBERNETES_SERVICE_PORT_HTTPS", "value": str(api.port)},
            ]
            started.append(
                cluster.run_container(
                    head_pod,
                    head["spec"],
                    sidecar,
                    labels={},
                    detach=True,
                    extra_env=k8s_env,
                    fields=fields,
                    share_network_of=names["ray-head"],
                )
            )
            with Operator(cluster, api, job, name, ns) as operator:
                yield SimpleNamespace(
                    cluster=cluster, job=job, name=name, ns=ns, api=api, operator=operator, logs=logs,
                    head=names["ray-head"], autoscaler=started[-1],
                )  # fmt: skip
        finally:
            for n in started:
                (logs / f"{n.rsplit('-', 1)[0]}.log").write_text(cluster.logs(n))
            (logs / "api-requests.json").write_text(json.dumps(api.log[-500:], indent=0))
            (logs / "raycluster-patches.json").write_text(json.dumps(api.patches, indent=1))
            for n in started:
                cluster.stop(n)
            cluster.service_account = None


def _trial_end_times(stack, sweep: str) -> list[float]:
    """When the sweep's trial runs ended (s since the epoch), from the stack's MLflow."""
    import requests

    from sweeps.contract import ROLE_TRIAL, TAG_ROLE, TAG_SWEEP

    base = f"{stack.url}/api/2.0/mlflow"
    alias = requests.get(
        f"{base}/registered-models/alias", params={"name": MODEL, "alias": "champion"},
        auth=stack.auth, timeout=30,
    ).json()  # fmt: skip
    run = requests.get(
        f"{base}/runs/get", params={"run_id": alias["model_version"]["run_id"]}, auth=stack.auth, timeout=30
    ).json()["run"]
    flt = f"tags.`{TAG_SWEEP}` = '{sweep}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'"
    found = requests.post(
        f"{base}/runs/search",
        json={"experiment_ids": [run["info"]["experiment_id"]], "filter": flt, "max_results": 100},
        auth=stack.auth,
        timeout=30,
    ).json()
    return [int(r["info"]["end_time"]) / 1000 for r in found.get("runs", [])]


def test_the_autoscaler_adds_a_worker_for_the_sweep_and_removes_it_when_idle(autoscaled, stack):
    a = autoscaled
    time.sleep(15)  # the autoscaler is up and sees a cluster with nothing to do
    assert a.operator.events == [], "no worker before any demand"
    assert a.api.raycluster()["spec"]["workerGroupSpecs"][0].get("replicas", 0) == 0
    jobid = kr.job_id(a.job)
    t0 = time.time()
    proc = _submit(a, jobid, timeout=1200)
    out = proc.stdout + proc.stderr
    (a.logs / "submitter.log").write_text(out)
    assert proc.returncode == 0, out[-5000:]
    assert f"Registered: models:/{MODEL}@champion" in out, out[-3000:]
    ups = [e for e in a.operator.events if e[1] == "up"]
    assert ups and ups[0][0] > t0, a.operator.events  # raised by the sweep's demand
    assert len(ups) == 1, "maxReplicas is 1"
    words = shlex.split(a.job["spec"]["entrypoint"])
    ends = _trial_end_times(stack, words[words.index("--name") + 1])
    assert len(ends) == 2 and all(ups[0][0] < e for e in ends), (ends, a.operator.events)  # trials ran after it
    # the idle worker goes once it has been idle for the idle timeout (the autoscaler updates every ~5 s)
    deadline = max(ends) + IDLE_TIMEOUT_S + 150
    while time.time() < deadline and not any(e[1] == "down" for e in a.operator.events):
        time.sleep(3)
    downs = [e for e in a.operator.events if e[1] == "down"]
    timeline = [(round(t - t0, 1), k, p) for t, k, p in a.operator.events] + [
        (round(e - t0, 1), "trial run ended", "") for e in ends
    ]
    (a.logs / "events.json").write_text(json.dumps(sorted(timeline), indent=0))
    assert downs and downs[0][2] == ups[0][2], timeline
    idle = downs[0][0] - max(ends)
    assert IDLE_TIMEOUT_S - 5 <= idle <= IDLE_TIMEOUT_S + 60, f"removed {idle:.0f} s after the last trial: {timeline}"
    group = a.api.raycluster()["spec"]["workerGroupSpecs"][0]
    assert group.get("replicas") == 0 and all("-head-" in p for p in a.api.pods()), (group, a.api.pods())
    assert a.operator.errors == [], a.operator.errors
    # every API call the sidecar made was authorised and understood
    assert {s for _, _, s in a.api.log} <= {200}, [x for x in a.api.log if x[2] != 200][:5]
    status, _ = http(f"{stack.url}/health")
    assert status == 200

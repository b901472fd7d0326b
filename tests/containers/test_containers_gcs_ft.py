"""GCS fault tolerance (deploy/components/gcs-ft) in containers (`make test-containers`, issue #37 item 4): the dev
RayJob's cluster rendered with the component, run as KubeRay runs it (tests/containers/kuberay.py translates the
Redis wiring KubeRay adds: RAY_REDIS_ADDRESS, REDIS_PASSWORD and --redis-password on the head, a 600 s GCS
reconnect timeout on the workers) beside a Redis stand-in, on the MLflow stack's network.

The head is killed (SIGKILL: the GCS and the sweep's driver with it) while trials run. What a Kubernetes cluster
then does, done by hand: the kubelet restarts the head container (same pod, same Service), whose GCS reloads
the cluster from Redis, and the worker, which waited for it, is still its node; the RayJob's retry
(`backoffLimit`) submits the same entrypoint again, which carries --resume. Checked: the worker lived through the
restart (same Ray node id), the retried job completes, and the sweep's MLflow runs hold every trial exactly once
(one run per trial id, all FINISHED, the parent FINISHED, the champion registered).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.containers import kuberay as kr
from tests.containers.fixtures import artifacts_dir, built_images, stack  # noqa: F401
from tests.containers.harness import Cluster, podman
from tests.containers.images import REDIS_IMAGE
from tests.containers.test_containers_ray import substituted_entrypoint
from tests.sweep_helpers import sweep_runs

pytestmark = pytest.mark.container
REDIS = "gcs-redis"  # the Redis Service's name in the test network
MODEL = "calibrated-gcs-ft"
TRIALS = 3  # two run at once on the worker (4 CPUs, 2 per trial): the third starts after one ends
NODES = """
import json, ray
ray.init(address="auto", logging_level="ERROR")
print(json.dumps(sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])))
"""


def _rendered_with_gcs_ft(tmp_path) -> list[dict]:
    from tests import deploy_render as dr

    rel = lambda p: os.path.relpath(p, tmp_path)  # noqa: E731 - kustomize takes relative paths only
    overlay, component = dr.DEPLOY / "overlays" / "dev", dr.DEPLOY / "components" / "gcs-ft"
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kustomization.yaml").write_text(f"resources:\n  - {rel(overlay)}\ncomponents:\n  - {rel(component)}\n")
    return dr.render(tmp_path)


def _alive_nodes(cluster, head: str) -> list[list[str]]:
    out = cluster.exec(head, "python", "-c", NODES, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _client(stack, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", stack.auth[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", stack.auth[1])
    return MlflowClient(tracking_uri=stack.url)


def _wait_until(predicate, timeout: float, what: str, every: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def _sweep_entrypoint(job: dict, sweep: str) -> str:
    """The RayJob's entrypoint for sweep `sweep`: TRIALS trials long enough to be cut, a registered model of its own."""
    words = shlex.split(substituted_entrypoint(job["spec"]["entrypoint"]))
    words[words.index("--name") + 1] = sweep
    words[words.index("--num-samples") + 1] = str(TRIALS)
    words += ["--set", "run.train.epochs=10", "--set", "search.references=[]"]  # trials long enough to be cut
    # a registered model of its own: the stack's registry is shared, and this champion must not gate other tests'
    words += ["--set", f"tracking.registered_model={MODEL}"]
    entrypoint = shlex.join(words)
    assert "--resume" in words  # the RayJob's entrypoint: a retry continues the sweep
    return entrypoint


@dataclass(frozen=True)
class _RayPods:
    """The RayJob's cluster as KubeRay creates it: the job, its RayCluster's name and namespace, its two pods."""

    job: dict
    name: str
    ns: str
    head_tpl: dict
    worker_tpl: dict
    head_pod: str
    worker_pod: str
    aliases: list[str]


def _ray_pods(cluster: Cluster, job: dict, spec: dict) -> _RayPods:
    """The head's and the worker's pod templates and names, and the head's Service names."""
    ns, name = job["metadata"]["namespace"], kr.cluster_name(job)
    head_tpl, worker_tpl = kr.build_pod(job, "head", name), kr.build_pod(job, "worker", name)
    head_pod = kr.pod_name(name, "head")
    worker_pod = kr.pod_name(name, "worker", spec["workerGroupSpecs"][0]["groupName"])
    aliases = [
        *cluster.dns_names(kr.head_service_name(name, spec)),
        *cluster.dns_names(kr.rayjob_head_service_name(job)),
    ]
    return _RayPods(job, name, ns, head_tpl, worker_tpl, head_pod, worker_pod, aliases)


def _start_ray_pods(cluster: Cluster, pods: _RayPods, started: list[str]) -> tuple[str, str]:
    """The head, then the worker, each ready; (head container, worker container), each added to `started`."""
    head = cluster.run_pod(
        pods.head_pod,
        pods.head_tpl,
        containers=["ray-head"],
        aliases=pods.aliases,
        fields=kr.pod_fields(pods.head_tpl, pods.head_pod, pods.ns),
    )["ray-head"]
    started.append(head)
    cluster.wait_ready(head, pods.head_tpl["spec"]["containers"][0], timeout=300)
    worker = cluster.run_pod(
        pods.worker_pod,
        pods.worker_tpl,
        containers=["ray-worker"],
        fields=kr.pod_fields(pods.worker_tpl, pods.worker_pod, pods.ns),
    )["ray-worker"]
    started.append(worker)
    cluster.wait_ready(worker, pods.worker_tpl["spec"]["containers"][0], timeout=300)
    return head, worker


def _check_cluster_in_redis(cluster: Cluster, redis: str, head: str) -> list[list[str]]:
    """The GCS's tables in Redis, two nodes alive; those nodes."""
    # the GCS keeps the cluster in Redis, under the cluster's storage namespace
    keys = podman("exec", redis, "sh", "-c", 'redis-cli -a "$REDIS_PASSWORD" --no-auth-warning DBSIZE').stdout
    assert int(keys.strip() or 0) > 0, keys
    nodes_before = _alive_nodes(cluster, head)
    assert len(nodes_before) == 2, nodes_before
    return nodes_before


def _submit(cluster: Cluster, pods: _RayPods, entrypoint: str, attempt: int, started: list[str]) -> str:
    """The RayJob's submitter pod for attempt `attempt`, detached; its container, added to `started`."""
    jobid = kr.job_id(pods.job, f"try{attempt}")
    tpl = kr.submitter_pod(pods.job, pods.name, jobid, entrypoint)
    pod = f"{jobid}-submitter"
    sub = cluster.run_container(
        pod,
        tpl["spec"],
        tpl["spec"]["containers"][0],
        labels=tpl["metadata"]["labels"],
        detach=True,
        fields={"metadata.name": pod, "metadata.namespace": pods.ns},
    )
    started.append(sub)
    return sub


def _statuses(client, sweep: str) -> list[str]:
    """The statuses of the sweep's trial runs."""
    return [r.info.status for r in sweep_runs(client, sweep)[1]]


def _wait_mid_sweep(client, sweep: str) -> list[str]:
    """Until a trial finished and another runs (their checkpoints in MinIO); the trial runs' statuses then."""
    _wait_until(
        lambda: "FINISHED" in _statuses(client, sweep) and "RUNNING" in _statuses(client, sweep),
        600,
        "a finished and a running trial",
    )
    return _statuses(client, sweep)


def _kill_and_restart_head(
    cluster: Cluster, pods: _RayPods, head: str, worker: str, first: str, nodes_before: list[list[str]], logs: Path
) -> float:
    """SIGKILL the head, then restart it as the kubelet would; seconds until the worker is back in the cluster."""
    podman("kill", "--signal", "KILL", head)
    t_kill = time.monotonic()
    with contextlib.suppress(subprocess.TimeoutExpired):  # the submitter notices the lost job API
        podman("wait", first, check=False, timeout=120)
    (logs / "attempt-1.log").write_text(cluster.logs(first))
    cluster.stop(first)
    # the kubelet restarts the container; its GCS reloads the cluster from Redis
    podman("start", head)
    cluster.wait_ready(head, pods.head_tpl["spec"]["containers"][0], timeout=300)
    assert podman("inspect", "--format", "{{.State.Running}}", worker).stdout.strip() == "true"
    _wait_until(lambda: len(_alive_nodes(cluster, head)) == 2, 240, "the worker back in the cluster")
    nodes_after = _alive_nodes(cluster, head)
    worker_ids = {n for _, n in nodes_before} & {n for _, n in nodes_after}
    assert worker_ids, f"no node kept its id through the head's restart: {nodes_before} -> {nodes_after}"
    return round(time.monotonic() - t_kill, 1)


def _check_retry_completes(
    cluster: Cluster, second: str, client, sweep: str, before: list[str], recovered_s: float, logs: Path
) -> None:
    """The retried job resumes and completes, and the sweep's runs hold every trial exactly once, all FINISHED."""
    rc = podman("wait", second, check=False, timeout=1200).stdout.strip()
    out = cluster.logs(second)
    (logs / "attempt-2.log").write_text(out)
    assert rc == "0", out[-5000:]
    assert "Resuming " in out and f"Registered: models:/{MODEL}@champion" in out, out[-3000:]
    parents, children = sweep_runs(client, sweep)
    trial_ids = [r.data.tags.get("calib.trial_id") for r in children]
    (logs / "runs.json").write_text(
        json.dumps(
            {
                "before_kill": before,
                "recovered_s": recovered_s,
                "children": [(t, r.info.status) for t, r in zip(trial_ids, children, strict=True)],
            },
            indent=1,
        )
    )
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert len(trial_ids) == TRIALS and len(set(trial_ids)) == TRIALS, trial_ids  # every trial once
    assert all(r.info.status == "FINISHED" for r in children), [(t, r.info.status) for t, r in zip(trial_ids, children)]


def test_a_sweep_survives_a_killed_head_with_gcs_fault_tolerance(stack, tmp_path, monkeypatch):
    cluster = stack.cluster
    resources = _rendered_with_gcs_ft(tmp_path / "render")
    job = next(r for r in resources if r["kind"] == "RayJob")
    spec = kr.cluster_spec(job)
    assert spec["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]["secretKeyRef"]["name"] == "ray-gcs-redis"
    spec["gcsFaultToleranceOptions"]["redisAddress"] = f"{REDIS}:6379"  # the component's placeholder address
    cluster.secrets["ray-gcs-redis"] = {"password": secrets.token_hex(16)}
    sweep = f"gcs-ft-{uuid.uuid4().hex[:6]}"
    entrypoint = _sweep_entrypoint(job, sweep)

    pods = _ray_pods(cluster, job, spec)
    logs = artifacts_dir("gcs-ft")
    started: list[str] = []
    redis = f"{REDIS}-{cluster.id}"
    podman(
        *("run", "-d", "--name", redis, "--network", cluster.network, "--network-alias", REDIS),
        *("-e", f"REDIS_PASSWORD={cluster.secrets['ray-gcs-redis']['password']}", REDIS_IMAGE),
    )
    started.append(redis)
    try:
        head, worker = _start_ray_pods(cluster, pods, started)
        nodes_before = _check_cluster_in_redis(cluster, redis, head)
        client = _client(stack, monkeypatch)
        first = _submit(cluster, pods, entrypoint, 1, started)
        before = _wait_mid_sweep(client, sweep)
        recovered_s = _kill_and_restart_head(cluster, pods, head, worker, first, nodes_before, logs)
        # the RayJob's retry (backoffLimit): the same entrypoint, with --resume
        second = _submit(cluster, pods, entrypoint, 2, started)
        _check_retry_completes(cluster, second, client, sweep, before, recovered_s, logs)
    finally:
        for n in started:
            with contextlib.suppress(Exception):
                (logs / f"{n}.log").write_text(cluster.logs(n))
        for n in reversed(started):
            with contextlib.suppress(Exception):
                cluster.stop(n)
        with contextlib.suppress(Exception):
            podman("rm", "-f", redis, check=False)

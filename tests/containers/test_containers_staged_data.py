"""The gpu-cluster overlay's RayJob entrypoint and config on its staged data, under its NetworkPolicies
(`make test-containers`; issue #44 item 5): the head and one worker of the gpu-cluster RayJob's cluster, built as
KubeRay builds them (tests/containers/kuberay.py), on the MLflow stack's network; an S3 stand-in as the object
store outside the cluster; the overlay's policies enforced on the bridge (tests/containers/netpol.py). The sweep
is submitted through the submitter pod's K8sJobMode command, first with nothing staged (refused before any trial,
in one line naming `make stage-data`, nothing written to the Tune bucket), then after the staging step's CLI put
a small CIFAR-10 in torchvision's real on-disk format (python pickle batches, fabricated) into the object store:
the trials sync it onto the data PVC, verified by the manifest, and the sweep finishes.

Stand-ins and substitutions (this machine has no GPU, no cloud, and two cores):
- the object store: the MinIO stand-in (moto's S3) listening on 443 in plain HTTP (the policies judge the port;
  the real endpoint speaks TLS), declared at 192.0.2.10, inside the overlay's object-store range as committed
  (a placeholder, set per cluster); ray-env gets `AWS_ENDPOINT_URL=http://object-store:443` (the real S3
  needs no endpoint) and `AWS_EC2_METADATA_DISABLED=true`;
- the managed PostgreSQL (the Optuna study): the stack's PostgreSQL pod, declared at 192.0.2.130, inside the
  overlay's database range; MLflow is the stack's (dev) server, its artifact store the stack's MinIO (not
  judged: the Ray pods never address it; MLflow proxies artifacts);
- the entrypoint keeps --cluster, --resume, --config (cifar10_resnet18.yaml), --name, --storage-path, --tracking-uri,
  --cpus-per-trial and every --set; sizes for CPU: --gpus-per-trial 0, --num-samples 2, --max-concurrent 2, and
  --set run.train.epochs=1 (fabricated images: run.data.verify_checksums=false, as the official md5 sums cannot
  match them; the staging step runs with --no-verify-checksums for the same reason);
- fewer metrics and resamples, for time alone: evaluation.temperature_on_top=false, evaluation.conformal_alphas=[]
  and selection.num_resamples=100. Registering the champion, MLflow 3's log_model copies each metric of the
  trial's run onto the logged model with one get-history request per metric (mlflow/models/model.py,
  log_model_metrics_for_step), and every request through the basic-auth server checks the password (scrypt) and
  the permissions: with the config's 261 metrics that was 261 requests at 1-2 s each on this loaded 2-core
  machine, 491 s of registration, where these settings leave 76.
The KubeRay operator, the autoscaler and the GPU are not run (tests/containers/test_containers_ray.py and
test_containers_autoscaler.py cover what the harness can of them)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import deploy_render as dr
from tests.containers import images, netpol
from tests.containers import kuberay as kr
from tests.containers.fixtures import artifacts_dir, built_images, free_port, stack  # noqa: F401
from tests.containers.harness import Cluster, find_template, podman
from tests.fixtures_fabricate import fabricate_cifar10

pytestmark = pytest.mark.container
GPU = dr.DEPLOY / "overlays" / "gpu-cluster"
OBJECT_STORE, MANAGED_PG, PUBLIC = "192.0.2.10", "192.0.2.130", "203.0.113.10"  # what the policies' ipBlocks see
STAGE_STEP = "make stage-data DATASET=cifar10 DEST=s3://calib-sweeps-ray-results/datasets"
LISTEN = "import socket,time\ns=socket.socket();s.bind(('0.0.0.0',443));s.listen(8)\nprint('listening',flush=True)\n"
LISTEN += "while True: s.accept()[0].close()\n"
# A name is resolved first, a DNS failure tried again up to 5 times: EAI_AGAIN (podman's resolver answered late, seen
# once with the machine fully loaded) and EAI_NONAME (a name of this network unknown for a moment while the resolver
# reloads for another test's containers, seen once in a fresh-clone CI run, the worker pod resolving it just before):
# what is knocked on is the policy, not the resolver. A name that does not exist still fails, five seconds later.
KNOCK = r"""
import json, socket, sys, time
def address(host, port):
    for attempt in range(5):
        try:
            return socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
        except socket.gaierror as e:
            if e.errno not in (socket.EAI_AGAIN, socket.EAI_NONAME) or attempt == 4:
                raise
            time.sleep(1)
out = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(address(host, port)); out[f"{host}:{port}"] = "open"
    except socket.timeout:
        out[f"{host}:{port}"] = "blocked"
    except OSError as e:
        out[f"{host}:{port}"] = f"{type(e).__name__}({e.errno})"
    finally:
        s.close()
print(json.dumps(out))
"""


def substituted_entrypoint(entrypoint: str) -> str:
    """The gpu-cluster entrypoint with the module docstring's CPU sizes."""
    words = shlex.split(entrypoint)
    sizes = {"--gpus-per-trial": "0", "--num-samples": "2", "--max-concurrent": "2"}
    out = [w if words[i - 1] not in sizes else sizes[words[i - 1]] for i, w in enumerate(words)]
    assert "run.data.download=false" in out and "--cluster" in out and "--resume" in out, out
    cpu = ["run.train.epochs=1", "run.data.verify_checksums=false", "evaluation.temperature_on_top=false"]
    cpu += ["evaluation.conformal_alphas=[]", "selection.num_resamples=100"]
    return shlex.join([*out, *(w for kv in cpu for w in ("--set", kv))])


def _ip(name: str, network: str) -> str:
    return json.loads(podman("inspect", "-f", "{{json .NetworkSettings.Networks}}", name).stdout)[network]["IPAddress"]


def _s3_env(port: int, secrets: dict) -> dict[str, str]:
    """The engineer's machine: the Tune bucket's key, the object store through a published port."""
    key = secrets["tune-storage-s3"]
    return {
        "AWS_ACCESS_KEY_ID": key["access-key-id"],
        "AWS_SECRET_ACCESS_KEY": key["secret-access-key"],
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _s3(env: dict[str, str]):
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=env["AWS_ENDPOINT_URL"],
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )


def _outside(cluster: Cluster, key: dict[str, str], port: int) -> tuple[str, str]:
    """The object store outside the cluster (the S3 stand-in on 443, published to this machine at `port`) and a
    public HTTPS site; their container names."""
    store, public = f"object-store-{cluster.id}", f"public-{cluster.id}"
    net = ["--network", cluster.network, "--network-alias"]
    s3_image = images.qualify(images.dev_overlay_images()["s3"])
    creds = ["-e", f"MINIO_ROOT_USER={key['access-key-id']}", "-e", f"MINIO_ROOT_PASSWORD={key['secret-access-key']}"]
    serve = ["minio", "server", "/tmp", "--address", ":443"]  # objects in memory; the folder must exist
    podman("run", "-d", "--name", store, *net, "object-store", "-p", f"127.0.0.1:{port}:443", *creds, s3_image, *serve)
    listen = ["--entrypoint", "python3", images.python_base(), "-c", LISTEN]
    podman("run", "-d", "--name", public, *net, "public-site", *listen)
    return store, public


def _ray_nodes(cluster: Cluster, job: dict, name: str) -> tuple[dict, dict]:
    """Head and worker of the RayJob's cluster `name` as KubeRay builds them, started and ready: ({role: template},
    {role: container name})."""
    ns, spec = job["metadata"]["namespace"], kr.cluster_spec(job)
    pods = {"head": kr.build_pod(job, "head", name), "worker": kr.build_pod(job, "worker", name)}
    pod_names = {
        "head": kr.pod_name(name, "head"),
        "worker": kr.pod_name(name, "worker", spec["workerGroupSpecs"][0]["groupName"]),
    }
    aliases = {
        "head": [
            *cluster.dns_names(kr.head_service_name(name, spec)),
            *cluster.dns_names(kr.rayjob_head_service_name(job)),
        ],
        "worker": [],
    }
    names = {}
    for role, container in (("head", "ray-head"), ("worker", "ray-worker")):
        fields = kr.pod_fields(pods[role], pod_names[role], ns)
        started = cluster.run_pod(
            pod_names[role], pods[role], containers=[container], aliases=aliases[role], fields=fields
        )
        names[role] = started[container]
        cluster.wait_ready(names[role], pods[role]["spec"]["containers"][0], timeout=300)
    return pods, names


@pytest.fixture(scope="module")
def gpu(stack, tmp_path_factory):
    """The gpu-cluster RayJob's head and worker, the outside object store and a public address on the stack's
    network, the overlay's policies on the bridge."""
    resources = dr.render(GPU)
    job = next(r for r in resources if r["kind"] == "RayJob")
    cluster = Cluster(resources, stack.secrets, tmp_path_factory.mktemp("gpu-cluster"), network=stack.cluster.network)
    cluster.config_maps["ray-env"] = {
        **cluster.config_maps["ray-env"],
        "AWS_ENDPOINT_URL": "http://object-store:443",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    logs, port, t0 = artifacts_dir("staged-data"), free_port(), time.monotonic()
    outside: tuple[str, ...] = ()
    gpu = SimpleNamespace(cluster=cluster, job=job, ns=job["metadata"]["namespace"], name=kr.cluster_name(job))
    gpu.table, gpu.logs, gpu.env = f"calib_staged_{cluster.id}", logs, _s3_env(port, stack.secrets)
    gpu.pvc = cluster.workdir / "pvc" / "ray-datasets"
    try:
        outside = store, public = _outside(cluster, stack.secrets["tune-storage-s3"], port)
        for attempt in range(60):
            try:
                _s3(gpu.env).create_dir("calib-sweeps-ray-results")
                break
            except OSError:
                assert attempt < 59, cluster.logs(store)[-2000:]
                time.sleep(1)
        pods, names = _ray_nodes(cluster, job, gpu.name)  # one name: kr.cluster_name draws a new suffix
        gpu.head, gpu.worker = names["head"], names["worker"]
        gpu.policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
        postgres = next(c for c in stack.cluster.containers if c.startswith("postgres-0-"))
        mlflow_labels = find_template(stack.resources, "Deployment", "mlflow")["metadata"]["labels"]
        net, ns = cluster.network, gpu.ns
        gpu.endpoints = [
            *(netpol.Endpoint(r, ns, pods[r]["metadata"]["labels"], ip=_ip(names[r], net)) for r in ("head", "worker")),
            netpol.Endpoint("mlflow", ns, mlflow_labels, ip=_ip(stack.mlflow, net)),
            netpol.Endpoint("managed-postgres", None, address=MANAGED_PG, ip=_ip(postgres, net)),
            netpol.Endpoint("object-store", None, address=OBJECT_STORE, ip=_ip(store, net)),
            netpol.Endpoint("public", None, address=PUBLIC, ip=_ip(public, net)),
        ]
        gpu.startup_s = round(time.monotonic() - t0, 1)
        _enforce(gpu)
        yield gpu
    finally:
        netpol.remove(gpu.table)
        for n in [*cluster.containers, *outside]:
            (logs / f"{n.rsplit('-', 1)[0]}.log").write_text(cluster.logs(n))
        cluster.close()
        for n in outside:
            podman("rm", "-f", "-t", "0", n, check=False)


def _enforce(gpu, extra: list[netpol.Endpoint] = ()) -> None:
    """The overlay's policies between the endpoints (again, with `extra`: a submitter once it has an address)."""
    rules = netpol.ruleset(gpu.table, gpu.policies, [*gpu.endpoints, *extra])
    (gpu.logs / "rules.nft").write_text(rules)
    netpol.remove(gpu.table)
    netpol.apply(rules)


def _submit(gpu, jobid: str) -> tuple[str, str]:
    """The submitter pod's K8sJobMode command with the substituted entrypoint, under the policies; (rc, log)."""
    tpl = kr.submitter_pod(gpu.job, gpu.name, jobid, substituted_entrypoint(gpu.job["spec"]["entrypoint"]))
    pod = f"{jobid}-submitter"
    fields = {"metadata.name": pod, "metadata.namespace": gpu.ns}
    c = tpl["spec"]["containers"][0]
    name = gpu.cluster.run_container(pod, tpl["spec"], c, labels=tpl["metadata"]["labels"], detach=True, fields=fields)
    ip = _ip(name, gpu.cluster.network)  # it polls the dashboard first: judged from its first submission on
    _enforce(gpu, [netpol.Endpoint("submitter", gpu.ns, tpl["metadata"]["labels"], ip=ip)])
    rc = podman("wait", name, check=False, timeout=1200).stdout.strip()
    out = gpu.cluster.logs(name)
    gpu.cluster.stop(name)
    (gpu.logs / f"{jobid}.log").write_text(out)
    return rc, out


def _job_status(gpu, jobid: str) -> str:
    """The job's status as the dashboard reports it (what KubeRay reads; the submitter's exit code is not it)."""
    proc = gpu.cluster.exec(gpu.head, "ray", "job", "status", "--address", "http://127.0.0.1:8265", jobid)
    return proc.stdout + proc.stderr


def _tune_objects(gpu) -> list[str]:
    import pyarrow.fs as pafs

    sel = pafs.FileSelector("calib-sweeps-ray-results/tune", recursive=True, allow_not_found=True)
    return [i.path for i in _s3(gpu.env).get_file_info(sel)]


def test_the_policies_hold_between_the_pods(gpu):
    """The control: the rules are live (the workers reach the object store and MLflow, not a public address nor
    the database; the driver's head reaches the study's database)."""
    targets = {
        "worker": [("object-store", 443), ("mlflow", 5000), ("public-site", 443)],
        "head": [("object-store", 443), ("public-site", 443)],
    }
    pg = next(e for e in gpu.endpoints if e.name == "managed-postgres").ip
    targets["worker"].append((pg, 5432))
    targets["head"].append((pg, 5432))
    seen = {}
    for role, name in (("worker", gpu.worker), ("head", gpu.head)):
        proc = gpu.cluster.exec(name, "python", "-c", KNOCK, json.dumps(targets[role]), timeout=60)
        seen[role] = json.loads(proc.stdout)
    (gpu.logs / "knocks.json").write_text(json.dumps(seen, indent=1))
    assert seen["worker"] == {
        "object-store:443": "open",
        "mlflow:5000": "open",
        "public-site:443": "blocked",
        f"{pg}:5432": "blocked",
    }, seen
    assert seen["head"] == {"object-store:443": "open", "public-site:443": "blocked", f"{pg}:5432": "open"}, seen


def test_absent_data_is_refused_before_any_trial(gpu):
    _, out = _submit(gpu, "staged-absent")
    assert "failed" in _job_status(gpu, "staged-absent").lower(), out[-3000:]
    lines = [ln for ln in out.splitlines() if STAGE_STEP in ln]
    assert lines and "run.data.root: cifar10 is neither under /data/datasets" in lines[0], out[-3000:]
    assert "nor staged (no calib-manifest.json in DEST/cifar10/)" in lines[0]
    assert "characters)" not in lines[0], "the line was cut"
    assert "Trial status" not in out and "trial_" not in out, out[-3000:]
    assert not _tune_objects(gpu), "the refused sweep wrote to the Tune bucket"
    assert not (gpu.pvc / "datasets" / "cifar-10-batches-py").exists()


def test_gpu_cluster_entrypoint_runs_on_the_staged_data(gpu, tmp_path):
    fab = tmp_path / "download"
    fabricate_cifar10(fab, per_batch=40, n_test=40)
    t0 = time.monotonic()
    stage = subprocess.run(
        [
            sys.executable,
            "-m",
            "calib_core.data.stage",
            "stage",
            "cifar10",
            "s3://calib-sweeps-ray-results/datasets",
            "--root",
            str(fab),
            "--no-download",
            "--no-verify-checksums",
        ],
        env={**os.environ, **gpu.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stage.returncode == 0, stage.stdout + stage.stderr
    assert "cifar10: 7 files" in stage.stdout, stage.stdout
    stage_s = time.monotonic() - t0
    rc, out = _submit(gpu, "staged-present")
    sweep_s = round(time.monotonic() - t0 - stage_s, 1)
    timings = {"startup_s": gpu.startup_s, "stage_s": round(stage_s, 1), "sweep_s": sweep_s}
    (gpu.logs / "timings.json").write_text(json.dumps(timings))
    assert rc == "0" and "succeeded" in _job_status(gpu, "staged-present").lower(), out[-5000:]
    assert "Registered: models:/" in out, out[-3000:]
    for rel in (
        "cifar-10-batches-py/data_batch_1",
        "cifar-10-batches-py/test_batch",
        "cifar-10-batches-py/batches.meta",
    ):
        assert (gpu.pvc / "datasets" / rel).read_bytes() == (fab / rel).read_bytes(), rel
    assert not list(Path(gpu.pvc / "datasets").rglob("*.partial-*"))
    assert _tune_objects(gpu), "the sweep kept its Tune state in the object store"

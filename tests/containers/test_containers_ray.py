"""A Ray cluster from the rendered dev overlay's RayJob in containers (`make test-containers`): the
head and one worker of its rayClusterSpec run as KubeRay would run them (tests/containers/kuberay.py:
the generated `ray start` command line, KubeRay's env, the worker's wait-gcs-ready init container,
the probes, the token from the Secret ray-auth-token) on the MLflow stack's network, reachable by
the head Services KubeRay creates. The RayJob's entrypoint, with the documented substitutions below,
goes through Ray's job submission API from the submitterPodTemplate with KubeRay's K8sJobMode
command, and runs the sweep to a registered champion in the stack's MLflow; a submission without
the token, or with a wrong one, is refused. While the cluster runs, the TCP ports its processes
listen on are compared with tests/containers/ray_ports.json, whose ports the default suite checks
against the NetworkPolicies (tests/unit/deploy/test_deploy_security.py).

Substitutions (the dev RayJob trains CIFAR-10 with downloads on GPUs): the entrypoint is parsed with
shlex and keeps --cluster, --resume, --name, --storage-path s3://... (MinIO, through the ray-env
ConfigMap's AWS_ENDPOINT_URL), --tracking-uri http://mlflow:5000 and --cpus-per-trial; --config
becomes the embedded mnist1d_demo.yaml, the run.data.* sets are dropped, --gpus-per-trial 0,
--num-samples 2, --max-concurrent 2 (the worker's 4 CPUs / 2 per trial) and run.train.epochs=2 are
set. The worker keeps its declared GPU: KubeRay passes --num-gpus=1 from the nvidia.com/gpu limit;
Ray does not check a logical GPU against hardware, and no trial asks for one.
The autoscaler sidecar is not run here (tests/containers/test_containers_autoscaler.py runs it); the worker is
started directly, as the autoscaler would once trials are pending.

Record the ports again (after a Ray upgrade): CALIB_RECORD_RAY_PORTS=1 rewrites ray_ports.json."""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import time
from types import SimpleNamespace

import pytest

from tests.containers import kuberay as kr
from tests.containers.fixtures import artifacts_dir, built_images, http, stack  # noqa: F401
from tests.containers.harness import SA_PATH, podman
from tests.paths import TESTS

pytestmark = pytest.mark.container
PORTS_JSON = TESTS / "containers" / "ray_ports.json"
DEMO_CONFIG = "/home/ray/app/sweeps/configs/mnist1d_demo.yaml"
TAG_SWEEP = "calib.sweep"  # sweeps/contract.py: the sweep's name on its parent and child runs

# Every TCP socket in LISTEN state in the container's network namespace, with the process holding it.
LISTENERS = r"""
import json, os, re
socks = {}
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(f).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        p = row.split()
        if p[3] == "0A":
            host, port = p[1].rsplit(":", 1)
            if len(host) == 8:  # IPv4, little-endian
                host = ".".join(str(b) for b in bytes.fromhex(host)[::-1])
            elif host.startswith("0000000000000000FFFF0000"):  # IPv4-mapped IPv6
                host = "::ffff:" + ".".join(str(b) for b in bytes.fromhex(host[24:])[::-1])
            else:
                host = {"0" * 32: "::", "0" * 24 + "01000000": "::1"}.get(host, host)
            socks[p[9]] = (int(port, 16), host)
out = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    for fd in fds:
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m and m.group(1) in socks:
            port, addr = socks[m.group(1)]
            out.append({"port": port, "addr": addr, "pid": int(pid), "cmd": cmd[:300]})
print(json.dumps(out))
"""


def process_kind(cmd: str) -> str:
    """A name for the Ray process behind a command line."""
    rules = [
        ("gcs_server", "gcs_server"),
        ("/raylet", "raylet"),
        ("ray::DashboardAgent", "dashboard_agent"),
        ("ray::RuntimeEnvAgent", "runtime_env_agent"),
        ("dashboard/dashboard.py", "dashboard"),
        ("ray-dashboard-", "dashboard_module"),
        ("ray.util.client.server", "ray_client_server"),
        ("default_worker.py", "core_worker"),
        ("ray::", "core_worker"),
        ("sweeps/launch.py", "driver"),
        ("log_monitor", "log_monitor"),
        ("monitor.py", "monitor"),
    ]
    return next((name for pattern, name in rules if pattern in cmd), cmd.split(" ")[0].rsplit("/", 1)[-1] or "?")


def listeners(name: str) -> list[dict]:
    proc = podman("exec", name, "python", "-c", LISTENERS, check=False, timeout=60)
    if proc.returncode != 0:
        return []
    rows = json.loads(proc.stdout)
    for r in rows:
        r["process"] = process_kind(r["cmd"])
    return rows


def substituted_entrypoint(entrypoint: str) -> str:
    """The RayJob entrypoint with the substitutions of the module docstring."""
    words = shlex.split(entrypoint)
    out, i = [], 0
    replace = {"--config": DEMO_CONFIG, "--gpus-per-trial": "0", "--num-samples": "2", "--max-concurrent": "2"}
    seen = set()
    while i < len(words):
        w = words[i]
        if w in replace:
            out += [w, replace[w]]
            seen.add(w)
            i += 2
        elif w == "--set" and words[i + 1].startswith("run.data."):
            i += 2
        else:
            out.append(w)
            i += 1
    for flag in replace.keys() - seen:
        out += [flag, replace[flag]]
    out += ["--set", "run.train.epochs=2"]
    for keep in ("--cluster", "--resume", "--storage-path", "--tracking-uri", "--name"):
        assert keep in out, keep
    return shlex.join(out)


@pytest.fixture(scope="module")
def ray(stack):
    """Head and one worker of the dev RayJob's cluster, running on the stack's network."""
    cluster = stack.cluster
    job = next(r for r in stack.resources if r["kind"] == "RayJob")
    ns = job["metadata"]["namespace"]
    spec = kr.cluster_spec(job)
    name = kr.cluster_name(job)
    head = kr.build_pod(job, "head", name)
    worker = kr.build_pod(job, "worker", name)
    head_pod = kr.pod_name(name, "head")
    worker_pod = kr.pod_name(name, "worker", spec["workerGroupSpecs"][0]["groupName"])
    # The RayCluster's head Service (workers' FQ_RAY_IP, the dashboard URL) and the RayJob's.
    aliases = [
        *cluster.dns_names(kr.head_service_name(name, spec)),
        *cluster.dns_names(kr.rayjob_head_service_name(job)),
    ]
    logs = artifacts_dir("ray")
    t0 = time.monotonic()
    started = []
    try:
        names = cluster.run_pod(
            head_pod, head, containers=["ray-head"], aliases=aliases, fields=kr.pod_fields(head, head_pod, ns)
        )
        started.append(names["ray-head"])
        cluster.wait_ready(names["ray-head"], head["spec"]["containers"][0], timeout=300)
        head_ready_s = time.monotonic() - t0
        wnames = cluster.run_pod(
            worker_pod, worker, containers=["ray-worker"], fields=kr.pod_fields(worker, worker_pod, ns)
        )
        started.append(wnames["ray-worker"])
        cluster.wait_ready(wnames["ray-worker"], worker["spec"]["containers"][0], timeout=300)
        yield SimpleNamespace(
            cluster=cluster,
            job=job,
            name=name,
            ns=ns,
            head=names["ray-head"],
            worker=wnames["ray-worker"],
            head_pod=head,
            worker_pod=worker,
            logs=logs,
            startup_s=round(time.monotonic() - t0, 1),
            head_ready_s=round(head_ready_s, 1),
            listeners={"head": {}, "worker": {}},
            worker_name=worker_pod,
        )
    finally:
        for n in started:
            (logs / f"{n.rsplit('-', 1)[0]}.log").write_text(cluster.logs(n))
        (logs / "init-containers.json").write_text(
            json.dumps({k: v for k, v in cluster.init_logs.items() if k.startswith(name)}, indent=1)
        )
        for n in started:
            cluster.stop(n)


def _record(ray, role: str, name: str) -> None:
    for r in listeners(name):
        seen = ray.listeners[role].setdefault((r["port"], r["process"]), {"addrs": set(), "cmds": set()})
        seen["addrs"].add(r["addr"])
        seen["cmds"].add(r["cmd"][:120])


def _submit(ray, jobid: str, extra_env=(), detach=False, timeout=600):
    tpl = kr.submitter_pod(ray.job, ray.name, jobid, substituted_entrypoint(ray.job["spec"]["entrypoint"]))
    c = tpl["spec"]["containers"][0]
    pod = f"{jobid}-submitter"
    return ray.cluster.run_container(
        pod,
        tpl["spec"],
        c,
        labels=tpl["metadata"]["labels"],
        detach=detach,
        extra_env=list(extra_env),
        timeout=timeout,
        fields={"metadata.name": pod, "metadata.namespace": ray.ns},
    )


def test_no_kubernetes_credentials_reach_the_driver_or_the_trials(ray, tmp_path):
    """The head (where the driver runs) and the workers (the trials) get no service-account token: the harness
    mounts one wherever a pod does not opt out (automountServiceAccountToken), as Kubernetes would; a pod
    template without the opt-out (the control) does get it."""
    for name in (ray.head, ray.worker):
        proc = ray.cluster.exec(name, "sh", "-c", f"ls -A {SA_PATH} 2>&1; printenv | grep -ci serviceaccount")
        assert "No such file" in proc.stdout and proc.stdout.strip().endswith("0"), (name, proc.stdout)
    control = json.loads(json.dumps(ray.head_pod))
    control["spec"].pop("automountServiceAccountToken", None)
    c = control["spec"]["containers"][0]
    out = ray.cluster.run_container(
        "sa-control", control["spec"], c, labels={}, detach=False, command=["cat", f"{SA_PATH}/token"], timeout=120
    )
    assert out.returncode == 0 and out.stdout.startswith("fake-service-account-token-"), out.stdout + out.stderr


def test_nodes_run_the_generated_ray_start_command(ray):
    for name, pod in ((ray.head, ray.head_pod), (ray.worker, ray.worker_pod)):
        env = ray.cluster.exec(name, "printenv", "KUBERAY_GEN_RAY_START_CMD", "RAY_CLUSTER_NAME").stdout
        assert env.split("\n")[:2] == [pod["rayStartCommand"], ray.name]
    assert "GCS is ready." in ray.cluster.init_logs[f"{ray.worker_name}/wait-gcs-ready"]
    status = ray.cluster.exec(ray.head, "ray", "status", timeout=120)
    out = status.stdout + status.stderr
    (ray.logs / "ray-status.txt").write_text(out)
    assert status.returncode == 0, out[-3000:]
    # The head (0 CPU, 0 GPU) and the worker (4 CPU from its limit, 1 GPU from nvidia.com/gpu).
    assert re.search(r"/4\.0 CPU", out) and re.search(r"/1\.0 GPU", out), out


def test_rayjob_submitter_runs_the_sweep_to_a_champion(ray, stack):
    jobid = kr.job_id(ray.job)
    t0 = time.monotonic()
    name = _submit(ray, jobid, detach=True)
    while podman("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip() not in (
        "exited",
        "stopped",
        "",
    ):
        _record(ray, "head", ray.head)
        _record(ray, "worker", ray.worker)
        if time.monotonic() - t0 > 900:
            break
        time.sleep(5)
    rc = podman("wait", name, check=False, timeout=60).stdout.strip()
    out = ray.cluster.logs(name)
    ray.cluster.stop(name)
    (ray.logs / "submitter.log").write_text(out)
    (ray.logs / "timings.json").write_text(
        json.dumps(
            {
                "cluster_startup_s": ray.startup_s,
                "head_ready_s": ray.head_ready_s,
                "job_s": round(time.monotonic() - t0, 1),
            },
            indent=1,
        )
    )
    assert rc == "0", out[-5000:]
    assert "Registered: models:/calibrated-mnist1d@champion" in out, out[-3000:]
    sweep = shlex.split(ray.job["spec"]["entrypoint"])
    sweep_name = sweep[sweep.index("--name") + 1]
    status, body = http(
        f"{stack.url}/api/2.0/mlflow/registered-models/alias?name=calibrated-mnist1d&alias=champion", stack.auth
    )
    assert status == 200, body
    run_id = json.loads(body)["model_version"]["run_id"]
    status, body = http(f"{stack.url}/api/2.0/mlflow/runs/get?run_id={run_id}", stack.auth)
    assert status == 200, body
    tags = {t["key"]: t["value"] for t in json.loads(body)["run"]["data"].get("tags", [])}
    assert tags.get(TAG_SWEEP) == sweep_name, tags
    # The driver on the head kept the Optuna study in the stack's PostgreSQL (CALIB_OPTUNA_STORAGE).
    import optuna

    study = optuna.load_study(study_name=sweep_name, storage=stack.optuna_url)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"], study.trials


# How a client goes without the cluster's token: a wrong one (the dashboard answers 403), none but
# RAY_AUTH_MODE=token (Ray's client refuses to send), neither variable (a client that does not know
# about the token: the server refuses the unauthenticated request).
WITHOUT_TOKEN = {
    "wrong-token": [{"name": "RAY_AUTH_TOKEN", "value": "wrong-token-0123456789abcdef"}],
    "no-token": [],
    "no-auth-config": None,
}


def _without_token(c: dict, case: str) -> None:
    drop = ("RAY_AUTH_TOKEN",) if WITHOUT_TOKEN[case] is not None else ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE")
    c["env"] = [e for e in c["env"] if e["name"] not in drop] + list(WITHOUT_TOKEN[case] or [])


@pytest.mark.parametrize("case", list(WITHOUT_TOKEN))
def test_submission_without_the_token_is_refused(ray, case):
    """The submitter pod's command (a trivial entrypoint) without the token fails, with Ray's
    authentication error, and the job does not exist afterwards."""
    jobid = f"{kr.job_id(ray.job)}-{case}"
    tpl = kr.submitter_pod(ray.job, ray.name, jobid, "python -c 'print(1)'")
    c = tpl["spec"]["containers"][0]
    _without_token(c, case)
    proc = ray.cluster.run_container(f"{jobid}-submitter", tpl["spec"], c, labels={}, detach=False, timeout=180)
    out = proc.stdout + proc.stderr
    (ray.logs / f"refused-{case}.log").write_text(out)
    assert proc.returncode != 0, out[-3000:]
    assert "AuthenticationError" in out, out[-3000:]
    if case == "wrong-token":
        assert "Invalid authentication token" in out, out[-3000:]
    status = ray.cluster.exec(ray.head, "ray", "job", "status", "--address", "http://127.0.0.1:8265", jobid)
    assert status.returncode != 0 and "does not exist" in (status.stdout + status.stderr), status


@pytest.mark.parametrize("case", ["no-token", "no-auth-config"])
def test_driver_without_the_token_is_refused(ray, case):
    """ray.init against the head's GCS (through its Service) from a pod of the namespace fails
    without the token."""
    addr = f"{kr.fqdn(kr.head_service_name(ray.name, kr.cluster_spec(ray.job)), ray.ns)}:6379"
    tpl = kr.submitter_pod(ray.job, ray.name, "driver")
    c = tpl["spec"]["containers"][0]
    _without_token(c, case)
    script = f"import ray; ray.init(address={addr!r}); print('CONNECTED', ray.cluster_resources())"
    name = f"driver-{case}-{ray.cluster.id}"
    try:
        proc = ray.cluster.run_container(
            f"driver-{case}",
            tpl["spec"],
            c,
            labels={},
            detach=False,
            timeout=120,
            command=["python", "-c", script],
            name=name,
        )
    except subprocess.TimeoutExpired:
        ray.cluster.stop(name)
        pytest.fail("the driver neither connected nor failed within 120 s")
    out = proc.stdout + proc.stderr
    (ray.logs / f"driver-{case}.log").write_text(out)
    assert proc.returncode != 0 and "CONNECTED" not in out, out[-3000:]
    assert "AuthenticationError" in out or "UNAUTHENTICATED" in out or "Unauthenticated" in out, out[-3000:]


def test_listening_ports_are_the_recorded_ones(ray):
    """Every port a Ray process listened on during the sweep is in ray_ports.json (fixed ports by
    number, Ray's randomly chosen ones by process, core workers within the worker port range), and
    every fixed port there was listened on."""
    import ray as ray_module

    _record(ray, "head", ray.head)
    _record(ray, "worker", ray.worker)
    observed = {
        role: sorted(
            (
                {"port": p, "process": k, "addrs": sorted(r["addrs"]), "cmds": sorted(r["cmds"])}
                for (p, k), r in rows.items()
            ),
            key=lambda r: (r["process"], r["port"]),
        )
        for role, rows in ray.listeners.items()
    }
    (ray.logs / "ports-observed.json").write_text(json.dumps(observed, indent=1))
    assert observed["head"] and observed["worker"], "no listeners recorded"
    params = {"head": ray.head_pod["rayStartParams"], "worker": ray.worker_pod["rayStartParams"]}
    lo, hi = int(params["worker"].get("min-worker-port", 10002)), int(params["worker"].get("max-worker-port", 19999))
    if os.environ.get("CALIB_RECORD_RAY_PORTS") == "1":
        record = {
            "ray_version": ray_module.__version__,
            "recorded_on": datetime.date.today().isoformat(),
            "recorded_by": "tests/containers/test_containers_ray.py (CALIB_RECORD_RAY_PORTS=1)",
            "kuberay": kr.KUBERAY_SOURCE,
            "worker_port_range": [lo, hi],
        }
        for role, rows in observed.items():
            fixed, rand, ranged = {}, set(), set()
            for r in rows:
                if r["port"] in FIXED_PORTS:
                    fixed[str(r["port"])] = r["process"]
                elif lo <= r["port"] <= hi and r["process"] in ("core_worker", "driver"):
                    ranged.add(r["process"])
                else:
                    rand.add(r["process"])
            record[role] = {
                "fixed": dict(sorted(fixed.items(), key=lambda kv: int(kv[0]))),
                "random": sorted(rand),
                "worker_port_range": sorted(ranged),
                "examples": {k: sorted({r["port"] for r in rows if r["process"] == k}) for k in sorted(rand | ranged)},
            }
        # The flat list tests/deploy_checks.py check_ray_network_policy reads: every observed port.
        record["ports"] = [
            {"role": role, "port": r["port"], "process": r["process"], "addrs": r["addrs"]}
            for role, rows in observed.items()
            for r in rows
        ]
        PORTS_JSON.write_text(json.dumps(record, indent=1) + "\n")
    recorded = json.loads(PORTS_JSON.read_text())
    assert recorded["ray_version"] == ray_module.__version__, "Ray changed: record the ports again"
    assert recorded["worker_port_range"] == [lo, hi]
    problems = []
    for role, rows in observed.items():
        rec = recorded[role]
        for r in rows:
            port, kind = r["port"], r["process"]
            if str(port) in rec["fixed"]:
                if rec["fixed"][str(port)] != kind:
                    problems.append(f"{role}: {port} is {kind}, recorded as {rec['fixed'][str(port)]}")
            elif kind in rec["worker_port_range"] and lo <= port <= hi:
                continue
            elif kind not in rec["random"] or port in FIXED_PORTS:
                problems.append(f"{role}: {kind} listens on {port}, not in ray_ports.json")
        missing = set(rec["fixed"]) - {str(r["port"]) for r in rows}
        if missing:
            problems.append(f"{role}: recorded ports {sorted(missing)} not listened on")
    assert not problems, "\n".join(problems) + "\n(CALIB_RECORD_RAY_PORTS=1 records them again)"


# The ports Ray opens at a number the configuration fixes (rayStartParams, KubeRay's and Ray's defaults).
FIXED_PORTS = {
    kr.DEFAULT_GCS_SERVER_PORT,
    kr.DEFAULT_DASHBOARD_PORT,
    kr.DEFAULT_CLIENT_PORT,
    kr.DEFAULT_METRICS_PORT,
    kr.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT,
}

"""Security of the rendered overlays: every pod (Deployments, StatefulSets, Jobs, RayJob/RayCluster
head, workers, autoscaler and submitter) is hardened, the Ray token reaches every Ray process
from a Secret, and NetworkPolicies keep MLflow and the Ray ports to the pods that need them."""

from __future__ import annotations

import copy
import os

import pytest

from deploy import release
from tests import deploy_checks as dc
from tests import deploy_render as dr
from tests.containers import kuberay as kr
from tests.paths import TESTS

OVERLAYS = dr.overlay_dirs()
OVERLAY_IDS = [p.name for p in OVERLAYS]
RAY_TOKEN_SECRET = ("ray-auth-token", "auth_token")
# No pod mounts its service-account token; the head's autoscaler sidecar alone gets a projected one
# (test_only_the_autoscaler_holds_kubernetes_credentials).
TOKEN_MOUNT_ALLOWED: set[str] = set()
SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _sc_value(container_sc: dict, pod_sc: dict, key: str):
    return container_sc.get(key, pod_sc.get(key))


def container_violations(where: str, c: dict, pod_sc: dict, volumes: dict) -> list[str]:
    """What is wrong with one container's hardening (empty when it is fine)."""
    v = []
    sc = c.get("securityContext", {})
    name = f"{where}/{c.get('name', '?')}"
    if sc.get("privileged"):
        v.append(f"{name}: privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        v.append(f"{name}: allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities", {})
    if "ALL" not in caps.get("drop", []):
        v.append(f"{name}: capabilities must drop ALL")
    if caps.get("add"):
        v.append(f"{name}: adds capabilities {caps['add']}")
    if sc.get("readOnlyRootFilesystem") is not True:
        v.append(f"{name}: readOnlyRootFilesystem must be true")
    if _sc_value(sc, pod_sc, "runAsNonRoot") is not True:
        v.append(f"{name}: runAsNonRoot must be true")
    if _sc_value(sc, pod_sc, "runAsUser") in (0, None):
        v.append(f"{name}: runAsUser must be a non-zero uid")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp != "RuntimeDefault":
        v.append(f"{name}: seccompProfile must be RuntimeDefault (got {seccomp})")
    res = c.get("resources", {})
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in res.get(part, {}):
                v.append(f"{name}: resources.{part}.{r} missing")
    # A read-only root filesystem needs a writable /tmp: an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    if volumes is not None and "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
        v.append(f"{name}: /tmp must be an emptyDir mount")
    return v


def pod_violations(where: str, spec: dict) -> list[str]:
    v = []
    pod_sc = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            v.append(f"{where}: {flag}")
    if pod_sc.get("runAsNonRoot") is not True:
        v.append(f"{where}: pod securityContext.runAsNonRoot must be true")
    if (pod_sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        v.append(f"{where}: pod seccompProfile must be RuntimeDefault")
    volumes = {vol["name"]: vol for vol in spec.get("volumes", [])}
    for vol in volumes.values():
        if "hostPath" in vol:
            v.append(f"{where}: hostPath volume {vol['name']}")
    role = where.rsplit("/", 1)[-1]
    if spec.get("automountServiceAccountToken") is not False and role not in TOKEN_MOUNT_ALLOWED:
        v.append(f"{where}: automountServiceAccountToken must be false")
    if spec.get("enableServiceLinks") is not False:
        v.append(f"{where}: enableServiceLinks must be false (a Service named mlflow would inject MLFLOW_PORT)")
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    if not containers:
        v.append(f"{where}: no containers")
    for c in containers:
        v += container_violations(where, c, pod_sc, volumes)
    return v


def all_pod_specs(resources: list[dict]):
    for r in resources:
        yield from dr.pod_specs(r)


def _resources():
    return [pytest.param(dr.render(o), id=o.name) for o in OVERLAYS]


@pytest.mark.parametrize("resources", _resources())
def test_every_pod_is_hardened(resources):
    specs = list(all_pod_specs(resources))
    kinds = {where.split("/")[0] for where, _ in specs}
    assert {"Deployment", "RayJob", "RayCluster"} <= kinds
    roles = {where.split("/")[-1].split(":")[0] for where, _ in specs if where.startswith("RayJob/")}
    assert roles == {"submitter", "head", "worker"}
    problems = [p for where, spec in specs for p in pod_violations(where, spec)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("resources", _resources())
def test_autoscaler_sidecar_is_hardened(resources):
    for r in resources:
        cluster = dr.ray_cluster_spec(r)
        if cluster is None:
            continue
        assert cluster.get("enableInTreeAutoscaling") is True
        opts = cluster["autoscalerOptions"]
        head = cluster["headGroupSpec"]["template"]["spec"]
        fake = {
            "name": "autoscaler",
            "securityContext": opts["securityContext"],
            "resources": opts["resources"],
            "volumeMounts": opts.get("volumeMounts", []),
        }
        volumes = {v["name"]: v for v in head.get("volumes", [])}
        problems = container_violations(f"{r['kind']}/{r['metadata']['name']}", fake, head["securityContext"], volumes)
        assert not problems, problems


def test_the_hardening_check_is_not_vacuous():
    resources = dr.render(OVERLAYS[0])
    dep = copy.deepcopy(next(r for r in resources if r["kind"] == "Deployment"))
    spec = dep["spec"]["template"]["spec"]
    assert pod_violations("Deployment/x", spec) == []
    c = spec["containers"][0]
    c["securityContext"]["allowPrivilegeEscalation"] = True
    c["securityContext"]["capabilities"] = {"drop": ["NET_RAW"], "add": ["SYS_ADMIN"]}
    del c["securityContext"]["readOnlyRootFilesystem"]
    spec["securityContext"]["runAsUser"] = 0
    spec["hostNetwork"] = True
    del c["resources"]["limits"]
    found = "\n".join(pod_violations("Deployment/x", spec))
    for needle in (
        "allowPrivilegeEscalation",
        "drop ALL",
        "adds capabilities",
        "readOnlyRootFilesystem",
        "runAsUser",
        "hostNetwork",
        "limits.cpu",
    ):
        assert needle in found, needle


# ------------------------------------------------------------------------------ Ray specifics


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _has_token(env: dict[str, dict]) -> bool:
    mode, token = env.get("RAY_AUTH_MODE", {}), env.get("RAY_AUTH_TOKEN", {})
    ref = token.get("valueFrom", {}).get("secretKeyRef", {})
    return mode.get("value") == "token" and (ref.get("name"), ref.get("key")) == RAY_TOKEN_SECRET


@pytest.mark.parametrize("resources", _resources())
def test_ray_token_reaches_every_ray_process_from_the_secret(resources):
    ray_objects = [r for r in resources if r["kind"] in ("RayJob", "RayCluster")]
    assert {r["kind"] for r in ray_objects} == {"RayJob", "RayCluster"}
    for r in ray_objects:
        cluster = dr.ray_cluster_spec(r)
        assert cluster["authOptions"] == {"mode": "token", "secretName": RAY_TOKEN_SECRET[0]}
        # the autoscaler's comes from KubeRay (pod.go v1.7, ported in tests/containers/kuberay.py), once
        head = kr.build_pod(r, "head", kr.cluster_name(r))
        autoscaler = next(c for c in head["spec"]["containers"] if c["name"] == "autoscaler")
        names = [e["name"] for e in autoscaler["env"]]
        assert names.count("RAY_AUTH_MODE") == 1 and names.count("RAY_AUTH_TOKEN") == 1, names
        assert _has_token(_env(autoscaler)), f"{r['kind']} autoscaler"
        for where, spec in dr.pod_specs(r):
            for c in spec["containers"]:
                assert _has_token(_env(c)), f"{where}/{c['name']} lacks RAY_AUTH_MODE/RAY_AUTH_TOKEN"


@pytest.mark.parametrize("resources", _resources())
def test_only_the_autoscaler_holds_kubernetes_credentials(resources):
    """The driver and every trial's code run in the head's Ray container: no service-account token there (nor in
    any other pod); the autoscaler sidecar, which patches the RayCluster, mounts a projected, expiring token
    of the head's service account with the cluster CA and namespace, where Kubernetes clients look."""
    for r in (r for r in resources if r["kind"] in ("RayJob", "RayCluster")):
        cluster = dr.ray_cluster_spec(r)
        head = kr.build_pod(r, "head", kr.cluster_name(r))["spec"]
        assert head["automountServiceAccountToken"] is False
        volumes = {v["name"]: v for v in head["volumes"]}
        holders = {}
        for c in head["containers"] + head.get("initContainers", []):
            for m in c.get("volumeMounts", []):
                sources = volumes[m["name"]].get("projected", {}).get("sources", [])
                if m["mountPath"] == SA_TOKEN_PATH or any("serviceAccountToken" in s for s in sources):
                    holders[c["name"]] = (m, sources)
        assert set(holders) == {"autoscaler"}, set(holders)
        mount, sources = holders["autoscaler"]
        assert mount["mountPath"] == SA_TOKEN_PATH and mount["readOnly"] is True
        token = next(s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s)
        assert token["path"] == "token" and token["expirationSeconds"] <= 3607
        assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
        assert any(i["path"] == "namespace" for s in sources for i in s.get("downwardAPI", {}).get("items", []))
        ray_env = {e["name"] for e in head["containers"][0].get("env", [])}
        assert not ray_env & {"KUBECONFIG"}, ray_env
        assert "env" not in cluster["autoscalerOptions"] or not {
            e["name"] for e in cluster["autoscalerOptions"]["env"]
        } & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}


@pytest.mark.parametrize("resources", _resources())
def test_the_driver_gets_the_optuna_study_database_from_a_secret(resources):
    """The sweep driver runs on the head: it alone reads CALIB_OPTUNA_STORAGE (the name the sweep
    reads), from the Secret optuna-storage; the workers never hold the database credentials."""
    from sweeps.config_defaults import STUDY_STORAGE_ENV

    for r in (r for r in resources if r["kind"] in ("RayJob", "RayCluster")):
        cluster = dr.ray_cluster_spec(r)
        head_env = _env(cluster["headGroupSpec"]["template"]["spec"]["containers"][0])
        ref = head_env[STUDY_STORAGE_ENV]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("optuna-storage", "url"), r["metadata"]["name"]
        assert cluster["headGroupSpec"]["template"]["metadata"]["labels"].get("calib-sweeps/optuna-client") == "true"
        for g in cluster["workerGroupSpecs"]:
            assert STUDY_STORAGE_ENV not in _env(g["template"]["spec"]["containers"][0])
            assert "calib-sweeps/optuna-client" not in g["template"]["metadata"]["labels"]


@pytest.mark.parametrize("resources", _resources())
def test_head_has_no_gpu_and_workers_are_gpu_nodes(resources):
    for r in (r for r in resources if r["kind"] in ("RayJob", "RayCluster")):
        cluster = dr.ray_cluster_spec(r)
        head = cluster["headGroupSpec"]
        assert head["rayStartParams"]["num-gpus"] == "0"
        head_res = head["template"]["spec"]["containers"][0]["resources"]
        assert "nvidia.com/gpu" not in head_res.get("limits", {}) | head_res.get("requests", {})
        assert not head["template"]["spec"].get("tolerations")
        gpu_groups = [
            g
            for g in cluster["workerGroupSpecs"]
            if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"].get("limits", {})
        ]
        assert gpu_groups, "no GPU worker group"
        for g in gpu_groups:
            spec = g["template"]["spec"]
            limits = spec["containers"][0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1
            assert spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == limits["nvidia.com/gpu"]
            assert any(
                t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" and t["effect"] == "NoSchedule"
                for t in spec["tolerations"]
            )
            # The GPU request places the pod; a label only GPU Feature Discovery sets must not.
            assert "nvidia.com/gpu.present" not in spec.get("nodeSelector", {})
            assert g["minReplicas"] <= g["maxReplicas"]


@pytest.mark.parametrize("resources", _resources())
def test_ray_pods_carry_the_labels_the_network_policies_select(resources):
    for r in (r for r in resources if r["kind"] in ("RayJob", "RayCluster")):
        cluster = dr.ray_cluster_spec(r)
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        for g in groups:
            labels = g["template"]["metadata"]["labels"]
            assert labels.get("calib-sweeps/ray-node") == "true"
            assert labels.get("calib-sweeps/mlflow-client") == "true"


# ------------------------------------------------------------------------ NetworkPolicy model


allowed = dc.policy_allows


def _template_labels(resources: list[dict], kind: str, name: str, role: str | None = None) -> dict:
    r = next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)
    if kind in ("RayJob", "RayCluster"):
        cluster = dr.ray_cluster_spec(r)
        group = cluster["headGroupSpec"] if role == "head" else cluster["workerGroupSpecs"][0]
        labels = dict(group["template"]["metadata"]["labels"])
        # KubeRay adds its own labels to the pods it creates.
        labels.update({"ray.io/node-type": role, "app.kubernetes.io/created-by": "kuberay-operator"})
        return labels
    return r["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("resources", _resources())
def test_network_policies(resources):
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    assert any(
        p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"] and not p["spec"].get("ingress")
        for p in policies
    ), "no default-deny ingress policy"
    head = _template_labels(resources, "RayJob", "calib-sweep", "head")
    worker = _template_labels(resources, "RayJob", "calib-sweep", "worker")
    interactive_head = _template_labels(resources, "RayCluster", "calib-interactive", "head")
    mlflow = _template_labels(resources, "Deployment", "mlflow")
    rayjob = next(r for r in resources if r["kind"] == "RayJob")
    submitter = rayjob["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    stranger_here = {"app": "something-else"}
    outside = ("other-team", {"calib-sweeps/ray-node": "true", "calib-sweeps/mlflow-client": "true"})
    ingress = ("gateway-system", {"app": "gateway-proxy"})  # the UI's way in: the Gateway's data plane

    def ok(src, dst, port):
        return allowed(policies, ns, src, dst, port)

    for ray_pod in (head, worker, interactive_head):
        for port in (6379, 8265, 10001):
            assert ok((ns, worker), ray_pod, port) and ok((ns, head), ray_pod, port)
            assert ok((ns, submitter), ray_pod, port) and ok((ns, operator), ray_pod, port)
            assert not ok(outside, ray_pod, port), f"{outside[0]} reaches Ray port {port}"
            assert not ok(ingress, ray_pod, port), f"ingress reaches Ray port {port}"
    assert ok((ns, head), mlflow, 5000) and ok((ns, worker), mlflow, 5000)
    assert ok(ingress, mlflow, 5000)
    assert not ok((ns, stranger_here), mlflow, 5000)
    assert not ok((ns, submitter), mlflow, 5000)
    assert not ok(outside, mlflow, 5000)
    assert not ok((ns, head), mlflow, 22)
    # Every other rendered workload is closed to strangers, too.
    for r in resources:
        if r["kind"] in ("StatefulSet", "Deployment"):
            labels = r["spec"]["template"]["metadata"]["labels"]
            for port in (5432, 9000, 5000):
                assert not ok((ns, stranger_here), labels, port), f"{r['metadata']['name']}:{port} open"
    if any(r["kind"] == "StatefulSet" and r["metadata"]["name"] == "postgres" for r in resources):
        pg = _template_labels(resources, "StatefulSet", "postgres")
        optuna_job = _template_labels(resources, "Job", "optuna-db")
        # MLflow, the sweep driver (the Optuna study) and the Job creating its database; not the
        # trials, the submitter or anyone else.
        assert ok((ns, mlflow), pg, 5432) and ok((ns, head), pg, 5432) and ok((ns, interactive_head), pg, 5432)
        assert ok((ns, optuna_job), pg, 5432)
        assert not ok((ns, worker), pg, 5432) and not ok((ns, submitter), pg, 5432)
        assert not ok(outside, pg, 5432) and not ok((ns, stranger_here), pg, 5432)
    if any(r["kind"] == "StatefulSet" and r["metadata"]["name"] == "minio" for r in resources):
        minio = _template_labels(resources, "StatefulSet", "minio")
        job = _template_labels(resources, "Job", "minio-buckets")
        assert ok((ns, mlflow), minio, 9000) and ok((ns, worker), minio, 9000) and ok((ns, job), minio, 9000)
        assert not ok((ns, submitter), minio, 9000) and not ok(outside, minio, 9000)


# ------------------------------------------------------- the ports the Ray processes listen on


def _recorded_ray_ports() -> dict:
    """tests/containers/ray_ports.json: the TCP ports Ray's processes listened on in the head and
    worker pods of the dev RayJob, recorded by tests/containers/test_containers_ray.py (which fails when what
    Ray listens on no longer matches it)."""
    import json

    return json.loads((TESTS / "containers" / "ray_ports.json").read_text())


def _ports_of(record: dict, role: str) -> set[int]:
    """The fixed ports, every port seen for Ray's randomly placed listeners, the ends of the worker
    port range when core workers listen there, and the ends of the range Ray draws random ports
    from (the kernel's ephemeral range; any port above 1023) when it does."""
    r = record[role]
    lo, hi = record["worker_port_range"]
    ports = {int(p) for p in r["fixed"]}
    for seen in r["examples"].values():
        ports |= set(seen)
    if r["worker_port_range"]:
        ports |= {lo, hi}
    if r["random"]:
        ports |= {1024, 32768, 60999, 65535}
    return ports


def test_recorded_ray_ports_are_complete():
    record = _recorded_ray_ports()
    assert record["ray_version"] == "2.60.0" and record["recorded_on"]
    # What KubeRay's generated command and Ray's defaults fix (tests/containers/kuberay.py).
    assert {"6379", "8265", "10001", "8080", "52365"} <= set(record["head"]["fixed"])
    assert {"8080", "52365"} <= set(record["worker"]["fixed"])
    assert record["head"]["fixed"]["6379"] == "gcs_server" and record["head"]["fixed"]["8265"] == "dashboard"
    for role in ("head", "worker"):
        assert "raylet" in record[role]["random"], f"{role}: raylet ports missing"
        assert "core_worker" in record[role]["worker_port_range"] + record[role]["random"]


@pytest.mark.parametrize("resources", _resources())
def test_network_policies_admit_every_recorded_ray_port(resources):
    """Worker -> head (GCS, raylet, object manager, agents, the driver's and the actors' gRPC
    servers), head -> worker and worker -> worker (raylets, object managers, core workers), the
    submitter -> the head's dashboard (job API), for the RayJob's and the interactive cluster's
    pods; nobody outside the namespace."""
    record = _recorded_ray_ports()
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    rayjob = next(r for r in resources if r["kind"] == "RayJob")
    submitter = rayjob["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    outside = ("other-team", {"calib-sweeps/ray-node": "true"})
    head_ports, worker_ports = _ports_of(record, "head"), _ports_of(record, "worker")

    def ok(src, dst, port):
        return allowed(policies, ns, src, dst, port)

    for kind, name in (("RayJob", "calib-sweep"), ("RayCluster", "calib-interactive")):
        head = _template_labels(resources, kind, name, "head")
        worker = _template_labels(resources, kind, name, "worker")
        for port in sorted(head_ports):
            assert ok((ns, worker), head, port), f"{name}: worker -> head:{port} blocked"
            assert not ok(outside, head, port), f"{name}: head:{port} open to other namespaces"
        for port in sorted(worker_ports):
            assert ok((ns, head), worker, port), f"{name}: head -> worker:{port} blocked"
            assert ok((ns, worker), worker, port), f"{name}: worker -> worker:{port} blocked"
            assert not ok(outside, worker, port), f"{name}: worker:{port} open to other namespaces"
    head = _template_labels(resources, "RayJob", "calib-sweep", "head")
    dashboard = next(int(p) for p, what in record["head"]["fixed"].items() if what == "dashboard")
    assert ok((ns, submitter), head, dashboard), "the submitter cannot reach the job API"


# ------------------------------------------------------------------------ egress


egress_allowed = dc.policy_allows_egress


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda o: o.name)
def test_egress_is_closed_but_for_what_each_pod_needs(overlay):
    """A connectivity matrix over the rendered policies, the overlay's placeholder address ranges set as a user
    would (dr.EXAMPLE_ADDRESSES): DNS for all; Ray pods to each other; MLflow clients to MLflow; the submitter to
    the job API only; the head to the Kubernetes API; S3 clients to the object store's addresses (gpu-cluster: an
    S3 range; dev: MinIO); the overlay's stores to those that use them; nothing else (no other public address, no
    SSH out, no other port, no PostgreSQL for the trials, nothing for the stores themselves)."""
    resources = dr.render_with_addresses(overlay)
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    assert any(
        p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Egress"] and not p["spec"].get("egress")
        for p in policies
    ), "no default-deny egress policy"
    head = _template_labels(resources, "RayJob", "calib-sweep", "head")
    worker = _template_labels(resources, "RayJob", "calib-sweep", "worker")
    ihead = _template_labels(resources, "RayCluster", "calib-interactive", "head")
    mlflow = _template_labels(resources, "Deployment", "mlflow")
    rayjob = next(r for r in resources if r["kind"] == "RayJob")
    submitter = rayjob["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    dns = ("pod", "kube-system", {"k8s-app": "kube-dns"})

    def ok(src, dst, port, protocol="TCP"):
        return egress_allowed(policies, ns, src, dst, port, protocol)

    def pod(labels):
        return ("pod", ns, labels)

    everyone = [head, worker, ihead, mlflow, submitter]
    everyone += [r["spec"]["template"]["metadata"]["labels"] for r in resources if r["kind"] in ("StatefulSet", "Job")]
    for src in everyone:
        assert ok(src, dns, 53, "UDP") and ok(src, dns, 53, "TCP"), src
        assert not ok(src, ("ip", "203.0.113.7"), 22), f"{src}: SSH out"
        assert not ok(src, ("ip", "203.0.113.7"), 80), f"{src}: plain HTTP out"
        assert not ok(src, ("pod", "other-team", {"app": "x"}), 8080), f"{src}: another namespace"
    for a in (head, worker):
        for b in (head, worker):
            for port in (6379, 8265, 10001, 20000, 45000):
                assert ok(a, pod(b), port)
    managed = "postgres" not in {r["metadata"]["name"] for r in resources if r["kind"] == "StatefulSet"}
    for src in (head, worker, ihead):
        assert ok(src, pod(mlflow), 5000)
        # the object store's range: gpu-cluster's S3; dev has MinIO and nothing outside for the workers
        assert ok(src, ("ip", "52.216.1.1"), 443) == (managed or src is not worker)
        assert not ok(src, ("ip", "8.8.8.8"), 443) or (not managed and src is not worker)  # no other address
    api = "10.0.0.1" if managed else "10.96.0.1"  # gpu-cluster: the API server's address it was given
    assert ok(head, ("ip", api), 443) and ok(ihead, ("ip", api), 443)  # the API (autoscaler)
    assert not ok(worker, ("ip", api), 443)  # trials never reach the Kubernetes API
    assert ok(submitter, pod(head), 8265)
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    assert ok(operator, pod(head), 8265) and ok(operator, ("ip", api), 443)
    assert not ok(operator, pod(worker), 8265) and not ok(operator, ("ip", "203.0.113.7"), 22)
    assert not ok(submitter, pod(head), 6379) and not ok(submitter, pod(mlflow), 5000)
    assert not ok(submitter, ("ip", "52.216.1.1"), 443) and not ok(submitter, pod(worker), 8265)
    assert not ok(mlflow, pod(head), 6379) and not ok(mlflow, pod(worker), 10001)
    names = {r["metadata"]["name"] for r in resources if r["kind"] == "StatefulSet"}
    if "postgres" in names:
        pg = pod(_template_labels(resources, "StatefulSet", "postgres"))
        minio = pod(_template_labels(resources, "StatefulSet", "minio"))
        job = _template_labels(resources, "Job", "optuna-db")
        buckets = _template_labels(resources, "Job", "minio-buckets")
        assert ok(mlflow, pg, 5432) and ok(head, pg, 5432) and ok(ihead, pg, 5432) and ok(job, pg, 5432)
        assert not ok(worker, pg, 5432) and not ok(submitter, pg, 5432)
        assert (
            ok(mlflow, minio, 9000) and ok(worker, minio, 9000) and ok(head, minio, 9000) and ok(buckets, minio, 9000)
        )
        assert not ok(submitter, minio, 9000)
        for store in ("postgres", "minio"):
            labels = _template_labels(resources, "StatefulSet", store)
            assert not ok(labels, ("ip", "52.216.1.1"), 443) and not ok(labels, pod(mlflow), 5000), store
    else:  # a managed PostgreSQL outside the cluster
        assert ok(mlflow, ("ip", "10.20.0.5"), 5432) and ok(head, ("ip", "10.20.0.5"), 5432)
        assert not ok(worker, ("ip", "10.20.0.5"), 5432) and not ok(submitter, ("ip", "10.20.0.5"), 5432)


def _admits(affinity: dict, node_labels: dict) -> bool:
    """requiredDuringScheduling node affinity: any term whose expressions all hold (Gt/Lt on integers)."""
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        good = True
        for e in term["matchExpressions"]:
            v = node_labels.get(e["key"])
            op = e["operator"]
            if op == "In":
                good &= v in e["values"]
            elif op == "Gt":
                good &= v is not None and int(v) > int(e["values"][0])
            elif op == "Lt":
                good &= v is not None and int(v) < int(e["values"][0])
            elif op == "Exists":
                good &= v is not None
            else:
                raise AssertionError(op)
        if good:
            return True
    return False


def test_gpu_workers_land_only_on_gpus_the_cuda_build_supports():
    """gpu-cluster: the worker group's affinity admits compute capability 7.5 and newer (CUDA 13's floor) and
    refuses older GPUs, by the GPU Feature Discovery labels."""
    overlay = next(o for o in OVERLAYS if o.name == "gpu-cluster")
    rayjob = next(r for r in dr.render(overlay) if r["kind"] == "RayJob")
    aff = dr.ray_cluster_spec(rayjob)["workerGroupSpecs"][0]["template"]["spec"]["affinity"]

    def node(major: int, minor: int) -> dict:
        return {"nvidia.com/gpu.compute.major": str(major), "nvidia.com/gpu.compute.minor": str(minor)}

    for cc in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)):  # T4, A100, A10, L4, H100, B200, ...
        assert _admits(aff, node(*cc)), cc
    for cc in ((5, 2), (6, 0), (6, 1), (7, 0), (7, 2)):  # Maxwell, P100, P4/P40, V100, Xavier
        assert not _admits(aff, node(*cc)), cc
    assert not _admits(aff, {})  # a node without the labels: the README says to drop the affinity there


def test_no_ray_pod_reaches_a_public_address_until_the_overlay_names_the_object_store():
    """As committed, gpu-cluster's egress address ranges are placeholders (TEST-NET-1, routed nowhere): no pod
    reaches any public address on 443, and the release step refuses to render the overlay, naming each policy.
    Opting in to downloads from the internet is a component of its own."""
    overlay = next(o for o in OVERLAYS if o.name == "gpu-cluster")
    resources = dr.render(overlay)
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    for role in ("head", "worker"):
        labels = _template_labels(resources, "RayJob", "calib-sweep", role)
        for address in ("52.216.1.1", "8.8.8.8", "203.0.113.7"):
            assert not egress_allowed(policies, ns, labels, ("ip", address), 443), (role, address)
    left = release.placeholder_ranges(resources)
    assert {w.split(":")[0] for w in left} == {
        "NetworkPolicy/egress-s3-clients-https",
        "NetworkPolicy/egress-head-kubernetes-api",
        "NetworkPolicy/egress-kuberay-operator",
        "NetworkPolicy/egress-managed-postgres-from-mlflow",
        "NetworkPolicy/egress-managed-postgres-from-optuna-clients",
        "NetworkPolicy/egress-managed-postgres-from-admin-job",
    }
    assert all("placeholder address range" in p for p in release.problems(resources, for_apply=True)[: len(left)])
    assert release.placeholder_ranges(dr.render_with_addresses(overlay)) == []
    # dev: everything in the cluster (MinIO, PostgreSQL): nothing left to set
    assert release.placeholder_ranges(dr.render(next(o for o in OVERLAYS if o.name == "dev"))) == []


def test_public_https_for_downloads_is_an_opt_in_component(tmp_path):
    """deploy/components/public-https-egress opens 443 to public addresses for the Ray pods alone; private and
    link-local ranges stay closed."""
    overlay = next(o for o in OVERLAYS if o.name == "gpu-cluster")
    rel = lambda p: os.path.relpath(p, tmp_path)  # noqa: E731 - kustomize takes relative paths only
    component = dr.DEPLOY / "components" / "public-https-egress"
    (tmp_path / "kustomization.yaml").write_text(f"resources:\n  - {rel(overlay)}\ncomponents:\n  - {rel(component)}\n")
    resources = dr.render(tmp_path)
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    worker = _template_labels(resources, "RayJob", "calib-sweep", "worker")
    mlflow = _template_labels(resources, "Deployment", "mlflow")
    assert egress_allowed(policies, ns, worker, ("ip", "8.8.8.8"), 443)
    assert not egress_allowed(policies, ns, worker, ("ip", "8.8.8.8"), 80)
    assert not egress_allowed(policies, ns, worker, ("ip", "169.254.169.254"), 443)  # the metadata service
    assert not egress_allowed(policies, ns, worker, ("ip", "10.1.2.3"), 443)
    assert not egress_allowed(policies, ns, mlflow, ("ip", "8.8.8.8"), 443)

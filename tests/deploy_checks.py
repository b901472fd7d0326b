"""Deploy checks as functions: each takes one rendered overlay (a list of objects) and returns what
is wrong with it (an empty list when nothing is). tests/unit/deploy/test_deploy_checks.py runs every check on
every overlay; tests/unit/deploy/test_deploy_mutations.py plants known mistakes into the rendered manifests
and requires that some check reports each of them.

The checks encode how the pieces meet at run time, which schema validation cannot see: the ports
KubeRay derives from the head container (its head Service and the workers' GCS address), where
Ray keeps its object store, which ports the running Ray processes use (recorded by the container
tests in tests/containers/ray_ports.json), what a Service's targetPort and the tracking URI point
at, and what the MLflow server needs before it starts.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from tests import deploy_render as dr
from tests.containers import netpol

RAY_KINDS = ("RayJob", "RayCluster")
RAY_PORTS_FILE = dr.REPO_ROOT / "tests" / "containers" / "ray_ports.json"
# KubeRay v1.7 (ray-operator/controllers/ray/utils/constant.go): the head container's named ports
# become the head Service's ports; workers join <head-svc>:<rayStartParams.port or 6379>, the
# RayJob submitter and the operator use the port named "dashboard".
KUBERAY_HEAD_PORTS = {  # port name -> (rayStartParams key, default)
    "gcs-server": ("port", 6379),
    "dashboard": ("dashboard-port", 8265),
    "client": ("ray-client-server-port", 10001),
    "metrics": ("metrics-export-port", 8080),
}
# Node labels every cluster has (kubelet / cloud provider): the only ones a nodeSelector may use.
# GPU placement comes from the nvidia.com/gpu request; labels such as nvidia.com/gpu.present are set
# only by GPU Feature Discovery and would leave workers Pending on clusters without it.
WELL_KNOWN_NODE_LABELS = {
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
}
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(value) -> float:
    """A Kubernetes quantity (\"10Gi\", \"500m\", 3) as a number (bytes, cores)."""
    s = str(value)
    if s.endswith("m"):
        return float(s[:-1]) / 1000
    for unit, factor in _UNITS.items():
        if s.endswith(unit):
            return float(s[: -len(unit)]) * factor
    return float(s)


# ------------------------------------------------------------------------------------ helpers


def ray_objects(resources: list[dict]) -> list[dict]:
    return [r for r in resources if r["kind"] in RAY_KINDS]


def ray_groups(obj: dict) -> list[tuple[str, dict]]:
    """(\"head\" | \"worker:<group>\", group spec) of a RayJob's cluster or a RayCluster."""
    cluster = dr.ray_cluster_spec(obj)
    out = [("head", cluster["headGroupSpec"])]
    out += [(f"worker:{g['groupName']}", g) for g in cluster.get("workerGroupSpecs", [])]
    return out


def _where(obj: dict, role: str = "") -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}" + (f"/{role}" if role else "")


def config_map(resources: list[dict], name: str) -> dict:
    return next(
        (r.get("data", {}) for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == name), {}
    )


def container_env(resources: list[dict], c: dict) -> dict[str, str | None]:
    """Effective plain env of a container: envFrom ConfigMaps, then env (values; None for refs)."""
    env: dict[str, str | None] = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(config_map(resources, src["configMapRef"]["name"]))
    for e in c.get("env", []):
        env[e["name"]] = e.get("value")
    return env


def template_labels(obj: dict, role: str | None = None) -> dict:
    if obj["kind"] in RAY_KINDS:
        group = dict(ray_groups(obj))[role or "head"]
        labels = dict(group["template"]["metadata"].get("labels", {}))
        labels.update(
            {"ray.io/node-type": (role or "head").split(":")[0], "app.kubernetes.io/created-by": "kuberay-operator"}
        )
        return labels
    if obj["kind"] in dr.WORKLOAD_TEMPLATE_PATHS:
        node = obj
        for p in dr.WORKLOAD_TEMPLATE_PATHS[obj["kind"]]:
            node = node[p]
        return node["metadata"].get("labels", {})
    return {}


def pod_templates(resources: list[dict]) -> list[tuple[str, dict, dict]]:
    """(where, labels, PodSpec) of every pod the overlay creates (Ray pods as KubeRay labels them)."""
    out = []
    for r in resources:
        if r["kind"] in RAY_KINDS:
            for role, group in ray_groups(r):
                out.append((_where(r, role), template_labels(r, role), group["template"]["spec"]))
            if r["kind"] == "RayJob" and "submitterPodTemplate" in r["spec"]:
                t = r["spec"]["submitterPodTemplate"]
                out.append((_where(r, "submitter"), t.get("metadata", {}).get("labels", {}), t["spec"]))
        elif r["kind"] in dr.WORKLOAD_TEMPLATE_PATHS:
            for where, spec in dr.pod_specs(r):
                out.append((where, template_labels(r), spec))
    return out


selects = netpol.selects  # label selectors: the one model of NetworkPolicy semantics is tests/containers/netpol.py


def _in_namespace(policies: list[dict], namespace: str) -> list[dict]:
    """The policies, each in `namespace` unless it names its own."""
    return [{**p, "metadata": {"namespace": namespace, **p["metadata"]}} for p in policies]


def policy_allows(policies: list[dict], namespace: str, src: tuple[str, dict], dst_labels: dict, port: int) -> bool:
    """Kubernetes NetworkPolicy ingress semantics: whether a pod of `namespace` with `dst_labels` admits `src`
    (its namespace, labels) on TCP `port`."""
    src_ep = netpol.Endpoint("src", src[0], dict(src[1]))
    dst_ep = netpol.Endpoint("dst", namespace, dict(dst_labels))
    return netpol.ingress_allows(_in_namespace(policies, namespace), src_ep, dst_ep, port)


def policy_allows_egress(
    policies: list[dict], namespace: str, src_labels: dict, dst: tuple, port: int, protocol: str = "TCP"
) -> bool:
    """Kubernetes NetworkPolicy egress semantics for a pod of `namespace` with `src_labels`: dst is
    ("pod", namespace, labels) or ("ip", address)."""
    src_ep = netpol.Endpoint("src", namespace, dict(src_labels))
    dst_ep = (
        netpol.Endpoint("dst", None, address=dst[1]) if dst[0] == "ip" else netpol.Endpoint("dst", dst[1], dict(dst[2]))
    )
    return netpol.egress_allows(_in_namespace(policies, namespace), src_ep, dst_ep, port, protocol)


def recorded_ray_ports() -> list[dict]:
    """Ports the running Ray processes listened on in the container test (tests/containers/)."""
    if not RAY_PORTS_FILE.is_file():
        return []
    return json.loads(RAY_PORTS_FILE.read_text())["ports"]


def entrypoint_options(job: dict) -> dict[str, list[str]]:
    tokens = shlex.split(job["spec"]["entrypoint"])
    opts: dict[str, list[str]] = {}
    i = 2
    while i < len(tokens):
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            opts.setdefault(tokens[i], []).append(tokens[i + 1])
            i += 2
        else:
            opts.setdefault(tokens[i], []).append("")
            i += 1
    return opts


# ------------------------------------------------------------------------------------- checks


def check_head_ports(resources: list[dict]) -> list[str]:
    """The head container's named ports are the ones KubeRay and the Ray processes agree on."""
    problems = []
    for r in ray_objects(resources):
        head = dr.ray_cluster_spec(r)["headGroupSpec"]
        params = head.get("rayStartParams", {})
        ports = {p.get("name"): p["containerPort"] for p in head["template"]["spec"]["containers"][0].get("ports", [])}
        for name, (param, default) in KUBERAY_HEAD_PORTS.items():
            want = int(params.get(param, default))
            if ports.get(name) != want:
                problems.append(
                    f"{_where(r, 'head')}: container port {name!r} is {ports.get(name)}, Ray listens on {want}"
                )
    return problems


def check_shared_memory(resources: list[dict]) -> list[str]:
    """Ray's object store lives in /dev/shm: a memory-backed emptyDir larger than the store."""
    problems = []
    for r in ray_objects(resources):
        for role, group in ray_groups(r):
            spec = group["template"]["spec"]
            c = spec["containers"][0]
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            mount = next((m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"), None)
            vol = volumes.get(mount["name"], {}) if mount else {}
            empty_dir = vol.get("emptyDir")
            if not mount or empty_dir is None or empty_dir.get("medium") != "Memory":
                problems.append(f"{_where(r, role)}: /dev/shm must be an emptyDir with medium: Memory")
                continue
            store = group.get("rayStartParams", {}).get("object-store-memory")
            if store is None:
                problems.append(f"{_where(r, role)}: set object-store-memory (Ray would size it from the node)")
                continue
            shm = quantity(empty_dir.get("sizeLimit", 0))
            mem = quantity(c.get("resources", {}).get("limits", {}).get("memory", 0))
            if not shm or int(store) > shm:
                problems.append(f"{_where(r, role)}: object-store-memory {store} exceeds /dev/shm ({shm:.0f} bytes)")
            if mem and int(store) + shm > mem:
                problems.append(f"{_where(r, role)}: object store + /dev/shm exceed the memory limit")
    return problems


def check_node_selectors(resources: list[dict]) -> list[str]:
    problems = []
    for where, _, spec in pod_templates(resources):
        for key in spec.get("nodeSelector", {}):
            if key not in WELL_KNOWN_NODE_LABELS:
                problems.append(
                    f"{where}: nodeSelector {key!r} is not a label every node has "
                    "(the nvidia.com/gpu request places GPU pods)"
                )
    for r in ray_objects(resources):
        for role, group in ray_groups(r):
            spec = group["template"]["spec"]
            limits = spec["containers"][0].get("resources", {}).get("limits", {})
            tolerated = any(
                t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" for t in spec.get("tolerations", [])
            )
            if "nvidia.com/gpu" in limits and not tolerated:
                problems.append(f"{_where(r, role)}: GPU pods must tolerate the nvidia.com/gpu taint")
    return problems


def check_ray_network_policy(resources: list[dict]) -> list[str]:
    """Every port the running Ray processes listened on is open between the Ray pods, and the
    dashboard (job API) is open to the submitter and the operator; nothing outside the namespace."""
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    problems = []
    ports = recorded_ray_ports() or [{"port": p, "role": "head"} for p in (6379, 8265, 10001, 8080, 52365)]
    operator = (ns, {"app.kubernetes.io/name": "kuberay-operator"})
    outside = ("other-team", {"calib-sweeps/ray-node": "true"})
    for r in ray_objects(resources):
        peers = {role: template_labels(r, role) for role, _ in ray_groups(r)}
        for p in ports:
            role = "head" if p["role"] == "head" else next(k for k in peers if k.startswith("worker"))
            for src_role, src in peers.items():
                if not policy_allows(policies, ns, (ns, src), peers[role], p["port"]):
                    what = p.get("process", "?")
                    problems.append(f"{_where(r, role)}: port {p['port']} ({what}) closed to {src_role}")
            if policy_allows(policies, ns, outside, peers[role], p["port"]):
                problems.append(f"{_where(r, role)}: port {p['port']} open to other namespaces")
        head = peers["head"]
        if r["kind"] == "RayJob":
            sub = r["spec"].get("submitterPodTemplate", {}).get("metadata", {}).get("labels", {})
            if not policy_allows(policies, ns, (ns, sub), head, 8265):
                problems.append(f"{_where(r)}: the submitter cannot reach the dashboard")
        if not policy_allows(policies, ns, operator, head, 8265):
            problems.append(f"{_where(r)}: the operator cannot reach the dashboard")
    return problems


def check_services_target_pods(resources: list[dict]) -> list[str]:
    """Every Service selects a pod template, and each targetPort is a port of that pod."""
    problems = []
    templates = pod_templates(resources)
    for svc in (r for r in resources if r["kind"] == "Service"):
        selector = {"matchLabels": svc["spec"].get("selector", {})}
        targets = [(w, spec) for w, labels, spec in templates if selector["matchLabels"] and selects(selector, labels)]
        name = f"Service/{svc['metadata']['name']}"
        if not targets:
            problems.append(f"{name}: selects no pod")
            continue
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            for where, spec in targets:
                cports = [cp for c in spec["containers"] for cp in c.get("ports", [])]
                if not any(cp.get("name") == target or cp["containerPort"] == target for cp in cports):
                    problems.append(f"{name}: targetPort {target!r} is not a port of {where}")
    return problems


def check_tracking_uri(resources: list[dict]) -> list[str]:
    """The MLflow URI of the Ray pods and of the entrypoint is the MLflow Service's port."""
    problems = []
    services = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Service"}
    ns = dr.namespace_of(resources)
    uris = {}
    for r in ray_objects(resources):
        for role, group in ray_groups(r):
            env = container_env(resources, group["template"]["spec"]["containers"][0])
            uris[_where(r, role)] = env.get("MLFLOW_TRACKING_URI")
        if r["kind"] == "RayJob":
            uris[_where(r, "entrypoint")] = (entrypoint_options(r).get("--tracking-uri") or [None])[0]
    for where, uri in uris.items():
        if not uri:
            problems.append(f"{where}: no MLFLOW_TRACKING_URI")
            continue
        u = urlsplit(uri)
        host = (u.hostname or "").split(".")
        svc = services.get(host[0])
        if u.scheme != "https" or svc is None or (len(host) > 1 and host[1] != ns):
            problems.append(f"{where}: {uri} is not a Service of this overlay")
            continue
        if svc["spec"].get("selector", {}).get("app.kubernetes.io/name") != "mlflow":
            problems.append(f"{where}: {uri} does not reach the MLflow server")
        if not any(p["port"] == (u.port or 80) for p in svc["spec"]["ports"]):
            problems.append(f"{where}: {uri}: Service {host[0]} has no port {u.port or 80}")
    if len(set(uris.values())) > 1:
        problems.append(f"tracking URIs differ: {sorted(set(map(str, uris.values())))}")
    return problems


MLFLOW_TLS_SECRET = "mlflow-tls"


def _secret_mount(spec: dict, c: dict, path: str) -> dict | None:
    """The Secret volume mounted at the folder holding `path` in container `c`, or None."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        if path.startswith(m["mountPath"].rstrip("/") + "/") and "secret" in volumes.get(m["name"], {}):
            return volumes[m["name"]]["secret"]
    return None


def check_mlflow_tls(resources: list[dict]) -> list[str]:
    """MLflow serves TLS with the certificate and key of Secret mlflow-tls, probed over HTTPS; every MLflow
    client (a container with MLflow credentials) verifies it: MLFLOW_TRACKING_SERVER_CERT_PATH is a file of a
    mounted mlflow-tls volume that projects ca.crt alone (never the server's key), and no one turns checks off."""
    problems = []
    dep = next((r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "mlflow"), None)
    if dep is None:
        return ["no MLflow Deployment"]
    spec = dep["spec"]["template"]["spec"]
    server = next(c for c in spec["containers"] if c["name"] == "mlflow")
    args = server.get("args", [])
    opts = args[args.index("--uvicorn-opts") + 1].split() if "--uvicorn-opts" in args else []
    files = dict(o.removeprefix("--").split("=", 1) for o in opts if o.startswith("--ssl-") and "=" in o)
    for opt in ("ssl-certfile", "ssl-keyfile"):
        sec = _secret_mount(spec, server, files.get(opt, ""))
        if sec is None or sec.get("secretName") != MLFLOW_TLS_SECRET:
            problems.append(f"Deployment/mlflow: --{opt} is not a file of Secret {MLFLOW_TLS_SECRET} (args {args})")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if server.get(probe, {}).get("httpGet", {}).get("scheme") != "HTTPS":
            problems.append(f"Deployment/mlflow: {probe} is not HTTPS")
    for r in resources:
        for where, pod in dr.pod_specs(r):
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                env = container_env(resources, c)
                if env.get("MLFLOW_TRACKING_INSECURE_TLS", "false").lower() not in ("false", "0", ""):
                    problems.append(
                        f"{where}/{c['name']}: MLFLOW_TRACKING_INSECURE_TLS turns the certificate check off"
                    )
                if "MLFLOW_TRACKING_USERNAME" not in env:
                    continue
                uri, ca = env.get("MLFLOW_TRACKING_URI") or "", env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or ""
                if not uri.startswith("https://"):
                    problems.append(f"{where}/{c['name']}: MLflow client with {uri or 'no URI'}, not HTTPS")
                sec = _secret_mount(pod, c, ca)
                if sec is None or sec.get("secretName") != MLFLOW_TLS_SECRET:
                    problems.append(
                        f"{where}/{c['name']}: MLFLOW_TRACKING_SERVER_CERT_PATH {ca!r} is not mlflow-tls's CA"
                    )
                elif [i.get("key") for i in sec.get("items", [])] != ["ca.crt"]:
                    problems.append(
                        f"{where}/{c['name']}: mounts {MLFLOW_TLS_SECRET} beyond ca.crt: {sec.get('items')}"
                    )
    return problems


POSTGRES_CA_SECRET, POSTGRES_TLS_SECRET = "postgres-ca", "postgres-tls"
POSTGRES_DSN_SECRETS = {"mlflow-db", "optuna-storage", "postgres-credentials"}


def _server_options(args: list[str]) -> dict[str, str]:
    """PostgreSQL's `-c name=value` options from a container's args."""
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args[:-1]) if a == "-c" and "=" in args[i + 1])


def check_postgres_tls(resources: list[dict]) -> list[str]:
    """An in-cluster PostgreSQL serves TLS with Secret postgres-tls and its pg_hba.conf admits network
    connections over TLS alone (hostssl); every PostgreSQL client (a container given a DSN or the admin password)
    connects with PGSSLMODE=verify-full against PGSSLROOTCERT, a file of a mounted postgres-ca volume projecting
    ca.crt alone."""
    problems = []
    server = next((r for r in resources if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "postgres"), None)
    if server is not None:
        spec = server["spec"]["template"]["spec"]
        c = next(c for c in spec["containers"] if c["name"] == "postgres")
        opts = _server_options(c.get("args", []))
        if opts.get("ssl") != "on":
            problems.append(f"StatefulSet/postgres: ssl is not on (args {c.get('args')})")
        for opt in ("ssl_cert_file", "ssl_key_file"):
            sec = _secret_mount(spec, c, opts.get(opt, ""))
            if sec is None or sec.get("secretName") != POSTGRES_TLS_SECRET:
                problems.append(f"StatefulSet/postgres: {opt} is not a file of Secret {POSTGRES_TLS_SECRET}")
        hba_path = opts.get("hba_file", "")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        hba = None
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if hba_path.startswith(m["mountPath"].rstrip("/") + "/") and "configMap" in v:
                hba = config_map(resources, v["configMap"]["name"]).get(hba_path.rsplit("/", 1)[1])
        if hba is None:
            problems.append(f"StatefulSet/postgres: hba_file {hba_path!r} is not a file of a mounted ConfigMap")
        else:
            rules = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            open_rules = [" ".join(r) for r in rules if r[0] not in ("local", "hostssl")]
            if open_rules:
                problems.append(f"StatefulSet/postgres: pg_hba.conf admits connections without TLS: {open_rules}")
    for r in resources:
        for where, pod in dr.pod_specs(r):
            if r["kind"] == "StatefulSet" and r["metadata"]["name"] == "postgres":
                continue
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                refs = {
                    e["valueFrom"]["secretKeyRef"]["name"]
                    for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})
                }
                if not refs & POSTGRES_DSN_SECRETS:
                    continue
                env = container_env(resources, c)
                if env.get("PGSSLMODE") != "verify-full":
                    problems.append(f"{where}/{c['name']}: PostgreSQL client with PGSSLMODE={env.get('PGSSLMODE')}")
                ca = env.get("PGSSLROOTCERT") or ""
                sec = _secret_mount(pod, c, ca)
                if sec is None or sec.get("secretName") != POSTGRES_CA_SECRET:
                    problems.append(f"{where}/{c['name']}: PGSSLROOTCERT {ca!r} is not a file of Secret postgres-ca")
                elif [i.get("key") for i in sec.get("items", [])] != ["ca.crt"]:
                    problems.append(f"{where}/{c['name']}: mounts {POSTGRES_CA_SECRET} beyond ca.crt")
    return problems


def check_mlflow_migrates_before_start(resources: list[dict]) -> list[str]:
    """The MLflow pod waits for its database, plans, backs up and runs `mlflow db upgrade`, in that order,
    before the server; the MLflow steps run the server's image (same MLflow version)."""
    dep = next((r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "mlflow"), None)
    if dep is None:
        return ["no MLflow Deployment"]
    spec = dep["spec"]["template"]["spec"]
    inits = spec.get("initContainers", [])
    commands = [" ".join(c.get("command", []) + c.get("args", [])) for c in inits]
    steps = {
        "waits for the database": r"mlflow-db-upgrade wait|pg_isready",
        "plans the migration": r"mlflow-db-upgrade plan",
        "backs the database up (pg_dump)": r"pg_dump",
        "runs the schema migration (mlflow db upgrade)": r"mlflow-db-upgrade upgrade|mlflow db upgrade",
    }
    problems, order = [], []
    for what, pattern in steps.items():
        at = next((i for i, c in enumerate(commands) if re.search(pattern, c)), None)
        if at is None:
            problems.append(f"mlflow: no init container {what}")
        else:
            order.append((what, at))
    for (first, i), (then, j) in zip(order, order[1:]):
        if i > j:
            problems.append(f"mlflow: the init container that {then} runs before the one that {first}")
    main_image = spec["containers"][0]["image"]
    for c, cmd in zip(inits, commands):
        if "pg_dump" in cmd:
            continue  # PostgreSQL's image: its pg_dump
        if c["image"] != main_image:
            problems.append(f"mlflow: init container {c['name']} must run the server's image (same MLflow version)")
        env = {e["name"] for e in c.get("env", [])}
        if "MLFLOW_BACKEND_STORE_URI" not in env:
            problems.append(f"mlflow: init container {c['name']} has no MLFLOW_BACKEND_STORE_URI")
    if dep["spec"].get("strategy", {}).get("type") != "Recreate":
        problems.append("mlflow: strategy must be Recreate (no old server on a migrated schema)")
    return problems


def check_images_pinned_by_digest(resources: list[dict]) -> list[str]:
    problems = []
    for where, _, spec in pod_templates(resources):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            image = c["image"]
            if "/calib-sweeps/" in image or image.startswith("calib-sweeps/"):
                if not re.search(r"@sha256:[0-9a-f]{64}$", image):
                    problems.append(f"{where}/{c['name']}: {image} is not pinned by digest")
            elif not re.search(r":[\w.-]+(@sha256:[0-9a-f]{64})?$", image) or image.endswith(":latest"):
                problems.append(f"{where}/{c['name']}: {image} has no fixed tag")
    return problems


def check_ephemeral_storage(resources: list[dict]) -> list[str]:
    """Every container requests and limits ephemeral storage (logs and disk emptyDirs count)."""
    problems = []
    containers = [
        (w, c)
        for w, _, spec in pod_templates(resources)
        for c in spec.get("containers", []) + spec.get("initContainers", [])
    ]
    for r in ray_objects(resources):
        containers.append((_where(r, "autoscaler"), dr.ray_cluster_spec(r).get("autoscalerOptions", {})))
    for where, c in containers:
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            if "ephemeral-storage" not in res.get(part, {}):
                problems.append(f"{where}/{c.get('name', 'autoscaler')}: no {part}.ephemeral-storage")
    for where, _, spec in pod_templates(resources):
        disk = sum(
            quantity(v["emptyDir"].get("sizeLimit", 0))
            for v in spec.get("volumes", [])
            if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
        )
        limit = sum(
            quantity(c.get("resources", {}).get("limits", {}).get("ephemeral-storage", 0))
            for c in spec.get("containers", [])
        )
        if limit and disk > limit:
            problems.append(f"{where}: disk emptyDirs ({disk / 2**30:.0f}Gi) exceed the ephemeral-storage limit")
    return problems


def check_head_not_evicted(resources: list[dict]) -> list[str]:
    problems = []
    for r in ray_objects(resources):
        meta = dr.ray_cluster_spec(r)["headGroupSpec"]["template"].get("metadata", {})
        if meta.get("annotations", {}).get(SAFE_TO_EVICT) != "false":
            problems.append(f'{_where(r, "head")}: needs {SAFE_TO_EVICT}: "false" (it runs the driver for days)')
    return problems


def check_telemetry_off(resources: list[dict]) -> list[str]:
    problems = []
    for where, _, spec in pod_templates(resources):
        # The processes that import mlflow: Ray head and workers, the MLflow server and its migration.
        if not (where.startswith(RAY_KINDS) and "submitter" not in where or where == "Deployment/mlflow"):
            continue
        for c in spec["containers"] + spec.get("initContainers", []):
            if "postgres" in c["image"]:  # the backup step's pg_dump: no MLflow in it
                continue
            env = container_env(resources, c)
            for k, v in TELEMETRY_OFF.items():
                if (env.get(k) or "").lower() != v:
                    problems.append(f"{where}/{c['name']}: {k} must be {v}")
    return problems


def check_datasets_cached(resources: list[dict]) -> list[str]:
    """Ray pods keep the dataset root on a PVC (a retry must not download everything again), and
    the overlay itself holds no PVC or Namespace (`kubectl delete -k` would delete them)."""
    problems = []
    for r in resources:
        if r["kind"] in ("Namespace", "PersistentVolumeClaim"):
            problems.append(f"{r['kind']}/{r['metadata']['name']} belongs in persistent/, not in the overlay")
    for r in ray_objects(resources):
        for role, group in ray_groups(r):
            spec = group["template"]["spec"]
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            mount = next((m for m in spec["containers"][0].get("volumeMounts", []) if m["mountPath"] == "/data"), None)
            if mount is None or "persistentVolumeClaim" not in volumes.get(mount["name"], {}):
                problems.append(f"{_where(r, role)}: /data (datasets) must be the ray-datasets PVC")
    return problems


def check_data_reachable(resources: list[dict]) -> list[str]:
    """The RayJob's data is reachable under the overlay's own policies: no download at run time unless the Ray
    pods may reach public addresses (components/public-https-egress); otherwise ray-env names the staged copy
    (CALIB_DATASETS_URI) in the Tune results bucket, whose key the Ray pods hold (deploy/README.md, "Stage the
    datasets")."""
    public = any(r["kind"] == "NetworkPolicy" and r["metadata"]["name"] == "egress-ray-public-https" for r in resources)
    staged = config_map(resources, "ray-env").get("CALIB_DATASETS_URI", "")
    problems = []
    for r in resources:
        if r["kind"] != "RayJob":
            continue
        opts = entrypoint_options(r)
        sets = dict(s.split("=", 1) for s in opts.get("--set", []) if "=" in s)
        if sets.get("run.data.download", "false").lower() == "true":
            if not public:
                problems.append(
                    f"{_where(r, 'entrypoint')}: run.data.download=true, but the Ray pods reach no public address; "
                    "stage the data (make stage-data) or add components/public-https-egress"
                )
            continue
        bucket = (opts.get("--storage-path") or [""])[0].removeprefix("s3://").split("/")[0]
        if not staged.startswith(f"s3://{bucket}/"):
            problems.append(
                f"ConfigMap/ray-env: CALIB_DATASETS_URI={staged!r} must be under s3://{bucket}/ (the Tune bucket, "
                "whose key the Ray pods hold), where make stage-data put the datasets"
            )
    return problems


def _env_value(resources: list[dict], kind: str, name: str, container: str, var: str) -> str | None:
    for r in resources:
        if r["kind"] == kind and r["metadata"]["name"] == name:
            for _, spec in dr.pod_specs(r):
                for c in spec.get("containers", []):
                    if c["name"] == container:
                        return next((e.get("value") for e in c.get("env", []) if e["name"] == var), None)
    return None


def check_tenant_references(resources: list[dict]) -> list[str]:
    """Every reference follows the tenant: a `<namespace>/<secret>` annotation names the object's own namespace, and
    where the overlay carries tenant values (ConfigMap calib-tenant: the UI host, the buckets) every place that uses
    one holds it (deploy/tenant writes them; a tenant that wrapped the overlay without listing it keeps the default
    tenant's host, buckets and namespace)."""
    problems = []
    for r in resources:
        ns = r["metadata"].get("namespace")
        for key, value in (r["metadata"].get("annotations") or {}).items():
            if key.endswith("-secret") and isinstance(value, str) and "/" in value and value.split("/", 1)[0] != ns:
                problems.append(f"{r['kind']}/{r['metadata']['name']}: {key}={value} names another namespace than {ns}")
    values = next(
        (r.get("data", {}) for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == "calib-tenant"),
        None,
    )
    if values is None:
        return problems

    def want(where: str, got, expected) -> None:
        if got != expected:
            problems.append(
                f"{where} is {got!r}, not the tenant's {expected!r} (ConfigMap calib-tenant; deploy/tenant)"
            )

    host = values.get("UI_HOST")
    for r in resources:
        if r["kind"] == "Ingress" and r["metadata"]["name"] == "mlflow":
            spec = r["spec"]
            want("Ingress/mlflow host", [x.get("host") for x in spec.get("rules", [])], [host])
            want("Ingress/mlflow tls hosts", [h for x in spec.get("tls", []) for h in x.get("hosts", [])], [host])
        if r["kind"] == "HTTPRoute" and r["metadata"]["name"] == "mlflow":
            want("HTTPRoute/mlflow hostnames", r["spec"].get("hostnames"), [host])
    allowed = _env_value(resources, "Deployment", "mlflow", "mlflow", "MLFLOW_SERVER_ALLOWED_HOSTS") or ""
    want("Deployment/mlflow MLFLOW_SERVER_ALLOWED_HOSTS's first host", allowed.split(",")[0], host)
    origins = _env_value(resources, "Deployment", "mlflow", "mlflow", "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS")
    want("Deployment/mlflow MLFLOW_SERVER_CORS_ALLOWED_ORIGINS", origins, f"https://{host}")
    artifacts = _env_value(resources, "Deployment", "mlflow", "mlflow", "MLFLOW_ARTIFACTS_DESTINATION")
    want("Deployment/mlflow MLFLOW_ARTIFACTS_DESTINATION", artifacts, values.get("MLFLOW_ARTIFACTS_URI"))
    for r in resources:
        if r["kind"] == "RayJob":
            want(
                f"{_where(r, 'entrypoint')} --storage-path",
                entrypoint_options(r).get("--storage-path"),
                [values.get("TUNE_STORAGE_URI")],
            )
    ray_env = config_map(resources, "ray-env")
    want("ConfigMap/ray-env RAY_LOGS_URI", ray_env.get("RAY_LOGS_URI"), values.get("RAY_LOGS_URI"))
    want("ConfigMap/ray-env CALIB_DATASETS_URI", ray_env.get("CALIB_DATASETS_URI"), values.get("DATASETS_URI"))
    backup = next(
        (
            r.get("data", {})
            for r in resources
            if r["kind"] == "ConfigMap" and re.fullmatch(r"db-backup(-[a-z0-9]{10})?", r["metadata"]["name"])
        ),
        {},
    )
    want("ConfigMap/db-backup BACKUP_S3_URI", backup.get("BACKUP_S3_URI"), values.get("BACKUP_S3_URI"))
    return problems


def check_token_auth(resources: list[dict]) -> list[str]:
    problems = []
    for r in ray_objects(resources):
        cluster = dr.ray_cluster_spec(r)
        if cluster.get("authOptions") != {"mode": "token", "secretName": "ray-auth-token"}:
            problems.append(f"{_where(r)}: authOptions must use the ray-auth-token Secret")
        # KubeRay (pod.go, v1.7) sets both on the autoscaler it builds, then appends autoscalerOptions.env:
        # naming them there too would give the container each variable twice.
        dup = {e["name"] for e in cluster.get("autoscalerOptions", {}).get("env", [])} & {
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN",
        }
        if dup:
            problems.append(f"{_where(r, 'autoscaler')}: {sorted(dup)} duplicate what KubeRay injects")
        containers = []
        for where, _, spec in pod_templates([r]):
            containers += [(where, c) for c in spec["containers"]]
        for where, c in containers:
            env = {e["name"]: e for e in c.get("env", [])}
            ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
            if env.get("RAY_AUTH_MODE", {}).get("value") != "token" or (ref.get("name"), ref.get("key")) != (
                "ray-auth-token",
                "auth_token",
            ):
                problems.append(f"{where}: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from ray-auth-token/auth_token")
    return problems


def check_ray_version(resources: list[dict]) -> list[str]:
    pins = {}
    for line in (dr.REPO_ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("ray=="):
            pins["ray"] = line.split("==", 1)[1].strip()
    return [
        f"{_where(r)}: rayVersion {dr.ray_cluster_spec(r).get('rayVersion')} != ray {pins['ray']}"
        for r in ray_objects(resources)
        if dr.ray_cluster_spec(r).get("rayVersion") != pins["ray"]
    ]


def check_pod_hardening(resources: list[dict]) -> list[str]:
    from tests.unit.deploy.test_deploy_security import pod_violations

    return [p for where, _, spec in pod_templates(resources) for p in pod_violations(where.split(":")[0], spec)]


def check_mlflow_reachable_only_by_clients(resources: list[dict]) -> list[str]:
    ns = dr.namespace_of(resources)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    problems = []
    mlflow = next(labels for w, labels, _ in pod_templates(resources) if w == "Deployment/mlflow")
    for where, labels, _ in pod_templates(resources):
        client = labels.get("calib-sweeps/mlflow-client") == "true"
        if policy_allows(policies, ns, (ns, labels), mlflow, 5000) != client:
            problems.append(f"{where}: {'cannot' if client else 'can'} reach MLflow")
    if policy_allows(policies, ns, (ns, {"app": "stranger"}), mlflow, 5000):
        problems.append("MLflow is open to every pod of the namespace")
    return problems


def _scaled(value, total: int, round_up: bool) -> int:
    """A PDB's intOrString against TOTAL replicas (percentages as the disruption controller scales them)."""
    if isinstance(value, str) and value.endswith("%"):
        exact = int(value[:-1]) * total / 100
        return int(-(-exact // 1)) if round_up else int(exact)
    return int(value)


def check_pdbs_drainable(resources: list[dict]) -> list[str]:
    """No PodDisruptionBudget leaves its workload no eviction at full health: `minAvailable: 1` on one replica
    (or `maxUnavailable: 0`) refuses every drain of its node and every cluster-autoscaler scale-down, until
    someone scales the workload to 0 (issue #46: MLflow's and PostgreSQL's did)."""
    problems = []
    workloads = [r for r in resources if r["kind"] in ("Deployment", "StatefulSet", "ReplicaSet")]
    for pdb in (r for r in resources if r["kind"] == "PodDisruptionBudget"):
        spec = pdb["spec"]
        for w in workloads:
            if not selects(spec.get("selector") or {}, template_labels(w)):
                continue
            replicas = w["spec"].get("replicas", 1)
            if "minAvailable" in spec:
                allowed = replicas - _scaled(spec["minAvailable"], replicas, round_up=True)
            else:
                allowed = _scaled(spec.get("maxUnavailable", 1), replicas, round_up=True)
            if replicas and allowed < 1:
                rule = {k: spec[k] for k in ("minAvailable", "maxUnavailable") if k in spec}
                problems.append(
                    f"PodDisruptionBudget/{pdb['metadata']['name']}: {rule} on {w['kind']}/{w['metadata']['name']}"
                    f" ({replicas} replica(s)) allows no eviction: every node drain blocks (use maxUnavailable: 1)"
                )
    return problems


def check_autoscaler_reaches_api(resources: list[dict]) -> list[str]:
    """deploy/release.py's preflight: the Ray head's autoscaler has a way to the Kubernetes API under the
    NetworkPolicies (and, where the render holds a CiliumNetworkPolicy, under Cilium's rules)."""
    from deploy import release

    problem = release.api_server_route_problem(resources)
    return [problem] if problem else []


@functools.lru_cache(maxsize=512)
def _schema_errors(text: str) -> tuple[str, ...]:
    import kubernetes_validate

    from tests.unit.deploy.test_deploy_k8s import K8S_LATEST, kuberay_errors

    r = json.loads(text)
    if dr.is_builtin(r):
        try:
            kubernetes_validate.validate(r, K8S_LATEST, strict=True)
        except kubernetes_validate.ValidationError as e:
            return (f"{r['kind']}/{r['metadata'].get('name') or r['metadata'].get('generateName')}: {e.message}",)
        return ()
    if r["kind"] in RAY_KINDS:
        return tuple(f"{_where(r)}: {e}" for e in kuberay_errors(r))
    return ()


def check_schemas(resources: list[dict]) -> list[str]:
    """Strict Kubernetes schemas for built-in kinds, KubeRay's CRD (or ours) for Ray objects."""
    return [p for r in resources for p in _schema_errors(json.dumps(r, sort_keys=True))]


CHECKS: dict[str, Callable[[list[dict]], list[str]]] = {
    f.__name__.removeprefix("check_"): f
    for f in (
        check_head_ports,
        check_shared_memory,
        check_node_selectors,
        check_ray_network_policy,
        check_services_target_pods,
        check_tracking_uri,
        check_mlflow_tls,
        check_postgres_tls,
        check_mlflow_migrates_before_start,
        check_images_pinned_by_digest,
        check_ephemeral_storage,
        check_head_not_evicted,
        check_telemetry_off,
        check_datasets_cached,
        check_data_reachable,
        check_tenant_references,
        check_token_auth,
        check_ray_version,
        check_pod_hardening,
        check_mlflow_reachable_only_by_clients,
        check_pdbs_drainable,
        check_autoscaler_reaches_api,
        check_schemas,
    )
}


def run_checks(resources: list[dict]) -> dict[str, list[str]]:
    """{check name: problems} for the checks that found something."""
    out = {}
    for name, check in CHECKS.items():
        problems = check(resources)
        if problems:
            out[name] = problems
    return out


def overlays() -> list[Path]:
    return dr.overlay_dirs()

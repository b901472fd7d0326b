"""What KubeRay would run for a rendered RayJob / RayCluster: the pods of the head and worker groups
(the generated `ray start` command line, the environment KubeRay injects, its probes and volumes)
and the K8sJobMode submitter's command, translated from the operator's Go source so that the
container tests (tests/containers/test_containers_ray.py) run what a cluster would run.

Source: ray-project/kuberay v1.7.0-rc.0+5 (commit feeaf72fa), ray-operator/controllers/ray/:
  common/pod.go    DefaultHeadPodTemplate, DefaultWorkerPodTemplate, BuildPod,
                   setMissingRayStartParams, generateRayStartCommand, addWellKnownAcceleratorResources,
                   convertParamMap, setContainerEnvVars, setInitContainerEnvVars,
                   SetContainerTokenAuthEnvVars, initLivenessAndReadinessProbe, addEmptyDir,
                   updateRayStartParamsResources, updateRayStartParamsLabels, labelPod
  common/job.go    BuildJobSubmitCommand, GetSubmitterTemplate
  rayjob_controller.go  initRayJobStatusIfNeed (cluster name, job id), getSubmitterTemplate,
                   configureSubmitterContainer (command, PYTHONUNBUFFERED, RAY_DASHBOARD_ADDRESS, ...)
  utils/util.go    GenerateHeadServiceName, GenerateFQDNServiceName, FetchHeadServiceURL,
                   ExtractRayIPFromFQDN, GetContainerCommand, GenerateRayClusterName, GenerateRayJobId
  utils/constant.go  default ports, env names, probe constants

Translated: the operator's defaults (ENABLE_INIT_CONTAINER_INJECTION and ENABLE_PROBES_INJECTION
unset, i.e. on; ENABLE_LOGIN_SHELL unset; CLUSTER_DOMAIN unset: cluster.local), token auth from a
Secret (authOptions.mode token, not the Kubernetes-token variant), in-tree autoscaling (no-monitor,
the autoscaler sidecar; tests/containers/test_containers_autoscaler.py runs it against the stand-in Kubernetes API
of k8s_api.py and plays the operator's scaling).
Not translated: GCS fault tolerance, TLS, the history-server collector, RayService specifics,
multi-host indexing, Kubernetes-token auth (rejected below if a manifest asks for them)."""

from __future__ import annotations

import copy
import json
import math
import random

from tests import deploy_checks as dc

KUBERAY_SOURCE = "ray-project/kuberay v1.7.0-rc.0+5 (feeaf72fa)"

# utils/constant.go
DEFAULT_CLIENT_PORT = 10001
DEFAULT_GCS_SERVER_PORT = 6379
DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_METRICS_PORT = 8080
DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = 52365
LOCAL_HOST = "127.0.0.1"
KUBERAY_VERSION = "nightly"
RAY_AUTH_TOKEN_SECRET_KEY = "auth_token"
RAY_NODE_HEALTH_PATH = "/api/healthz"
RAY_DASHBOARD_GCS_HEALTH_PATH = "api/gcs_healthz"
RAY_DASHBOARD_GCS_HEALTH_CHECK_TIMEOUT_SECONDS = 10
BASE_PYTHON_HEALTH_COMMAND = (
    "python -c \"import urllib.request; r=urllib.request.urlopen('%s', timeout=%d); "
    "exit(0 if b'success' in r.read() else 1)\""
)
HEAD_GROUP_LABEL_VALUE = "headgroup"
# utils/util.go DefaultDomainName (CLUSTER_DOMAIN unset)
CLUSTER_DOMAIN = "cluster.local"
# The Secret's key and the submitter container's default name.
SUBMITTER_CONTAINER_NAME = "ray-job-submitter"
# The env vars whose values come from the pod itself (the harness fills fieldRefs from these paths).
LABEL_CLUSTER = "ray.io/cluster"
LABEL_GROUP = "ray.io/group"


def quantity_value(q) -> int:
    """resource.Quantity.Value(): the value rounded up to an integer (500m -> 1, 8Gi -> bytes)."""
    return math.ceil(dc.quantity(q) - 1e-9)


def go_json(obj: dict) -> str:
    """encoding/json.Marshal of a map[string]float64: sorted keys, no spaces, 4 not 4.0."""
    return json.dumps(
        {k: int(v) if float(v).is_integer() else v for k, v in obj.items()}, sort_keys=True, separators=(",", ":")
    )


def rand5() -> str:
    """k8s.io/apimachinery rand.String(5): lowercase consonants and digits."""
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


def cluster_spec(obj: dict) -> dict:
    return obj["spec"]["rayClusterSpec"] if obj["kind"] == "RayJob" else obj["spec"]


def cluster_name(obj: dict, suffix: str | None = None) -> str:
    """The RayCluster's name: a RayJob's cluster is `<rayjob>-<rand 5>` (rayjob_controller.go
    initRayJobStatusIfNeed -> utils.GenerateRayClusterName); a RayCluster keeps its own."""
    if obj["kind"] == "RayJob":
        return f"{obj['metadata']['name']}-{suffix or rand5()}"
    return obj["metadata"]["name"]


def raycluster_for(rayjob: dict, suffix: str | None = None) -> dict:
    """The RayCluster the operator creates for a RayJob (rayjob_controller.go constructRayClusterForRayJob), as
    the API server stores it: each worker group carries `scaleStrategy: {}`, since the Go type's
    `ScaleStrategy ScaleStrategy json:"scaleStrategy,omitempty"` is a struct, which omitempty keeps (Ray's
    autoscaler then `replace`s it with its workersToDelete)."""
    spec = copy.deepcopy(rayjob["spec"]["rayClusterSpec"])
    for group in spec.get("workerGroupSpecs", []):
        group.setdefault("scaleStrategy", {})
    meta = rayjob["metadata"]
    labels = {**meta.get("labels", {}), "ray.io/originated-from-crd": "RayJob"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": cluster_name(rayjob, suffix),
            "namespace": meta.get("namespace", "default"),
            "labels": labels,
        },
        "spec": spec,
    }


def job_id(rayjob: dict, suffix: str | None = None) -> str:
    """spec.jobId, else `<rayjob>-<rand 5>` (initRayJobStatusIfNeed -> utils.GenerateRayJobId)."""
    return rayjob["spec"].get("jobId") or f"{rayjob['metadata']['name']}-{suffix or rand5()}"


def head_service_name(name: str, spec: dict) -> str:
    """utils.GenerateHeadServiceName(RayClusterCRD, ...): `<cluster>-head-svc` unless
    headGroupSpec.headService names it."""
    svc = spec["headGroupSpec"].get("headService") or {}
    return svc.get("metadata", {}).get("name") or f"{name}-head-svc"


def rayjob_head_service_name(rayjob: dict) -> str:
    """The extra Service the RayJob controller creates (common/job.go BuildHeadServiceForRayJob ->
    GenerateHeadServiceName(RayJobCRD, ...)): `<rayjob>-head-svc`, pointing at the current cluster."""
    return f"{rayjob['metadata']['name']}-head-svc"


def fqdn(service: str, namespace: str) -> str:
    """utils.GenerateFQDNServiceName."""
    return f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}"


def dashboard_url(name: str, spec: dict, namespace: str) -> str:
    """RayJob status.dashboardURL: utils.FetchHeadServiceURL(cluster, "dashboard") -- the head
    Service's FQDN and its dashboard port (the head container's port named dashboard, else 8265)."""
    c = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    port = next(
        (p["containerPort"] for p in c.get("ports", []) if p.get("name") == "dashboard"), DEFAULT_DASHBOARD_PORT
    )
    return f"{fqdn(head_service_name(name, spec), namespace)}:{port}"


def head_port(head_params: dict) -> str:
    """pod.go GetHeadPort: rayStartParams port, else the GCS default."""
    return str(head_params.get("port", DEFAULT_GCS_SERVER_PORT))


def _check_supported(spec: dict) -> None:
    auth = spec.get("authOptions") or {}
    unsupported = [k for k in ("tlsOptions", "historyServerOptions") if spec.get(k)]
    backend = (spec.get("gcsFaultToleranceOptions") or {}).get("backend", "redis")
    if spec.get("gcsFaultToleranceOptions") and backend != "redis":
        unsupported.append(f"gcsFaultToleranceOptions.backend {backend}")
    if auth.get("mode") not in (None, "disabled", "token") or auth.get("enableK8sTokenAuth"):
        unsupported.append(f"authOptions {auth}")
    if unsupported:
        raise NotImplementedError(f"kuberay.py does not translate {unsupported}")


def auth_enabled(spec: dict) -> bool:
    """utils.IsAuthEnabled: authOptions.mode == token."""
    return (spec.get("authOptions") or {}).get("mode") == "token"


def autoscaling_enabled(spec: dict) -> bool:
    return bool(spec.get("enableInTreeAutoscaling"))


def autoscaler_version(spec: dict) -> str | None:
    """utils.IsAutoscalingV2Enabled / IsAutoscalingV1Enabled: autoscalerOptions.version, None where unset."""
    return (spec.get("autoscalerOptions") or {}).get("version")


# ----------------------------------------------------------------------- rayStartParams, command


def update_params_resources(params: dict, group_resources: dict | None) -> None:
    """pod.go updateRayStartParamsResources (the group's top-level `resources`)."""
    if not group_resources:
        return
    custom = {}
    for name, q in group_resources.items():
        low = name.lower()
        if low == "cpu":
            params["num-cpus"] = str(quantity_value(q))
        elif low == "memory":
            params["memory"] = str(quantity_value(q))
        elif is_gpu_resource_key(low):
            params["num-gpus"] = str(quantity_value(q))
        else:
            custom[name] = dc.quantity(q)
    if custom:
        params["resources"] = "'" + go_json(custom) + "'"


def update_params_labels(params: dict, group_labels: dict | None) -> None:
    """pod.go updateRayStartParamsLabels (the group's top-level `labels`)."""
    if group_labels:
        params["labels"] = ",".join(f"{k}={group_labels[k]}" for k in sorted(group_labels))


def is_gpu_resource_key(key: str) -> bool:
    """utils/resources.go IsGPUResourceKey."""
    import re

    return key.endswith("gpu") or re.search(r"nvidia\.com/mig-\d+g\.\d+gb$", key) is not None


def set_missing_params(params: dict, node_type: str, port: str, fqdn_ray_ip: str) -> dict:
    """pod.go setMissingRayStartParams."""
    if node_type == "worker" and "address" not in params:
        params["address"] = f"{fqdn_ray_ip}:{port}"
    if node_type == "head" and "dashboard-host" not in params:
        params["dashboard-host"] = "0.0.0.0"
    params.setdefault("metrics-export-port", str(DEFAULT_METRICS_PORT))
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", str(DEFAULT_DASHBOARD_AGENT_LISTEN_PORT))
    return params


def add_accelerator_resources(params: dict, limits: dict) -> None:
    """pod.go addWellKnownAcceleratorResources: num-gpus from the first GPU limit (sorted keys),
    the first custom accelerator (Neuron cores, TPU) into --resources."""
    custom_map = {"aws.amazon.com/neuroncore": "neuron_cores", "google.com/tpu": "TPU"}
    if not limits:
        return
    resources = json.loads(params["resources"].strip("'\"` ")) if "resources" in params else {}
    added = any(v in resources for v in custom_map.values())
    for key in sorted(limits):
        value = limits[key]
        if "num-gpus" not in params and is_gpu_resource_key(key) and dc.quantity(value) != 0:
            params["num-gpus"] = str(quantity_value(value))
        if not added and key in custom_map and dc.quantity(value) != 0:
            if custom_map[key] not in resources:
                resources[custom_map[key]] = dc.quantity(value)
                params["resources"] = "'" + go_json(resources) + "'"
            added = True


def convert_param_map(params: dict) -> str:
    """pod.go convertParamMap: sorted keys, ` --flag ` for true, nothing for false (except the
    flags that take an explicit boolean), ` --key=value ` otherwise (spacing as in the Go code)."""
    special = ("log-color", "include-dashboard", "include-log-monitor")
    out = []
    for key in sorted(params):
        value = str(params[key])
        if value.lower() in ("true", "false") and key not in special:
            if value.lower() == "true":
                out.append(f" --{key} ")
        else:
            out.append(f" --{key}={value} ")
    return "".join(out)


def generate_ray_start_command(node_type: str, params: dict, resources: dict) -> str:
    """pod.go generateRayStartCommand: --num-cpus from the CPU limit (else request), --memory from
    the memory limit, --num-gpus from a GPU limit, unless rayStartParams set them."""
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    if "num-cpus" not in params:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu and dc.quantity(cpu) != 0:
            params["num-cpus"] = str(quantity_value(cpu))
    if "memory" not in params and limits.get("memory") and dc.quantity(limits["memory"]) != 0:
        params["memory"] = str(quantity_value(limits["memory"]))
    add_accelerator_resources(params, limits)
    head = "--head " if node_type == "head" else ""
    return f"ray start {head}{convert_param_map(params)}"


# ----------------------------------------------------------------------------------- the pods


def _env_exists(name: str, env: list[dict]) -> bool:
    return any(e["name"] == name for e in env)


def set_token_auth_env(container: dict, name: str, spec: dict) -> None:
    """pod.go SetContainerTokenAuthEnvVars (Secret variant): RAY_AUTH_MODE=token and RAY_AUTH_TOKEN
    from the Secret authOptions.secretName (default: the cluster's name), key auth_token -- each only
    when the container does not set it already."""
    env = container.setdefault("env", [])
    if not _env_exists("RAY_AUTH_MODE", env):
        env.append({"name": "RAY_AUTH_MODE", "value": "token"})
    secret = (spec.get("authOptions") or {}).get("secretName") or name
    if not _env_exists("RAY_AUTH_TOKEN", env):
        env.append(
            {
                "name": "RAY_AUTH_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": RAY_AUTH_TOKEN_SECRET_KEY}},
            }
        )


def add_empty_dir(container: dict, spec: dict, volume: str, path: str, medium: str | None) -> None:
    """pod.go addEmptyDir / makeEmptyDirVolume (a Memory medium is sized by the memory limit)."""
    if any(m["mountPath"] == path for m in container.get("volumeMounts", [])):
        return
    if not any(v["name"] == volume for v in spec.get("volumes", [])):
        vol: dict = {"name": volume, "emptyDir": {}}
        if medium == "Memory":
            res = container.get("resources", {})
            size = res.get("limits", {}).get("memory") or res.get("requests", {}).get("memory")
            vol["emptyDir"] = {"medium": "Memory", **({"sizeLimit": size} if size else {})}
        spec.setdefault("volumes", []).append(vol)
    container.setdefault("volumeMounts", []).append({"name": volume, "mountPath": path})


def autoscaler_container(image: str, name: str, spec: dict) -> dict:
    """pod.go BuildAutoscalerContainer + SetContainerTokenAuthEnvVars + mergeAutoscalerOverrides
    (command, env and resources; run by tests/containers/test_containers_autoscaler.py against k8s_api.py)."""
    start = "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
    c = {
        "name": "autoscaler",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/bash", "-c", "--"],
        "args": [start],
        "env": [
            {
                "name": "RAY_CLUSTER_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_CLUSTER}']"}},
            },
            {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "RAY_HEAD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "KUBERAY_CRD_VER", "value": "v1"},
            {"name": "KUBERAY_GEN_AUTOSCALER_START_CMD", "value": start},
        ],
        "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "500m", "memory": "512Mi"}},
    }
    if auth_enabled(spec):
        set_token_auth_env(c, name, spec)
    opts = spec.get("autoscalerOptions") or {}  # mergeAutoscalerOverrides: replace or append
    for key in ("resources", "image", "imagePullPolicy", "securityContext", "command", "args"):
        if opts.get(key):
            c[key] = copy.deepcopy(opts[key])
    for key in ("env", "envFrom", "volumeMounts"):
        if opts.get(key):
            c[key] = c.get(key, []) + copy.deepcopy(opts[key])
    return c


def probes(node_type: str, params: dict) -> dict:
    """pod.go initLivenessAndReadinessProbe for Ray >= 2.53 (supportsUnifiedHealthCheck): an
    httpGet of /api/healthz on the dashboard agent's listen port."""
    port = int(params.get("dashboard-agent-listen-port", DEFAULT_DASHBOARD_AGENT_LISTEN_PORT))
    get = {"path": RAY_NODE_HEALTH_PATH, "port": port}
    head = node_type == "head"
    return {
        "livenessProbe": {
            "initialDelaySeconds": 30,
            "timeoutSeconds": 5 if head else 2,
            "periodSeconds": 5,
            "successThreshold": 1,
            "failureThreshold": 120,
            "httpGet": get,
        },
        "readinessProbe": {
            "initialDelaySeconds": 10,
            "timeoutSeconds": 5 if head else 2,
            "periodSeconds": 5,
            "successThreshold": 1,
            "failureThreshold": 10,
            "httpGet": dict(get),
        },
    }


def _version_at_least(version: str, minimum: tuple[int, ...]) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:3]) >= minimum
    except ValueError:
        return False


def _wait_gcs_ready_container(ray: dict, fqdn_ray_ip: str, port: str) -> dict:
    """pod.go DefaultWorkerPodTemplate's wait-gcs-ready init container (env and mounts: a copy of the Ray
    container's, taken first)."""
    script = _wait_gcs_script(fqdn_ray_ip, port)
    return {
        "name": "wait-gcs-ready",
        "image": ray["image"],
        "imagePullPolicy": ray.get("imagePullPolicy"),
        "command": ["/bin/bash", "-c", "--"],
        "args": [script],
        "securityContext": copy.deepcopy(ray.get("securityContext", {})),
        "env": copy.deepcopy(ray.get("env", [])),
        "volumeMounts": copy.deepcopy(ray.get("volumeMounts", [])),
        "resources": {"limits": {"cpu": "200m", "memory": "256Mi"}, "requests": {"cpu": "200m", "memory": "256Mi"}},
    }


def _default_pod_template(
    template: dict, spec: dict, g: dict, node_type: str, name: str, params: dict, port: str, fqdn_ray_ip: str
) -> dict | None:
    """pod.go DefaultHeadPodTemplate / DefaultWorkerPodTemplate, on `template` and `params` in place: the
    head's autoscaler container when it gets one, else None."""
    pod_spec = template["spec"]
    ray = pod_spec["containers"][0]
    if node_type == "worker":
        pod_spec.setdefault("initContainers", []).append(_wait_gcs_ready_container(ray, fqdn_ray_ip, port))
    update_params_resources(params, g.get("resources"))
    update_params_labels(params, g.get("labels"))
    labels = {**template.get("metadata", {}).get("labels", {}), **(g.get("labels") or {})}
    group_name = HEAD_GROUP_LABEL_VALUE if node_type == "head" else g["groupName"]
    template.setdefault("metadata", {})["labels"] = label_pod(node_type, name, group_name, labels)
    set_missing_params(params, node_type, port, fqdn_ray_ip)
    autoscaler = None
    if node_type == "head" and autoscaling_enabled(spec):
        params["no-monitor"] = "true"
        autoscaler = autoscaler_container(ray["image"], name, spec)
        pod_spec["containers"].append(autoscaler)
        # v1.7 DefaultHeadPodTemplate: autoscalerOptions.version v2 -> RAY_enable_autoscaler_v2=true and
        # restartPolicy Never (setAutoscalerV2EnvVars); v1 -> "false"; unset -> nothing (Ray 2.60's `ray start
        # --head` then picks v2 itself when KubeRay's RAY_CLOUD_INSTANCE_ID and RAY_NODE_TYPE_NAME are set)
        version = autoscaler_version(spec)
        if version is not None:
            value = "true" if version == "v2" else "false"
            ray.setdefault("env", []).append({"name": "RAY_enable_autoscaler_v2", "value": value})
    if node_type == "head" and autoscaling_enabled(spec) and autoscaler_version(spec) == "v2":
        pod_spec["restartPolicy"] = "Never"
    if node_type == "worker" and autoscaling_enabled(spec) and autoscaler_version(spec) == "v2":
        pod_spec["restartPolicy"] = "Never"  # DefaultWorkerPodTemplate
    configure_gcs_fault_tolerance(template, spec, node_type, params, name)
    if not any(p.get("name") == "metrics" for p in ray.get("ports", [])):
        ray.setdefault("ports", []).append({"name": "metrics", "containerPort": DEFAULT_METRICS_PORT})
    if auth_enabled(spec):
        set_token_auth_env(ray, name, spec)
        for c in pod_spec.get("initContainers", []):
            if c["name"] == "wait-gcs-ready":
                set_token_auth_env(c, name, spec)
    return autoscaler


def _set_ray_command(template: dict, ray: dict, node_type: str, params: dict) -> str:
    """pod.go BuildPod: the Ray container's command becomes its own then `ulimit; ray start ...` unless it
    already starts Ray or the template keeps its command (ray.io/overwrite-container-cmd); the `ray start`."""
    cmd = "".join(f" {a} " for a in ray.get("command", [])) + "".join(f" {a} " for a in ray.get("args", []))
    ulimit = "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}"
    start = generate_ray_start_command(node_type, params, ray.get("resources", {}))
    overwrite = (
        str(template.get("metadata", {}).get("annotations", {}).get("ray.io/overwrite-container-cmd", "")).lower()
        == "true"
    )
    if not overwrite and "ray start" not in cmd:
        generated = f"{ulimit}; {start}"
        ray["command"] = ["/bin/bash", "-c", "--"]
        ray["args"] = [f"{cmd} && {generated}" if cmd else generated]
    return start


def _set_default_probes(ray: dict, spec: dict, node_type: str, params: dict) -> None:
    """pod.go BuildPod: KubeRay's probes where the Ray container lacks its own."""
    if "livenessProbe" not in ray or "readinessProbe" not in ray:
        if not _version_at_least(spec.get("rayVersion", ""), (2, 53)):
            raise NotImplementedError("exec probes of Ray < 2.53")
        for k, v in probes(node_type, params).items():
            ray.setdefault(k, v)


def build_pod(obj: dict, node_type: str, name: str, group: int = 0) -> dict:
    """The pod KubeRay creates for the head (node_type "head") or worker group `group` of the
    rendered RayJob/RayCluster `obj`, whose RayCluster is called `name`: a pod template (metadata
    labels, spec) with KubeRay's command, env, init container, probes and volumes, plus
    `rayStartCommand` (the value of KUBERAY_GEN_RAY_START_CMD) at the top level."""
    spec = cluster_spec(obj)
    _check_supported(spec)
    namespace = obj["metadata"].get("namespace", "default")
    head_spec = spec["headGroupSpec"]
    g = head_spec if node_type == "head" else spec["workerGroupSpecs"][group]
    template = copy.deepcopy(g["template"])
    pod_spec = template["spec"]
    params = {k: str(v) for k, v in (g.get("rayStartParams") or {}).items()}
    port = head_port(head_spec.get("rayStartParams") or {})
    fqdn_ray_ip = fqdn(head_service_name(name, spec), namespace)
    ray = pod_spec["containers"][0]
    autoscaler = _default_pod_template(template, spec, g, node_type, name, params, port, fqdn_ray_ip)

    # BuildPod
    if "plasma-directory" not in params:
        add_empty_dir(ray, pod_spec, "shared-mem", "/dev/shm", "Memory")
    if autoscaler is not None:
        add_empty_dir(ray, pod_spec, "ray-logs", "/tmp/ray", None)
        add_empty_dir(autoscaler, pod_spec, "ray-logs", "/tmp/ray", None)
    start = _set_ray_command(template, ray, node_type, params)
    for c in pod_spec.get("initContainers", []):
        # setInitContainerEnvVars
        c.setdefault("env", []).extend(
            [{"name": "FQ_RAY_IP", "value": fqdn_ray_ip}, {"name": "RAY_IP", "value": fqdn_ray_ip.split(".")[0]}]
        )
    # raycluster_controller.go getCreatorCRDType: a RayJob's cluster carries originated-from-crd RayJob.
    set_container_env(ray, node_type, fqdn_ray_ip, port, start, creator=obj["kind"])
    _set_default_probes(ray, spec, node_type, params)
    template["rayStartCommand"] = start
    template["rayStartParams"] = params
    return template


# The external storage namespace KubeRay gives a cluster without one: its UID (a stand-in here).
STORAGE_NAMESPACE_ANNOTATION = "ray.io/external-storage-namespace"
GCS_RECONNECT_TIMEOUT_S = "600"  # utils.DefaultWorkerRayGcsReconnectTimeoutS


def configure_gcs_fault_tolerance(template: dict, spec: dict, node_type: str, params: dict, name: str) -> None:
    """pod.go configureGCSFaultTolerance (Redis backend): the workers wait up to 600 s for a restarted GCS; the
    head's GCS keeps its tables in Redis (RAY_REDIS_ADDRESS, the password as REDIS_PASSWORD and
    --redis-password=$REDIS_PASSWORD) under the cluster's storage namespace."""
    options = spec.get("gcsFaultToleranceOptions")
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    if node_type == "head":
        annotations["ray.io/ft-enabled"] = str(bool(options)).lower()
    if not options:
        return
    ray = template["spec"]["containers"][0]
    env = ray.setdefault("env", [])
    if node_type == "worker":
        if not _env_exists("RAY_gcs_rpc_server_reconnect_timeout_s", env):
            env.append({"name": "RAY_gcs_rpc_server_reconnect_timeout_s", "value": GCS_RECONNECT_TIMEOUT_S})
        return
    namespace = options.get("externalStorageNamespace") or f"uid-of-{name}"
    annotations[STORAGE_NAMESPACE_ANNOTATION] = namespace
    if not _env_exists("RAY_external_storage_namespace", env):
        env.append({"name": "RAY_external_storage_namespace", "value": namespace})
    env.append({"name": "RAY_REDIS_ADDRESS", "value": options["redisAddress"]})
    for field, var, param in (
        ("redisUsername", "REDIS_USERNAME", "redis-username"),
        ("redisPassword", "REDIS_PASSWORD", "redis-password"),
    ):
        if options.get(field):
            params[param] = f"${var}"
            env.append({"name": var, **{k: v for k, v in options[field].items() if k in ("value", "valueFrom")}})


def _wait_gcs_script(host: str, port: str) -> str:
    """pod.go DefaultWorkerPodTemplate: the wait-gcs-ready init container's script."""
    faq = "https://docs.ray.io/en/master/cluster/kubernetes/troubleshooting.html"
    still = "Still waiting for GCS to be ready. For troubleshooting, refer to the FAQ at"
    return f"""
					SECONDS=0
					while true; do
						if (( SECONDS <= 120 )); then
							if ray health-check --address {host}:{port} > /dev/null 2>&1; then
								echo "GCS is ready."
								break
							fi
							echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."
						else
							if ray health-check --address {host}:{port}; then
								echo "GCS is ready. Any error messages above can be safely ignored."
								break
							fi
							echo "$SECONDS seconds elapsed: {still} {faq}."
						fi
						sleep 5
					done
				"""


def label_pod(node_type: str, name: str, group_name: str, labels: dict) -> dict:
    """pod.go labelPod: KubeRay's labels; the template's may not override node-type, group, cluster."""
    ident = f"{name}-{node_type}"
    ident = ident[len(ident) - 63 :] if len(ident) > 63 else ident  # utils.CheckLabel keeps the tail
    out = {
        "ray.io/is-ray-node": "yes",
        LABEL_CLUSTER: name,
        "ray.io/node-type": node_type,
        LABEL_GROUP: group_name,
        "ray.io/identifier": ident,
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    for k, v in labels.items():
        if k not in ("ray.io/node-type", LABEL_GROUP, LABEL_CLUSTER):
            out[k] = v
    return out


def set_container_env(
    c: dict, node_type: str, fqdn_ray_ip: str, port: str, start: str, creator: str = "RayCluster"
) -> None:
    """pod.go setContainerEnvVars (no default container envs configured, not a RayService)."""
    env = c.setdefault("env", [])
    ip = LOCAL_HOST
    if node_type == "worker":
        ip = fqdn_ray_ip
        env += [{"name": "FQ_RAY_IP", "value": ip}, {"name": "RAY_IP", "value": ip.split(".")[0]}]
    env += [
        {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_CLUSTER}']"}}},
        {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "RAY_CLOUD_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "RAY_NODE_TYPE_NAME", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_GROUP}']"}}},
        {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start},
    ]
    if not _env_exists("RAY_PORT", env):
        env.append({"name": "RAY_PORT", "value": port})
    if not _env_exists("RAY_ADDRESS", env):
        env.append({"name": "RAY_ADDRESS", "value": f"{ip}:{port}"})
    if not _env_exists("RAY_USAGE_STATS_KUBERAY_IN_USE", env):
        env.append({"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"})
    if node_type == "head":
        tags = f"kuberay_version={KUBERAY_VERSION};kuberay_crd={creator}"
        env.append({"name": "RAY_USAGE_STATS_EXTRA_TAGS", "value": tags})
    if not _env_exists("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", env):
        env.append({"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"})


def pod_fields(template: dict, pod_name: str, namespace: str) -> dict[str, str]:
    """Values of the fieldRefs KubeRay's env uses, for the harness."""
    labels = template["metadata"]["labels"]
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace}
    for k, v in labels.items():
        fields[f"metadata.labels['{k}']"] = v
    return fields


def pod_name(name: str, node_type: str, group: str = "") -> str:
    """A pod name as KubeRay generates it (utils.PodName with GenerateName: `<cluster>-head-xxxxx`,
    `<cluster>-<group>-worker-xxxxx`; the suffix is the API server's)."""
    base = f"{name}-head" if node_type == "head" else f"{name}-{group}-worker"
    return f"{base}-{rand5()}"


# ---------------------------------------------------------------------------------- submitter


def submit_command(rayjob: dict, address: str, jobid: str, entrypoint: str | None = None) -> list[str]:
    """common/job.go BuildJobSubmitCommand, K8sJobMode: wait for the dashboard's GCS health, then
    `ray job status` / `ray job submit --no-wait --submission-id` / `ray job logs --follow` (the
    words of a bash script; KubeRay joins them with spaces). `entrypoint` replaces spec.entrypoint
    (the tests' documented substitutions); `address` is status.dashboardURL."""
    spec = rayjob["spec"]
    if not address.startswith("http://"):
        address = "http://" + address
    entry = (entrypoint if entrypoint is not None else spec["entrypoint"]).strip()
    health = BASE_PYTHON_HEALTH_COMMAND % (
        address + "/" + RAY_DASHBOARD_GCS_HEALTH_PATH,
        RAY_DASHBOARD_GCS_HEALTH_CHECK_TIMEOUT_SECONDS,
    )
    cmd = [
        "until",
        health,
        ">/dev/null",
        "2>&1",
        ";",
        "do",
        "echo",
        json.dumps(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."),
        ";",
        "sleep",
        "2",
        ";",
        "done",
        ";",
    ]
    cmd += ["if", "!", "ray", "job", "status", "--address", address, jobid, ">/dev/null", "2>&1", ";", "then"]
    cmd += ["ray", "job", "submit", "--address", address, "--no-wait"]
    if spec.get("runtimeEnvYAML"):
        import yaml

        cmd += [
            "--runtime-env-json",
            json.dumps(json.dumps(yaml.safe_load(spec["runtimeEnvYAML"]), separators=(",", ":"))),
        ]
    if spec.get("metadata"):
        cmd += ["--metadata-json", json.dumps(json.dumps(spec["metadata"], separators=(",", ":")))]
    if jobid:
        cmd += ["--submission-id", jobid]
    if spec.get("entrypointNumCpus"):
        cmd += ["--entrypoint-num-cpus", f"{float(spec['entrypointNumCpus']):f}"]
    if spec.get("entrypointNumGpus"):
        cmd += ["--entrypoint-num-gpus", f"{float(spec['entrypointNumGpus']):f}"]
    if spec.get("entrypointResources"):
        cmd += ["--entrypoint-resources", json.dumps(spec["entrypointResources"])]
    cmd += ["--", entry, ";", "fi", ";", "ray", "job", "logs", "--address", address, "--follow", jobid]
    return cmd


def submitter_pod(rayjob: dict, name: str, jobid: str, entrypoint: str | None = None) -> dict:
    """rayjob_controller.go getSubmitterTemplate / configureSubmitterContainer for K8sJobMode: the
    submitterPodTemplate (or GetDefaultSubmitterContainer's), `/bin/bash -ce -- <command>` unless the
    template sets a command, PYTHONUNBUFFERED, RAY_DASHBOARD_ADDRESS, RAY_JOB_SUBMISSION_ID, the
    token env, and KubeRay's labels."""
    spec = cluster_spec(rayjob)
    namespace = rayjob["metadata"].get("namespace", "default")
    address = dashboard_url(name, spec, namespace)
    head_image = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    template = copy.deepcopy(
        rayjob["spec"].get("submitterPodTemplate")
        or {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": SUBMITTER_CONTAINER_NAME,
                        "image": head_image,
                        "resources": {
                            "limits": {"cpu": "1", "memory": "1Gi"},
                            "requests": {"cpu": "500m", "memory": "200Mi"},
                        },
                    }
                ],
            }
        }
    )
    c = template["spec"]["containers"][0]
    if not c.get("command"):
        c["command"] = ["/bin/bash", "-ce", "--"]
        c["args"] = [" ".join(submit_command(rayjob, address, jobid, entrypoint))]
    env = c.setdefault("env", [])
    env += [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "RAY_DASHBOARD_ADDRESS", "value": address},
        {"name": "RAY_JOB_SUBMISSION_ID", "value": jobid},
    ]
    if auth_enabled(spec):
        set_token_auth_env(c, name, spec)
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels.update(
        {
            "ray.io/originated-from-cr-name": rayjob["metadata"]["name"],
            "ray.io/originated-from-crd": "RayJob",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
    )
    return template

"""Run pods of the rendered manifests as podman containers, the way the kubelet would run them.

From a pod template (rendered by kustomize: tests/deploy_render.py) the harness takes: the image (our images
mapped to the locally built test tags), command and args (with Kubernetes' $(VAR) expansion), env
(values, Secret and ConfigMap references, envFrom, fieldRef), the security context (runAsUser /
runAsGroup / fsGroup, readOnlyRootFilesystem -- and nothing else writable: podman's default tmpfs
mounts are turned off --, capabilities dropped, no-new-privileges, podman's default seccomp
profile as RuntimeDefault), memory limits, volumes (disk emptyDir: a fresh host directory, 0777
as the kubelet makes it; memory emptyDir: a tmpfs of sizeLimit; PVC: a host directory kept for
the test's lifetime; ConfigMap and Secret: their keys as read-only files, a Secret's with its modes and
the pod's fsGroup), init containers (run to completion first, in order), readiness probes
(exec, or httpGet -- HTTP or HTTPS, unverified as the kubelet's -- run inside the container) and the
Services selecting the pod (their names, and the cluster-DNS forms, become network aliases on one podman
network, so `mlflow:5000` and `postgres:5432` resolve as in the cluster; a Service's port must equal its
target port).

Not emulated: NetworkPolicies (the tests record the ports used and check the policies offline),
CPU limits above this machine's cores, the kubelet's restarts, Service load balancing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from tests import deploy_checks as dc
from tests import deploy_render as dr

OUR_IMAGES = {
    "calib-sweeps/ray": "localhost/calib-sweeps/ray:test",
    "calib-sweeps/mlflow": "localhost/calib-sweeps/mlflow:test",
}


def local_image(image: str) -> str:
    for name, tag in OUR_IMAGES.items():
        if re.search(rf"(^|/){re.escape(name)}([:@].*)?$", image):
            return tag
    # a public image pinned tag@digest: the local stand-in carries the tag only (its digest is its own)
    return image.split("@", 1)[0]


def podman(*args: str, check: bool = True, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return proc


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion ($$ escapes); unknown references stay as they are."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # the tier runs its files on xdist workers (make test-containers)
# per worker, so that one worker's check for networks left behind does not see the other's live ones
NETWORK_PREFIX = "calib-test-" + (f"{WORKER}-" if WORKER else "")
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kubelet mounts a pod's service-account token


def leftover_networks() -> list[str]:
    """Podman networks a Cluster of these tests created and did not remove."""
    out = podman("network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    return [n for n in out if n.startswith(NETWORK_PREFIX)]


class Cluster:
    """A podman network standing in for one namespace, with its Secrets and ConfigMaps."""

    def __init__(
        self, resources: list[dict], secrets: dict[str, dict[str, str]], workdir: Path, network: str | None = None
    ):
        self.resources = resources
        self.namespace = dr.namespace_of(resources)
        self.secrets = secrets
        self.config_maps = {r["metadata"]["name"]: r.get("data", {}) for r in resources if r["kind"] == "ConfigMap"}
        self.workdir = workdir
        self.id = uuid.uuid4().hex[:8]
        # `network`: join another Cluster's (same namespace); only a network created here is removed by close()
        self.own_network = network is None
        self.network = network or f"{NETWORK_PREFIX}{self.id}"
        self.containers: list[str] = []
        self.init_logs: dict[str, str] = {}
        if self.own_network:
            podman("network", "create", self.network)

    # ------------------------------------------------------------------------------ pieces
    def service_aliases(self, labels: dict, ports: list[dict]) -> list[str]:
        aliases = []
        for svc in (r for r in self.resources if r["kind"] == "Service"):
            selector = svc["spec"].get("selector")
            if not selector or not dc.selects({"matchLabels": selector}, labels):
                continue
            for p in svc["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                number = next((cp["containerPort"] for cp in ports if cp.get("name") == target), target)
                if isinstance(number, str):
                    continue  # a named port of another container of the pod (MLflow's `metrics` beside `mlflow`)
                assert number == p["port"], f"Service {svc['metadata']['name']}: port {p['port']} -> {target}"
            aliases += self.dns_names(svc["metadata"]["name"])
        return aliases

    def dns_names(self, service: str) -> list[str]:
        ns = self.namespace
        return [service, f"{service}.{ns}", f"{service}.{ns}.svc", f"{service}.{ns}.svc.cluster.local"]

    def env_of(self, c: dict, extra: list[dict] = (), fields: dict[str, str] | None = None) -> dict[str, str]:
        env: dict[str, str] = {}
        for src in c.get("envFrom", []):
            if "configMapRef" in src:
                env.update(self.config_maps[src["configMapRef"]["name"]])
            if "secretRef" in src:
                env.update(self.secrets[src["secretRef"]["name"]])
        for e in [*c.get("env", []), *extra]:
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            elif "valueFrom" in e:
                ref = e["valueFrom"]
                if "secretKeyRef" in ref:
                    env[e["name"]] = self.secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
                elif "configMapKeyRef" in ref:
                    env[e["name"]] = self.config_maps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
                elif "fieldRef" in ref:
                    env[e["name"]] = (fields or {}).get(ref["fieldRef"]["fieldPath"], "")
            else:
                env[e["name"]] = ""
        return env

    # the service-account files pods get; a test with a stand-in Kubernetes API sets its own (k8s_api.py)
    service_account: Path | None = None

    def service_account_token(self) -> Path:
        """A stand-in of the service-account token kubelet mounts by default (token, ca.crt, namespace)."""
        if self.service_account is not None:
            return self.service_account
        folder = self.workdir / "serviceaccount"
        if not folder.exists():
            folder.mkdir(parents=True)
            (folder / "token").write_text("fake-service-account-token-" + self.id)
            (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
            (folder / "namespace").write_text(self.namespace)
            for f in folder.iterdir():
                f.chmod(0o644)
        return folder

    def volume_args(self, pod: str, spec: dict, c: dict) -> list[str]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        args = []
        mounted = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if spec.get("automountServiceAccountToken", True) is not False and SA_PATH not in mounted:
            # as Kubernetes does unless the pod opts out: the test then sees what a pod's processes would
            args += ["-v", f"{self.service_account_token()}:{SA_PATH}:ro"]
        for m in c.get("volumeMounts", []):
            v = volumes[m["name"]]
            ro = ":ro" if m.get("readOnly") else ""
            # an in-memory emptyDir shared by several containers of the pod (not /dev/shm) is a shared
            # host folder here: a podman tmpfs volume is a new tmpfs in every container
            if "emptyDir" in v and v["emptyDir"].get("medium") == "Memory" and m["mountPath"] == "/dev/shm":
                size = int(dc.quantity(v["emptyDir"].get("sizeLimit", "64Mi")))
                args += ["--mount", f"type=tmpfs,destination={m['mountPath']},tmpfs-size={size},tmpfs-mode=1777"]
                continue
            if "projected" in v and any("serviceAccountToken" in src for src in v["projected"]["sources"]):
                # a projected token (+ the CA and namespace): the cluster's service-account files
                args += ["-v", f"{self.service_account_token()}:{m['mountPath']}:ro"]
                continue
            if "configMap" in v:
                # the ConfigMap's keys as files (its `items` when given), read-only, as the kubelet projects them
                data = self.config_maps[v["configMap"]["name"]]
                items = v["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                host = self.workdir / "configmaps" / pod / m["name"]
                host.mkdir(parents=True, exist_ok=True)
                for item in items:
                    (host / item["path"]).write_text(data[item["key"]])
                    (host / item["path"]).chmod(0o444)
                args += ["-v", f"{host}:{m['mountPath']}:ro"]
                continue
            if "secret" in v:
                args += ["-v", f"{self.secret_files(pod, spec, m['name'], v['secret'])}:{m['mountPath']}:ro"]
                continue
            if "emptyDir" in v:
                host = self.workdir / "pods" / pod / m["name"]
            elif "persistentVolumeClaim" in v:
                host = self.workdir / "pvc" / v["persistentVolumeClaim"]["claimName"]
            else:
                raise NotImplementedError(f"volume {v}")
            if not host.exists():
                host.mkdir(parents=True)
                host.chmod(0o777)
            args += ["-v", f"{host}:{m['mountPath']}{ro}"]
        return args

    def secret_files(self, pod: str, spec: dict, volume: str, src: dict) -> Path:
        """A Secret volume's files as the kubelet projects them: its `items` (or every key), each with its mode
        (`mode`, else `defaultMode`, else 0644), group-owned by the pod's fsGroup when it has one."""
        data = self.secrets[src["secretName"]]
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        group = spec.get("securityContext", {}).get("fsGroup")
        host = self.workdir / "secrets" / pod / volume
        host.mkdir(parents=True, exist_ok=True)
        host.chmod(0o755)
        for item in items:
            f = host / item["path"]
            f.write_text(data[item["key"]])
            if group is not None:
                os.chown(f, 0, int(group))
            f.chmod(int(item.get("mode", src.get("defaultMode", 0o644))))
        return host

    def security_args(self, spec: dict, c: dict) -> list[str]:
        pod_sc, sc = spec.get("securityContext", {}), c.get("securityContext", {})
        uid, gid = sc.get("runAsUser", pod_sc.get("runAsUser")), sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        args = []
        if uid is not None:
            args += ["--user", f"{uid}:{gid}" if gid is not None else str(uid)]
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            assert uid not in (None, 0), "runAsNonRoot without a non-zero runAsUser"
        if pod_sc.get("fsGroup") is not None:
            args += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        if "ALL" in sc.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop=all"]
        for cap in sc.get("capabilities", {}).get("add", []):
            args += ["--cap-add", cap]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt=no-new-privileges"]
        mem = c.get("resources", {}).get("limits", {}).get("memory")
        if mem:
            args += ["--memory", str(int(dc.quantity(mem)))]
        return args

    # ------------------------------------------------------------------------------- running
    def run_container(
        self,
        pod: str,
        spec: dict,
        c: dict,
        *,
        labels: dict,
        detach: bool,
        command: list[str] | None = None,
        extra_env: list[dict] = (),
        aliases: list[str] = (),
        publish: list[str] = (),
        timeout: float | None = None,
        name: str | None = None,
        fields: dict[str, str] | None = None,
        share_network_of: str | None = None,
    ):
        """`share_network_of`: another container whose network namespace this one joins, as the containers of
        one pod share theirs (a sidecar reaching its pod's processes on the pod's own address)."""
        fields = fields or {"metadata.name": pod, "metadata.namespace": self.namespace}  # the downward API
        env = self.env_of(c, extra_env, fields)
        cmd = command if command is not None else [*c.get("command", []), *c.get("args", [])]
        cmd = [expand(a, env) for a in cmd]
        name = name or f"{pod}-{c['name']}-{self.id}"
        if share_network_of:
            args = ["run", "--name", name, "--network", f"container:{share_network_of}"]
        else:
            args = ["run", "--name", name, "--network", self.network, "--hostname", pod]
            for a in [*self.service_aliases(labels, c.get("ports", [])), *aliases]:
                args += ["--network-alias", a]
        for p in publish:
            args += ["-p", p]
        args += self.security_args(spec, c) + self.volume_args(pod, spec, c)
        env_file = self.workdir / "env" / f"{name}.env"
        env_file.parent.mkdir(parents=True, exist_ok=True)
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items() if "\n" not in v))
        env_file.chmod(0o600)
        args += ["--env-file", str(env_file)]
        entry = []
        if c.get("command") or command is not None:
            entry = ["--entrypoint", json.dumps(cmd[:1])] if cmd else []
            cmd = cmd[1:]
        args += [*entry, "-d" if detach else "--rm", local_image(c["image"]), *cmd]
        if detach:
            podman(*args)
            self.containers.append(name)
            return name
        return podman(*args, check=False, timeout=timeout)

    def run_pod(self, pod: str, template: dict, *, containers: list[str] | None = None, **kw) -> dict[str, str]:
        """Init containers to completion, then the pod's containers detached; {container: name}."""
        spec = template["spec"]
        labels = template.get("metadata", {}).get("labels", {})
        kw.setdefault("fields", {"metadata.name": pod, "metadata.namespace": self.namespace})
        for init in spec.get("initContainers", []):
            proc = self.run_container(
                pod,
                spec,
                init,
                labels={},
                detach=False,
                timeout=600,
                fields=kw["fields"],
                extra_env=kw.get("extra_env", ()),
            )
            self.init_logs[f"{pod}/{init['name']}"] = proc.stdout + proc.stderr
            if proc.returncode != 0:
                out = proc.stdout[-3000:] + proc.stderr[-3000:]
                raise RuntimeError(f"{pod}: init container {init['name']} failed:\n{out}")
        started = {}
        for c in spec["containers"]:
            if containers is not None and c["name"] not in containers:
                continue
            started[c["name"]] = self.run_container(pod, spec, c, labels=labels, detach=True, **kw)
        return started

    def wait_ready(self, name: str, container: dict, timeout: float = 300) -> None:
        """Run the container's readiness probe inside it until it passes."""
        probe = container.get("readinessProbe") or container.get("startupProbe")
        deadline = time.monotonic() + timeout
        while True:
            state = podman("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()
            if state in ("exited", "stopped"):
                raise RuntimeError(f"{name} exited:\n{self.logs(name)[-4000:]}")
            if probe_passes(name, probe, container.get("ports", [])):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout}s:\n{self.logs(name)[-4000:]}")
            time.sleep(2)

    def logs(self, name: str) -> str:
        proc = podman("logs", name, check=False)
        return proc.stdout + proc.stderr

    def exec(self, name: str, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return podman("exec", name, *cmd, check=False, timeout=timeout)

    def stop(self, *names: str) -> None:
        """Remove these containers in one podman call (stopped side by side, not one 5 s grace after another)."""
        if names:
            podman("rm", "-f", "-t", "5", *names, check=False)
        self.containers = [c for c in self.containers if c not in names]

    def close(self) -> None:
        self.stop(*self.containers)
        if self.own_network:
            podman("network", "rm", "-f", self.network, check=False)
        shutil.rmtree(self.workdir / "env", ignore_errors=True)


def probe_passes(name: str, probe: dict | None, ports: list[dict] = ()) -> bool:
    if not probe:
        return True
    if "exec" in probe:
        cmd = probe["exec"]["command"]
    elif "httpGet" in probe:
        port = probe["httpGet"]["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in ports if p.get("name") == port)
        scheme = probe["httpGet"].get("scheme", "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{port}{probe['httpGet'].get('path', '/')}"
        # the kubelet does not verify an HTTPS probe's certificate
        code = f"import ssl, urllib.request; urllib.request.urlopen({url!r}, timeout=4, "
        code += "context=ssl._create_unverified_context())"
        cmd = ["python3", "-c", code]
    elif "tcpSocket" in probe:
        port = probe["tcpSocket"]["port"]
        cmd = ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 4)"]
    else:
        return True
    return podman("exec", name, *cmd, check=False, timeout=30).returncode == 0


def find_template(resources: list[dict], kind: str, name: str) -> dict:
    """The pod template of a workload; a StatefulSet's volumeClaimTemplates become PVC volumes of
    pod 0 (claim <template>-<name>-0), as the StatefulSet controller creates them."""
    import copy

    r = next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)
    node = r
    for p in dr.WORKLOAD_TEMPLATE_PATHS[kind]:
        node = node[p]
    node = copy.deepcopy(node)
    for vct in r["spec"].get("volumeClaimTemplates", []) if kind == "StatefulSet" else []:
        claim = f"{vct['metadata']['name']}-{name}-0"
        node["spec"].setdefault("volumes", []).append(
            {"name": vct["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}}
        )
    return node


def shell_quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)

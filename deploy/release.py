#!/usr/bin/env python3
"""Images by digest, from build to `kubectl apply`: the one way to an overlay that can be applied.

    python deploy/release.py check   deploy/overlays/dev            # every image pinned (ours may be placeholders)
    python deploy/release.py render  deploy/overlays/dev > dev.yaml  # refuses while a placeholder remains
    python deploy/release.py release deploy/overlays/gpu-cluster --registry registry.example.com/calib-sweeps \\
        --version 0.1.0 [--builder docker|podman]               # build, push, pin the pushed digests
    python deploy/release.py digests deploy/overlays/dev           # re-read third-party digests from their registries
    python deploy/release.py apply   deploy/overlays/gpu-cluster [-l SELECTOR]   # render (as `render`), then
                                                                   # `kubectl apply -f -`: the README's deploy step
    python deploy/release.py operator-values                       # the KubeRay operator's helm values, refused
                                                                   # while its image is not pinned by digest

The rules (`problems()`): every container image of the rendered overlay (init containers, the Ray
autoscaler's) is `name[:tag]@sha256:<64 hex>`. A third-party image (anything but our
calib-sweeps/ray and calib-sweeps/mlflow) must carry its tag and a real digest: a tag alone, a
digest alone (nobody can tell what it was) or the all-zero placeholder is refused. Our images stay
`sha256:000...` placeholders in the repository (no build of them exists before a release); `render`
refuses them (and NetworkPolicy address ranges still in 192.0.2.0/24: the overlays' placeholders for
the object store, the Kubernetes API and a managed database, TEST-NET-1, routed nowhere, which the user
sets), and `release` is what replaces the images': it builds both images from docker/, pushes them,
reads the digests the registry answered and writes them into the overlay (`kustomize edit set image`
where the kustomize binary is installed, the same edit of kustomization.yaml otherwise), then renders
the overlay with the checks. Apply what `render` prints: `python deploy/release.py render OVERLAY |
kubectl apply -f -` (`kubectl apply -k` would apply placeholders as well, which no node can pull).

Every command but `operator-values` also refuses, in one line, an overlay whose NetworkPolicies leave the Ray
head's autoscaler no way to the Kubernetes API (`api_server_route_problem`): judged for the CNI `--cni`
(`generic`, or `cilium`, which ignores ipBlock for the in-cluster API server and needs
deploy/components/cilium-api-egress; default $CALIB_CNI) and, with `--api-server ADDR` ($CALIB_API_SERVER), for
the API server's endpoint addresses (`kubectl get endpoints kubernetes`).

`digests` asks each third-party image's registry for the digest of its tag (with `crane digest`,
`skopeo inspect` or `docker buildx imagetools inspect`, whichever is installed) and reports every
pin that differs: run it where the registries are reachable, when bumping a tag, and before a
release. The pins' sources are cited beside them in the manifests.
Renders with kustomize >= v5 (`find_kustomize`): the one beside this Python (the project's pinned
kustomize 5.6.0, which `make setup` installs into .venv/bin), else `kustomize` on PATH, else
`kubectl kustomize`. Standard library and PyYAML.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
OURS = {"calib-sweeps/ray": "docker/Dockerfile", "calib-sweeps/mlflow": "docker/mlflow.Dockerfile"}
PLACEHOLDER = "sha256:" + "0" * 64
REF = re.compile(r"^(?P<name>[^@\s]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


class ReleaseError(RuntimeError):
    pass


KUSTOMIZE_MIN = (5, 0)  # deploy/ uses `labels` with includeTemplates and `patches` with targets
INSTALL_HINT = "run `make setup` or `python tests/tools/install_kustomize.py` (kustomize 5.6.0, pinned by hash)"


def _output(cmd: list[str]) -> str | None:
    """CMD's stdout, None when it does not run or fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _v5(version: str) -> bool:
    """kustomize >= v5, or a version it does not print (Debian's build says `(devel)`)."""
    m = re.search(r"v(\d+)\.(\d+)", version)
    return m is None or (int(m[1]), int(m[2])) >= KUSTOMIZE_MIN


@functools.cache
def find_kustomize(
    python: str = sys.executable, path: str | None = None, only_kubectl: bool = False
) -> tuple[list[str], str]:
    """(the command that renders a kustomization with the directory appended, which one it is in
    words): the kustomize beside PYTHON (the pinned one in .venv/bin), else `kustomize` on PATH,
    else `kubectl kustomize` with kustomize >= v5 (ONLY_KUBECTL: that one or none).
    ReleaseError saying how to install the pinned one when there is none."""
    tried: list[str] = []
    pinned = Path(python).parent / "kustomize"  # not resolved: the venv's bin/
    candidates: list[str | None] = []
    if not only_kubectl:
        candidates = [str(pinned) if os.access(pinned, os.X_OK) else None, shutil.which("kustomize", path=path)]
    for exe in dict.fromkeys(c for c in candidates if c):
        version = _output([exe, "version"])
        if version is not None and _v5(version):
            return [exe, "build"], f"kustomize {version or '(version unknown)'} ({exe})"
        tried.append(f"{exe} does not run" if version is None else f"{exe} is kustomize {version}")
    kubectl = shutil.which("kubectl", path=path)
    if kubectl:
        try:
            embedded = str(
                json.loads(_output([kubectl, "version", "--client", "-o", "json"]) or "")["kustomizeVersion"]
            )
        except (ValueError, KeyError, TypeError):
            embedded = ""
        if embedded and _v5(embedded):
            return [kubectl, "kustomize"], f"kubectl kustomize ({kubectl}, kustomize {embedded})"
        tried.append(f"{kubectl} embeds kustomize {embedded or '(version unknown)'}")
    wanted = "kubectl with kustomize >= v5" if only_kubectl else "kustomize >= v5"
    raise ReleaseError(f"no {wanted} ({'; '.join(tried) or 'none found'}): {INSTALL_HINT}")


def render(overlay: Path) -> list[dict]:
    cmd = [*find_kustomize()[0], str(overlay)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def ours(image: str) -> str | None:
    """The name of ours an image reference is (whatever registry), or None for a third-party image."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name.rsplit(":", 1)[0]
    return next((n for n in OURS if name == n or name.endswith("/" + n)), None)


def images(resources: list[dict]) -> list[tuple[str, str]]:
    """(where, image) for every container, init container and Ray autoscaler image."""
    out: list[tuple[str, str]] = []

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                    for c in value:
                        if isinstance(c, dict) and "image" in c:
                            out.append((f"{where}/{c.get('name', '?')}", c["image"]))
                elif key == "autoscalerOptions" and isinstance(value, dict) and "image" in value:
                    out.append((f"{where}/autoscaler", value["image"]))
                walk(value, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for r in resources:
        walk(r, f"{r.get('kind')}/{r.get('metadata', {}).get('name', '?')}")
    return out


# NetworkPolicy address ranges the overlays leave for the user to set (TEST-NET-1: routed nowhere).
PLACEHOLDER_NETWORK = ipaddress.ip_network("192.0.2.0/24")


def placeholder_ranges(resources: list[dict]) -> list[str]:
    """'NetworkPolicy/<name>: <cidr>' for every egress or ingress address range still a placeholder."""
    found = []
    for r in resources:
        if r.get("kind") != "NetworkPolicy":
            continue
        spec = r.get("spec", {})
        for rule in [*spec.get("egress", []), *spec.get("ingress", [])]:
            for peer in [*rule.get("to", []), *rule.get("from", [])]:
                cidr = peer.get("ipBlock", {}).get("cidr")
                if cidr and ipaddress.ip_network(cidr, strict=False).subnet_of(PLACEHOLDER_NETWORK):
                    found.append(f"NetworkPolicy/{r['metadata']['name']}: {cidr}")
    return found


# ------------------------------------------------------------------- the autoscaler's way to the API server
# The Ray head's autoscaler sidecar patches the RayCluster through the Kubernetes API; without a way there the
# sweep never scales up, and nothing says so (the workers just never come). NetworkPolicy names the API server by
# address (ipBlock), which most CNIs honour. Cilium does not match ipBlock/toCIDR against addresses that belong
# to the cluster: the API server is the `kube-apiserver` entity there (its endpoints on the control-plane nodes
# or in the cluster), so an ipBlock rule lets nothing through and the CiliumNetworkPolicy of
# deploy/components/cilium-api-egress (toEntities: kube-apiserver) is the way. `cni` is "generic" (every
# NetworkPolicy CNI but Cilium) or "cilium" (given with --cni / CALIB_CNI, or implied by a CiliumNetworkPolicy
# in the render).
API_PORTS = (443, 6443)
CNIS = ("generic", "cilium")
CILIUM_API_ENTITIES = {"kube-apiserver", "cluster", "all"}


def _selects(selector: dict | None, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against LABELS."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _autoscaled_heads(resources: list[dict]) -> list[tuple[str, dict]]:
    """(where, the head pod's labels as KubeRay sets them) of every RayJob/RayCluster with in-tree autoscaling."""
    out = []
    for r in resources:
        if r.get("kind") not in ("RayJob", "RayCluster"):
            continue
        spec = r["spec"].get("rayClusterSpec", {}) if r["kind"] == "RayJob" else r["spec"]
        if not spec or not spec.get("enableInTreeAutoscaling"):
            continue
        labels = dict(spec["headGroupSpec"]["template"].get("metadata", {}).get("labels", {}))
        labels.update({"ray.io/node-type": "head", "app.kubernetes.io/created-by": "kuberay-operator"})
        out.append((f"{r['kind']}/{r['metadata']['name']}", labels))
    return out


def _ports_cover(ports: list[dict] | None, port: int) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        lo = p.get("port")
        if lo is None:
            return True
        if isinstance(lo, int) and lo <= port <= p.get("endPort", lo):
            return True
    return False


def _block_holds(peer: dict, address: str | None) -> bool:
    """Whether an egress peer is an address range holding ADDRESS (any range, where ADDRESS is None)."""
    block = peer.get("ipBlock")
    if block is None:
        return False
    if address is None:
        return True
    ip = ipaddress.ip_address(address)
    net = ipaddress.ip_network(block["cidr"], strict=False)
    if ip.version != net.version or ip not in net:
        return False
    return not any(ip in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])


def _netpol_route(policies: list[dict], labels: dict, addresses: list[str] | None = None) -> str | None:
    """'open' when no NetworkPolicy isolates the head's egress, 'ipBlock' when one of its egress rules allows 443
    or 6443 to an address range (holding every one of ADDRESSES, the API server's, where given), None otherwise."""
    mine = [
        p
        for p in policies
        if "Egress" in (p["spec"].get("policyTypes") or ["Ingress"]) and _selects(p["spec"].get("podSelector"), labels)
    ]
    if not mine:
        return "open"
    for p in mine:
        for rule in p["spec"].get("egress") or []:
            if not any(_ports_cover(rule.get("ports"), port) for port in API_PORTS):
                continue
            peers = rule.get("to")
            if not peers or all(any(_block_holds(peer, a) for peer in peers) for a in addresses or [None]):
                return "ipBlock"
    return None


def _cilium_route(resources: list[dict], labels: dict) -> bool:
    """Whether a CiliumNetworkPolicy selecting the head lets it reach the kube-apiserver entity on 443 or 6443."""
    for r in resources:
        if r.get("kind") != "CiliumNetworkPolicy":
            continue
        for spec in [r.get("spec"), *(r.get("specs") or [])]:
            if not spec or not _selects(spec.get("endpointSelector"), labels):
                continue
            for rule in spec.get("egress") or []:
                if not CILIUM_API_ENTITIES & set(rule.get("toEntities") or []):
                    continue
                to_ports = rule.get("toPorts") or [{}]
                for tp in to_ports:
                    ports = [
                        {"port": int(p["port"]), "protocol": p.get("protocol", "TCP").upper().replace("ANY", "TCP")}
                        for p in tp.get("ports") or []
                    ]
                    if any(_ports_cover(ports, port) for port in API_PORTS):
                        return True
    return False


def api_server_route_problem(
    resources: list[dict], cni: str = "generic", api_addresses: list[str] | None = None
) -> str | None:
    """One line saying why the Ray head's autoscaler cannot reach the Kubernetes API under CNI, or None.
    API_ADDRESSES (`kubectl get endpoints kubernetes`): judged against them; without, any address range on
    443/6443 counts (the object store's too: give the addresses for a precise answer)."""
    if any(r.get("kind") == "CiliumNetworkPolicy" for r in resources):
        cni = "cilium"
    policies = [r for r in resources if r.get("kind") == "NetworkPolicy"]
    for where, labels in _autoscaled_heads(resources):
        route = _netpol_route(policies, labels, api_addresses)
        if route == "open":
            continue
        if cni == "cilium":
            if _cilium_route(resources, labels):
                continue
            why = (
                "an ipBlock rule, which Cilium does not match against the API server (in-cluster, entity "
                "kube-apiserver)"
                if route == "ipBlock"
                else "no egress rule to 443/6443"
            )
            return (
                f"{where}: the autoscaler cannot reach the Kubernetes API under Cilium ({why}): add "
                "components/cilium-api-egress (toEntities: kube-apiserver); the sweep would never scale up"
            )
        if route is None:
            to = f"the API server's {', '.join(api_addresses)}" if api_addresses else "an address range"
            return (
                f"{where}: the autoscaler cannot reach the Kubernetes API (no egress rule of the head's "
                f"NetworkPolicies allows TCP 443/6443 to {to}): the sweep would never scale up"
            )
    return None


def problems(
    resources: list[dict], for_apply: bool = False, cni: str = "generic", api_addresses: list[str] | None = None
) -> list[str]:
    """What stops the overlay: images not pinned by digest, the autoscaler without a way to the Kubernetes API
    under CNI, and (`for_apply`) placeholders left to replace."""
    found = []
    no_route = api_server_route_problem(resources, cni, api_addresses)
    if no_route:
        found.append(no_route)
    if for_apply:
        found += [
            f"{where}: placeholder address range (set your own: the overlay's egress patch, deploy/README.md)"
            for where in placeholder_ranges(resources)
        ]
    for where, image in images(resources):
        m = REF.match(image)
        mine = ours(image)
        if not m or not m.group("digest"):
            found.append(f"{where}: {image} is not pinned by digest (name:tag@sha256:<64 hex>)")
            continue
        if mine is None:
            if not m.group("tag"):
                found.append(f"{where}: {image}: a third-party image names its tag beside the digest")
            if m.group("digest") == PLACEHOLDER:
                found.append(f"{where}: {image}: the all-zero placeholder on a third-party image")
        elif for_apply and m.group("digest") == PLACEHOLDER:
            found.append(f"{where}: {image}: placeholder digest of our image (run `deploy/release.py release`)")
    return found


# ---------------------------------------------------------------------------------- Jobs, re-applied
# A Job's pod template is immutable: `kubectl apply` of a Job whose spec changed (a new image digest, a new script)
# fails with "field is immutable" while the old Job exists. `render` and `apply` therefore name every Job after
# its spec: `<name>-<first 10 hex of sha256(spec)>`, with the label calib-sweeps/job=<name> to find it by. A new
# release makes a new Job (which runs once more: the set-up Jobs are idempotent); an unchanged one keeps its name,
# so re-applying is a no-op; the old one goes with its ttlSecondsAfterFinished (every Job has one: tested).
# (Kustomize hashes the names of generated ConfigMaps and Secrets only; a Job generator or plugin would have
# to be installed wherever kustomize runs, and ttlSecondsAfterFinished alone leaves the window until it
# expires, which is how the failure came about.)
JOB_LABEL = "calib-sweeps/job"


def job_spec_hash(job: dict) -> str:
    return hashlib.sha256(json.dumps(job.get("spec", {}), sort_keys=True, separators=(",", ":")).encode()).hexdigest()[
        :10
    ]


def name_jobs_by_spec(resources: list[dict]) -> list[dict]:
    """RESOURCES with every batch/v1 Job renamed `<name>-<hash of its spec>` and labelled calib-sweeps/job=<name>
    (a Job already carrying that label keeps its base name from it: idempotent)."""
    out = []
    for r in resources:
        if r.get("kind") == "Job" and r.get("apiVersion") == "batch/v1":
            r = json.loads(json.dumps(r))
            meta = r["metadata"]
            labels = meta.setdefault("labels", {})
            base = labels.get(JOB_LABEL) or meta["name"]
            labels[JOB_LABEL] = base
            meta["name"] = f"{base}-{job_spec_hash(r)}"
            if len(meta["name"]) > 63:
                raise ReleaseError(f"Job {base}: {meta['name']} is longer than 63 characters")
        out.append(r)
    return out


# ------------------------------------------------------------------------------- a running sweep
# KubeRay builds every retry's Ray cluster from the RayJob's *current* spec: applying a new Ray image while a sweep
# runs makes its next retry resume the old Tune state on the new Ray (deploy/UPGRADING.md). `apply` asks the
# cluster for the RayJobs it would change and refuses a change to a RayJob that is still running.
RUNNING = {"", "New", "Initializing", "Running", "Waiting", "Retrying", "Suspending", "Resuming"}


def running_rayjob_changes(resources: list[dict], live: dict[str, dict]) -> list[str]:
    """'RayJob/<name> ...' for every rendered RayJob whose spec differs from LIVE's (name -> the object in the
    cluster) while that one has not finished (status.jobDeploymentStatus not Complete/Failed)."""
    found = []
    for r in resources:
        if r.get("kind") != "RayJob":
            continue
        name = r["metadata"]["name"]
        current = live.get(name)
        if current is None:
            continue
        status = (current.get("status") or {}).get("jobDeploymentStatus", "")
        if status not in RUNNING or current.get("spec", {}).get("suspend"):
            continue
        want = r.get("spec", {}).get("rayClusterSpec", {})
        have = current.get("spec", {}).get("rayClusterSpec", {})
        if json.dumps(want, sort_keys=True) != json.dumps(have, sort_keys=True) or r["spec"].get("entrypoint") != (
            current.get("spec", {}).get("entrypoint")
        ):
            found.append(
                f"RayJob/{name} is {status or 'starting'}: its next retry would resume the sweep on the new spec; "
                "wait for it to finish, or delete it first (deploy/UPGRADING.md), or --allow-running-sweep"
            )
    return found


def live_rayjobs(kubectl: str, namespace: str) -> dict[str, dict]:
    proc = subprocess.run(
        [kubectl, "get", "rayjobs.ray.io", "-n", namespace, "-o", "json"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        if "NotFound" in proc.stderr or "doesn't have a resource type" in proc.stderr:
            return {}
        raise ReleaseError(f"{kubectl} get rayjobs -n {namespace} failed: {proc.stderr.strip()[-500:]}")
    return {i["metadata"]["name"]: i for i in json.loads(proc.stdout or "{}").get("items", [])}


def select(resources: list[dict], selector: str | None) -> list[dict]:
    """The objects a `-l` label selector of `=`, `==` and `!=` terms keeps (what `kubectl apply -l` would)."""
    if not selector:
        return resources
    terms = []
    for term in selector.split(","):
        m = re.fullmatch(r"\s*([\w./-]+)\s*(!=|==|=)\s*([\w.-]*)\s*", term)
        if not m:
            raise ReleaseError(f"-l {selector}: only key=value and key!=value terms are understood")
        terms.append(m.groups())
    out = []
    for r in resources:
        labels = r.get("metadata", {}).get("labels") or {}
        if all((labels.get(k) == v) == (op != "!=") for k, op, v in terms):
            out.append(r)
    return out


OPERATOR_VALUES = REPO / "deploy" / "cluster" / "kuberay-operator-values.yaml"
OPERATOR_VERSION = "v1.7.0"  # the CRDs the tests validate against (deploy/schemas/kuberay-v1.7.0)


def operator_problems(values: dict) -> list[str]:
    """What stops the KubeRay operator's helm values: its image not `quay.io/kuberay/operator:<version>@sha256:<64
    hex>` with a real digest, at the version whose CRDs the manifests are checked against."""
    image = values.get("image") or {}
    ref = f"{image.get('repository', '')}:{image.get('tag', '')}"
    m = REF.match(ref)
    where = f"{OPERATOR_VALUES.relative_to(REPO)}: image {ref}"
    if not m or not m.group("digest") or not m.group("tag"):
        return [f"{where} is not pinned by digest (tag: {OPERATOR_VERSION}@sha256:<64 hex>)"]
    found = []
    if m.group("tag") != OPERATOR_VERSION:
        found.append(f"{where}: the manifests are checked against KubeRay {OPERATOR_VERSION}'s CRDs")
    if m.group("digest") == PLACEHOLDER:
        found.append(f"{where}: placeholder digest (crane digest quay.io/kuberay/operator:{OPERATOR_VERSION})")
    if values.get("singleNamespaceInstall"):
        found.append(f"{where}: production runs one cluster-wide operator (singleNamespaceInstall: false)")
    return found


# ------------------------------------------------------------------------------------------ release


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def build_and_push(builder: str, registry: str, version: str) -> dict[str, str]:
    """{our name: registry/name@sha256:...} of the pushed images."""
    if registry.rstrip("/").rsplit("/", 1)[-1] != "calib-sweeps":
        # the checks know our images by their path (…/calib-sweeps/ray, …/calib-sweeps/mlflow)
        raise ReleaseError(
            f"--registry must end with /calib-sweeps (e.g. registry.example.com/calib-sweeps), got {registry}"
        )
    pushed = {}
    for name, dockerfile in OURS.items():
        ref = f"{registry.rstrip('/')}/{name.split('/', 1)[1]}:{version}"
        build = [builder, "build", "-f", str(REPO / dockerfile), "-t", ref]
        if builder == "podman":
            build += ["--format", "docker"]  # keeps HEALTHCHECK (OCI has none)
        _run([*build, str(REPO)])
        if builder == "podman":
            digest_file = REPO / ".release-digest"
            try:
                _run([builder, "push", "--digestfile", str(digest_file), ref])
                digest = digest_file.read_text().strip()
            finally:
                digest_file.unlink(missing_ok=True)
        else:
            out = _run([builder, "push", ref]).stdout
            m = re.findall(r"digest: (sha256:[0-9a-f]{64})", out)
            if not m:
                raise ReleaseError(f"{builder} push {ref} printed no digest")
            digest = m[-1]
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest) or digest == PLACEHOLDER:
            raise ReleaseError(f"{ref}: the registry answered no usable digest ({digest!r})")
        pushed[name] = f"{ref.rsplit(':', 1)[0]}@{digest}"
    return pushed


def set_images(overlay: Path, pushed: dict[str, str]) -> None:
    """`kustomize edit set image NAME=REF@DIGEST ...` in the overlay, or the same edit of its
    kustomization.yaml (the images: entry of each name gets newName and digest, and no newTag)."""
    if shutil.which("kustomize"):
        _run(["kustomize", "edit", "set", "image", *(f"{n}={ref}" for n, ref in pushed.items())], cwd=overlay)
        return
    kfile = overlay / "kustomization.yaml"
    text = kfile.read_text()
    for name, ref in pushed.items():
        new_name, digest = ref.split("@", 1)
        block = re.search(
            rf"(?m)^(?P<i>[ \t]*)- name: {re.escape(name)}[ \t]*\n(?P<body>(?:(?P=i)[ \t]+\S.*\n)*)", text
        )
        if block is None:
            raise ReleaseError(f"{kfile}: no images: entry for {name}")
        indent = block.group("i") + "  "
        body = f"{indent}newName: {new_name}\n{indent}digest: {digest}\n"
        text = text[: block.start("body")] + body + text[block.end("body") :]
    kfile.write_text(text)


def third_party_digest(image: str) -> str:
    """The registry's current digest of IMAGE's tag."""
    tagged = image.split("@", 1)[0]
    if shutil.which("crane"):
        return _run(["crane", "digest", tagged]).stdout.strip()
    if shutil.which("skopeo"):
        return _run(["skopeo", "inspect", "--format", "{{.Digest}}", f"docker://{tagged}"]).stdout.strip()
    if shutil.which("docker"):
        out = _run(["docker", "buildx", "imagetools", "inspect", tagged, "--format", "{{json .Manifest}}"]).stdout
        return json.loads(out)["digest"]
    raise ReleaseError("none of crane, skopeo or docker (buildx) is installed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    cni_help = "the cluster's CNI: the autoscaler's way to the API server differs under Cilium (default: $CALIB_CNI)"
    cni_default = os.environ.get("CALIB_CNI") or "generic"
    api_help = "the API server's endpoint address (repeatable; default: $CALIB_API_SERVER, comma-separated)"
    api_default = [a for a in os.environ.get("CALIB_API_SERVER", "").split(",") if a.strip()]
    parsers = []
    for name in ("check", "render", "digests"):
        one = sub.add_parser(name)
        one.add_argument("overlay", type=Path)
        parsers.append(one)
    sub.add_parser("operator-values").add_argument("--values", type=Path, default=OPERATOR_VALUES)
    app = sub.add_parser("apply", help="render with every check, then pipe to kubectl apply -f -")
    app.add_argument("overlay", type=Path)
    app.add_argument("-l", "--selector", help="apply only these objects (key=value, key!=value)")
    app.add_argument("--kubectl", default=os.environ.get("KUBECTL", "kubectl"))
    app.add_argument("--allow-running-sweep", action="store_true", help="apply a changed RayJob while it runs")
    app.add_argument("--dry-run", action="store_true", help="print what would be applied instead")
    rel = sub.add_parser("release")
    rel.add_argument("overlay", type=Path)
    rel.add_argument("--registry", required=True, help="ending with /calib-sweeps: registry.example.com/calib-sweeps")
    rel.add_argument("--version", required=True, help="the tag pushed beside the digest, e.g. 0.1.0")
    rel.add_argument("--builder", default="docker", choices=("docker", "podman"))
    for one in (*parsers, app, rel):
        one.add_argument("--cni", choices=CNIS, default=cni_default, help=cni_help)
        one.add_argument("--api-server", action="append", default=None, dest="api_server", help=api_help)
    args = p.parse_args(argv)
    try:
        if args.cmd == "operator-values":
            text = args.values.read_text()
            found = operator_problems(yaml.safe_load(text) or {})
            if found:
                print("\n".join(found), file=sys.stderr)
                return 1
            sys.stdout.write(text)
            return 0
        if args.cmd == "release":
            pushed = build_and_push(args.builder, args.registry, args.version)
            set_images(args.overlay, pushed)
            for name, ref in pushed.items():
                print(f"{name} -> {ref}", file=sys.stderr)
        resources = render(args.overlay)
        if args.cmd == "digests":
            wrong = []
            for image in sorted({i for _, i in images(resources) if ours(i) is None}):
                pinned = image.split("@", 1)[1] if "@" in image else None
                current = third_party_digest(image)
                status = "ok" if current == pinned else f"DIFFERS: registry {current}"
                print(f"{image.split('@', 1)[0]}: {status}")
                if current != pinned:
                    wrong.append(image)
            return 1 if wrong else 0
        found = problems(
            resources,
            for_apply=args.cmd in ("render", "release", "apply"),
            cni=args.cni,
            api_addresses=[a.strip() for a in (args.api_server or api_default)] or None,
        )
        if found:
            print("\n".join(found), file=sys.stderr)
            if args.cmd == "apply":
                print("release.py apply: nothing applied", file=sys.stderr)
            return 1
        if args.cmd in ("render", "apply"):
            resources = name_jobs_by_spec(resources)
        if args.cmd == "render":
            sys.stdout.write(yaml.safe_dump_all(resources, sort_keys=False))
        if args.cmd == "apply":
            resources = select(resources, args.selector)
            text = yaml.safe_dump_all(resources, sort_keys=False)
            if args.dry_run:
                sys.stdout.write(text)
                return 0
            kubectl = shutil.which(args.kubectl) or args.kubectl
            if not args.allow_running_sweep:
                namespaces = sorted(
                    {r["metadata"].get("namespace") for r in resources if r["kind"] == "RayJob"} - {None}
                )
                live: dict[str, dict] = {}
                for ns in namespaces:
                    live.update(live_rayjobs(kubectl, ns))
                found = running_rayjob_changes(resources, live)
                if found:
                    print("\n".join(found), file=sys.stderr)
                    print("release.py apply: nothing applied", file=sys.stderr)
                    return 1
            return subprocess.run([kubectl, "apply", "-f", "-"], input=text, text=True).returncode
        return 0
    except ReleaseError as e:
        print(f"release.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

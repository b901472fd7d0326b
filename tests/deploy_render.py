"""Kustomize rendering for the deploy tests: `render(DIR)` runs the real kustomize on DIR and returns its
objects. Which kustomize: deploy/release.py's `find_kustomize`, the same one the release tool renders
with: the pinned kustomize 5.6.0 beside this Python (.venv/bin/kustomize: Debian's package
kustomize_5.6.0+ds-1+b2, checked by SHA-256 and installed by `make setup`, i.e.
tests/tools/install_kustomize.py), else a `kustomize` on PATH, else `kubectl kustomize` (kustomize >=
v5). `CALIB_KUSTOMIZE=kubectl` renders with `kubectl kustomize` instead (an error without a usable
kubectl). Without any, rendering fails with one line saying how to install the pinned one.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from deploy import release
from tests.tools import install_kustomize

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "IngressClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "RuntimeClass",
}
# Kinds whose pod template lives at spec.template (or deeper for CronJob).
WORKLOAD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
BUILTIN_GROUPS = {
    "",
    "apps",
    "batch",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "autoscaling",
    "storage.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
}


def group_version(obj: dict) -> tuple[str, str]:
    api = obj.get("apiVersion", "")
    return tuple(api.split("/", 1)) if "/" in api else ("", api)  # type: ignore[return-value]


def is_builtin(obj: dict) -> bool:
    return group_version(obj)[0] in BUILTIN_GROUPS


def resource_id(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (group_version(obj)[0], obj["kind"], meta.get("namespace", ""), meta["name"])


KUSTOMIZE_ENV = "CALIB_KUSTOMIZE"  # unset: release.find_kustomize's order; "kubectl": kubectl kustomize


class KustomizeError(RuntimeError):
    """kustomize failed on a directory (its message included), or no usable kustomize is installed."""


@functools.cache
def _pinned(exe: str) -> bool:
    return Path(exe) == install_kustomize.DEFAULT_DEST and install_kustomize.is_installed(Path(exe))


def _command() -> tuple[list[str], str]:
    """(the command that renders, with the directory appended; which it is, in words)."""
    choice = os.environ.get(KUSTOMIZE_ENV, "").strip().lower()
    if choice not in ("", "kubectl"):
        raise KustomizeError(f"{KUSTOMIZE_ENV}={choice}: only 'kubectl' (or unset) is understood")
    try:
        cmd, why = release.find_kustomize(only_kubectl=choice == "kubectl")
    except release.ReleaseError as exc:
        raise KustomizeError(str(exc)) from None
    if _pinned(cmd[0]):
        why = f"kustomize {install_kustomize.VERSION} ({cmd[0]}, Debian's package pinned by sha256)"
    return cmd, why


def renderer() -> str:
    """Which kustomize :func:`render` runs, in words (for the pytest header and messages)."""
    return _command()[1]


@functools.cache
def _render_cached(cmd: tuple[str, ...], root: str) -> str:
    proc = subprocess.run([*cmd, root], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise KustomizeError(f"{' '.join(cmd)} {root} failed: {proc.stderr.strip()}")
    return json.dumps([d for d in yaml.safe_load_all(proc.stdout) if d is not None])


def render(directory: str | Path) -> list[dict]:
    """The objects `kustomize build DIRECTORY` prints, in its order; fresh copies (cached)."""
    return json.loads(_render_cached(tuple(_command()[0]), str(Path(directory).resolve())))


# ------------------------------------------------------------------------- helpers for the tests

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"


def overlay_dirs() -> list[Path]:
    """Every overlay under deploy/overlays that has a kustomization."""
    return sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, PodSpec) for every pod template an object carries, custom Ray resources included."""
    kind, name = obj["kind"], obj.get("metadata", {}).get("name", "?")
    spec = obj.get("spec", {})
    out: list[tuple[str, dict]] = []
    if kind in WORKLOAD_TEMPLATE_PATHS and is_builtin(obj):
        node: Any = obj
        for p in WORKLOAD_TEMPLATE_PATHS[kind]:
            node = node[p]
        out.append((f"{kind}/{name}", node["spec"]))
    elif kind == "Pod":
        out.append((f"Pod/{name}", spec))
    elif kind in ("RayJob", "RayCluster"):
        cluster = spec.get("rayClusterSpec", {}) if kind == "RayJob" else spec
        if kind == "RayJob" and "submitterPodTemplate" in spec:
            out.append((f"{kind}/{name}/submitter", spec["submitterPodTemplate"]["spec"]))
        if "headGroupSpec" in cluster:
            out.append((f"{kind}/{name}/head", cluster["headGroupSpec"]["template"]["spec"]))
        for group in cluster.get("workerGroupSpecs", []):
            out.append((f"{kind}/{name}/worker:{group['groupName']}", group["template"]["spec"]))
    return out


def ray_cluster_spec(obj: dict) -> dict | None:
    """The RayClusterSpec of a RayJob or RayCluster (None for other kinds)."""
    if obj["kind"] == "RayJob":
        return obj["spec"].get("rayClusterSpec")
    if obj["kind"] == "RayCluster":
        return obj["spec"]
    return None


def namespace_of(resources: list[dict]) -> str:
    """The one namespace an overlay's namespaced objects are rendered into."""
    namespaces = {r["metadata"].get("namespace") for r in resources if r["kind"] not in CLUSTER_SCOPED}
    namespaces.discard(None)
    if len(namespaces) != 1:
        raise ValueError(f"expected one namespace, got {sorted(namespaces)}")
    return namespaces.pop()


def persistent_dir(overlay: Path) -> Path:
    """The overlay's persistent/ kustomization (Namespace, dataset cache), applied once."""
    return overlay / "persistent"


# What a user writes over the overlays' placeholder address ranges (192.0.2.0/24, deploy/release.py):
# an AWS S3 range, the API server's endpoint, a managed database's subnet.
EXAMPLE_ADDRESSES = {"192.0.2.0/26": "52.216.0.0/15", "192.0.2.64/26": "10.0.0.1/32", "192.0.2.128/26": "10.20.0.0/24"}


def with_addresses(text: str) -> str:
    """Manifest text (a rendered overlay or its files) with the placeholder address ranges set as a user would."""
    for placeholder, real in EXAMPLE_ADDRESSES.items():
        text = text.replace(placeholder, real)
    return text


def render_with_addresses(directory: str | Path) -> list[dict]:
    """The overlay rendered, its placeholder address ranges set (EXAMPLE_ADDRESSES)."""
    return [d for d in yaml.safe_load_all(with_addresses(yaml.safe_dump_all(render(directory)))) if d]

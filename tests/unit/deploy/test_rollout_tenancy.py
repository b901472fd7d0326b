"""Tenants: the namespace is a kustomize parameter (an overlay's `namespace:`), so two teams render the same
overlay into two namespaces and apply both without a collision or a reference across; the persistent layer
holds a ResourceQuota that a sweep at its largest fits into and a LimitRange whose ceilings our containers
and claims stay under; the optional Kueue component queues the RayJob at a fixed size."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests import deploy_checks as dc
from tests import deploy_render as dr

OVERLAYS = dr.overlay_dirs()
IDS = [p.name for p in OVERLAYS]
EXAMPLES = dr.DEPLOY / "examples"


TENANT = dr.DEPLOY / "tenant"
# What each tenant sets (the README's "Tenants"): the UI host and the buckets, all its own.
TENANT_VALUES = {
    ns: {
        "UI_HOST": f"mlflow.{ns}.example.org",
        "MLFLOW_ARTIFACTS_URI": f"s3://{ns}-artifacts",
        "TUNE_STORAGE_URI": f"s3://{ns}-results/tune",
        "RAY_LOGS_URI": f"s3://{ns}-results/ray-logs",
        "DATASETS_URI": f"s3://{ns}-results/datasets",
        "BACKUP_S3_URI": f"s3://{ns}-backups/mlflow",
    }
    for ns in ("team-a", "team-b")
}
# The default tenant's (the overlay as committed): its host and buckets must appear in no other tenant's render.
DEFAULT_NAMES = (
    "mlflow.example.com",
    "calib-sweeps-mlflow-artifacts",
    "calib-sweeps-ray-results",
    "calib-sweeps-db-backups",
)


def has_tenant_values(target: Path) -> bool:
    return any(r["kind"] == "ConfigMap" and r["metadata"]["name"] == "calib-tenant" for r in dr.render(target))


def tenant_kustomization(d: Path, target: Path, namespace: str, values: dict | None) -> dict:
    """What the README tells a tenant to write: its namespace, and for an overlay with tenant values (gpu-cluster)
    its own values and ../deploy/tenant (which writes them, and the namespace, into every reference)."""
    k: dict = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [os.path.relpath(target, d)],
    }
    if values is not None:
        k["configMapGenerator"] = [
            {
                "name": "calib-tenant",
                "behavior": "replace",
                "options": {"disableNameSuffixHash": True},
                "literals": [f"{key}={v}" for key, v in values.items()],
            }
        ]
        k["transformers"] = [os.path.relpath(TENANT, d)]
    return k


def render_into(tmp: Path, target: Path, namespace: str, values: dict | None = None) -> list[dict]:
    """TARGET rendered by a kustomization of its own (tenant_kustomization)."""
    d = tmp / f"{namespace}-{target.name}-{abs(hash(str(target))) % 10**6}-{values is not None}"
    d.mkdir(parents=True)
    (d / "kustomization.yaml").write_text(yaml.safe_dump(tenant_kustomization(d, target, namespace, values)))
    return dr.render(d)


def render_tenant(tmp: Path, overlay: Path, namespace: str) -> list[dict]:
    values = TENANT_VALUES[namespace] if has_tenant_values(overlay) else None
    return render_into(tmp, overlay, namespace, values)


def _strings(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


def namespace_ref(namespace: str) -> re.Pattern:
    """NAMESPACE as a value, a DNS label (svc.NAMESPACE.svc) or the namespace of a `NAMESPACE/name` reference (an
    ingress-nginx annotation, a Prometheus job); not the part of an image name (`.../calib-sweeps/ray`)."""
    return re.compile(rf"(?:^|[.\s=:,@\"'])({re.escape(namespace)})(?:$|[.\s:,/\"'])")


def foreign_references(resources: list[dict], others: list[str], names: tuple[str, ...]) -> list[str]:
    """'Kind/name path: value' for every string that names one of the OTHERS namespaces or holds one of NAMES (the
    other tenants' hosts and buckets)."""
    found = []
    patterns = [namespace_ref(ns) for ns in others]
    for r in resources:
        for path, s in _strings(r):
            if path[-1] in ("app.kubernetes.io/part-of", "SWEEP_EXPERIMENTS", "image"):
                continue  # the app's name, the MLflow experiment's (the sweep's default), image names: not namespaces
            if any(p.search(s) for p in patterns) or any(n in s for n in names):
                found.append(f"{r['kind']}/{r['metadata'].get('name')} {'/'.join(path)}: {s[:160]}")
    return found


TENANT_TARGETS = [*OVERLAYS, *sorted(p for p in EXAMPLES.iterdir() if p.name.startswith("gpu-cluster"))]


@pytest.mark.parametrize("overlay", TENANT_TARGETS, ids=[p.name for p in TENANT_TARGETS])
def test_two_tenants_name_nothing_of_each_other(tmp_path, overlay):
    """Two teams wrap the same overlay as the README shows: no object collides, and no string of one names the other's
    namespace, host or bucket, nor the default tenant's (calib-sweeps, mlflow.example.com, calib-sweeps-* buckets)."""
    renders = {}
    for ns in ("team-a", "team-b"):
        persistent = dr.persistent_dir(
            overlay if overlay.parent.name == "overlays" else dr.DEPLOY / "overlays" / "gpu-cluster"
        )
        renders[ns] = render_tenant(tmp_path, overlay, ns) + render_into(tmp_path, persistent, ns)
    ids = [dr.resource_id(r) for rs in renders.values() for r in rs]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    gpu = has_tenant_values(overlay)
    for ns, resources in renders.items():
        other = "team-b" if ns == "team-a" else "team-a"
        scoped = [r for r in resources if r["kind"] in dr.CLUSTER_SCOPED]
        # the only cluster-scoped object a tenant applies is its own Namespace (the platform part: deploy/cluster)
        assert [(r["kind"], r["metadata"]["name"]) for r in scoped] == [("Namespace", ns)], scoped
        assert {r["metadata"].get("namespace") for r in resources if r["kind"] not in dr.CLUSTER_SCOPED} == {ns}
        names = (*TENANT_VALUES[other].values(), *DEFAULT_NAMES) if gpu else ()
        names = tuple(n.removeprefix("s3://").split("/")[0] for n in names)  # hosts and bucket names
        assert foreign_references(resources, [other, "calib-sweeps"], names) == []
        if gpu:  # and its own values are where they belong
            text = yaml.safe_dump_all(resources)
            for v in TENANT_VALUES[ns].values():
                assert text.count(v) >= 2, v  # the calib-tenant ConfigMap and at least one reference
        problems = {k: v for k, v in dc.run_checks(render_tenant(tmp_path / "again", overlay, ns)).items() if v}
        assert problems == {}, problems


def test_a_tenant_without_the_tenant_transformer_is_caught(tmp_path):
    """What the README showed before (the overlay wrapped with `namespace:` alone): the Ingress's proxy-ssl-secret
    kept `calib-sweeps/mlflow-tls`, and host and buckets stayed the default tenant's. Both the render test's finder
    and the deploy check see it. (The Ingress is the ingress-nginx example's now; gpu-cluster's HTTPRoute has no
    namespace in it, its host is checked the same way.)"""
    overlay = dr.DEPLOY / "examples" / "gpu-cluster-ingress-nginx"
    resources = render_into(tmp_path, overlay, "team-b")
    found = foreign_references(resources, ["calib-sweeps"], ())
    assert any("proxy-ssl-secret: calib-sweeps/mlflow-tls" in f for f in found), found
    assert foreign_references(resources, [], DEFAULT_NAMES)  # the default host and buckets
    # values changed but the transformer not listed: every reference disagrees with them
    d = tmp_path / "no-transformer"
    d.mkdir()
    k = tenant_kustomization(d, overlay, "team-b", TENANT_VALUES["team-b"])
    del k["transformers"]
    (d / "kustomization.yaml").write_text(yaml.safe_dump(k))
    problems = dc.check_tenant_references(dr.render(d))
    assert len(problems) >= 7, problems
    assert any("proxy-ssl-secret" in p for p in problems) and any("--storage-path" in p for p in problems), problems


def test_default_render_still_uses_calib_sweeps():
    for overlay in OVERLAYS:
        assert dr.namespace_of(dr.render(overlay)) == "calib-sweeps"
        ns = [r for r in dr.render(dr.persistent_dir(overlay)) if r["kind"] == "Namespace"]
        assert [r["metadata"]["name"] for r in ns] == ["calib-sweeps"]


def _env_order_problems(resources: list[dict]) -> list[str]:
    problems = []
    for r in resources:
        for where, spec in dr.pod_specs(r):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                defined: set[str] = set()
                for src in c.get("envFrom", []):
                    name = (src.get("configMapRef") or src.get("secretRef") or {}).get("name")
                    cm = next(
                        (x for x in resources if x["kind"] == "ConfigMap" and x["metadata"]["name"] == name), None
                    )
                    defined |= set((cm or {}).get("data", {}))
                for e in c.get("env", []):
                    for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(e.get("value", ""))):
                        if ref not in defined:
                            problems.append(f"{where}/{c['name']}: {e['name']} uses $({ref}) before it is defined")
                    defined.add(e["name"])
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_env_references_come_after_their_definition(overlay):
    """Kubernetes expands $(VAR) in an env value only from variables defined before it (MLflow's allowed
    hosts name the namespace through $(POD_NAMESPACE)); a patch that reorders env would silently leave the
    text unexpanded."""
    resources = dr.render(overlay)
    assert _env_order_problems(resources) == []
    mlflow = next(r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "mlflow")
    env = {e["name"]: e for e in mlflow["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "mlflow.$(POD_NAMESPACE).svc.cluster.local:5000" in env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")
    # the check sees a reordering
    c = mlflow["spec"]["template"]["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != "POD_NAMESPACE"] + [env["POD_NAMESPACE"]]
    assert _env_order_problems([mlflow]), "a reference before its definition passed"


# ----------------------------------------------------------------------------------- quota and limits

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
KUBERAY_AUTOSCALER_DEFAULT = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"cpu": "500m", "memory": "512Mi"},
}


def _pod_amounts(spec: dict, kind: str) -> dict[str, float]:
    """What one pod counts against a quota: the larger of its containers' sum and its largest init container."""
    total: dict[str, float] = {}
    for c in spec.get("containers", []):
        for k, v in c.get("resources", {}).get(kind, {}).items():
            total[k] = total.get(k, 0.0) + dc.quantity(v)
    for c in spec.get("initContainers", []):
        for k, v in c.get("resources", {}).get(kind, {}).items():
            total[k] = max(total.get(k, 0.0), dc.quantity(v))
    return total


def sweep_at_max(resources: list[dict]) -> dict[str, float]:
    """requests.* and limits.memory of everything but the (suspended) interactive RayCluster, with the
    RayJob's worker groups at maxReplicas and KubeRay's autoscaler sidecar on the head; `pods` too."""
    total: dict[str, float] = {}

    def add(spec: dict, times: int = 1, extra: dict | None = None) -> None:
        for kind, prefix in (("requests", "requests."), ("limits", "limits.")):
            amounts = _pod_amounts(spec, kind)
            for k, v in ((extra or {}).get(kind) or {}).items():
                amounts[k] = amounts.get(k, 0.0) + dc.quantity(v)
            for k, v in amounts.items():
                total[prefix + k] = total.get(prefix + k, 0.0) + v * times
        total["pods"] = total.get("pods", 0) + times

    for r in resources:
        if r["kind"] == "RayCluster":
            continue
        if r["kind"] == "RayJob":
            cluster = r["spec"]["rayClusterSpec"]
            autoscaler = (cluster.get("autoscalerOptions") or {}).get("resources") or KUBERAY_AUTOSCALER_DEFAULT
            add(
                cluster["headGroupSpec"]["template"]["spec"],
                1,
                autoscaler if cluster.get("enableInTreeAutoscaling") else None,
            )
            for g in cluster["workerGroupSpecs"]:
                add(g["template"]["spec"], int(g.get("maxReplicas", g.get("replicas", 1))))
            add(r["spec"]["submitterPodTemplate"]["spec"])
            continue
        for _, spec in dr.pod_specs(r):
            replicas = int(r["spec"].get("replicas", 1)) if r["kind"] in ("Deployment", "StatefulSet") else 1
            add(spec, replicas)
    return total


def _claims(resources: list[dict]) -> list[tuple[str, float]]:
    out = []
    for r in resources:
        if r["kind"] == "PersistentVolumeClaim":
            out.append((r["metadata"]["name"], dc.quantity(r["spec"]["resources"]["requests"]["storage"])))
        if r["kind"] == "StatefulSet":
            for t in r["spec"].get("volumeClaimTemplates", []):
                out.append(
                    (
                        f"{r['metadata']['name']}/{t['metadata']['name']}",
                        dc.quantity(t["spec"]["resources"]["requests"]["storage"]),
                    )
                )
    return out


def quota_problems(service: list[dict], persistent: list[dict]) -> list[str]:
    quota = next(r for r in persistent if r["kind"] == "ResourceQuota")["spec"]["hard"]
    limits = next(r for r in persistent if r["kind"] == "LimitRange")["spec"]["limits"]
    need = sweep_at_max(service)
    claims = _claims(service + persistent)
    need["persistentvolumeclaims"] = len(claims)
    need["requests.storage"] = sum(size for _, size in claims)
    problems = [f"{k}: needs {need.get(k, 0)}, quota {v}" for k, v in quota.items() if need.get(k, 0) > dc.quantity(v)]
    container_max = next(item["max"] for item in limits if item["type"] == "Container")
    for r in service:
        for where, spec in dr.pod_specs(r):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                for kind in ("requests", "limits"):
                    for k, v in c.get("resources", {}).get(kind, {}).items():
                        if k in container_max and dc.quantity(v) > dc.quantity(container_max[k]):
                            problems.append(
                                f"{where}/{c['name']}: {kind}.{k} {v} above the LimitRange's {container_max[k]}"
                            )
    claim_max = dc.quantity(next(item["max"]["storage"] for item in limits if item["type"] == "PersistentVolumeClaim"))
    problems += [
        f"claim {name}: {size} above the LimitRange's {claim_max}" for name, size in claims if size > claim_max
    ]
    # every resource the quota counts has a LimitRange default (or a pod without it would be refused)
    defaults = next(item for item in limits if item["type"] == "Container")
    for k in quota:
        if k.startswith("limits."):
            assert k.removeprefix("limits.") in defaults.get("default", {}), k
        if k.startswith("requests.") and k not in ("requests.storage", "requests.nvidia.com/gpu"):
            assert k.removeprefix("requests.") in defaults.get("defaultRequest", {}), k
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_quota_holds_the_sweep_at_its_largest_and_limits_hold_every_container(overlay):
    service, persistent = dr.render(overlay), dr.render(dr.persistent_dir(overlay))
    kinds = {r["kind"] for r in persistent}
    assert {"ResourceQuota", "LimitRange"} <= kinds
    assert "ResourceQuota" not in {r["kind"] for r in service}, "the quota belongs to the persistent layer"
    assert quota_problems(service, persistent) == []
    need = sweep_at_max(service)
    workers = sum(
        g["maxReplicas"]
        for r in service
        if r["kind"] == "RayJob"
        for g in r["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    )
    assert need["requests.nvidia.com/gpu"] == workers  # one GPU per worker: the quota's GPU line is the sweep's size
    assert dr.namespace_of(persistent) == dr.namespace_of(service)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=IDS)
def test_quota_check_sees_a_sweep_grown_beyond_it(overlay):
    service, persistent = dr.render(overlay), dr.render(dr.persistent_dir(overlay))
    job = next(r for r in service if r["kind"] == "RayJob")
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] += 1
    assert any("requests.nvidia.com/gpu" in p for p in quota_problems(service, persistent))
    service = dr.render(overlay)
    job = next(r for r in service if r["kind"] == "RayJob")
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "memory"
    ] = "100Gi"
    assert any("LimitRange" in p for p in quota_problems(service, persistent))


# ----------------------------------------------------------------------------------------------- Kueue


def test_kueue_example_queues_the_rayjob_at_a_fixed_size():
    resources = dr.render(EXAMPLES / "gpu-cluster-kueue")
    job = next(r for r in resources if r["kind"] == "RayJob")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "sweeps"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    # what Kueue requires of a RayJob, and what makes its admission reserve every GPU the sweep uses
    assert spec["shutdownAfterJobFinishes"] is True and "clusterSelector" not in spec
    assert cluster["enableInTreeAutoscaling"] is False  # (autoscalerOptions stay; KubeRay ignores them then)
    for g in cluster["workerGroupSpecs"]:
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == 8
    # the interactive cluster is not queued; everything else is the gpu-cluster overlay unchanged
    ray_cluster = next(r for r in resources if r["kind"] == "RayCluster")
    assert "kueue.x-k8s.io/queue-name" not in ray_cluster["metadata"].get("labels", {})
    problems = {k: v for k, v in dc.run_checks(resources).items() if v}
    assert problems == {}, problems
    base = {dr.resource_id(r) for r in dr.render(dr.DEPLOY / "overlays" / "gpu-cluster")}
    assert {dr.resource_id(r) for r in resources} == base


# --------------------------------------------------------------------------- the platform-owned part


def test_cluster_scoped_objects_live_in_the_platform_part_only():
    """PriorityClasses (and the KubeRay CRDs, with the operator's chart) belong to the platform: deploy/cluster holds
    every PriorityClass a pod names, and no overlay or example carries a cluster-scoped object."""
    platform = dr.render(dr.DEPLOY / "cluster")
    assert {r["kind"] for r in platform} == {"PriorityClass"}
    classes = {r["metadata"]["name"] for r in platform}
    for target in TENANT_TARGETS:
        resources = dr.render(target)
        assert [r["kind"] for r in resources if r["kind"] in dr.CLUSTER_SCOPED] == [], target.name
        named = {spec.get("priorityClassName") for r in resources for _, spec in dr.pod_specs(r)}
        assert named <= classes, (target.name, named - classes)


def test_production_admits_the_shared_operator_to_the_dashboard_only():
    """gpu-cluster: the cluster-wide KubeRay operator (kuberay-system) reaches the Ray head's dashboard (8265) and
    nothing else; other namespaces reach no Ray port."""
    resources = dr.render(dr.DEPLOY / "overlays" / "gpu-cluster")
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    operator = ("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})
    head = {"calib-sweeps/ray-node": "true", "app.kubernetes.io/component": "ray-head"}
    worker = {"calib-sweeps/ray-node": "true", "app.kubernetes.io/component": "ray-worker"}
    assert dc.policy_allows(policies, "calib-sweeps", operator, head, 8265)
    assert not dc.policy_allows(policies, "calib-sweeps", operator, head, 6379)
    assert not dc.policy_allows(policies, "calib-sweeps", operator, worker, 8265)
    assert not dc.policy_allows(policies, "calib-sweeps", ("team-b", operator[1]), head, 8265)
    assert not dc.policy_allows(policies, "calib-sweeps", ("kuberay-system", {"app": "other"}), head, 8265)


def test_operator_values_refuse_a_placeholder_digest_and_a_per_namespace_install(tmp_path, capsys):
    from deploy import release

    committed = yaml.safe_load(release.OPERATOR_VALUES.read_text())
    assert committed["singleNamespaceInstall"] is False
    assert committed["image"]["tag"].startswith(release.OPERATOR_VERSION + "@sha256:")
    assert any("placeholder digest" in p for p in release.operator_problems(committed))
    assert release.main(["operator-values"]) == 1  # the committed file: placeholder
    assert "placeholder digest" in capsys.readouterr().err
    real = {**committed, "image": {**committed["image"], "tag": release.OPERATOR_VERSION + "@sha256:" + "ab" * 32}}
    assert release.operator_problems(real) == []
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(real))
    assert release.main(["operator-values", "--values", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == real
    assert release.operator_problems({**real, "image": {**real["image"], "tag": "v1.7.0"}})  # a tag alone
    assert release.operator_problems({**real, "image": {**real["image"], "tag": "v1.6.0@sha256:" + "ab" * 32}})
    assert release.operator_problems({**real, "singleNamespaceInstall": True})

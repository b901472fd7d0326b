"""Portable networking (issue #46 item 5): the MLflow UI through the Gateway API (an HTTPRoute and a
BackendTLSPolicy, validated against Gateway API v1.4.1's own CRDs) with ingress-nginx an example component only;
PodDisruptionBudgets that never block a drain of a single-replica pod; the autoscaler version pinned (v2) and
translated as KubeRay v1.7 does; the Ray head's way to the Kubernetes API judged per CNI (Cilium ignores ipBlock
for the in-cluster API server) by deploy/release.py's one-line preflight."""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib

import jsonschema
import pytest
import yaml

from deploy import release
from tests import deploy_checks as dc
from tests import deploy_render as dr
from tests.containers import kuberay
from tests.unit.deploy.test_deploy_k8s import _strict

DEPLOY = dr.DEPLOY
GPU = DEPLOY / "overlays" / "gpu-cluster"
NGINX_EXAMPLE = DEPLOY / "examples" / "gpu-cluster-ingress-nginx"
CILIUM_EXAMPLE = DEPLOY / "examples" / "gpu-cluster-cilium"
EXAMPLES = sorted(p for p in (DEPLOY / "examples").iterdir() if (p / "kustomization.yaml").is_file())
TARGETS = [*dr.overlay_dirs(), *EXAMPLES]
IDS = [f"{p.parent.name}/{p.name}" for p in TARGETS]

GATEWAY_API = DEPLOY / "schemas" / "gateway-api-v1.4.1"
GATEWAY_CRDS = {  # kind -> (file, sha256 of the uncompressed release file)
    "HTTPRoute": (
        "gateway.networking.k8s.io_httproutes.yaml",
        "98c6777c22309d319292e9c288ee632006c9ffdd4272383d6f9dffa3fbccaf14",
    ),
    "BackendTLSPolicy": (
        "gateway.networking.k8s.io_backendtlspolicies.yaml",
        "f94f34b0c19cab6c25b53a6e672d9a684116a4e52193531fe2abcea20b51574f",
    ),
}


def _by(resources: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]


# --------------------------------------------------------------------------------------- Gateway API


@functools.cache
def _gateway_crd_text(kind: str) -> str:
    return gzip.decompress((GATEWAY_API / (GATEWAY_CRDS[kind][0] + ".gz")).read_bytes()).decode()


@functools.cache
def gateway_validator(kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(_gateway_crd_text(kind))
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    assert version["served"] and version["storage"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def gateway_errors(obj: dict) -> list[str]:
    assert obj["apiVersion"] == "gateway.networking.k8s.io/v1", obj["apiVersion"]
    errors = sorted(gateway_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def test_vendored_gateway_api_crds_are_the_release_files():
    for kind, (_, digest) in GATEWAY_CRDS.items():
        assert hashlib.sha256(_gateway_crd_text(kind).encode()).hexdigest() == digest, kind
    assert (GATEWAY_API / "LICENSE").read_text().lstrip().startswith("Apache License")


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_gateway_objects_validate_against_gateway_api_v1_4_1(target):
    found = [r for r in dr.render(target) if r["apiVersion"].startswith("gateway.networking.k8s.io/")]
    for r in found:
        assert gateway_errors(r) == [], f"{r['kind']}/{r['metadata']['name']}"
    if target in (GPU, CILIUM_EXAMPLE):
        assert {r["kind"] for r in found} == {"HTTPRoute", "BackendTLSPolicy"}


@pytest.mark.parametrize(
    "kind,path,value",
    [
        ("HTTPRoute", ["spec", "rules", 0, "backendRefs", 0], {"name": "mlflow", "prot": 5000}),
        ("HTTPRoute", ["spec", "rules", 0, "matches", 0, "path", "type"], "Prefix"),  # Ingress's word, not Gateway's
        ("BackendTLSPolicy", ["spec", "validation", "hostName"], "mlflow"),
        ("BackendTLSPolicy", ["spec", "validation", "caCertificateRefs"], [{"group": "", "kind": "ConfigMap"}]),
    ],
    ids=["misspelled-port", "ingress-path-type", "misspelled-hostname", "ca-without-name"],
)
def test_gateway_schema_refuses_planted_mistakes(kind, path, value):
    obj = copy.deepcopy(_by(dr.render(GPU), kind, "mlflow")[0])
    node = obj
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    assert gateway_errors(obj)


def test_httproute_is_the_default_way_in_and_reaches_mlflow_over_tls():
    resources = dr.render(GPU)
    assert not _by(resources, "Ingress"), "gpu-cluster's way in is the HTTPRoute; ingress-nginx is an example"
    assert not any(
        k.startswith("nginx.ingress.kubernetes.io/") for r in resources for k in r["metadata"].get("annotations", {})
    )
    route, tls = _by(resources, "HTTPRoute", "mlflow")[0], _by(resources, "BackendTLSPolicy", "mlflow")[0]
    service = _by(resources, "Service", "mlflow")[0]
    tenant = dc.config_map(resources, "calib-tenant")
    assert route["spec"]["hostnames"] == [tenant["UI_HOST"]]
    assert [p["kind"] for p in route["spec"]["parentRefs"]] == ["Gateway"]
    (backend,) = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backend["kind"] == "Service" and backend["name"] == "mlflow"
    assert backend["port"] in [p["port"] for p in service["spec"]["ports"]]
    # the Gateway speaks HTTPS to MLflow and checks its certificate for a name it carries
    assert tls["spec"]["targetRefs"] == [{"group": "", "kind": "Service", "name": "mlflow"}]
    assert tls["spec"]["validation"]["hostname"] == "mlflow"
    assert [c["kind"] for c in tls["spec"]["validation"]["caCertificateRefs"]] == ["ConfigMap"]
    # MLflow accepts the UI host and admits the Gateway's namespace, not ingress-nginx's
    policies = _by(resources, "NetworkPolicy")
    ns = dr.namespace_of(resources)
    mlflow = dc.template_labels(_by(resources, "Deployment", "mlflow")[0])
    assert dc.policy_allows(policies, ns, ("gateway-system", {"app": "envoy"}), mlflow, 5000)
    assert not dc.policy_allows(
        policies, ns, ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}), mlflow, 5000
    )
    assert not dc.policy_allows(policies, ns, ("gateway-system", {"app": "envoy"}), mlflow, 8080)
    hosts = dc.container_env(
        resources, _by(resources, "Deployment", "mlflow")[0]["spec"]["template"]["spec"]["containers"][0]
    )
    assert tenant["UI_HOST"] in (hosts.get("MLFLOW_SERVER_ALLOWED_HOSTS") or "").split(",")


def test_ingress_nginx_is_an_example_component_only():
    resources = dr.render(NGINX_EXAMPLE)
    assert not _by(resources, "HTTPRoute") and not _by(resources, "BackendTLSPolicy")
    (ing,) = _by(resources, "Ingress", "mlflow")
    ns = dr.namespace_of(resources)
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-ssl-secret"] == f"{ns}/mlflow-tls"
    policies = _by(resources, "NetworkPolicy")
    mlflow = dc.template_labels(_by(resources, "Deployment", "mlflow")[0])
    assert dc.policy_allows(policies, ns, ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}), mlflow, 5000)
    assert not dc.policy_allows(policies, ns, ("gateway-system", {"app": "envoy"}), mlflow, 5000)
    assert dc.run_checks(resources) == {}
    # no overlay carries the Ingress by itself
    for overlay in dr.overlay_dirs():
        assert not _by(dr.render(overlay), "Ingress"), overlay.name


# ------------------------------------------------------------------------------ disruption budgets


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_no_disruption_budget_blocks_a_drain(target):
    resources = dr.render(target)
    assert dc.check_pdbs_drainable(resources) == []
    for pdb in _by(resources, "PodDisruptionBudget"):
        assert "minAvailable" not in pdb["spec"] and pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize(
    "rule,replicas,blocks",
    [
        ({"minAvailable": 1}, 1, True),  # the budgets
        ({"minAvailable": "100%"}, 3, True),
        ({"minAvailable": "50%"}, 1, True),  # rounds up to 1 of 1
        ({"maxUnavailable": 0}, 1, True),
        ({"maxUnavailable": "0%"}, 2, True),
        ({"maxUnavailable": 1}, 1, False),
        ({"minAvailable": 1}, 2, False),
        ({"maxUnavailable": "10%"}, 1, False),  # rounds up to 1
    ],
)
def test_the_drain_check_fails_on_a_blocking_budget(rule, replicas, blocks):
    resources = copy.deepcopy(dr.render(dr.DEPLOY / "overlays" / "dev"))
    for name in ("mlflow", "postgres"):
        pdb = _by(resources, "PodDisruptionBudget", name)[0]
        pdb["spec"] = {k: v for k, v in pdb["spec"].items() if k not in ("minAvailable", "maxUnavailable")} | rule
    _by(resources, "StatefulSet", "postgres")[0]["spec"]["replicas"] = replicas
    problems = dc.check_pdbs_drainable(resources)
    assert bool([p for p in problems if "StatefulSet/postgres" in p]) == blocks, problems
    assert any("Deployment/mlflow" in p for p in problems) == (blocks or replicas == 2 and "minAvailable" in rule)


# -------------------------------------------------------------------------------- autoscaler version


def _ray_specs(resources):
    return [(dc._where(r), dr.ray_cluster_spec(r)) for r in dc.ray_objects(resources)]


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_autoscaler_version_is_pinned_to_v2(target):
    for where, spec in _ray_specs(dr.render(target)):
        if spec.get("enableInTreeAutoscaling"):
            assert spec["autoscalerOptions"]["version"] == "v2", where


def test_kuberay_translation_of_the_pinned_version():
    """KubeRay v1.7 (pod.go DefaultHeadPodTemplate/DefaultWorkerPodTemplate): version v2 puts
    RAY_enable_autoscaler_v2=true on the head's Ray container and restartPolicy Never on head and workers."""
    job = _by(dr.render(dr.DEPLOY / "overlays" / "dev"), "RayJob")[0]
    head = kuberay.build_pod(job, "head", "calib-sweep-abcde")
    worker = kuberay.build_pod(job, "worker", "calib-sweep-abcde")
    env = {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}
    assert env["RAY_enable_autoscaler_v2"] == "true"
    assert head["spec"]["restartPolicy"] == "Never" and worker["spec"]["restartPolicy"] == "Never"
    v1 = copy.deepcopy(job)
    v1["spec"]["rayClusterSpec"]["autoscalerOptions"]["version"] = "v1"
    head = kuberay.build_pod(v1, "head", "calib-sweep-abcde")
    env = {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}
    assert env["RAY_enable_autoscaler_v2"] == "false" and "restartPolicy" not in head["spec"]


def test_the_readme_names_the_pinned_version():
    text = (DEPLOY / "README.md").read_text()
    assert "`autoscalerOptions.version: v2`" in text
    assert "Ray 2.60's default is v1" not in text


# ------------------------------------------------------------------------ the autoscaler to the API


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_the_autoscaler_reaches_the_api_server(target):
    resources = dr.render(target)
    assert release.api_server_route_problem(resources) is None
    assert dc.check_autoscaler_reaches_api(resources) == []


def test_under_cilium_the_ip_block_is_not_a_way_and_the_component_is():
    problem = release.api_server_route_problem(dr.render(GPU), cni="cilium")
    assert problem and "\n" not in problem and "components/cilium-api-egress" in problem, problem
    assert "kube-apiserver" in problem
    assert release.api_server_route_problem(dr.render(CILIUM_EXAMPLE), cni="cilium") is None
    # the component alone opens 443/6443 to the API for the heads, nothing else
    (cnp,) = [
        r for r in dr.render(CILIUM_EXAMPLE) if r["kind"] == "CiliumNetworkPolicy" and "head" in r["metadata"]["name"]
    ]
    (rule,) = cnp["spec"]["egress"]
    assert rule["toEntities"] == ["kube-apiserver"]
    assert sorted(p["port"] for tp in rule["toPorts"] for p in tp["ports"]) == ["443", "6443"]


def test_a_policy_without_the_api_rule_is_refused_in_one_line():
    api_server = ["192.0.2.65"]  # in the overlay's (placeholder) range for the API server
    assert release.api_server_route_problem(dr.render(GPU), api_addresses=api_server) is None
    resources = [r for r in dr.render(GPU) if r["metadata"]["name"] != "egress-head-kubernetes-api"]
    problem = release.api_server_route_problem(resources, api_addresses=api_server)
    assert problem and "\n" not in problem and "cannot reach the Kubernetes API" in problem
    assert problem.startswith(("RayJob/calib-sweep", "RayCluster/calib-interactive"))
    # without the addresses, the object store's 443 still counts as a way (the check cannot tell them apart)...
    assert release.api_server_route_problem(resources) is None
    # ...but no rule to any address range on 443/6443 is refused, by the deploy check too
    bare = [r for r in resources if r["metadata"]["name"] != "egress-s3-clients-https"]
    assert dc.check_autoscaler_reaches_api(bare) == [release.api_server_route_problem(bare)] != [None]
    # a rule on another port is no way either
    resources = copy.deepcopy(dr.render(GPU))
    api = next(r for r in resources if r["metadata"]["name"] == "egress-head-kubernetes-api")
    for rule in api["spec"]["egress"]:
        rule["ports"] = [{"protocol": "TCP", "port": 8443}]
    assert release.api_server_route_problem(resources, api_addresses=api_server)
    # nor is an API server outside the range the overlay names
    assert release.api_server_route_problem(dr.render(GPU), api_addresses=["10.0.0.1"])


def test_release_check_refuses_cilium_without_the_component(capsys):
    assert release.main(["check", str(GPU), "--cni", "cilium"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any("components/cilium-api-egress" in line for line in err), err
    assert release.main(["check", str(CILIUM_EXAMPLE), "--cni", "cilium"]) == 0
    assert release.main(["check", str(GPU)]) == 0
    assert release.main(["check", str(GPU), "--api-server", "10.0.0.1"]) == 1
    assert "10.0.0.1" in capsys.readouterr().err

"""The NetworkPolicy evaluator of the emulation (tests/containers/netpol.py) against hand-made cases: Kubernetes'
semantics on small policies, and the dev overlay's policies on the pairs the service depends on (fast; the same
cases run enforced on a podman bridge in tests/containers/test_containers_netpol.py)."""

from __future__ import annotations

import pytest

from tests import deploy_checks as dc
from tests import deploy_render as dr
from tests.containers import netpol

NS = "calib-sweeps"
RAY_WORKER_PORT = 10002  # in the Ray workers' port range (deploy/base/ray): object manager, worker processes


def endpoints() -> tuple[list[dict], list[netpol.Endpoint]]:
    resources = dr.render(dr.DEPLOY / "overlays" / "dev")
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    eps = []
    for where, labels, spec in dc.pod_templates(resources):
        if where.startswith("RayCluster/"):
            continue  # the interactive cluster's pods carry the RayJob's labels
        ports = {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
        if labels.get("calib-sweeps/ray-node") == "true":
            ports.add(RAY_WORKER_PORT)
        name = where.split("/", 1)[1].replace("/", "-").replace(":", "-")
        eps.append(netpol.Endpoint(name, NS, dict(labels), ports=tuple(sorted(ports))))
    eps += [
        netpol.Endpoint("kuberay-operator", NS, {"app.kubernetes.io/name": "kuberay-operator"}),
        netpol.Endpoint("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, ports=(53,)),
        netpol.Endpoint("ingress-controller", "gateway-system", {"app": "gateway-proxy"}),  # the Gateway's proxies
        netpol.Endpoint("kube-apiserver", None, address="10.0.0.1", ports=(6443,)),
        netpol.Endpoint("public-s3", None, address="203.0.113.10", ports=(443,)),  # TEST-NET-3: a public address
        netpol.Endpoint("private-host", None, address="192.168.7.7", ports=(443, 5432)),
    ]
    for p in policies:
        p["metadata"].setdefault("namespace", NS)
    return policies, eps


# (source, destination, port, connects?): what the service needs, and what must stay closed
BY_HAND = [
    ("calib-sweep-head", "mlflow", 5000, True),  # the driver logs to MLflow
    ("calib-sweep-worker-gpu", "mlflow", 5000, True),
    ("calib-sweep-head", "postgres", 5432, True),  # the Optuna study
    ("calib-sweep-worker-gpu", "postgres", 5432, False),  # trials never touch the study database
    ("mlflow", "postgres", 5432, True),
    ("mlflow", "minio", 9000, True),  # artifacts
    ("mlflow", "minio", 9001, False),  # MinIO's console
    ("minio-buckets", "minio", 9000, True),
    ("optuna-db", "postgres", 5432, True),
    ("calib-sweep-worker-gpu", "calib-sweep-head", 6379, True),  # GCS
    ("calib-sweep-head", "calib-sweep-worker-gpu", RAY_WORKER_PORT, True),
    ("calib-sweep-submitter", "calib-sweep-head", 8265, True),  # the job API
    ("calib-sweep-submitter", "calib-sweep-head", 6379, False),
    ("kuberay-operator", "calib-sweep-head", 8265, True),
    ("kuberay-operator", "mlflow", 5000, False),
    ("ingress-controller", "mlflow", 5000, True),  # the UI
    ("ingress-controller", "calib-sweep-head", 8265, False),
    ("postgres", "mlflow", 5000, False),  # the stores open nothing
    ("mlflow", "calib-sweep-head", 8265, False),
    ("calib-sweep-head", "kube-apiserver", 6443, True),  # the autoscaler
    ("calib-sweep-worker-gpu", "kube-apiserver", 6443, False),
    # dev's object store is MinIO in the cluster: the trials reach no public address
    ("calib-sweep-worker-gpu", "public-s3", 443, False),
    ("calib-sweep-worker-gpu", "private-host", 443, False),  # ... but no private address
    # the head's rule for the Kubernetes API (usually a private address) admits any address on 443 and 6443:
    # deploy/base/networkpolicy-egress.yaml says to narrow it to the API server's address
    ("calib-sweep-head", "private-host", 443, True),
    ("calib-sweep-head", "private-host", 5432, False),
    ("postgres", "public-s3", 443, False),
    ("mlflow", "kube-dns", 53, True),  # every pod resolves names
    ("calib-sweep-submitter", "kube-dns", 53, True),
]


@pytest.mark.parametrize(("src", "dst", "port", "ok"), BY_HAND)
def test_the_dev_overlay_allows_what_the_service_needs_and_nothing_else_by_hand(src, dst, port, ok):
    policies, eps = endpoints()
    by_name = {e.name: e for e in eps}
    assert netpol.allows(policies, by_name[src], by_name[dst], port) == ok


def _pol(spec, ns=NS):
    return {"metadata": {"name": "p", "namespace": ns}, "spec": spec}


def test_kubernetes_semantics_on_small_policies():
    a = netpol.Endpoint("a", NS, {"app": "a", "tier": "x"})
    b = netpol.Endpoint("b", NS, {"app": "b"})
    other = netpol.Endpoint("o", "other", {"app": "a"})
    web = netpol.Endpoint("w", None, address="8.8.8.8")
    lan = netpol.Endpoint("l", None, address="10.1.2.3")
    assert netpol.allows([], a, b, 80)  # no policy: all open
    deny_in = _pol({"podSelector": {}, "policyTypes": ["Ingress"]})
    assert not netpol.allows([deny_in], a, b, 80) and netpol.allows([deny_in], a, web, 80)
    ranged = _pol(
        {
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["b"]}]},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"tier": "x"}}}], "ports": [{"port": 8000, "endPort": 8010}]}
            ],
        }
    )
    assert netpol.allows([ranged], a, b, 8005) and not netpol.allows([ranged], a, b, 8011)
    assert not netpol.allows([ranged], other, b, 8005)  # a podSelector alone means the policy's namespace
    cross = _pol({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]})
    assert netpol.allows([cross], other, b, 1)
    egress = _pol(
        {
            "podSelector": {"matchLabels": {"app": "a"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}], "ports": [{"port": 443}]}
            ],
        }
    )
    assert netpol.allows([egress], a, web, 443) and not netpol.allows([egress], a, web, 80)
    assert not netpol.allows([egress], a, lan, 443) and not netpol.allows([egress], a, b, 443)
    udp_only = _pol({"podSelector": {}, "ingress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]})
    assert not netpol.allows([udp_only], a, b, 53)  # TCP is not admitted by a UDP rule
    assert netpol.allowed_ports([deny_in, cross], other, b) == netpol.ALL  # policies add up

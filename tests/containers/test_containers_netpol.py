"""NetworkPolicy enforcement, emulated (`make test-containers`; issue #25 item 7): one container per pod of the
rendered dev overlay (with its labels; listening on its declared ports, Ray nodes on a worker port too) plus the
peers the policies name (kube-dns, the ingress controller, the KubeRay operator, the Kubernetes API, a public
and a private address outside the cluster) on one podman bridge; the overlay's policies become nftables rules
on that bridge (tests/containers/netpol.py) and every endpoint tries every other's ports. What connects must
be what the policies allow, and the pairs the service depends on are checked by hand below."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.containers import images, netpol
from tests.containers.fixtures import built_images  # noqa: F401
from tests.containers.harness import podman
from tests.unit.deploy.test_netpol_semantics import BY_HAND, endpoints

pytestmark = pytest.mark.container

SERVER = r"""
import socket, sys, threading, time
for port in map(int, sys.argv[1:]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    threading.Thread(target=lambda s=s: [c.close() for c, _ in iter(s.accept, None)], daemon=True).start()
print("listening", flush=True)
time.sleep(3600)
"""
PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def knock(target):
    name, ip, port = target
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((ip, port)); return name, port, "open"
    except socket.timeout:
        return name, port, "blocked"
    except OSError as e:
        return name, port, type(e).__name__
    finally:
        s.close()
with ThreadPoolExecutor(64) as pool:
    print(json.dumps(list(pool.map(knock, json.loads(sys.argv[1])))))
"""


def test_network_policies_enforced_on_a_bridge_allow_exactly_what_they_say(built_images, tmp_path):
    policies, eps = endpoints()
    by_name = {e.name: e for e in eps}
    tag = uuid.uuid4().hex[:8]
    network, table = f"calib-test-netpol-{tag}", f"calib_netpol_{tag}"
    image = images.python_base()
    podman("network", "create", network)
    names = []
    try:
        for e in eps:
            name = f"netpol-{e.name}-{tag}"
            args = ["run", "-d", "--name", name, "--network", network, "--entrypoint", "python", image]
            podman(*args, "-c", SERVER, *map(str, e.ports))
            names.append(name)
            networks = json.loads(podman("inspect", "-f", "{{json .NetworkSettings.Networks}}", name).stdout)
            e.ip = networks[network]["IPAddress"]
        for name in names:  # every server is up before any probe
            for _ in range(100):
                if "listening" in podman("logs", name, check=False).stdout:
                    break
                time.sleep(0.2)
        rules = netpol.ruleset(table, policies, eps)
        (tmp_path / "rules.nft").write_text(rules)
        netpol.apply(rules)
        observed, expected = {}, {}
        for e, name in zip(eps, names):
            targets = [(d.name, d.ip, p) for d in eps if d is not e for p in d.ports]
            out = podman("exec", name, "python", "-c", PROBE, json.dumps(targets), timeout=120).stdout
            for dst, port, verdict in json.loads(out):
                observed[(e.name, dst, port)] = verdict
                expected[(e.name, dst, port)] = "open" if netpol.allows(policies, e, by_name[dst], port) else "blocked"
        (tmp_path / "matrix.json").write_text(json.dumps([[*k, v] for k, v in sorted(observed.items())], indent=0))
        wrong = {k: (observed[k], expected[k]) for k in expected if observed[k] != expected[k]}
        assert not wrong, wrong
        opened = sum(v == "open" for v in observed.values())
        assert 0 < opened < len(observed), (opened, len(observed))  # both kinds of pair were probed
        for src, dst, port, ok in BY_HAND:
            assert (observed[(src, dst, port)] == "open") == ok, (src, dst, port, observed[(src, dst, port)])
    finally:
        netpol.remove(table)
        for name in names:
            podman("rm", "-f", "-t", "0", name, check=False)
        podman("network", "rm", "-f", network, check=False)

"""NetworkPolicy enforcement emulated on a podman bridge with nftables (tests/containers/test_containers_netpol.py).

Kubernetes semantics (networking.k8s.io/v1), evaluated per endpoint pair: a pod selected by a policy with
`Egress` (`Ingress`) in its types is isolated in that direction, and a connection is allowed when some rule of
some selecting policy admits the peer and the port; a connection needs both the source's egress and the
destination's ingress. Peers: `podSelector` (the policy's namespace), `namespaceSelector` (+ `podSelector`),
`ipBlock` (with `except`; it matches endpoints outside the cluster only, as CNI plugins treat pod IPs).
Ports: number, `endPort`, protocol (TCP by default); an empty list is every port.

The verdicts become rules of an nftables `bridge` table on the podman bridge's forward hook: only the first
packet of a TCP connection (SYN without ACK) is judged, so replies pass; between the endpoints, a SYN no
rule accepts is dropped (the client times out, as behind a real policy). Endpoints' addresses for `ipBlock`
are declared (an "internet" endpoint can stand for a public address while its container sits on the
bridge's private subnet).
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass, field
from typing import Any

ALL = ((1, 65535),)
NS_LABEL = "kubernetes.io/metadata.name"


@dataclass
class Endpoint:
    """A pod (namespace set) or an address outside the cluster (namespace None) on the test bridge."""

    name: str
    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    address: str = ""  # what ipBlock sees (outside endpoints); pods match by selectors
    ports: tuple[int, ...] = ()  # TCP ports it listens on
    ip: str = ""  # its container's address on the bridge


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against `labels`; {} selects everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_ns: str, ep: Endpoint) -> bool:
    if "ipBlock" in peer:
        if ep.namespace is not None:
            return False
        addr = ipaddress.ip_address(ep.address)
        block = peer["ipBlock"]
        if addr not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(addr in ipaddress.ip_network(c) for c in block.get("except", []))
    if ep.namespace is None:
        return False
    ns_sel = peer.get("namespaceSelector")
    ns_ok = ep.namespace == policy_ns if ns_sel is None else selects(ns_sel, {NS_LABEL: ep.namespace})
    return ns_ok and ("podSelector" not in peer or selects(peer["podSelector"], ep.labels))


def _rule_ports(rule: dict[str, Any], protocol: str = "TCP") -> tuple[tuple[int, int], ...]:
    ranges = []
    for p in rule.get("ports") or []:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return ALL
        if not isinstance(p["port"], int):
            raise NotImplementedError(f"named port {p['port']!r}")
        ranges.append((p["port"], p.get("endPort", p["port"])))
    return ALL if not rule.get("ports") else tuple(ranges)


def _types(spec: dict[str, Any]) -> list[str]:
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if "egress" in spec else [])]


def _side(
    policies: list[dict], me: Endpoint, peer: Endpoint, direction: str, protocol: str = "TCP"
) -> tuple[tuple[int, int], ...]:
    """`protocol` port ranges `me` may use with `peer` in `direction` (Egress: me -> peer; Ingress: peer -> me)."""
    if me.namespace is None:
        return ALL  # outside the cluster: no policy of ours applies
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace") == me.namespace
        and direction in _types(p["spec"])
        and selects(p["spec"].get("podSelector"), me.labels)
    ]
    if not selecting:
        return ALL  # not isolated in this direction
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    ranges: list[tuple[int, int]] = []
    for p in selecting:
        for rule in p["spec"].get(key, []):
            peers = rule.get(peers_key)
            if not peers or any(_peer_matches(x, me.namespace, peer) for x in peers):
                ranges.extend(_rule_ports(rule, protocol))
    return _merge(ranges)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _intersect(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out = [(max(lo1, lo2), min(hi1, hi2)) for lo1, hi1 in a for lo2, hi2 in b if max(lo1, lo2) <= min(hi1, hi2)]
    return _merge(out)


def allowed_ports(policies: list[dict], src: Endpoint, dst: Endpoint) -> tuple[tuple[int, int], ...]:
    """The TCP port ranges on which `src` may open connections to `dst`."""
    return _intersect(_side(policies, src, dst, "Egress"), _side(policies, dst, src, "Ingress"))


def allows(policies: list[dict], src: Endpoint, dst: Endpoint, port: int) -> bool:
    """Whether `src` may connect to `dst` on TCP `port`."""
    return any(lo <= port <= hi for lo, hi in allowed_ports(policies, src, dst))


def egress_allows(policies: list[dict], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Whether `src`'s egress policies let it reach `dst` on `port` (`dst`'s ingress not considered)."""
    return any(lo <= port <= hi for lo, hi in _side(policies, src, dst, "Egress", protocol))


def ingress_allows(policies: list[dict], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Whether `dst`'s ingress policies admit `src` on `port` (`src`'s egress not considered)."""
    return any(lo <= port <= hi for lo, hi in _side(policies, dst, src, "Ingress", protocol))


def ruleset(table: str, policies: list[dict], endpoints: list[Endpoint]) -> str:
    """The nftables `bridge` table enforcing `policies` between `endpoints` (their `ip` set)."""
    lines = [
        f"table bridge {table} {{",
        "  chain filt {",
        "    type filter hook forward priority 0; policy accept;",
    ]
    syn = "tcp flags & (syn | ack) == syn"
    for src in endpoints:
        for dst in endpoints:
            if src is dst:
                continue
            ranges = allowed_ports(policies, src, dst)
            if ranges:
                ports = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
                lines.append(f"    ip saddr {src.ip} ip daddr {dst.ip} tcp dport {{ {ports} }} {syn} accept")
    ips = ", ".join(e.ip for e in endpoints)
    lines.append(f"    ip saddr {{ {ips} }} ip daddr {{ {ips} }} {syn} drop")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def apply(text: str) -> None:
    """Load a ruleset (root: the test machine's own nftables)."""
    subprocess.run(["nft", "-f", "-"], input=text, text=True, check=True, capture_output=True)


def remove(table: str) -> None:
    """Delete the bridge table (nothing if it is not there)."""
    subprocess.run(["nft", "delete", "table", "bridge", table], capture_output=True)

"""A stand-in of the Kubernetes API for Ray's autoscaler (no Kubernetes here): the calls Ray's KubeRay
node provider and its autoscaling-config producer make (ray/autoscaler/_private/kuberay/), over HTTPS
with a service-account bearer token, nothing else.

    GET   /apis/ray.io/v1/namespaces/NS/rayclusters/NAME     the RayCluster (its spec is the config)
    PATCH /apis/ray.io/v1/namespaces/NS/rayclusters/NAME     JSON patch (replicas, workersToDelete,
                                                             a resourceVersion test) or merge patch
    GET   /api/v1/namespaces/NS/pods?labelSelector=k=v,...   the pods the test registered
    GET   /api/v1/namespaces/NS/pods/NAME

The test plays KubeRay's operator: it reads the replicas and workersToDelete the autoscaler patches in,
starts or removes worker pods, and registers them here (`add_pod` / `remove_pod`) with their IPs, as the
pod list Kubernetes would serve. `ServiceAccount` writes the token, CA and namespace files kubelet
mounts (the CA signed this server's certificate), so the autoscaler verifies TLS as it would in a pod.
"""

from __future__ import annotations

import copy
import datetime
import ipaddress
import json
import re
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

RAYCLUSTERS = re.compile(r"^/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/rayclusters/(?P<name>[^/]+)$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?$")


@dataclass(frozen=True)
class ServiceAccount:
    """The files kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""

    folder: Path
    token: str

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"


def _certificates(folder: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `hosts` (IPs or names) signed by it: (ca.crt, server.crt, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in kubernetes CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / "ca.crt", folder / "server.crt", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths[2].chmod(0o600)
    return paths


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")] if path != "/" else []


def _parent(doc: Any, parts: list[str], create: bool = False) -> Any:
    for p in parts[:-1]:
        if isinstance(doc, list):
            doc = doc[int(p)]
        else:
            if p not in doc and create:
                doc[p] = {}
            doc = doc[p]
    return doc


class PatchError(ValueError):
    """A JSON patch that does not apply (a failed `test`, a missing path)."""


def json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 (add, replace, remove, test) on a copy of `doc`; PatchError when an operation fails."""
    out = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        try:
            parent = _parent(out, parts, create=op["op"] == "add")
            key = parts[-1]
            if op["op"] == "test":
                cur = parent[int(key)] if isinstance(parent, list) else parent[key]
                if cur != op["value"]:
                    raise PatchError(f"test failed at {op['path']}: {cur!r} != {op['value']!r}")
            elif op["op"] in ("add", "replace"):
                if isinstance(parent, list):
                    if key == "-":
                        parent.append(op["value"])
                    elif op["op"] == "add":
                        parent.insert(int(key), op["value"])
                    else:
                        parent[int(key)] = op["value"]
                else:
                    if op["op"] == "replace" and key not in parent:
                        raise PatchError(f"replace of a missing path {op['path']}")
                    parent[key] = op["value"]
            elif op["op"] == "remove":
                del parent[int(key) if isinstance(parent, list) else key]
            else:
                raise PatchError(f"unsupported operation {op['op']!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            if isinstance(exc, PatchError):
                raise
            raise PatchError(f"{op['op']} {op['path']}: {exc!r}") from None
    return out


def merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class KubeAPI:
    """The stand-in server: one namespace, one RayCluster, the pods the test registers."""

    def __init__(self, raycluster: dict, workdir: Path, hosts: list[str], bind: str = "0.0.0.0") -> None:
        self.namespace = raycluster["metadata"]["namespace"]
        self.name = raycluster["metadata"]["name"]
        self._lock = threading.Lock()
        self._version = 1
        self._cluster = copy.deepcopy(raycluster)
        self._cluster["metadata"]["resourceVersion"] = "1"
        self._pods: dict[str, dict] = {}
        self.log: list[tuple[str, str, int]] = []  # (method, path, status) of every request
        self.patches: list[Any] = []  # the bodies of the accepted RayCluster patches, in order
        sa = workdir / "serviceaccount"
        ca, cert, key = _certificates(workdir / "pki", hosts)
        sa.mkdir(parents=True, exist_ok=True)
        (sa / "ca.crt").write_bytes(ca.read_bytes())
        (sa / "namespace").write_text(self.namespace)
        self.service_account = ServiceAccount(sa, "stand-in-sa-token-" + self.name)
        (sa / "token").write_text(self.service_account.token)
        for f in sa.iterdir():
            f.chmod(0o644)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self._server = ThreadingHTTPServer((bind, 0), self._handler())
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # ---------------------------------------------------------------------------- the operator's side
    def __enter__(self) -> KubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def raycluster(self) -> dict:
        """The RayCluster as it stands (a copy)."""
        with self._lock:
            return copy.deepcopy(self._cluster)

    def update_raycluster(self, fn: Any) -> None:
        """Change the RayCluster in place under the lock (the operator's own writes)."""
        with self._lock:
            fn(self._cluster)
            self._bump(self._cluster)

    def add_pod(self, name: str, labels: dict[str, str], ip: str, state: str = "running") -> None:
        """Register a pod as Kubernetes would list it (phase, IP, the first container's state)."""
        with self._lock:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels)},
                "status": {
                    "phase": "Running" if state == "running" else "Pending",
                    "podIP": ip,
                    "containerStatuses": [{"name": "ray", "ready": state == "running", "state": {state: {}}}],
                },
            }
            self._bump(pod)
            self._pods[name] = pod

    def remove_pod(self, name: str) -> None:
        with self._lock:
            self._pods.pop(name, None)
            self._version += 1

    def pods(self) -> list[str]:
        with self._lock:
            return sorted(self._pods)

    def _bump(self, obj: dict) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    # ------------------------------------------------------------------------------------ HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this server."""
        return type("Handler", (_Handler,), {"api": self})


class _Handler(BaseHTTPRequestHandler):
    """The stand-in's routes; `api` is the KubeAPI served (KubeAPI._handler binds it in a subclass)."""

    api: KubeAPI

    def log_message(self, *args: Any) -> None:  # the request log is api.log
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.api.log.append((self.command, self.path, status))

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                          "message": message, "code": code})  # fmt: skip

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.api.service_account.token}":
            self._status(401, "Unauthorized", "no or a wrong bearer token")
            return False
        return True

    def _is_our_raycluster(self, m: re.Match[str] | None) -> bool:
        """Whether a RAYCLUSTERS match names the one RayCluster served."""
        return bool(m) and m["ns"] == self.api.namespace and m["name"] == self.api.name

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._authorised():
            return
        url = urlparse(self.path)
        if self._is_our_raycluster(RAYCLUSTERS.match(url.path)):
            self._send(200, self.api.raycluster())
            return
        if (m := PODS.match(url.path)) and m["ns"] == self.api.namespace:
            if m["name"]:
                self._get_pod(m["name"])
            else:
                self._list_pods(url.query)
            return
        self._status(404, "NotFound", f"no such resource: {url.path}")

    def _get_pod(self, name: str) -> None:
        """GET one pod; answered under the lock."""
        api = self.api
        with api._lock:
            pod = api._pods.get(name)
            if pod is None:
                self._status(404, "NotFound", f'pods "{name}" not found')
                return
            self._send(200, copy.deepcopy(pod))

    def _list_pods(self, query: str) -> None:
        """GET the pods whose labels match every k=v of the labelSelector, with the list's resourceVersion."""
        api = self.api
        with api._lock:
            selector = dict(
                kv.split("=", 1) for kv in unquote(parse_qs(query).get("labelSelector", [""])[0]).split(",") if kv
            )
            items = [
                copy.deepcopy(p)
                for p in api._pods.values()
                if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            body = {"kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(api._version)}, "items": items}  # fmt: skip
        self._send(200, body)

    def do_PATCH(self) -> None:  # noqa: N802
        if not self._authorised():
            return
        url = urlparse(self.path)
        if not self._is_our_raycluster(RAYCLUSTERS.match(url.path)):
            self._status(404, "NotFound", f"no such resource: {url.path}")
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        api = self.api
        with api._lock:
            try:
                if kind == "application/json-patch+json":
                    new = json_patch(api._cluster, body)
                elif kind == "application/merge-patch+json":
                    new = merge_patch(api._cluster, body)
                else:
                    self._status(415, "UnsupportedMediaType", f"patch type {kind!r}")
                    return
            except PatchError as exc:
                self._status(422, "Invalid", str(exc))
                return
            api._cluster = new
            api._bump(api._cluster)
            api.patches.append(body)
            out = copy.deepcopy(api._cluster)
        self._send(200, out)

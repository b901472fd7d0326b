#!/usr/bin/env python3
"""Print the dev overlay's TLS Secrets: a private CA and the server certificates it signs, ready for kubectl.

    python deploy/dev_tls.py --namespace calib-sweeps > deploy/overlays/dev/tls.yaml
    kubectl apply -n calib-sweeps -f deploy/overlays/dev/tls.yaml

One Secret per in-cluster server, `kubernetes.io/tls` with the keys cert-manager writes (`tls.crt`, `tls.key`,
`ca.crt`), so a cluster with cert-manager can issue them instead (deploy/components/cert-manager):

- `mlflow-tls`: MLflow's certificate, for the Service `mlflow` in every DNS form a pod uses (`mlflow`,
  `mlflow.<ns>`, `mlflow.<ns>.svc`, `mlflow.<ns>.svc.cluster.local`) and `localhost` / 127.0.0.1 for
  `kubectl port-forward`;
- `postgres-tls`: PostgreSQL's, for the Service `postgres` in the same forms (`localhost` / 127.0.0.1 too);
- `postgres-ca`: the CA alone (`ca.crt`, type Opaque), the Secret every PostgreSQL client mounts. Its name is the
  same in every overlay: with an external database (gpu-cluster) it holds that database's CA instead;
- `mlflow-metrics-client-tls`: a client certificate (`prometheus`, client auth only) that Prometheus shows to
  MLflow's metrics port, which answers certificates of this CA only (mutual TLS; components/monitoring).

Clients mount `ca.crt` only and verify the server against it (MLflow: MLFLOW_TRACKING_SERVER_CERT_PATH;
PostgreSQL: PGSSLMODE=verify-full, PGSSLROOTCERT). The CA's key is not kept: to renew, run this again and re-apply
(every Secret is replaced at once). Certificates last `--days` (default 365). Needs `cryptography` (a dependency
of MLflow: the project's virtualenv has it).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import sys

SERVERS = ("mlflow", "postgres")
METRICS_CLIENT_TLS = "mlflow-metrics-client-tls"  # Prometheus's certificate for MLflow's metrics port (9464)
METRICS_CLIENT_NAME = "prometheus"
PORT_FORWARD_NAMES = {"mlflow": ("localhost", "127.0.0.1"), "postgres": ("localhost", "127.0.0.1")}


def dns_names(service: str, namespace: str) -> list[str]:
    """Every name a pod of the namespace reaches the Service by."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "public_bytes"):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(
    namespace: str, days: int = 365, extra_names: dict[str, list[str]] | None = None
) -> dict[str, dict[str, bytes]]:
    """{secret name: {tls.crt, tls.key, ca.crt}} signed by a new CA (ECDSA P-256); `extra_names` adds DNS names
    to a server's certificate (a replacement server reached by a name of its own, say)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"calib-sweeps dev CA ({namespace})")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out = {}
    for server in SERVERS:
        key = ec.generate_private_key(ec.SECP256R1())
        extra = PORT_FORWARD_NAMES.get(server, ())
        names = [*dns_names(server, namespace), *extra[:1], *(extra_names or {}).get(server, [])]
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra[1:]]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{server}.{namespace}.svc")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        out[f"{server}-tls"] = {"tls.crt": _pem(cert), "tls.key": _pem(key), "ca.crt": _pem(ca)}
    out["postgres-ca"] = {"ca.crt": _pem(ca)}
    # Prometheus's client certificate for MLflow's metrics port (mutual TLS: the sidecar verifies it against ca.crt)
    key = ec.generate_private_key(ec.SECP256R1())
    client = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, METRICS_CLIENT_NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out[METRICS_CLIENT_TLS] = {"tls.crt": _pem(client), "tls.key": _pem(key), "ca.crt": _pem(ca)}
    return out


def manifest(secrets: dict[str, dict[str, bytes]]) -> str:
    """The Secrets as one YAML stream (base64 `data`)."""
    docs = []
    for name, files in secrets.items():
        kind = "kubernetes.io/tls" if "tls.key" in files else "Opaque"
        lines = ["apiVersion: v1", "kind: Secret", "metadata:", f"  name: {name}", f"type: {kind}", "data:"]
        lines += [f"  {k}: {base64.b64encode(v).decode()}" for k, v in files.items()]
        docs.append("\n".join(lines) + "\n")
    return "---\n".join(docs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespace", default="calib-sweeps", help="the namespace the overlay renders into")
    p.add_argument("--days", type=int, default=365, help="validity of the CA and the certificates")
    p.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="SERVER=DNS",
        help=f"one more DNS name for a server's certificate (SERVER: {', '.join(SERVERS)}); repeatable",
    )
    a = p.parse_args(argv)
    extra: dict[str, list[str]] = {}
    for item in a.name:
        server, _, dns = item.partition("=")
        if server not in SERVERS or not dns:
            p.error(f"--name {item!r}: expected SERVER=DNS with SERVER one of {', '.join(SERVERS)}")
        extra.setdefault(server, []).append(dns)
    sys.stdout.write(manifest(issue(a.namespace, a.days, extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

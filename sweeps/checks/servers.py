"""Pre-flight checks of the servers a sweep talks to: the MLflow store (a SQLite file, or a server answering over
HTTP or HTTPS with a certificate the MLflow client will trust), the Optuna study's database, and the Ray head's
address. Every problem is one ConfigError line; on a cluster a transient reason (a name not resolving yet,
nothing listening yet, a gateway error) is waited out for CLUSTER_WAIT_S. Nothing is written.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from calib_core.config import ConfigError, clip
from calib_core.redaction import redact
from sweeps.checks.paths import check_writable_dir

# Seconds to wait for a tracking server, a database or a Ray head to answer.
TIMEOUT_S = float(os.environ.get("CALIB_PREFLIGHT_TIMEOUT_S", "3"))


# On a cluster a service's DNS name and its server can come up after the job's driver (a Service created with the
# RayCluster, a pod restarting): a sweep there waits this long for its stores before giving up.
CLUSTER_WAIT_S = float(os.environ.get("CALIB_PREFLIGHT_CLUSTER_WAIT_S", "90"))


# Reasons a server may still give a moment later; anything else (a 404, a bad port) fails at once.
TRANSIENT = (
    "cannot resolve host",
    "no answer within",
    "cannot reach",
    "Connection refused",
    "HTTP 502",
    "HTTP 503",
    "HTTP 504",
)


def ray_address() -> str:
    """The Ray cluster `--cluster` joins: RAY_ADDRESS, else 'auto' (the one `ray start` started here)."""
    return os.environ.get("RAY_ADDRESS") or "auto"


def is_local_store(uri: str) -> bool:
    """True for MLflow stores other nodes cannot reach (SQLite files, file paths)."""
    return uri.startswith(("sqlite:", "file:", "/", ".")) or "://" not in uri


def uri_host(uri: str) -> str:
    """The host of a URI ("" when it has none or does not parse)."""
    try:
        return urllib.parse.urlsplit(uri).hostname or ""
    except ValueError:
        return ""


def address_host(address: str) -> str:
    """The host of a Ray address (host:port, ray://host:port, or 'auto')."""
    if address == "auto":
        return ""
    if "://" in address:
        return uri_host(address)
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 in brackets or not) is this machine's loopback."""
    if not host:
        return False
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_tracking(uri: str, cluster: bool) -> None:
    """The MLflow store: a SQLite file whose folder exists and is writable, or a server that answers."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        _check_sqlite_file("tracking.uri", db, "store", "URI")
        artifacts = db.parent / "mlartifacts"  # ensure_experiment keeps a SQLite store's artifacts there
        if artifacts.exists() and not artifacts.is_dir():
            raise ConfigError(f"tracking.uri: {artifacts} (the artifact folder beside the store) is not a folder")
    elif uri.startswith(("http://", "https://")):
        reason = wait_for(lambda: _probe_http(uri), redact(uri), cluster)
        if reason:
            raise ConfigError(
                f"tracking.uri: no MLflow server answers at {redact(uri)} ({reason}); start it or fix the URI"
            )
    elif uri.startswith(("postgresql", "mysql")):
        _check_database_server("tracking.uri", uri, cluster)


def check_study_storage(url: str, cluster: bool = False) -> None:
    """The Optuna storage: a SQLite file whose folder exists and is writable, or a database that answers."""
    if url.startswith("sqlite:///"):
        _check_sqlite_file("search.storage", Path(url.removeprefix("sqlite:///")), "study", "URL")
    elif url.startswith(("postgresql", "mysql")):
        _check_database_server("search.storage", url, cluster)


def wait_for(probe: Callable[[], str | None], what: str, cluster: bool, wait_s: float | None = None) -> str | None:
    """`probe()`'s reason, retried for up to CLUSTER_WAIT_S on a cluster while the reason is transient (the
    name does not resolve yet, nothing listens yet, a gateway error), saying once on stderr that it waits."""
    reason = probe()
    if not cluster or reason is None or not reason.startswith(TRANSIENT):
        return reason
    wait_s = CLUSTER_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    print(f"waiting up to {wait_s:g} s for {what} ({reason})", file=sys.stderr, flush=True)
    while reason is not None and reason.startswith(TRANSIENT) and time.monotonic() < deadline:
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        reason = probe()
    if reason is not None and reason.startswith(TRANSIENT):
        return f"{reason}, still after {wait_s:g} s"
    return reason


def _check_sqlite_file(field: str, db: Path, what: str, address: str) -> None:
    """A SQLite database `db` (the `what`: store or study): its folder exists and is writable; the file,
    if there, is a readable and writable SQLite database. A missing file is fine (it is created)."""
    if not db.parent.exists():
        raise ConfigError(
            f"{field}: the folder {db.parent} of the SQLite {what} does not exist "
            f"(create it, or point the {address} elsewhere)"
        )
    check_writable_dir(field, db.parent, what=f"the folder of the SQLite {what}")
    if db.exists():
        if not db.is_file():
            raise ConfigError(f"{field}: {db} is not a file")
        if not os.access(db, os.R_OK | os.W_OK):
            raise ConfigError(f"{field}: {db} is not writable")
        with open(db, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise ConfigError(f"{field}: {db} is not a SQLite database")


def _check_database_server(field: str, url: str, cluster: bool = False) -> None:
    """A PostgreSQL or MySQL URL: its host answers on its port (the default port when none is given)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        return
    default = 5432 if url.startswith("postgresql") else 3306
    try:
        port = parts.port or default
    except ValueError:
        raise ConfigError(f"{field}: {redact(url)!r} has an invalid port") from None
    host = parts.hostname
    reason = wait_for(lambda: probe_tcp(host, port), f"{host}:{port}", cluster)
    if reason:
        raise ConfigError(f"{field}: no database answers at {parts.hostname}:{port} ({reason})")


def check_uri_syntax(field: str, uri: str) -> None:
    """A URI-shaped value must parse (host, port, IPv6 brackets): one line naming the field, never a traceback."""
    if "\x00" in uri:
        raise ConfigError(f"{field}: contains a NUL byte")
    if "://" not in uri:
        return
    try:
        parts = urllib.parse.urlsplit(uri)
        parts.port  # noqa: B018 - parsing the port raises on a bad one
        parts.hostname  # noqa: B018
    except ValueError as exc:
        raise ConfigError(f"{field}: {clip(redact(uri), 120)} is not a valid URI ({clip(str(exc), 80)})") from None


def probe_tcp(host: str, port: int, timeout: float = TIMEOUT_S) -> str | None:
    """None when something accepts a TCP connection at host:port within `timeout`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"cannot resolve host {host!r}"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def _tls_context() -> ssl.SSLContext:
    """The certificate check the MLflow client makes: MLFLOW_TRACKING_SERVER_CERT_PATH's CA when set (a private
    CA, e.g. the cluster's: deploy/dev_tls.py), else the system's; none with MLFLOW_TRACKING_INSECURE_TLS=true."""
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1"):
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx
    ca = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"MLFLOW_TRACKING_SERVER_CERT_PATH: {ca} is not a readable PEM certificate ({exc})") from None


def _probe_http(uri: str, timeout: float = TIMEOUT_S) -> str | None:
    """None when an MLflow server answers at `uri` (any status on /health but 404 or a gateway error),
    else why not."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        return "invalid port"
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    ctx = _tls_context()
    req = urllib.request.Request(url, headers={"User-Agent": "calib-sweep-preflight"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx):
            return None
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code in (502, 503, 504):
            return f"HTTP {exc.code} {exc.reason}"
        if exc.code == 404:  # every MLflow server (3.x) serves /health
            return f"HTTP 404 for {url}: something answers, but not an MLflow tracking server"
        return None  # 401, 403...: a server answers, behind authentication
    except urllib.error.URLError as exc:
        reason = exc.reason
    except OSError as exc:
        reason = exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        ca = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
        fix = f"is {ca} its CA's certificate?" if ca else "set MLFLOW_TRACKING_SERVER_CERT_PATH to its CA's certificate"
        return f"its TLS certificate is not trusted here ({reason.verify_message}): {fix}"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve host {host!r}"
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return f"no answer within {timeout:g} s"
    return getattr(reason, "strerror", None) or str(reason)

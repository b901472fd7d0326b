"""Checks that run before a sweep writes anything: every problem is one `ConfigError` line.

`launch.main` calls `check_config` (values only: no file system, no network; --dry-run runs
these too) and then `preflight` (the environment: paths and their writability, the tracking
server, the local machine's or the cluster's resources, and the MLflow store) before
`run_sweep` creates a store, a Ray session or a run. Nothing here creates a file or directory.

This module stays cheap to import (no ray, torch or mlflow at import time): a bad invocation
fails in a fraction of a second.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError, clip
from calib_core.registry import DATASETS
from sweeps.redaction import redact

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

# Seconds to wait for a tracking server, a database or a Ray head to answer.
TIMEOUT_S = float(os.environ.get("CALIB_PREFLIGHT_TIMEOUT_S", "3"))
# On a cluster a service's DNS name and its server can come up after the job's driver (a Service created with the
# RayCluster, a pod restarting): a sweep there waits this long for its stores before giving up.
CLUSTER_WAIT_S = float(os.environ.get("CALIB_PREFLIGHT_CLUSTER_WAIT_S", "90"))
# Reasons a server may still give a moment later; anything else (a 404, a bad port) fails at once.
_TRANSIENT = ("cannot resolve host", "no answer within", "Connection refused", "HTTP 502", "HTTP 503", "HTTP 504")
# Datasets read from files under run.data.root (calib_core.registry's metadata).
ROOT_DATASETS = tuple(DATASETS.names(needs_root=True))
# File systems that cannot hold a store (kernel interfaces).
PSEUDO_FS = {
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "devtmpfs",
    "securityfs",
    "debugfs",
    "tracefs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "mqueue",
    "binfmt_misc",
    "efivarfs",
    "autofs",
    "nsfs",
}
RESOURCE_UNIT = 1e-4  # Ray refuses fractional resources below 0.0001


# --------------------------------------------------------------------------- values only


def check_config(cfg: SweepConfig, cluster: bool) -> None:
    """Every check that needs neither the file system nor the network; all problems in one line."""
    problems: list[str] = []
    _non_finite(cfg.model_dump(), "", problems)
    problems += _run_path_problems(cfg)
    t = cfg.tracking
    problems += _name_problems("tracking.experiment", t.experiment, 500, forbidden="")
    problems += _name_problems("tracking.registered_model", t.registered_model, 256, forbidden="/:@")
    if t.registered_model.strip() in (".", ".."):
        problems.append(f"tracking.registered_model: {t.registered_model!r} is not a usable model name")
    if cfg.storage_path is not None and not cfg.storage_path.strip():
        problems.append("storage_path: must not be empty (a directory or s3://...; omit it for ./ray_results)")
    if t.uri is not None and t.uri.startswith("sqlite:///"):
        path = t.uri.removeprefix("sqlite:///")
        if not path.startswith("/"):
            problems.append(
                f"tracking.uri: {t.uri!r} is a relative SQLite path; give an absolute one: "
                f"sqlite:///{Path(path).absolute()} (four slashes)"
            )
    problems += _study_storage_problems(cfg, cluster)
    r = cfg.resources
    for field, value in (("cpus_per_trial", r.cpus_per_trial), ("gpus_per_trial", r.gpus_per_trial)):
        if 0 < value < RESOURCE_UNIT:
            problems.append(f"resources.{field}: Ray counts resources in steps of {RESOURCE_UNIT:g} (got {value:g})")
    if cfg.run.device.startswith("cuda") and r.gpus_per_trial == 0:
        problems.append(
            f"run.device: {cfg.run.device!r} needs resources.gpus_per_trial > 0 "
            "(Ray hides every GPU from a trial that asks for none)"
        )
    if cfg.run.data.name in ROOT_DATASETS and cfg.run.data.root is None:
        problems.append(
            f"run.data.root: {cfg.run.data.name} is read from torchvision's files; set the folder that holds them"
        )
    if cluster:
        problems += _cluster_store_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))


def _run_path_problems(cfg: SweepConfig) -> list[str]:
    """The run's own paths (data root, data file, pretrained weights) pass the check every path value of the
    sweep passes (sweeps.config.path_problem; storage_path and the store URLs pass it in the schema)."""
    from sweeps.config import path_problem

    d, m = cfg.run.data, cfg.run.model
    out = []
    for field, value in (("run.data.root", d.root), ("run.data.path", d.path), ("run.model.weights", m.weights)):
        problem = path_problem(value) if value is not None else None
        if problem:
            out.append(f"{field}: {problem}")
    return out


def _study_storage_problems(cfg: SweepConfig, cluster: bool) -> list[str]:
    """search.storage: an absolute SQLite path, never the MLflow database itself, a server with --cluster."""
    url = cfg.search.storage
    if not url or url == "memory":
        return []
    if url.startswith("sqlite:///") and not url.removeprefix("sqlite:///").startswith("/"):
        return [
            f"search.storage: {url!r} is a relative SQLite path; give an absolute one: "
            f"sqlite:///{Path(url.removeprefix('sqlite:///')).absolute()} (four slashes)"
        ]
    if url == cfg.tracking.uri:
        # both keep an alembic_version table: one database cannot hold the two schemas
        return [
            f"search.storage: {redact(url)!r} is the MLflow store itself; give the Optuna study its own "
            "database (e.g. optuna.db beside mlflow.db, or a database 'optuna' on the same server)"
        ]
    if cluster and url.startswith("sqlite:"):
        return [
            f"search.storage: {url!r} is a local SQLite file; with --cluster use a database every node "
            "can reach (postgresql://..., e.g. via CALIB_OPTUNA_STORAGE) or 'memory'"
        ]
    return []


def _non_finite(value: Any, path: str, problems: list[str]) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}: must be a finite number (got {value})")
    elif isinstance(value, dict):
        for k, v in value.items():
            _non_finite(v, f"{path}.{k}" if path else str(k), problems)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _non_finite(v, f"{path}[{i}]", problems)


def _name_problems(field: str, name: str, max_len: int, forbidden: str) -> list[str]:
    if not name.strip():
        return [f"{field}: must not be empty"]
    out = []
    if name != name.strip():
        out.append(f"{field}: {name!r} starts or ends with white space")
    if len(name) > max_len:
        out.append(f"{field}: at most {max_len} characters (got {len(name)})")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        out.append(f"{field}: {name!r} contains a control character")
    bad = sorted({c for c in name if c in forbidden})
    if bad:
        out.append(f"{field}: {name!r} must not contain {' or '.join(repr(c) for c in bad)}")
    return out


def ray_address() -> str:
    """The Ray cluster `--cluster` joins: RAY_ADDRESS, else 'auto' (the one `ray start` started here)."""
    return os.environ.get("RAY_ADDRESS") or "auto"


def _cluster_store_problems(cfg: SweepConfig) -> list[str]:
    """With --cluster: stores every node can reach (a server, an object store, a shared mount)."""
    uri, storage = cfg.tracking.uri, cfg.storage_path
    problems = []
    if not uri:
        problems.append(
            "tracking.uri: --cluster needs an MLflow server every node can reach "
            "(e.g. --tracking-uri http://mlflow:5000); none was given"
        )
    elif is_local_store(uri):
        problems.append(
            f"tracking.uri: {uri!r} is a local store; with --cluster use an MLflow server URL "
            "(http://...) reachable from every node"
        )
    elif is_loopback(uri_host(uri)) and not is_loopback(address_host(ray_address())):
        problems.append(
            f"tracking.uri: {redact(uri)!r} is a loopback address, which is each node's own "
            "machine; with --cluster use a host name or address every node can reach"
        )
    if not storage:
        problems.append("storage_path: --cluster needs shared storage (s3://... or a shared mount); none was given")
    elif storage.startswith(("file://", "memory://")):
        scheme = storage.split("://", 1)[0]
        problems.append(
            f"storage_path: {storage!r} ({scheme}://) is local to each node; with --cluster use "
            "s3://... or gs://..., or the plain path of a shared mount with CALIB_SHARED_STORAGE=1"
        )
    elif "://" not in storage and not os.environ.get("CALIB_SHARED_STORAGE"):
        problems.append(
            f"storage_path: {storage!r} is a local directory that other nodes cannot reach; use "
            "s3://... or gs://..., or set CALIB_SHARED_STORAGE=1 if it is a shared mount (NFS) at "
            "the same path on every node"
        )
    return problems


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


# --------------------------------------------------------------------------- --resume: the same search

SEARCH_SPACE_FILE = "calib_search_space.json"  # in Tune's experiment folder: what the sweep searches
# The search settings a --resume must keep: restored trials, Ray Tune's restored searcher and the Optuna study
# all hold the space the sweep started with (num_samples may grow it; storage is where the study lives, and
# storage_outage_timeout_s how long the sweep waits for it).
SEARCH_SPACE_EXCLUDES = {"num_samples", "storage", "storage_outage_timeout_s"}


def search_space(cfg: SweepConfig) -> dict[str, Any]:
    """The search settings of `cfg` that a --resume must keep, as JSON values."""
    return cfg.search.model_dump(mode="json", exclude=SEARCH_SPACE_EXCLUDES)


def search_space_problem(cfg: SweepConfig, recorded: dict[str, Any]) -> str | None:
    """One line when `cfg` searches otherwise than the sweep did when it started (`recorded`), else None."""
    now = search_space(cfg)
    changed = [k for k in sorted(set(now) | set(recorded)) if now.get(k) != recorded.get(k)]
    if not changed:
        return None
    k = changed[0]
    was, is_ = clip(json.dumps(recorded.get(k)), 60), clip(json.dumps(now.get(k)), 60)
    more = f" (and {', '.join('search.' + c for c in changed[1:])})" if changed[1:] else ""
    return (
        f"search.{k}: --resume of {cfg.name!r} must search what it started with: {was} then, {is_} now{more}; "
        "resume with the same search settings, or start a new sweep with --name"
    )


def check_resume_search_space(cfg: SweepConfig) -> None:
    """On --resume of a local sweep, the search space it recorded when it started (SEARCH_SPACE_FILE) is the one
    asked for now; reads that one file (a remote storage path is checked when Tune's experiment is restored)."""
    storage = cfg.storage_path or ""
    if not storage or "://" in storage:
        return
    path = Path(storage) / cfg.name / SEARCH_SPACE_FILE
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # a sweep started before the space was recorded, or nothing to resume
    problem = search_space_problem(cfg, recorded) if isinstance(recorded, dict) else None
    if problem:
        raise ConfigError(problem)


# --------------------------------------------------------------------------- the environment


@contextmanager
def fs_errors(field: str) -> Iterator[None]:
    """A file-system error while checking (e.g. a folder on the way this user may not enter) as one line."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ConfigError(f"{field}: {exc.strerror or exc}{where}") from None


def check_tracking(uri: str, cluster: bool) -> None:
    """The MLflow store: a SQLite file whose folder exists and is writable, or a server that answers."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        _check_sqlite_file("tracking.uri", db, "store", "URI")
        artifacts = db.parent / "mlartifacts"  # ensure_experiment keeps a SQLite store's artifacts there
        if artifacts.exists() and not artifacts.is_dir():
            raise ConfigError(f"tracking.uri: {artifacts} (the artifact folder beside the store) is not a folder")
    elif uri.startswith(("http://", "https://")):
        reason = _wait_for(lambda: _probe_http(uri), redact(uri), cluster)
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


def _wait_for(probe: Callable[[], str | None], what: str, cluster: bool, wait_s: float | None = None) -> str | None:
    """`probe()`'s reason, retried for up to CLUSTER_WAIT_S on a cluster while the reason is transient (the
    name does not resolve yet, nothing listens yet, a gateway error), saying once on stderr that it waits."""
    reason = probe()
    if not cluster or reason is None or not reason.startswith(_TRANSIENT):
        return reason
    wait_s = CLUSTER_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    print(f"waiting up to {wait_s:g} s for {what} ({reason})", file=sys.stderr, flush=True)
    while reason is not None and reason.startswith(_TRANSIENT) and time.monotonic() < deadline:
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        reason = probe()
    if reason is not None and reason.startswith(_TRANSIENT):
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
    _check_writable_dir(field, db.parent, what=f"the folder of the SQLite {what}")
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
    reason = _wait_for(lambda: probe_tcp(host, port), f"{host}:{port}", cluster)
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


PROBE_TIMEOUT_S = 20.0


def probe_remote_storage(storage: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Write and delete a marker file in a remote storage path (s3://, gs://, hdfs://, ...) through pyarrow, as
    Ray Tune will: missing libraries or credentials are one line here, before anything of the sweep is written."""
    import threading
    import uuid

    problem: list[str] = []

    def probe() -> None:
        try:
            import pyarrow.fs as pafs

            fs, path = pafs.FileSystem.from_uri(storage)
            marker = f"{path.rstrip('/')}/.calib-probe-{uuid.uuid4().hex}"
            with fs.open_output_stream(marker) as out:
                out.write(b"calib-sweep storage probe")
            fs.delete_file(marker)
        except Exception as exc:  # noqa: BLE001 - every failure is reported as the one line below
            problem.append(" ".join(str(exc).split()) or type(exc).__name__)

    worker = threading.Thread(target=probe, name="storage-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    scheme = storage.split("://", 1)[0]
    if worker.is_alive():
        raise ConfigError(
            f"storage_path: {scheme}:// storage did not answer within {timeout:.0f} s ({clip(redact(storage), 100)})"
        )
    if problem:
        raise ConfigError(
            f"storage_path: cannot write to {clip(redact(storage), 100)} ({clip(problem[0], 140)}); check the "
            f"{scheme} library and credentials"
        )


def check_storage(storage: str, cluster: bool) -> None:
    """A local storage path (or file://) must be a folder this process can create or write into; a remote one
    (s3://, gs://, hdfs://, ...) must take a marker file."""
    if storage.startswith("file://"):
        parts = urllib.parse.urlsplit(storage)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"storage_path: {storage!r}: a file:// URI names no host (file:///ABS/PATH)")
        path = Path(urllib.parse.unquote(parts.path))
    elif "://" in storage:
        return  # an object store: probed by preflight once the cheaper checks passed (probe_remote_storage)
    elif cluster and not os.environ.get("CALIB_SHARED_STORAGE"):
        return  # nothing local to check
    else:
        path = Path(storage)
    if not path.is_absolute():
        raise ConfigError(f"storage_path: {storage!r} is not an absolute path")
    _check_writable_dir("storage_path", path, what="the storage folder", may_create=True)


def _check_writable_dir(field: str, path: Path, what: str, may_create: bool = False) -> None:
    """`path` is a writable folder, or (may_create) could be created: no file in the way, the nearest
    existing folder writable, not on a read-only or kernel file system. Creates nothing.

    os.access cannot see permissions for root (it may write anywhere on a writable file system),
    so the mount table (/proc/self/mountinfo) is checked too: read-only mounts and kernel file
    systems (proc, sysfs, ...) are refused for everyone.
    """
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ConfigError(f"{field}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        if existing == path:
            raise ConfigError(f"{field}: {path} is a file, not a folder")
        raise ConfigError(f"{field}: {existing} is a file, so {path} cannot be created under it")
    if existing != path and not may_create:
        raise ConfigError(f"{field}: {path} does not exist")
    mount = _mount_of(existing)
    if mount is not None:
        point, fstype, options = mount
        if fstype in PSEUDO_FS:
            raise ConfigError(f"{field}: {path} is on {point}, a {fstype} file system that cannot hold {what}")
        if "ro" in options:
            raise ConfigError(f"{field}: {path} is on {point}, which is mounted read-only")
    if not os.access(existing, os.W_OK | os.X_OK):
        action = "write into" if existing == path else f"create {path} under"
        raise ConfigError(f"{field}: no permission to {action} {existing}")


def _mount_of(path: Path) -> tuple[str, str, set[str]] | None:
    """(mount point, file system type, mount options) of the mount holding `path` (Linux), else None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best: tuple[str, str, set[str]] | None = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or not tail:
            continue
        point = fields[4].encode().decode("unicode_escape")  # \040 for a space
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best[0]):
                opts = set(fields[5].split(",")) | (set(tail[2].split(",")) if len(tail) > 2 else set())
                best = (point, tail[0], opts)
    return best


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


# --------------------------------------------------------------------------- resources


def local_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (as Ray counts them)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return min(n, max(1, int(quota))) if quota else n


def _cgroup_cpu_quota() -> float | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()  # cgroup v2
        return float(quota) / float(period) if quota != "max" else None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        q = float(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = float(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def local_gpus() -> int:
    """CUDA devices torch sees (imports torch: call only when a trial asks for GPUs)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def check_local_resources(cfg: SweepConfig) -> None:
    """A single trial must fit on this machine, or Ray would keep it pending for ever."""
    r = cfg.resources
    cpus = local_cpus()
    if r.cpus_per_trial > cpus:
        raise ConfigError(
            f"resources.cpus_per_trial: a trial asks for {r.cpus_per_trial:g} CPUs but this machine "
            f"offers {cpus}; lower it (a trial runs on one machine) or use --cluster"
        )
    if r.gpus_per_trial > 0:
        gpus = local_gpus()
        if r.gpus_per_trial > gpus:
            has = "no GPU (torch sees no CUDA device)" if gpus == 0 else f"{gpus} GPU{'s' if gpus > 1 else ''}"
            raise ConfigError(
                f"resources.gpus_per_trial: a trial asks for {r.gpus_per_trial:g} GPUs but this "
                f"machine has {has}; lower it or use --cluster"
            )


def check_local_data(cfg: SweepConfig) -> None:
    """Datasets read from files: their folder must exist here unless they are to be downloaded."""
    d = cfg.run.data
    if d.name in ROOT_DATASETS and d.root is not None and not d.download:
        root = Path(d.root).expanduser()
        if not root.is_dir():
            raise ConfigError(
                f"run.data.root: {root} is not a folder ({d.name} needs torchvision's files there, "
                "or run.data.download: true)"
            )


CHECKPOINT_COPIES = 3  # weights + Adam's two moments in every epoch checkpoint


def check_disk_fits(cfg: SweepConfig, params: int) -> None:
    """Refuse a local sweep whose epoch checkpoints (estimated from the model's parameter count) cannot fit
    on the storage path's disk."""
    import shutil

    kept = cfg.run.train.epochs if cfg.resources.checkpoints_to_keep is None else cfg.resources.checkpoints_to_keep
    need = cfg.search.num_samples * min(kept, cfg.run.train.epochs) * params * 4 * CHECKPOINT_COPIES
    existing = Path(cfg.storage_path or ".")
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if need > free:
        raise ConfigError(
            f"search.num_samples: {cfg.search.num_samples} trials keep about {need / 2**30:.1f} GiB of checkpoints "
            f"({params} parameters, {kept} per trial) but {existing} has {free / 2**30:.1f} GiB free; use fewer "
            "trials or resources.checkpoints_to_keep"
        )


def check_model_fits_data(cfg: SweepConfig) -> int | None:
    """Build the backbone for the dataset's input shape and run one dummy batch (sweeps/checks/model_fit.py, in a
    child process); the parameter count, or None where the shape is not known before loading."""
    from sweeps.checks.model_fit import start

    return start(cfg).result()


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

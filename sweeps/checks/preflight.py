"""Checks that run before a sweep writes anything: every problem is one `ConfigError` line.

`check_config` checks values only (no file system, no network; --dry-run runs it alone); sweeps/startup.py's
`check_all` runs it first and then the environment checks (paths and their writability (checks/paths.py), the
tracking server and the study's database (checks/servers.py), the local machine's resources (here) or the
cluster's, and the MLflow store), collecting every problem, before `run_sweep` creates a store, a Ray session
or a run. Nothing here creates a file or directory.

This module stays cheap to import (no ray, torch or mlflow at import time): a bad invocation
fails in a fraction of a second.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError, clip
from calib_core.redaction import redact
from calib_core.registry import DATASETS
from sweeps.checks.servers import address_host, is_local_store, is_loopback, ray_address, uri_host

if TYPE_CHECKING:
    from sweeps.config import SweepConfig

# Datasets read from files under run.data.root (calib_core.registry's metadata).
ROOT_DATASETS = tuple(DATASETS.names(needs_root=True))
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


def _cluster_store_problems(cfg: SweepConfig) -> list[str]:
    """With --cluster: stores every node can reach (a server, an object store, a shared mount)."""
    uri, storage = cfg.tracking.uri, cfg.storage_path
    problems = []
    if not uri:
        problems.append(
            "tracking.uri: --cluster needs an MLflow server every node can reach "
            "(e.g. --tracking-uri https://mlflow:5000); none was given"
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


# --------------------------------------------------------------------------- --resume: the same search

# In Tune's experiment folder: what the sweep searches (SearchConfig.resumed_space), for --resume to compare.
SEARCH_SPACE_FILE = "calib_search_space.json"


def search_space_problem(cfg: SweepConfig, recorded: dict[str, Any]) -> str | None:
    """One line when `cfg` searches otherwise than the sweep did when it started (`recorded`), else None."""
    now = cfg.search.resumed_space()
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


def cuda_devices_hidden() -> bool:
    """CUDA_VISIBLE_DEVICES hides every device: set but empty, or its first entry not a device ('-1'; CUDA reads
    the list up to its first invalid entry, and HIP honours the variable too). torch then sees none."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return False
    first = value.split(",", 1)[0].strip()
    return first == "" or first.startswith("-")


def local_gpus() -> int:
    """CUDA devices torch sees. Imports torch (seconds, tens of them on a loaded machine, and serial before the
    other checks, which overlap with the model/data check's own import in its child) unless CUDA_VISIBLE_DEVICES
    already says there are none: call only when a trial asks for GPUs."""
    if cuda_devices_hidden():
        return 0
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
            why = "CUDA_VISIBLE_DEVICES hides every device" if cuda_devices_hidden() else "torch sees no CUDA device"
            has = f"no GPU ({why})" if gpus == 0 else f"{gpus} GPU{'s' if gpus > 1 else ''}"
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


MOMENTS = 2  # Adam's two moments of every trained parameter, in every epoch checkpoint beside the weights


def check_disk_fits(cfg: SweepConfig, params: int, trainable: int | None = None) -> None:
    """Refuse a local sweep whose epoch checkpoints (estimated from the model's parameter count, and the trained
    ones' optimizer moments: `trainable`, default all) cannot fit on the storage path's disk."""
    import shutil

    trainable = params if trainable is None else trainable
    kept = cfg.run.train.epochs if cfg.resources.checkpoints_to_keep is None else cfg.resources.checkpoints_to_keep
    need = cfg.search.num_samples * min(kept, cfg.run.train.epochs) * (params + MOMENTS * trainable) * 4
    existing = Path(cfg.storage_path or ".")
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if need > free:
        raise ConfigError(
            f"search.num_samples: {cfg.search.num_samples} trials keep about {need / 2**30:.1f} GiB of checkpoints "
            f"({params} parameters{'' if trainable == params else f', {trainable} of them trained'}, {kept} per "
            f"trial) but {existing} has {free / 2**30:.1f} GiB free; use fewer "
            "trials or resources.checkpoints_to_keep"
        )


def check_model_fits_data(cfg: SweepConfig) -> int | None:
    """Build the backbone for the dataset's input shape and run one dummy batch (sweeps/checks/model_fit.py, in a
    child process); the parameter count, or None where the shape is not known before loading."""
    from sweeps.checks.model_fit import start

    return start(cfg).result()


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__

"""Every check before a sweep's first write, in one pass: `check_all` returns every problem it finds.

Values first (checks/preflight.py's `check_config`: no file system, no network), on a resume the recorded search
space, and the URLs' syntax; if those hold, the environment: this machine's data folder and resources (with
`--cluster`: the dataset on the shared volume or staged, checks/staged_data.py), then the
model/data check (started in a child process: it loads torch while the others run), the storage path, for
`--cluster` the connection to the cluster and its resources (integrations/ray/cluster.py), the tracking server,
the study's database, a remote storage path, the stores (integrations/mlflow/existing.py: name taken, nothing to
resume), and the model/data check's answer with the disk check it feeds. A check whose input another check found
broken is skipped (no second line for one cause). Nothing here writes; `preflight` raises the problems as one
ConfigError line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calib_core.config import ConfigError
from sweeps.checks.paths import check_storage, fs_errors, probe_remote_storage
from sweeps.checks.preflight import (
    check_config,
    check_disk_fits,
    check_local_data,
    check_local_resources,
    check_resume_search_space,
)
from sweeps.checks.servers import check_study_storage, check_tracking, check_uri_syntax, is_loopback, uri_host
from sweeps.checks.staged_data import check_cluster_data

if TYPE_CHECKING:
    from sweeps.config import SweepConfig


@dataclass(frozen=True)
class StartupCheck:
    """What the checks found: every problem (one line each), and the line saying there is nothing to do (a
    `--resume` of a finished sweep) when that is so."""

    problems: tuple[str, ...] = ()
    nothing_to_do: str | None = None


def preflight(cfg: SweepConfig, cluster: bool, resume: bool = False, grow: bool = False) -> str | None:
    """`check_all`, its problems raised as one ConfigError line; else the nothing-to-do line or None."""
    found = check_all(cfg, cluster, resume, grow)
    if found.problems:
        raise ConfigError("; ".join(found.problems))
    return found.nothing_to_do


def check_all(cfg: SweepConfig, cluster: bool, resume: bool = False, grow: bool = False) -> StartupCheck:
    """Every check of the sweep before its first write; every problem found (the environment is checked only
    when the values hold)."""
    found: list[str] = []
    _collect(found, None, check_config, cfg, cluster)
    if resume:
        _collect(found, None, check_resume_search_space, cfg)
    for field, uri in (
        ("tracking.uri", cfg.tracking.uri),
        ("search.storage", cfg.search.storage),
        ("storage_path", cfg.storage_path),
    ):
        _collect(found, None, check_uri_syntax, field, uri or "")
    if found:
        return StartupCheck(tuple(found))
    data_ok = True
    if not cluster:  # this machine's data folder and resources: cheap, read here
        data_ok, _ = _collect(found, "run.data.root", check_local_data, cfg)
        _collect(found, None, check_local_resources, cfg)
    else:  # the shared data volume, else the staged copy the trials sync from: refused here, before any trial
        data_ok, _ = _collect(found, "run.data.root", check_cluster_data, cfg)
    return _environment(cfg, cluster, resume, grow, found, data_ok)


def _collect(found: list[str], field: str | None, check: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """Run one check; its ConfigError (or, under `field`, a file-system error) joins `found`.
    Returns (passed, what the check returned)."""
    try:
        if field is None:
            return True, check(*args)
        with fs_errors(field):
            return True, check(*args)
    except ConfigError as exc:
        found.append(str(exc))
        return False, None


def _same_sqlite_folder(tracking_uri: str, storage_url: str) -> bool:
    """Whether the MLflow store and the Optuna study are SQLite files in one folder."""
    prefix = "sqlite:///"
    if not (tracking_uri.startswith(prefix) and storage_url.startswith(prefix)):
        return False
    return Path(tracking_uri.removeprefix(prefix)).parent == Path(storage_url.removeprefix(prefix)).parent


def _environment(
    cfg: SweepConfig, cluster: bool, resume: bool, grow: bool, found: list[str], data_ok: bool
) -> StartupCheck:
    """The checks that reach beyond the config: the model/data check started first in a child process (it loads
    torch while the others run; not when the data folder was refused), then storage, cluster, servers and
    stores, then the model/data check's answer and the disk check it feeds."""
    from sweeps.checks import model_fit

    # a data folder already refused: no child (its torch import, ~2 s of CPU) for a check whose answer goes unused
    fit = model_fit.start(cfg, cluster) if data_ok else None
    try:
        storage_ok, _ = _collect(found, "storage_path", check_storage, cfg.storage_path or "", cluster)
        if cluster:
            from sweeps.integrations.ray.cluster import check_cluster, connect_cluster, plugin_runtime_env

            joined, _ = _collect(found, None, connect_cluster, plugin_runtime_env(cfg.plugins))
            if not joined:  # the servers' checks would wait for Services of a cluster this driver cannot reach
                return StartupCheck(tuple(found))
        tracking_at = len(found)
        tracking_ok, _ = _collect(found, "tracking.uri", check_tracking, cfg.tracking.uri or "", cluster)
        if cluster:
            loopback_tracking = bool(cfg.tracking.uri) and is_loopback(uri_host(cfg.tracking.uri or ""))
            _collect(found, None, check_cluster, cfg, loopback_tracking)
        storage = cfg.search.storage or "memory"
        if tracking_ok or not _same_sqlite_folder(cfg.tracking.uri or "", storage):
            _collect(found, "search.storage", check_study_storage, storage, cluster)
        else:  # the study's SQLite file sits in the store's folder, already refused: said once, not twice
            found[tracking_at] += " (the folder of search.storage's study too)"
        if cfg.storage_path and "://" in cfg.storage_path and not cfg.storage_path.startswith("file://"):
            _collect(found, None, probe_remote_storage, cfg.storage_path)

        def stores() -> str | None:
            """Name taken, nothing to resume; refused first while a launch of this name runs (its lock file)."""
            from sweeps.integrations.mlflow.existing import check_store
            from sweeps.sweep_lock import refused_while_running

            with refused_while_running(cfg.storage_path, cfg.name):
                return check_store(cfg, resume, grow)

        nothing_to_do = None
        if tracking_ok:
            _, nothing_to_do = _collect(found, "tracking.uri", stores)
        if nothing_to_do and not found:
            return StartupCheck(nothing_to_do=nothing_to_do)
        if not found:
            # The sweep will run: its driver's modules (Ray Tune, MLflow; ~1.7 s) load while the child loads torch.
            import sweeps.service  # noqa: F401
        if fit is not None:  # a missing data folder is one line, not a second one from the model/data check
            fit_ok, params = _collect(found, None, fit.result)
            local = not cluster and "://" not in (cfg.storage_path or "://")
            if fit_ok and storage_ok and local and params is not None:
                _collect(found, None, check_disk_fits, cfg, params, fit.trainable)
    finally:
        if fit is not None:
            fit.cancel()
    if not found and cfg.search.num_samples > cfg.resources.warn_trials:
        print(
            f"warning: {cfg.search.num_samples} trials (more than resources.warn_trials = "
            f"{cfg.resources.warn_trials}): the stores, the report and selection grow with the trial count",
            file=sys.stderr,
        )
    return StartupCheck(tuple(found))

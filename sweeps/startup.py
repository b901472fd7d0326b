"""Everything before a sweep's first write, in order (cheap checks first): the pure checks of sweeps/checks/,
then for `--cluster` the connection to the cluster and its resources (integrations/ray/cluster.py), the stores
(integrations/mlflow/existing.py: name taken, nothing to resume) and the model/data and size checks.

Raises ConfigError (one line) on the first problem; writes nothing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from sweeps.checks.paths import check_storage, fs_errors, probe_remote_storage
from sweeps.checks.preflight import check_disk_fits, check_local_data, check_local_resources
from sweeps.checks.servers import check_study_storage, check_tracking, check_uri_syntax, is_loopback, uri_host

if TYPE_CHECKING:
    from sweeps.checks import model_fit
    from sweeps.config import SweepConfig


def preflight(cfg: SweepConfig, cluster: bool, resume: bool = False, grow: bool = False) -> str | None:
    """Check the environment before anything is written (raises ConfigError, one line).

    Returns a one-line message when there is nothing to do (`--resume` of a sweep that already
    finished and registered its champion, and `grow` does not ask for more trials than it has), else None.
    """
    for field, uri in (
        ("tracking.uri", cfg.tracking.uri),
        ("search.storage", cfg.search.storage),
        ("storage_path", cfg.storage_path),
    ):
        check_uri_syntax(field, uri or "")
    from sweeps.checks import model_fit

    fit = model_fit.start(cfg, cluster)  # torch loads in a child process while the other checks run
    try:
        return _checks(cfg, cluster, resume, grow, fit)
    finally:
        fit.cancel()


def _checks(cfg: SweepConfig, cluster: bool, resume: bool, grow: bool, fit: model_fit.ModelFitCheck) -> str | None:
    loopback_tracking = bool(cfg.tracking.uri) and is_loopback(uri_host(cfg.tracking.uri or ""))
    with fs_errors("storage_path"):
        check_storage(cfg.storage_path or "", cluster)
    if cluster:
        from sweeps.integrations.ray.cluster import check_cluster, connect_cluster, plugin_runtime_env

        connect_cluster(plugin_runtime_env(cfg.plugins))
        with fs_errors("tracking.uri"):
            check_tracking(cfg.tracking.uri or "", cluster)
        check_cluster(cfg, loopback_tracking)
    else:
        with fs_errors("tracking.uri"):
            check_tracking(cfg.tracking.uri or "", cluster)
        with fs_errors("run.data.root"):
            check_local_data(cfg)
        check_local_resources(cfg)
    with fs_errors("search.storage"):
        check_study_storage(cfg.search.storage or "memory", cluster)
    if cfg.storage_path and "://" in cfg.storage_path and not cfg.storage_path.startswith("file://"):
        probe_remote_storage(cfg.storage_path)
    from sweeps.integrations.mlflow.existing import check_store
    from sweeps.sweep_lock import refused_while_running

    # a launch of this name that is running now is named (reads its lock file only)
    with fs_errors("tracking.uri"), refused_while_running(cfg.storage_path, cfg.name):
        nothing_to_do = check_store(cfg, resume, grow)
    if nothing_to_do:
        return nothing_to_do
    # The sweep will run: its driver's modules (Ray Tune, MLflow; ~1.7 s) load while the child still loads torch.
    import sweeps.service  # noqa: F401

    params = fit.result()
    if not cluster and params is not None and cfg.storage_path and "://" not in cfg.storage_path:
        check_disk_fits(cfg, params)
    if cfg.search.num_samples > cfg.resources.warn_trials:
        print(
            f"warning: {cfg.search.num_samples} trials (more than resources.warn_trials = "
            f"{cfg.resources.warn_trials}): the stores, the report and selection grow with the trial count",
            file=sys.stderr,
        )
    return None

"""The sweep's start-up where it writes: Ray started (or the cluster joined) while, in a thread beside it, the
MLflow experiment and the sweep's parent run are opened (sweeps/start_steps.py's "ray_start" and "store").

A failure of either leaves the runs closed, and a stop signal (Ctrl+C, SIGTERM: KeyboardInterrupt) at any moment
from here to the sweep's end leaves no run RUNNING: Ray's start and its session record are one held section
(the stop is raised once the session can be stopped), the parent run's opening is waited for, and what no
phase's own guard saw is KILLED on the way out (`started`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sweeps.config import SweepConfig
from sweeps.integrations.mlflow.existing import started_registered_model
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.sweep_runs import open_parent, runs_closed_on_failure
from sweeps.integrations.mlflow.tracking import source_tags
from sweeps.integrations.ray.tuner import connect_ray, grown_to, should_restore
from sweeps.start_steps import SIGNALS, Startup, trace


@dataclass(frozen=True)
class Opened:
    experiment_id: str
    parent_id: str
    restoring: bool
    grown: list[int]
    sources: dict[str, str]
    registered_model: str  # the name the sweep began registering under, kept on --resume (existing.py)


@dataclass(frozen=True)
class Run:
    """What start-up made: the sweep's config (with the registered model's name it keeps), its store, Ray
    experiment path, parent run and the local Ray session's record (None on a cluster)."""

    cfg: SweepConfig
    store: MlflowStore
    exp_path: str
    opened: Opened
    session: Path | None
    owned: bool  # this driver started or joined Ray itself (a Ray the caller started stays up)


@contextmanager
def started(cfg: SweepConfig, cluster: bool, resume: bool, verbose: bool, startup: Startup) -> Iterator[Run]:
    """Ray started (its processes boot on the other core) while the MLflow store is set up and the parent run
    opened; yields the started sweep, whose runs a stop signal anywhere inside leaves KILLED."""
    from sweeps.integrations.ray.session import reap_stale
    from sweeps.integrations.ray.session import track as track_session

    assert cfg.tracking.uri and cfg.storage_path
    exp_path = f"{cfg.storage_path.rstrip('/')}/{cfg.name}"
    store = MlflowStore(cfg.tracking.uri, outage_timeout_s=cfg.tracking.outage_timeout_s)
    opened: Opened | None = None
    try:
        owned = not ray_connected()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-setup") as pool:
            opening = pool.submit(startup.run, "store", open_tracking, cfg, store, exp_path, resume)
            try:
                with startup.step("ray_start"):
                    if not cluster:  # a SIGKILLed driver's local Ray processes: stopped before this one starts its own
                        reap_stale(cfg.storage_path)
                    # Ray's start and its record are one: a stop during them is raised once Ray can be stopped
                    with SIGNALS.held():
                        session_dir = connect_ray(cluster, cfg.plugins)
                        session = None
                        if session_dir:  # stopped at exit; recorded for the next sweep if this driver is killed
                            session = track_session(cfg.storage_path, session_dir, quiet=not verbose)
                            trace(f"ray_session {session_dir}")
                opened = opening.result()
            except BaseException:
                with SIGNALS.held():  # a second Ctrl+C does not cut the runs' closing short
                    opened = opening.result()  # (its own error, if any, is raised here instead)
                    with runs_closed_on_failure(store, opened.experiment_id, opened.parent_id, cfg.name):
                        raise
        if opened.registered_model != cfg.tracking.registered_model:  # a resumed sweep keeps its model's name
            cfg = cfg.model_copy(
                update={"tracking": cfg.tracking.model_copy(update={"registered_model": opened.registered_model})}
            )
        yield Run(cfg, store, exp_path, opened, session, owned)
    except KeyboardInterrupt:
        if opened is not None:  # between the phases' own guards (their runs_closed_on_failure) too
            with SIGNALS.held():
                killed_if_running(store, opened, cfg.name)
        raise


def killed_if_running(store: MlflowStore, opened: Opened, sweep: str) -> None:
    """The sweep's runs KILLED when its parent run is still RUNNING (a stop no phase's guard saw)."""
    with contextlib.suppress(Exception):  # the stop is what is reported (exit 130), not a store's error
        if store.get_run(opened.parent_id).info.status == "RUNNING":
            store.close_open_runs(opened.experiment_id, sweep, "KILLED")
            store.terminate(opened.parent_id, "KILLED")


def open_tracking(cfg: SweepConfig, store: MlflowStore, exp_path: str, resume: bool) -> Opened:
    """The experiment (the store created or migrated if new) and the sweep's parent run, opened or reopened."""
    experiment_id = store.ensure_experiment(cfg.tracking.experiment)
    existing = store.parent_run(experiment_id, cfg.name)
    restoring = should_restore(cfg, exp_path, resume, exists=existing is not None)
    sources = source_tags()
    parent_id = open_parent(cfg, store, experiment_id, sources, new=existing is None)
    model = started_registered_model(cfg, existing)
    return Opened(experiment_id, parent_id, restoring, grown_to(existing), sources, model)


def ray_connected() -> bool:
    """Whether this process is already connected to Ray (someone else started or joined it)."""
    import ray

    return bool(ray.is_initialized())

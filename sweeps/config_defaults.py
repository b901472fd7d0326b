"""What a sweep config leaves open, filled in before the sweep starts: the MLflow store and Tune's storage in the
working directory (locally), the Optuna study's storage, the registered model's name after the data."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from calib_core.config import ConfigError
from sweeps.config import SweepConfig


def default_tracking_uri(workdir: str | Path = ".") -> str:
    """A SQLite store in the working directory, with an absolute path (trials run elsewhere)."""
    return f"sqlite:///{(Path(workdir).resolve() / 'mlflow.db')}"


STUDY_STORAGE_ENV = "CALIB_OPTUNA_STORAGE"


def default_study_storage(tracking_uri: str | None) -> str:
    """The Optuna storage when `search.storage` is not set: $CALIB_OPTUNA_STORAGE (e.g. the cluster's
    PostgreSQL), else `optuna.db` in the folder of a SQLite MLflow store, else 'memory'."""
    env = os.environ.get(STUDY_STORAGE_ENV, "").strip()
    if env:
        return env
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return f"sqlite:///{db.parent / 'optuna.db'}"
    return "memory"


def default_registered_model(data: Any) -> str:
    """The registered model's name when `tracking.registered_model` is left unset: `calibrated-<dataset>`, with the
    file's or folder's name for the file formats (`calibrated-table-patients` for run.data.path patients.csv)."""
    name = str(data.name)
    path = getattr(data, "path", None)
    if path:
        stem = Path(str(path)).name
        for suffix in (".csv", ".parquet", ".pq", ".npz"):
            stem = stem.removesuffix(suffix)
        name = f"{name}-{stem}"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "data"
    return f"calibrated-{slug}"[:200]


def with_defaults(cfg: SweepConfig, cluster: bool, workdir: str | Path = ".") -> SweepConfig:
    """Fill what the config leaves open, made absolute: locally the MLflow store `workdir/mlflow.db`,
    Tune's storage `workdir/ray_results`; the Optuna storage (default_study_storage); the registered model's name
    after the data (default_registered_model) when tracking.registered_model is not set."""
    updates: dict[str, Any] = {}
    tracking = cfg.tracking
    if "registered_model" not in tracking.model_fields_set:
        tracking = tracking.model_copy(update={"registered_model": default_registered_model(cfg.run.data)})
        tracking._named_after_data = True
        updates["tracking"] = tracking
    if tracking.uri is None and not cluster:
        tracking = tracking.model_copy(update={"uri": default_tracking_uri(workdir)})
        updates["tracking"] = tracking
    if cfg.storage_path is None and not cluster:
        updates["storage_path"] = str(Path(workdir).resolve() / "ray_results")
    elif cfg.storage_path and "://" not in cfg.storage_path:
        updates["storage_path"] = str((Path(workdir) / Path(cfg.storage_path).expanduser()).resolve())
    if cfg.search.storage is None:
        url = default_study_storage(tracking.uri)
        search = cfg.search.model_copy()
        try:
            search.storage = url  # validated: the environment variable may hold anything
        except ValidationError:
            raise ConfigError(
                f"{STUDY_STORAGE_ENV}: {url!r} must be sqlite:////ABS/PATH.db, postgresql://..., "
                "mysql://... or 'memory'"
            ) from None
        updates["search"] = search
    return cfg.model_copy(update=updates) if updates else cfg

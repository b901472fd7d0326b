"""What a sweep config leaves open, filled in before the sweep starts: the MLflow store and Tune's storage in the
working directory (locally), the Optuna study's storage, the registered model's name after the data."""

from __future__ import annotations

import hashlib
import json
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


# Hex characters of the data digest in a file-format dataset's default model name (32 bits: two of one user's
# datasets sharing it is a one-in-four-billion event).
DIGEST_CHARS = 8
CHUNK_BYTES = 1 << 20
# Files in a folder hashed by content, not size alone: x.npy and y.npy of two datasets often have the same size.
CONTENT_SUFFIXES = (".npy", ".npz")
# The file-format settings that say how inputs are presented, not which task is learnt: they stay out of the name.
PRESENTATION_FIELDS = ("path", "normalize", "image_size", "image_mode", "categorical", "missing")


def _file_digest(h: Any, path: Path) -> None:
    """Feed a file's bytes into `h`, streamed (never the whole file in memory)."""
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)


def _folder_digest(h: Any, root: Path) -> None:
    """Feed a folder's listing into `h`: every file's relative path and size (hidden ones skipped, as the loaders
    do), and the bytes of array files; an image folder is not read, its listing says which images are where."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(f for f in filenames if not f.startswith(".")):
            p = Path(dirpath) / name
            h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
            if p.suffix.lower() in CONTENT_SUFFIXES:
                _file_digest(h, p)


def data_digest(data: Any) -> str | None:
    """A short digest of what defines a file-format dataset's task: the file's bytes (a folder: its listing with
    sizes, array files' bytes) and the settings that pick the task (label column, feature columns, ...), never its
    location; None without a path, or when the path cannot be read here (the data checks name it later)."""
    from calib_core.config import FILE_FIELDS, DataConfig

    path = getattr(data, "path", None)
    if not path:
        return None
    h = hashlib.blake2b(digest_size=16)
    fields = [f for f in FILE_FIELDS.get(str(data.name), ()) if f not in PRESENTATION_FIELDS]
    # only values other than the default: a setting added later leaves the names of earlier sweeps as they were
    task = {f: getattr(data, f) for f in fields if getattr(data, f) != DataConfig.model_fields[f].default}
    h.update(json.dumps({"format": str(data.name), **task}, sort_keys=True, default=str).encode())
    try:
        p = Path(str(path))
        if p.is_dir():
            _folder_digest(h, p)
        else:
            _file_digest(h, p)
    except OSError:
        return None
    return h.hexdigest()[:DIGEST_CHARS]


def default_registered_model(data: Any) -> str:
    """The registered model's name when `tracking.registered_model` is left unset: `calibrated-<dataset>` for the
    built-in datasets; for the file formats the file's or folder's name and a digest of its content
    (`calibrated-table-patients-<8 hex>` for run.data.path patients.csv, data_digest), so two different files
    called train.csv never share a name while the same data, wherever it lies, keeps its own."""
    name = str(data.name)
    path = getattr(data, "path", None)
    if path:
        stem = Path(str(path)).name
        for suffix in (".csv", ".parquet", ".pq", ".npz"):
            stem = stem.removesuffix(suffix)
        name = f"{name}-{stem}"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "data"
    digest = data_digest(data)
    tail = f"-{digest}" if digest else ""
    return f"calibrated-{slug}"[: 200 - len(tail)] + tail


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

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


def _listing(root: Path) -> list[Path]:
    """A folder's files in the digest's order (hidden ones skipped, as the loaders do)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files += [Path(dirpath) / name for name in sorted(f for f in filenames if not f.startswith("."))]
    return files


def _folder_digest(h: Any, root: Path, files: list[Path]) -> None:
    """Feed a folder's listing into `h`: every file's relative path and size, and the bytes of array files; an
    image folder is not read, its listing says which images are where."""
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())
        if p.suffix.lower() in CONTENT_SUFFIXES:
            _file_digest(h, p)


def _too_large_to_load(data: Any, p: Path) -> bool:
    """Whether the file is too large for memory by its size alone, at the least its loader needs (a CSV six times
    its size, any other file its size): its bytes are not worth hashing then (a 24 GiB CSV took 83 s), and the data
    check refuses it in one line. Reads no header and imports no torch (the config step stays light)."""
    from calib_core.memory import CSV_MEMORY_FACTOR, available_memory

    if not p.is_file():
        return False
    factor = CSV_MEMORY_FACTOR if str(data.name) == "table" and p.suffix.lower() == ".csv" else 1
    return p.stat().st_size * factor > available_memory()


def _stat_key(task: dict[str, Any], p: Path, files: list[Path] | None) -> str:
    """What the digest is cached under: the task settings and the path's (or every listed file's) size, change
    time, inode and device, as git's index keeps them; any rewrite of the data changes it."""

    def stat(q: Path) -> list[int]:
        st = q.stat()
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]

    entries = [[str(q.relative_to(p)), *stat(q)] for q in files] if files is not None else [stat(p)]
    text = json.dumps({"v": 1, "chars": DIGEST_CHARS, "task": task, "path": str(p.resolve()), "entries": entries},
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cached_digest(key: str, compute: Any) -> str:
    """The digest kept under `key` in the cache folder (calib_core/cache_dir.py, `data-digest/`), else computed
    and kept; an unwritable or absent cache only costs the computation."""
    from calib_core.cache_dir import cache_root, write_whole

    root = cache_root()
    path = root / "data-digest" / key if root is not None else None
    if path is not None:
        try:
            kept = path.read_text().strip()
            if re.fullmatch(rf"[0-9a-f]{{{DIGEST_CHARS}}}", kept):
                return kept
        except OSError:
            pass
    digest: str = compute()
    if path is not None:
        try:
            write_whole(path, lambda f: f.write(digest.encode()))
        except OSError:
            pass
    return digest


def data_digest(data: Any) -> str | None:
    """A short digest of what defines a file-format dataset's task: the file's bytes (a folder: its listing with
    sizes, array files' bytes) and the settings that pick the task (label column, feature columns, ...), never its
    location; None without a path, when the path cannot be read here or when the file is too large for memory by
    its size (the data checks name the problem later). Kept in the cache under the files' stat (`_stat_key`): a
    launch on data already named reads no byte of it."""
    from calib_core.config import FILE_FIELDS, DataConfig

    path = getattr(data, "path", None)
    if not path:
        return None
    fields = [f for f in FILE_FIELDS.get(str(data.name), ()) if f not in PRESENTATION_FIELDS]
    # only values other than the default: a setting added later leaves the names of earlier sweeps as they were
    task = {f: getattr(data, f) for f in fields if getattr(data, f) != DataConfig.model_fields[f].default}
    head = json.dumps({"format": str(data.name), **task}, sort_keys=True, default=str).encode()
    try:
        p = Path(str(path))
        files = _listing(p) if p.is_dir() else None
        if _too_large_to_load(data, p):
            return None

        def compute() -> str:
            h = hashlib.blake2b(digest_size=16)
            h.update(head)
            if files is not None:
                _folder_digest(h, p, files)
            else:
                _file_digest(h, p)
            return h.hexdigest()[:DIGEST_CHARS]

        return _cached_digest(_stat_key(task | {"format": str(data.name)}, p, files), compute)
    except OSError:
        return None


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

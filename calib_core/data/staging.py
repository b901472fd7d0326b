"""Datasets staged once into the object store (or a shared folder), then synced into a data root.

A cluster's workers reach no public address (deploy/README.md, "Stage the datasets"): a platform engineer
runs `make stage-data DATASET=cifar10 DEST=s3://bucket/datasets` (calib_core/data/stage.py) from a machine
with internet access, which downloads the dataset with this project's own torchvision loaders, checks the
official md5 sums, and uploads torchvision's on-disk files to `<DEST>/<name>/` with a manifest
(`calib-manifest.json`: every file's path, size and sha256), written last so that a manifest means a complete
copy. In the cluster `CALIB_DATASETS_URI` (ConfigMap ray-env) names DEST; a trial whose files are missing under
`data.root` syncs them from there (under the data root's download lock, so one trial copies and the others
wait), each file written under a temporary name and renamed only once its size and sha256 match the manifest.

Stores: anything pyarrow.fs opens from a URI (s3://, gs://, file://) or a plain local folder. S3 settings come
from the environment as for Ray Tune's storage (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MANIFEST = "calib-manifest.json"
SOURCE_ENV = "CALIB_DATASETS_URI"  # where the cluster's staged datasets live (<uri>/<name>/...)
STAGE_STEP = "make stage-data DATASET={name} DEST={dest}"  # the documented step, named by every refusal
CHUNK = 1 << 20


def staged_source() -> str | None:
    """The staged datasets' location from the environment (CALIB_DATASETS_URI), or None."""
    return os.environ.get(SOURCE_ENV) or None


def dataset_uri(source: str, name: str) -> str:
    """Where dataset `name` lies under a staging location."""
    return f"{source.rstrip('/')}/{name}"


def stage_step(name: str, dest: str | None) -> str:
    """The staging command a refusal names."""
    return STAGE_STEP.format(name=name, dest=dest or "s3://<bucket>/datasets")


def open_store(uri: str) -> tuple[Any, str]:
    """(pyarrow file system, path) for a URI or a local folder."""
    import pyarrow.fs as pafs

    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute())


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a local file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def build_manifest(name: str, root: Path, files: Sequence[str], official_md5_checked: bool) -> dict[str, Any]:
    """The manifest of dataset `name`'s `files` (every file its loader reads, relative to `root`)."""
    entries = []
    for rel in files:
        size, sha = file_digest(root / rel)
        entries.append({"path": rel, "size": size, "sha256": sha})
    return {"format": 1, "dataset": name, "official_md5_checked": official_md5_checked, "files": entries}


def manifest_problem(name: str, manifest: Any, files: Sequence[str]) -> str | None:
    """Why `manifest` is not a complete manifest of dataset `name`, whose loader reads `files` (pure), else None."""
    from calib_core.data.fetch import some

    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return f"{MANIFEST} is not a manifest (no 'files' list)"
    if manifest.get("dataset") != name:
        return f"{MANIFEST} describes {manifest.get('dataset')!r}, not {name!r}"
    listed = {
        f.get("path")
        for f in manifest["files"]
        if isinstance(f, dict) and isinstance(f.get("size"), int) and isinstance(f.get("sha256"), str)
    }
    lacking = [rel for rel in files if rel not in listed]
    return f"{MANIFEST} lacks {some(lacking)}" if lacking else None


def read_manifest(source: str, name: str, files: Sequence[str]) -> dict[str, Any]:
    """The staged manifest of `name` (its loader reads `files`) under `source`, else one line: FileNotFoundError
    when there is none, ValueError when it is not a complete manifest, OSError when the store cannot be read (no
    access, no connection)."""
    fs, base = open_store(dataset_uri(source, name))
    try:
        with fs.open_input_stream(f"{base}/{MANIFEST}") as f:
            text = f.read().decode()
    except FileNotFoundError:
        raise FileNotFoundError(f"no {MANIFEST} at {dataset_uri(source, name)}") from None
    except OSError as exc:  # pyarrow: no access (ACCESS_DENIED), no connection (NETWORK_CONNECTION), ...
        reason = " ".join(str(exc).split())[:160]
        raise OSError(f"cannot read {dataset_uri(source, name)}/{MANIFEST} ({reason})") from None
    try:
        manifest = json.loads(text)
    except ValueError:
        raise ValueError(f"{dataset_uri(source, name)}/{MANIFEST} is not JSON") from None
    problem = manifest_problem(name, manifest, files)
    if problem:
        raise ValueError(f"{dataset_uri(source, name)}: {problem}")
    return dict(manifest)


def _copy_verified(fs: Any, src: str, dst: Path, size: int, sha256: str) -> None:
    """Copy one object to `dst` through a temporary file, renamed only when size and sha256 match."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    h, got = hashlib.sha256(), 0
    try:
        with fs.open_input_stream(src) as inp, open(part, "wb") as out:
            while chunk := inp.read(CHUNK):
                h.update(chunk)
                got += len(chunk)
                out.write(chunk)
        if got != size or h.hexdigest() != sha256:
            raise ValueError(
                f"{src}: {got} bytes, sha256 {h.hexdigest()[:12]}... but the manifest says {size} bytes, "
                f"{sha256[:12]}...; stage the dataset again"
            )
        os.replace(part, dst)
    finally:
        part.unlink(missing_ok=True)


def sync(name: str, source: str, root: Path, files: Sequence[str]) -> list[str]:
    """Copy dataset `name` (its loader reads `files`) from its staged copy into `root`, verified against the
    manifest; the paths copied. A file already there with the manifest's size and sha256 is kept."""
    manifest = read_manifest(source, name, files)
    fs, base = open_store(dataset_uri(source, name))
    copied = []
    for entry in manifest["files"]:
        dst = root / entry["path"]
        if dst.is_file() and file_digest(dst) == (entry["size"], entry["sha256"]):
            continue
        _copy_verified(fs, f"{base}/{entry['path']}", dst, entry["size"], entry["sha256"])
        copied.append(entry["path"])
    return copied

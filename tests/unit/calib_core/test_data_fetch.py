"""Concurrent downloads into one data root: one download, everyone else waits and reads it."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.data.fetch import LOCK_NAME, ensure_files
from calib_core.data.torchvision_sets import SPECS

try:
    from concurrency import run_on_threads
    from fixtures_fabricate import fabricate_cifar10
except ImportError:  # tests/ imported as a package
    from tests.concurrency import run_on_threads
    from tests.fixtures_fabricate import fabricate_cifar10


def _slow_download(root: Path, log: Path) -> None:
    """A fake download: records itself, writes half the file, waits, then finishes it."""
    with open(log, "a") as fh:
        fh.write("download\n")
    part = root / "data.bin"
    part.write_bytes(b"half")
    time.sleep(0.5)
    part.write_bytes(b"half" * 2)
    (root / "done").write_text("ok")


def _missing(root: Path) -> list[Path]:
    return [p for p in (root / "data.bin", root / "done") if not p.is_file()]


def _fetch_in_process(root: str, log: str) -> bytes:
    r = Path(root)
    ensure_files(
        "fake",
        r,
        lambda: _missing(r),
        lambda: _slow_download(r, Path(log)),
        allowed=True,
        not_found=lambda paths: "missing",
    )
    return (r / "data.bin").read_bytes()


def test_processes_download_once_and_all_see_complete_files(tmp_path):
    root, log = tmp_path / "data", tmp_path / "log.txt"
    ctx = mp.get_context("spawn")  # a fresh interpreter each, as Ray workers are
    with ctx.Pool(3) as pool:
        results = pool.starmap(_fetch_in_process, [(str(root), str(log))] * 3)
    assert log.read_text().splitlines() == ["download"]
    assert results == [b"halfhalf"] * 3
    assert (root / LOCK_NAME).exists()


def test_threads_download_once(tmp_path):
    root, log = tmp_path / "data", tmp_path / "log.txt"
    out = run_on_threads(lambda: _fetch_in_process(str(root), str(log)), 4)
    assert log.read_text().splitlines() == ["download"]
    assert out == [b"halfhalf"] * 4


def test_failed_download_releases_the_lock_for_the_next_try(tmp_path):
    root = tmp_path / "data"

    def broken():
        raise OSError("connection reset")

    with pytest.raises(RuntimeError, match=r"fake: download to .*data failed: connection reset"):
        ensure_files("fake", root, lambda: _missing(root), broken, allowed=True, not_found=lambda p: "missing")
    log = tmp_path / "log.txt"
    ensure_files(
        "fake",
        root,
        lambda: _missing(root),
        lambda: _slow_download(root, log),
        allowed=True,
        not_found=lambda p: "missing",
    )
    assert log.read_text().splitlines() == ["download"] and not _missing(root)


def test_download_that_leaves_files_missing_names_them(tmp_path):
    root = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match=r"still missing after download: .*data\.bin"):
        ensure_files("fake", root, lambda: _missing(root), lambda: None, allowed=True, not_found=lambda p: "x")


def test_not_allowed_raises_without_creating_anything(tmp_path):
    root = tmp_path / "absent"
    with pytest.raises(FileNotFoundError, match="^no files here$"):
        ensure_files(
            "fake", root, lambda: _missing(root), lambda: None, allowed=False, not_found=lambda p: "no files here"
        )
    assert not root.exists()


def test_cifar_trials_starting_together_download_once(tmp_path, monkeypatch):
    spec = SPECS["cifar10"]
    calls: list[bool] = []
    read = spec.read

    def fake_read(root: Path, download: bool):
        if download:  # stands in for torchvision's download into root
            calls.append(True)
            time.sleep(0.3)
            fabricate_cifar10(root)
            return None
        return read(root, False)

    monkeypatch.setitem(SPECS, "cifar10", dataclasses.replace(spec, read=fake_read))
    cfg = DataConfig(name="cifar10", root=str(tmp_path), download=True, verify_checksums=False)
    sizes = run_on_threads(lambda: len(load_dataset(cfg, 0).train), 3)
    assert len(calls) == 1
    assert len(set(sizes)) == 1 and sizes[0] > 0

"""MNIST-1D's disk cache: what a trial reads from it equals what the package generates, and a missing, corrupt or
unwritable cache only means generating again."""

from __future__ import annotations

import random

import numpy as np
import pytest

from calib_core.data import mnist1d as m


def _package(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: the mnist1d package called directly, as its README shows."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = num_samples, seed, 1.0
    data = make_dataset(args)
    return np.asarray(data["x"], dtype=np.float32), np.asarray(data["y"], dtype=np.int64)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The disk cache in a fresh folder; the in-process cache empty before and after."""
    monkeypatch.setenv(m.CACHE_ENV, str(tmp_path / "cache"))
    m._generate_cached.cache_clear()
    yield tmp_path / "cache"
    m._generate_cached.cache_clear()


def _no_generating(monkeypatch) -> None:
    import mnist1d.data

    def refuse(*_a, **_k):
        raise AssertionError("generated although the disk cache held the arrays")

    monkeypatch.setattr(mnist1d.data, "make_dataset", refuse)


def test_a_second_process_reads_what_the_first_generated(cache, monkeypatch):
    ref_x, ref_y = _package(300, 5)
    x, y = m.generate_mnist1d(300, 5)
    assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y)
    files = list(cache.rglob("*.npz"))
    assert files == [m.cache_file(300, 5)] and "n300-seed5-" in files[0].name
    m._generate_cached.cache_clear()  # as a new process: only the disk holds it
    _no_generating(monkeypatch)
    py_state, np_state = random.getstate(), np.random.get_state()
    x2, y2 = m.generate_mnist1d(300, 5)
    assert np.array_equal(x2, ref_x) and np.array_equal(y2, ref_y) and x2.dtype == np.float32
    assert random.getstate() == py_state and all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state))
    assert m.cache_file(300, 6) != m.cache_file(300, 5) != m.cache_file(310, 5)


@pytest.mark.parametrize("damage", ["one value changed", "truncated", "not an npz"])
def test_a_damaged_file_is_generated_again_and_replaced(cache, damage):
    ref_x, ref_y = _package(200, 1)
    m.generate_mnist1d(200, 1)
    path = m.cache_file(200, 1)
    if damage == "one value changed":
        with np.load(path) as f:
            x, y, sha = f["x"].copy(), f["y"], f["sha256"]
        x[3, 7] += 1.0
        np.savez(path, x=x, y=y, sha256=sha)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    else:
        path.write_text("hello")
    m._generate_cached.cache_clear()
    x2, y2 = m.generate_mnist1d(200, 1)
    assert np.array_equal(x2, ref_x) and np.array_equal(y2, ref_y)
    assert m._read_cache(path) is not None  # written again, whole
    assert list(path.parent.glob("*.tmp")) == []


def test_an_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(m.CACHE_ENV, str(blocker))  # its "mnist1d" folder cannot be made
    m._generate_cached.cache_clear()
    try:
        x, y = m.generate_mnist1d(100, 2)
    finally:
        m._generate_cached.cache_clear()
    ref_x, ref_y = _package(100, 2)
    assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y)


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(m.CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    m._generate_cached.cache_clear()
    try:
        m.generate_mnist1d(100, 3)
    finally:
        m._generate_cached.cache_clear()
    assert m.cache_file(100, 3) is None and list(tmp_path.rglob("*")) == []


def test_the_default_folder_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(m.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert m.cache_file(100, 0).parent == tmp_path / "calib-sweeps" / "mnist1d"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert m.cache_file(100, 0).parent == tmp_path / "home" / ".cache" / "calib-sweeps" / "mnist1d"

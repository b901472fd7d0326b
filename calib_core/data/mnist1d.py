"""MNIST-1D (Greydanus 2020), generated procedurally and offline with the `mnist1d` package.

We call `mnist1d.data.make_dataset` with our own arguments (the package defaults, with the
requested `num_samples` and `seed`, and `train_split=1.0` so it returns every sample in one
array); never `get_dataset`, which downloads. Our seeded, stratified split then makes train /
val / test. The package centres and scales the whole array by one global affine map; we then
standardise with the *train* split's mean and std, which undoes that map exactly, so the
result equals standardising the raw signals with train statistics only.

`make_dataset` seeds numpy's and Python's global RNGs; we restore both afterwards.

Generating is slow (the package builds samples one by one: ~0.5 ms each, 4-5 s of CPU for the default 8,000 plus
~1.5 s to import it) and every trial runs in a process of its own, so the arrays are also kept on disk, one `.npz`
per (num_samples, seed, versions of mnist1d, numpy and scipy), in $CALIB_DATA_CACHE (default
$XDG_CACHE_HOME/calib-sweeps, else ~/.cache/calib-sweeps; `off` keeps nothing). A file is used only when the SHA-256
stored in it matches its arrays; anything else (missing, unreadable, corrupt, a read-only disk) means generating
again, silently, as without a cache.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from calib_core.cache_dir import CACHE_ENV as CACHE_ENV  # the variable that moves the cache (tests set it)
from calib_core.cache_dir import cache_root, write_whole
from calib_core.config import DataConfig
from calib_core.data.splits import DataSplits, Split, channel_stats, standardize, train_val_test_indices

DEFAULT_NUM_SAMPLES = 8000
NUM_CLASSES = 10
SEQ_LEN = 40

_log = logging.getLogger(__name__)


def generate_mnist1d(num_samples: int = DEFAULT_NUM_SAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Generate MNIST-1D: (x float32 (M, 40), y int64 (M,)), M = 10 * (num_samples // 10).

    Deterministic in (num_samples, seed); no network access. Results are cached in-process and on disk (the
    module's docstring); callers get copies.
    """
    if num_samples < NUM_CLASSES:
        raise ValueError(f"mnist1d: num_samples must be >= {NUM_CLASSES}, got {num_samples}")
    x, y = _generate_cached(int(num_samples), int(seed))
    return x.copy(), y.copy()


@functools.lru_cache(maxsize=4)
def _generate_cached(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    path = cache_file(num_samples, seed)
    arrays = _read_cache(path) if path is not None else None
    if arrays is None:
        arrays = _generate(num_samples, seed)
        if path is not None:
            _write_cache(path, *arrays)
    for a in arrays:
        a.setflags(write=False)
    return arrays


def cache_file(num_samples: int, seed: int) -> Path | None:
    """Where the generated arrays for (num_samples, seed) are kept on disk; None when $CALIB_DATA_CACHE is `off`."""
    root = cache_root()
    if root is None:
        return None
    versions = "-".join(_version(p) for p in ("mnist1d", "numpy", "scipy"))  # the generator's output depends on them
    return root / "mnist1d" / f"n{num_samples}-seed{seed}-{versions}.npz"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _digest(x: np.ndarray, y: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()


def _read_cache(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The arrays kept at `path`, or None if there are none whose stored digest matches."""
    try:
        with np.load(path, allow_pickle=False) as f:
            x, y, sha = f["x"], f["y"], str(f["sha256"])
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # missing, unreadable, not an npz of ours
        return None
    if x.dtype != np.float32 or y.dtype != np.int64 or x.ndim != 2 or x.shape[0] != y.shape[0] or sha != _digest(x, y):
        _log.debug("mnist1d cache %s does not match its digest; generating again", path)
        return None
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def _write_cache(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Keep the arrays at `path` (written whole, then renamed: a reader never sees half a file); a disk that refuses
    is no error."""
    try:
        write_whole(path, lambda f: np.savez(f, x=x, y=y, sha256=np.array(_digest(x, y))))
    except OSError as exc:
        _log.debug("mnist1d cache not written at %s: %s", path, exc)


def _generate(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D from the package itself (Python's and numpy's global RNG states restored after)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()  # plain dict behind an ObjectView: our own copy
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return np.ascontiguousarray(data["x"], dtype=np.float32), np.ascontiguousarray(data["y"], dtype=np.int64)


def load_mnist1d(cfg: DataConfig, seed: int) -> DataSplits:
    """MNIST-1D generated with `seed`, split (stratified, by `seed`) into train / val / test."""
    num_samples = cfg.num_samples if cfg.num_samples is not None else DEFAULT_NUM_SAMPLES
    x_np, y_np = generate_mnist1d(num_samples, seed)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    tr, va, te = train_val_test_indices(
        len(y), val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction, seed=seed, labels=y
    )
    mean, std = channel_stats(x[tr])
    train, val, test = (Split(standardize(x[idx], mean, std), y[idx]) for idx in (tr, va, te))
    return DataSplits(
        train,
        val,
        test,
        num_classes=NUM_CLASSES,
        input_shape=(SEQ_LEN,),
        name="mnist1d",
        stats={"mean": mean.tolist(), "std": std.tolist()},
    )

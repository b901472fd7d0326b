"""MNIST-1D (Greydanus 2020), generated procedurally and offline with the `mnist1d` package.

We call `mnist1d.data.make_dataset` with our own arguments (the package defaults, with the
requested `num_samples` and `seed`, and `train_split=1.0` so it returns every sample in one
array); never `get_dataset`, which downloads. Our seeded, stratified split then makes train /
val / test. The package centres and scales the whole array by one global affine map; we then
standardise with the *train* split's mean and std, which undoes that map exactly, so the
result equals standardising the raw signals with train statistics only.

`make_dataset` seeds numpy's and Python's global RNGs; we restore both afterwards.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch

from calib_core.config import DataConfig
from calib_core.data.splits import DataSplits, Split, channel_stats, standardize, train_val_test_indices

DEFAULT_NUM_SAMPLES = 8000
NUM_CLASSES = 10
SEQ_LEN = 40


def generate_mnist1d(num_samples: int = DEFAULT_NUM_SAMPLES, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Generate MNIST-1D: (x float32 (M, 40), y int64 (M,)), M = 10 * (num_samples // 10).

    Deterministic in (num_samples, seed); no network access. Results are cached in-process
    (the package builds samples one by one: about 0.5 ms each); callers get copies.
    """
    if num_samples < NUM_CLASSES:
        raise ValueError(f"mnist1d: num_samples must be >= {NUM_CLASSES}, got {num_samples}")
    x, y = _generate_cached(int(num_samples), int(seed))
    return x.copy(), y.copy()


@functools.lru_cache(maxsize=4)
def _generate_cached(num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
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
    x = np.ascontiguousarray(data["x"], dtype=np.float32)
    y = np.ascontiguousarray(data["y"], dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


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

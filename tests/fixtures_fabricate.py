"""Fabricate tiny datasets in the exact on-disk formats torchvision reads.

Each function writes the files under `root` in torchvision's layout and returns the arrays
it wrote, as `Fab(x_train, y_train, x_test, y_test)` with images uint8 (N, C, H, W) and labels
int64 in [0, K) (what a correct loader must give back), in file order.

Formats (as in the official releases):
- CIFAR-10: `cifar-10-batches-py/data_batch_1..5`, `test_batch`: pickled dicts with
  'batch_label', 'labels' (list of int), 'data' (uint8 (n, 3072), rows = R plane, G, B of a
  32x32 image in row-major order), 'filenames'; `batches.meta` with 'label_names',
  'num_cases_per_batch', 'num_vis'.
- CIFAR-100: `cifar-100-python/train`, `test` with 'fine_labels' and 'coarse_labels';
  `meta` with 'fine_label_names' and 'coarse_label_names'.
- SVHN: `train_32x32.mat`, `test_32x32.mat` (MATLAB 5 via scipy.io.savemat): 'X' uint8
  (32, 32, 3, N) (H, W, C, N), 'y' uint8 (N, 1) with 10 standing for the digit 0.
- MNIST / FashionMNIST: `<Name>/raw/{train,t10k}-images-idx3-ubyte` (big-endian magic 2051,
  count, rows, cols, then pixels) and `-labels-idx1-ubyte` (magic 2049, count, labels).

The md5 sums obviously differ from the official ones (see calib_core/data/torchvision_sets.py).
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Fab(NamedTuple):
    x_train: np.ndarray  # uint8 (N, C, H, W)
    y_train: np.ndarray  # int64 (N,)
    x_test: np.ndarray
    y_test: np.ndarray


def _images(rng: np.random.Generator, n: int, c: int, h: int, w: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, c, h, w), dtype=np.uint8)


def _labels(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    # every class present when n >= k, then random: keeps stratified splits meaningful
    y = np.concatenate([np.arange(min(n, k)), rng.integers(0, k, size=max(0, n - k))])
    return rng.permutation(y).astype(np.int64)


def _pickle(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _cifar_rows(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.reshape(len(x), 3 * 32 * 32))  # (N, C, H, W) -> R plane, G, B


def fabricate_cifar10(
    root: Path, *, per_batch: int = 8, n_test: int = 10, seed: int = 0, test_value: int | None = None
) -> Fab:
    """Five train batches of `per_batch` images and a test batch of `n_test`.

    `test_value` (optional) fills every test pixel with one value (to detect test data
    leaking into train statistics).
    """
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-10-batches-py"
    xs, ys = [], []
    for b in range(1, 6):
        x, y = _images(rng, per_batch, 3, 32, 32), _labels(rng, per_batch, 10)
        _pickle(
            base / f"data_batch_{b}",
            {
                "batch_label": f"training batch {b} of 5",
                "labels": [int(v) for v in y],
                "data": _cifar_rows(x),
                "filenames": [f"img_{b}_{i}.png" for i in range(per_batch)],
            },
        )
        xs.append(x)
        ys.append(y)
    x_te, y_te = _images(rng, n_test, 3, 32, 32), _labels(rng, n_test, 10)
    if test_value is not None:
        x_te[:] = test_value
    _pickle(
        base / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": [int(v) for v in y_te],
            "data": _cifar_rows(x_te),
            "filenames": [f"test_{i}.png" for i in range(n_test)],
        },
    )
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    _pickle(base / "batches.meta", {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072})
    return Fab(np.concatenate(xs), np.concatenate(ys), x_te, y_te)


def fabricate_cifar100(root: Path, *, n_train: int = 120, n_test: int = 20, seed: int = 0) -> Fab:
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-100-python"
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        x, y = _images(rng, n, 3, 32, 32), _labels(rng, n, 100)
        _pickle(
            base / split,
            {
                "filenames": [f"{split}_{i}.png" for i in range(n)],
                "batch_label": f"{split}ing batch 1 of 1",
                "fine_labels": [int(v) for v in y],
                "coarse_labels": [int(v) // 5 for v in y],
                "data": _cifar_rows(x),
            },
        )
        out += [x, y]
    _pickle(
        base / "meta",
        {
            "fine_label_names": [f"fine_{i}" for i in range(100)],
            "coarse_label_names": [f"coarse_{i}" for i in range(20)],
        },
    )
    return Fab(*out)


def fabricate_svhn(root: Path, *, n_train: int = 40, n_test: int = 10, seed: int = 0) -> Fab:
    import scipy.io

    rng = np.random.default_rng(seed)
    Path(root).mkdir(parents=True, exist_ok=True)
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        x, y = _images(rng, n, 3, 32, 32), _labels(rng, n, 10)
        mat_y = np.where(y == 0, 10, y).astype(np.uint8).reshape(n, 1)  # SVHN writes 10 for the digit 0
        scipy.io.savemat(
            str(Path(root) / f"{split}_32x32.mat"), {"X": np.ascontiguousarray(x.transpose(2, 3, 1, 0)), "y": mat_y}
        )
        out += [x, y]
    return Fab(*out)


def _write_idx_images(path: Path, x: np.ndarray) -> None:
    n, h, w = x.shape
    path.write_bytes(struct.pack(">IIII", 2051, n, h, w) + np.ascontiguousarray(x, dtype=np.uint8).tobytes())


def _write_idx_labels(path: Path, y: np.ndarray) -> None:
    path.write_bytes(struct.pack(">II", 2049, len(y)) + y.astype(np.uint8).tobytes())


def fabricate_mnist(root: Path, *, name: str = "MNIST", n_train: int = 40, n_test: int = 10, seed: int = 0) -> Fab:
    """`name` is the torchvision class name: "MNIST" or "FashionMNIST"."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = []
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x, y = _images(rng, n, 1, 28, 28), _labels(rng, n, 10)
        _write_idx_images(raw / f"{prefix}-images-idx3-ubyte", x[:, 0])
        _write_idx_labels(raw / f"{prefix}-labels-idx1-ubyte", y)
        out += [x, y]
    return Fab(*out)


FABRICATORS = {
    "cifar10": fabricate_cifar10,
    "cifar100": fabricate_cifar100,
    "svhn": fabricate_svhn,
    "mnist": lambda root, **kw: fabricate_mnist(root, name="MNIST", **kw),
    "fashionmnist": lambda root, **kw: fabricate_mnist(root, name="FashionMNIST", **kw),
}

"""CIFAR-10, CIFAR-100, SVHN, MNIST and FashionMNIST through torchvision, held in memory.

The files are torchvision's on-disk layout under `data.root` (nothing is downloaded unless
`data.download` is true; without it, missing files are synced from a staged copy when CALIB_DATASETS_URI
names one: calib_core/data/staging.py):

    cifar10       <root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}
    cifar100      <root>/cifar-100-python/{train, test, meta}
    svhn          <root>/{train_32x32.mat, test_32x32.mat}
    mnist         <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte
    fashionmnist  <root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte

The official test split is the test split; validation is carved (stratified, by seed) from
the official train split with `val_fraction`. Images become float32 (N, C, H, W) tensors
standardised with the per-channel mean/std of the train part only.

Integrity: torchvision's CIFAR and SVHN classes compare every file with the official md5
inside their constructors and refuse anything else ("Dataset not found or corrupted"), which
also hides *which* file is missing. We therefore (1) check presence ourselves and name the
missing paths, (2) compare the official md5 sums ourselves when `data.verify_checksums` is
true (the default; a mismatch names the file), and (3) parse the files with torchvision's own
classes, subclassed only to make their built-in check a presence check (their download
path, with its archive md5, is unchanged). MNIST raw files have no official md5 (torchvision
only checks the .gz archives), so for them presence is all that is checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10, CIFAR100, MNIST, SVHN, FashionMNIST

from calib_core.config import DataConfig
from calib_core.data import staging
from calib_core.data.fetch import ensure_files, some, verify_md5
from calib_core.data.splits import CropFlip, DataSplits, Split, channel_stats, split_indices, standardize

RawArrays = tuple[Tensor, Tensor, Tensor, Tensor]  # x_train uint8 NCHW, y_train, x_test, y_test


# torchvision's parsers with the official-md5 gate turned into a presence check ---------------
class _CIFAR10Files(CIFAR10):
    train_list = [[f, None] for f, _ in CIFAR10.train_list]
    test_list = [[f, None] for f, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}


class _CIFAR100Files(CIFAR100):
    train_list = [[f, None] for f, _ in CIFAR100.train_list]
    test_list = [[f, None] for f, _ in CIFAR100.test_list]
    meta = {**CIFAR100.meta, "md5": None}


class _SVHNFiles(SVHN):
    def _check_integrity(self) -> bool:
        return os.path.isfile(os.path.join(self.root, self.filename))


def _read_cifar(cls: type[CIFAR10]) -> Callable[[Path, bool], RawArrays]:
    def read(root: Path, download: bool) -> RawArrays:
        out = []
        for train in (True, False):
            ds = cls(str(root), train=train, download=download and train)
            x = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))  # HWC -> CHW
            out += [x, torch.as_tensor(ds.targets, dtype=torch.long)]
        return out[0], out[1], out[2], out[3]

    return read


def _read_svhn(root: Path, download: bool) -> RawArrays:
    out = []
    for split in ("train", "test"):
        ds = _SVHNFiles(str(root), split=split, download=download)
        out += [torch.from_numpy(np.ascontiguousarray(ds.data)), torch.from_numpy(ds.labels.astype(np.int64))]
    return out[0], out[1], out[2], out[3]


def _read_mnist(cls: type[MNIST]) -> Callable[[Path, bool], RawArrays]:
    def read(root: Path, download: bool) -> RawArrays:
        out = []
        for train in (True, False):
            ds = cls(str(root), train=train, download=download and train)
            out += [ds.data.unsqueeze(1).contiguous(), ds.targets.long()]
        return out[0], out[1], out[2], out[3]

    return read


@dataclass(frozen=True)
class TorchvisionSpec:
    name: str
    num_classes: int
    files: tuple[str, ...]  # every file the loader needs, relative to root
    checksums: dict[str, str]  # official md5 of those that have one
    read: Callable[[Path, bool], RawArrays]
    crop_padding: int
    flip: bool  # SVHN and MNIST digits change meaning when mirrored: no flip


def _cifar_files(cls: type[CIFAR10]) -> tuple[tuple[str, ...], dict[str, str]]:
    pairs = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
    return tuple(f"{cls.base_folder}/{f}" for f, _ in pairs), {f"{cls.base_folder}/{f}": md5 for f, md5 in pairs}


def _mnist_files(cls: type[MNIST]) -> tuple[str, ...]:
    return tuple(f"{cls.__name__}/raw/{os.path.splitext(f)[0]}" for f, _ in cls.resources)


SPECS: dict[str, TorchvisionSpec] = {
    "cifar10": TorchvisionSpec("cifar10", 10, *_cifar_files(CIFAR10), _read_cifar(_CIFAR10Files), 4, True),
    "cifar100": TorchvisionSpec("cifar100", 100, *_cifar_files(CIFAR100), _read_cifar(_CIFAR100Files), 4, True),
    "svhn": TorchvisionSpec(
        "svhn",
        10,
        tuple(SVHN.split_list[s][1] for s in ("train", "test")),
        {SVHN.split_list[s][1]: SVHN.split_list[s][2] for s in ("train", "test")},
        _read_svhn,
        4,
        False,
    ),
    "mnist": TorchvisionSpec("mnist", 10, _mnist_files(MNIST), {}, _read_mnist(MNIST), 2, False),
    "fashionmnist": TorchvisionSpec(
        "fashionmnist", 10, _mnist_files(FashionMNIST), {}, _read_mnist(FashionMNIST), 2, True
    ),
}


def dataset_root(cfg: DataConfig) -> Path:
    if cfg.root is None:
        raise ValueError(f"data.root must be set for {cfg.name} (the folder with torchvision's files for it)")
    return Path(cfg.root).expanduser().absolute()


def missing_files(spec: TorchvisionSpec, root: Path) -> list[Path]:
    return [root / f for f in spec.files if not (root / f).is_file()]


def verify_checksums(spec: TorchvisionSpec, root: Path) -> None:
    """ValueError naming every file whose md5 differs from the official one."""
    verify_md5(spec.name, {root / rel: md5 for rel, md5 in spec.checksums.items()})


def read_raw(cfg: DataConfig) -> RawArrays:
    """The official train and test arrays (uint8 images NCHW, int64 labels), checked."""
    spec = SPECS[cfg.name]
    root = dataset_root(cfg)

    # A cluster's workers reach no public address: without data.download the missing files come from the staged
    # copy (CALIB_DATASETS_URI, calib_core/data/staging.py), synced under the same lock a download takes.
    source = None if cfg.download else staging.staged_source()

    def not_found(missing: list[Path]) -> str:
        where = "does not exist" if not root.is_dir() else f"lacks {some([str(p) for p in missing])}"
        return (
            f"{spec.name}: dataset files not found: data.root={root} {where}. Place torchvision's "
            f"{spec.name} files there ({', '.join(spec.files[:2])}, ...), set data.download=true "
            f"on a machine with internet access, or stage them ({staging.stage_step(spec.name, None)}) "
            f"and set {staging.SOURCE_ENV}."
        )

    ensure_files(
        spec.name,
        root,
        lambda: missing_files(spec, root),
        (lambda: staging.sync(spec.name, source, root, spec.files)) if source else (lambda: spec.read(root, True)),
        allowed=cfg.download or source is not None,
        not_found=not_found,
    )
    if cfg.verify_checksums:
        verify_checksums(spec, root)
    x_tr, y_tr, x_te, y_te = spec.read(root, False)
    for part, y in (("train", y_tr), ("test", y_te)):
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= spec.num_classes):
            raise ValueError(
                f"{spec.name}: {part} labels under {root} lie outside [0, {spec.num_classes}): "
                f"min {int(y.min())}, max {int(y.max())}"
            )
    return x_tr, y_tr, x_te, y_te


def load_torchvision(cfg: DataConfig, seed: int) -> DataSplits:
    """Train / val (carved from the official train split by `seed`) / official test."""
    spec = SPECS[cfg.name]
    x_tr_all, y_tr_all, x_te, y_te = read_raw(cfg)
    tr, va = split_indices(len(y_tr_all), [1.0 - cfg.val_fraction, cfg.val_fraction], seed=seed, labels=y_tr_all)
    x_tr = x_tr_all[tr]
    mean255, std255 = channel_stats(x_tr)  # train part only: val and test never enter the statistics
    train = Split(standardize(x_tr, mean255, std255), y_tr_all[tr])
    del x_tr
    val = Split(standardize(x_tr_all[va], mean255, std255), y_tr_all[va])
    test = Split(standardize(x_te, mean255, std255), y_te.clone())
    mean, std = (mean255 / 255.0), (std255 / 255.0)
    augmentation = None
    if cfg.augment:
        fill = tuple(float(v) for v in (-mean / std))  # a black pixel after standardisation
        augmentation = CropFlip(padding=spec.crop_padding, flip=spec.flip, fill=fill)
    return DataSplits(
        train,
        val,
        test,
        num_classes=spec.num_classes,
        input_shape=tuple(int(s) for s in x_te.shape[1:]),
        name=spec.name,
        augmentation=augmentation,
        stats={"mean": mean.tolist(), "std": std.tolist()},
    )

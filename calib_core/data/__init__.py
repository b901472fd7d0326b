"""Datasets as three in-memory splits: `load_dataset(cfg: DataConfig, seed) -> DataSplits`.

Embedded (no download): mnist1d (generated, the default) and digits (scikit-learn).
From files in torchvision's layout under `data.root`: cifar10, cifar100, svhn, mnist,
fashionmnist. Splits are disjoint and fixed by the seed; standardisation uses train only.
"""

from calib_core.data.registry import list_datasets, load_dataset, register_dataset
from calib_core.data.splits import (
    CropFlip,
    DataSplits,
    Split,
    channel_stats,
    iterate_batches,
    split_indices,
    standardize,
    train_val_test_indices,
)

__all__ = [
    "load_dataset",
    "list_datasets",
    "register_dataset",
    "DataSplits",
    "Split",
    "CropFlip",
    "iterate_batches",
    "split_indices",
    "train_val_test_indices",
    "channel_stats",
    "standardize",
]

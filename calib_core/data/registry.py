"""`load_dataset(cfg, seed)`: one entry point from a `DataConfig` to three in-memory splits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calib_core.config import DataConfig
from calib_core.data.celeba import load_celeba
from calib_core.data.digits import load_digits_splits
from calib_core.data.mnist1d import load_mnist1d
from calib_core.data.multitask import MULTITASK_LOADERS
from calib_core.data.splits import DataSplits
from calib_core.data.torchvision_sets import SPECS, load_torchvision

_LOADERS: dict[str, Callable[[DataConfig, int], DataSplits]] = {
    "mnist1d": load_mnist1d,
    "digits": load_digits_splits,
    **{name: load_torchvision for name in SPECS},
    **MULTITASK_LOADERS,  # digits_mtl, mnist1d_mtl: labels (N, 4), DataSplits.tasks set
    "celeba": load_celeba,  # 40 binary attribute tasks
}
_GENERATED = ("mnist1d", "mnist1d_mtl")  # accept data.num_samples
_AUGMENTABLE = tuple(SPECS)  # image sets with a crop (+ flip) policy


def list_datasets() -> list[str]:
    return sorted(_LOADERS)


def load_dataset(cfg: DataConfig | dict[str, Any], seed: int) -> DataSplits:
    """Load `cfg.name` as train / val / test splits, disjoint and fixed by `seed`.

    Datasets without an official test split (mnist1d, digits) are split by
    `cfg.val_fraction` and `cfg.test_fraction`; the torchvision sets keep their official test
    split and carve `cfg.val_fraction` of their train split for validation.
    """
    if not isinstance(cfg, DataConfig):
        cfg = DataConfig.model_validate(cfg)
    if cfg.name not in _LOADERS:
        raise ValueError(f"unknown dataset {cfg.name!r}; allowed: {', '.join(list_datasets())}")
    if cfg.num_samples is not None and cfg.name not in _GENERATED:
        raise ValueError(
            f"data.num_samples applies to generated datasets (mnist1d) only, not {cfg.name!r}; leave it unset"
        )
    if cfg.augment and cfg.name not in _AUGMENTABLE:
        raise ValueError(
            f"data.augment: no augmentation is defined for {cfg.name!r}; defined for {', '.join(_AUGMENTABLE)}"
        )
    return _LOADERS[cfg.name](cfg, int(seed))

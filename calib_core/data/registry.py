"""`load_dataset(cfg, seed)`: one entry point from a `DataConfig` to three in-memory splits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calib_core.config import DataConfig
from calib_core.data.celeba import load_celeba
from calib_core.data.digits import load_digits_splits
from calib_core.data.mnist1d import load_mnist1d
from calib_core.data.multitask import MULTITASK_LOADERS
from calib_core.data.perturb import perturb_splits
from calib_core.data.splits import DataSplits
from calib_core.data.torchvision_sets import SPECS, load_torchvision

_LOADERS: dict[str, Callable[[DataConfig, int], DataSplits]] = {
    "mnist1d": load_mnist1d,
    "digits": load_digits_splits,
    **{name: load_torchvision for name in SPECS},
    **MULTITASK_LOADERS,  # digits_mtl, mnist1d_mtl: labels (N, 4), DataSplits.tasks set
    "celeba": load_celeba,  # 40 binary attribute tasks
}
_GENERATED = {"mnist1d", "mnist1d_mtl"}  # accept data.num_samples
# (input shape without the batch dimension, classes of the first task) of the built-in sets whose shape does not
# depend on the config: what a model/data compatibility check needs without loading the data
_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "mnist1d": ((40,), 10),
    "mnist1d_mtl": ((40,), 10),
    "digits": ((1, 8, 8), 10),
    "digits_mtl": ((1, 8, 8), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "svhn": ((3, 32, 32), 10),
    "mnist": ((1, 28, 28), 10),
    "fashionmnist": ((1, 28, 28), 10),
}
_AUGMENTABLE = set(SPECS)  # image sets with a crop (+ flip) policy

Loader = Callable[[DataConfig, int], DataSplits]


def register_dataset(name: str, *, generated: bool = False, augmentable: bool = False) -> Callable[[Loader], Loader]:
    """Decorator: register `loader(cfg: DataConfig, seed: int) -> DataSplits` under `name`.

    `generated`: the loader honours `data.num_samples`; `augmentable`: it applies `data.augment`.
    The function is returned unchanged; a name registered to another loader is refused."""

    def deco(loader: Loader) -> Loader:
        if not callable(loader):
            raise TypeError(f"register_dataset({name!r}) expects a function (cfg, seed) -> DataSplits")
        if name in _LOADERS and _LOADERS[name] is not loader:
            raise ValueError(f"dataset name {name!r} is already registered to {_LOADERS[name].__qualname__}")
        _LOADERS[name] = loader
        if generated:
            _GENERATED.add(name)
        if augmentable:
            _AUGMENTABLE.add(name)
        return loader

    return deco


def dataset_shape(name: str) -> tuple[tuple[int, ...], int] | None:
    """(input shape, classes of the first task) of a built-in dataset, or None where it depends on the config."""
    return _SHAPES.get(name)


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
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
            f"data.augment: no augmentation is defined for {cfg.name!r}; defined for {', '.join(sorted(_AUGMENTABLE))}"
        )
    data = _LOADERS[cfg.name](cfg, int(seed))
    return perturb_splits(data, label_noise=cfg.label_noise, imbalance_ratio=cfg.imbalance_ratio, seed=int(seed))

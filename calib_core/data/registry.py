"""`load_dataset(cfg, seed)`: one entry point from a `DataConfig` to three in-memory splits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calib_core.config import DataConfig
from calib_core.data.perturb import perturb_splits
from calib_core.data.splits import DataSplits
from calib_core.registry import DATASETS

Loader = Callable[[DataConfig, int], DataSplits]


def register_dataset(name: str, *, generated: bool = False, augmentable: bool = False) -> Callable[[Loader], Loader]:
    """Decorator: register `loader(cfg: DataConfig, seed: int) -> DataSplits` under `name`.

    `generated`: the loader honours `data.num_samples`; `augmentable`: it applies `data.augment`.
    The function is returned unchanged; a name registered to another loader is refused."""

    def deco(loader: Loader) -> Loader:
        if not callable(loader):
            raise TypeError(f"register_dataset({name!r}) expects a function (cfg, seed) -> DataSplits")
        return DATASETS.add(name, loader, generated=generated, augmentable=augmentable)

    return deco


def dataset_shape(name: str) -> tuple[tuple[int, ...], int] | None:
    """(input shape, classes of the first task) of a dataset whose shape the config does not change, else None."""
    return DATASETS.meta(name)["shape"] if name in DATASETS else None


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    return sorted(DATASETS.names())


def load_dataset(cfg: DataConfig | dict[str, Any], seed: int) -> DataSplits:
    """Load `cfg.name` as train / val / test splits, disjoint and fixed by `seed`.

    Datasets without an official test split (mnist1d, digits) are split by
    `cfg.val_fraction` and `cfg.test_fraction`; the torchvision sets keep their official test
    split and carve `cfg.val_fraction` of their train split for validation.
    """
    if not isinstance(cfg, DataConfig):
        cfg = DataConfig.model_validate(cfg)
    if cfg.name not in DATASETS:
        raise ValueError(f"unknown dataset {cfg.name!r}; allowed: {', '.join(list_datasets())}")
    meta = DATASETS.meta(cfg.name)
    if cfg.num_samples is not None and not meta["generated"]:
        raise ValueError(
            f"data.num_samples applies to generated datasets (mnist1d) only, not {cfg.name!r}; leave it unset"
        )
    if cfg.augment and not meta["augmentable"]:
        augmentable = ", ".join(sorted(DATASETS.names(augmentable=True)))
        raise ValueError(f"data.augment: no augmentation is defined for {cfg.name!r}; defined for {augmentable}")
    data = DATASETS.get(cfg.name)(cfg, int(seed))
    return perturb_splits(data, label_noise=cfg.label_noise, imbalance_ratio=cfg.imbalance_ratio, seed=int(seed))

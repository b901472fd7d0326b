"""scikit-learn's bundled handwritten digits (1797 images of 8x8, 10 classes); no download.

Images are returned as (1, 8, 8) tensors scaled to [0, 1] (pixel / 16), so both `mlp`
(which flattens) and `cnn2d`/`vit_small` (patch_size 2 or 4) apply.
"""

from __future__ import annotations

import numpy as np
import torch

from calib_core.config import DataConfig
from calib_core.data.splits import DataSplits, Split, train_val_test_indices

NUM_CLASSES = 10


def load_digits_splits(cfg: DataConfig, seed: int) -> DataSplits:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32) / 16.0).unsqueeze(1)  # (N, 1, 8, 8)
    y = torch.from_numpy(np.asarray(bunch.target, dtype=np.int64))
    tr, va, te = train_val_test_indices(
        len(y), val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction, seed=seed, labels=y
    )
    train, val, test = (Split(x[idx], y[idx]) for idx in (tr, va, te))
    return DataSplits(
        train,
        val,
        test,
        num_classes=NUM_CLASSES,
        input_shape=(1, 8, 8),
        name="digits",
        stats={"scale": 1.0 / 16.0},
    )

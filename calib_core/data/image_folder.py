"""`image_folder`: images in torchvision's `ImageFolder` layout, one sub-folder per class, decoded with PIL.

    <data.path>/cat/001.jpg
    <data.path>/cat/002.png
    <data.path>/dog/xyz.jpeg

    run:
      data: {name: image_folder, path: /data/pets, image_size: [64, 64], image_mode: RGB, normalize: train}

Classes and files are found by torchvision's own `find_classes` and `make_dataset` (sorted class folders,
files with an image suffix, sorted), so class k is `ImageFolder(path).classes[k]`. Each image is converted to
`image_mode` (RGB: 3 channels, L: 1) and, with `image_size`, resized with PIL's bilinear filter to
(height, width); without it every image must have the size of the first. Pixels are scaled to [0, 1] and
standardised per channel with the mean/std of the TRAIN split (`normalize: train`), ImageNet's
(`imagenet`: for a backbone pretrained on ImageNet; L images use the mean of its three channels), the
backbone's own (`model`: `data.mean`/`data.std`, filled from a torchvision/ or timm/ `run.model.name`), or not
at all (`none`). The split is seeded and stratified as for the embedded datasets.

`DataSplits.preprocessing` (how a raw image becomes a model input):

    {"format": "image_folder", "source": str, "class_names": [str, ...], "image_mode": "RGB" | "L",
     "image_size": [height, width], "resize": "PIL bilinear" | None, "scale": 1/255,
     "normalize": "train" | "imagenet" | "model" | "none", "mean": [per channel], "std": [per channel],
     "layout": "CHW", "input_shape": [C, H, W]}

i.e. model input = (pixels_CHW * scale - mean) / std after the conversion and resize.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from calib_core.config import DataConfig
from calib_core.data.files import DataError, as_tensor, check_fits_memory, data_path, make_splits, some, split_rows
from calib_core.data.splits import DataSplits, channel_stats, standardize

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BYTES_PER_VALUE = 1 + 4 + 4  # the decoded uint8 pixels, the float32 splits, a float32 working copy
WHAT = "image_folder"


def find_images(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(class names, [(file, class index)]) as torchvision's ImageFolder finds them; every problem a DataError."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    if not root.exists():
        raise DataError(f"{WHAT}: {root} does not exist (data.path)")
    if not root.is_dir():
        raise DataError(f"{WHAT}: {root} is not a folder (data.path: a folder with one sub-folder per class)")
    try:
        classes, class_to_idx = find_classes(str(root))
    except FileNotFoundError:
        raise DataError(f"{WHAT}: {root} has no class sub-folders (one sub-folder of images per class)") from None
    samples = make_dataset(str(root), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    counts = np.bincount([k for _, k in samples], minlength=len(classes))
    empty = [classes[k] for k in np.flatnonzero(counts == 0).tolist()]
    if len(classes) < 2:
        raise DataError(f"{WHAT}: {root} has a single class ({classes[0]}); a classifier needs at least two")
    if empty:
        raise DataError(
            f"{WHAT}: class folder(s) {some(empty)} under {root} hold no images ({', '.join(IMG_EXTENSIONS)})"
        )
    return classes, samples


def _decode(path: str, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as f:
            im = f.convert(mode)
            if size is not None and im.size != (size[1], size[0]):
                im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            a = np.asarray(im, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for a broken file
        raise DataError(
            f"{WHAT}: cannot decode {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        ) from None
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _first_size(path: str) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return int(im.size[1]), int(im.size[0])
    except Exception as exc:  # noqa: BLE001
        raise DataError(
            f"{WHAT}: cannot decode {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        ) from None


def load_image_folder(cfg: DataConfig, seed: int) -> DataSplits:
    """The `image_folder` dataset (module docstring)."""
    root = data_path(cfg)
    classes, samples = find_images(root)
    channels = 3 if cfg.image_mode == "RGB" else 1
    size = (cfg.image_size, cfg.image_size) if isinstance(cfg.image_size, int) else cfg.image_size
    h, w = size if size is not None else _first_size(samples[0][0])
    need = len(samples) * channels * h * w * BYTES_PER_VALUE
    check_fits_memory(WHAT, root, need, f"{len(samples)} images of {channels}x{h}x{w}")
    x_u8 = np.empty((len(samples), channels, h, w), dtype=np.uint8)
    for i, (f, _) in enumerate(samples):
        a = _decode(f, cfg.image_mode, size)
        if a.shape[1:] != (h, w):
            raise DataError(
                f"{WHAT}: {f} is {a.shape[1]}x{a.shape[2]} but {samples[0][0]} is {h}x{w}; set data.image_size "
                "to resize every image"
            )
        x_u8[i] = a
    y_np = np.asarray([k for _, k in samples], dtype=np.int64)
    tr, va, te = split_rows(y_np, cfg, seed, WHAT, root)
    x = as_tensor(x_u8)
    if cfg.normalize == "train":
        mean255, std255 = channel_stats(x[tr])
        mean, std = mean255 / 255.0, std255 / 255.0
    elif cfg.normalize == "imagenet":
        m, s = (
            (IMAGENET_MEAN, IMAGENET_STD)
            if channels == 3
            else ((float(np.mean(IMAGENET_MEAN)),), (float(np.mean(IMAGENET_STD)),))
        )
        mean, std = torch.tensor(m, dtype=torch.float64), torch.tensor(s, dtype=torch.float64)
    elif cfg.normalize == "model":  # the backbone's own (calib_core/models/library.py fills data.mean/std)
        if cfg.mean is None or cfg.std is None:
            raise DataError(f"{WHAT}: data.normalize 'model' needs data.mean and data.std")
        mean, std = torch.tensor(cfg.mean, dtype=torch.float64), torch.tensor(cfg.std, dtype=torch.float64)
        if channels == 1:
            mean, std = mean.mean().reshape(1), std.mean().reshape(1)
    else:
        mean, std = torch.zeros(channels, dtype=torch.float64), torch.ones(channels, dtype=torch.float64)
    xs = standardize(x, mean * 255.0, std * 255.0)
    del x, x_u8
    stats = {"mean": mean.tolist(), "std": std.tolist()}
    preprocessing = {
        "format": "image_folder",
        "source": str(root),
        "class_names": list(classes),
        "image_mode": cfg.image_mode,
        "image_size": [h, w],
        "resize": "PIL bilinear" if size is not None else None,
        "scale": 1.0 / 255.0,
        "normalize": cfg.normalize,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "layout": "CHW",
        "input_shape": [channels, h, w],
    }
    return make_splits(
        xs,
        torch.from_numpy(y_np),
        (tr, va, te),
        num_classes=len(classes),
        name="image_folder",
        stats=stats,
        preprocessing=preprocessing,
    )

"""CelebA attributes (40 binary tasks) through torchvision, held in memory.

Files: torchvision's on-disk layout under `root` (nothing is downloaded unless `download`):

    <root>/celeba/img_align_celeba/000001.jpg ...   aligned and cropped faces (178 x 218)
    <root>/celeba/list_attr_celeba.txt               count, 40 names, then "file  1 -1 ..." rows
    <root>/celeba/list_eval_partition.txt            "file split", 0 train / 1 valid / 2 test
    <root>/celeba/identity_CelebA.txt, list_bbox_celeba.txt, list_landmarks_align_celeba.txt
                                                     (parsed by torchvision; not used here)

Splits are the official ones: train / valid / test become train / val / test (the seed and
`val_fraction` play no part). Labels are the (N, 40) long attribute matrix mapped from the
file's -1 / 1 to 0 / 1 by torchvision; the multi-task convention reserves -1 for a missing
label (CelebA has none). `DataSplits.tasks` names the 40 attributes (2 classes each) in file
order; `num_classes` is 2.

Images: decoded with PIL at full resolution, centre-cropped to a square of side
min(width, height) (178 x 178 for CelebA's 178 x 218: the face region), resized to
`image_size` square with PIL's antialiased bilinear filter (decoded by a small thread pool;
PIL releases the GIL), held as uint8, then standardised per channel with the
train split's mean and std (`stats["mean"]`, `["std"]` in [0, 1] pixel units, as for the other
image sets). Memory: float32 3 * S * S * 4 bytes per image, about 9.7 GB at S = 64 for the
202,599 images; `max_per_split` keeps only the first n of each split (file order) for smoke runs.

Integrity: torchvision's CelebA checks the official md5 of every list file in its constructor
and refuses anything else ("Dataset not found or corrupted"), without naming the file. As in
`torchvision_sets`, we (1) check presence ourselves and name what is missing, (2) compare the
official md5 of the list files when `verify_checksums` is true, and (3) parse with torchvision's
own class, subclassed only to make its integrity check a presence check.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.datasets import CelebA

from calib_core.config import DataConfig
from calib_core.data.fetch import ensure_files, verify_md5
from calib_core.data.multitask import Task
from calib_core.data.splits import DataSplits, Split, channel_stats, standardize

NAME = "celeba"
DEFAULT_IMAGE_SIZE = 64
IMAGE_DIR = "img_align_celeba"
LIST_FILES = (
    "list_attr_celeba.txt",
    "list_eval_partition.txt",
    "identity_CelebA.txt",
    "list_bbox_celeba.txt",
    "list_landmarks_align_celeba.txt",
)
OFFICIAL_MD5 = {fname: md5 for _, md5, fname in CelebA.file_list if fname in LIST_FILES}
_SPLITS = (("train", "train"), ("val", "valid"), ("test", "test"))  # ours, torchvision's


class _CelebAFiles(CelebA):
    """torchvision's CelebA parser with the md5 gate turned into a presence check."""

    def _check_integrity(self) -> bool:
        base = os.path.join(self.root, self.base_folder)
        return all(os.path.isfile(os.path.join(base, f)) for f in LIST_FILES) and os.path.isdir(
            os.path.join(base, IMAGE_DIR)
        )


def missing_files(root: Path) -> list[Path]:
    base = Path(root) / CelebA.base_folder
    out = [base / f for f in LIST_FILES if not (base / f).is_file()]
    if not (base / IMAGE_DIR).is_dir():
        out.append(base / IMAGE_DIR)
    return out


def verify_list_checksums(root: Path) -> None:
    """ValueError naming every list file whose md5 differs from the official one."""
    base = Path(root) / CelebA.base_folder
    verify_md5(NAME, {base / fname: md5 for fname, md5 in OFFICIAL_MD5.items()})


def _load_image(path: Path, size: int) -> np.ndarray:
    with Image.open(path) as src:
        im: Image.Image = src.convert("RGB")
        w, h = im.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        im = im.crop((left, top, left + side, top + side))
        if side != size:
            im = im.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


def read_split(
    root: Path, split: str, *, image_size: int, max_samples: int | None = None, num_workers: int | None = None
) -> tuple[Tensor, Tensor, list[str]]:
    """One official split: (uint8 images (N, 3, S, S), long attributes (N, A) in {0, 1}, attribute names)."""
    ds = _CelebAFiles(str(root), split=split, target_type="attr", download=False)
    names = [a for a in ds.attr_names if a]  # the official header line ends with a space
    attr = ds.attr.to(torch.long)
    files = list(ds.filename)
    if max_samples is not None:
        files, attr = files[:max_samples], attr[:max_samples]
    if attr.dim() != 2 or attr.shape[1] != len(names):
        raise ValueError(
            f"{NAME}: list_attr_celeba.txt names {len(names)} attributes but rows hold {tuple(attr.shape)[1:]}"
        )
    if attr.numel() and not bool(((attr == 0) | (attr == 1)).all()):
        raise ValueError(f"{NAME}: attribute values must be -1 or 1 in list_attr_celeba.txt")
    img_dir = Path(root) / CelebA.base_folder / IMAGE_DIR
    paths = [img_dir / f for f in files]
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise FileNotFoundError(
            f"{NAME}: {len(absent)} image(s) listed for split {split!r} are missing: {', '.join(absent[:3])}{more}"
        )
    x = np.empty((len(paths), image_size, image_size, 3), dtype=np.uint8)
    workers = num_workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:  # PIL releases the GIL while decoding
        for i, arr in enumerate(pool.map(lambda p: _load_image(p, image_size), paths, chunksize=64)):
            x[i] = arr
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), attr, names


def load_celeba_splits(
    root: str | Path,
    *,
    download: bool = False,
    verify_checksums: bool = True,
    image_size: int = DEFAULT_IMAGE_SIZE,
    max_per_split: int | None = None,
    num_workers: int | None = None,
) -> DataSplits:
    """CelebA's official train / valid / test as in-memory splits (module docstring)."""
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    root = Path(root).expanduser().absolute()

    def not_found(missing: list[Path]) -> str:
        where = "does not exist" if not root.is_dir() else f"lacks {', '.join(map(str, missing))}"
        return (
            f"{NAME}: dataset files not found: data.root={root} {where}. Place torchvision's CelebA files there "
            f"(celeba/{IMAGE_DIR}/*.jpg, " + ", ".join(f"celeba/{f}" for f in LIST_FILES) + "), "
            "or set data.download=true on a machine with internet access."
        )

    ensure_files(
        NAME,
        root,
        lambda: missing_files(root),
        lambda: CelebA(str(root), split="train", target_type="attr", download=True),
        allowed=download,
        not_found=not_found,
    )
    if verify_checksums:
        verify_list_checksums(root)
    parts = {
        ours: read_split(root, theirs, image_size=image_size, max_samples=max_per_split, num_workers=num_workers)
        for ours, theirs in _SPLITS
    }
    names = parts["train"][2]
    if len(parts["train"][0]) == 0:
        raise ValueError(f"{NAME}: the train split under {root} is empty (list_eval_partition.txt has no 0 rows)")
    mean255, std255 = channel_stats(parts["train"][0])  # train only
    splits = {ours: Split(standardize(x_u8, mean255, std255), y) for ours, (x_u8, y, _) in parts.items()}
    mean, std = mean255 / 255.0, std255 / 255.0
    return DataSplits(
        splits["train"],
        splits["val"],
        splits["test"],
        num_classes=2,
        input_shape=(3, image_size, image_size),
        name=NAME,
        stats={"mean": mean.tolist(), "std": std.tolist()},
        tasks=tuple(Task(n, 2) for n in names),
    )


def load_celeba(cfg: DataConfig, seed: int) -> DataSplits:
    """Registry adapter: `data.root`, `data.download`, `data.verify_checksums`; official splits (seed unused)."""
    if cfg.root is None:
        raise ValueError(f"data.root must be set for {NAME} (the folder that holds torchvision's celeba/ folder)")
    return load_celeba_splits(cfg.root, download=cfg.download, verify_checksums=cfg.verify_checksums)

"""`arrays`: features and labels saved with numpy: an `.npz` with arrays `x` and `y`, or a folder holding `x.npy`
and `y.npy`.

    run:
      data: {name: arrays, path: features.npz}     # x_key: X, y_key: y to name the arrays

Without `data.x_key` / `data.y_key` the features are whichever of X_KEYS (x, X, data, features: numpy's, sklearn's
and the common names) the file holds and the labels whichever of Y_KEYS (y, target, labels); none, or two of them,
is refused naming the arrays the file holds and the setting. In a folder, a key `k` is the file `k.npy`.

`x` is (N, D) for feature vectors or (N, C, ...) for signals and images (channels first), any real dtype; `y` is
(N,) integer class labels 0..K-1 (floats with integral values are accepted), K = max(y) + 1, every class with at
least one example. Read with `allow_pickle=False`. The split is seeded and stratified as for the embedded
datasets; `normalize: train` (the default) standardises with the TRAIN split's mean/std per feature for (N, D)
and per channel (dim 1) for (N, C, ...); `none` keeps the values.

`DataSplits.preprocessing`:

    {"format": "arrays", "source": str, "class_names": ["0", ..., "K-1"], "normalize": "train" | "none",
     "axis": "feature" | "channel", "mean": [...], "std": [...], "input_shape": [...]}

i.e. model input = (x - mean) / std along that axis.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from calib_core.config import DataConfig
from calib_core.data.files import (
    DataError,
    as_tensor,
    check_classes,
    check_finite,
    check_fits_memory,
    data_path,
    integer_labels,
    make_splits,
    some,
    split_rows,
)
from calib_core.data.splits import DataSplits, channel_stats, standardize

WHAT = "arrays"
BYTES_PER_VALUE = 4 + 4  # float32 features, float32 standardised splits (plus the file's own dtype)
X_KEYS = ("x", "X", "data", "features")
Y_KEYS = ("y", "target", "labels")


def _npz_header(zf: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype]:
    with zf.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
    return tuple(shape), np.dtype(dtype)


def _members(path: Path) -> dict[str, str]:
    """Array name -> where it is: the .npz member, or the .npy file in the folder."""
    if path.is_dir():
        return {f.stem: f.name for f in sorted(path.glob("*.npy")) if f.is_file()}
    with zipfile.ZipFile(path) as zf:
        return {Path(n).stem: n for n in zf.namelist() if n.endswith(".npy")}


def pick_key(
    members: list[str], kind: str, field: str, key: str | None, candidates: tuple[str, ...], path: Path, taken: str
) -> str:
    """The array `key` names, else the one of `candidates` (but `taken`, the other side's) the file holds; a missing
    or ambiguous one is one line."""
    held = f"its arrays: {some(sorted(members), 12) or 'none'}"
    if key is not None:
        if key not in members:
            raise DataError(f"{WHAT}: {path} has no array {key!r} (data.{field}); {held}")
        return key
    found = [k for k in candidates if k in members and k != taken]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(
            f"{WHAT}: {path} has no {kind} array named {', '.join(candidates)} ({held}); set data.{field} to the "
            "one that holds them"
        )
    raise DataError(f"{WHAT}: {path} has several {kind} arrays ({', '.join(found)}); set data.{field} to one of them")


def _headers(path: Path, x_key: str | None, y_key: str | None) -> dict[str, tuple[str, tuple[int, ...], np.dtype]]:
    """For "x" and "y": the array's name, shape and dtype, read from the file headers only (nothing loaded yet)."""
    try:
        members = _members(path)
    except Exception as exc:  # noqa: BLE001 - zipfile raises many types for a broken file
        raise DataError(
            f"{WHAT}: cannot read {path} as .npz ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        ) from None
    # a key given for one side is never the other side's guess
    xk = pick_key(list(members), "features", "x_key", x_key, X_KEYS, path, taken=y_key or "")
    yk = pick_key(list(members), "labels", "y_key", y_key, Y_KEYS, path, taken=xk)
    out = {}
    for role, key in (("x", xk), ("y", yk)):
        try:
            if path.is_dir():
                a = np.load(path / members[key], mmap_mode="r", allow_pickle=False)
                out[role] = (key, tuple(a.shape), a.dtype)
            else:
                with zipfile.ZipFile(path) as zf:
                    out[role] = (key, *_npz_header(zf, members[key]))
        except Exception as exc:  # noqa: BLE001 - zipfile and numpy raise many types for a broken file
            raise DataError(
                f"{WHAT}: cannot read array {key!r} of {path} ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:120]})"
            ) from None
    return out


def read_arrays(path: Path, x_key: str | None = None, y_key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of an .npz or a folder of .npy files (module docstring), checked for presence, shapes and memory
    first."""
    if not path.exists():
        raise DataError(f"{WHAT}: {path} does not exist (data.path)")
    if path.is_file() and path.suffix.lower() == ".npy":
        raise DataError(f"{WHAT}: {path} is one .npy file; give the folder that holds x.npy and y.npy, or an .npz")
    if path.is_file() and path.stat().st_size == 0:
        raise DataError(f"{WHAT}: {path} is empty")
    if path.is_file() and path.suffix.lower() != ".npz":
        raise DataError(f"{WHAT}: {path} is not an .npz file (data.path: an .npz, or a folder with x.npy and y.npy)")
    heads = _headers(path, x_key, y_key)
    (xk, xs, xd), (yk, ys, _) = heads["x"], heads["y"]
    if len(xs) < 2:
        raise DataError(f"{WHAT}: {xk} in {path} has shape {xs}; it needs (N, D) or (N, C, ...)")
    if len(ys) != 1 or ys[0] != xs[0]:
        raise DataError(f"{WHAT}: {yk} in {path} has shape {ys}; it needs ({xs[0]},), one label per row of {xk} {xs}")
    if xs[0] == 0:
        raise DataError(f"{WHAT}: {path} holds no examples")
    if xd.kind not in "biuf":
        raise DataError(f"{WHAT}: {xk} in {path} has dtype {xd}; it needs numbers")
    per_row = int(np.prod(xs[1:]))
    need = xs[0] * per_row * (BYTES_PER_VALUE + xd.itemsize)
    check_fits_memory(WHAT, path, need, f"{xk} of shape {xs}")
    try:
        if path.is_dir():
            x, y = (np.load(path / f"{k}.npy", allow_pickle=False) for k in (xk, yk))
        else:
            with np.load(path, allow_pickle=False) as z:
                x, y = z[xk], z[yk]
    except Exception as exc:  # noqa: BLE001
        raise DataError(
            f"{WHAT}: cannot read {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        ) from None
    return x, y


def load_arrays(cfg: DataConfig, seed: int) -> DataSplits:
    """The `arrays` dataset (module docstring)."""
    path = data_path(cfg)
    x_np, y_raw = read_arrays(path, cfg.x_key, cfg.y_key)
    y_np = integer_labels(y_raw, WHAT, path)
    num_classes = int(y_np.max()) + 1
    check_classes(y_np, num_classes, WHAT, path)
    x_f = x_np.astype(np.float32, copy=False)
    check_finite(x_f, WHAT, path)
    tr, va, te = split_rows(y_np, cfg, seed, WHAT, path)
    x = as_tensor(x_f)
    axis = "feature" if x.dim() == 2 else "channel"
    if cfg.normalize == "train":
        if axis == "feature":
            xt = x[tr].double()
            mean, std = xt.mean(0), xt.std(0, unbiased=False)
            std = torch.where(std > 0, std, torch.ones_like(std))
        else:
            mean, std = channel_stats(x[tr])
        xs = (x.double() - mean) / std if axis == "feature" else standardize(x, mean, std)
        xs = xs.float()
    else:
        width = x.shape[1]
        mean, std = torch.zeros(width, dtype=torch.float64), torch.ones(width, dtype=torch.float64)
        xs = x.float()
    preprocessing = {
        "format": "arrays",
        "source": str(path),
        "class_names": [str(k) for k in range(num_classes)],
        "normalize": cfg.normalize,
        "axis": axis,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "input_shape": [int(s) for s in x.shape[1:]],
    }
    return make_splits(
        xs.contiguous(),
        torch.from_numpy(y_np),
        (tr, va, te),
        num_classes=num_classes,
        name="arrays",
        stats={"mean": mean.tolist(), "std": std.tolist()},
        preprocessing=preprocessing,
    )

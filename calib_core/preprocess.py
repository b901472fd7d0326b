"""Raw inputs to model inputs: apply a dataset's preprocessing record to data as it is on disk.

A trained model takes standardised tensors (the training split's statistics, the tabular encoding, the image
transform already applied). `input_record(data)` is the JSON record of that preprocessing for one `DataSplits`
(the file formats' own `DataSplits.preprocessing`, or one derived from `stats` for the built-in datasets), and
`apply_record(record, raw)` turns raw inputs into the model's float32 array (N, *input_shape) exactly as the
loader did, or raises `InvalidInputError` in one line naming what does not fit.

Records (`format`):
- `table`: calib_core/data/table.py's record. Raw input: a pandas DataFrame (or a dict of columns, or a list of
  row dicts) with the feature columns by name, in any order; other columns (the label, the free-text columns the
  loader dropped, an id) are ignored. A column may be left out only where the model fills empty cells (a numeric
  column under `missing: impute_mean`, a categorical one unless `missing: reject`): it reads as empty in every row,
  with a warning naming it; any other missing column, or all of them, is an error naming them (and the ignored
  columns, in case one is a missing one misspelt). Numeric
  columns are standardised with the train mean/std (empty cells filled with the train mean when the model was
  trained with `missing: impute_mean`), categorical columns one-hot encoded with the train categories (an unseen
  value: all zeros, as in training).
- `image_folder` (also the torchvision sets, derived): images as users hold them (calib_core/image_inputs.py):
  arrays (N, H, W) grey, (N, H, W, C) channels last as PIL and numpy give them or (N, C, H, W), uint8 or float
  (0..255, or 0..1); PIL images; PNG/JPEG files as bytes or base64 text. Each image is converted to the model's
  mode (RGB / L) and, when the model was trained with a resize, resized with the recorded PIL filter to its size,
  as the loader did; then scaled and standardised per channel.
- `arrays` (also mnist1d and digits, derived): the raw feature arrays (N, *input_shape) (or the flat / one-channel
  layouts of calib_core.export.accepted_input_shapes), any real dtype, standardised along `axis` (`feature`,
  `channel`, or `all`: one mean/std for every value), after an optional `scale`.

Datasets without a record (CelebA's several tasks, a plugin that records none) take standardised inputs only.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calib_core.export import InvalidInputError, accepted_input_shapes

RAW = "raw"
STANDARDISED = "standardised"
INPUT_MODES = (RAW, STANDARDISED)
IMAGE_FORMATS = ("image_folder", "image")
TORCHVISION_IMAGES = ("cifar10", "cifar100", "svhn", "mnist", "fashionmnist")


def _some(items: Sequence[Any], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


# ---------------------------------------------------------------------------- the record
def input_record(data: Any, data_config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The preprocessing record of `data` (a DataSplits): its own `preprocessing`, or one derived from `stats` for
    mnist1d, digits and the torchvision image sets; None when raw inputs cannot be described (several tasks,
    a plugin dataset without a record)."""
    if getattr(data, "tasks", None) is not None:
        return None
    own = dict(getattr(data, "preprocessing", None) or {})
    if own.get("format") in ("table", "arrays", *IMAGE_FORMATS):
        return own
    stats, name, shape = dict(data.stats or {}), str(data.name), [int(s) for s in data.input_shape]
    cfg = dict(data_config or {})
    classes = [str(k) for k in range(int(data.num_classes))]
    if name == "mnist1d" and {"mean", "std"} <= set(stats):
        source = f"mnist1d.data.make_dataset(num_samples={cfg.get('num_samples') or 8000}, seed=<run seed>)"
        return {
            "format": "arrays",
            "source": source,
            "class_names": classes,
            "normalize": "train",
            "axis": "all",
            "mean": [float(v) for v in stats["mean"]],
            "std": [float(v) for v in stats["std"]],
            "input_shape": shape,
        }
    if name == "digits" and set(stats) >= {"scale"}:
        return {
            "format": "arrays",
            "source": "sklearn.datasets.load_digits().images (values 0..16)",
            "class_names": classes,
            "normalize": "none",
            "axis": "all",
            "scale": float(stats["scale"]),
            "mean": [0.0],
            "std": [1.0],
            "input_shape": shape,
        }
    if name in TORCHVISION_IMAGES and {"mean", "std"} <= set(stats) and len(shape) == 3:
        return {
            "format": "image",
            "source": f"torchvision {name} under {cfg.get('root')}",
            "class_names": classes,
            "image_mode": "RGB" if shape[0] == 3 else "L",
            "image_size": shape[1:],
            "resize": None,
            "scale": 1.0 / 255.0,
            "normalize": "train",
            "mean": [float(v) for v in stats["mean"]],
            "std": [float(v) for v in stats["std"]],
            "layout": "CHW",
            "input_shape": shape,
        }
    return None


def describe_raw_inputs(record: Mapping[str, Any]) -> str:
    """One line: what `predict` takes as raw input for this record."""
    fmt = record["format"]
    if fmt == "table":
        cols = [c["name"] for c in record["columns"]]
        return f"a table (pandas DataFrame) with columns {_some(cols, 12)}"
    if fmt in IMAGE_FORMATS:
        h, w = record["image_size"]
        size = f"any size (resized to {h}x{w})" if record.get("resize") else f"{h}x{w}"
        return (
            f"images, converted to {record['image_mode']}, {size}: pixel arrays (N, H, W), (N, H, W, C) or "
            "(N, C, H, W) (uint8, or float 0..255 or 0..1), PIL images, or PNG/JPEG files as bytes or base64 text"
        )
    return f"raw feature arrays {_shapes_text(_raw_array_shapes(record['input_shape']))}, real numbers"


def _shapes_text(shapes: list[tuple[int, ...]]) -> str:
    return " or ".join("(N, " + ", ".join(str(d) for d in s) + ")" for s in shapes)


def _raw_array_shapes(input_shape: Any) -> list[tuple[int, ...]]:
    """Per-example shapes raw arrays may come in: the model's, the flat one, and (H, W) for one-channel images."""
    shape = tuple(int(s) for s in input_shape)
    accepted = accepted_input_shapes(shape)
    if len(shape) == 3 and shape[0] == 1:
        accepted.append(shape[1:])  # one-channel images (digits) as (N, H, W)
    return accepted


# ---------------------------------------------------------------------------- applying it
def apply_record(
    record: Mapping[str, Any], raw: Any, *, layout: str | None = None, pixels: str | None = None
) -> np.ndarray:
    """Raw inputs to the model's finite float32 array (N, *input_shape), or `InvalidInputError`; `layout` ("HWC" /
    "CHW") and `pixels` ("0..255" / "0..1") settle image batches that could be read either way."""
    fmt = record.get("format")
    if fmt == "table":
        out = _table(record, raw)
    elif fmt in IMAGE_FORMATS:
        out = _images(record, raw, layout, pixels)
    elif fmt == "arrays":
        out = _arrays(record, raw)
    else:
        raise InvalidInputError(f"unknown preprocessing format {fmt!r}; this model takes standardised inputs only")
    return np.ascontiguousarray(out, dtype=np.float32)


def _as_frame(raw: Any) -> Any:
    import pandas as pd

    if isinstance(raw, pd.DataFrame):
        return raw
    if isinstance(raw, (Mapping, list)):
        try:
            return pd.DataFrame(raw)
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(f"cannot read the input as table rows: {exc}") from None
    raise InvalidInputError(
        f"expected table rows (a pandas DataFrame with the feature columns by name); got {type(raw).__name__}"
    )


def _fill(record: Mapping[str, Any], column: Mapping[str, Any]) -> float | None:
    """The value a numeric column's empty cells take (None: they are refused)."""
    fill = column.get("fill")
    if fill is None and record.get("missing") == "impute_mean" and record.get("normalize") == "train":
        fill = column["mean"]  # the train rows' mean of the column (what imputation would have used)
    return None if fill is None else float(fill)


def _optional(record: Mapping[str, Any], column: Mapping[str, Any]) -> bool:
    """Whether raw rows may leave the column out: its empty cells are filled (numeric) or encode as all zeros
    (categorical, unless the model was trained with missing: reject)."""
    if column["kind"] == "numeric":
        return _fill(record, column) is not None
    return record.get("missing", "reject") != "reject"


def _table(record: Mapping[str, Any], raw: Any) -> np.ndarray:
    import pandas as pd

    df = _as_frame(raw)
    df = df.set_axis([str(c) for c in df.columns], axis=1)
    wanted = [str(c["name"]) for c in record["columns"]]
    have = list(df.columns)
    missing = [c for c in record["columns"] if str(c["name"]) not in have]
    required = [str(c["name"]) for c in missing if not _optional(record, c)]
    if missing and len(missing) == len(wanted):  # filling every column would answer the train means for any rows
        required = wanted
    if required:
        # other columns are ignored (the label, the free-text columns the loader dropped, an id); named here since
        # one of them may be the missing column misspelt
        ignored = {*wanted, str(record.get("label_column")), *map(str, record.get("dropped_columns") or ())}
        unknown = [c for c in have if c not in ignored]
        also = f"; unknown column(s) {_some(unknown)} (ignored)" if unknown else ""
        raise InvalidInputError(
            f"missing column(s) {_some(required)}{also}; the model takes the columns {_some(wanted, 40)}"
        )
    if missing:  # columns whose empty cells the model fills: left out, they read as empty in every row
        left_out = [str(c["name"]) for c in missing]
        warnings.warn(
            f"column(s) {_some(left_out)} left out: read as empty in every row (filled as in training)", stacklevel=3
        )
        df = df.assign(**{name: np.nan for name in left_out})
    blocks: list[np.ndarray] = []
    for c in record["columns"]:
        name = str(c["name"])
        col = df[name]
        empty = col.isna().to_numpy()
        if c["kind"] == "numeric":
            if not (pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col)):
                col = pd.to_numeric(col, errors="coerce")
                bad = col.isna().to_numpy() & ~empty
                if bad.any():
                    raise InvalidInputError(
                        f"column {name!r} holds values that are not numbers (row {int(np.flatnonzero(bad)[0])}: "
                        f"{df[name].iloc[int(np.flatnonzero(bad)[0])]!r})"
                    )
            v = col.to_numpy(dtype=np.float64, na_value=np.nan)
            if np.isinf(v).any():
                raise InvalidInputError(
                    f"column {name!r} holds infinite values (row {int(np.flatnonzero(np.isinf(v))[0])})"
                )
            if empty.any():
                fill = _fill(record, c)
                if fill is None:
                    raise InvalidInputError(
                        f"column {name!r} has {int(empty.sum())} empty cell(s) (the first in row "
                        f"{int(np.flatnonzero(empty)[0])}); the model was trained with missing: "
                        f"{record.get('missing', 'reject')} and has no value to fill them with"
                    )
                v = np.where(empty, float(fill), v)
            blocks.append(((v - float(c["mean"])) / float(c["std"]))[:, None])
        else:
            if empty.any() and record.get("missing", "reject") == "reject":
                raise InvalidInputError(
                    f"column {name!r} has {int(empty.sum())} empty cell(s) (the first in row "
                    f"{int(np.flatnonzero(empty)[0])}); the model was trained with missing: reject"
                )
            text = col.astype(str).to_numpy()
            cats = np.asarray(list(c["categories"]), dtype=object)
            blocks.append(((text[:, None] == cats[None, :]) & ~empty[:, None]).astype(np.float64))
    x = np.concatenate(blocks, axis=1) if blocks else np.zeros((len(df), 0))
    return x.astype(np.float32)


def _images(record: Mapping[str, Any], raw: Any, layout: str | None, pixels: str | None) -> np.ndarray:
    from calib_core.data.splits import standardize
    from calib_core.image_inputs import pixel_batch

    _, h, w = (int(s) for s in record["input_shape"])
    resize = record.get("resize")
    x_u8 = pixel_batch(
        raw,
        mode=str(record["image_mode"]),
        size=(h, w),
        resize=str(resize) if resize else None,
        layout=layout,
        pixels=pixels,
    )
    mean = torch.tensor(record["mean"], dtype=torch.float64)
    std = torch.tensor(record["std"], dtype=torch.float64)
    scale = float(record.get("scale", 1.0 / 255.0))
    return standardize(torch.from_numpy(np.ascontiguousarray(x_u8)), mean / scale, std / scale).numpy()


def _arrays(record: Mapping[str, Any], raw: Any) -> np.ndarray:
    from calib_core.data.splits import standardize

    arr = raw.detach().cpu().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    shape = tuple(int(s) for s in record["input_shape"])
    got = tuple(int(s) for s in arr.shape)
    accepted = _raw_array_shapes(shape)
    if len(got) < 1 or not any(got[1:] == s for s in accepted):
        raise InvalidInputError(f"expected raw inputs of shape {_shapes_text(accepted)}; got {got}")
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.number) and not np.issubdtype(arr.dtype, np.complexfloating)
    ):
        raise InvalidInputError(f"expected real numbers; got dtype {arr.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = np.ascontiguousarray(arr, dtype=np.float32).reshape((got[0], *shape))
    if not np.isfinite(x32).all():
        row = int(np.argwhere(~np.isfinite(x32))[0][0])
        raise InvalidInputError(f"input has NaN or infinite values (first in row {row}); every value must be finite")
    x = torch.from_numpy(x32)
    scale = record.get("scale")
    if scale is not None:
        x = x * float(scale)
    mean = torch.tensor(record["mean"], dtype=torch.float64)
    std = torch.tensor(record["std"], dtype=torch.float64)
    axis = record.get("axis", "feature")
    if axis == "feature" and x.dim() == 2 and mean.numel() == x.shape[1]:
        return ((x.double() - mean) / std).float().numpy()  # as calib_core/data/arrays.py standardises (N, D)
    if axis in ("channel", "all"):
        if mean.numel() == 1 and x.dim() > 2:
            return ((x - mean.float()) / std.float()).numpy()
        return standardize(x, mean, std).numpy()
    return ((x.double() - mean) / std).float().numpy()


# ---------------------------------------------------------------------------- what MLflow's signature says
def table_column_types(record: Mapping[str, Any]) -> dict[str, str]:
    """MLflow column types ("long", "double", "boolean", "string") of a table record's columns, read from its
    source file's dtypes (what `pandas.read_csv` / `read_parquet` give a client reading the same file); a
    numeric column falls back to "double" when the source cannot be read."""
    types = {str(c["name"]): ("double" if c["kind"] == "numeric" else "string") for c in record["columns"]}
    source = str(record.get("source") or "")
    try:
        if source == "sklearn.datasets.load_breast_cancer":
            from sklearn.datasets import load_breast_cancer

            frame = load_breast_cancer(as_frame=True).frame
        elif source and Path(source).is_file():
            from calib_core.data.table import read_table

            frame = read_table(Path(source))
        else:
            return types
    except Exception:  # noqa: BLE001 - the types are a convenience; double accepts what a client sends
        return types
    import pandas as pd

    frame = frame.set_axis([str(c) for c in frame.columns], axis=1)
    for c in record["columns"]:
        name = str(c["name"])
        if c["kind"] != "numeric" or name not in frame.columns:
            continue
        col = frame[name]
        if pd.api.types.is_bool_dtype(col):
            types[name] = "boolean"
        elif pd.api.types.is_integer_dtype(col):
            types[name] = "long"
    return types


def raw_example(record: Mapping[str, Any], rows: int = 2) -> Any:
    """A small raw input for the record (the logged input example): typical table rows (train means, first
    categories), mid-grey images (N, H, W, C), or arrays at the train mean."""
    fmt = record["format"]
    if fmt == "table":
        import pandas as pd

        types = table_column_types(record)
        cols: dict[str, Any] = {}
        for c in record["columns"]:
            name = str(c["name"])
            if c["kind"] != "numeric":
                cols[name] = [(list(c["categories"]) or [""])[i % max(1, len(c["categories"]))] for i in range(rows)]
                continue
            base = float(c["fill"] if c.get("fill") is not None else c["mean"])
            values = [base + (i - (rows - 1) / 2) * float(c["std"]) for i in range(rows)]
            if types.get(name) == "long":
                cols[name] = np.asarray(np.round(values), dtype=np.int64)
            elif types.get(name) == "boolean":
                cols[name] = np.asarray([i % 2 == 0 for i in range(rows)])
            else:
                cols[name] = np.asarray(values, dtype=np.float64)
        return pd.DataFrame(cols)
    if fmt in IMAGE_FORMATS:
        c, h, w = (int(s) for s in record["input_shape"])
        return np.random.default_rng(0).integers(0, 256, (rows, h, w, c)).astype(np.uint8)
    shape = tuple(int(s) for s in record["input_shape"])
    rng = np.random.default_rng(0)
    scale = float(record.get("scale") or 1.0)
    mean = float(np.mean(record["mean"])) / scale
    std = float(np.mean(record["std"])) / scale
    return (mean + std * rng.standard_normal((rows, *shape))).astype(np.float32)


__all__ = [
    "INPUT_MODES",
    "RAW",
    "STANDARDISED",
    "apply_record",
    "dataset_lineage",
    "describe_raw_inputs",
    "input_record",
    "raw_example",
    "table_column_types",
]


# ---------------------------------------------------------------------------- lineage
def dataset_lineage(data: Any, data_config: Mapping[str, Any] | None = None, seed: int | None = None) -> dict[str, Any]:
    """What a run trained on, for MLflow's dataset input: name, source (a path, or the generator's settings), a
    content digest (blake2b of the x and y of the train, val and test splits, in that order: the very tensors the
    model saw) and the split sizes."""
    import hashlib

    cfg = dict(data_config or {})
    record = dict(getattr(data, "preprocessing", None) or {})
    name = str(data.name)
    if record.get("source") and record.get("format") in ("table", "arrays", "image_folder"):
        source = str(record["source"])
        if Path(source).name and "/" in source:
            name = f"{name}:{Path(source).name}"
    elif name == "mnist1d":
        source = f"mnist1d.data.make_dataset(num_samples={cfg.get('num_samples') or 8000}, seed={seed})"
    elif cfg.get("root"):
        source = str(cfg["root"])
    else:
        source = str(record.get("source") or name)
    h = hashlib.blake2b(digest_size=16)
    for split in (data.train, data.val, data.test):
        for t in (split.x, split.y):
            a = t.detach().cpu().contiguous().numpy()
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
    extra = {k: cfg[k] for k in ("label_noise", "imbalance_ratio") if cfg.get(k)}
    return {
        "name": name,
        "source": source,
        "digest": h.hexdigest(),
        "sizes": {"train": len(data.train), "val": len(data.val), "test": len(data.test)},
        "num_classes": int(data.num_classes),
        "input_shape": [int(s) for s in data.input_shape],
        **({"settings": extra} if extra else {}),
    }

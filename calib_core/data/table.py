"""`table`: a CSV or Parquet file with named feature columns and a label column; and `breast_cancer`, scikit-learn's
bundled Wisconsin breast-cancer table (569 rows, 30 numeric features, 2 classes; no download) read through the
same code.

    run:
      data: {name: table, path: patients.csv, label_column: outcome,
             feature_columns: [age, dose, site],      # default: every column but the label
             categorical: onehot, missing: impute_mean}

The split is seeded and stratified as for the embedded datasets. Then, with statistics of the TRAIN rows only:
- numeric columns (bool counts as 0/1) are standardised, (v - mean) / std (population std; a constant column
  keeps std 1); `data.normalize: none` leaves them as they are;
- non-numeric columns are refused (`categorical: reject`, the default) or one-hot encoded (`onehot`) with the
  categories seen in the train rows, sorted; a value the train rows lack encodes as all zeros;
- empty cells are refused (`missing: reject`, the default) or filled (`impute_mean`): a numeric cell with the
  train rows' mean of its column, a categorical cell as all zeros;
- labels (numbers or strings) become classes 0..K-1 in sorted order; numeric labels must be integers.

`DataSplits.preprocessing` records all of it so raw rows can be encoded again later:

    {"format": "table", "source": str, "label_column": str, "class_names": [str, ...] (class k's label),
     "normalize": "train" | "none", "missing": "reject" | "impute_mean",
     "columns": [{"name": str, "kind": "numeric", "mean": float, "std": float, "fill": float | None}
                 | {"name": str, "kind": "categorical", "categories": [str, ...]}, ...],
     "feature_names": [str, ...] (the model's input columns: a numeric column's name, "col=category" per one-hot
     column), "input_shape": [D]}

`stats` holds {"mean": [...], "std": [...]} per model input column (one-hot columns 0 and 1), so model input =
(raw encoded row - mean) / std as for the other datasets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calib_core.config import DataConfig
from calib_core.data.files import (
    DataError,
    as_tensor,
    check_fits_memory,
    data_path,
    feature_stats,
    integer_labels,
    make_splits,
    some,
    split_rows,
)
from calib_core.data.splits import DataSplits

TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
CSV_MEMORY_FACTOR = 6  # bytes in memory per byte of CSV: pandas' frame, the float64 features, the float32 splits
PARQUET_MEMORY_FACTOR = 3  # per byte of uncompressed Parquet data


def read_table(path: Path) -> Any:
    """The file as a pandas DataFrame, after checking that it exists, is not empty and fits in memory."""
    import pandas as pd

    what = "table"
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(
            f"{what}: {path} is neither .csv nor .parquet (data.path; allowed suffixes: .csv, .parquet, .pq)"
        )
    if not path.exists():
        raise DataError(f"{what}: {path} does not exist (data.path)")
    if not path.is_file():
        raise DataError(f"{what}: {path} is not a file (data.path)")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{what}: {path} is empty")
    try:
        if kind == "csv":
            check_fits_memory(what, path, size * CSV_MEMORY_FACTOR, f"{CSV_MEMORY_FACTOR}x its {size / 2**30:.2f} GiB")
            df = pd.read_csv(path)
        else:
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            raw = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            check_fits_memory(
                what, path, raw * PARQUET_MEMORY_FACTOR, f"{PARQUET_MEMORY_FACTOR}x its {raw / 2**30:.2f} GiB of data"
            )
            df = pd.read_parquet(path)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - pandas' and pyarrow's parse errors are many types
        raise DataError(
            f"{what}: cannot read {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
        ) from None
    if len(df) == 0:
        raise DataError(f"{what}: {path} has no rows")
    return df


def _label_classes(col: Any, what: str, source: str) -> tuple[np.ndarray, list[Any]]:
    """(int64 class per row, the sorted label values): numeric labels must be integers."""
    import pandas as pd

    missing = col.isna().to_numpy()
    if missing.any():
        raise DataError(
            f"{what}: label column {col.name!r} of {source} is empty in {int(missing.sum())} rows "
            f"(the first is row {int(np.flatnonzero(missing)[0])})"
        )
    if pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
        values: np.ndarray = integer_labels(col.to_numpy(), f"{what}: column {col.name!r}", Path(source))
    else:
        values = col.astype(str).to_numpy()
    classes, y = np.unique(values, return_inverse=True)
    return y.astype(np.int64), classes.tolist()


def encode_table(
    df: Any,
    cfg: DataConfig,
    seed: int,
    *,
    source: str,
    name: str = "table",
    label_column: str | None = None,
    class_names: dict[Any, str] | None = None,
) -> DataSplits:
    """Split, encode and standardise a DataFrame (module docstring). `class_names` renames label values."""
    what = name
    label = label_column if label_column is not None else cfg.label_column
    df = df.set_axis([str(c) for c in df.columns], axis=1)
    features = _feature_columns(list(df.columns), label, cfg, what, source)
    assert label is not None  # _feature_columns refuses a missing label column
    y_np, classes = _label_classes(df[label], what, source)
    if len(classes) < 2:
        raise DataError(
            f"{what}: {source} has a single class ({classes[0]!s}) in column {label!r}; a classifier needs two"
        )
    tr, va, te = split_rows(y_np, cfg, seed, what, Path(source))
    encoded = [_encode_column(df[c], c, tr.numpy(), cfg, what, source) for c in features]
    x = np.concatenate([e.block for e in encoded], axis=1).astype(np.float32)
    names = [class_names.get(k, str(k)) if class_names else str(k) for k in classes]
    preprocessing = {
        "format": "table",
        "source": source,
        "label_column": label,
        "class_names": names,
        "normalize": cfg.normalize,
        "missing": cfg.missing,
        "columns": [e.encoding for e in encoded],
        "feature_names": [n for e in encoded for n in e.names],
        "input_shape": [x.shape[1]],
    }
    return make_splits(
        as_tensor(x),
        as_tensor(y_np),
        (tr, va, te),
        num_classes=len(classes),
        name=name,
        stats={"mean": [m for e in encoded for m in e.means], "std": [s for e in encoded for s in e.stds]},
        preprocessing=preprocessing,
    )


def _feature_columns(columns: list[str], label: str | None, cfg: DataConfig, what: str, source: str) -> list[str]:
    """The feature columns (data.feature_columns, else every column but the label), each problem one line."""
    if label is None:
        raise DataError(f"{what}: data.label_column is not set")
    wanted = [label] + list(cfg.feature_columns or [])
    absent = [c for c in wanted if c not in columns]
    if absent:
        field = "data.label_column" if absent[0] == label else "data.feature_columns"
        raise DataError(f"{what}: column {absent[0]!r} ({field}) is not in {source}; its columns: {some(columns, 12)}")
    features = list(cfg.feature_columns) if cfg.feature_columns else [c for c in columns if c != label]
    if label in features:
        raise DataError(f"{what}: the label column {label!r} is also a feature column (data.feature_columns)")
    if len(set(features)) != len(features):
        dup = [c for c in features if features.count(c) > 1][0]
        raise DataError(f"{what}: data.feature_columns names {dup!r} twice")
    if not features:
        raise DataError(f"{what}: {source} has no feature columns besides the label {label!r}")
    return features


@dataclass(frozen=True)
class _Encoded:
    """One source column as model inputs: its block of columns, their names and statistics, and how it was
    encoded (the preprocessing record's entry)."""

    block: np.ndarray
    names: list[str]
    means: list[float]
    stds: list[float]
    encoding: dict[str, Any]


def _encode_column(col: Any, c: str, train_rows: np.ndarray, cfg: DataConfig, what: str, source: str) -> _Encoded:
    """A numeric (or boolean) column standardised on the train rows, or a text column one-hot encoded."""
    import pandas as pd

    empty = col.isna().to_numpy()
    if empty.any() and cfg.missing == "reject":
        raise DataError(
            f"{what}: column {c!r} of {source} has {int(empty.sum())} empty (NaN) cells (the first in row "
            f"{int(np.flatnonzero(empty)[0])}); set data.missing: impute_mean, or fill them"
        )
    if not (pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col)):
        return _one_hot(col, c, empty, train_rows, cfg, what, source)
    v = col.to_numpy(dtype=np.float64, na_value=np.nan)
    inf = np.isinf(v)
    if inf.any():
        raise DataError(
            f"{what}: column {c!r} of {source} has NaN or inf values in {int(inf.sum())} rows "
            f"(the first is row {int(np.flatnonzero(inf)[0])})"
        )
    seen = v[train_rows][~empty[train_rows]]
    if len(seen) == 0:
        raise DataError(f"{what}: column {c!r} of {source} is empty in every train row")
    fill = None
    if empty.any():
        fill = float(seen.mean())
        v = np.where(empty, fill, v)
    if cfg.normalize == "train":
        m, s = feature_stats(seen[:, None])
        mean, std = float(m[0]), float(s[0])
    else:
        mean, std = 0.0, 1.0
    encoding = {"name": c, "kind": "numeric", "mean": mean, "std": std, "fill": fill}
    return _Encoded(((v - mean) / std)[:, None], [c], [mean], [std], encoding)


def _one_hot(
    col: Any, c: str, empty: np.ndarray, train_rows: np.ndarray, cfg: DataConfig, what: str, source: str
) -> _Encoded:
    """A text column as one indicator per category seen in the train rows (data.categorical: onehot)."""
    if cfg.categorical == "reject":
        sample = col[~col.isna()].astype(str)
        example = sample.iloc[0] if len(sample) else ""
        raise DataError(
            f"{what}: column {c!r} of {source} is not numeric (values like {example!r}); set "
            "data.categorical: onehot, or leave it out of data.feature_columns"
        )
    text = col.astype(str).to_numpy()
    cats = sorted(set(text[train_rows][~empty[train_rows]].tolist()))
    onehot = (text[:, None] == np.asarray(cats, dtype=object)[None, :]) & ~empty[:, None]
    encoding = {"name": c, "kind": "categorical", "categories": cats}
    return _Encoded(
        onehot.astype(np.float64), [f"{c}={k}" for k in cats], [0.0] * len(cats), [1.0] * len(cats), encoding
    )


def load_table(cfg: DataConfig, seed: int) -> DataSplits:
    """The `table` dataset: `data.path` (.csv or .parquet) encoded as the module docstring says."""
    path = data_path(cfg)
    return encode_table(read_table(path), cfg, seed, source=str(path))


BREAST_CANCER_LABEL = "target"


def load_breast_cancer_table(cfg: DataConfig, seed: int) -> DataSplits:
    """scikit-learn's bundled breast-cancer table through the table code (class 0 malignant, 1 benign)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer(as_frame=True)
    names = {i: str(n) for i, n in enumerate(bunch.target_names)}
    return encode_table(
        bunch.frame,
        cfg,
        seed,
        source="sklearn.datasets.load_breast_cancer",
        name="breast_cancer",
        label_column=BREAST_CANCER_LABEL,
        class_names=names,
    )

"""`table`: a CSV or Parquet file with named feature columns and a label column; and `breast_cancer`, scikit-learn's
bundled Wisconsin breast-cancer table (569 rows, 30 numeric features, 2 classes; no download) read through the
same code.

    run:
      data: {name: table, path: patients.csv, label_column: outcome,
             feature_columns: [age, dose, site],      # default: every column but the label
             categorical: onehot, text_columns: drop, missing: impute_mean}

The split is seeded and stratified as for the embedded datasets. Then, with statistics of the TRAIN rows only:
- numeric columns (bool counts as 0/1) are standardised, (v - mean) / std (population std; a constant column
  keeps std 1); `data.normalize: none` leaves them as they are;
- non-numeric columns are refused (`categorical: reject`, the default) or one-hot encoded (`onehot`) with the
  categories seen in the train rows, sorted; a value the train rows lack encodes as all zeros;
- free text is not a category: a non-numeric column whose non-empty cells hold more than TEXT_MIN_DISTINCT (20)
  distinct values, and either more distinct values than TEXT_DISTINCT_SHARE (half) of its non-empty cells (notes,
  names, ids) or a typical (median) distinct value of TEXT_MIN_WORDS (3) or more words (sentences), is refused
  whatever `categorical` says (`text_columns: reject`, the default), left out of the model's inputs (`drop`; the
  champion then ignores the column in raw rows), or one-hot encoded as a categorical column (`onehot`);
- every refused column is named in one line (the label or a feature column the file lacks too, with the closest
  names the file has);
- empty cells are refused (`missing: reject`, the default) or filled (`impute_mean`): a numeric cell with the
  train rows' mean of its column, a categorical cell as all zeros;
- labels (numbers or strings) become classes 0..K-1 in sorted order; numeric labels must be integers.

`DataSplits.preprocessing` records all of it so raw rows can be encoded again later:

    {"format": "table", "source": str, "label_column": str, "class_names": [str, ...] (class k's label),
     "normalize": "train" | "none", "missing": "reject" | "impute_mean",
     "dropped_columns": [str, ...] (free-text columns left out with `text_columns: drop`),
     "columns": [{"name": str, "kind": "numeric", "mean": float, "std": float, "fill": float | None}
                 | {"name": str, "kind": "categorical", "categories": [str, ...]}, ...],
     "feature_names": [str, ...] (the model's input columns: a numeric column's name, "col=category" per one-hot
     column), "input_shape": [D]}

`stats` holds {"mean": [...], "std": [...]} per model input column (one-hot columns 0 and 1), so model input =
(raw encoded row - mean) / std as for the other datasets.
"""

from __future__ import annotations

import difflib
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
    split_rows,
)
from calib_core.data.splits import DataSplits
from calib_core.memory import CSV_MEMORY_FACTOR

TABLE_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
PARQUET_MEMORY_FACTOR = 3  # per byte of uncompressed Parquet data
# free text versus categories (module docstring): a handful of distinct values is a category whatever it reads like
TEXT_MIN_DISTINCT = 20
TEXT_DISTINCT_SHARE = 0.5
TEXT_MIN_WORDS = 3
TEXT_RULE = "over 20 distinct values, mostly unique or of 3+ words"
# an error line is read by a person (and the CLI cuts one at 300 characters): the lists of columns in it are
# shortened to fit, with a count of the rest, so that the advice at its end stays whole
LINE_CHARS = 270
MIN_LIST_CHARS = 40


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
    features, dropped = _check_kinds(df, features, cfg, what, source)
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
        "dropped_columns": dropped,
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
        named = [_absent(c, "data.label_column" if c == label else "data.feature_columns", columns) for c in absent]
        which = "column" if len(named) == 1 else "columns"
        are = "is" if len(named) == 1 else "are"
        raise DataError(
            fit_line(
                [f"{what}: {which} ", named, f" {are} not in {source}, which has {len(columns)} columns: ", columns]
            )
        )
    features = list(cfg.feature_columns) if cfg.feature_columns else [c for c in columns if c != label]
    if label in features:
        raise DataError(f"{what}: the label column {label!r} is also a feature column (data.feature_columns)")
    if len(set(features)) != len(features):
        dup = [c for c in features if features.count(c) > 1][0]
        raise DataError(f"{what}: data.feature_columns names {dup!r} twice")
    if not features:
        raise DataError(f"{what}: {source} has no feature columns besides the label {label!r}")
    return features


def _absent(name: str, field: str, columns: list[str]) -> str:
    """`'outcom' (data.label_column; did you mean 'outcome'?)`: the closest column names, case aside."""
    lowered: dict[str, str] = {}
    for c in columns:
        lowered.setdefault(c.strip().lower(), c)
    close = difflib.get_close_matches(name.strip().lower(), list(lowered), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(lowered[m]) for m in close)}?" if close else ""
    return f"{name!r} ({field}{hint})"


def _is_numeric(col: Any) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col))


def is_free_text(col: Any) -> bool:
    """Whether a non-numeric column reads as free text rather than categories (TEXT_* rule, module docstring)."""
    values = col[~col.isna()].astype(str)
    distinct = values.unique()
    if len(distinct) <= TEXT_MIN_DISTINCT:
        return False
    if len(distinct) > TEXT_DISTINCT_SHARE * len(values):
        return True
    return float(np.median([len(v.split()) for v in distinct])) >= TEXT_MIN_WORDS


def _shortened(items: list[str], budget: int) -> str:
    """`items` comma-separated, as many as fit in `budget` characters (at least one), then "(and N more)"."""
    shown = items[:1]
    for item in items[1:]:
        rest = len(items) - len(shown) - 1
        if len(", ".join([*shown, item])) + (len(f" (and {rest} more)") if rest else 0) > budget:
            break
        shown.append(item)
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" (and {more} more)" if more else "")


def fit_line(parts: list[str | list[str]]) -> str:
    """Text and lists joined in one line, the lists shortened (with a count) so the line fits LINE_CHARS; an
    earlier list takes what it needs first, leaving MIN_LIST_CHARS to each later one."""
    later = sum(isinstance(p, list) for p in parts)
    left = LINE_CHARS - sum(len(p) for p in parts if isinstance(p, str))
    out = []
    for p in parts:
        if isinstance(p, list):
            later -= 1
            p = _shortened(p, max(MIN_LIST_CHARS, left - MIN_LIST_CHARS * later))
            left -= len(p)
        out.append(p)
    return "".join(out)


def _quoted(names: list[str]) -> list[str]:
    return [repr(c) for c in names]


def _check_kinds(df: Any, features: list[str], cfg: DataConfig, what: str, source: str) -> tuple[list[str], list[str]]:
    """(the feature columns kept, the free-text ones dropped); every refused column named in one line."""
    other = [c for c in features if not _is_numeric(df[c])]
    text = [c for c in other if is_free_text(df[c])]
    categories = [c for c in other if c not in text]
    refuse_categories = bool(categories) and cfg.categorical == "reject"
    refuse_text = bool(text) and cfg.text_columns == "reject"
    both = refuse_categories and refuse_text  # then the line holds two lists and two settings: no examples
    parts: list[str | list[str]] = [f"{what}: {source} has "]
    if refuse_categories:
        sample = df[categories[0]].dropna().astype(str)
        example = f" (values like {sample.iloc[0]!r})" if len(sample) and not both else ""
        parts += [f"non-numeric column{'s' * (len(categories) > 1)} ", _quoted(categories), example]
    if refuse_text:
        parts += [" and free-text ones " if both else f"free-text column{'s' * (len(text) > 1)} ", _quoted(text)]
        parts += ["" if both else f" ({TEXT_RULE})"]
    settings = (["data.categorical: onehot (allowed: reject, onehot)"] if refuse_categories else []) + (
        ["data.text_columns: drop or onehot (allowed: reject, drop, onehot)"] if refuse_text else []
    )
    if settings:
        parts += [f"; set {' and '.join(settings)}, or list data.feature_columns"]
        raise DataError(fit_line(parts))
    dropped = text if cfg.text_columns == "drop" else []
    kept = [c for c in features if c not in dropped]
    if not kept:
        advice = "); set data.text_columns: onehot (allowed: reject, drop, onehot), or add numeric columns"
        raise DataError(
            fit_line([f"{what}: every feature column of {source} is free text (", _quoted(dropped), advice])
        )
    return kept, dropped


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
    empty = col.isna().to_numpy()
    if empty.any() and cfg.missing == "reject":
        raise DataError(
            f"{what}: column {c!r} of {source} has {int(empty.sum())} empty (NaN) cells (the first in row "
            f"{int(np.flatnonzero(empty)[0])}); set data.missing: impute_mean, or fill them"
        )
    if not _is_numeric(col):
        return _one_hot(col, c, empty, train_rows)
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


def _one_hot(col: Any, c: str, empty: np.ndarray, train_rows: np.ndarray) -> _Encoded:
    """A text column as one indicator per category seen in the train rows (data.categorical or text_columns:
    onehot; _check_kinds refused the others)."""
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

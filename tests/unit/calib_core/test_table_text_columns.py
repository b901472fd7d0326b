"""Free-text columns and misspelt column names of the `table` dataset (calib_core/data/table.py): refused in one
line naming every column and the setting, `text_columns: drop | onehot` as documented (checked against the same
table written without those columns, and against numpy's unique values of the train rows), the champion's
preprocessing record agreeing, and the closest names offered for a typo."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.data.files import DataError
from calib_core.data.splits import train_val_test_indices
from calib_core.data.table import is_free_text

SEED = 5
N = 60
TEXT = ["notes", "ticket", "remarks"]
TEXT_ADVICE = (
    "(over 20 distinct values, mostly unique or of 3+ words); set data.text_columns: drop or onehot "
    "(allowed: reject, drop, onehot), or list data.feature_columns"
)


def _frame() -> pd.DataFrame:
    """Numeric, categorical and three kinds of free text (unique sentences, unique ids, repeated sentences)."""
    rng = np.random.default_rng(0)
    towns = [f"town{k}" for k in range(25)]  # 25 one-word values over 60 rows: categories, not text
    sentences = [f"the patient reported symptom {k} today" for k in range(25)]  # repeated, but 3+ words
    return pd.DataFrame(
        {
            "age": rng.normal(50, 10, N),
            "notes": [f"felt better after dose {i}" for i in range(N)],
            "site": rng.choice(["arm", "leg", "neck"], N),
            "ticket": [f"T{i:04d}" for i in range(N)],
            "town": [towns[i % 25] for i in range(N)],
            "remarks": [sentences[i % 25] for i in range(N)],
            "outcome": rng.choice(["cured", "relapse"], N),
        }
    )


def _write(df: pd.DataFrame, path) -> str:
    df.to_csv(path, index=False) if path.suffix == ".csv" else df.to_parquet(path)
    return str(path)


def _cfg(path: str, **kw) -> DataConfig:
    return DataConfig(name="table", path=path, label_column="outcome", **kw)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_free_text_is_refused_by_default_naming_every_column_and_the_setting(tmp_path, suffix):
    path = _write(_frame(), tmp_path / f"t{suffix}")
    with pytest.raises(DataError) as err:
        load_dataset(_cfg(path, categorical="onehot"), SEED)
    assert str(err.value) == f"table: {path} has free-text columns 'notes', 'ticket', 'remarks' {TEXT_ADVICE}"


def test_with_categorical_reject_too_one_line_names_both_kinds_and_both_settings(tmp_path):
    path = _write(_frame(), tmp_path / "t.csv")
    with pytest.raises(DataError) as err:
        load_dataset(_cfg(path), SEED)
    assert str(err.value) == (
        f"table: {path} has non-numeric columns 'site', 'town' and free-text ones 'notes', 'ticket', 'remarks'; "
        "set data.categorical: onehot (allowed: reject, onehot) and data.text_columns: drop or onehot "
        "(allowed: reject, drop, onehot), or list data.feature_columns"
    )
    assert "\n" not in str(err.value)


def test_a_long_list_is_shortened_with_a_count_and_the_advice_stays_whole(tmp_path):
    df = pd.DataFrame({f"comment_field_{k:02d}": [f"note {k}-{i}" for i in range(N)] for k in range(40)})
    df["outcome"] = np.arange(N) % 2
    path = _write(df, tmp_path / "t.csv")
    with pytest.raises(DataError) as err:
        load_dataset(_cfg(path), SEED)
    line = str(err.value)
    shown = [c for c in df.columns[:-1] if f"'{c}'" in line]
    assert shown == list(df.columns[: len(shown)]) and 1 <= len(shown) < 40
    assert line.startswith(f"table: {path} has free-text columns 'comment_field_00'")
    assert line.endswith(f" (and {40 - len(shown)} more) {TEXT_ADVICE}")
    assert len(line) - len(path) < 260  # fits the CLI's 300-character line with a path of 40 characters


def test_the_free_text_rule(tmp_path):
    """More than 20 distinct values, and either more distinct values than half the non-empty cells or a median
    distinct value of 3+ words; empty cells are not values."""
    words = pd.Series([f"w{k}" for k in range(21)] * 2)  # 21 distinct in 42 cells: half, one word each
    assert not is_free_text(pd.Series([f"id{k}" for k in range(20)]))  # 20 distinct: a category, however unique
    assert is_free_text(pd.Series([f"id{k}" for k in range(21)]))
    assert not is_free_text(words)
    assert is_free_text(pd.Series([f"{w} and more" for w in words]))  # the same, of three words
    assert is_free_text(pd.Series([*[f"id{k}" for k in range(21)], *[None] * 40]))  # 21 of 21 non-empty cells


def _splits_x(data) -> np.ndarray:
    return np.concatenate([data.train.x.numpy(), data.val.x.numpy(), data.test.x.numpy()])


def test_drop_leaves_the_text_out_as_if_the_file_had_never_held_it(tmp_path):
    df = _frame()
    path = _write(df, tmp_path / "t.csv")
    without = _write(df.drop(columns=TEXT), tmp_path / "without.csv")
    data = load_dataset(_cfg(path, categorical="onehot", text_columns="drop"), SEED)
    reference = load_dataset(_cfg(without, categorical="onehot"), SEED)
    np.testing.assert_array_equal(_splits_x(data), _splits_x(reference))
    pre = data.preprocessing
    assert pre["dropped_columns"] == TEXT and reference.preprocessing["dropped_columns"] == []
    assert [c["name"] for c in pre["columns"]] == ["age", "site", "town"]
    assert pre["feature_names"] == reference.preprocessing["feature_names"]


def test_the_champion_takes_raw_rows_with_the_dropped_columns_in_them(tmp_path):
    from calib_core.preprocess import apply_record

    df = _frame()
    data = load_dataset(_cfg(_write(df, tmp_path / "t.csv"), categorical="onehot", text_columns="drop"), SEED)
    y = (df["outcome"] == "relapse").to_numpy().astype(int)
    _, _, te = train_val_test_indices(N, val_fraction=0.15, test_fraction=0.15, seed=SEED, labels=y)
    raw = df.iloc[te.numpy()]  # as in the file: label and free text included
    np.testing.assert_allclose(apply_record(data.preprocessing, raw), data.test.x.numpy(), rtol=1e-6, atol=1e-6)


def test_onehot_encodes_each_distinct_train_value_of_the_text(tmp_path):
    df = _frame()
    data = load_dataset(_cfg(_write(df, tmp_path / "t.csv"), categorical="onehot", text_columns="onehot"), SEED)
    y = (df["outcome"] == "relapse").to_numpy().astype(int)
    tr, _, _ = train_val_test_indices(N, val_fraction=0.15, test_fraction=0.15, seed=SEED, labels=y)
    by_name = {c["name"]: c for c in data.preprocessing["columns"]}
    for c in TEXT:
        assert by_name[c]["kind"] == "categorical"
        assert by_name[c]["categories"] == np.unique(df[c].to_numpy()[tr.numpy()]).tolist()
    expected = 1 + sum(len(np.unique(df[c].to_numpy()[tr.numpy()])) for c in ["notes", "site", "ticket", "town"])
    expected += len(np.unique(df["remarks"].to_numpy()[tr.numpy()]))
    assert data.input_shape == (expected,) and data.preprocessing["dropped_columns"] == []


def test_drop_that_leaves_no_feature_is_one_line(tmp_path):
    df = _frame()[["notes", "ticket", "outcome"]]
    path = _write(df, tmp_path / "t.csv")
    with pytest.raises(DataError) as err:
        load_dataset(_cfg(path, text_columns="drop"), SEED)
    assert str(err.value) == (
        f"table: every feature column of {path} is free text ('notes', 'ticket'); set data.text_columns: onehot "
        "(allowed: reject, drop, onehot), or add numeric columns"
    )


# --- misspelt columns ---------------------------------------------------------------------------------------------
def _wide(tmp_path) -> str:
    cols = {f"measure_{k:02d}": np.arange(N, dtype=float) * k for k in range(30)}
    cols.update({"age": np.arange(N, dtype=float), "site": np.arange(N) % 3, "outcome": np.arange(N) % 2})
    return _write(pd.DataFrame(cols), tmp_path / "t.csv")


def test_a_misspelt_label_column_gets_the_closest_name_and_the_column_count(tmp_path):
    path = _wide(tmp_path)
    for given in ("outcom", "Outcome", "outcome "):
        with pytest.raises(DataError) as err:
            load_dataset(DataConfig(name="table", path=path, label_column=given), SEED)
        line = str(err.value)
        assert line.startswith(
            f"table: column {given!r} (data.label_column; did you mean 'outcome'?) is not in {path}, which has 33 "
            "columns: measure_00, measure_01, "
        ), line
        assert line.endswith(" more)") and "\n" not in line


def test_every_misspelt_feature_column_is_named_with_its_closest_names(tmp_path):
    path = _wide(tmp_path)
    cfg = DataConfig(name="table", path=path, label_column="outcome", feature_columns=["agee", "site", "zzz"])
    with pytest.raises(DataError) as err:
        load_dataset(cfg, SEED)
    assert str(err.value).startswith(
        "table: columns 'agee' (data.feature_columns; did you mean 'age'?), 'zzz' (data.feature_columns) are not "
        f"in {path}, which has 33 columns: measure_00, "
    )

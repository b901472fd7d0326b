"""The file formats (image_folder, table, arrays) and breast_cancer against independent references: numpy's
statistics of the train rows, torchvision's ImageFolder, PIL's resize, an .npz round trip; and
`DataSplits.preprocessing` is enough to encode raw inputs again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.data.files import DataError
from calib_core.data.splits import train_val_test_indices
from calib_core.registry import DATASETS

SEED = 3


def _idx(y: np.ndarray, cfg: DataConfig, seed: int = SEED) -> tuple[np.ndarray, ...]:
    tr, va, te = train_val_test_indices(
        len(y), val_fraction=cfg.val_fraction, test_fraction=cfg.test_fraction, seed=seed, labels=y
    )
    return tr.numpy(), va.numpy(), te.numpy()


def _frame(n: int = 80) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "age": rng.normal(50, 10, n),
            "dose": rng.integers(0, 7, n),
            "smoker": rng.integers(0, 2, n).astype(bool),
            "site": rng.choice(["arm", "leg", "neck"], n),
            "outcome": rng.choice(["relapse", "cured", "stable"], n),
        }
    )


# --- table ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_standardises_with_train_rows_only_as_numpy_does(tmp_path, suffix):
    df = _frame()
    path = tmp_path / f"t{suffix}"
    df.to_csv(path, index=False) if suffix == ".csv" else df.to_parquet(path)
    cfg = DataConfig(name="table", path=str(path), label_column="outcome", feature_columns=["age", "dose", "smoker"])
    data = load_dataset(cfg, SEED)

    classes = sorted(df["outcome"].unique())
    y = np.array([classes.index(v) for v in df["outcome"]])
    tr, va, te = _idx(y, cfg)
    raw = df[["age", "dose", "smoker"]].to_numpy(dtype=np.float64)
    mean, std = raw[tr].mean(axis=0), raw[tr].std(axis=0)  # population std, train rows only
    for split, rows in ((data.train, tr), (data.val, va), (data.test, te)):
        np.testing.assert_allclose(split.x.numpy(), (raw[rows] - mean) / std, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(split.y.numpy(), y[rows])
    assert data.preprocessing["class_names"] == classes == ["cured", "relapse", "stable"]
    np.testing.assert_allclose([c["mean"] for c in data.preprocessing["columns"]], mean)
    np.testing.assert_allclose(data.stats["std"], std)
    assert data.input_shape == (3,) and data.num_classes == 3
    assert not np.allclose(raw.mean(axis=0), mean)  # the whole table's mean differs: train only was used


def test_csv_and_parquet_give_the_same_splits(tmp_path):
    df = _frame()
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet")
    kw = {"label_column": "outcome", "categorical": "onehot"}
    a = load_dataset(DataConfig(name="table", path=str(tmp_path / "t.csv"), **kw), SEED)
    b = load_dataset(DataConfig(name="table", path=str(tmp_path / "t.parquet"), **kw), SEED)
    for s in ("train", "val", "test"):
        torch.testing.assert_close(getattr(a, s).x, getattr(b, s).x)
        assert torch.equal(getattr(a, s).y, getattr(b, s).y)


def test_table_one_hot_uses_train_categories_and_imputes_train_means(tmp_path):
    df = _frame(60)
    df.loc[[2, 5, 11], "age"] = np.nan
    df.loc[7, "site"] = None
    cfg = DataConfig(name="table", path="t.csv", label_column="outcome", categorical="onehot", missing="impute_mean")
    classes = sorted(df["outcome"].unique())
    y = np.array([classes.index(v) for v in df["outcome"]])
    tr, _, _ = _idx(y, cfg)
    only_val = [i for i in range(60) if i not in set(tr.tolist())][0]
    df.loc[only_val, "site"] = "scalp"  # a category the train rows never see
    df.to_csv(tmp_path / "t.csv", index=False)
    data = load_dataset(cfg.model_copy(update={"path": str(tmp_path / "t.csv")}), SEED)
    pre = data.preprocessing
    assert pre["feature_names"] == ["age", "dose", "smoker", "site=arm", "site=leg", "site=neck"]
    site = next(c for c in pre["columns"] if c["name"] == "site")
    assert site["categories"] == sorted(set(df.loc[tr, "site"].dropna()))
    age = df["age"].to_numpy()
    seen = age[tr][~np.isnan(age[tr])]
    age_col = next(c for c in pre["columns"] if c["name"] == "age")
    assert age_col["fill"] == pytest.approx(seen.mean()) and age_col["std"] == pytest.approx(seen.std())
    x = np.concatenate([data.train.x.numpy(), data.val.x.numpy(), data.test.x.numpy()])
    rows = np.concatenate(_idx(y, cfg))
    by_row = dict(zip(rows.tolist(), x))
    assert by_row[2][0] == pytest.approx(0.0, abs=1e-6)  # imputed with the train mean: 0 once standardised
    np.testing.assert_array_equal(by_row[7][3:], 0.0)  # a missing category: all zeros
    np.testing.assert_array_equal(by_row[only_val][3:], 0.0)  # an unseen category: all zeros
    assert json.loads(json.dumps(pre)) == pre


def _encode(pre: dict, df: pd.DataFrame) -> np.ndarray:
    """An independent encoder of raw rows from `preprocessing` alone (what an exported model must do)."""
    cols = []
    for c in pre["columns"]:
        v = df[c["name"]]
        if c["kind"] == "numeric":
            a = v.to_numpy(dtype=np.float64, na_value=np.nan)
            a = np.where(np.isnan(a), c["fill"] if c["fill"] is not None else np.nan, a)
            cols.append(((a - c["mean"]) / c["std"])[:, None])
        else:
            cols.append(np.stack([(v.astype(str) == k) & v.notna() for k in c["categories"]], 1).astype(float))
    return np.concatenate(cols, 1)


def test_table_preprocessing_encodes_raw_rows_as_the_loader_did(tmp_path):
    df = _frame()
    df.to_parquet(tmp_path / "t.parquet")
    data = load_dataset(
        DataConfig(name="table", path=str(tmp_path / "t.parquet"), label_column="outcome", categorical="onehot"), SEED
    )
    y = np.array([sorted(df["outcome"].unique()).index(v) for v in df["outcome"]])
    _, _, te = _idx(y, DataConfig())
    np.testing.assert_allclose(_encode(data.preprocessing, df.iloc[te]), data.test.x.numpy(), rtol=1e-5, atol=1e-6)


def test_table_integer_labels_become_sorted_classes_and_the_label_names_stay(tmp_path):
    df = pd.DataFrame({"a": np.arange(30.0), "y": [3, 7, 5] * 10})
    df.to_csv(tmp_path / "t.csv", index=False)
    data = load_dataset(DataConfig(name="table", path=str(tmp_path / "t.csv"), label_column="y"), SEED)
    assert data.preprocessing["class_names"] == ["3", "5", "7"] and data.num_classes == 3
    with pytest.raises(DataError, match=r"the label column 'a' is also a feature column"):
        load_dataset(DataConfig(name="table", path=str(tmp_path / "t.csv"), label_column="a", feature_columns=["a"]), 0)


def test_breast_cancer_is_sklearns_table_through_the_table_code(tmp_path):
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer(as_frame=True)
    bunch.frame.to_csv(tmp_path / "bc.csv", index=False)
    ours = load_dataset(DataConfig(name="breast_cancer"), SEED)
    via_csv = load_dataset(DataConfig(name="table", path=str(tmp_path / "bc.csv"), label_column="target"), SEED)
    for s in ("train", "val", "test"):
        torch.testing.assert_close(getattr(ours, s).x, getattr(via_csv, s).x)
        assert torch.equal(getattr(ours, s).y, getattr(via_csv, s).y)
    assert ours.preprocessing["class_names"] == ["malignant", "benign"]
    assert DATASETS.meta("breast_cancer")["shape"] == (tuple(ours.input_shape), ours.num_classes) == ((30,), 2)
    assert len(ours.train) + len(ours.val) + len(ours.test) == len(bunch.frame) == 569


# --- image folder -----------------------------------------------------------------------------------------------
def _folder(root: Path, sizes: dict[str, list[tuple[int, int]]], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for cls, shapes in sizes.items():
        (root / cls).mkdir(parents=True)
        for i, (h, w) in enumerate(shapes):
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / cls / f"{i:02d}.png")
    (root / "cat" / "notes.txt").write_text("not an image: skipped as ImageFolder skips it")


def test_image_folder_classes_and_files_are_imagefolders_and_pixels_are_pils(tmp_path):
    from torchvision.datasets import ImageFolder

    root = tmp_path / "img"
    _folder(root, {"dog": [(9, 7)] * 5, "cat": [(12, 10)] * 6, "bird": [(8, 8)] * 5})
    cfg = DataConfig(name="image_folder", path=str(root), image_size=[6, 5])
    data = load_dataset(cfg, SEED)
    ref = ImageFolder(str(root))
    assert data.preprocessing["class_names"] == ref.classes == ["bird", "cat", "dog"]
    y = np.asarray(ref.targets)
    tr, va, te = _idx(y, cfg)
    pixels = np.stack(
        [np.asarray(ref.loader(p).resize((5, 6), Image.Resampling.BILINEAR)).transpose(2, 0, 1) for p, _ in ref.samples]
    ).astype(np.float64)
    mean = pixels[tr].mean(axis=(0, 2, 3)) / 255.0  # per channel, train images only
    std = pixels[tr].std(axis=(0, 2, 3)) / 255.0
    np.testing.assert_allclose(data.stats["mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(data.stats["std"], std, rtol=1e-9)
    for split, rows in ((data.train, tr), (data.val, va), (data.test, te)):
        np.testing.assert_array_equal(split.y.numpy(), y[rows])
        expect = (pixels[rows] / 255.0 - mean[None, :, None, None]) / std[None, :, None, None]
        np.testing.assert_allclose(split.x.numpy(), expect, rtol=1e-5, atol=1e-5)
    assert data.input_shape == (3, 6, 5)
    pre = data.preprocessing
    assert pre["image_size"] == [6, 5] and pre["resize"] == "PIL bilinear" and pre["layout"] == "CHW"
    assert json.loads(json.dumps(pre)) == pre


def test_image_folder_grey_imagenet_and_unresized(tmp_path):
    root = tmp_path / "img"
    _folder(root, {"a": [(6, 6)] * 4, "cat": [(6, 6)] * 4})
    grey = load_dataset(DataConfig(name="image_folder", path=str(root), image_mode="L", normalize="none"), SEED)
    assert grey.input_shape == (1, 6, 6) and float(grey.train.x.max()) <= 1.0 and float(grey.train.x.min()) >= 0.0
    net = load_dataset(DataConfig(name="image_folder", path=str(root), normalize="imagenet"), SEED)
    assert net.stats["mean"] == pytest.approx([0.485, 0.456, 0.406]) and net.preprocessing["resize"] is None
    _folder(tmp_path / "mixed", {"a": [(6, 6), (7, 6)], "cat": [(6, 6)] * 2})
    with pytest.raises(DataError, match=r"a/01.png is 7x6 but .*a/00.png is 6x6; set data.image_size"):
        load_dataset(DataConfig(name="image_folder", path=str(tmp_path / "mixed")), SEED)


# --- arrays ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["npz", "npy_pair"])
def test_arrays_round_trip(tmp_path, layout):
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, (90, 5)).astype(np.float32)
    y = np.arange(90) % 3
    if layout == "npz":
        np.savez(tmp_path / "a.npz", x=x, y=y)
        path = tmp_path / "a.npz"
    else:
        (tmp_path / "pair").mkdir()
        np.save(tmp_path / "pair" / "x.npy", x)
        np.save(tmp_path / "pair" / "y.npy", y)
        path = tmp_path / "pair"
    cfg = DataConfig(name="arrays", path=str(path))
    data = load_dataset(cfg, SEED)
    tr, va, te = _idx(y, cfg)
    mean, std = x[tr].astype(np.float64).mean(0), x[tr].astype(np.float64).std(0)
    np.testing.assert_allclose(data.preprocessing["mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(data.preprocessing["std"], std, rtol=1e-9)
    for split, rows in ((data.train, tr), (data.val, va), (data.test, te)):
        np.testing.assert_array_equal(split.y.numpy(), y[rows])
        back = split.x.numpy() * np.asarray(data.stats["std"]) + np.asarray(data.stats["mean"])
        np.testing.assert_allclose(back, x[rows], rtol=1e-5, atol=1e-5)  # un-standardised: the saved rows
    assert data.preprocessing["axis"] == "feature" and data.preprocessing["class_names"] == ["0", "1", "2"]
    raw = load_dataset(DataConfig(name="arrays", path=str(path), normalize="none"), SEED)
    np.testing.assert_array_equal(raw.test.x.numpy(), x[te])


def test_arrays_images_are_standardised_per_channel(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (40, 2, 4, 4)).astype(np.uint8)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(40) % 2)
    cfg = DataConfig(name="arrays", path=str(tmp_path / "a.npz"))
    data = load_dataset(cfg, SEED)
    tr, _, _ = _idx(np.arange(40) % 2, cfg)
    np.testing.assert_allclose(data.stats["mean"], x[tr].astype(np.float64).mean(axis=(0, 2, 3)), rtol=1e-9)
    assert data.preprocessing["axis"] == "channel" and data.input_shape == (2, 4, 4)


def test_the_splits_are_fixed_by_the_seed_disjoint_and_cover_every_row(tmp_path):
    x = np.arange(200, dtype=np.float32).reshape(100, 2)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(100) % 4)
    cfg = DataConfig(name="arrays", path=str(tmp_path / "a.npz"), normalize="none")
    a, b, c = load_dataset(cfg, 1), load_dataset(cfg, 1), load_dataset(cfg, 2)
    assert torch.equal(a.train.x, b.train.x) and not torch.equal(a.train.x, c.train.x)
    ids = [int(v) for s in (a.train, a.val, a.test) for v in s.x[:, 0].tolist()]
    assert sorted(ids) == list(range(0, 200, 2))


def test_paths_are_made_absolute_where_the_config_is_read(tmp_path, monkeypatch):
    """Trials run in folders of their own: a relative data.path or model.weights is the driver's working folder's."""
    from calib_core.config import ModelConfig

    monkeypatch.chdir(tmp_path)
    assert DataConfig(name="arrays", path="a.npz").path == str(tmp_path / "a.npz")
    assert ModelConfig(name="mlp", weights="w.pt").weights == str(tmp_path / "w.pt")
    again = DataConfig.model_validate(DataConfig(name="arrays", path="a.npz").model_dump())
    assert again.path == str(tmp_path / "a.npz")

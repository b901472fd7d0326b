"""Data loading: disjoint seeded splits, train-only statistics, offline MNIST-1D, torchvision
loaders on fabricated files in the official on-disk formats, augmentation, batching."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from calib_core.config import DataConfig
from calib_core.data import (
    CropFlip,
    DataSplits,
    Split,
    channel_stats,
    iterate_batches,
    list_datasets,
    load_dataset,
    split_indices,
    train_val_test_indices,
)
from calib_core.data import mnist1d as mnist1d_mod
from calib_core.data.torchvision_sets import SPECS

try:
    from fixtures_fabricate import FABRICATORS, fabricate_cifar10
except ImportError:  # tests/ imported as a package
    from tests.fixtures_fabricate import FABRICATORS, fabricate_cifar10

TV_SETS = ["cifar10", "cifar100", "svhn", "mnist", "fashionmnist"]


def _assert_partition(parts, n):
    allidx = torch.cat(parts)
    assert len(allidx) == n and torch.equal(allidx.sort().values, torch.arange(n))  # disjoint and covering


# --- split helper --------------------------------------------------------------------------
@pytest.mark.parametrize("stratify", [False, True])
def test_split_indices_disjoint_covering_seeded(stratify):
    n = 1000
    labels = torch.arange(n) % 7 if stratify else None
    a = train_val_test_indices(n, val_fraction=0.15, test_fraction=0.2, seed=1, labels=labels)
    _assert_partition(a, n)
    assert [len(p) for p in a] == [650, 150, 200]
    b = train_val_test_indices(n, val_fraction=0.15, test_fraction=0.2, seed=1, labels=labels)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = train_val_test_indices(n, val_fraction=0.15, test_fraction=0.2, seed=2, labels=labels)
    assert not torch.equal(a[1], c[1]) and not torch.equal(a[2], c[2])
    if stratify:
        for part in a:
            counts = torch.bincount(labels[part], minlength=7).double()
            assert (counts - len(part) / 7).abs().max() <= 1.0


def test_split_indices_tiny_many_classes_and_no_global_rng():
    state = torch.get_rng_state()
    labels = torch.randint(0, 100, (40,), generator=torch.Generator().manual_seed(0))
    tr, va = split_indices(40, [0.8, 0.2], seed=0, labels=labels)
    _assert_partition([tr, va], 40)
    assert len(va) == 8
    assert torch.equal(state, torch.get_rng_state())
    with pytest.raises(ValueError, match="empty"):
        split_indices(3, [0.9, 0.05, 0.05], seed=0)


# --- Split / DataSplits ----------------------------------------------------------------------
def test_split_basics():
    s = Split(torch.arange(20.0).view(10, 2), torch.arange(10))
    assert len(s) == 10 and s.to("cpu") is s
    sub = s.subset(torch.tensor([3, 1]))
    assert torch.equal(sub.y, torch.tensor([3, 1])) and torch.equal(sub.x[0], torch.tensor([6.0, 7.0]))
    assert torch.equal(s.subset(s.y % 2 == 0).y, torch.tensor([0, 2, 4, 6, 8]))
    assert torch.equal(s.subset([9]).y, torch.tensor([9])) and torch.equal(s.subset(np.array([0])).y, torch.tensor([0]))
    with pytest.raises(ValueError, match="first dimension"):
        Split(torch.zeros(3, 2), torch.zeros(4, dtype=torch.long))


def test_iterate_batches():
    s = Split(torch.arange(50.0).view(25, 2), torch.arange(25))
    plain = list(iterate_batches(s, 10, shuffle=False))
    assert [len(y) for _, y in plain] == [10, 10, 5]
    assert plain[1][0].data_ptr() == s.x[10].data_ptr()  # views, no copy
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    a = [y for _, y in iterate_batches(s, 10, shuffle=True, generator=g1)]
    b = [y for _, y in iterate_batches(s, 10, shuffle=True, generator=g2)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    _assert_partition(a, 25)
    assert not torch.equal(torch.cat(a), torch.arange(25))
    for xb, yb in iterate_batches(s, 10, shuffle=True, generator=g1):
        assert torch.equal(xb[:, 0], 2.0 * yb)  # rows stay paired
    assert [len(y) for _, y in iterate_batches(s, 10, shuffle=True, drop_last=True)] == [10, 10]


def test_iterate_batches_is_fast():
    s = Split(torch.randn(8000, 40), torch.randint(0, 10, (8000,)))
    g = torch.Generator().manual_seed(0)
    t = time.perf_counter()
    for _ in range(10):
        for _ in iterate_batches(s, 128, shuffle=True, generator=g):
            pass
    per_epoch = (time.perf_counter() - t) / 10
    assert per_epoch < 0.05, f"{per_epoch * 1e3:.1f} ms per MNIST-1D-sized epoch"


# --- augmentation ----------------------------------------------------------------------------
def test_crop_flip_deterministic_and_correct():
    x = torch.randn(16, 3, 32, 32)
    aug = CropFlip(padding=4, flip=True, fill=(-1.0, -2.0, -3.0))
    a = aug(x, torch.Generator().manual_seed(5))
    b = aug(x, torch.Generator().manual_seed(5))
    c = aug(x, torch.Generator().manual_seed(6))
    assert a.shape == x.shape and a.dtype == x.dtype and torch.equal(a, b) and not torch.equal(a, c)
    padded = torch.stack([torch.full((40, 40), v) for v in (-1.0, -2.0, -3.0)]).expand(16, 3, 40, 40).clone()
    padded[:, :, 4:36, 4:36] = x
    for i in range(16):  # every output is some 32x32 window of the padded image, maybe mirrored
        windows = [padded[i, :, r : r + 32, q : q + 32] for r in range(9) for q in range(9)]
        assert any(torch.equal(a[i], w) or torch.equal(a[i], w.flip(-1)) for w in windows), i
    flips = CropFlip(padding=0, flip=True)(x, torch.Generator().manual_seed(0))
    is_flip = [torch.equal(flips[i], x[i].flip(-1)) for i in range(16)]
    assert all(f or torch.equal(flips[i], x[i]) for i, f in enumerate(is_flip)) and 0 < sum(is_flip) < 16


def test_augment_identity_when_off_and_policy_when_on(tmp_path):
    fabricate_cifar10(tmp_path)
    cfg = dict(name="cifar10", root=str(tmp_path), verify_checksums=False, val_fraction=0.2)
    off = load_dataset(DataConfig(**cfg), 0)
    x = off.train.x[:4]
    assert off.augment(x, torch.Generator()) is x
    on = load_dataset(DataConfig(**cfg, augment=True), 0)
    assert on.augmentation == CropFlip(4, True, on.augmentation.fill)
    black = (torch.tensor(0.0) - torch.tensor(on.stats["mean"])) / torch.tensor(on.stats["std"])
    torch.testing.assert_close(torch.tensor(on.augmentation.fill), black.float())
    assert SPECS["svhn"].flip is False and SPECS["mnist"].flip is False  # mirrored digits change meaning
    assert on.augment(x, torch.Generator().manual_seed(0)).shape == x.shape
    with pytest.raises(ValueError, match="augment.*mnist1d"):
        load_dataset(DataConfig(name="mnist1d", num_samples=100, augment=True), 0)


# --- MNIST-1D ----------------------------------------------------------------------------------
def test_mnist1d_splits_shapes_and_train_only_stats(no_network):
    cfg = DataConfig(name="mnist1d", num_samples=500)
    d = load_dataset(cfg, seed=0)
    assert isinstance(d, DataSplits) and d.name == "mnist1d" and d.num_classes == 10 and d.input_shape == (40,)
    assert [len(d.train), len(d.val), len(d.test)] == [350, 75, 75]
    for s in (d.train, d.val, d.test):
        assert s.x.dtype == torch.float32 and s.y.dtype == torch.int64 and s.x.shape[1:] == (40,)
        assert s.y.min() >= 0 and s.y.max() < 10
    # standardised with the train split's statistics, and only those
    x_raw, y_raw = mnist1d_mod.generate_mnist1d(500, 0)
    tr, va, te = train_val_test_indices(500, val_fraction=0.15, test_fraction=0.15, seed=0, labels=y_raw)
    mean, std = float(x_raw[tr.numpy()].mean(dtype=np.float64)), float(x_raw[tr.numpy()].std(dtype=np.float64))
    assert d.stats["mean"][0] == pytest.approx(mean, abs=1e-6) and d.stats["std"][0] == pytest.approx(std, rel=1e-6)
    assert d.stats["mean"][0] != pytest.approx(float(x_raw.mean(dtype=np.float64)), abs=1e-6)
    torch.testing.assert_close(d.test.x, torch.from_numpy((x_raw[te.numpy()] - mean) / std).float(), atol=1e-5, rtol=0)
    assert torch.equal(d.test.y, torch.from_numpy(y_raw[te.numpy()]))
    assert abs(float(d.train.x.mean())) < 1e-5 and abs(float(d.train.x.std(unbiased=False)) - 1) < 1e-5


def test_mnist1d_seeded():
    a = load_dataset(DataConfig(num_samples=300), 0)
    b = load_dataset(DataConfig(num_samples=300), 0)
    c = load_dataset(DataConfig(num_samples=300), 1)
    for s in ("train", "val", "test"):
        assert torch.equal(getattr(a, s).x, getattr(b, s).x) and torch.equal(getattr(a, s).y, getattr(b, s).y)
    assert not torch.equal(a.test.x, c.test.x)
    b.train.x.add_(1.0)  # caller mutation must not leak into the cache
    assert torch.equal(load_dataset(DataConfig(num_samples=300), 0).train.x, a.train.x)


def test_mnist1d_generates_8000_offline_fast(no_network, capsys, monkeypatch):
    monkeypatch.setenv(mnist1d_mod.CACHE_ENV, "off")  # generated here, not read from the disk cache
    mnist1d_mod._generate_cached.cache_clear()
    np_state, py_state = np.random.get_state(), random.getstate()
    t = time.perf_counter()
    x, y = mnist1d_mod.generate_mnist1d(8000, seed=0)
    elapsed = time.perf_counter() - t
    with capsys.disabled():
        print(f"\n[mnist1d] generated 8000 samples offline in {elapsed:.2f} s")
    assert x.shape == (8000, 40) and x.dtype == np.float32 and np.bincount(y).tolist() == [800] * 10
    assert elapsed < 45, elapsed
    # the package seeds numpy's and Python's global RNGs: we restore them
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state))
    d = load_dataset(DataConfig(), seed=0)  # default num_samples is 8000: served from the cache
    assert len(d.train) + len(d.val) + len(d.test) == 8000


# --- digits ------------------------------------------------------------------------------------
def test_digits():
    d = load_dataset(DataConfig(name="digits", val_fraction=0.2, test_fraction=0.2), seed=3)
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10
    assert [len(d.train), len(d.val), len(d.test)] == [1078, 359, 360]
    xs = torch.cat([d.train.x, d.val.x, d.test.x])
    assert xs.dtype == torch.float32 and xs.min() == 0.0 and xs.max() == 1.0
    from sklearn.datasets import load_digits

    assert torch.equal(
        torch.bincount(torch.cat([d.train.y, d.val.y, d.test.y])), torch.bincount(torch.tensor(load_digits().target))
    )
    a, b = load_dataset(DataConfig(name="digits"), seed=3), load_dataset(DataConfig(name="digits"), seed=4)
    assert not torch.equal(a.test.x, b.test.x)


def test_config_errors():
    with pytest.raises(ValueError, match="num_samples.*mnist1d"):
        load_dataset(DataConfig(name="digits", num_samples=500), 0)
    with pytest.raises(ValueError, match="data.root"):
        load_dataset(DataConfig(name="cifar10"), 0)
    assert set(list_datasets()) == set(TV_SETS) | {"mnist1d", "digits", "digits_mtl", "mnist1d_mtl", "celeba"} | {
        "image_folder",
        "table",
        "arrays",
        "breast_cancer",
    }


# --- torchvision sets on fabricated files -----------------------------------------------------
@pytest.mark.parametrize("name", TV_SETS)
def test_torchvision_loader_reads_fabricated_files(name, tmp_path, no_network):
    fab = FABRICATORS[name](tmp_path)
    cfg = DataConfig(name=name, root=str(tmp_path), verify_checksums=False, val_fraction=0.2)
    d = load_dataset(cfg, seed=4)
    k = SPECS[name].num_classes
    c = fab.x_train.shape[1]
    assert d.name == name and d.num_classes == k and d.input_shape == fab.x_train.shape[1:]
    # official test split in file order; validation carved from train by the seed
    tr, va = split_indices(len(fab.y_train), [0.8, 0.2], seed=4, labels=fab.y_train)
    mean = torch.tensor(d.stats["mean"]).view(1, c, 1, 1)
    std = torch.tensor(d.stats["std"]).view(1, c, 1, 1)
    for split, x_u8, y in (
        (d.train, fab.x_train[tr], fab.y_train[tr]),
        (d.val, fab.x_train[va], fab.y_train[va]),
        (d.test, fab.x_test, fab.y_test),
    ):
        assert split.x.dtype == torch.float32 and split.y.dtype == torch.int64
        back = torch.round((split.x.double() * std + mean) * 255).to(torch.uint8)
        assert torch.equal(back, torch.from_numpy(x_u8))  # pixel values, channel order and layout round-trip
        assert torch.equal(split.y, torch.from_numpy(y))  # labels round-trip (SVHN's 10 -> 0 included)
    # per-channel statistics come from the train part only
    x_tr = fab.x_train[tr].astype(np.float64) / 255
    np.testing.assert_allclose(d.stats["mean"], x_tr.mean(axis=(0, 2, 3)), atol=1e-9)
    np.testing.assert_allclose(d.stats["std"], x_tr.std(axis=(0, 2, 3)), rtol=1e-9)
    train_x = d.train.x.double()
    assert train_x.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert (train_x.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-5


def test_test_split_never_enters_statistics(tmp_path):
    fabricate_cifar10(tmp_path / "a", test_value=0)
    fabricate_cifar10(tmp_path / "b", test_value=255)  # same train files, very different test
    da, db = (load_dataset(DataConfig(name="cifar10", root=str(tmp_path / r), verify_checksums=False), 0) for r in "ab")
    assert da.stats == db.stats and torch.equal(da.train.x, db.train.x) and torch.equal(da.val.x, db.val.x)


def test_torchvision_splits_seeded(tmp_path):
    fabricate_cifar10(tmp_path)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), verify_checksums=False, val_fraction=0.25)
    a, b, c = load_dataset(cfg, 0), load_dataset(cfg, 0), load_dataset(cfg, 1)
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.train.y, b.train.y)
    assert not torch.equal(a.val.x, c.val.x)
    assert torch.equal(a.test.y, c.test.y)  # the official test split does not depend on the seed
    assert [len(a.train), len(a.val), len(a.test)] == [30, 10, 10]


@pytest.mark.parametrize("name", TV_SETS)
def test_missing_files_name_the_path(name, tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as e:
        load_dataset(DataConfig(name=name, root=str(root)), 0)
    assert str(root) in str(e.value) and name in str(e.value) and "download" in str(e.value)
    # one file missing: that file is named
    FABRICATORS[name](tmp_path / "some")
    victim = tmp_path / "some" / SPECS[name].files[-1]
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=str(victim)):
        load_dataset(DataConfig(name=name, root=str(tmp_path / "some"), verify_checksums=False), 0)


def test_checksums_checked_by_default(tmp_path):
    from torchvision.datasets import CIFAR10

    fabricate_cifar10(tmp_path)
    # stock torchvision refuses any non-official file, without saying which: why we check ourselves
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CIFAR10(str(tmp_path), train=True, download=False)
    with pytest.raises(ValueError, match=r"data_batch_1.*md5.*official.*verify_checksums"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path)), 0)


def test_svhn_checksums_checked_by_default(tmp_path):
    FABRICATORS["svhn"](tmp_path)
    with pytest.raises(ValueError, match=r"train_32x32.mat.*md5"):
        load_dataset(DataConfig(name="svhn", root=str(tmp_path)), 0)


def test_download_failure_is_reported(tmp_path, no_network):
    with pytest.raises(RuntimeError, match=rf"cifar10: download to {tmp_path}"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path), download=True), 0)


def test_labels_out_of_range_rejected(tmp_path):
    import pickle

    fabricate_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    entry = pickle.loads(path.read_bytes())
    entry["labels"][0] = 12
    path.write_bytes(pickle.dumps(entry, protocol=2))
    with pytest.raises(ValueError, match=r"test labels.*\[0, 10\).*max 12"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path), verify_checksums=False), 0)


def test_channel_stats_chunked_matches_direct():
    x = torch.randint(0, 256, (50, 3, 4, 4), dtype=torch.uint8)
    mean, std = channel_stats(x, chunk=7)
    xd = x.double()
    torch.testing.assert_close(mean, xd.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(std, xd.std(dim=(0, 2, 3), unbiased=False))

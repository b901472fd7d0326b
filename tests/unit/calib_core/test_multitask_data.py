"""Multi-task data: embedded digits_mtl / mnist1d_mtl, label masking, and CelebA on fabricated files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from calib_core.config import DataConfig
from calib_core.data import celeba as celeba_mod
from calib_core.data import load_dataset, train_val_test_indices
from calib_core.data.celeba import load_celeba, load_celeba_splits
from calib_core.data.multitask import DIGIT_TASKS, MULTITASK_LOADERS, digit_task_labels, load_multitask, mask_labels

ATTRS = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
    "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
    "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
    "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
    "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young"
).split()


# --- label functions and masking ------------------------------------------------------------
def test_digit_task_labels_against_independent_computation():
    d = torch.arange(10).repeat(3)
    y = digit_task_labels(d)
    assert y.shape == (30, 4) and y.dtype == torch.long
    for i, v in enumerate(d.tolist()):
        is_prime = v > 1 and all(v % q for q in range(2, v))
        assert y[i].tolist() == [v, 1 if v % 2 else 0, 1 if v >= 5 else 0, 1 if is_prime else 0]
    assert [t.name for t in DIGIT_TASKS] == ["digit", "parity", "ge5", "prime"]
    assert [t.num_classes for t in DIGIT_TASKS] == [10, 2, 2, 2]
    with pytest.raises(ValueError, match="0..9"):
        digit_task_labels(torch.tensor([3, 10]))


def test_mask_labels_exact_rate_and_seeded():
    y = digit_task_labels(torch.arange(10).repeat(20))  # (200, 4)
    m = mask_labels(y, [0.0, 0.1, 0.25, 0.5], seed=3)
    assert (m == -1).sum(0).tolist() == [0, 20, 50, 100]
    kept = m != -1
    assert torch.equal(m[kept], y[kept])  # nothing else changes
    assert torch.equal(m, mask_labels(y, [0.0, 0.1, 0.25, 0.5], seed=3))
    assert not torch.equal(m, mask_labels(y, [0.0, 0.1, 0.25, 0.5], seed=4))
    assert torch.equal(y, digit_task_labels(torch.arange(10).repeat(20)))  # input untouched
    # tasks are masked independently: not the same rows everywhere
    assert not torch.equal(m[:, 2] == -1, m[:, 3] == -1)
    for bad in (1.5, [0.1, 0.2]):
        with pytest.raises(ValueError, match="missing_fraction"):
            mask_labels(y, bad, seed=0)


# --- embedded multi-task sets ---------------------------------------------------------------
def test_digits_mtl_splits_disjoint_seeded_and_labels():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    d = load_multitask("digits_mtl", seed=5, val_fraction=0.2, test_fraction=0.2)
    assert d.name == "digits_mtl" and d.num_classes == 10 and d.input_shape == (1, 8, 8)
    assert d.tasks == DIGIT_TASKS and d.tasks[1] == ("parity", 2)
    tr, va, te = train_val_test_indices(
        1797, val_fraction=0.2, test_fraction=0.2, seed=5, labels=torch.tensor(bunch.target)
    )
    all_idx = torch.cat([tr, va, te])
    assert len(all_idx) == 1797 and len(torch.unique(all_idx)) == 1797  # disjoint and covering
    for split, idx in ((d.train, tr), (d.val, va), (d.test, te)):
        x_ref = torch.from_numpy(bunch.images[idx.numpy()].astype(np.float32) / 16).unsqueeze(1)
        assert torch.equal(split.x, x_ref)
        digit = torch.from_numpy(bunch.target[idx.numpy()])
        assert split.y.shape == (len(idx), 4) and split.y.dtype == torch.long
        assert torch.equal(split.y[:, 0], digit)
        assert torch.equal(split.y[:, 1], digit % 2)
        assert torch.equal(split.y[:, 2], (digit >= 5).long())
        assert torch.equal(split.y[:, 3], ((digit == 2) | (digit == 3) | (digit == 5) | (digit == 7)).long())
    # the same split as the single-task set; seeded
    single = load_dataset(DataConfig(name="digits", val_fraction=0.2, test_fraction=0.2), seed=5)
    assert torch.equal(single.test.x, d.test.x) and torch.equal(single.test.y, d.test.y[:, 0])
    again = load_multitask("digits_mtl", seed=5, val_fraction=0.2, test_fraction=0.2)
    other = load_multitask("digits_mtl", seed=6, val_fraction=0.2, test_fraction=0.2)
    assert torch.equal(again.train.y, d.train.y) and torch.equal(again.val.x, d.val.x)
    assert not torch.equal(other.test.x, d.test.x)
    assert (d.train.y != -1).all()  # nothing masked by default


def test_mnist1d_mtl(no_network):
    d = load_multitask("mnist1d_mtl", seed=1, num_samples=300)
    assert d.input_shape == (40,) and d.tasks == DIGIT_TASKS
    assert len(d.train) + len(d.val) + len(d.test) == 300
    single = load_dataset(DataConfig(name="mnist1d", num_samples=300), seed=1)
    for a, b in ((d.train, single.train), (d.val, single.val), (d.test, single.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, digit_task_labels(b.y))
    assert d.stats == single.stats
    via_cfg = MULTITASK_LOADERS["mnist1d_mtl"](DataConfig(num_samples=300), 1)
    assert torch.equal(via_cfg.test.y, d.test.y)
    with pytest.raises(ValueError, match="mnist1d_mtl only"):
        load_multitask("digits_mtl", seed=0, num_samples=500)
    with pytest.raises(ValueError, match="allowed: digits_mtl, mnist1d_mtl"):
        load_multitask("cifar_mtl", seed=0)


def test_missing_labels_rate_and_splits():
    d = load_multitask("digits_mtl", seed=2, missing_fraction=[0.0, 0.3, 0.5, 0.9])
    n = len(d.train)
    assert (d.train.y == -1).sum(0).tolist() == [0, round(0.3 * n), round(0.5 * n), round(0.9 * n)]
    assert (d.val.y != -1).all() and (d.test.y != -1).all()  # train only by default
    full = load_multitask("digits_mtl", seed=2)
    kept = d.train.y != -1
    assert torch.equal(d.train.y[kept], full.train.y[kept])
    assert torch.equal(load_multitask("digits_mtl", seed=2, missing_fraction=[0.0, 0.3, 0.5, 0.9]).train.y, d.train.y)
    e = load_multitask("digits_mtl", seed=2, missing_fraction=0.2, missing_splits=("train", "val", "test"))
    for split in (e.train, e.val, e.test):
        assert (split.y == -1).sum(0).tolist() == [round(0.2 * len(split))] * 4
    with pytest.raises(ValueError, match="missing_splits"):
        load_multitask("digits_mtl", seed=2, missing_splits=("holdout",))


# --- CelebA on a fabricated directory in torchvision's exact format --------------------------
def fabricate_celeba(root: Path, partition=(0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2), seed: int = 0, size=(24, 30)) -> dict:
    """Write <root>/celeba/ as torchvision reads it. Images: constant colour (w x h = size) with
    (h - w) / 2 white rows at the top and bottom (what the centre crop cuts). Returns what a loader must give."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "celeba"
    (base / "img_align_celeba").mkdir(parents=True)
    n = len(partition)
    files = [f"{i + 1:06d}.jpg" for i in range(n)]
    attrs = rng.choice([-1, 1], size=(n, 40))
    colours = rng.integers(30, 220, size=(n, 3))
    w, h = size
    for f, col in zip(files, colours):
        img = np.empty((h, w, 3), dtype=np.uint8)
        img[:] = col
        pad = (h - w) // 2
        img[:pad], img[h - pad :] = 255, 255
        Image.fromarray(img).save(base / "img_align_celeba" / f, quality=100, subsampling=0)
    # list_attr_celeba.txt: count, names (trailing space, as in the release), "file -1  1 ..." rows
    lines = [str(n), " ".join(ATTRS) + " "] + [
        f + " " + " ".join(f"{v:2d}" for v in row) for f, row in zip(files, attrs)
    ]
    (base / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (base / "list_eval_partition.txt").write_text("".join(f"{f} {p}\n" for f, p in zip(files, partition)))
    (base / "identity_CelebA.txt").write_text("".join(f"{f} {rng.integers(1, 10000)}\n" for f in files))
    bbox = [str(n), "image_id x_1 y_1 width height"] + [f"{f}    95  71 226 313" for f in files]
    (base / "list_bbox_celeba.txt").write_text("\n".join(bbox) + "\n")
    marks = [
        str(n),
        "lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y rightmouth_x rightmouth_y",
    ]
    marks += [f"{f}  69 109 106 113  77 142  73 152 108 154" for f in files]
    (base / "list_landmarks_align_celeba.txt").write_text("\n".join(marks) + "\n")
    part = np.array(partition)
    return {"files": files, "attrs01": (attrs + 1) // 2, "colours": colours, "partition": part}


def test_celeba_reads_fabricated_files_through_torchvision(tmp_path, no_network):
    fab = fabricate_celeba(tmp_path)
    d = load_celeba_splits(tmp_path, verify_checksums=False, image_size=16, num_workers=2)
    assert d.name == "celeba" and d.num_classes == 2 and d.input_shape == (3, 16, 16)
    assert [t.name for t in d.tasks] == ATTRS and all(t.num_classes == 2 for t in d.tasks)
    mean = torch.tensor(d.stats["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(d.stats["std"]).view(1, 3, 1, 1)
    for split, code in ((d.train, 0), (d.val, 1), (d.test, 2)):
        rows = np.flatnonzero(fab["partition"] == code)  # official split, file order
        assert split.y.dtype == torch.long and split.y.shape == (len(rows), 40)
        assert torch.equal(split.y, torch.from_numpy(fab["attrs01"][rows]))  # -1/1 -> 0/1
        pixels = (split.x.double() * std + mean) * 255
        want = torch.from_numpy(fab["colours"][rows]).double().view(-1, 3, 1, 1)
        assert (pixels - want).abs().max() < 4  # the white rows were cropped away; channels in RGB order
    train_px = torch.from_numpy(fab["colours"][fab["partition"] == 0]).double() / 255
    np.testing.assert_allclose(d.stats["mean"], train_px.mean(0).numpy(), atol=3 / 255)  # train statistics only
    assert d.train.x.double().mean(dim=(0, 2, 3)).abs().max() < 1e-5
    # resize path (crop 24 -> 8) and max_per_split
    small = load_celeba_splits(tmp_path, verify_checksums=False, image_size=8, max_per_split=2)
    assert [len(small.train), len(small.val), len(small.test)] == [2, 2, 2] and small.input_shape == (3, 8, 8)
    assert torch.equal(small.train.y, torch.from_numpy(fab["attrs01"][:2]))
    px = (
        small.train.x.double() * torch.tensor(small.stats["std"]).view(1, 3, 1, 1)
        + torch.tensor(small.stats["mean"]).view(1, 3, 1, 1)
    ) * 255
    assert (px - torch.from_numpy(fab["colours"][:2]).double().view(-1, 3, 1, 1)).abs().max() < 4
    # the registry-style adapter reads data.root / data.verify_checksums
    via_cfg = load_celeba(DataConfig(root=str(tmp_path), verify_checksums=False), seed=0)
    assert via_cfg.input_shape == (3, 64, 64) and torch.equal(via_cfg.test.y, d.test.y)


def test_celeba_integrity(tmp_path):
    from torchvision.datasets import CelebA

    fabricate_celeba(tmp_path)
    # stock torchvision refuses non-official files without naming them: why we check ourselves
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CelebA(str(tmp_path), split="train", download=False)
    with pytest.raises(ValueError, match="list_attr_celeba.txt.*official"):
        load_celeba_splits(tmp_path)  # checksums on by default
    victim = tmp_path / "celeba" / "list_eval_partition.txt"
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=str(victim)):
        load_celeba_splits(tmp_path, verify_checksums=False)
    with pytest.raises(FileNotFoundError) as e:
        load_celeba_splits(tmp_path / "nowhere")
    msg = str(e.value)
    assert "does not exist" in msg and "download" in msg
    for f in (
        "img_align_celeba",
        "list_attr_celeba.txt",
        "list_eval_partition.txt",
        "identity_CelebA.txt",
        "list_bbox_celeba.txt",
        "list_landmarks_align_celeba.txt",
    ):
        assert f in msg
    with pytest.raises(ValueError, match="data.root"):
        load_celeba(DataConfig(), 0)


def test_celeba_missing_image_named(tmp_path):
    fab = fabricate_celeba(tmp_path)
    gone = tmp_path / "celeba" / "img_align_celeba" / fab["files"][7]
    gone.unlink()
    with pytest.raises(FileNotFoundError, match=str(gone)):
        load_celeba_splits(tmp_path, verify_checksums=False, image_size=8)


def test_celeba_official_md5_table():
    assert set(celeba_mod.OFFICIAL_MD5) == set(celeba_mod.LIST_FILES)

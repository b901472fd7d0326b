"""Staged datasets (calib_core/data/staging.py): stage a dataset in torchvision's on-disk format with its manifest,
sync it into a data root verified file by file, and the trials' reading path syncing instead of downloading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib_core.config import DataConfig
from calib_core.data import stage, staging
from calib_core.data.torchvision_sets import SPECS, read_raw
from tests.fixtures_fabricate import fabricate_cifar10

FILES = SPECS["cifar10"].files


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, Path]:
    """(the engineer's download folder, the staging store) with CIFAR-10 staged from fabricated batches."""
    src, store = tmp_path / "download", tmp_path / "store"
    fabricate_cifar10(src)
    stage.stage("cifar10", str(store), src, download=False, verify_checksums=False)
    return src, store


def test_stage_writes_every_file_and_a_manifest_of_sizes_and_digests(staged):
    src, store = staged
    manifest = json.loads((store / "cifar10" / staging.MANIFEST).read_text())
    assert [f["path"] for f in manifest["files"]] == list(SPECS["cifar10"].files)
    for f in manifest["files"]:
        assert (store / "cifar10" / f["path"]).read_bytes() == (src / f["path"]).read_bytes()
        assert staging.file_digest(src / f["path"]) == (f["size"], f["sha256"])
    assert manifest["official_md5_checked"] is False and staging.manifest_problem("cifar10", manifest, FILES) is None


def test_sync_copies_verified_files_and_keeps_good_ones(staged, tmp_path):
    src, store = staged
    root = tmp_path / "root"
    assert staging.sync("cifar10", f"file://{store}", root, FILES) == list(SPECS["cifar10"].files)
    for rel in SPECS["cifar10"].files:
        assert (root / rel).read_bytes() == (src / rel).read_bytes()
    assert staging.sync("cifar10", str(store), root, FILES) == []  # nothing copied twice


def test_sync_refuses_a_file_that_differs_from_the_manifest_and_leaves_nothing(staged, tmp_path):
    _, store = staged
    (store / "cifar10" / "cifar-10-batches-py" / "test_batch").write_bytes(b"tampered")
    root = tmp_path / "root"
    with pytest.raises(ValueError, match=r"test_batch: 8 bytes, sha256 .* but the manifest says .*stage the dataset"):
        staging.sync("cifar10", str(store), root, FILES)
    assert not (root / "cifar-10-batches-py" / "test_batch").exists()
    assert not list((root / "cifar-10-batches-py").glob("*.partial-*"))


def test_missing_or_incomplete_manifest_is_one_line(staged, tmp_path):
    _, store = staged
    with pytest.raises(FileNotFoundError, match=r"^no calib-manifest.json at .*/cifar100$"):
        staging.read_manifest(str(store), "cifar100", SPECS["cifar100"].files)
    manifest = json.loads((store / "cifar10" / staging.MANIFEST).read_text())
    manifest["files"] = manifest["files"][:2]
    assert staging.manifest_problem("cifar10", manifest, FILES) == (
        "calib-manifest.json lacks cifar-10-batches-py/data_batch_3, cifar-10-batches-py/data_batch_4, "
        "cifar-10-batches-py/data_batch_5 and 2 more"
    )
    assert "describes 'cifar100'" in (
        staging.manifest_problem("cifar10", {**manifest, "dataset": "cifar100"}, FILES) or ""
    )


def test_trials_read_the_staged_copy_without_downloading(staged, tmp_path, monkeypatch):
    """read_raw (what every trial calls) with data.download=false syncs the missing files from CALIB_DATASETS_URI."""
    src, store = staged
    root = tmp_path / "data"
    cfg = DataConfig(name="cifar10", root=str(root), download=False, verify_checksums=False)
    monkeypatch.delenv(staging.SOURCE_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=r"make stage-data DATASET=cifar10 DEST=s3://<bucket>/datasets"):
        read_raw(cfg)
    monkeypatch.setenv(staging.SOURCE_ENV, str(store))
    x_tr, y_tr, x_te, y_te = read_raw(cfg)
    assert (len(x_tr), len(x_te)) == (40, 10) and tuple(x_tr.shape[1:]) == (3, 32, 32)
    assert (root / "cifar-10-batches-py" / "batches.meta").read_bytes() == (
        src / "cifar-10-batches-py" / "batches.meta"
    ).read_bytes()


def test_stage_cli_reports_and_refuses_in_one_line(staged, tmp_path, capsys):
    src, store = staged
    assert stage.main(["stage", "cifar10", str(tmp_path / "s2"), "--root", str(src), "--no-download",
                         "--no-verify-checksums"]) == 0  # fmt: skip
    assert "cifar10: 7 files" in capsys.readouterr().out
    assert stage.main(["check", "cifar10", str(store)]) == 0
    assert stage.main(["stage", "cifar10", str(tmp_path / "s3"), "--root", str(tmp_path / "none"),
                         "--no-download"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("error: cifar10: ") and err.count("\n") == 1, err

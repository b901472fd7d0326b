"""The cluster sweep's data check (sweeps/checks/staged_data.py): refused before any trial, in one line naming the
staging step, when the dataset is neither under the data root nor staged; passes when either holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from calib_core.config import ConfigError
from calib_core.data import stage, staging
from sweeps.api import resolve
from sweeps.checks.staged_data import check_cluster_data, staged_data_problem
from tests.fixtures_fabricate import fabricate_cifar10

STEP = "make stage-data DATASET=cifar10 DEST="


def test_problem_is_none_when_the_files_are_there_or_staged():
    assert staged_data_problem("cifar10", "/data/datasets", [], None, None) is None
    assert staged_data_problem("cifar10", "/data/datasets", ["a"], "s3://b/datasets", None) is None


def test_problem_names_the_staging_step_and_why_within_one_short_line():
    line = staged_data_problem("cifar10", "/data/datasets", ["a", "b", "c", "d"], None, None)
    assert line is not None and "\n" not in line
    assert line.startswith("run.data.root: cifar10 is neither under /data/datasets (4 files missing) nor staged")
    assert "CALIB_DATASETS_URI is not set" in line and f"`{STEP}s3://<bucket>/datasets`" in line
    src = "s3://calib-sweeps-ray-results/datasets"
    line = staged_data_problem("cifar10", "/data/datasets", ["a"] * 7, src, "no calib-manifest.json in DEST/cifar10/")
    assert line is not None and "nor staged (no calib-manifest.json in DEST/cifar10/);" in line
    assert line.endswith(f"`{STEP}{src}` (deploy/README.md)")
    assert len(line) <= 280, len(line)  # sweeps/cli.py cuts an error line at 300 characters with its frame


def _cfg(tmp_path: Path, root: Path, download: bool = False):
    return resolve(
        None,
        ["run.data.name=cifar10", f"run.data.root={root}", f"run.data.download={str(download).lower()}"],
        workdir=tmp_path,
    )


def test_cluster_check_refuses_absent_data_and_accepts_staged_or_present(tmp_path, monkeypatch):
    root, store = tmp_path / "data", tmp_path / "store"
    monkeypatch.delenv(staging.SOURCE_ENV, raising=False)
    with pytest.raises(ConfigError, match="CALIB_DATASETS_URI is not set"):
        check_cluster_data(_cfg(tmp_path, root))
    monkeypatch.setenv(staging.SOURCE_ENV, str(store))
    with pytest.raises(ConfigError, match=rf"nor staged \(no calib-manifest.json in DEST/cifar10/\).*{STEP}{store}`"):
        check_cluster_data(_cfg(tmp_path, root))
    fabricate_cifar10(tmp_path / "download")
    stage.stage("cifar10", str(store), tmp_path / "download", download=False, verify_checksums=False)
    check_cluster_data(_cfg(tmp_path, root))  # staged: the trials sync it
    assert not root.exists(), "the check writes nothing"
    monkeypatch.delenv(staging.SOURCE_ENV)
    check_cluster_data(_cfg(tmp_path, tmp_path / "download"))  # on the shared volume already
    check_cluster_data(_cfg(tmp_path, root, download=True))  # downloads: opted in (public-https-egress)


def test_cluster_check_gives_up_on_a_store_that_does_not_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(staging.SOURCE_ENV, "s3://b/datasets")
    monkeypatch.setattr(staging, "read_manifest", lambda *a: __import__("time").sleep(5))
    with pytest.raises(ConfigError, match=r"nor staged \(no answer within 0.2 s\)"):
        check_cluster_data(_cfg(tmp_path, tmp_path / "data"), timeout=0.2)


def test_startup_runs_the_check_for_cluster_sweeps_only(tmp_path, monkeypatch):
    from sweeps.startup import check_all

    monkeypatch.delenv(staging.SOURCE_ENV, raising=False)
    monkeypatch.setattr("sweeps.startup._environment", lambda cfg, cluster, resume, grow, found, ok: found)
    cfg = resolve(
        None,
        ["run.data.name=cifar10", f"run.data.root={tmp_path / 'data'}", "run.data.download=false"],
        cluster=True,
        workdir=tmp_path,
    )
    cfg = cfg.model_copy(update={"storage_path": "s3://b/tune"})
    cfg.tracking.uri = "https://mlflow:5000"
    found = check_all(cfg, cluster=True)
    assert any(STEP in p for p in found), found

"""The model/data check's answers kept on disk (sweeps/checks/model_fit.py): a passed check whose answer depends on
the job and the code alone is answered again without a child process; anything read from files, a failed check,
another code or another model is checked again."""

from __future__ import annotations

import subprocess

import pytest

from calib_core.cache_dir import CACHE_ENV
from calib_core.config import ConfigError
from sweeps.checks import model_fit
from sweeps.checks.model_fit import ModelFitCheck, cache_path, job_for, measure
from sweeps.config import load_sweep_config


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "model-fit"


def _no_child(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_a_passed_check_is_answered_again_from_the_cache_with_no_child(cache, monkeypatch):
    cfg = load_sweep_config(None, [], {})  # the demo: cnn1d on MNIST-1D's declared shape
    first = ModelFitCheck(cfg)
    params = first.result()
    # the answer is the model's own count (measured here in-process, independently of the child)
    want = measure(cfg.run.model.model_dump(mode="json"), cfg.run.data.name, [])
    assert first.cached is None and params == want["params"] and first.trainable == want["trainable"]
    assert [p.name for p in cache.iterdir()] == [cache_path(job_for(cfg)).name]
    _no_child(monkeypatch)
    again = ModelFitCheck(load_sweep_config(None, ["run.seed=5"], {}))  # the seed draws weights, not shapes
    assert again.result() == params and again.trainable == want["trainable"] and again.cached is not None


def test_another_model_another_code_or_a_corrupt_entry_is_checked_again(cache, monkeypatch):
    cfg = load_sweep_config(None, [], {})
    ModelFitCheck(cfg).result()
    other = load_sweep_config(None, ["run.model.name=mlp"], {})
    assert cache_path(job_for(other)) != cache_path(job_for(cfg))
    monkeypatch.setattr(model_fit, "_code_digest", lambda: "another commit")
    assert ModelFitCheck(cfg).cached is None  # calib_core's source is part of the key
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(cache.parent))
    path = cache_path(job_for(cfg))
    path.write_text('{"params": "many"}')
    assert ModelFitCheck(cfg).cached is None


def test_failed_checks_files_and_weights_are_never_kept(cache, tmp_path):
    mismatch = load_sweep_config(None, ["run.model.name=resnet18"], {})  # a 2-D image model on 1-D signals
    with pytest.raises(ConfigError):
        ModelFitCheck(mismatch).result()
    assert not cache.exists() or not list(cache.iterdir())
    csv = tmp_path / "t.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    table = load_sweep_config(None, ["run.data.name=table", f"run.data.path={csv}", "run.data.label_column=label"], {})
    assert job_for(table)["data_config"] is not None and cache_path(job_for(table)) is None
    weights = load_sweep_config(None, ["run.model.name=torchvision/resnet18", f"run.model.weights={csv}"], {})
    assert cache_path(job_for(weights)) is None


def test_off_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, "off")
    cfg = load_sweep_config(None, [], {})
    assert cache_path(job_for(cfg)) is None
    check = ModelFitCheck(cfg)
    assert check.result() and check.cached is None

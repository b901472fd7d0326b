"""`python -m calib_core.train`: one JSON line, clean config errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "calib_core.train", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )


def _config(tmp_path: Path, body: str) -> str:
    p = tmp_path / "run.yaml"
    p.write_text(body)
    return str(p)


SMALL = """
seed: 3
device: cpu
num_threads: 1
data: {name: digits}
model: {name: mlp, kwargs: {hidden_dims: [32]}}
train: {epochs: 2, batch_size: 64, lr: 0.003, calibrator: temperature, calibrator_data: "holdout:0.1"}
"""


def test_prints_one_json_line_with_metrics(tmp_path):
    r = _run("--config", _config(tmp_path, SMALL), "--set", "train.calibrator_lr=0.02", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["status"] == "completed" and out["epochs_run"] == 2 and out["wall_time"] > 0
    for split in ("val", "test"):
        assert set(out[split]) == {"accuracy", "nll", "brier", "ece", "sce", "ace", "tace", "mce"}
        assert 0.0 <= out[split]["ece"] <= 1.0
    assert out["calibrator"]["temperature"] > 0 and out["calibrator"]["num_params"] == 1


def test_posthoc_reports_parameter_count(tmp_path):
    r = _run(
        "--config",
        _config(tmp_path, SMALL),
        "--set",
        "train.method=posthoc",
        "--set",
        "train.posthoc_calibrator=matrix",
        "--set",
        "train.epochs=1",
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["calibrator"]["calibrator"] == "matrix" and out["calibrator"]["num_params"] == 10 * 10 + 10


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--set", "train.calibrator=platt"], "train.calibrator"),
        (["--set", "train.epochs=0"], "train.epochs"),
        (["--set", "train.calibrator_data=holdout:2"], "train.calibrator_data"),
        (["--set", "train.bogus=1"], "train.bogus: unknown key"),
        (["--set", "model.kwargs={nope: 1}"], "nope"),
        (["--config", "/does/not/exist.yaml"], "not found"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path, args, fragment):
    argv = args if args[0] == "--config" else ["--config", _config(tmp_path, SMALL), *args]
    r = _run(*argv, tmp_path=tmp_path)
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and fragment in r.stderr


def test_divergence_exits_1_with_status(tmp_path):
    r = _run(
        "--config", _config(tmp_path, SMALL), "--set", "train.lr=1e6", "--set", "train.epochs=1", tmp_path=tmp_path
    )
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "diverged" and out["reason"] and out["val"] == {}


def _strict_json(line: str) -> dict:
    def refuse(token: str):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


TO_INF = """
seed: 3
device: cpu
num_threads: 1
data: {name: mnist1d, num_samples: 600}
model: {name: mlp, kwargs: {hidden_dims: [32]}}
train: {epochs: 2, warmup_epochs: 1, batch_size: 4096, lr: 0.003, calibrator: temperature,
        calibrator_data: "holdout:0.1"}
"""


@pytest.mark.parametrize(
    "body, args",
    [
        (TO_INF, []),  # T = exp(log T) = inf after the last step: used to end "completed", then crash
        (SMALL, ["--set", "train.calibrator_data=same"]),  # T -> 0, then NaN: diverged, then crashed on NaN
    ],
)
def test_huge_calibrator_lr_is_diverged_one_json_line_no_traceback(tmp_path, body, args):
    r = _run("--config", _config(tmp_path, body), "--set", "train.calibrator_lr=1e3", *args, tmp_path=tmp_path)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = _strict_json(lines[0])
    assert out["status"] == "diverged" and out["reason"] and out["val"] == {} and out["test"] == {}
    assert "temperature" in out["reason"], out["reason"]
    t = out["calibrator"]["temperature"]
    assert t is None or (isinstance(t, float) and t >= 0.0)  # non-finite numbers are written as null


def test_non_finite_numbers_are_written_as_null(tmp_path, monkeypatch, capsys):
    """Whatever the trainer hands back, the CLI writes standard JSON (NaN/inf -> null)."""
    import types

    import calib_core.data
    import calib_core.trainer
    from calib_core import train

    result = types.SimpleNamespace(
        status="completed",
        reason=None,
        epochs_run=1,
        wall_time=0.5,
        val_metrics={"accuracy": 0.5, "nll": float("inf"), "ece": float("nan")},
        test_metrics={"accuracy": 0.25, "nll": float("-inf")},
        calibrator_info={
            "calibrator": "temperature",
            "num_params": 1,
            "temperature": float("inf"),
            "per_task": {"a": {"t": float("nan")}},
        },
    )
    monkeypatch.setattr(calib_core.data, "load_dataset", lambda cfg, seed: None)
    monkeypatch.setattr(calib_core.trainer, "make_trainer", lambda cfg, data: types.SimpleNamespace(fit=lambda: result))
    code = train.main(["--config", _config(tmp_path, SMALL)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    got = _strict_json(out[0])
    assert got["val"] == {"accuracy": 0.5, "nll": None, "ece": None} and got["test"] == {"accuracy": 0.25, "nll": None}
    assert got["calibrator"]["temperature"] is None and got["calibrator"]["per_task"] == {"a": {"t": None}}

"""`python -m calib_core.train`: one JSON line, clean config errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "calib_core.train", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


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
    r = _run("--config", _config(tmp_path, SMALL), "--set", "train.method=posthoc", "--set", "train.posthoc_calibrator=matrix", "--set", "train.epochs=1", tmp_path=tmp_path)
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
    r = _run("--config", _config(tmp_path, SMALL), "--set", "train.lr=1e6", "--set", "train.epochs=1", tmp_path=tmp_path)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["status"] == "diverged" and out["reason"] and out["val"] == {}

"""Run provenance (benchmarks/provenance.py) and repeatability across fresh processes (issue #31)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.provenance import FIELDS, check_same_commit, cpu_model, provenance
from tests.paths import ROOT

# one small run: MNIST-1D, 600 samples, 2 epochs, one-go temperature (its calibrator and holdout draw
# random numbers too), trained as the method studies train it (1 thread, deterministic algorithms); printed as JSON
_CHILD = """
import json
import torch
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
from calib_core.config import RunConfig
from calib_core.data import load_dataset
from calib_core.trainer import make_trainer
from benchmarks.provenance import provenance
cfg = RunConfig.model_validate({
    "data": {"name": "mnist1d", "num_samples": 600, "val_fraction": 0.2, "test_fraction": 0.3},
    "model": {"name": "cnn1d"},
    "train": {"epochs": 2, "batch_size": 64, "optimizer": "adam", "lr": 0.01, "weight_decay": 0.0,
              "lr_schedule": "none", "method": "onego", "calibrator": "temperature",
              "calibrator_data": "holdout:0.1", "calibrator_lr": 0.05},
    "seed": 7, "device": "cpu", "num_threads": 1,
})
res = make_trainer(cfg, load_dataset(cfg.data, cfg.seed), "cpu").fit()
print(json.dumps({"status": res.status, "val": res.val_metrics, "test": res.test_metrics,
                  "probs_sum": float(res.test_probs.double().sum()), "provenance": provenance()}))
"""


def _children(n: int = 2) -> list[dict]:
    """Run the child in `n` fresh processes side by side (1 thread each); their JSON outputs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(n)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_provenance_has_every_field_and_no_host_name():
    p = provenance()
    assert set(FIELDS) <= set(p)
    assert p["cpu_model"] and isinstance(p["threads"], int) and p["threads"] >= 1
    assert p["python"].count(".") == 2
    if p["git_commit"] is not None:
        assert len(p["git_commit"]) == 40 and isinstance(p["git_clean"], bool)
    import platform

    node = platform.node()
    if node:
        assert node not in json.dumps(p)
    assert cpu_model() == p["cpu_model"]


def test_mixed_commits_are_refused_unless_allowed():
    check_same_commit(["a" * 40, "a" * 40, None], "a" * 40)
    with pytest.raises(ValueError, match="refusing to mix commits"):
        check_same_commit(["a" * 40], "b" * 40)
    check_same_commit(["a" * 40], "b" * 40, allow_mixed=True)


def test_same_seed_in_two_fresh_processes_gives_identical_metrics():
    a, b = _children(2)
    assert a["status"] == "completed" == b["status"]
    assert a["val"] == b["val"] and a["test"] == b["test"]  # exact: every metric
    assert a["probs_sum"] == b["probs_sum"]
    assert a["provenance"]["threads"] == 1 == b["provenance"]["threads"]

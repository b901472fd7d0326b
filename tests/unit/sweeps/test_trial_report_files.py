"""The trial draws its own report files; the driver uploads them as they lie (fast, real SQLite store)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sweeps.contract import PREDICTIONS_FILE, REPORT_DIR, ROLE_TRIAL, SUMMARY_FILE, TAG_ROLE, TAG_SWEEP, TAG_TRIAL
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.tracking import MLflowTrackingCallback
from sweeps.integrations.ray.trainable import _draw_report


def _checkpoint(d: Path) -> Path:
    rng = np.random.default_rng(0)
    arrays = {}
    for split in ("val", "test"):
        p = rng.dirichlet(np.ones(4), size=50).astype(np.float32)
        arrays[f"{split}_probs"], arrays[f"{split}_labels"] = p, rng.integers(0, 4, size=50)
    np.savez_compressed(d / PREDICTIONS_FILE, **arrays)
    (d / SUMMARY_FILE).write_text(json.dumps({"tasks": None}))
    return d


class _Ckpt:
    def __init__(self, d: Path) -> None:
        self.d = d

    def as_directory(self):
        import contextlib

        return contextlib.nullcontext(str(self.d))


def _logged(tmp_path: Path, ckpt: Path) -> set[str]:
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = store.ensure_experiment("files")
    rid = store.create_run(exp, "t", {TAG_SWEEP: "s", TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: "a1"})
    cb = MLflowTrackingCallback(store, exp, "parent", "s", base_tags={}, trial_params=None, num_bins=10)
    trial = SimpleNamespace(trial_id="a1", checkpoint=_Ckpt(ckpt), last_result={}, config={"calibrator": "vector"})
    cb._log_trial_artifacts(rid, trial)
    names = set()
    for top in store.client.list_artifacts(rid):
        kids = store.client.list_artifacts(rid, top.path) if top.is_dir else [top]
        names |= {a.path for a in kids}
    return names


def test_the_trial_draws_its_diagrams_and_the_driver_logs_them_under_their_folders(tmp_path):
    (tmp_path / "ckpt").mkdir()
    ckpt = _checkpoint(tmp_path / "ckpt")
    _draw_report(ckpt, {"val_accuracy": 0.5}, num_bins=10, title="vector lr=1.0e-02")
    drawn = sorted(p.relative_to(ckpt / REPORT_DIR).as_posix() for p in (ckpt / REPORT_DIR).rglob("*.png"))
    assert drawn == ["diagrams/reliability_test.png", "diagrams/reliability_val.png"]
    for p in (ckpt / REPORT_DIR).rglob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _logged(tmp_path, ckpt) == {
        "predictions/predictions.npz",
        "diagrams/reliability_test.png",
        "diagrams/reliability_val.png",
    }


def test_a_checkpoint_without_drawn_files_gets_them_drawn_by_the_driver(tmp_path):
    (tmp_path / "old").mkdir()
    ckpt = _checkpoint(tmp_path / "old")  # as a trial of an older version left it
    assert _logged(tmp_path, ckpt) == {
        "predictions/predictions.npz",
        "diagrams/reliability_test.png",
        "diagrams/reliability_val.png",
    }

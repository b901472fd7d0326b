"""Two tiny sweeps on two different files both called train.csv, in one MLflow store (issue #44 item 4): two
registered models, each with its own @champion, neither competing with the other's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.sweep_helpers import ROOT, launch, store

# whole sweeps: the e2e tier (make test-slow), not the unit tier (make test)
pytestmark = pytest.mark.slow


def _train_csv(path: Path, classes: int, features: int, seed: int) -> Path:
    """Well separated Gaussian blobs (2 epochs learn them), labels as text, one file per project."""
    rng = np.random.default_rng(seed)
    y = np.arange(300) % classes
    x = rng.normal(size=(300, features)) + 6.0 * np.eye(classes, features)[y]
    path.parent.mkdir(parents=True)
    header = ",".join([f"f{i}" for i in range(features)] + ["label"])
    rows = [",".join([*(f"{v:.5f}" for v in xi), f"c{k}"]) for xi, k in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_two_train_csv_files_register_two_models_each_with_its_champion(tmp_path):
    from sweeps.config import load_sweep_config
    from sweeps.config_defaults import with_defaults

    config = ROOT / "sweeps" / "configs" / "tabular_demo.yaml"
    files = {
        "proj-a": _train_csv(tmp_path / "projA" / "train.csv", classes=2, features=5, seed=0),
        "proj-b": _train_csv(tmp_path / "projB" / "train.csv", classes=3, features=4, seed=1),
    }
    names = {}
    for sweep, path in files.items():
        sets = [
            "run.data.name=table",
            f"run.data.path={path}",
            "run.data.label_column=label",
            "run.model.kwargs={}",
            "run.train.epochs=2",
            "run.train.lr=0.01",
            "resources.max_failures=0",
        ]
        args = [a for s in sets for a in ("--set", s)]
        proc = launch(tmp_path, "--config", str(config), "--name", sweep, "--num-samples", "2", *args, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        expected = with_defaults(load_sweep_config(config, sets), cluster=True).tracking.registered_model
        assert expected.startswith("calibrated-table-train-"), expected
        assert f"the champion registers as {expected!r}" in proc.stdout
        assert f"Registered: models:/{expected}@champion" in proc.stdout, proc.stdout[-3000:]
        names[sweep] = expected
    assert names["proj-a"] != names["proj-b"]

    client = store(tmp_path)
    registered = sorted(m.name for m in client.search_registered_models())
    assert registered == sorted(names.values())
    champions = {sweep: client.get_model_version_by_alias(name, "champion") for sweep, name in names.items()}
    for sweep, mv in champions.items():
        # each champion is its own sweep's first version, trained on its own file: no gate between the two
        assert str(mv.version) == "1" and "calib.gate" not in mv.tags, mv.tags
        run = client.get_run(mv.run_id)
        assert run.data.tags["calib.sweep"] == sweep, run.data.tags

"""The file formats and the shipped tabular demo through `python sweeps/launch.py`, end to end: exit 0, every trial
completed, a registered champion, and that champion, loaded from the registry, gives on the raw test rows as they
are in the fabricated files (table rows with their column names, the .npz's float64 arrays, the images' pixels
at their own size) the probabilities its trial stored. The demo's --dry-run is fast; the sweeps are marked slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.sweep_helpers import ROOT, launch, store, sweep_runs

TABULAR_DEMO = ROOT / "sweeps" / "configs" / "tabular_demo.yaml"
SHORT = ["--num-samples", "2", "--set", "run.train.epochs=2", "--set", "resources.max_failures=0"]


def test_the_tabular_demo_config_validates():
    proc = launch(ROOT, "--config", str(TABULAR_DEMO), "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "name: breast_cancer" in proc.stdout and "trials: 6 (single-objective, metric val_ece" in proc.stdout


def _finished(cwd: Path, proc, sweep: str, n: int) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Registered: models:/" in proc.stdout and "@champion" in proc.stdout
    parents, children = sweep_runs(store(cwd), sweep)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == n and all(r.data.tags.get("calib.status") == "completed" for r in children)


@pytest.mark.slow
def test_the_tabular_demo_registers_a_champion(tmp_path):
    proc = launch(tmp_path, "--config", str(TABULAR_DEMO))
    _finished(tmp_path, proc, "tabular-demo", 6)


def _table(d: Path, suffix: str) -> list[str]:
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame["target"] = frame["target"].map({0: "malignant", 1: "benign"})
    frame["site"] = np.where(np.arange(len(frame)) % 3 == 0, "left", "right")
    frame["note"] = [f"seen on visit {i}" for i in range(len(frame))]  # free text: left out, and in the raw rows
    path = d / f"patients{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    sets = [f"run.data.path={path.name}", "run.data.label_column=target", "run.data.categorical=onehot"]
    return [*sets, "run.data.text_columns=drop"]


def _npz(d: Path) -> list[str]:
    rng = np.random.default_rng(0)
    y = np.arange(300) % 3
    x = rng.normal(size=(300, 8)) + y[:, None]
    np.savez(d / "features.npz", X=x, y=y)  # scikit-learn's names, found without data.x_key
    return ["run.data.path=features.npz"]


def _images(d: Path) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, cls in enumerate(["circle", "square"]):
        (d / "img" / cls).mkdir(parents=True)
        for i in range(40):
            a = rng.integers(0, 80, (10, 12, 3)) + 120 * k
            Image.fromarray(a.astype(np.uint8)).save(d / "img" / cls / f"{i}.png")
    return ["run.data.path=img", "run.data.image_size=8"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fmt, make, model",
    [
        ("table", lambda d: _table(d, ".csv"), "mlp"),
        ("table", lambda d: _table(d, ".parquet"), "mlp"),
        ("arrays", _npz, "mlp"),
        ("image_folder", _images, "cnn2d"),
    ],
    ids=["csv", "parquet", "npz", "image_folder"],
)
def test_each_format_runs_a_sweep_to_a_champion(tmp_path, fmt, make, model):
    sets = [f"run.data.name={fmt}", f"run.model.name={model}", "run.model.kwargs={}", *make(tmp_path)]
    args = [a for s in sets for a in ("--set", s)]
    proc = launch(tmp_path, "--config", str(TABULAR_DEMO), "--name", f"e2e-{fmt}", *SHORT, *args)
    _finished(tmp_path, proc, f"e2e-{fmt}", 2)
    _champion_predicts_on_raw_rows(tmp_path, proc.stdout, f"e2e-{fmt}", fmt)


def _raw_test_rows(cwd: Path, cfg, fmt: str):
    """The champion's test rows as they are in the fabricated file, in the loader's split order."""
    import pandas as pd

    from calib_core.data.splits import train_val_test_indices

    data = cfg.data
    if fmt == "table":
        path = cwd / data.path
        raw = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
        labels = np.unique(raw[data.label_column].astype(str).to_numpy(), return_inverse=True)[1]
    elif fmt == "arrays":
        with np.load(cwd / data.path) as z:
            raw, labels = z["X"], z["y"]
    else:
        from PIL import Image

        from calib_core.data.image_folder import find_images

        _, samples = find_images(cwd / data.path)
        labels = np.asarray([k for _, k in samples])
        raw = samples
    rows = train_val_test_indices(
        len(labels), val_fraction=data.val_fraction, test_fraction=data.test_fraction, seed=cfg.seed, labels=labels
    )[2].numpy()
    if fmt == "table":
        return raw.iloc[rows]
    if fmt == "arrays":
        return raw[rows]
    return np.stack(
        [np.asarray(Image.open(raw[i][0])) for i in rows]
    )  # uint8 (N, 10, 12, 3): not the 8x8 it trained on


def _champion_predicts_on_raw_rows(cwd: Path, stdout: str, sweep: str, fmt: str) -> None:
    import contextlib
    import json
    import re

    import mlflow

    from calib_core.config import RunConfig

    name = re.search(r"Registered: models:/([\w.-]+)@champion", stdout)[1]
    client = store(cwd)
    (parent,), _ = sweep_runs(client, sweep)
    mv = client.get_model_version_by_alias(name, "champion")
    with contextlib.chdir(cwd):
        z = np.load(client.download_artifacts(mv.run_id, "predictions/predictions.npz", str(cwd)))
        cfg = RunConfig.model_validate(
            json.loads(Path(client.download_artifacts(mv.run_id, "run_config.json", str(cwd))).read_text())
        )
        mlflow.set_tracking_uri(f"sqlite:///{cwd}/mlflow.db")
        model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    prefix = "ts_" if parent.data.tags["calib.champion_candidate"].endswith("+ts") else ""
    got = np.asarray(model.predict(_raw_test_rows(cwd, cfg, fmt)))
    np.testing.assert_allclose(got, z[f"{prefix}test_probs"], atol=1e-6, rtol=0)

"""The champion takes raw inputs (issue #34 item 4): the logged MLflow model carries the training split's
preprocessing (calib_core.preprocess), so `predict` takes the data as it is on disk.

For a CSV table with a one-hot column, an image folder (images of another size, resized by the model) and the
embedded mnist1d demo: a tiny model is trained for one epoch with calib_core's trainer, written as the trial's
checkpoint with its preprocessing record (sweeps.integrations.ray.trainable.save_model), logged and registered into
a fresh SQLite store, loaded with `mlflow.pyfunc.load_model`, and its probabilities on the raw test rows (read from
the files, split as the loader splits) are compared with the trainer's own probabilities on the same rows (1e-6).
Also: the standardised path under `params={"inputs": "standardised"}`; missing / unknown columns, a wrong image
size or dtype, each one error naming them; the signature names the table's columns and types.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from calib_core.config import RunConfig
from calib_core.data import load_dataset
from calib_core.data.splits import train_val_test_indices
from calib_core.preprocess import input_record
from calib_core.trainer import make_trainer

MODEL = "raw-inputs-test"


def _train(run: dict):
    torch.set_num_threads(1)
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in run.items()}
    raw.setdefault("train", {}).update(epochs=1, batch_size=64, calibrator="temperature")
    cfg = RunConfig.model_validate({**raw, "device": "cpu", "num_threads": 1})
    data = load_dataset(cfg.data, cfg.seed)
    result = make_trainer(cfg, data, "cpu").fit()
    assert result.status == "completed", result.reason
    return cfg, data, result


def _register(tmp: Path, cfg: RunConfig, data, result, name: str):
    """Checkpoint as the trial writes it, then log_and_register; the loaded pyfunc model."""
    import mlflow
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow.model_export import log_and_register
    from sweeps.integrations.ray.trainable import FINAL_FILE, SUMMARY_FILE, save_model

    ckpt = tmp / "ckpt"
    ckpt.mkdir(parents=True)
    record = input_record(data, cfg.data.model_dump(mode="json"))
    assert record is not None
    save_model(ckpt, result.model, cfg.model_dump(mode="json"), tuple(data.input_shape), record)
    (ckpt / SUMMARY_FILE).write_text(
        json.dumps({"run_config": cfg.model_dump(mode="json"), "input_shape": list(data.input_shape)})
    )
    (ckpt / FINAL_FILE).write_text(json.dumps({f"val_{k}": float(v) for k, v in result.val_metrics.items()}))
    uri = f"sqlite:///{tmp.resolve()}/mlflow.db"
    with contextlib.chdir(tmp):
        client = MlflowClient(uri)
        exp = client.create_experiment("raw", artifact_location=(tmp / "mlartifacts").as_uri())
        run = client.create_run(exp)
        client.set_terminated(run.info.run_id, "FINISHED")
        version = log_and_register(run.info.run_id, ckpt, tuple(data.input_shape), name, uri)
        mlflow.set_tracking_uri(uri)
        model = mlflow.pyfunc.load_model(f"models:/{name}/{version}")
    model.uri = uri  # type: ignore[attr-defined]  # the store, for the served test
    return model, client.get_model_version(name, version)


def _trainer_probs(result, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(result.model.eval()(x).double(), dim=-1).numpy()


def _test_rows(y: np.ndarray, cfg: RunConfig) -> np.ndarray:
    return train_val_test_indices(
        len(y), val_fraction=cfg.data.val_fraction, test_fraction=cfg.data.test_fraction, seed=cfg.seed, labels=y
    )[2].numpy()


# ---------------------------------------------------------------------------- table with a one-hot column
@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from sklearn.datasets import load_breast_cancer

    d = tmp_path_factory.mktemp("table")
    frame = load_breast_cancer(as_frame=True).frame.iloc[:, list(range(8)) + [30]]
    frame["target"] = frame["target"].map({0: "malignant", 1: "benign"})
    frame["site"] = np.where(np.arange(len(frame)) % 3 == 0, "left", "right")
    frame["visits"] = np.arange(len(frame)) % 7  # an integer column: long in the signature
    frame.to_csv(d / "patients.csv", index=False)
    cfg, data, result = _train(
        {
            "data": {
                "name": "table",
                "path": str(d / "patients.csv"),
                "label_column": "target",
                "categorical": "onehot",
            },
            "model": {"name": "mlp"},
        }
    )
    model, mv = _register(d, cfg, data, result, MODEL + "-table")
    raw = pd.read_csv(d / "patients.csv")
    y = np.unique(raw["target"].astype(str).to_numpy(), return_inverse=True)[1]
    rows = raw.iloc[_test_rows(y, cfg)].reset_index(drop=True)
    return model, mv, rows, _trainer_probs(result, data.test.x), data


def test_table_raw_rows_give_the_trainers_probabilities(table):
    model, _, rows, expected, _ = table
    got = np.asarray(model.predict(rows))  # the label column rides along: ignored
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    # raw rows used to be read as standardised inputs: a confident [1, 0] for every row
    assert not np.all(got[:, 0] > 0.99) and not np.all(got[:, 1] > 0.99)
    # the columns in another order, and the rows as JSON would carry them
    np.testing.assert_allclose(np.asarray(model.predict(rows[rows.columns[::-1]])), expected, atol=1e-6, rtol=0)


def test_table_standardised_path_and_signature(table):
    model, mv, rows, expected, data = table
    py = model.unwrap_python_model()
    std = py.predict(None, data.test.x.numpy(), params={"inputs": "standardised"})
    np.testing.assert_allclose(std, expected, atol=1e-6, rtol=0)
    sig = model.metadata.get_input_schema()
    # named, optional, any type: MLflow's own refusal would print the whole frame, so the model checks them
    cols = {c.name: (str(c.type), c.required) for c in sig.inputs}
    assert cols["site"] == cols["visits"] == cols["mean radius"] == ("Any", False) and "target" not in cols
    assert "raw data as on disk: a table" in mv.description


@pytest.mark.slow
def test_mlflow_models_serve_takes_raw_table_rows(table, tmp_path):
    """`mlflow models serve` (the README's command) on the table model: rows posted with their column names
    (dataframe_split, as JSON carries them) give the trainer's probabilities; a missing column is an HTTP 400."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from tests.sweep_helpers import wait_http
    from tests.unit.sweeps.test_model_export import ROOT, _clean_env, _free_port, _post

    model, mv, rows, expected, _ = table
    port = _free_port()
    line = next(
        ln
        for ln in (ROOT / "docs" / "guide.md").read_text().splitlines()
        if ln.startswith("PATH=") and "models serve" in ln
    )
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    cmd = line.replace('"sqlite:///$PWD/mlflow.db"', model.uri).replace("-p 5001", f"-p {port}")
    cmd = re.sub(r"models:/[^@\s]+@champion", f"models:/{mv.name}/{mv.version}", cmd)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        cwd=tmp_path,
        env=_clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/ping", proc, tmp_path / "serve.log", timeout=180)
        split = json.loads(rows.to_json(orient="split", index=False))
        status, body = _post(f"{url}/invocations", {"dataframe_split": split})
        assert status == 200, body
        records = json.loads(body)["predictions"]  # a DataFrame in, a DataFrame out: records by class name
        got = [[r["benign"], r["malignant"]] for r in records]
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6, rtol=0)
        bad = json.loads(rows.drop(columns=["site"]).to_json(orient="split", index=False))
        status, body = _post(f"{url}/invocations", {"dataframe_split": bad})
        assert 400 <= status < 500 and "site" in body, (status, body[:500])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def test_table_missing_and_unknown_columns_named_in_one_error(table, monkeypatch):
    from mlflow.exceptions import MlflowException

    from calib_core.export import InvalidInputError

    model, _, rows, _, _ = table
    bad = rows.drop(columns=["site"]).rename(columns={"visits": "visitz"})
    with pytest.raises(InvalidInputError) as e:
        model.unwrap_python_model().model_inputs(bad)
    msg = str(e.value)
    assert "\n" not in msg and "missing column(s) site, visits; unknown column(s) visitz (ignored)" in msg
    # through MLflow's predict: the same line (MLflow drops the columns its signature does not name first)
    with pytest.raises(MlflowException) as e:
        model.predict(bad)
    assert e.value.message.startswith("missing column(s) site, visits; the model takes the columns mean radius")
    assert "\n" not in e.value.message
    from tests.unit.sweeps.test_champion_inputs import _serve  # mlflow models serve's app, in-process

    status, reply = _serve(model, {"dataframe_split": json.loads(bad.to_json(orient="split"))}, monkeypatch)
    assert status == 400 and reply["message"] == e.value.message, reply
    with pytest.raises(MlflowException, match="column 'visits' holds values that are not numbers"):
        model.unwrap_python_model().predict(None, rows.assign(visits="many"))


# ---------------------------------------------------------------------------- image folder
@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for k, cls in enumerate(["circle", "square"]):
        (d / "img" / cls).mkdir(parents=True)
        for i in range(30):
            a = rng.integers(0, 80, (10, 12, 3)) + 120 * k
            Image.fromarray(a.astype(np.uint8)).save(d / "img" / cls / f"{i}.png")
    cfg, data, result = _train(
        {"data": {"name": "image_folder", "path": str(d / "img"), "image_size": 8}, "model": {"name": "cnn2d"}}
    )
    model, mv = _register(d, cfg, data, result, MODEL + "-images")
    from calib_core.data.image_folder import find_images

    _, samples = find_images(d / "img")
    y = np.asarray([k for _, k in samples])
    files = [samples[i][0] for i in _test_rows(y, cfg)]
    pixels = np.stack([np.asarray(Image.open(f)) for f in files])  # (N, 10, 12, 3) uint8, as on disk
    return model, mv, pixels, _trainer_probs(result, data.test.x)


def test_image_folder_raw_pixels_give_the_trainers_probabilities(images):
    model, mv, pixels, expected = images
    assert pixels.dtype == np.uint8 and pixels.shape[1:] == (10, 12, 3)
    np.testing.assert_allclose(np.asarray(model.predict(pixels)), expected, atol=1e-6, rtol=0)
    chw = np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(np.asarray(model.predict(chw)), expected, atol=1e-6, rtol=0)
    assert "pixel arrays (N, H, W), (N, H, W, C) or (N, C, H, W) (uint8, or float" in mv.description
    assert "classes circle, square in that order" in mv.description


def test_image_folder_bad_inputs_one_line(images):
    from mlflow.exceptions import MlflowException

    model, _, pixels, _ = images
    with pytest.raises(MlflowException, match=r"^integer pixel values must lie in 0\.\.255; got -1\.\."):
        model.unwrap_python_model().predict(None, pixels.astype(np.int64) - 1)
    with pytest.raises(MlflowException, match="cannot tell the channels"):
        model.predict(np.zeros((2, 5, 6, 7), dtype=np.uint8))


# ---------------------------------------------------------------------------- the embedded mnist1d demo
def test_mnist1d_raw_signals_give_the_trainers_probabilities(tmp_path):
    from calib_core.data.mnist1d import generate_mnist1d

    cfg, data, result = _train({"data": {"name": "mnist1d", "num_samples": 300}, "model": {"name": "cnn1d"}})
    model, mv = _register(tmp_path, cfg, data, result, MODEL + "-mnist1d")
    x, y = generate_mnist1d(300, cfg.seed)
    raw = x[_test_rows(y, cfg)]
    expected = _trainer_probs(result, data.test.x)
    np.testing.assert_allclose(np.asarray(model.predict(raw)), expected, atol=1e-6, rtol=0)
    std = model.predict(data.test.x.numpy(), params={"inputs": "standardised"})
    np.testing.assert_allclose(np.asarray(std), expected, atol=1e-6, rtol=0)
    assert "raw data as on disk: raw feature arrays (N, 40) or (N, 1, 40), real numbers" in mv.description
    np.testing.assert_allclose(np.asarray(model.predict(raw.reshape(len(raw), 1, 40))), expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- the champion gate
def test_the_gate_feeds_a_raw_input_champion_its_standardised_rows(tmp_path, monkeypatch):
    """The gate scores the current champion on model inputs (standardised with its own statistics): a champion
    that takes raw inputs by default is asked for the standardised path, and gives its trainer's probabilities."""
    import mlflow
    from mlflow import MlflowClient

    import sweeps.integrations.mlflow.champion_gate as gate
    from sweeps.integrations.mlflow.model_export import log_and_register
    from sweeps.integrations.mlflow.store import MlflowStore
    from sweeps.integrations.ray.trainable import FINAL_FILE, SUMMARY_FILE, save_model

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    name = MODEL + "-gate"
    trained = {}
    for which, seed in (("old", 0), ("new", 1)):
        cfg, data, result = _train(
            {"data": {"name": "mnist1d", "num_samples": 1000}, "model": {"name": "cnn1d"}, "seed": seed}
        )
        ckpt = tmp_path / which
        ckpt.mkdir()
        record = input_record(data, cfg.data.model_dump(mode="json"))
        save_model(ckpt, result.model, cfg.model_dump(mode="json"), tuple(data.input_shape), record)
        (ckpt / SUMMARY_FILE).write_text(json.dumps({"run_config": cfg.model_dump(mode="json")}))
        (ckpt / FINAL_FILE).write_text("{}")
        probs = _trainer_probs(result, data.test.x)
        np.savez(ckpt / "predictions.npz", test_probs=probs, test_labels=data.test.y.numpy())
        trained[which] = (cfg, data, result, ckpt)
    seen = {}
    real_compare = gate.compare

    def spy(new_probs, old_probs, labels, **kw):
        seen["old"] = old_probs
        return real_compare(new_probs, old_probs, labels, **kw)

    monkeypatch.setattr(gate, "compare", spy)
    store = MlflowStore(uri)
    with contextlib.chdir(tmp_path):
        client = MlflowClient(uri)
        exp = client.create_experiment("gate", artifact_location=(tmp_path / "mlartifacts").as_uri())
        lines = []
        for which in ("old", "new"):
            cfg, data, _, ckpt = trained[which]
            run = client.create_run(exp)
            client.set_terminated(run.info.run_id, "FINISHED")
            version = log_and_register(run.info.run_id, ckpt, tuple(data.input_shape), name, uri, alias=None)
            lines.append(
                gate.move_alias(
                    store,
                    name,
                    version,
                    run.info.run_id,
                    cfg.model_dump(mode="json"),
                    ckpt / "predictions.npz",
                    level=0.95,
                    num_bins=15,
                )
            )
        mlflow.set_tracking_uri(uri)
        spec = mlflow.pyfunc.load_model(f"models:/{name}/1").unwrap_python_model().spec
    assert spec["preprocessing"]["format"] == "arrays"  # the old champion takes raw inputs by default
    assert "rows held out from both" in lines[1][1], lines[1]
    # the new sweep's test rows the old champion never saw, as the old trainer scores them
    old_cfg, old_data, old_result, _ = trained["old"]
    from sweeps.decide.gate import held_out_mask, model_inputs, raw_inputs, row_hashes

    new_data = trained["new"][1]
    raw = raw_inputs(new_data.test.x.numpy(), new_data.stats)
    old_seen = np.concatenate(
        [row_hashes(raw_inputs(s.x.numpy(), old_data.stats)) for s in (old_data.train, old_data.val)]
    )
    keep = held_out_mask(row_hashes(raw), old_seen)
    expected = _trainer_probs(old_result, torch.from_numpy(model_inputs(raw, old_data.stats)[keep]))
    np.testing.assert_allclose(seen["old"], expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- a whole sweep (slow)
@pytest.mark.slow
def test_a_csv_sweeps_champion_predicts_on_raw_rows_and_its_runs_name_their_data(tmp_path):
    """`python sweeps/launch.py` on a CSV with a one-hot column: the champion registers as
    calibrated-table-patients-<digest>, its probabilities on the raw test rows of the file equal the ones its trial
    stored (the + TS candidate's when it won), and every trial's run has the CSV as its dataset input."""
    import mlflow
    from sklearn.datasets import load_breast_cancer

    from tests.sweep_helpers import ROOT, launch, store, sweep_runs

    frame = load_breast_cancer(as_frame=True).frame
    frame["target"] = frame["target"].map({0: "malignant", 1: "benign"})
    frame["site"] = np.where(np.arange(len(frame)) % 3 == 0, "left", "right")
    frame.to_csv(tmp_path / "patients.csv", index=False)
    sets = [
        "run.data.name=table",
        "run.data.path=patients.csv",
        "run.data.label_column=target",
        "run.data.categorical=onehot",
        "run.model.name=mlp",
        "run.model.kwargs={}",
        "run.train.epochs=2",
        "resources.max_failures=0",
    ]
    args = [a for s in sets for a in ("--set", s)]
    config = ROOT / "sweeps" / "configs" / "tabular_demo.yaml"
    proc = launch(tmp_path, "--config", str(config), "--name", "raw-csv", "--num-samples", "2", *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    named = re.search(r"the champion registers as '(calibrated-table-patients-[0-9a-f]{8})'", proc.stdout)
    assert named, proc.stdout[-3000:]
    name = named.group(1)  # the file's name and a digest of its content (issue #44 item 4)
    assert f"Registered: models:/{name}@champion" in proc.stdout
    client = store(tmp_path)
    (parent,), children = sweep_runs(client, "raw-csv")
    for run in children:
        (inp,) = run.inputs.dataset_inputs
        assert inp.dataset.name == "table:patients.csv" and inp.dataset.source_type == "local"
    assert len({r.inputs.dataset_inputs[0].dataset.digest for r in children}) == 1  # one seed, one split
    mv = client.get_model_version_by_alias(name, "champion")
    with contextlib.chdir(tmp_path):
        z = np.load(client.download_artifacts(mv.run_id, "predictions/predictions.npz", str(tmp_path)))
        prefix = "ts_" if parent.data.tags["calib.champion_candidate"].endswith("+ts") else ""
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
        model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    cfg = RunConfig.model_validate(
        json.loads(Path(client.download_artifacts(mv.run_id, "run_config.json", str(tmp_path))).read_text())
    )
    raw = pd.read_csv(tmp_path / "patients.csv")
    y = np.unique(raw["target"].astype(str).to_numpy(), return_inverse=True)[1]
    rows = raw.iloc[_test_rows(y, cfg)]
    np.testing.assert_allclose(np.asarray(model.predict(rows)), z[f"{prefix}test_probs"], atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- the records derived for built-ins
def test_digits_and_torchvision_records_reproduce_the_loaders_inputs():
    from sklearn.datasets import load_digits

    from calib_core.data.splits import DataSplits, Split, channel_stats, standardize
    from calib_core.preprocess import apply_record

    cfg = RunConfig.model_validate({"data": {"name": "digits"}})
    data = load_dataset(cfg.data, cfg.seed)
    record = input_record(data, cfg.data.model_dump(mode="json"))
    bunch = load_digits()
    rows = _test_rows(np.asarray(bunch.target), cfg)
    got = apply_record(record, bunch.images[rows])  # (N, 8, 8), values 0..16 as sklearn gives them
    np.testing.assert_array_equal(got, data.test.x.numpy())

    # a CIFAR-like set: uint8 (N, 3, H, W) standardised with its train split's per-channel statistics
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (20, 3, 5, 6)).astype(np.uint8))
    mean255, std255 = channel_stats(x[:10])
    splits = [Split(standardize(x[i : i + 5], mean255, std255), torch.zeros(5, dtype=torch.long)) for i in (0, 5, 10)]
    fake = DataSplits(
        *splits,
        num_classes=10,
        input_shape=(3, 5, 6),
        name="cifar10",
        stats={"mean": (mean255 / 255).tolist(), "std": (std255 / 255).tolist()},
    )
    record = input_record(fake, {"name": "cifar10", "root": "/data"})
    assert record["format"] == "image" and record["image_mode"] == "RGB"
    hwc = x[10:15].numpy().transpose(0, 2, 3, 1)  # as CIFAR's files hold them
    np.testing.assert_allclose(apply_record(record, hwc), splits[2].x.numpy(), atol=1e-6, rtol=0)


def test_arrays_records_reproduce_the_loaders_inputs(tmp_path):
    """An .npz of feature vectors (float64, per-feature statistics) and one of signals (N, C, L: per channel)."""
    from calib_core.preprocess import apply_record

    rng = np.random.default_rng(0)
    y = np.arange(150) % 3
    for name, x in (("vec", rng.normal(3, 2, (150, 6)) + y[:, None]), ("sig", rng.normal(1, 5, (150, 2, 7)))):
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
        cfg = RunConfig.model_validate({"data": {"name": "arrays", "path": str(tmp_path / f"{name}.npz")}})
        data = load_dataset(cfg.data, cfg.seed)
        record = input_record(data, cfg.data.model_dump(mode="json"))
        got = apply_record(record, x[_test_rows(y, cfg)])
        np.testing.assert_allclose(got, data.test.x.numpy(), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- arrays as the user has them
@pytest.mark.parametrize("form", ["images (N, 8, 8)", "rows (N, 64)"])
def test_digits_raw_arrays_as_sklearn_gives_them_pass_mlflows_predict(tmp_path, form):
    """The description offers the digits champion's raw inputs as sklearn holds them (float64, (N, 8, 8) or the
    flat (N, 64)); MLflow's own `predict` must take both (its signature must not refuse a rank or a dtype the
    model takes), with the trainer's probabilities."""
    from sklearn.datasets import load_digits

    cfg, data, result = _train({"data": {"name": "digits"}, "model": {"name": "mlp"}})
    model, mv = _register(tmp_path, cfg, data, result, MODEL + "-digits")
    bunch = load_digits()
    rows = _test_rows(np.asarray(bunch.target), cfg)
    raw = bunch.images[rows] if form.startswith("images") else bunch.data[rows]
    assert raw.dtype == np.float64
    expected = _trainer_probs(result, data.test.x)
    np.testing.assert_allclose(np.asarray(model.predict(raw)), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(model.predict(raw.astype(np.float32))), expected, atol=1e-6, rtol=0)
    assert "(N, 64)" in mv.description and "(N, 8, 8)" in mv.description


def test_npz_float64_features_pass_mlflows_predict(tmp_path):
    """An .npz of float64 features, as numpy saves them: the champion's MLflow `predict` takes the file's rows."""
    rng = np.random.default_rng(0)
    y = np.arange(300) % 3
    x = rng.normal(3, 2, (300, 6)) + y[:, None]
    np.savez(tmp_path / "features.npz", x=x, y=y)
    cfg, data, result = _train(
        {"data": {"name": "arrays", "path": str(tmp_path / "features.npz")}, "model": {"name": "mlp"}}
    )
    model, _ = _register(tmp_path, cfg, data, result, MODEL + "-npz")
    raw = x[_test_rows(y, cfg)]
    np.testing.assert_allclose(np.asarray(model.predict(raw)), _trainer_probs(result, data.test.x), atol=1e-6, rtol=0)
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match=r"expected raw inputs of shape \(N, 6\)"):
        model.predict(raw[:, :5])
    # the scoring server's own request path (`mlflow models serve`): the rows as JSON lists
    from mlflow.pyfunc import scoring_server

    reply = scoring_server.invocations(
        json.dumps({"inputs": raw.tolist()}), "application/json", model, model.metadata.get_input_schema()
    )
    assert reply.status == 200, reply.response
    served = np.asarray(json.loads(reply.response)["predictions"])
    np.testing.assert_allclose(served, _trainer_probs(result, data.test.x), atol=1e-6, rtol=0)
    with pytest.raises(MlflowException, match=r"expected raw inputs of shape \(N, 6\)") as info:  # the server's 400
        scoring_server.invocations(json.dumps({"inputs": raw[:, :5].tolist()}), "application/json", model, None)
    assert info.value.error_code == "INVALID_PARAMETER_VALUE"

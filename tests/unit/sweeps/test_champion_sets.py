"""The champion serves prediction sets on request (issue #48 step 5).

A table model (sklearn's digits as a CSV, ten classes named as words) is trained for one epoch, written as the trial
writes its final checkpoint (the model, its summary and `predictions.npz` from calib_core.evaluation.prediction_arrays),
then logged and registered twice by `log_and_register`: as trained, and as a "+ TS" candidate (a temperature on top).
Each loaded pyfunc must store, per method (lac, aps, raps) and alpha (CONFORMAL_SERVED_ALPHAS and the sweep's own), the
finite-sample quantile of its own served probabilities on the validation rows (the checkpoint holds no cross-fitted
"+ TS" predictions, so the "+ TS" model falls back to its full-fit temperature; with them it takes their quantile,
the one behind the sweep's test numbers: test_served_sets_match_report.py); with params {"alpha", "method"} its sets
must be calib_core.conformal.prediction_sets on the probabilities it serves with that quantile, as class names (a
DataFrame `set` column for a DataFrame in, lists otherwise), also through MLflow's scoring app; an alpha or method
without a stored quantile is one line (HTTP 400 served) naming the stored ones.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from calib_core.conformal import calibrate, prediction_sets
from calib_core.conformal.raps import K_REG, PENALTY
from calib_core.preprocess import input_record
from sweeps.contract import CONFORMAL_SERVED_ALPHAS, CONFORMAL_SPEC_KEY
from tests.unit.sweeps.test_champion_inputs import _serve
from tests.unit.sweeps.test_raw_inputs import _test_rows, _train

MODEL = "sets-served"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SWEEP_ALPHA = 0.125  # an evaluation.conformal_alphas entry outside CONFORMAL_SERVED_ALPHAS
TEMPERATURE = 1.7


def write_checkpoint(tmp: Path, cfg, data, result, arrays: dict | None) -> Path:
    """A trial's checkpoint folder `tmp/ckpt` as the trainable writes it: model, summary, final metrics and (given
    `arrays`) its predictions file."""
    from sweeps.integrations.ray.trainable import FINAL_FILE, PREDICTIONS_FILE, SUMMARY_FILE, save_model

    ckpt = tmp / "ckpt"
    ckpt.mkdir(parents=True)
    save_model(
        ckpt,
        result.model,
        cfg.model_dump(mode="json"),
        tuple(data.input_shape),
        input_record(data, cfg.data.model_dump(mode="json")),
    )
    (ckpt / SUMMARY_FILE).write_text(
        json.dumps({"run_config": cfg.model_dump(mode="json"), "input_shape": list(data.input_shape)})
    )
    (ckpt / FINAL_FILE).write_text(json.dumps({f"val_{k}": float(v) for k, v in result.val_metrics.items()}))
    if arrays is not None:
        np.savez_compressed(ckpt / PREDICTIONS_FILE, **arrays)
    return ckpt


def _register_all(tmp: Path, cfg, data, result, with_predictions: bool = True) -> dict:
    """The trial's checkpoint (with its predictions file unless told), registered as trained and + TS."""
    import mlflow
    from mlflow import MlflowClient

    from calib_core.evaluation import prediction_arrays
    from sweeps.integrations.mlflow.model_export import log_and_register

    ckpt = write_checkpoint(tmp, cfg, data, result, prediction_arrays(result) if with_predictions else None)
    uri = f"sqlite:///{tmp.resolve()}/mlflow.db"
    out = {}
    with contextlib.chdir(tmp):
        client = MlflowClient(uri)
        exp = client.create_experiment("sets", artifact_location=(tmp / "mlartifacts").as_uri())
        run = client.create_run(exp)
        client.set_terminated(run.info.run_id, "FINISHED")
        for name, temps in (("trained", None), ("ts", [TEMPERATURE])):
            version = log_and_register(
                run.info.run_id,
                ckpt,
                tuple(data.input_shape),
                MODEL,
                uri,
                temperatures=temps,
                conformal_alphas=[0.1, SWEEP_ALPHA],
            )
            mlflow.set_tracking_uri(uri)
            model = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}")
            out[name] = (model, client.get_model_version(MODEL, version))
    return out


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from sklearn.datasets import load_digits

    d = tmp_path_factory.mktemp("digits")
    frame = load_digits(as_frame=True).frame
    frame["target"] = frame["target"].map(dict(enumerate(WORDS)))
    frame.to_csv(d / "digits.csv", index=False)
    cfg, data, result = _train(
        {"data": {"name": "table", "path": str(d / "digits.csv"), "label_column": "target"}, "model": {"name": "mlp"}}
    )
    models = _register_all(d, cfg, data, result)
    raw = pd.read_csv(d / "digits.csv")
    y = np.unique(raw["target"].astype(str).to_numpy(), return_inverse=True)[1]
    rows = raw.iloc[_test_rows(y, cfg)].drop(columns=["target"])
    return models, data, rows


def _served_probs(model, x: torch.Tensor) -> np.ndarray:
    return model.unwrap_python_model().predict(None, x.numpy(), params={"inputs": "standardised"})


def _expected(probs: np.ndarray, record: dict, method: str, alpha: float, names: list[str]) -> list[list[str]]:
    """calib_core.conformal.prediction_sets with the stored quantile, as class names."""
    q = record["quantiles"][method][repr(alpha)]
    options: dict[str, Any] = {"penalty": PENALTY, "k_reg": K_REG} if method == "raps" else {}
    mask = prediction_sets(method, probs, math.inf if q is None else q, **options).numpy()
    return [[names[k] for k in np.flatnonzero(row)] for row in mask]


# ---------------------------------------------------------------------------- what is stored
@pytest.mark.parametrize("candidate", ["trained", "ts"])
def test_the_stored_quantiles_are_those_of_the_served_probabilities(digits, candidate):
    models, data, _ = digits
    model, mv = models[candidate]
    py = model.unwrap_python_model()
    record = py.spec[CONFORMAL_SPEC_KEY]
    assert model.metadata.metadata["calib_core_spec"][CONFORMAL_SPEC_KEY] == record  # in the MLmodel file too
    assert record["convention"] == "finite_sample" and record["calibration_rows"] == len(data.val.y)
    assert set(record["quantiles"]) == {"lac", "aps", "raps"}  # aps_randomized is not served
    alphas = sorted({*CONFORMAL_SERVED_ALPHAS, 0.1, SWEEP_ALPHA})
    assert all(list(per) == [repr(a) for a in alphas] for per in record["quantiles"].values())
    if candidate == "ts":
        assert py.spec["temperature_on_top"] == [TEMPERATURE]
    val = _served_probs(model, data.val.x)  # what this model serves on the validation rows (TS on top or not)
    for method, per in record["quantiles"].items():
        for key, q in per.items():
            want = calibrate(method, val, data.val.y, float(key))
            assert q is not None and math.isfinite(want), (method, key)  # 270 rows: finite down to alpha 0.01
            assert abs(q - want) < 1e-6, (candidate, method, key, q, want)
    assert "prediction sets: params" in mv.description and "stored alphas 0.01, 0.02" in mv.description


def test_the_ts_candidates_quantiles_are_not_the_trained_ones(digits):
    models, _, _ = digits
    a = models["trained"][0].unwrap_python_model().spec[CONFORMAL_SPEC_KEY]["quantiles"]["lac"]
    b = models["ts"][0].unwrap_python_model().spec[CONFORMAL_SPEC_KEY]["quantiles"]["lac"]
    assert any(abs(a[k] - b[k]) > 1e-3 for k in a)


def test_the_signature_declares_alpha_and_method(digits):
    models, _, _ = digits
    params = {p.name: p for p in models["trained"][0].metadata.signature.params.params}
    assert params["alpha"].dtype.name == "double" and params["alpha"].default is None
    assert params["method"].dtype.name == "string" and params["method"].default is None


# ---------------------------------------------------------------------------- the sets
@pytest.mark.parametrize("candidate", ["trained", "ts"])
def test_sets_are_prediction_sets_on_the_served_probabilities(digits, candidate):
    models, data, rows = digits
    model, _ = models[candidate]
    record = model.unwrap_python_model().spec[CONFORMAL_SPEC_KEY]
    probs = model.predict(rows)  # the default stays probabilities
    assert isinstance(probs, pd.DataFrame) and list(probs.columns) == sorted(WORDS)
    names = list(probs.columns)
    sizes = set()
    for method in ("lac", "aps", "raps"):
        for alpha in (0.05, 0.1, SWEEP_ALPHA):
            got = model.predict(rows, params={"alpha": alpha, "method": method})
            assert isinstance(got, pd.DataFrame) and list(got.columns) == ["set"]
            assert list(got.index) == list(rows.index)
            want = _expected(probs.to_numpy().copy(), record, method, alpha, names)
            assert got["set"].tolist() == want, (method, alpha)
            sizes.update(len(s) for s in want)
    assert len(sizes) > 2  # sets of several sizes: the comparison is not trivial
    # default method lac; an array in gives lists of class names (standardised arrays: past MLflow's table schema)
    x, py = data.test.x.numpy(), model.unwrap_python_model()
    lists = py.predict(None, x, params={"inputs": "standardised", "alpha": 0.1})
    assert isinstance(lists, list) and all(isinstance(s, list) for s in lists)
    assert lists == _expected(_served_probs(model, data.test.x), record, "lac", 0.1, names)
    framed = py.predict(None, x, params={"inputs": "standardised", "alpha": 0.1, "output": "frame"})
    assert framed["set"].tolist() == lists
    assert model.predict(rows, params={"alpha": 0.1, "output": "array"}) == framed["set"].tolist()


def test_served_sets_name_the_classes(digits, monkeypatch):
    models, _, rows = digits
    model, _ = models["ts"]
    split = json.loads(rows.to_json(orient="split", index=False))
    status, body = _serve(model, {"dataframe_split": split, "params": {"alpha": 0.1, "method": "aps"}}, monkeypatch)
    assert status == 200, body
    assert all(set(r) == {"set"} for r in body["predictions"])
    want = model.predict(rows, params={"alpha": 0.1, "method": "aps"})["set"].tolist()
    assert [r["set"] for r in body["predictions"]] == want
    assert {c for r in body["predictions"] for c in r["set"]} <= set(WORDS)
    status, body = _serve(model, {"dataframe_split": split}, monkeypatch)  # no params: probabilities
    assert status == 200 and set(body["predictions"][0]) == set(WORDS), body


# ---------------------------------------------------------------------------- refusals
def test_an_alpha_or_method_without_a_stored_quantile_is_one_line(digits, monkeypatch):
    from mlflow.exceptions import MlflowException

    models, _, rows = digits
    model, _ = models["trained"]
    stored = ", ".join(f"{a:g}" for a in sorted({*CONFORMAL_SERVED_ALPHAS, SWEEP_ALPHA}))
    cases = {
        (0.07, "lac"): f"params alpha: 0.07 has no stored quantile; stored: {stored}",
        (0.1, "thr"): "params method: 'thr' has no stored quantiles; stored: lac, aps, raps",
        (0.1, "aps_randomized"): "params method: randomised APS is not served (its sets depend on a uniform draw",
        (None, "aps"): f"params method: 'aps' needs params alpha, one of the stored {stored}",
    }
    for (alpha, method), says in cases.items():
        with pytest.raises(MlflowException) as e:
            model.predict(rows, params={"alpha": alpha, "method": method})
        line = e.value.message
        assert line.startswith(says) and "\n" not in line and len(line) < 300, line
        assert e.value.error_code == "INVALID_PARAMETER_VALUE"
    split = json.loads(rows.to_json(orient="split", index=False))
    status, body = _serve(model, {"dataframe_split": split, "params": {"alpha": 0.07}}, monkeypatch)
    assert status == 400 and body["message"] == f"params alpha: 0.07 has no stored quantile; stored: {stored}", body


def test_a_model_without_validation_predictions_serves_no_sets(tmp_path):
    """A checkpoint without predictions.npz (an older trial): probabilities as before, sets refused in one line."""
    from mlflow.exceptions import MlflowException
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame
    frame.to_csv(tmp_path / "iris.csv", index=False)
    cfg, data, result = _train(
        {
            "data": {"name": "table", "path": str(tmp_path / "iris.csv"), "label_column": "target"},
            "model": {"name": "mlp"},
        }
    )
    model, mv = _register_all(tmp_path, cfg, data, result, with_predictions=False)["trained"]
    assert CONFORMAL_SPEC_KEY not in model.unwrap_python_model().spec
    rows = frame.drop(columns=["target"]).iloc[:3]
    assert model.predict(rows).shape == (3, 3)
    with pytest.raises(MlflowException, match=r"^this model stores no conformal quantiles \(it was registered without"):
        model.predict(rows, params={"alpha": 0.1})
    assert "prediction sets: none stored" in mv.description


def test_the_spec_key_is_the_contracts():
    from calib_core.export import CONFORMAL_KEY

    assert CONFORMAL_KEY == CONFORMAL_SPEC_KEY

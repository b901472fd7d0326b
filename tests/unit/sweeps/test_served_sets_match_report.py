"""The sets a registered champion serves are the sets behind the sweep's test numbers (issue #48).

A table model (sklearn's digits as a CSV, ten classes named as words) is trained for one epoch and scored as a
completed trial is scored (sweeps.integrations.ray.trainable._score: temperature scaling on top, 5-fold cross-fitted
on validation, then the conformal sets of both candidates); its checkpoint is written as the trial writes it, and
both candidates are registered as the sweep registers a champion (log_and_register, the "+ TS" one with the
temperature the trial fitted). Each loaded pyfunc is then asked for sets on the test rows, and the share of rows
whose served set names the true class, and the mean number of names per set, must be the reported
`[ts_]test_cp_<method>_a<alpha>_coverage` and `_size` exactly. Before the fix, the "+ TS" model's quantile was
computed on validation probabilities under its full-fit temperature while the reported test sets used the quantile
of the cross-fitted ones, and the served coverage or size differed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from calib_core.config import RunConfig
from calib_core.data import load_dataset
from calib_core.trainer import make_trainer
from sweeps.config import EvaluationConfig
from sweeps.contract import TS_PREFIX, conformal_key, metric_key
from tests.unit.sweeps.test_champion_sets import write_checkpoint

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
METHODS = ("lac", "aps", "raps")
ALPHAS = (0.05, 0.1, 0.2)
MODEL = "sets-as-reported"


def _trial(tmp: Path):
    """One completed trial on the digits table, scored as the trainable scores it: (cfg, data, metrics, arrays,
    temperatures)."""
    from sklearn.datasets import load_digits

    from sweeps.integrations.ray.trainable import _score

    frame = load_digits(as_frame=True).frame
    frame["target"] = frame["target"].map(dict(enumerate(WORDS)))
    frame.to_csv(tmp / "digits.csv", index=False)
    torch.set_num_threads(1)
    cfg = RunConfig.model_validate(
        {
            "data": {"name": "table", "path": str(tmp / "digits.csv"), "label_column": "target"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64, "calibrator": "temperature"},
            "device": "cpu",
            "num_threads": 1,
        }
    )
    data = load_dataset(cfg.data, cfg.seed)
    trainer = make_trainer(cfg, data, "cpu")
    result = trainer.fit()
    assert result.status == "completed", result.reason
    evaluation = EvaluationConfig(temperature_on_top=True, conformal_alphas=list(ALPHAS), conformal_methods=METHODS)
    metrics, scored, temperatures = _score(trainer, result, cfg, data, evaluation)
    assert temperatures is not None
    return cfg, data, result, metrics, scored.arrays, temperatures


def _register(tmp: Path, cfg, data, result, arrays, temperatures) -> dict:
    """The trial's checkpoint as _report_final writes it, registered as trained and as "+ TS"; the loaded pyfuncs."""
    import mlflow
    from mlflow import MlflowClient

    from sweeps.integrations.mlflow.model_export import log_and_register

    ckpt = write_checkpoint(tmp, cfg, data, result, arrays)
    uri = f"sqlite:///{tmp.resolve()}/mlflow.db"
    models = {}
    with contextlib.chdir(tmp):
        client = MlflowClient(uri)
        exp = client.create_experiment("sets", artifact_location=(tmp / "mlartifacts").as_uri())
        run = client.create_run(exp)
        client.set_terminated(run.info.run_id, "FINISHED")
        for prefix, temps in (("", None), (TS_PREFIX, temperatures)):
            version = log_and_register(
                run.info.run_id,
                ckpt,
                tuple(data.input_shape),
                MODEL,
                uri,
                temperatures=temps,
                conformal_alphas=list(ALPHAS),
            )
            mlflow.set_tracking_uri(uri)
            models[prefix] = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}")
    return models


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served_as_reported")
    cfg, data, result, metrics, arrays, temperatures = _trial(tmp)
    return _register(tmp, cfg, data, result, arrays, temperatures), data, metrics


@pytest.mark.parametrize("prefix", ["", TS_PREFIX], ids=["trained", "ts"])
def test_served_sets_on_the_test_rows_give_the_reported_test_coverage_and_size(champion, prefix):
    models, data, metrics = champion
    py = models[prefix].unwrap_python_model()
    x, y = data.test.x.numpy(), data.test.y.numpy()
    names = sorted(WORDS)  # the table's label values, sorted: class k is names[k]
    truth = [names[k] for k in y]
    compared = 0
    for method in METHODS:
        for alpha in ALPHAS:
            sets = py.predict(None, x, params={"inputs": "standardised", "alpha": alpha, "method": method})
            assert len(sets) == len(y)
            covered = sum(t in s for t, s in zip(truth, sets, strict=True)) / len(y)
            size = sum(len(s) for s in sets) / len(y)
            key = {m: prefix + metric_key("test", conformal_key(method, alpha, m)) for m in ("coverage", "size")}
            want = {m: metrics[k] for m, k in key.items()}
            # k / n computed the same way on both sides: equal to the last bit when the same rows are covered
            assert (covered, size) == pytest.approx((want["coverage"], want["size"]), abs=1e-12), (method, alpha)
            compared += 1
    assert compared == len(METHODS) * len(ALPHAS)

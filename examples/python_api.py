"""Run a sweep from Python and use what it returns.

    .venv/bin/python examples/python_api.py            # about a minute on 2 CPUs

A 2-trial sweep of the MNIST-1D demo with tiny settings, everything written to a temporary folder
(MLflow store, Optuna study, Ray Tune results), then: the leaderboard, the selection sentence, the
champion's interval, and its registered model loaded back with MLflow to predict calibrated
probabilities. `run_sweep` takes the same configs as `python sweeps/launch.py` (a YAML file, a
dict or a SweepConfig, plus `--set`-style overrides) and raises where the CLI exits non-zero.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from sweeps import run_sweep

DEMO = Path(__file__).resolve().parent.parent / "sweeps" / "configs" / "mnist1d_demo.yaml"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="calib-api-") as workdir:
        result = run_sweep(
            DEMO,
            overrides=[
                "name=api-example",
                "search.num_samples=2",
                "run.data.num_samples=1200",
                "run.train.epochs=2",
                "run.train.batch_size=64",
                "selection.num_resamples=200",
            ],
            workdir=workdir,
        )

        print("\n--- what run_sweep returned ---")
        print(
            f"champion: {result.champion_label} (MLflow run {result.champion_run_id}, trial {result.champion_trial_id})"
        )
        print(f"model: {result.model_uri} (also {result.champion_uri})")
        cols = ["label", "status", "val_accuracy", "val_ece", "val_ece_ci_low", "val_ece_ci_high", "champion"]
        print(result.leaderboard[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        low, high = result.intervals[result.champion_trial_id]["val_ece"]
        print(f"champion val ECE {100 * low:.1f} .. {100 * high:.1f} % ({100 * result.confidence:.0f} % interval)")
        print(f"selection: {result.selection}")
        print(f"repr: {result!r}")
        print(f"best config: {result.best_config}")
        print(f"trials that did not complete: {result.errors}")
        study = result.study  # the Optuna study (optuna.load_study on the sweep's storage)
        print(f"study: {study.study_name} with {len(study.trials)} trials")

        # Later, in another process: the same result read back from MLflow by name (no progress bars).
        from sweeps import load_result

        again = load_result("api-example", workdir)
        assert again.champion_run_id == result.champion_run_id and again.best_config == {
            k: str(v) for k, v in result.best_config.items()
        }
        print(f"load_result: {again!r}")

        # The registered champion predicts calibrated probabilities in any process that can reach the store.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no download bars
        import mlflow

        from calib_core.config import RunConfig
        from calib_core.data import load_dataset

        mlflow.set_tracking_uri(result.tracking_uri)
        model = mlflow.pyfunc.load_model(result.model_uri)
        run_cfg = RunConfig.model_validate(
            mlflow.artifacts.load_dict(f"runs:/{result.champion_run_id}/run_config.json")
        )
        x = load_dataset(run_cfg.data, run_cfg.seed).test.x[:5].numpy()
        probs = model.predict(x, params={"inputs": "standardised"})  # x is standardised; raw data works as is
        assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
        print(f"calibrated probabilities of 5 test inputs: shape {probs.shape}, rows sum to 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())

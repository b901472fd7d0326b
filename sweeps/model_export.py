"""Package the champion as an MLflow pyfunc model that returns calibrated probabilities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow import MlflowClient

CHAMPION_ALIAS = "champion"


class CalibratedClassifierModel(mlflow.pyfunc.PythonModel):
    """Backbone + calibrator; `predict` maps inputs (N, ...) to calibrated probabilities (N, K)."""

    def load_context(self, context: Any) -> None:
        """Load the pickled torch module and the input shape it expects."""
        self.model = torch.load(context.artifacts["model"], map_location="cpu", weights_only=False).eval()
        summary = json.loads(Path(context.artifacts["summary"]).read_text())
        self.input_shape = tuple(summary["input_shape"])

    def predict(self, context: Any, model_input: Any, params: dict | None = None) -> Any:
        """Calibrated class probabilities (N, K) for a batch of inputs (flat rows are reshaped);
        a multi-task model gives a dict {task index: (N, K_t) probabilities}."""
        x = np.asarray(model_input, dtype=np.float32)
        if x.ndim == 2 and len(self.input_shape) > 1:
            x = x.reshape((x.shape[0], *self.input_shape))
        with torch.no_grad():
            logits = self.model(torch.from_numpy(x))
        if isinstance(logits, (list, tuple)):
            return {i: torch.softmax(z.double(), dim=-1).numpy() for i, z in enumerate(logits)}
        return torch.softmax(logits.double(), dim=-1).numpy()


def log_and_register(run_id: str, checkpoint_dir: str | Path, input_shape: tuple[int, ...],
                     model_name: str, tracking_uri: str) -> str:
    """Log the champion's model on its run, register it, and point alias `champion` at it."""
    from sweeps.trainable import MODEL_FILE, SUMMARY_FILE

    mlflow.set_tracking_uri(tracking_uri)
    ckpt = Path(checkpoint_dir)
    summary = json.loads((ckpt / SUMMARY_FILE).read_text())
    summary["input_shape"] = list(input_shape)
    summary_path = ckpt / "export_summary.json"
    summary_path.write_text(json.dumps(summary, default=str))
    client = MlflowClient(tracking_uri)
    before = client.get_run(run_id).info
    with mlflow.start_run(run_id=run_id, nested=False):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=CalibratedClassifierModel(),
            artifacts={"model": str(ckpt / MODEL_FILE), "summary": str(summary_path)},
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}",
                              f"mlflow=={mlflow.__version__}", "calib-sweep"],
            registered_model_name=model_name,
        )
    # start_run/end_run stamps a new end time; the trial's run keeps its own status and end time.
    client.set_terminated(run_id, status=before.status, end_time=before.end_time)
    version = str(info.registered_model_version)
    client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
    client.set_model_version_tag(model_name, version, "source_run_id", run_id)
    return version

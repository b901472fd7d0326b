"""MLflow models-from-code definition of the champion: calibrated class probabilities.

`sweeps.integrations.mlflow.model_export.log_and_register` logs this file as the model's code
(`mlflow.pyfunc.log_model(python_model=<this file>, ...)`); MLflow runs it when the model is
loaded, under a module name of its own. It therefore imports only mlflow, numpy, torch and
`calib_core`, which is shipped inside the model (`code_paths`), never `sweeps`.

The model's artifacts: `spec` (JSON: backbone name and kwargs, calibrator kind, classes or
tasks, input shape; see `calib_core.export`) and `weights` (a state_dict, loaded with
`torch.load(weights_only=True)`). No pickled Python object is involved.
"""

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel

PREDICT_BATCH = 1024


class CalibratedClassifierPyfunc(PythonModel):
    """`predict(x)`: inputs (N, *input_shape) -> calibrated probabilities (N, K) (float64 rows
    summing to 1); a multi-task model gives {task name: (N, K_t)}.

    Through `mlflow.pyfunc.load_model` / `mlflow models serve`, MLflow first enforces the
    logged signature (float32, (-1, *input_shape)); `predict` itself then rejects NaN and inf
    (HTTP 400 when served) and, called directly, also accepts the flat (N, prod(input_shape))
    or one-channel (N, 1, L) layouts, naming the accepted shapes when none fits.
    """

    def load_context(self, context: Any) -> None:
        from calib_core.export import load_calibrated_model, output_classes

        self.spec = json.loads(Path(context.artifacts["spec"]).read_text())
        self.module = load_calibrated_model(self.spec, context.artifacts["weights"])
        self.input_shape = tuple(int(s) for s in self.spec["input_shape"])
        self.outputs = output_classes(self.spec)

    # model_input: np.ndarray is a hint MLflow derives no signature from (the logged tensor
    # signature is the one enforced) and it silences MLflow's "add type hints" warning
    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None):
        from calib_core.export import InvalidInputError, prepare_inputs

        try:
            x = prepare_inputs(model_input, self.input_shape)
        except InvalidInputError as exc:  # MLflow's scoring server answers these with HTTP 400
            raise MlflowException.invalid_parameter_value(str(exc)) from None
        with torch.no_grad():
            chunks = [self.module(xb) for xb in torch.from_numpy(x).split(PREDICT_BATCH)] if len(x) else []
        if self.outputs[0][0] is None:  # single task
            k = self.outputs[0][1]
            logits = torch.cat(chunks) if chunks else torch.empty(0, k)
            return torch.softmax(logits.double(), dim=-1).numpy()
        out = {}
        for t, (name, k) in enumerate(self.outputs):
            logits = torch.cat([c[t] for c in chunks]) if chunks else torch.empty(0, k)
            out[name] = torch.softmax(logits.double(), dim=-1).numpy()
        return out


mlflow.models.set_model(CalibratedClassifierPyfunc())

__all__ = ["CalibratedClassifierPyfunc"]

"""MLflow models-from-code definition of the champion: calibrated class probabilities.

`sweeps.integrations.mlflow.model_export.log_and_register` logs this file as the model's code
(`mlflow.pyfunc.log_model(python_model=<this file>, ...)`); MLflow runs it when the model is
loaded, under a module name of its own. It therefore imports only mlflow, numpy, torch and
`calib_core`, which is shipped inside the model (`code_paths`), never `sweeps`.

The model's artifacts: `spec` (JSON: backbone name and kwargs, calibrator kind, classes or
tasks, input shape; see `calib_core.export`) and `weights` (a state_dict, loaded with
`torch.load(weights_only=True)`). No pickled Python object is involved.

Raw inputs: when the spec carries a `preprocessing` record (calib_core.preprocess), `predict` takes the data as it
is on disk (table rows by column name, uint8 pixel arrays, raw feature arrays) and applies the training split's
preprocessing itself; the predict param `inputs: "standardised"` takes already-preprocessed model inputs instead
(the old path). A spec without the record (older checkpoints, multi-task CelebA) takes standardised inputs only.
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
    """`predict(x)`: raw inputs (see the module docstring), or with params `inputs: "standardised"` model inputs
    (N, *input_shape) -> calibrated probabilities (N, K) (float64 rows summing to 1); a multi-task model gives
    {task name: (N, K_t)}. Params `layout: "HWC" | "CHW"` settles an image batch whose channels could be either.

    Through `mlflow.pyfunc.load_model` / `mlflow models serve`, MLflow first enforces the
    logged signature (the raw inputs: named, typed columns for a table; uint8 (-1, -1, -1, -1) for images;
    float32 with the data's dimensions otherwise; a spec without a preprocessing record: float32 model inputs);
    `predict` itself then rejects what does not fit in one line (HTTP 400 when served), naming the columns or
    shapes. Standardised inputs for a table or image model go around the raw signature:
    `mlflow.pyfunc.load_model(uri).unwrap_python_model().predict(None, x, params={"inputs": "standardised"})`.
    """

    def load_context(self, context: Any) -> None:
        from calib_core.export import load_calibrated_model, output_classes

        self.spec = json.loads(Path(context.artifacts["spec"]).read_text())
        self.module = load_calibrated_model(self.spec, context.artifacts["weights"])
        self.input_shape = tuple(int(s) for s in self.spec["input_shape"])
        self.outputs = output_classes(self.spec)
        self.preprocessing = self.spec.get("preprocessing")

    def model_inputs(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """The module's float32 inputs (N, *input_shape): raw inputs through the preprocessing record (the default
        when the spec has one), or standardised ones as given (params `inputs: "standardised"`)."""
        from calib_core.export import InvalidInputError, prepare_inputs

        mode = str((params or {}).get("inputs") or ("raw" if self.preprocessing else "standardised"))
        if mode not in ("raw", "standardised"):
            raise InvalidInputError(f"params inputs: {mode!r} is neither 'raw' nor 'standardised'")
        if mode == "standardised":
            return prepare_inputs(model_input, self.input_shape)
        if not self.preprocessing:
            raise InvalidInputError("this model has no record of its preprocessing: it takes standardised inputs only")
        from calib_core.preprocess import apply_record

        layout = (params or {}).get("layout") or None
        return apply_record(self.preprocessing, model_input, layout=str(layout) if layout else None)

    # model_input: np.ndarray is a hint MLflow derives no signature from (the logged tensor
    # signature is the one enforced) and it silences MLflow's "add type hints" warning
    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None):
        from calib_core.export import InvalidInputError

        try:
            x = self.model_inputs(model_input, params)
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

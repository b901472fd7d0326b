"""MLflow models-from-code definition of the champion: calibrated class probabilities.

`sweeps.integrations.mlflow.model_export.log_and_register` logs this file as the model's code
(`mlflow.pyfunc.log_model(python_model=<this file>, ...)`); MLflow runs it when the model is
loaded, under a module name of its own. It therefore imports only mlflow, numpy, torch and
`calib_core`, which is shipped inside the model (`code_paths`), never `sweeps`.

The model's artifacts: `spec` (JSON: backbone name and kwargs, calibrator kind, classes or
tasks, input shape; see `calib_core.export`) and `weights` (a state_dict, loaded with
`torch.load(weights_only=True)`). No pickled Python object is involved.

Raw inputs: when the spec carries a `preprocessing` record (calib_core.preprocess), `predict` takes the data as it
is on disk (table rows by column name; images as arrays of any layout, uint8 or float, PIL images or PNG/JPEG files
as bytes or base64 text; raw feature arrays) and applies the training split's preprocessing itself; the predict
param `inputs: "standardised"` takes already-preprocessed model inputs instead (the old path). A spec without the
record (older checkpoints, multi-task CelebA) takes standardised inputs only.

Outputs: a DataFrame in, a DataFrame out (one column per class, named as the record names the classes: the table's
label values, the image folder's sub-folders; its index the input's); an array otherwise (column k is class k), or
as the param `output: "frame" | "array"` asks.

Prediction sets (calib_core.conformal.served): with params `alpha` (a miscoverage level whose quantile the model
stores: the spec's `conformal` record, calibrated at export on all validation rows, the quantile behind the sweep's
test numbers) and optionally `method` ("lac", the default, "aps" or "raps"), `predict` returns each row's split
conformal set as the list of its class names instead of the probabilities: a DataFrame with one column `set` for a
DataFrame input (its index the input's), a list of lists otherwise (`output` chooses as for probabilities). The sets
follow the stored convention (finite_sample: {k : score_k <= q}; a set may be empty, and it is every label where the
calibration rows were too few for that alpha). Randomised APS is not served (one input would get different sets on
different calls). An alpha or method without a stored quantile is refused in one line naming the stored ones.

A refused input is one line, `InputRefused` (MLflow's INVALID_PARAMETER_VALUE: HTTP 400 when served), naming the
expected and the received shape or type; MLflow's scoring server would prefix the whole input to the message, which
`InputRefused` keeps out.
"""

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

PREDICT_BATCH = 1024
OUTPUTS = ("frame", "array")


class InputRefused(MlflowException):
    """An input the model cannot take, as one line (HTTP 400 when served)."""

    def __init__(self, line: str) -> None:
        super().__init__(line, error_code=INVALID_PARAMETER_VALUE)

    # MLflow's scoring server rewrites `message` to "Failed to predict data '<the whole input>'. Error: ..."
    # (mlflow/pyfunc/scoring_server invocations); the first message set, the constructor's, is the one kept
    @property
    def message(self) -> str:
        return self._line

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_line"):
            self._line = str(value)


class CalibratedClassifierPyfunc(PythonModel):
    """`predict(x)`: raw inputs (see the module docstring), or with params `inputs: "standardised"` model inputs
    (N, *input_shape) -> calibrated probabilities (N, K) (float64 rows summing to 1; a DataFrame with the class
    names as columns for a DataFrame input); a multi-task model gives {task name: (N, K_t)}. Params: `layout`
    ("HWC" | "CHW") settles an image batch whose channels could be either, `pixels` ("0..255" | "0..1") the scale
    of float pixels, `output` ("frame" | "array") the type returned, `alpha` and `method` prediction sets instead
    of probabilities (the module docstring).

    Through `mlflow.pyfunc.load_model` / `mlflow models serve`, MLflow's own signature check lets every form
    through (a table's columns are named but optional and of any type; images and raw arrays have no input
    schema: MLflow's check refuses by printing the whole input), so `predict` checks the input itself and refuses
    in one line. Standardised inputs for a table or image model:
    `mlflow.pyfunc.load_model(uri).unwrap_python_model().predict(None, x, params={"inputs": "standardised"})`.
    """

    def load_context(self, context: Any) -> None:
        from calib_core.export import class_names, load_calibrated_model, output_classes

        self.spec = json.loads(Path(context.artifacts["spec"]).read_text())
        self.module = load_calibrated_model(self.spec, context.artifacts["weights"])
        self.input_shape = tuple(int(s) for s in self.spec["input_shape"])
        self.outputs = output_classes(self.spec)
        self.preprocessing = self.spec.get("preprocessing")
        self.class_names = class_names(self.spec)
        from calib_core.export import CONFORMAL_KEY

        self.conformal = self.spec.get(CONFORMAL_KEY)

    def sets_request(self, params: dict[str, Any] | None) -> tuple[str, float] | None:
        """(method, alpha) when params ask for prediction sets, None for probabilities; InvalidInputError (one
        line) when they cannot be answered, before any input is read."""
        from calib_core.conformal.served import DEFAULT_METHOD, served_quantile, stored_alphas
        from calib_core.export import InvalidInputError

        params = params or {}
        alpha, method = params.get("alpha"), params.get("method") or None
        if alpha is None and method is None:
            return None
        if self.outputs[0][0] is not None:
            raise InvalidInputError("prediction sets are served for single-task models only; this one has tasks")
        if not self.conformal:
            raise InvalidInputError(
                "this model stores no conformal quantiles (it was registered without its validation predictions): "
                "no prediction sets; omit params alpha and method for probabilities"
            )
        if alpha is None:
            stored = ", ".join(f"{a:g}" for a in stored_alphas(self.conformal))
            raise InvalidInputError(f"params method: {method!r} needs params alpha, one of the stored {stored}")
        method = str(method or DEFAULT_METHOD)
        try:
            served_quantile(self.conformal, method, alpha)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        return method, float(alpha)

    def model_inputs(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """The module's float32 inputs (N, *input_shape): raw inputs through the preprocessing record (the default
        when the spec has one), or standardised ones as given (params `inputs: "standardised"`)."""
        from calib_core.export import InvalidInputError, prepare_inputs

        params = params or {}
        mode = str(params.get("inputs") or ("raw" if self.preprocessing else "standardised"))
        if mode not in ("raw", "standardised"):
            raise InvalidInputError(f"params inputs: {mode!r} is neither 'raw' nor 'standardised'")
        if mode == "standardised":
            return prepare_inputs(model_input, self.input_shape)
        if not self.preprocessing:
            raise InvalidInputError("this model has no record of its preprocessing: it takes standardised inputs only")
        from calib_core.preprocess import apply_record

        layout, pixels = params.get("layout") or None, params.get("pixels") or None
        return apply_record(
            self.preprocessing,
            model_input,
            layout=str(layout) if layout else None,
            pixels=str(pixels) if pixels else None,
        )

    # model_input: np.ndarray is a hint MLflow derives no signature from and validates nothing against (the
    # logged signature is the one used) and it silences MLflow's "add type hints" warning
    def predict(self, context: Any, model_input: np.ndarray, params: dict[str, Any] | None = None) -> Any:
        from calib_core.export import InvalidInputError

        try:
            frame = _wants_frame(model_input, params)
            sets = self.sets_request(params)
            x = self.model_inputs(model_input, params)
        except InvalidInputError as exc:  # MLflow's scoring server answers these with HTTP 400
            raise InputRefused(str(exc)) from None
        with torch.no_grad():
            chunks = [self.module(xb) for xb in torch.from_numpy(x).split(PREDICT_BATCH)] if len(x) else []
        if self.outputs[0][0] is None:  # single task
            k = self.outputs[0][1]
            logits = torch.cat(chunks) if chunks else torch.empty(0, k)
            probs = torch.softmax(logits.double(), dim=-1).numpy()
            if sets is not None:
                return self._sets(probs, *sets, model_input, frame)
            return _as_frame(probs, self.class_names, model_input) if frame else probs
        out = {}
        for t, (name, k) in enumerate(self.outputs):
            logits = torch.cat([c[t] for c in chunks]) if chunks else torch.empty(0, k)
            out[name] = torch.softmax(logits.double(), dim=-1).numpy()
        return out

    def _sets(self, probs: np.ndarray, method: str, alpha: float, model_input: Any, frame: bool) -> Any:
        """Each row's set as its class names: a DataFrame with a `set` column, or a list of lists."""
        from calib_core.conformal.served import served_sets

        mask = served_sets(self.conformal, probs, alpha=alpha, method=method).numpy() if len(probs) else probs > 2
        names = [[self.class_names[k] for k in np.flatnonzero(row)] for row in mask]
        if not frame:
            return names
        index = model_input.index if isinstance(model_input, pd.DataFrame) and len(model_input) == len(names) else None
        return pd.DataFrame({"set": pd.Series(names, index=index, dtype=object)}, index=index)


def _wants_frame(model_input: Any, params: dict[str, Any] | None) -> bool:
    """A DataFrame for a DataFrame input, an array otherwise, unless params `output` says which."""
    from calib_core.export import InvalidInputError

    output = str((params or {}).get("output") or "")
    if output and output not in OUTPUTS:
        raise InvalidInputError(f"params output: {output!r} is neither 'frame' nor 'array'")
    return output == "frame" if output else isinstance(model_input, pd.DataFrame)


def _as_frame(probs: np.ndarray, names: list[str], model_input: Any) -> pd.DataFrame:
    """Probabilities with a column per class; the input's row index when it had one (rows stay matched)."""
    index = model_input.index if isinstance(model_input, pd.DataFrame) and len(model_input) == len(probs) else None
    return pd.DataFrame(probs, columns=names, index=index)


mlflow.models.set_model(CalibratedClassifierPyfunc())

__all__ = ["CalibratedClassifierPyfunc", "InputRefused"]

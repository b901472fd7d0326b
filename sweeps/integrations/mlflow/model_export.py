"""Package the champion as a portable MLflow pyfunc model that returns calibrated probabilities.

What gets logged (a models-from-code pyfunc; no pickled Python object anywhere):

- `champion_pyfunc.py` (this package's `sweeps/integrations/mlflow/champion_pyfunc.py`), the model's code, which
  `mlflow.pyfunc.load_model` runs; it imports mlflow, torch and calib_core only;
- artifacts `spec` (JSON, `calib_core.export.model_spec`: backbone name and kwargs,
  calibrator kind, classes or tasks, input shape; with the trial's validation predictions, the conformal quantiles
  of its prediction sets, `conformal_record`) and `weights` (the calibrated module's
  state_dict, tensors only, loaded with `torch.load(weights_only=True)`);
- `code/calib_core/`, the calib_core package (`code_paths`), so the model loads where
  neither this repository nor `sweeps` is importable;
- exact pip requirements (torch, numpy, pydantic, pyyaml, pillow, mlflow pinned to the versions
  installed here), a signature (`model_signature`: what MLflow checks before `predict` runs, kept permissive
  where the model takes several forms, since MLflow's refusal prints the whole input) and an input example.

Before logging, the module rebuilt from the spec and the weights is checked against the
trained one on the input example. The registered version gets a description (dataset,
calibrator, calibrator lr, validation metrics) and the alias `champion`.

Registration is idempotent: when the run already has a version of the registered model, that
version is reused (only the alias and tags are set); when an earlier attempt logged the
model but died before registering it, that logged model is registered instead of logging a
second one.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types import Schema, TensorSpec

from sweeps.contract import (
    CHAMPION_ALIAS,
    CONFORMAL_SERVED_ALPHAS,
    CONFORMAL_SPEC_KEY,
    FINAL_FILE,
    MODEL_FILE,
    MODEL_SPEC_FILE,
    PREDICTIONS_FILE,
    SUMMARY_FILE,
    TAG_EXPORT_FORMAT,
    TAG_SOURCE_RUN,
    TS_PREFIX,
    is_finite_number,
)
from sweeps.integrations.mlflow.retry import fluent_http_retries
from sweeps.integrations.mlflow.store import MlflowStore

LOGGED_MODEL_NAME = "model"
MODEL_CODE = Path(__file__).with_name("champion_pyfunc.py")
# distributions the model imports when it loads (calib_core.trainer needs pydantic and pyyaml; pillow decodes and
# resizes images, pinned since its resize is part of the preprocessing)
REQUIRED_DISTRIBUTIONS = ("torch", "numpy", "pydantic", "pyyaml", "pillow", "mlflow")
EXPORT_FORMAT = "mlflow-models-from-code/calib_core-spec-v1"
EXPORT_FORMAT_TS = EXPORT_FORMAT + "+temperature-on-top"  # the trial's model with temperature scaling on top
VAL_METRICS = (
    ("accuracy", "accuracy"),
    ("ece", "ECE"),
    ("sce", "SCE"),
    ("ace", "ACE"),
    ("tace", "TACE"),
    ("mce", "MCE"),
    ("rmsce", "RMSCE"),
    ("nll", "NLL"),
    ("brier", "Brier"),
    ("aurc", "AURC"),
    ("shift_ece", "ECE under shift"),
)


class CalibratedClassifierModel(PythonModel):
    """Legacy (CloudPickled) model class: versions registered before the portable format
    reference it by name, so it stays importable for them. New versions never use it.

    Their `model` artifact is a whole pickled nn.Module, which is no longer unpickled (that
    could run code): loading one raises calib_core.export.UnsafeFileError; register the
    champion again (the portable format) to serve it."""

    def load_context(self, context: Any) -> None:
        from calib_core.export import load_tensors

        self.model = load_tensors(context.artifacts["model"]).eval()
        summary = json.loads(Path(context.artifacts["summary"]).read_text())
        self.input_shape = tuple(summary["input_shape"])

    def predict(self, context: Any, model_input: np.ndarray, params: dict | None = None) -> Any:
        x = np.asarray(model_input, dtype=np.float32)
        if x.ndim == 2 and len(self.input_shape) > 1:
            x = x.reshape((x.shape[0], *self.input_shape))
        with torch.no_grad():
            logits = self.model(torch.from_numpy(x))
        if isinstance(logits, (list, tuple)):
            return {i: torch.softmax(z.double(), dim=-1).numpy() for i, z in enumerate(logits)}
        return torch.softmax(logits.double(), dim=-1).numpy()


# ---------------------------------------------------------------------------- pieces
# what a backbone of another library needs where the champion loads (calib_core/models/library.py builds it)
LIBRARY_DISTRIBUTIONS = {"torchvision": ("torchvision",), "timm": ("torchvision", "timm", "safetensors")}


def pip_requirements(spec: dict[str, Any] | None = None) -> list[str]:
    """`name==version` for every distribution the model (of `spec`, when given) needs, as installed here."""
    from calib_core.registry import split_library_name

    library = split_library_name(str(((spec or {}).get("model") or {}).get("name", "")))
    extra = LIBRARY_DISTRIBUTIONS[library[0]] if library else ()
    out = []
    for dist in (*REQUIRED_DISTRIBUTIONS, *extra):
        version = metadata.version(dist).split("+")[0]  # torch's local tag (+cpu, +cu12x) is not on PyPI
        out.append(f"{dist}=={version}")
    return out


def model_signature(spec: dict[str, Any]) -> ModelSignature:
    """What MLflow shows and checks before `predict` runs. Inputs: with a preprocessing record
    (calib_core.preprocess), a table's columns by name, each optional and of any type (extra columns are dropped by
    MLflow, the order is free; which may be left out and what a column holds the model checks itself: MLflow's
    refusal prints the whole frame), and no schema for images and raw arrays (they come in several ranks, dtypes and
    types: arrays, PIL images, encoded files); without a record, float32 model inputs with the data's number of
    dimensions (sizes -1: the model checks them). Params: `inputs` ("raw" or "standardised"), `layout` ("HWC" or
    "CHW", images), `pixels` ("0..255" or "0..1", float images), `output` ("frame" or "array"), `alpha` and
    `method` (prediction sets instead of probabilities: champion_pyfunc's docstring). Outputs (probabilities): a
    float64 column per class named as the record names the classes (what a DataFrame input gets back; an array's
    column k is class k), float64 (-1, K) without class names, or one named (-1, K_t) per task. The exact input
    shape is the model's metadata (`calib_core_spec.input_shape`)."""
    from mlflow.types import ColSpec, ParamSchema, ParamSpec
    from mlflow.types.schema import AnyType

    from calib_core.export import class_names, output_classes
    from calib_core.preprocess import IMAGE_FORMATS

    record = spec.get("preprocessing")
    dims = (-1, *(-1 for _ in spec["input_shape"]))
    inputs: Schema | None
    if record and record.get("format") == "table":
        inputs = Schema([ColSpec(AnyType(), str(c["name"]), required=False) for c in record["columns"]])
    elif record:
        inputs = None  # images and raw arrays: every rank, dtype and type the model takes (calib_core.preprocess)
    else:
        inputs = Schema([TensorSpec(np.dtype(np.float32), dims)])
    params = ParamSchema(
        [
            ParamSpec("inputs", "string", "raw" if record else "standardised"),
            ParamSpec("layout", "string", ""),
            *([ParamSpec("pixels", "string", "")] if record and record.get("format") in IMAGE_FORMATS else []),
            ParamSpec("output", "string", ""),
            # None: probabilities; a stored alpha: prediction sets (a declared param: MLflow drops undeclared ones)
            ParamSpec("alpha", "double", None),
            ParamSpec("method", "string", None),
        ]
    )
    outs = output_classes(spec)
    if outs[0][0] is not None:
        outputs = Schema([TensorSpec(np.dtype(np.float64), (-1, k), name=name) for name, k in outs])
    elif record and record.get("class_names"):
        outputs = Schema([ColSpec("double", name) for name in class_names(spec)])
    else:
        outputs = Schema([TensorSpec(np.dtype(np.float64), (-1, outs[0][1]))])
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


def logged_input_example(spec: dict[str, Any]) -> Any:
    """What the model is logged with as its input example: raw inputs when it takes them, else standardised."""
    from calib_core.preprocess import raw_example

    record = spec.get("preprocessing")
    return raw_example(record) if record else input_example(tuple(spec["input_shape"]))


def input_example(input_shape: tuple[int, ...]) -> np.ndarray:
    """A small float32 batch shaped like the data (standardised inputs, so N(0, 1) values)."""
    rows = 2 if math.prod(input_shape) <= 10_000 else 1
    return np.random.default_rng(0).standard_normal((rows, *input_shape)).astype(np.float32)


def conformal_record(
    ckpt: Path, temperatures: list[float] | None, alphas: tuple[float, ...] | list[float] = ()
) -> dict[str, Any] | None:
    """The conformal quantiles the exported model stores (calib_core.conformal.served.served_record): lac, aps and
    raps at every alpha of CONFORMAL_SERVED_ALPHAS and `alphas` (the sweep's evaluation.conformal_alphas), calibrated
    on all the trial's validation rows (PREDICTIONS_FILE) with the probabilities behind the sweep's test numbers
    (calib_core.conformal.evaluate_sets): the trial's own, or for a "+ TS" model (`temperatures` given) the
    cross-fitted validation probabilities the trial stored under TS_PREFIX; so the served sets are the sets the
    report's test coverage and size describe. None without single-task validation predictions (a multi-task model,
    or a checkpoint without the file): the model then serves no sets."""
    from calib_core.conformal.served import served_record, with_temperature

    path = ckpt / PREDICTIONS_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        if "tasks" in z.files or "val_probs" not in z.files or "val_labels" not in z.files:
            return None
        prefix = TS_PREFIX if temperatures is not None and f"{TS_PREFIX}val_probs" in z.files else ""
        probs, labels = z[f"{prefix}val_probs"], z[f"{prefix}val_labels"]
    if len(labels) == 0:
        return None
    # as stored (float32), widened as evaluate_sets widens them, so the quantile is the sweep's to the last bit
    served = torch.from_numpy(probs)
    if temperatures is not None and not prefix:
        # a "+ TS" checkpoint without its cross-fitted predictions (none were measured for it): the full fit's
        served = with_temperature(served, float(temperatures[0]))
    return served_record(served, labels, (*CONFORMAL_SERVED_ALPHAS, *alphas))


def _sets_text(record: dict[str, Any] | None) -> str:
    if not record:
        return "none stored (no validation predictions at export)"
    from calib_core.conformal.served import stored_alphas

    alphas = ", ".join(f"{a:g}" for a in stored_alphas(record))
    return (
        f'params {{"alpha": a, "method": "lac" | "aps" | "raps"}} return each row\'s set of class names (split '
        f"conformal, {record['convention']} quantile on {record['calibration_rows']} validation rows); stored "
        f"alphas {alphas}; randomised APS is not served"
    )


def _fmt_metric(key: str, value: float) -> str:
    return f"{value:.4f}" if key != "nll" else f"{value:.4g}"


def default_description(summary: dict[str, Any], metrics: dict[str, Any], spec: dict[str, Any], run_id: str) -> str:
    """Markdown for the model version: dataset, model, calibrator and its lr, validation metrics."""
    from calib_core.export import class_names, output_classes

    rc = summary.get("run_config") or {}
    train = rc.get("train") or {}
    method = train.get("method", "?")
    if method == "onego":
        cal = (
            f"{train.get('calibrator')}, trained one-go with the backbone, calibrator lr "
            f"{float(train.get('calibrator_lr', float('nan'))):.4g}, calibrator data {train.get('calibrator_data')}"
        )
    elif method == "posthoc":
        cal = f"{train.get('posthoc_calibrator')}, fitted post hoc on {train.get('calibrator_data')}"
    else:
        cal = f"none (method {method})"
    vals = []
    for key, label in VAL_METRICS:
        v = metrics.get(f"val_{key}")
        if is_finite_number(v):
            vals.append(f"{label} {_fmt_metric(key, float(v))}")
    outs = output_classes(spec)
    if outs[0][0] is None:
        names = class_names(spec)
        shown = ", ".join(names[:12]) + (f" (and {len(names) - 12} more)" if len(names) > 12 else "")
        output = (
            f"(N, {outs[0][1]}) calibrated class probabilities, classes {shown} in that order (a DataFrame with "
            "those columns for a DataFrame input)"
        )
    else:
        output = "{" + ", ".join(f"{n}: (N, {k})" for n, k in outs) + "} calibrated probabilities per task"
    model = rc.get("model") or {}
    lines = [
        f"Calibrated classifier, the sweep's champion (MLflow run `{run_id}`).",
        "",
        f"- dataset: {(rc.get('data') or {}).get('name', '?')} (seed {rc.get('seed', '?')})",
        f"- model: {model.get('name', spec['model']['name'])} {json.dumps(model.get('kwargs') or {})}",
        f"- calibrator: {cal}",
        f"- validation{' (means over the tasks)' if spec.get('tasks') else ''}: "
        f"{', '.join(vals) if vals else 'no metrics recorded'}",
        f"- input: {_input_text(spec)}",
        f"- output: {output}",
        *([] if spec.get("tasks") else [f"- prediction sets: {_sets_text(spec.get(CONFORMAL_SPEC_KEY))}"]),
    ]
    return "\n".join(lines)


def _input_text(spec: dict[str, Any]) -> str:
    from calib_core.preprocess import describe_raw_inputs

    standardised = f"float32 array (N, {', '.join(str(s) for s in spec['input_shape'])}), finite values"
    record = spec.get("preprocessing")
    if not record:
        return f"{standardised}, standardised with the training split's statistics"
    return (
        f"raw data as on disk: {describe_raw_inputs(record)} (the training preprocessing is applied inside); "
        f'params {{"inputs": "standardised"}} takes model inputs, {standardised}'
    )


def _read_metrics(store: MlflowStore, run_id: str, ckpt: Path) -> dict[str, Any]:
    metrics: dict[str, Any] = dict(store.get_run(run_id).data.metrics)
    if (ckpt / FINAL_FILE).is_file():
        metrics.update(json.loads((ckpt / FINAL_FILE).read_text()))
    return metrics


def _load_trained(ckpt: Path) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """The trial's calibrated module, summary and model spec from its final checkpoint
    (sweeps.contract's layout, written by sweeps.integrations.ray.trainable.save_model): the module is rebuilt
    from the spec with calib_core's registries and its state_dict loaded with
    `torch.load(weights_only=True)`; a file holding any other pickled object raises
    calib_core.export.UnsafeFileError and is never unpickled."""
    from calib_core.export import load_calibrated_model, load_tensors

    summary = json.loads((ckpt / SUMMARY_FILE).read_text())
    if not (ckpt / MODEL_FILE).is_file():
        why = summary.get("model_export_error") or f"the trial did not complete (status {summary.get('status')!r})"
        raise FileNotFoundError(f"{ckpt / MODEL_FILE} is missing: {why}, so there is no model to register")
    weights = load_tensors(ckpt / MODEL_FILE)  # before the spec: an old pickled module is refused by name
    if not (ckpt / MODEL_SPEC_FILE).is_file():
        raise FileNotFoundError(f"{ckpt / MODEL_SPEC_FILE} is missing: {ckpt} was not written by this version")
    spec = json.loads((ckpt / MODEL_SPEC_FILE).read_text())
    return load_calibrated_model(spec, weights), summary, spec


def _stage(module: torch.nn.Module, spec: dict[str, Any], out: Path) -> None:
    """Write weights.pt, spec.json and a clean copy of calib_core under `out`, then check that
    the module rebuilt from them computes what the trained one computes."""
    import calib_core
    from calib_core.export import load_calibrated_model, state_dict_for_export

    torch.save(state_dict_for_export(module), out / "weights.pt")
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    shutil.copytree(
        Path(calib_core.__file__).parent,
        out / "code" / "calib_core",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"),
    )

    rebuilt = load_calibrated_model(json.loads((out / "spec.json").read_text()), out / "weights.pt")
    x = torch.from_numpy(input_example(tuple(spec["input_shape"])))
    with torch.no_grad():
        want, got = module(x), rebuilt(x)
    want = want if isinstance(want, (list, tuple)) else [want]
    got = got if isinstance(got, (list, tuple)) else [got]
    if len(want) != len(got) or not all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(want, got)):
        raise RuntimeError(f"the module rebuilt from spec {spec} differs from the trained one; not registering it")
    if spec.get("preprocessing"):
        from calib_core.preprocess import apply_record, raw_example

        apply_record(spec["preprocessing"], raw_example(spec["preprocessing"]))  # the record applies (or raises)


def _log_portable_model(
    store: MlflowStore, run_id: str, module: torch.nn.Module, spec: dict[str, Any], fmt: str = EXPORT_FORMAT
) -> str:
    """Log the portable model of `run_id` with no run opened (the run's status, end time and metrics untouched,
    and none of them copied onto the model one request per metric: sweeps/integrations/mlflow/logged_model.py);
    return its model id."""
    from sweeps.integrations.mlflow.logged_model import link_output, new_logged_model, pins_not_rechecked

    with tempfile.TemporaryDirectory(prefix="calib-export-") as tmp:
        out = Path(tmp)
        _stage(module, spec, out)
        model = new_logged_model(store, run_id, LOGGED_MODEL_NAME, {TAG_EXPORT_FORMAT: fmt})
        saved_path = list(sys.path)
        try:
            retrying = fluent_http_retries(store.tracking_uri, store.retry is not None)
            with retrying, pins_not_rechecked():
                info = mlflow.pyfunc.log_model(
                    name=LOGGED_MODEL_NAME,
                    model_id=model.model_id,
                    python_model=str(MODEL_CODE),
                    artifacts={"spec": str(out / "spec.json"), "weights": str(out / "weights.pt")},
                    code_paths=[str(out / "code" / "calib_core")],
                    pip_requirements=pip_requirements(spec),
                    signature=model_signature(spec),
                    input_example=logged_input_example(spec),
                    metadata={"calib_core_spec": spec},
                )
        finally:
            # MLflow validates the input example by loading the model here, which prepends the
            # model's (temporary) code directory to sys.path.
            sys.path[:] = saved_path
        link_output(store, run_id, model.model_id)
    store.mark_export_complete(info.model_id)
    return info.model_id


# ---------------------------------------------------------------------------- entry point
def log_and_register(
    run_id: str,
    checkpoint_dir: str | Path,
    input_shape: tuple[int, ...],
    model_name: str,
    tracking_uri: str,
    *,
    description: str | None = None,
    alias: str | None = CHAMPION_ALIAS,
    temperatures: list[float] | None = None,
    store: MlflowStore | None = None,
    conformal_alphas: tuple[float, ...] | list[float] = (),
) -> str:
    """Log the champion's portable model on its run, register it, point `alias` at it; return
    the version. Idempotent: a version already registered from `run_id` is reused (only the
    alias, tags and, when given, the description are set), so a resumed sweep never adds a
    second one. `description` replaces the default one built from the run's summary. `alias=None`: no alias
    is set (the champion gate, sweeps/integrations/mlflow/champion_gate.py, decides which one). `store`: the
    sweep's store on `tracking_uri` (its calls wait out outages and HTTP 500s, so the run's status is restored even
    when the fluent logging fails and the caller retries the whole call); None: one that fails at once.
    `conformal_alphas`: alphas whose conformal quantiles the model stores besides CONFORMAL_SERVED_ALPHAS (the
    sweep's evaluation.conformal_alphas; conformal_record)."""
    mlflow.set_tracking_uri(tracking_uri)  # mlflow.pyfunc.log_model logs through the fluent API
    store = MlflowStore(tracking_uri) if store is None else store
    ckpt = Path(checkpoint_dir)
    input_shape = tuple(int(s) for s in input_shape)
    # the trial's model and the same model with temperature scaling on top are two exports of one run
    fmt = EXPORT_FORMAT if temperatures is None else EXPORT_FORMAT_TS
    existing = [
        v
        for v in store.versions_of_run(model_name, run_id)
        if (v.tags.get(TAG_EXPORT_FORMAT) == EXPORT_FORMAT_TS) == (temperatures is not None)
    ]
    if existing:
        mv = next((v for v in reversed(existing) if v.tags.get(TAG_EXPORT_FORMAT) == fmt), existing[-1])
        version = str(mv.version)
        if description is not None and description != mv.description:
            store.describe_version(model_name, version, description)
    else:
        module, summary, spec = _load_trained(ckpt)
        if tuple(spec["input_shape"]) != input_shape:
            raise ValueError(f"{ckpt}'s model takes inputs {tuple(spec['input_shape'])}, not {input_shape}")
        if temperatures is not None:
            from calib_core.export import with_temperature_on_top
            from calib_core.posthoc_on_top import TemperatureOnTopModel

            spec = with_temperature_on_top(spec, temperatures)
            module = TemperatureOnTopModel(module, list(temperatures)).eval()
        record = conformal_record(ckpt, temperatures, conformal_alphas)
        if record is not None:
            from calib_core.export import with_conformal

            spec = with_conformal(spec, record)
        # an earlier call that died between logging and registering left a complete model: reuse it
        model_id = store.completed_export(run_id, fmt) or _log_portable_model(store, run_id, module, spec, fmt)
        if description is None:
            description = default_description(summary, _read_metrics(store, run_id, ckpt), spec, run_id)
        version = store.register(
            model_name, model_id, run_id, description, tags={TAG_SOURCE_RUN: run_id, TAG_EXPORT_FORMAT: fmt}
        )
    if alias is not None:
        store.point_alias(model_name, alias, version, tags={TAG_SOURCE_RUN: run_id})
    return version

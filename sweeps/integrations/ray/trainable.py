"""The Ray Tune function trainable: one trial = one calib_core training run.

Trials never talk to MLflow: they report metrics and checkpoints to Tune, and the driver's
tracking callback is the single writer (SQLite stays safe, retries cannot duplicate runs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ray import tune

from calib_core.config import RunConfig, clip
from sweeps.config import EvaluationConfig
from sweeps.contract import (
    DEBIASED_METRICS,
    FINAL_FILE,
    GATE_DIR,
    MODEL_FILE,
    MODEL_SPEC_FILE,
    OOD_SCORES,
    OUT_OF_MEMORY,
    PREDICTIONS_FILE,
    REPORT_DIR,
    SHIFT_FILE,
    STATE_FILE,
    SUMMARY_FILE,
    TS_PREFIX,
    TS_SUMMARY_KEY,
    final_only_keys,
    is_number,
    memory_failure,
    metric_key,
)
from sweeps.integrations.ray.conformal_scores import conformal_scores
from sweeps.trial_params import describe_params, resolve_run_config

# torch and calib_core's data and trainer are imported where used: the sweep's driver imports this
# module for `train_trial` and never trains; a trial process imports them when it starts.
if TYPE_CHECKING:
    from calib_core.trainer import Trainer


def _trial_resources() -> tuple[float, float]:
    """CPUs and GPUs this trial was given (from its placement group)."""
    try:
        bundles = tune.get_context().get_trial_resources().bundles
        cpus = sum(b.get("CPU", 0.0) for b in bundles)
        gpus = sum(b.get("GPU", 0.0) for b in bundles)
        return cpus, gpus
    except Exception:  # outside Tune (direct call in tests): use what the process has
        return float(os.cpu_count() or 1), 0.0


def _device_for(gpus: float) -> str:
    """CUDA when this trial holds a GPU share and CUDA is visible, else CPU."""
    import torch

    return "cuda" if gpus > 0 and torch.cuda.is_available() else "cpu"


def _node_id() -> str:
    """The Ray node this trial ran on (recorded so cluster runs show where trials went)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return "local"


def _lead_columns(result: dict[str, Any]) -> dict[str, Any]:
    """Put the headline metrics first: Tune's status table shows the first few keys."""
    lead = [k for k in ("val_accuracy", "val_ece", "epoch") if k in result]
    return {**{k: result[k] for k in lead}, **{k: v for k, v in result.items() if k not in lead}}


def _finite(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else float("nan")) for k, v in metrics.items()}


# A failed trial's objectives: Optuna records NaN objectives as failed trials, so it never ranks.
FAILED_OBJECTIVES = {"val_ece": float("nan"), "val_accuracy": float("nan")}
# Why an out-of-memory trial is not retried (its reason ends with this).
NOT_RETRIED = "not retried, the same config needs the same memory again (use a smaller model or batch, or more memory)"


def train_trial(
    config: dict[str, Any],
    base: dict[str, Any],
    evaluation: EvaluationConfig | dict[str, Any] | None = None,
    plugins: list[str] | None = None,
    quiet: bool = False,
) -> None:
    """Run one trial (arguments: _train_trial's). A failed allocation (torch's CPU or CUDA allocator, MemoryError)
    ends it `out_of_memory` with its reason, reported as a diverged trial's ending is, and it is not retried."""
    built: list[Any] = []  # the trainer once built: its epoch count outlives the error
    try:
        _train_trial(config, base, evaluation, plugins, quiet, built)
        return
    except Exception as exc:
        oom = memory_failure(exc)
        if oom is None:
            raise
    # Out of the except block: the failed frames (and what they allocated) are released before the report.
    epoch = int(built[0].epoch) if built else 0
    built.clear()
    _release_memory()
    _report_failed(OUT_OF_MEMORY, f"{clip(oom[1], 300)}; {NOT_RETRIED}", epoch)


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _report_failed(status: str, reason: str, epoch: int) -> None:
    """The final report of a trial that ended without a result (`status`, `reason`; the driver marks its run FAILED
    with the reason). Its checkpoint holds FINAL_FILE, so a restored trial reports it again instead of running."""
    final = _lead_columns(
        {"epoch": epoch, "done": True, "status": status, "reason": reason, "node_id": _node_id(), **FAILED_OBJECTIVES}
    )
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / FINAL_FILE).write_text(json.dumps(final))
        tune.report(final, checkpoint=tune.Checkpoint.from_directory(d))


def _train_trial(
    config: dict[str, Any],
    base: dict[str, Any],
    evaluation: EvaluationConfig | dict[str, Any] | None,
    plugins: list[str] | None,
    quiet: bool,
    built: list[Any],
) -> None:
    """Run one trial: resolve its config, resume from Tune's checkpoint if any, report per epoch.

    `evaluation`: what is measured after training (a dict is validated into an EvaluationConfig).
    `plugins`: modules that register models, datasets or calibrators (imported here too: a trial
    runs in its own process). `quiet`: Ray Train's per-checkpoint INFO line off (sweeps.integrations.ray.progress).
    `built`: gets the trainer once it is built.
    """
    import torch

    from calib_core.data import load_dataset
    from calib_core.export import load_tensors
    from calib_core.trainer import make_trainer

    evaluation = EvaluationConfig.model_validate(evaluation or {})
    if quiet:
        from sweeps.integrations.ray.progress import QUIET_WORKER_LOGGERS

        for name in QUIET_WORKER_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    from calib_core.plugins import epoch_hooks, load_plugins

    load_plugins(plugins or [])  # the config's and $CALIB_PLUGINS' modules (each imported once per process)
    cpus, gpus = _trial_resources()
    run_cfg = resolve_run_config(RunConfig.model_validate(base), config)
    threads = max(1, int(cpus))
    run_cfg = run_cfg.model_copy(update={"device": _device_for(gpus), "num_threads": threads})
    torch.set_num_threads(threads)

    data = load_dataset(run_cfg.data, run_cfg.seed)
    trainer = make_trainer(run_cfg, data, run_cfg.device)
    built.append(trainer)

    resume_state, final = _readable_checkpoint(tune.get_checkpoint(), load_tensors)
    if final is not None:
        # The trial had finished before the driver went down: report, do not run again.
        tune.report(final)
        return

    last_epoch: dict[str, float] = {}
    node = _node_id()  # in every report: the driver names the trials a lost node held (node_loss.py)

    def on_epoch(report: Any) -> None:
        metrics = _finite({k: float(v) for k, v in report.metrics.items()})
        if report.epoch >= run_cfg.train.epochs:
            # The last epoch is reported by the final report (_report_final), never on its own:
            # a scheduler stops a trial whose report reaches max_t (ASHA: time_attr=epoch,
            # max_t=epochs), which would end it before its test metrics and model are reported.
            last_epoch.update(metrics)
        else:
            with tempfile.TemporaryDirectory() as d:
                torch.save(report.state(), Path(d) / STATE_FILE)
                # Measured once, after training; Tune and Optuna need the keys in every result.
                for key in final_only_keys(shift=evaluation.shift, ood=evaluation.ood != "none"):
                    metrics[key] = float("nan")
                tune.report(
                    _lead_columns({**metrics, "epoch": report.epoch, "done": False, "node_id": node}),
                    checkpoint=tune.Checkpoint.from_directory(d),
                )
        for hook in epoch_hooks():  # plugins' hooks (calib_core.plugins.on_epoch_end)
            hook(report.epoch)

    result = trainer.fit(on_epoch=on_epoch, resume_state=resume_state)
    _report_final(trainer, result, run_cfg, data, evaluation, last_epoch, title=describe_params(config))


def _read_checkpoint(directory: Path, load_tensors: Any) -> tuple[Any, dict[str, Any] | None]:
    """(training state, None), or (None, the final result) of a finished trial, from one checkpoint folder.
    Tensors and plain data only (calib_core.trainer's state): a file naming any other Python object is refused
    (UnsafeFileError), never unpickled."""
    if (directory / FINAL_FILE).is_file():
        final = json.loads((directory / FINAL_FILE).read_text())
        if not isinstance(final, dict):
            raise ValueError(f"{directory / FINAL_FILE} holds no result")
        return None, final
    return load_tensors(directory / STATE_FILE), None


def _readable_checkpoint(checkpoint: Any, load_tensors: Any) -> tuple[Any, dict[str, Any] | None]:
    """What the trial resumes from: Tune's checkpoint, or when that cannot be read (a damaged or overwritten
    file) the newest older checkpoint of the trial that can, or nothing (the trial starts again from its first
    epoch); one line says which file was unreadable and what the trial does instead. Before, the trial failed
    on every retry with the same unreadable file and ended errored."""
    if checkpoint is None:
        return None, None
    import pyarrow.fs as pafs

    fs, path = checkpoint.filesystem, checkpoint.path.rstrip("/")
    candidates = [path]
    parent, _, name = path.rpartition("/")
    try:
        older = [
            info.path
            for info in fs.get_file_info(pafs.FileSelector(parent))
            if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_")
        ]
        candidates += sorted((p for p in older if p.rpartition("/")[2] < name), reverse=True)
    except (OSError, ValueError):
        pass
    unreadable = ""
    for candidate in candidates:
        local = candidate  # where its files are read (a copy, for remote storage)
        try:
            with tune.Checkpoint(candidate, filesystem=fs).as_directory() as d, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's warnings about what a damaged file seems to hold
                local = d
                state = _read_checkpoint(Path(d), load_tensors)
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint: the next older one is tried
            if not unreadable:
                name = FINAL_FILE if FINAL_FILE in str(exc) else STATE_FILE
                why = " ".join(str(exc).replace(f"{local}/{name}", name).split()) or "no detail"
                unreadable = f"{candidate}/{name} ({type(exc).__name__}: {clip(why, 120)})"
            continue
        if unreadable:
            print(f"checkpoint unreadable: {unreadable}; resuming from {candidate.rpartition('/')[2]}", flush=True)
        return state
    print(f"checkpoint unreadable: {unreadable}; no older one readable, the trial starts again", flush=True)
    return None, None


def save_model(
    directory: str | Path,
    module: Any,
    run_config: dict[str, Any],
    input_shape: tuple[int, ...],
    preprocessing: dict[str, Any] | None = None,
) -> None:
    """The trained calibrated module as MODEL_FILE (its state_dict, tensors only) plus
    MODEL_SPEC_FILE (calib_core.export.model_spec: what rebuilds it from calib_core's registries);
    sweeps.integrations.mlflow.model_export reads them back with calib_core.export.load_calibrated_model.
    `preprocessing`: how raw inputs become the module's inputs (calib_core.preprocess.input_record), kept in the
    spec so the exported model takes raw inputs."""
    import torch

    from calib_core.export import model_spec, state_dict_for_export, with_preprocessing

    module = module.cpu().eval()
    spec = model_spec(module, run_config, input_shape)
    if preprocessing:
        spec = with_preprocessing(spec, preprocessing)
    torch.save(state_dict_for_export(module), Path(directory) / MODEL_FILE)
    (Path(directory) / MODEL_SPEC_FILE).write_text(json.dumps(spec, indent=1))


def _report_final(
    trainer: Trainer,
    result: Any,
    run_cfg: RunConfig,
    data: Any,
    evaluation: EvaluationConfig,
    last_epoch: dict[str, float] | None = None,
    title: str = "",
) -> None:
    """Last report: final val/test metrics plus the model, predictions and report files for the driver
    (`title`: the trial's label on its diagrams).

    It is also the report of the last epoch (`last_epoch`: its train loss, epoch time, lr; the
    validation metrics are the final ones), so a trial that trains all its epochs has exactly
    one report per epoch and the last one is final (done=True: Tune ends the trial on it without
    asking the scheduler).
    """
    import torch

    from calib_core.preprocess import input_record

    input_shape = tuple(data.input_shape)
    data_json = run_cfg.data.model_dump(mode="json")
    preprocessing = input_record(data, data_json)
    lineage = _lineage(data, data_json, run_cfg.seed)
    final: dict[str, Any] = {
        **{k: v for k, v in (last_epoch or {}).items() if not k.startswith("val_")},
        "epoch": int(result.epochs_run),
        "done": True,
        "status": result.status,
        "reason": result.reason or "",
        "wall_time": float(result.wall_time),
        "node_id": _node_id(),
    }
    scored = None
    temperatures: list[float] | None = None
    if result.status == "completed":
        metrics, scored, temperatures = _score(trainer, result, run_cfg, data, evaluation)
        final.update(metrics)
    else:
        final.update(FAILED_OBJECTIVES)
    for k, v in (result.calibrator_info or {}).items():
        if is_number(v):
            final[f"calibrator_{k}"] = float(v)
    with tempfile.TemporaryDirectory() as d:
        torch.save(trainer.state_dict(), Path(d) / STATE_FILE)
        export_error = None
        if scored is not None:
            try:
                save_model(d, result.model, run_cfg.model_dump(mode="json"), input_shape, preprocessing)
            except (TypeError, ValueError) as exc:  # a module calib_core.export cannot describe
                export_error = f"{type(exc).__name__}: {exc}"
                logging.getLogger(__name__).warning("the trained model is not saved for export: %s", export_error)
            # numpy's stub lets the unpacked str-keyed dict reach the keyword `allow_pickle: bool`
            np.savez_compressed(Path(d) / PREDICTIONS_FILE, **scored.arrays)  # type: ignore[arg-type]
            if scored.shift:
                (Path(d) / SHIFT_FILE).write_text(json.dumps(scored.shift))
            from sweeps.decide.gate import write_trial_record  # what the champion gate records, made here

            write_trial_record(Path(d) / GATE_DIR, data)
        summary = {
            "run_config": run_cfg.model_dump(mode="json"),
            "input_shape": list(input_shape),
            "tasks": [str(t[0]) for t in data.tasks] if getattr(data, "tasks", None) else None,
            "calibrator_info": result.calibrator_info,
            "status": result.status,
            "reason": result.reason,
            "preprocessing": preprocessing,
            "dataset": lineage,
            **({TS_SUMMARY_KEY: temperatures} if temperatures is not None else {}),
            **({"model_export_error": export_error} if export_error else {}),
        }
        (Path(d) / SUMMARY_FILE).write_text(json.dumps(summary, default=str, indent=1))
        final = _lead_columns(_finite(final))
        (Path(d) / FINAL_FILE).write_text(json.dumps(final))
        if result.status == "completed":
            _draw_report(Path(d), final, run_cfg.train.num_bins, title)
        tune.report(final, checkpoint=tune.Checkpoint.from_directory(d))


def _lineage(data: Any, data_json: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """The trial's dataset lineage (calib_core.preprocess.dataset_lineage), or None with a warning: it is a
    record, never a reason to lose the trial."""
    from calib_core.preprocess import dataset_lineage

    try:
        return dataset_lineage(data, data_json, seed)
    except Exception as exc:  # noqa: BLE001 - see above
        logging.getLogger(__name__).warning("no dataset lineage for this trial: %s", exc)
        return None


def _score(
    trainer: Trainer, result: Any, run_cfg: RunConfig, data: Any, evaluation: EvaluationConfig
) -> tuple[dict[str, float], Any, list[float] | None]:
    """A completed trial's final metrics (the trainer's val/test metrics, every metric of every split, shift and
    OOD when asked, temperature scaling on top), its scored arrays and the temperatures on top (None when off)."""
    from calib_core.evaluation import final_metrics

    metrics = {f"val_{k.removeprefix('val_')}": float(v) for k, v in result.val_metrics.items()}
    metrics.update({f"test_{k.removeprefix('test_')}": float(v) for k, v in result.test_metrics.items()})
    scored = final_metrics(
        result,
        data,
        seed=run_cfg.seed,
        debiased=DEBIASED_METRICS,
        num_bins=run_cfg.train.num_bins,
        shift=evaluation.shift,
        shift_corruptions=evaluation.shift_corruptions,
        shift_severities=evaluation.shift_severities,
        ood=evaluation.ood,
        ood_scores=OOD_SCORES,
    )
    for split, values in scored.metrics.items():
        metrics.update({metric_key(split, k): v for k, v in values.items()})
    temperatures = None
    if evaluation.temperature_on_top:
        on_top, arrays, temperatures = _temperature_on_top(trainer, result, run_cfg, data, evaluation)
        metrics.update(on_top)
        scored.arrays.update(arrays)
    sets, rows = conformal_scores(scored.arrays, evaluation, run_cfg.seed)  # after TS: both candidates' sets
    metrics.update(sets)
    scored.arrays.update(rows)
    return metrics, scored, temperatures


def _temperature_on_top(
    trainer: Trainer, result: Any, run_cfg: RunConfig, data: Any, evaluation: EvaluationConfig
) -> tuple[dict[str, float], dict[str, Any], list[float]]:
    """Temperature scaling on top of the trained model (calib_core.posthoc_on_top): its metrics as
    ts_<split>_<name>, its prediction arrays as ts_<array> (the task names stay shared), its temperatures."""
    from calib_core.posthoc_on_top import temperature_on_top_scores

    fit, metrics, arrays = temperature_on_top_scores(
        result,
        data,
        trainer.strategy.metrics,
        folds=evaluation.temperature_folds,
        seed=run_cfg.seed,
        num_bins=run_cfg.train.num_bins,
        debiased=DEBIASED_METRICS,
    )
    out = {TS_PREFIX + metric_key(split, k): float(v) for split, values in metrics.items() for k, v in values.items()}
    out[f"{TS_PREFIX}temperature"] = float(np.mean(fit.temperatures))
    return out, {TS_PREFIX + k: v for k, v in arrays.items() if k != "tasks"}, fit.temperatures


def _draw_report(ckpt: Path, final: dict[str, Any], num_bins: int, title: str) -> None:
    """The trial's report files under ckpt/REPORT_DIR/<artifact folder>/: drawn here, where torch and the
    predictions already are, so the driver only uploads them (it never imports torch for them)."""
    from sweeps.report.files import trial_report_files

    with tempfile.TemporaryDirectory() as out:
        for path, folder in trial_report_files(ckpt, Path(out), final, num_bins=num_bins, title=title):
            dest = ckpt / REPORT_DIR / (folder or ".") / Path(path).name
            dest.parent.mkdir(parents=True, exist_ok=True)
            Path(path).replace(dest)

"""The Python API: `run_sweep(config) -> SweepResult`, the same sweep as `python sweeps/launch.py`.

    from sweeps import run_sweep

    result = run_sweep("sweeps/configs/mnist1d_demo.yaml", overrides=["search.num_samples=2"], workdir="/tmp/s")
    result.champion_run_id        # the champion's MLflow run
    result.model_uri              # models:/calibrated-<dataset>/<version>: mlflow.pyfunc.load_model(...)
    result.leaderboard            # pandas.DataFrame (sweep/leaderboard.csv)
    result.selection              # the selection sentence
    result.intervals[result.champion_trial_id]["val_ece"]   # (low, high) paired-bootstrap interval

`examples/python_api.py` runs a 2-trial sweep this way. The checks, defaults and outputs are the
CLI's: the config is validated (ConfigError, one line naming the field), the environment checked
before anything is written (sweeps/startup.py: every problem in one line), the MLflow store, the Optuna study and Ray
Tune's results default to `workdir` (the current directory), and the sweep prints the same
report (`verbose=True`: Ray Tune's full output). Exceptions where the CLI has exit codes:
ConfigError (2), SweepError (1), SweepIncomplete (130: trials left unfinished, `resume=True`
continues), KeyboardInterrupt (130). `resume=True` on a sweep that already finished returns its
result as recorded in MLflow (no replicates) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calib_core.config import ConfigError, apply_overrides, build_model, read_yaml
from sweeps.config import DEFAULT_CONFIG, SweepConfig
from sweeps.config_defaults import with_defaults
from sweeps.contract import SweepError, SweepIncomplete, SweepResult

__all__ = ["ConfigError", "SweepError", "SweepIncomplete", "SweepResult", "load_result", "run_sweep"]


def run_sweep(
    config: SweepConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    cluster: bool = False,
    resume: bool = False,
    verbose: bool = False,
    workdir: str | Path | None = None,
    promote: bool = False,
) -> SweepResult:
    """Run (or resume) a sweep and return its `SweepResult` (champion, model URI, leaderboard, selection,
    intervals and replicates).

    config: a SweepConfig, a dict of the YAML's shape, a YAML file, or None for the MNIST-1D demo;
    overrides: `--set` style "dotted.key=value" strings; cluster / resume / verbose: as the CLI's flags;
    workdir: where the local defaults go (mlflow.db, optuna.db, mlartifacts, ray_results);
    promote: move `@champion` to this sweep's pick even if the champion gate would keep the current one.
    With resume=True, an override of search.num_samples above the finished count grows the sweep.
    """
    from sweeps.service import execute
    from sweeps.start_steps import SIGNALS, Startup
    from sweeps.startup import preflight

    startup = Startup()  # the steps before the first trial, timed (SweepResult.timings) and Ctrl+C honoured
    try:
        with SIGNALS.installed():
            with startup.step("config"):
                cfg = resolve(config, overrides, cluster=cluster, workdir=workdir)
            # a trial count given with resume=True may grow a finished sweep, as `--resume --num-samples N` does
            grow = resume and any(o.split("=", 1)[0].strip() == "search.num_samples" for o in overrides)
            with startup.step("checks"):
                nothing_to_do = preflight(cfg, cluster=cluster, resume=resume, grow=grow)
            if nothing_to_do:
                print(nothing_to_do)
                return load_result(cfg)
            return execute(
                cfg, cluster=cluster, resume=resume, verbose=verbose, grow=grow, promote=promote, startup=startup
            )
    except KeyboardInterrupt:
        SIGNALS.clear()  # reported (the caller's KeyboardInterrupt): a next sweep in this process starts afresh
        raise


def resolve(
    config: SweepConfig | Mapping[str, Any] | str | Path | None,
    overrides: Sequence[str] = (),
    *,
    cluster: bool = False,
    workdir: str | Path | None = None,
) -> SweepConfig:
    """The validated config with the CLI's defaults filled in (see run_sweep)."""
    if isinstance(config, SweepConfig):
        raw = config.model_dump(mode="json")
        if config.tracking.registered_model_is_default:  # left unset: a resumed sweep keeps the name it began with
            raw["tracking"].pop("registered_model", None)
    elif isinstance(config, Mapping):
        raw = dict(config)
    else:
        raw = read_yaml(DEFAULT_CONFIG if config is None else config)
    cfg = build_model(SweepConfig, apply_overrides(raw, list(overrides)))
    return with_defaults(cfg, cluster=cluster, workdir=Path(workdir) if workdir is not None else Path.cwd())


def load_result(
    sweep: str | SweepConfig,
    workdir: str | Path | None = None,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    registered_model: str | None = None,
) -> SweepResult:
    """The SweepResult of a finished sweep, read back from MLflow (its parent run, artifacts and child runs).

    sweep: the sweep's name (its stores found as the CLI finds them from `workdir`, the current directory
    by default, unless `tracking_uri` / `experiment` / `registered_model` say otherwise), or its SweepConfig.
    No download progress bars are shown.
    """
    import json
    import os
    import tempfile

    import pandas as pd

    from calib_core.redaction import redact
    from sweeps.contract import TAG_CHAMPION_RUN, TrackingStore
    from sweeps.finish import build_result
    from sweeps.integrations.mlflow.existing import started_registered_model
    from sweeps.integrations.mlflow.store import MlflowStore

    if isinstance(sweep, SweepConfig):
        cfg = sweep
    else:
        sets = [f"name={sweep}"]
        sets += [f"tracking.uri={tracking_uri}"] if tracking_uri else []
        sets += [f"tracking.experiment={experiment}"] if experiment else []
        sets += [f"tracking.registered_model={registered_model}"] if registered_model else []
        cfg = resolve(None, sets, workdir=workdir)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    assert cfg.tracking.uri
    store: TrackingStore = MlflowStore(cfg.tracking.uri)  # the one implementation; only the protocol used
    experiment_id = store.experiment_id(cfg.tracking.experiment)
    parent = store.parent_run(experiment_id, cfg.name) if experiment_id is not None else None
    if parent is None or TAG_CHAMPION_RUN not in parent.data.tags:
        raise SweepError(f"sweep {cfg.name!r} has no selected champion in {redact(cfg.tracking.uri)}")
    assert experiment_id is not None  # the parent run was found in it
    champion_run = parent.data.tags[TAG_CHAMPION_RUN]
    model = started_registered_model(cfg, parent)  # an older sweep's champion: under the name it began with
    versions = store.versions_of_run(model, champion_run)
    if not versions:
        raise SweepError(f"sweep {cfg.name!r}: its champion run {champion_run} is not registered as {model}")
    version = str(max(int(v.version) for v in versions))
    champion_params = store.get_run(champion_run).data.params
    with tempfile.TemporaryDirectory() as d:
        board = pd.read_csv(store.download_artifact(parent.info.run_id, "sweep/leaderboard.csv", d))
        sel = json.loads(Path(store.download_artifact(parent.info.run_id, "sweep/selection.json", d)).read_text())
    intervals = _recorded_intervals(store.trial_runs(experiment_id, cfg.name))
    if model != cfg.tracking.registered_model:  # the result names the model the champion is registered as
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"registered_model": model})})
    return build_result(
        cfg,
        champion=(champion_run, sel["champion_trial"], sel["label"]),
        version=version,
        board=board,
        why=sel["why"],
        intervals=intervals,
        confidence=float(sel["confidence"]),
        parent_id=parent.info.run_id,
        experiment_id=experiment_id,
        best_config={k.removeprefix("search."): v for k, v in champion_params.items() if k.startswith("search.")},
        errors=[
            {"trial_id": str(r["trial_id"]), "label": str(r["label"]), "status": str(r["status"]), "reason": ""}
            for r in board.to_dict("records")
            if r.get("status") not in ("completed", "stopped_early")
        ],
    )


def _recorded_intervals(runs: list[Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """trial -> metric -> (low, high), as the sweep logged them on its trial runs (`<metric>_ci_low/_high`)."""
    from sweeps.contract import TAG_TRIAL

    intervals: dict[str, dict[str, tuple[float, float]]] = {}
    for run in runs:
        m = run.data.metrics
        ci = {
            k.removesuffix("_ci_low"): (m[k], m[k.removesuffix("_low") + "_high"])
            for k in m
            if k.endswith("_ci_low") and k.removesuffix("_low") + "_high" in m
        }
        if ci:
            intervals[run.data.tags.get(TAG_TRIAL, "")] = ci
    return intervals

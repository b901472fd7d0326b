"""The champion registered and gated (issue #24 item 2): its model logged and registered (register_champion),
what it saw recorded, and `@champion` moved to the new version only if it holds up against the current one (the
decision: sweeps/decide/gate.py).

At registration every version's run gets two small artifacts under `gate/`: `rows.npz` (hashes of the raw rows
of its training and validation splits: what it trained and was selected on) and `data.json` (dataset, its task:
input shape, class count and names, a table's input columns; standardisation). The gate reads them for the current
champion; the new sweep's test rows are regenerated in the driver from the champion trial's run config (the
trial's own split, checked against its stored labels). Outcomes, one line each: the alias moves; or the new version
gets `@challenger` and the champion stays (significantly worse, another task, or nothing comparable, with the
reason); `promote=True` moves it anyway. A pick no better than the majority class (sweeps/decide/majority.py) gets
`@no-better-than-majority` only, whatever the gate or `promote` would say.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sweeps.config import SweepConfig
from sweeps.contract import (
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    GATE_DATA_FILE,
    GATE_DIR,
    GATE_ROWS_FILE,
    NO_BETTER_ALIAS,
    PREDICTIONS_FILE,
    SUMMARY_FILE,
    TAG_GATE,
    TAG_SOURCE_RUN,
    TS_PREFIX,
    TS_SUMMARY_KEY,
)
from sweeps.decide.gate import (
    GateDecision,
    compare,
    held_out_mask,
    model_inputs,
    raw_inputs,
    row_hashes,
    seen_record,
    task_difference,
    task_record,
    write_seen_record,
)
from sweeps.decide.majority import majority_rate, no_better_than_majority
from sweeps.decide.selection import POST_TS, TrialRecord
from sweeps.integrations.mlflow.store import MlflowStore


def _splits(run_config: dict[str, Any]) -> Any:
    """The trial's data splits, regenerated as the trial made them (calib_core.data.load_dataset)."""
    from calib_core.config import RunConfig
    from calib_core.data import load_dataset

    cfg = RunConfig.model_validate(run_config)
    return load_dataset(cfg.data, cfg.seed)


def record_rows(
    store: MlflowStore, run_id: str, run_config: dict[str, Any], data: Any = None, ckpt: Path | None = None
) -> dict[str, Any] | None:
    """Log `gate/rows.npz` and `gate/data.json` on a champion's run (once); its data description, None if unknown.
    `ckpt`: the trial's final checkpoint, whose `gate/` files (written by the trial, which had its data loaded:
    sweeps.integrations.ray.trainable) are logged as they are; without them the splits are regenerated here
    (`data`: the run's splits when the caller has them already)."""
    if ckpt is not None and all((ckpt / GATE_DIR / f).is_file() for f in (GATE_ROWS_FILE, GATE_DATA_FILE)):
        recorded = json.loads((ckpt / GATE_DIR / GATE_DATA_FILE).read_text())
        files = [(ckpt / GATE_DIR / GATE_ROWS_FILE, GATE_DIR), (ckpt / GATE_DIR / GATE_DATA_FILE, GATE_DIR)]
        if f"{GATE_DIR}/{GATE_ROWS_FILE}" not in {a.path for a in store.client.list_artifacts(run_id, GATE_DIR)}:
            store.log_artifacts(run_id, files)
        return recorded
    record = seen_record(_splits(run_config) if data is None else data)
    if record is None:
        return None
    seen, desc = record
    logged = {a.path for a in store.client.list_artifacts(run_id, GATE_DIR)}
    if f"{GATE_DIR}/{GATE_ROWS_FILE}" not in logged:
        with tempfile.TemporaryDirectory(prefix="calib-gate-") as tmp:
            write_seen_record(Path(tmp), seen, desc)
            store.log_artifacts(
                run_id, [(Path(tmp) / GATE_ROWS_FILE, GATE_DIR), (Path(tmp) / GATE_DATA_FILE, GATE_DIR)]
            )
    return desc


def _champion_record(store: MlflowStore, run_id: str) -> tuple[np.ndarray, dict[str, Any]] | None:
    """The current champion's seen-row hashes and data description, or None when it has none."""
    with tempfile.TemporaryDirectory(prefix="calib-gate-") as tmp:
        try:
            rows = store.download_artifact(run_id, f"{GATE_DIR}/{GATE_ROWS_FILE}", tmp)
            desc = store.download_artifact(run_id, f"{GATE_DIR}/{GATE_DATA_FILE}", tmp)
        except Exception:  # MlflowException or OSError: the artifact is not there
            return None
        with np.load(rows, allow_pickle=False) as z:
            seen = z["seen"].copy()
        return seen, json.loads(Path(desc).read_text())


def decide(
    store: MlflowStore,
    model_name: str,
    current_version: str,
    new_run_config: dict[str, Any],
    new_predictions: str | Path,
    *,
    level: float,
    num_bins: int,
    data: Any = None,
    prefix: str = "",
) -> GateDecision:
    """Compare the new champion (its trial's stored test predictions; `prefix`: those of its "+ TS" candidate) with
    the current one (loaded from the registry) on the new test rows the current one never saw (`data`: the new
    run's splits, if loaded)."""
    current = store.client.get_model_version(model_name, current_version)
    record = _champion_record(store, current.run_id) if current.run_id else None
    if record is None:
        return GateDecision(False, f"version {current_version} has no record of its training rows ({GATE_DIR}/)")
    seen, old_desc = record
    data = _splits(new_run_config) if data is None else data
    if data.tasks is not None:
        return GateDecision(False, "multi-task models are not compared by the gate")
    other_task = task_difference(task_record(data), old_desc)
    if other_task:
        return GateDecision(False, other_task)
    raw = raw_inputs(data.test.x.numpy(), data.stats)
    old_x = model_inputs(raw, old_desc["stats"]) if raw is not None else None
    if raw is None or old_x is None:
        return GateDecision(False, "the two models' input standardisations cannot be mapped onto each other")
    with np.load(new_predictions, allow_pickle=False) as z:
        new_probs, stored_labels = z[f"{prefix}test_probs"].astype(np.float64), z[f"{prefix}test_labels"]
    labels = data.test.y.numpy()
    if len(stored_labels) != len(labels) or not np.array_equal(stored_labels, labels):
        return GateDecision(False, "the new champion's test split could not be regenerated in the driver")
    keep = held_out_mask(row_hashes(raw), seen)
    import mlflow.pyfunc

    old_model = mlflow.pyfunc.load_model(f"models:/{model_name}/{current_version}")
    # model inputs (standardised with the old model's statistics): a version that takes raw inputs by default is
    # asked for the standardised path; one from before raw inputs ignores the param. Called on the python model
    # itself, since a table's or images' raw-input signature would refuse a standardised array.
    old_probs = np.asarray(
        old_model.unwrap_python_model().predict(None, old_x[keep], params={"inputs": "standardised"}),
        dtype=np.float64,
    )
    return compare(new_probs[keep], old_probs, labels[keep], level=level, num_bins=num_bins)


def move_alias(
    store: MlflowStore,
    model_name: str,
    version: str,
    run_id: str,
    run_config: dict[str, Any],
    predictions: str | Path,
    *,
    level: float,
    num_bins: int,
    promote: bool = False,
    prefix: str = "",
    no_better: str | None = None,
    ckpt: Path | None = None,
) -> tuple[str, str]:
    """Point `@champion` (or `@challenger`) at the new version through the gate; (alias, one line saying why).
    `no_better`: why the new version is no better than the majority class (majority_reason): it gets
    `@no-better-than-majority` instead, and `@champion` stays where it is. `ckpt`: the trial's final checkpoint
    (its gate record, record_rows). The splits are regenerated in the driver only when something needs them: a
    comparison with the current champion, or a checkpoint without the record."""
    data = None if ckpt is not None and (ckpt / GATE_DIR / GATE_ROWS_FILE).is_file() else _splits(run_config)
    record_rows(store, run_id, run_config, data, ckpt)
    current = store.alias_version(model_name, CHAMPION_ALIAS)
    if no_better and current != version:
        alias = NO_BETTER_ALIAS
        stays = f"version {current} stays @champion" if current else "no version is @champion"
        line = f"Champion gate: version {version} is @{alias}, not @champion ({stays}): {no_better}"
    elif current is None or current == version:
        alias, line = CHAMPION_ALIAS, ""
    elif promote:
        alias, line = CHAMPION_ALIAS, f"Champion gate: --promote: version {version} replaces version {current}"
    else:
        d = decide(
            store,
            model_name,
            current,
            run_config,
            predictions,
            level=level,
            num_bins=num_bins,
            data=data,  # None: regenerated there
            prefix=prefix,
        )
        if d.promote:
            alias, line = CHAMPION_ALIAS, f"Champion gate: version {version} replaces version {current}: {d.reason}"
        else:
            alias = CHALLENGER_ALIAS
            line = (
                f"Champion gate: version {current} stays @champion, version {version} is @challenger: {d.reason} "
                "(--promote moves it)"
            )
    store.point_alias(model_name, alias, version, tags={TAG_SOURCE_RUN: run_id})
    if line:
        store.client.set_model_version_tag(model_name, version, TAG_GATE, line[:5000])
    return alias, line


def majority_reason(predictions: str | Path, intervals: dict[str, tuple[float, float]]) -> str | None:
    """Why the champion is no better than the majority class (sweeps/decide/majority.py), from its accuracy
    `intervals` by split and the labels its trial stored; None when it is better, or for multi-task models."""
    with np.load(predictions, allow_pickle=False) as z:
        if "tasks" in z.files:
            return None  # per-task labels: the mean accuracy over tasks has no single majority rate
        rates = {s: majority_rate(z[f"{s}_labels"]) for s in ("val", "test") if f"{s}_labels" in z.files}
    return no_better_than_majority(intervals, rates)


def register_champion(
    cfg: SweepConfig,
    store: MlflowStore,
    chosen: TrialRecord,
    promote: bool,
    accuracy_intervals: dict[str, tuple[float, float]] | None = None,
) -> tuple[str, str, str]:
    """The champion's portable model logged on its run and registered, then `@champion` moved through the
    champion gate (or `@challenger` set; `@no-better-than-majority` when its accuracy interval by split,
    `accuracy_intervals`, reaches that split's majority-class rate); (version, its alias, the gate's line or "")."""
    from sweeps.integrations.mlflow.model_export import log_and_register

    assert cfg.tracking.uri and chosen.run_id is not None  # the champion's trial logged an MLflow run
    model = cfg.tracking.registered_model
    with chosen.checkpoint.as_directory() as d:
        summary = json.loads((Path(d) / SUMMARY_FILE).read_text())
        # idempotent (a version registered from the run is reused), so retried through an outage
        # a "+ TS" candidate: the trial's model with its temperatures on top (fitted on all validation rows)
        temperatures = summary.get(TS_SUMMARY_KEY) if chosen.post == POST_TS else None
        version = str(
            store.call(
                log_and_register,
                chosen.run_id,
                d,
                tuple(summary["input_shape"]),
                model,
                cfg.tracking.uri,
                alias=None,
                temperatures=temperatures,
                store=store,
                conformal_alphas=cfg.evaluation.conformal_alphas,  # its sets' quantiles, with the served alphas
            )
        )
        alias, line = store.call(
            move_alias,
            store,
            model,
            version,
            chosen.run_id,
            summary["run_config"],
            Path(d) / PREDICTIONS_FILE,
            level=cfg.selection.confidence,
            num_bins=cfg.run.train.num_bins,
            promote=promote,
            prefix=TS_PREFIX if temperatures is not None else "",
            no_better=majority_reason(Path(d) / PREDICTIONS_FILE, accuracy_intervals or {}),
            ckpt=Path(d),
        )
    return version, alias, line

"""What the sweep prints and writes in words: the opening lines, the end summary (leaderboard, rank agreement,
selection, registered model, the commands that open MLflow and the Optuna dashboard) and the parent run's
description; links into the MLflow UI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from calib_core.redaction import redact
from sweeps.config import SweepConfig
from sweeps.contract import (
    CHAMPION_ALIAS,
    MEMORY,
)
from sweeps.decide.selection import TrialRecord
from sweeps.report.files import format_leaderboard


def experiment_page(experiment_id: str) -> str:
    """The experiment's page in the MLflow UI, relative to its root, in the classic ML view: MLflow 3.17 opens
    experiments in its GenAI view unless the URL asks (`workflowType`; the experiment tag alone is not read)."""
    return f"#/experiments/{experiment_id}?workflowType=machine_learning"


def run_link(experiment_id: str, run_id: str, text: str) -> str:
    """A Markdown link to a run, relative to the MLflow UI that shows it (run notes are Markdown)."""
    return f"[{text}](#/experiments/{experiment_id}/runs/{run_id})"


def rank_summary(ranks: Any) -> str:
    """One line: the pair of metrics whose rankings of the candidates agree least, and over how many candidates
    (the full matrix with --verbose)."""
    names = list(ranks.columns)
    n = ranks.attrs.get("candidates", 0)
    pairs = [(ranks.iloc[i, j], names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    pairs = [p for p in pairs if p[0] == p[0]]  # NaN where a metric is constant over the candidates
    if not pairs and n < 3:
        return f"Rank agreement between metrics: too few candidates to rank ({n}; 3 needed)"
    if not pairs:
        return f"Rank agreement between metrics: no two metrics vary over the {n} candidates"
    rho, a, b = min(pairs)
    return (
        f"Rank agreement between metrics (Spearman over {n} candidates): lowest {a} vs {b} {rho:+.2f} "
        "(the metrics can order calibrators differently; --verbose prints the matrix)"
    )


def print_summary(
    board: Any,
    ranks: Any,
    why: str,
    cfg: SweepConfig,
    version: str,
    alias: str,
    experiment_id: str,
    verbose: bool = False,
) -> None:
    level = f"{100 * cfg.selection.confidence:.0f} %"
    print(
        f"\nLeaderboard (validation decides; test for reference; [{level} bootstrap CI]; "
        "tied = not significantly worse than the champion):"
    )
    print(format_leaderboard(board))
    if verbose:
        print(f"\nRank agreement between metrics over {ranks.attrs.get('candidates', 0)} candidates (Spearman):")
        print(ranks.to_string(float_format=lambda v: f"{v:+.2f}"))
    else:
        print(f"\n{rank_summary(ranks)}")
    print(f"\nSelection: {why}")
    print(f"Registered: models:/{cfg.tracking.registered_model}@{alias} (version {version})")
    uri = cfg.tracking.uri or ""
    page = experiment_page(experiment_id)
    if uri.startswith("sqlite:"):
        ui = f"{tool('mlflow')} ui --backend-store-uri {redact(uri)}"
        print(f"Compare runs: {ui}   (then open http://127.0.0.1:5000/{page})")
    else:
        print(f"Compare runs: {redact(uri).rstrip('/')}/{page}")
    study = cfg.search.storage or MEMORY
    if study != MEMORY:
        print(f"Optuna study: {tool('optuna-dashboard')} {redact(study)}   (then open http://127.0.0.1:8080)")


def sweep_note(
    cfg: SweepConfig,
    experiment_id: str = "",
    chosen: TrialRecord | None = None,
    why: str = "",
    version: str = "",
    alias: str = CHAMPION_ALIAS,
    gate: str = "",
) -> str:
    """The parent run's description (Markdown): what the sweep is; once selected, the champion and why."""
    s, run = cfg.search, cfg.run
    goal = "validation accuracy (max) and validation ECE (min)" if s.objective == "multi" else f"{s.metric} ({s.mode})"
    lines = [
        f"Sweep **{cfg.name}**: {s.num_samples} trials of one-go calibrated training, {run.model.name} on "
        f"{run.data.name} ({run.train.epochs} epochs each). Optuna's TPE sampler (seed {s.seed}) searches the "
        f"calibrator ({', '.join(f'`{c}`' for c in s.calibrators)}) and its learning rate "
        f"({s.calibrator_lr.low:g} to {s.calibrator_lr.high:g}, log scale) for {goal}; the Optuna study "
        f"`{cfg.name}` is in `{redact(s.storage or MEMORY)}`.",
        f"The champion is chosen on validation metrics only (rule `{cfg.selection.rule}`); each child run is "
        "one trial.",
    ]
    if chosen is not None:
        link = run_link(experiment_id, chosen.run_id, chosen.label) if chosen.run_id else chosen.label
        lines.append(
            f"**Champion:** {link} (run `{chosen.run_id}`, trial `{chosen.trial_id}`), registered as "
            f"`models:/{cfg.tracking.registered_model}@{alias}` (version {version})."
        )
        lines.append(f"**Selection:** {why}")
        study, page = cfg.search.storage or MEMORY, experiment_page(experiment_id)
        if study != MEMORY:
            lines.append(
                f"**Optuna study** `{cfg.name}`: `optuna-dashboard {redact(study)}` (each study trial carries its "
                "MLflow run id, `mlflow_run_id`; the study names the champion, `champion_trial_number`). "
                f"All runs of this experiment, classic view: [{page}]({page})."
            )
        if gate:
            lines.append(f"**{gate.split(':', 1)[0]}:**{gate.split(':', 1)[1]}")
    return "\n\n".join(lines)


def tool(name: str) -> str:
    """How to call a console script installed beside this Python (e.g. .venv/bin/mlflow from the checkout)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def references_line(cfg: SweepConfig) -> str:
    """What the sweep compares against besides what Optuna samples (the reference arms and TS on top)."""
    arms = cfg.search.reference_arms()[: cfg.search.num_samples]
    names = {"ce_es": f"CE with early stopping (patience {cfg.search.reference_patience})", "none": "plain CE"}
    said = ", ".join(names.get(a, a.replace("_", " ")) for a in arms)
    first = (
        f"References: {said} ({'the first trial' if len(arms) == 1 else f'the first {len(arms)} trials'})"
        if arms
        else "References: no reference arm"
    )
    ts = (
        f"temperature scaling on top of every completed trial ({cfg.evaluation.temperature_folds}-fold cross-fitted on "
        "validation), each a candidate of its own"
        if cfg.evaluation.temperature_on_top
        else "no temperature scaling on top"
    )
    return f"{first}; {ts}"


def intro(cfg: SweepConfig, exp_path: str, parent_id: str, resumed: bool) -> str:
    """What runs and where everything goes, before the trials start."""
    s, r, run = cfg.search, cfg.resources, cfg.run
    if s.objective == "multi":
        goal = "val accuracy (max) and val ECE (min)"
    else:
        goal = f"{s.metric} ({s.mode})" + (" with ASHA early stopping" if s.scheduler == "asha" else "")
    lr = f"{s.calibrator_lr.low:.0e}..{s.calibrator_lr.high:.0e}"
    extra = "".join(f", {k}" for k in s.params)
    study = s.storage or MEMORY
    return "\n".join(
        [
            f"{'Resuming' if resumed else 'Sweep'} {cfg.name!r}: {s.num_samples} trials "
            f"({min(r.max_concurrent, s.num_samples)} "
            f"at a time) of {run.model.name} on {run.data.name}, {run.train.epochs} epochs each",
            f"Optuna TPE (seed {s.seed}) searches calibrator [{', '.join(s.sampled_calibrators())}], calibrator lr "
            f"{lr}{extra}; objectives: {goal}",
            references_line(cfg),
            f"Optuna study: {cfg.name!r} in {redact(study) if study != MEMORY else 'memory (Ray Tune state only)'}",
            f"MLflow: experiment {cfg.tracking.experiment!r}, parent run {parent_id} in "
            f"{redact(cfg.tracking.uri or '')}; the champion registers as {cfg.tracking.registered_model!r}",
            f"Ray Tune results and checkpoints: {exp_path}",
        ]
    )

"""After the trials: the trials as selection sees them, their paired bootstrap replicates, the report files
and the HTML report on the parent run."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from calib_core.redaction import redact
from sweeps.config import SweepConfig
from sweeps.contract import (
    MULTI_OBJECTIVE,
    OUT_OF_MEMORY,
    PREDICTIONS_FILE,
    SPLITS,
    TAG_CHAMPION_CANDIDATE,
    TAG_CHAMPION_RUN,
    TAG_CHAMPION_TRIAL,
    TAG_REASON,
    TAG_SELECTION_RULE,
    TS_PREFIX,
    SweepResult,
    TrackingStore,
    is_number,
    memory_failure,
)
from sweeps.decide.conformal import conformal_replicates, load_rows
from sweeps.decide.selection import POST_TS, Choice, TrialRecord, on_top_candidates
from sweeps.decide.uncertainty import (
    FULL_DETAIL_TRIALS,
    Replicates,
    compute_replicates,
    core_metrics,
    detail_ids,
    load_predictions,
)
from sweeps.integrations.mlflow.store import MAX_TAG_CHARS
from sweeps.integrations.mlflow.sweep_runs import log_intervals
from sweeps.integrations.optuna.study import MEMORY, load_study
from sweeps.report.files import BOARD_SHOWN, SWEEP_FOLDER, board_order, sweep_report_files
from sweeps.report.summary import tool
from sweeps.trial_params import describe_params


def trial_records(
    results: Any, store: TrackingStore, experiment_id: str, sweep: str, runs: list[Any] | None = None
) -> list[TrialRecord]:
    """Every trial Tune knows, as selection sees it, with its MLflow run (`runs`: the trial runs already read)."""
    records = []
    by_id = store.trial_runs_by_id(experiment_id, sweep, runs)  # one query, not one per trial (1,000 trials: seconds)
    for res in results:
        m = dict(res.metrics or {})
        tid = m.get("trial_id") or (res.path and Path(res.path).name.split("_")[1])
        run = by_id.get(str(tid)) if tid else None
        errored = OUT_OF_MEMORY if memory_failure(res.error) else "errored"  # a worker the memory monitor killed
        status = m.get("status") or (errored if res.error else "stopped")
        # NaN stays: selection and the leaderboard see a diverged trial's metric as NaN
        splits = tuple(f"{p}{s}_" for s in SPLITS for p in ("", TS_PREFIX))
        metrics = {k: float(v) for k, v in m.items() if is_number(v) and k.startswith(splits)}
        records.append(
            TrialRecord(
                trial_id=str(tid),
                label=describe_params(res.config or {}),
                status=status,
                metrics=metrics,
                params=dict(res.config or {}),
                run_id=run.info.run_id if run else None,
                checkpoint=res.checkpoint,
                reason=str(m.get("reason") or (run.data.tags.get(TAG_REASON) if run else None) or res.error or "")
                or None,
            )
        )
    return records


def candidates(records: list[TrialRecord], metric: str = "val_ece") -> list[TrialRecord]:
    """What selection chooses from: every trial as trained, then every completed trial + TS (when measured, and
    when its selection `metric` is: shift and OOD metrics are measured for the trained model only)."""
    on_top = [r for r in on_top_candidates(records, TS_PREFIX) if metric in r.metrics]
    return [*(_trained(r) for r in records), *on_top]


def _trained(rec: TrialRecord) -> TrialRecord:
    """The trial as trained: its own metrics only (the + TS ones belong to its other candidate)."""
    return replace(rec, metrics={k: v for k, v in rec.metrics.items() if not k.startswith(TS_PREFIX)})


def sweep_replicates(
    records: list[TrialRecord], cfg: SweepConfig, extra: frozenset[str] = frozenset(), *, choice_only: bool = False
) -> Replicates:
    """Paired bootstrap replicates of every completed trial, from the predictions in its final checkpoint: the
    metrics selection reads for all of them, every metric for the trials worth a closer look (all of them in a
    sweep of up to FULL_DETAIL_TRIALS; beyond, detail_ids and `extra`). The same resamples either way, so
    selection's answer does not depend on the split. `choice_only`: what the selection rule reads only
    (core_metrics, and the conformal means when it reads them: choice_reads_sets); complete_replicates adds the
    rest once the champion is registered."""
    with_sets = not choice_only or choice_reads_sets(cfg)
    predictions, sets = _inputs(records, with_sets)
    settings = _settings(cfg)
    if choice_only:
        reps = compute_replicates(predictions, names=core_metrics(cfg.selection.metric), **settings)
    elif len(predictions) <= FULL_DETAIL_TRIALS:
        reps = compute_replicates(predictions, **settings)
    else:
        reps = compute_replicates(predictions, names=core_metrics(cfg.selection.metric), **settings)
        detail = (detail_ids(reps.points) | set(extra)) & set(predictions)
        reps.merge(compute_replicates({t: predictions[t] for t in sorted(detail)}, **settings))
    if with_sets:
        reps.merge(_set_replicates(predictions, sets, cfg))
    return reps


def choice_replicates(records: list[TrialRecord], cfg: SweepConfig) -> Replicates:
    """What the choice and the lines printed with it read, before the champion is registered: sweep_replicates with
    `choice_only` for every candidate when the rule reads replicates; otherwise (the rule decides on point estimates)
    for the champion, the most accurate candidate and the leaderboard rows a terminal shows only, the others' left
    to complete_replicates (at 1,000 trials: 17 candidates' instead of 2,000)."""
    from sweeps.decide.selection import RULES, choose

    if RULES[cfg.selection.rule].needs_replicates:
        return sweep_replicates(records, cfg, choice_only=True)
    first = choose(records, cfg.selection)  # the same champion as with replicates: the rule does not read them
    ids = {r.trial_id for r in board_order(records)[:BOARD_SHOWN]}
    ids |= {first.champion.trial_id, first.most_accurate.trial_id}
    return sweep_replicates([r for r in records if r.trial_id in ids], cfg, choice_only=True)


def choice_reads_sets(cfg: SweepConfig) -> bool:
    """Whether the selection rule reads conformal means (a rule with a sets method among its settings, or a
    conformal selection.metric)."""
    from sweeps.decide.selection import RULES

    return "sets_method" in RULES[cfg.selection.rule].settings or cfg.selection.metric.startswith("val_cp_")


def _inputs(records: list[TrialRecord], with_sets: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(load_predictions, load_rows when `with_sets`) of every completed candidate, by trial id: one read of its
    checkpoint."""
    predictions, sets = {}, {}
    for rec in records:
        if rec.ok and rec.checkpoint is not None:
            with rec.checkpoint.as_directory() as d:
                prefix = TS_PREFIX if rec.post == POST_TS else ""
                predictions[rec.trial_id] = load_predictions(Path(d) / PREDICTIONS_FILE, prefix)
                if with_sets:
                    sets[rec.trial_id] = load_rows(Path(d) / PREDICTIONS_FILE, prefix)  # conformal sets' rows
    return predictions, sets


def _settings(cfg: SweepConfig) -> dict[str, Any]:
    return {
        "num_bins": cfg.run.train.num_bins,
        "num_resamples": cfg.selection.num_resamples,
        "level": cfg.selection.confidence,
        "seed": cfg.search.seed,
    }


def _set_replicates(predictions: dict[str, Any], sets: dict[str, Any], cfg: SweepConfig) -> Replicates:
    """The conformal means' replicates of every candidate, from its rows (`sets`, load_rows by trial id)."""
    settings = _settings(cfg)
    # a set's size lies in [0, K]: K of each candidate's single-task predictions (multi-task ones measure no sets)
    classes = {t: int(p["val"][0][1].shape[1]) for t, p in predictions.items() if len(p["val"]) == 1}
    return conformal_replicates(sets, num_classes=classes, **{k: v for k, v in settings.items() if k != "num_bins"})


def add_detail(reps: Replicates, records: list[TrialRecord], cfg: SweepConfig, trial_id: str) -> None:
    """Every metric's replicates for one more trial (the champion, when detail_ids left it out)."""
    from calib_core.metrics import METRIC_NAMES

    if all(reps.has(trial_id, f"val_{m}") for m in METRIC_NAMES):
        return
    rec = next(r for r in records if r.trial_id == trial_id)
    reps.merge(sweep_replicates([rec], cfg))


def complete_replicates(reps: Replicates, records: list[TrialRecord], cfg: SweepConfig, champion_id: str) -> None:
    """What sweep_replicates with `choice_only` (or choice_replicates) left out, merged into `reps` on the same
    resamples: the candidates choice_replicates left out, as sweep_replicates with `choice_only` gives them; every
    other metric for every candidate in a sweep of up to FULL_DETAIL_TRIALS, beyond for detail_ids and the champion;
    the conformal means when the rule did not read them (what sweep_replicates and add_detail give, value for
    value, trials in the same order)."""
    from calib_core.metrics import METRIC_NAMES

    core = core_metrics(cfg.selection.metric)
    rest = tuple(m for m in METRIC_NAMES if m not in core)
    sets_read = choice_reads_sets(cfg)
    missing = {r.trial_id for r in records if r.ok and r.checkpoint is not None and r.trial_id not in reps.values}
    predictions, sets = _inputs(records, not sets_read or bool(missing))
    left = [t for t in predictions if t in missing]  # the candidates choice_replicates did not compute, in order
    if left:
        reps.merge(compute_replicates({t: predictions[t] for t in left}, names=core, **_settings(cfg)))
        if sets_read:
            reps.merge(_set_replicates({t: predictions[t] for t in left}, {t: sets[t] for t in left}, cfg))
        _in_trial_order(reps, list(predictions))
    with_sets = not sets_read
    ids = set(predictions)
    if len(ids) > FULL_DETAIL_TRIALS:
        ids = (detail_ids(reps.points) | {champion_id}) & ids
    reps.merge(compute_replicates({t: predictions[t] for t in sorted(ids)}, names=rest, **_settings(cfg)))
    if with_sets:
        reps.merge(_set_replicates(predictions, sets, cfg))
    if len(ids) == len(predictions):  # beyond FULL_DETAIL_TRIALS the keys were merged in this order before too
        _in_metric_order(reps, METRIC_NAMES)


def _in_trial_order(reps: Replicates, order: list[str]) -> None:
    """Each table of `reps` keyed by trial in `order` (the candidates' order, as one computation gives it)."""
    for attr in ("values", "points", "nulls", "bounds", "groups"):
        table, known = getattr(reps, attr), set(order)
        setattr(
            reps, attr, {t: table[t] for t in order if t in table} | {t: v for t, v in table.items() if t not in known}
        )


def _in_metric_order(reps: Replicates, names: tuple[str, ...]) -> None:
    """Each trial's keys in the order one computation of every metric gives them: by split, a multi-task trial's
    per-task keys before their means, metrics in `names`' order, then the conformal means as merged
    (selection.json and SweepResult.intervals list them as before)."""
    by_length = sorted(names, key=len, reverse=True)  # classwise_ece before ece

    def parsed(key: str) -> tuple[int, str | None, str] | None:
        """(split's index, task or None for a mean, metric) of a metric's key; None for a conformal mean."""
        split, _, rest = key.partition("_")
        m = next((n for n in by_length if rest == n or rest.endswith(f"_{n}")), None)
        if split not in SPLITS or m is None or rest.startswith("cp_"):
            return None
        return SPLITS.index(split), rest[: -len(m) - 1] or None, m

    for attr in ("values", "points", "nulls", "bounds"):
        table = getattr(reps, attr)
        for tid, d in table.items():
            keys = {k: parsed(k) for k in d}
            tasks = list(dict.fromkeys(p[1] for p in keys.values() if p is not None and p[1] is not None))
            rank = {
                k: (1, 0, 0, i)
                if p is None
                else (0, p[0], tasks.index(p[1]) if p[1] else len(tasks), names.index(p[2]))
                for i, (k, p) in enumerate(keys.items())
            }
            table[tid] = {k: d[k] for k in sorted(d, key=rank.__getitem__)}


def log_selection(
    store: TrackingStore,
    parent_id: str,
    records: list[TrialRecord],
    choice: Choice,
    reps: Replicates,
    cfg: SweepConfig,
) -> Any:
    """The sweep's report files, the trials' intervals and the champion's tags and metrics on the parent run."""
    chosen, why = choice.champion, choice.sentence
    with tempfile.TemporaryDirectory() as d:
        board, ranks, files = sweep_report_files(Path(d), records, choice, reps, cfg)
        store.log_artifacts(parent_id, files)
    log_intervals(store, records, reps)
    tags = {TAG_CHAMPION_TRIAL: chosen.trial, TAG_CHAMPION_CANDIDATE: chosen.trial_id}
    if chosen.run_id:
        tags[TAG_CHAMPION_RUN] = chosen.run_id
    tags[TAG_SELECTION_RULE] = why[:MAX_TAG_CHARS]
    store.set_tags(parent_id, tags)
    store.log_metrics(parent_id, {f"champion_{k}": v for k, v in chosen.metrics.items()})
    return board, ranks


def report_summary(records: list[TrialRecord], cfg: SweepConfig) -> str:
    """The report's first line: trials (not the "+ TS" candidates records also hold), model, data, search, rule."""
    s, run = cfg.search, cfg.run
    trials = [r for r in records if not r.post]
    derived = f"; {len(records)} candidates with those on top" if len(records) > len(trials) else ""
    return (
        f"{len(trials)} trials ({sum(r.ok for r in trials)} completed{derived}) of {run.model.name} on "
        f"{run.data.name}, {run.train.epochs} epochs each; Optuna TPE (seed {s.seed}) over calibrator and calibrator "
        f"lr; rule {cfg.selection.rule}."
    )


def write_report(
    cfg: SweepConfig,
    store: TrackingStore,
    parent_id: str,
    experiment_id: str,
    exp_path: str,
    records: list[TrialRecord],
    chosen: TrialRecord,
    why: str,
    gate: str,
    reps: Replicates,
    board: Any,
) -> str | None:
    """The sweep's HTML report (sweeps/report/html.py), logged on the parent run as sweep/report.html and written
    into Ray Tune's experiment folder when that is local; the local path or None."""
    from sweeps.integrations.optuna.study import param_importances
    from sweeps.report.conformal import conformal_section
    from sweeps.report.files import pareto_plot, pyplot
    from sweeps.report.html import REPORT_FILE, render_report

    ok = [r for r in records if r.ok]
    most_accurate = max(ok, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))
    study = cfg.search.storage or MEMORY
    objectives = [m for m, _ in MULTI_OBJECTIVE] if cfg.search.objective == "multi" else [cfg.search.metric]
    importances, note = param_importances(study, cfg.name, objectives, cfg.search.storage_outage_timeout_s)
    links = _report_links(cfg, experiment_id, exp_path)
    s, run = cfg.search, cfg.run
    summary = report_summary(records, cfg)
    pyplot()
    with tempfile.TemporaryDirectory(prefix="calib-report-") as tmp:
        d = Path(tmp)
        pareto_plot(records, chosen, d / "pareto.png", reps)
        diagrams = _reliability_diagrams(chosen, most_accurate, d, run.train.num_bins)
        sets_html = conformal_section(
            chosen, board, cfg.evaluation.conformal_alphas, cfg.evaluation.conformal_methods, d
        )
        text = render_report(
            title=f"Sweep {cfg.name}",
            summary=summary,
            records=records,
            champion=chosen,
            most_accurate=most_accurate,
            why=why,
            gate=gate,
            level=reps.level,
            board=board,
            pareto_png=d / "pareto.png",
            diagrams=diagrams,
            importances=importances,
            importance_note=note,
            params=list(s.params),
            links=links,
            conformal_html=sets_html,
        )
        out = d / REPORT_FILE
        out.write_text(text, encoding="utf-8")
        store.log_artifacts(parent_id, [(out, SWEEP_FOLDER)])
        if "://" not in exp_path or exp_path.startswith("file://"):
            local = Path(exp_path.removeprefix("file://")) / REPORT_FILE
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(text, encoding="utf-8")
            return str(local)
    return None


def _report_links(cfg: SweepConfig, experiment_id: str, exp_path: str) -> Any:
    """The report's links: the MLflow UI (or how to start it), the Optuna dashboard's command, Tune's folder."""
    from sweeps.report.html import ReportLinks

    uri, study = cfg.tracking.uri or "", cfg.search.storage or MEMORY
    if uri.startswith("sqlite:"):
        root, hint = "http://127.0.0.1:5000/", f"MLflow UI: {tool('mlflow')} ui --backend-store-uri {redact(uri)}"
    elif uri.startswith(("http://", "https://")):
        root, hint = redact(uri).rstrip("/") + "/", ""
    else:
        root, hint = "", f"MLflow store: {redact(uri)}"
    return ReportLinks(
        mlflow_root=root,
        experiment_id=experiment_id,
        dashboard=f"{tool('optuna-dashboard')} {redact(study)}" if study != MEMORY else "",
        mlflow_hint=hint,
        tune_folder=exp_path,
    )


def _reliability_diagrams(
    chosen: TrialRecord, most_accurate: TrialRecord, folder: Path, num_bins: int
) -> dict[str, str | Path | None]:
    """Test-split reliability diagrams of the champion and (when another) the most accurate trial, as PNGs in
    `folder`, by caption; a trial without stored test predictions has none."""
    import numpy as np

    from calib_core.metrics import reliability_diagram

    diagrams: dict[str, str | Path | None] = {}
    for role, rec in (("champion", chosen), ("most accurate trial", most_accurate)):
        if (role != "champion" and rec.trial_id == chosen.trial_id) or rec.checkpoint is None:
            continue
        with rec.checkpoint.as_directory() as ck:
            z = np.load(Path(ck) / PREDICTIONS_FILE)
            if "test_probs" not in z.files:
                continue
            path = folder / f"reliability_{len(diagrams)}.png"
            reliability_diagram(
                z["test_probs"], z["test_labels"], path, num_bins=num_bins, title=f"{role}: {rec.label}"
            )
            diagrams[f"{role}: {rec.label}"] = path
    return diagrams


def build_result(
    cfg: SweepConfig,
    *,
    champion: tuple[str, str, str],
    version: str,
    board: Any,
    why: str,
    intervals: dict[str, dict[str, tuple[float, float]]],
    confidence: float,
    parent_id: str,
    experiment_id: str,
    best_config: dict[str, Any],
    errors: list[dict[str, str]],
    replicates: Replicates | None = None,
    timings: dict[str, float] | None = None,
    alias: str = "champion",
    gate: str = "",
) -> SweepResult:
    """The one place a SweepResult is made (a sweep that just ran, or one read back from MLflow): what follows
    from the config (name, model URI, tracking URI, study and its loader) is derived here.
    `champion`: (run id, trial id, label)."""
    run_id, trial_id, label = champion
    return SweepResult(
        name=cfg.name,
        champion_run_id=run_id,
        champion_trial_id=trial_id,
        champion_label=label,
        model_uri=f"models:/{cfg.tracking.registered_model}/{version}",
        model_version=version,
        leaderboard=board,
        selection=why,
        intervals=intervals,
        confidence=confidence,
        parent_run_id=parent_id,
        experiment_id=experiment_id,
        tracking_uri=cfg.tracking.uri or "",
        study_storage=cfg.search.storage or MEMORY,
        replicates=replicates,
        timings=dict(timings or {}),
        best_config=best_config,
        errors=errors,
        alias=alias,
        gate=gate,
        study_loader=load_study,
    )

"""Report files, written here and logged by the caller through integrations/mlflow/store.py: per trial the reliability
diagrams, shift tables, ECE-vs-severity plots and per-task tables; per sweep the leaderboard, rank
agreement, Pareto plot and selection.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.contract import (
    BOARD_ACCURACY_GAP,
    BOARD_ACCURACY_LOWER,
    BOARD_ACCURACY_P,
    BOARD_CHAMPION,
    BOARD_ELIGIBLE,
    BOARD_MOST_ACCURATE,
    LEADERBOARD_FILE,
    PREDICTIONS_FILE,
    SHIFT_FILE,
    SPLITS,
    SUMMARY_FILE,
    is_number,
    status_words,
)
from sweeps.decide.selection import Choice, TrialRecord, not_worse_than, pareto_front

# pandas and matplotlib are imported where used (pyplot()): the sweep's driver imports this module
# before its trials start.
if TYPE_CHECKING:
    import pandas as pd

    from sweeps.config import SelectionConfig, SweepConfig
    from sweeps.decide.uncertainty import Replicates


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (no display on a sweep's nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# (file, artifact folder) pairs, what sweeps.integrations.mlflow.store.MlflowStore.log_artifacts takes
ReportFiles = list[tuple[Path, str | None]]
SWEEP_FOLDER = "sweep"  # the parent run's artifact folder


def shift_table(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write one row per (corruption, severity) with accuracy and ECE as CSV."""
    import pandas as pd

    out = Path(path)
    pd.DataFrame(rows).sort_values(["corruption", "severity"]).to_csv(out, index=False)
    return out


def shift_plot(rows: list[dict[str, Any]], path: str | Path, title: str) -> Path:
    """ECE against severity, one line per corruption plus the mean over corruptions."""
    import pandas as pd

    plt = pyplot()
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, g in df.groupby("corruption"):
        g = g.sort_values("severity")
        ax.plot(g["severity"], g["ece"], marker="o", lw=1, alpha=0.7, label=str(name))
    mean = df.groupby("severity")["ece"].mean()
    ax.plot(mean.index, mean.values, "k-", lw=2.5, label="mean")
    ax.set_xlabel("severity")
    ax.set_ylabel("ECE")
    ax.set_xticks(sorted(df["severity"].unique()))
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def per_task_table(result: dict[str, Any], tasks: list[str], path: str | Path) -> Path:
    """Rows = tasks, columns = '<split>_<metric>' taken from '<split>_<task>_<metric>' keys."""
    import pandas as pd

    rows = []
    for task in tasks:
        row: dict[str, Any] = {"task": task}
        for key, value in result.items():
            for split in SPLITS:
                prefix = f"{split}_{task}_"
                if key.startswith(prefix) and is_number(value):
                    row[f"{split}_{key.removeprefix(prefix)}"] = value
        rows.append(row)
    out = Path(path)
    pd.DataFrame(rows).to_csv(out, index=False)
    return out


def trial_report_files(ckpt: Path, out: Path, result: dict[str, Any], num_bins: int, title: str) -> ReportFiles:
    """A completed trial's report files from its final checkpoint `ckpt` (sweeps.contract's layout),
    written under `out`: reliability diagrams (val, test); shift tables and ECE-vs-severity plots when
    the trial measured shift; the per-task table of a multi-task run (from its final `result`)."""
    import numpy as np

    from calib_core.metrics import reliability_diagram

    pyplot()  # the Agg backend before calib_core draws
    files: ReportFiles = []
    preds = np.load(ckpt / PREDICTIONS_FILE)
    for split in SPLITS:
        what = "validation" if split == "val" else "test"
        path = out / f"reliability_{split}.png"
        reliability_diagram(
            preds[f"{split}_probs"], preds[f"{split}_labels"], path, num_bins=num_bins, title=f"{title} ({what})"
        )
        files.append((path, "diagrams"))
    if (ckpt / SHIFT_FILE).is_file():
        tables = json.loads((ckpt / SHIFT_FILE).read_text())
        for split, rows in tables.items():
            files.append((shift_table(rows, out / f"shift_{split}.csv"), "shift"))
            files.append((shift_plot(rows, out / f"shift_ece_{split}.png", f"ECE under shift ({split})"), "shift"))
    tasks = json.loads((ckpt / SUMMARY_FILE).read_text()).get("tasks")
    if tasks:
        files.append((per_task_table(result, tasks, out / "per_task.csv"), "tasks"))
    return files


def write_leaderboard(
    out: Path, records: list[TrialRecord], choice: Choice, reps: Replicates | None, cfg: SelectionConfig
) -> pd.DataFrame:
    """The leaderboard with the rule's standings, written to `out`/LEADERBOARD_FILE as the sweep logs it."""
    board = leaderboard(records, choice.champion, reps, cfg, choice)
    board.to_csv(out / LEADERBOARD_FILE, index=False)
    return board


def sweep_report_files(
    out: Path, records: list[TrialRecord], choice: Choice, reps: Replicates, cfg: SweepConfig
) -> tuple[pd.DataFrame, pd.DataFrame, ReportFiles]:
    """The sweep's leaderboard, rank agreement, Pareto plot and selection.json, written under `out`;
    returns (leaderboard, rank agreement, files)."""
    chosen, why = choice.champion, choice.sentence
    board = write_leaderboard(out, records, choice, reps, cfg.selection)
    ranks = rank_agreement(records)
    champion_ci = {k: list(reps.interval(chosen.trial_id, k)) for k in reps.values.get(chosen.trial_id, {})}
    ranks.to_csv(out / "rank_agreement_spearman.csv")
    pareto_plot(records, chosen, out / "pareto.png", reps)
    settings = cfg.selection.rule_settings()  # what the rule read, as it read it
    (out / "selection.json").write_text(
        json.dumps(
            {
                "champion_trial": chosen.trial_id,
                "champion_run": chosen.run_id,
                "label": chosen.label,
                "family": chosen.family,
                "rule": cfg.selection.rule,
                "rule_settings": settings,
                "max_accuracy_loss_pt": settings.get("max_accuracy_loss"),  # the margin rule's (None for the others)
                "why": why,
                "confidence": reps.level,
                "num_resamples": reps.num_resamples,
                "val_metrics": {k: v for k, v in chosen.metrics.items() if k.startswith("val_")},
                "intervals": champion_ci,
            },
            indent=1,
        )
    )
    names = (LEADERBOARD_FILE, "rank_agreement_spearman.csv", "pareto.png", "selection.json")
    return board, ranks, [(out / name, SWEEP_FOLDER) for name in names]


RANK_METRICS = ("val_ece", "val_sce", "val_ace", "val_tace", "val_nll", "val_brier")
#: Metrics whose intervals the terminal leaderboard shows.
BOARD_CI_KEYS = ("val_accuracy", "val_ece", "test_accuracy", "test_ece")


BOARD_SHOWN = 15  # the leaderboard's rows a terminal shows (format_leaderboard)


def board_order(records: list[TrialRecord]) -> list[TrialRecord]:
    """The leaderboard's rows in order: by val ECE (missing or NaN last), then trial id; as given where no record
    has a val ECE."""
    if not any("val_ece" in r.metrics for r in records):
        return list(records)

    def key(r: TrialRecord) -> tuple[bool, float, str]:
        got = r.metrics.get("val_ece")
        v = float(got) if isinstance(got, (int, float)) else math.nan
        return (math.isnan(v), 0.0 if math.isnan(v) else v, r.trial_id)

    return sorted(records, key=key)


def leaderboard(
    records: list[TrialRecord],
    champion: TrialRecord | None = None,
    reps: Replicates | None = None,
    cfg: SelectionConfig | None = None,
    choice: Choice | None = None,
) -> pd.DataFrame:
    """One row per trial: calibrator, lr, champion and Pareto flags, the rule's standing of each candidate (`choice`:
    most accurate, accuracy gap, lower bound or p-value, eligible), metrics with interval bounds; in board_order."""
    ok = [r for r in records if r.ok]
    front_ids = {ok[i].trial_id for i in pareto_front(ok)} if ok else set()
    metric, mode = (cfg.metric, cfg.mode) if cfg is not None else ("val_ece", "min")
    rows = []
    for r in board_order(records):
        row: dict[str, Any] = {
            "trial_id": r.trial_id,
            "label": r.label,
            "family": r.family,
            "calibrator": r.params.get("calibrator"),
            "calibrator_lr": r.params.get("calibrator_lr"),
            "status": r.status,
            BOARD_CHAMPION: champion is not None and r.trial_id == champion.trial_id,
            "pareto": r.trial_id in front_ids,
            "run_id": r.run_id,
        }
        standing = choice.standings.get(r.trial_id) if choice is not None else None
        if choice is not None and standing is not None:
            row[BOARD_MOST_ACCURATE] = r.trial_id == choice.most_accurate.trial_id
            row[BOARD_ACCURACY_GAP] = standing.accuracy_gap
            row[BOARD_ACCURACY_LOWER] = standing.lower_bound
            row[BOARD_ACCURACY_P] = standing.p_value
            row[BOARD_ELIGIBLE] = standing.eligible
        if champion is not None and reps is not None and r.ok and reps.has(r.trial_id, "val_accuracy"):
            row["not_worse_than_champion"] = not_worse_than(reps, champion, r, metric, mode)
        for k, v in sorted(r.metrics.items()):
            if not k.startswith(("val_", "test_")) or k.endswith(("_ci_low", "_ci_high")):
                continue
            row[k] = v
            if reps is not None and reps.has(r.trial_id, k):
                row[f"{k}_ci_low"], row[f"{k}_ci_high"] = reps.interval(r.trial_id, k)
        rows.append(row)
    import pandas as pd

    return pd.DataFrame(rows)


def format_leaderboard(board: pd.DataFrame, limit: int = BOARD_SHOWN) -> str:
    """The leaderboard for a terminal: metrics in percent with their intervals."""
    lines = []
    cols = [c for c in ("label", "status") if c in board]
    shown = board.head(limit)
    table = shown[cols].copy()
    if "status" in table:  # out_of_memory reads "out of memory"
        table["status"] = [status_words(str(s)) for s in table["status"]]
    for key in BOARD_CI_KEYS:
        if key not in shown:
            continue
        lo, hi = shown.get(f"{key}_ci_low"), shown.get(f"{key}_ci_high")
        cells = []
        for i, v in enumerate(shown[key]):
            if v != v:  # NaN: not completed
                cells.append("-")
            elif lo is not None and lo.iloc[i] == lo.iloc[i]:
                cells.append(f"{100 * v:.1f} [{100 * lo.iloc[i]:.1f}, {100 * hi.iloc[i]:.1f}]")
            else:
                cells.append(f"{100 * v:.1f}")
        table[key.replace("accuracy", "acc") + " %"] = cells
    for flag, title in (("champion", "champion"), ("not_worse_than_champion", "tied")):
        if flag in shown:
            table[title] = ["*" if v is True else "" for v in shown[flag]]
    lines.append(table.to_string(index=False))
    return "\n".join(lines)


def rank_agreement(records: list[TrialRecord], metrics: tuple[str, ...] = RANK_METRICS) -> pd.DataFrame:
    """Spearman rank correlation between calibration metrics over the completed candidates in `records` (each trial
    as trained and, where measured, with temperature scaling on top; their count in `.attrs["candidates"]`):
    scipy.stats.spearmanr's figures (Pearson's correlation of average ranks; NaN where a metric is constant or has a
    NaN, and for fewer than 3 candidates), in numpy: importing scipy.stats for it took a second of the closing."""
    import numpy as np
    import pandas as pd

    ok = [r for r in records if r.ok and all(m in r.metrics for m in metrics)]
    rho = np.full((len(metrics), len(metrics)), np.nan)
    if len(ok) >= 3:
        values = pd.DataFrame([[float(r.metrics[m]) for m in metrics] for r in ok])
        ranks = values.rank(method="average").to_numpy()  # NaN stays NaN, and so does its column's correlation
        centred = ranks - ranks.mean(axis=0)
        norm = np.sqrt((centred**2).sum(axis=0))
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = (centred.T @ centred) / np.outer(norm, norm)
        rho = (rho + rho.T) / 2  # exactly symmetric
        rho[:, norm == 0] = np.nan  # a constant metric has no rank correlation
        rho[norm == 0, :] = np.nan
    frame = pd.DataFrame(rho, index=list(metrics), columns=list(metrics), dtype=float)
    frame.attrs["candidates"] = len(ok)  # what the sentence about it counts
    return frame


def pareto_plot(
    records: list[TrialRecord], chosen: TrialRecord | None, path: str | Path, reps: Replicates | None = None
) -> Path:
    """Scatter of val accuracy vs val ECE with interval whiskers, the Pareto front joined, the champion circled."""
    import numpy as np

    plt = pyplot()
    ok = [r for r in records if r.ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    kinds = sorted({r.params.get("calibrator", "?") for r in ok})
    for kind in kinds:
        pts = [r for r in ok if r.params.get("calibrator", "?") == kind]
        xs = [r.metrics["val_ece"] for r in pts]
        ys = [r.metrics["val_accuracy"] for r in pts]
        if reps is not None and all(reps.has(r.trial_id, "val_ece") for r in pts):
            xerr = [
                [x - reps.interval(r.trial_id, "val_ece")[0] for r, x in zip(pts, xs)],
                [reps.interval(r.trial_id, "val_ece")[1] - x for r, x in zip(pts, xs)],
            ]
            yerr = [
                [y - reps.interval(r.trial_id, "val_accuracy")[0] for r, y in zip(pts, ys)],
                [reps.interval(r.trial_id, "val_accuracy")[1] - y for r, y in zip(pts, ys)],
            ]
            ax.errorbar(
                xs,
                ys,
                xerr=np.clip(xerr, 0, None),
                yerr=np.clip(yerr, 0, None),
                fmt="o",
                ms=5,
                capsize=2,
                lw=0.8,
                label=kind,
            )
        else:
            ax.scatter(xs, ys, label=kind, s=30)
    front = sorted((ok[i] for i in pareto_front(ok)), key=lambda r: r.metrics["val_ece"])
    if front:
        ax.plot(
            [r.metrics["val_ece"] for r in front],
            [r.metrics["val_accuracy"] for r in front],
            "k--",
            lw=1,
            label="Pareto front",
        )
    if chosen is not None:
        ax.scatter(
            [chosen.metrics["val_ece"]],
            [chosen.metrics["val_accuracy"]],
            s=160,
            facecolors="none",
            edgecolors="red",
            linewidths=2,
            label="champion",
        )
    ax.set_xlabel("validation ECE (lower is better)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("Sweep trials: accuracy vs calibration" + (f" ({100 * reps.level:.0f} % CIs)" if reps else ""))
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

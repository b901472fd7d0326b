"""Report files, written here and logged by the caller through sweeps/store.py: per trial the reliability
diagrams, shift tables, ECE-vs-severity plots and per-task tables; per sweep the leaderboard, rank
agreement, Pareto plot and selection.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.contract import PREDICTIONS_FILE, SHIFT_FILE, SPLITS, SUMMARY_FILE, is_number

# pandas and matplotlib are imported where used (pyplot()): the sweep's driver imports this module
# before its trials start.
if TYPE_CHECKING:
    import pandas as pd

    from sweeps.config import SweepConfig
    from sweeps.selection import TrialRecord
    from sweeps.uncertainty import Replicates


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (no display on a sweep's nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# (file, artifact folder) pairs, what sweeps.store.MlflowStore.log_artifacts takes
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


def sweep_report_files(
    out: Path, records: list[TrialRecord], chosen: TrialRecord, why: str, reps: Replicates, cfg: SweepConfig
) -> tuple[pd.DataFrame, pd.DataFrame, ReportFiles]:
    """The sweep's leaderboard, rank agreement, Pareto plot and selection.json, written under `out`;
    returns (leaderboard, rank agreement, files)."""
    from sweeps.selection import leaderboard, pareto_plot, rank_agreement

    board = leaderboard(records, chosen, reps, cfg.selection)
    ranks = rank_agreement(records)
    champion_ci = {k: list(reps.interval(chosen.trial_id, k)) for k in reps.values.get(chosen.trial_id, {})}
    board.to_csv(out / "leaderboard.csv", index=False)
    ranks.to_csv(out / "rank_agreement_spearman.csv")
    pareto_plot(records, chosen, out / "pareto.png", reps)
    (out / "selection.json").write_text(
        json.dumps(
            {
                "champion_trial": chosen.trial_id,
                "champion_run": chosen.run_id,
                "label": chosen.label,
                "rule": cfg.selection.rule,
                "why": why,
                "confidence": reps.level,
                "num_resamples": reps.num_resamples,
                "val_metrics": {k: v for k, v in chosen.metrics.items() if k.startswith("val_")},
                "intervals": champion_ci,
            },
            indent=1,
        )
    )
    names = ("leaderboard.csv", "rank_agreement_spearman.csv", "pareto.png", "selection.json")
    return board, ranks, [(out / name, SWEEP_FOLDER) for name in names]

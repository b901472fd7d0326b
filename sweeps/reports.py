"""Per-trial report artifacts beyond reliability diagrams: shift tables, ECE-vs-severity plots,
per-task tables for multi-task runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from sweeps.contract import SPLITS, is_number  # noqa: E402


def shift_table(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write one row per (corruption, severity) with accuracy and ECE as CSV."""
    out = Path(path)
    pd.DataFrame(rows).sort_values(["corruption", "severity"]).to_csv(out, index=False)
    return out


def shift_plot(rows: list[dict[str, Any]], path: str | Path, title: str) -> Path:
    """ECE against severity, one line per corruption plus the mean over corruptions."""
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

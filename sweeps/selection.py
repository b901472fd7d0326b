"""Model selection on validation metrics: Pareto front, the champion rule, rank agreement."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from sweeps.config import SelectionConfig  # noqa: E402

RANK_METRICS = ("val_ece", "val_sce", "val_ace", "val_tace", "val_nll", "val_brier")


@dataclass
class TrialRecord:
    """One finished trial as selection sees it."""

    trial_id: str
    label: str
    status: str
    metrics: dict[str, float]
    params: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    checkpoint: Any = None

    @property
    def ok(self) -> bool:
        """Completed with finite validation accuracy and ECE."""
        return self.status == "completed" and all(
            math.isfinite(self.metrics.get(k, float("nan"))) for k in ("val_accuracy", "val_ece"))


def pareto_front(records: list[TrialRecord], acc: str = "val_accuracy", err: str = "val_ece") -> list[int]:
    """Indices of records not dominated on (accuracy up, calibration error down)."""
    front = []
    for i, r in enumerate(records):
        a, e = r.metrics[acc], r.metrics[err]
        dominated = any(
            (o.metrics[acc] >= a and o.metrics[err] <= e) and (o.metrics[acc] > a or o.metrics[err] < e)
            for j, o in enumerate(records) if j != i)
        if not dominated:
            front.append(i)
    return front


def select(records: list[TrialRecord], cfg: SelectionConfig) -> tuple[TrialRecord, str]:
    """Pick the champion by the configured rule; return it and a sentence saying why."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.trial_id)
    if not ok:
        raise ValueError("no trial completed with finite validation metrics: nothing to select")
    if cfg.rule == "min_metric":
        missing = [r.trial_id for r in ok if cfg.metric not in r.metrics]
        if missing:
            raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")
        sign = 1.0 if cfg.mode == "min" else -1.0
        best = min(ok, key=lambda r: (sign * r.metrics[cfg.metric], r.trial_id))
        return best, f"{'lowest' if cfg.mode == 'min' else 'highest'} {cfg.metric} = {best.metrics[cfg.metric]:.4f}"
    front = [ok[i] for i in pareto_front(ok)]
    best_acc = max(r.metrics["val_accuracy"] for r in front)
    near = [r for r in front if r.metrics["val_accuracy"] >= best_acc - cfg.accuracy_tolerance - 1e-12]
    best = min(near, key=lambda r: (r.metrics["val_ece"], -r.metrics["val_accuracy"], r.trial_id))
    why = (f"Pareto front of val accuracy vs val ECE has {len(front)} of {len(ok)} trials; "
           f"{len(near)} within {cfg.accuracy_tolerance * 100:.2g} points of the best val accuracy "
           f"{best_acc:.4f}; lowest val ECE among them: {best.label} "
           f"(val acc {best.metrics['val_accuracy']:.4f}, val ECE {best.metrics['val_ece']:.4f})")
    return best, why


def leaderboard(records: list[TrialRecord]) -> pd.DataFrame:
    """One row per trial, Pareto membership marked, sorted by val ECE then accuracy."""
    ok = [r for r in records if r.ok]
    front_ids = {ok[i].trial_id for i in pareto_front(ok)} if ok else set()
    rows = []
    for r in records:
        row = {"trial_id": r.trial_id, "label": r.label, "status": r.status,
               "pareto": r.trial_id in front_ids, "run_id": r.run_id}
        row.update({k: v for k, v in sorted(r.metrics.items()) if k.startswith(("val_", "test_"))})
        rows.append(row)
    df = pd.DataFrame(rows)
    if "val_ece" in df:
        df = df.sort_values(["val_ece", "trial_id"], na_position="last", kind="stable")
    return df.reset_index(drop=True)


def rank_agreement(records: list[TrialRecord], metrics: tuple[str, ...] = RANK_METRICS) -> pd.DataFrame:
    """Spearman rank correlation between calibration metrics over the completed trials."""
    ok = [r for r in records if r.ok and all(m in r.metrics for m in metrics)]
    table = pd.DataFrame(index=list(metrics), columns=list(metrics), dtype=float)
    for a in metrics:
        for b in metrics:
            if len(ok) < 3:
                table.loc[a, b] = float("nan")
                continue
            rho = spearmanr([r.metrics[a] for r in ok], [r.metrics[b] for r in ok]).statistic
            table.loc[a, b] = float(rho)
    return table


def pareto_plot(records: list[TrialRecord], chosen: TrialRecord | None, path: str | Path) -> Path:
    """Scatter of val accuracy vs val ECE, the Pareto front joined, the champion circled."""
    ok = [r for r in records if r.ok]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    kinds = sorted({r.params.get("calibrator", "?") for r in ok})
    for kind in kinds:
        pts = [r for r in ok if r.params.get("calibrator", "?") == kind]
        ax.scatter([r.metrics["val_ece"] for r in pts], [r.metrics["val_accuracy"] for r in pts], label=kind, s=30)
    front = sorted((ok[i] for i in pareto_front(ok)), key=lambda r: r.metrics["val_ece"])
    if front:
        ax.plot([r.metrics["val_ece"] for r in front], [r.metrics["val_accuracy"] for r in front],
                "k--", lw=1, label="Pareto front")
    if chosen is not None:
        ax.scatter([chosen.metrics["val_ece"]], [chosen.metrics["val_accuracy"]], s=160,
                   facecolors="none", edgecolors="red", linewidths=2, label="champion")
    ax.set_xlabel("validation ECE (lower is better)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("Sweep trials: accuracy vs calibration")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

"""Model selection on validation metrics: Pareto front, the champion rule, rank agreement."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeps.config import SelectionConfig

# pandas, scipy and matplotlib are imported where used: the sweep's driver imports this module
# before its trials start and needs them only for selection and its reports.
if TYPE_CHECKING:
    import pandas as pd

    from sweeps.uncertainty import Replicates

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
            math.isfinite(self.metrics.get(k, float("nan"))) for k in ("val_accuracy", "val_ece")
        )


def pareto_front(records: list[TrialRecord], acc: str = "val_accuracy", err: str = "val_ece") -> list[int]:
    """Indices of records not dominated on (accuracy up, calibration error down)."""
    front = []
    for i, r in enumerate(records):
        a, e = r.metrics[acc], r.metrics[err]
        dominated = any(
            (o.metrics[acc] >= a and o.metrics[err] <= e) and (o.metrics[acc] > a or o.metrics[err] < e)
            for j, o in enumerate(records)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def _ci(reps: Replicates | None, r: TrialRecord, key: str) -> str:
    """' [lo, hi]' in the metric's own units (percent points for rates, as printed), or '' without replicates."""
    if reps is None or not reps.has(r.trial_id, key):
        return ""
    lo, hi = reps.interval(r.trial_id, key)
    if _is_rate(key):
        return f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f" [{lo:.4f}, {hi:.4f}]"


def _is_rate(key: str) -> bool:
    """Metrics printed in percent: accuracy and the calibration errors (not NLL, Brier or AURC)."""
    return not key.endswith(("nll", "brier", "aurc"))


def _metric_name(key: str) -> str:
    name = key.removeprefix("val_")
    return {"ece": "ECE", "accuracy": "acc", "nll": "NLL"}.get(name, name)


def _fmt_metric(key: str, v: float) -> str:
    return _pct(v) if _is_rate(key) and 0.0 <= v <= 1.0 else f"{v:.4f}"


def accuracy_candidates(ok: list[TrialRecord], reps: Replicates) -> tuple[TrialRecord, dict[str, float]]:
    """The most accurate trial on validation and, per trial, the one-sided p-value of
    "this trial is less accurate than it" (small = significantly less accurate)."""
    best_acc = max(ok, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))  # first of ties
    pvals = {
        r.trial_id: (
            1.0 if r is best_acc else reps.significantly_greater(best_acc.trial_id, r.trial_id, "val_accuracy")[1]
        )
        for r in ok
    }
    return best_acc, pvals


def _select_noise_aware(
    ok: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None
) -> tuple[TrialRecord, str]:
    if reps is None or any(not reps.has(r.trial_id, "val_accuracy") for r in ok):
        raise ValueError("selection.rule noise_aware needs bootstrap replicates of every completed trial")
    missing = [r.trial_id for r in ok if cfg.metric not in r.metrics]
    if missing:
        raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")
    alpha = 1.0 - cfg.confidence
    adjusted = cfg.multiple_comparisons == "bonferroni" and len(ok) > 2
    if adjusted:
        alpha /= len(ok) - 1
    best_acc, pvals = accuracy_candidates(ok, reps)
    near = [r for r in ok if pvals[r.trial_id] >= alpha]
    sign = 1.0 if cfg.mode == "min" else -1.0
    m = cfg.metric

    def rank(r: TrialRecord) -> tuple[float, float, str]:
        return sign * r.metrics[m], r.metrics.get("val_nll", math.inf), r.trial_id

    best = first = min(near, key=rank)
    # A trial outside the pool can still be tied with the chosen one on accuracy while far better
    # calibrated (the most accurate trial's lead is partly luck): move to it, and repeat.
    moves = []
    while cfg.dominance_factor is not None and cfg.mode == "min":
        better = [
            r
            for r in ok
            if r.metrics[m] < cfg.dominance_factor * best.metrics[m]
            and (r is best_acc or reps.significantly_greater(best.trial_id, r.trial_id, "val_accuracy")[1] >= alpha)
        ]
        if not better:
            break
        moves.append(best)
        best = min(better, key=rank)
    level = f"{100 * cfg.confidence:.0f} %"
    # three short lines: the champion with its intervals, what it trades, the rule that chose it
    head = (
        f"{best.label}: val {_metric_name(m)} {_fmt_metric(m, best.metrics[m])}{_ci(reps, best, m)}, "
        f"val acc {_pct(best.metrics['val_accuracy'])}{_ci(reps, best, 'val_accuracy')} ({level} bootstrap intervals)"
    )
    test = f"one-sided paired bootstrap at {level}"
    if adjusted:
        test += f", Bonferroni over {len(ok) - 1} comparisons: p < {alpha:.3f}"
    rule = (
        f"Rule: {'lowest' if cfg.mode == 'min' else 'highest'} val {_metric_name(m)} among the {len(near)} of "
        f"{len(ok)} completed trials not significantly less accurate than the most accurate ({test})"
    )
    if moves:
        rule += (
            f"; that was {first.label} ({_fmt_metric(m, first.metrics[m])}), replaced by this trial with under "
            f"{cfg.dominance_factor:g}x its val {_metric_name(m)} and accuracy not significantly lower"
        )
    if best is best_acc:
        return best, f"{head}\nTrade: none, it is also the most accurate trial.\n{rule}."
    p = reps.significantly_greater(best_acc.trial_id, best.trial_id, "val_accuracy")[1]
    gap = best_acc.metrics["val_accuracy"] - best.metrics["val_accuracy"]
    trade = (
        f"Trade: {100 * gap:.1f} pt below the most accurate trial {best_acc.label} (p = {p:.3f}, "
        f"{'not significant' if p >= alpha else 'significant'}), whose val {_metric_name(m)} is "
        f"{_fmt_metric(m, best_acc.metrics[m])}{_ci(reps, best_acc, m)}"
    )
    return best, f"{head}\n{trade}.\n{rule}."


def select(records: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None = None) -> tuple[TrialRecord, str]:
    """Pick the champion by the configured rule; return it and a sentence saying why and what it trades."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.trial_id)
    if not ok:
        raise ValueError("no trial completed with finite validation metrics: nothing to select")
    if cfg.rule == "noise_aware":
        return _select_noise_aware(ok, cfg, reps)
    if cfg.rule == "min_metric":
        missing = [r.trial_id for r in ok if cfg.metric not in r.metrics]
        if missing:
            raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")
        sign = 1.0 if cfg.mode == "min" else -1.0
        best = min(ok, key=lambda r: (sign * r.metrics[cfg.metric], r.trial_id))
        m = cfg.metric
        return best, (
            f"{best.label}: {'lowest' if cfg.mode == 'min' else 'highest'} {m} = "
            f"{best.metrics[m]:.4f}{_ci(reps, best, m)}"
        )
    front = [ok[i] for i in pareto_front(ok)]
    best_acc = max(r.metrics["val_accuracy"] for r in front)
    near = [r for r in front if r.metrics["val_accuracy"] >= best_acc - cfg.accuracy_tolerance - 1e-12]
    best = min(near, key=lambda r: (r.metrics["val_ece"], -r.metrics["val_accuracy"], r.trial_id))
    why = (
        f"Pareto front of val accuracy vs val ECE has {len(front)} of {len(ok)} trials; "
        f"{len(near)} within {cfg.accuracy_tolerance * 100:.2g} points of the best val accuracy "
        f"{best_acc:.4f}; lowest val ECE among them: {best.label} "
        f"(val acc {best.metrics['val_accuracy']:.4f}, val ECE {best.metrics['val_ece']:.4f})"
    )
    return best, why


#: Metrics whose intervals the terminal leaderboard shows.
BOARD_CI_KEYS = ("val_accuracy", "val_ece", "test_accuracy", "test_ece")


def not_worse_than(reps: Replicates, champion: TrialRecord, r: TrialRecord, metric: str, mode: str) -> bool:
    """True when `r` is neither significantly less accurate nor significantly worse on `metric`
    than the champion (one-sided paired tests at the replicates' level)."""
    if r is champion:
        return True
    less_accurate, _ = reps.significantly_greater(champion.trial_id, r.trial_id, "val_accuracy")
    if not (reps.has(champion.trial_id, metric) and reps.has(r.trial_id, metric)):
        return not less_accurate  # a metric without replicates (e.g. val_shift_ece): accuracy alone
    if mode == "min":
        worse, _ = reps.significantly_greater(r.trial_id, champion.trial_id, metric)
    else:
        worse, _ = reps.significantly_greater(champion.trial_id, r.trial_id, metric)
    return not less_accurate and not worse


def leaderboard(
    records: list[TrialRecord],
    champion: TrialRecord | None = None,
    reps: Replicates | None = None,
    cfg: SelectionConfig | None = None,
) -> pd.DataFrame:
    """One row per trial: calibrator, lr, champion and Pareto flags, metrics with interval bounds;
    sorted by val ECE then trial id."""
    ok = [r for r in records if r.ok]
    front_ids = {ok[i].trial_id for i in pareto_front(ok)} if ok else set()
    metric, mode = (cfg.metric, cfg.mode) if cfg is not None else ("val_ece", "min")
    rows = []
    for r in records:
        row: dict[str, Any] = {
            "trial_id": r.trial_id,
            "label": r.label,
            "calibrator": r.params.get("calibrator"),
            "calibrator_lr": r.params.get("calibrator_lr"),
            "status": r.status,
            "champion": champion is not None and r.trial_id == champion.trial_id,
            "pareto": r.trial_id in front_ids,
            "run_id": r.run_id,
        }
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

    df = pd.DataFrame(rows)
    if "val_ece" in df:
        df = df.sort_values(["val_ece", "trial_id"], na_position="last", kind="stable")
    return df.reset_index(drop=True)


def format_leaderboard(board: pd.DataFrame, limit: int = 15) -> str:
    """The leaderboard for a terminal: metrics in percent with their intervals."""
    lines = []
    cols = [c for c in ("label", "status") if c in board]
    shown = board.head(limit)
    table = shown[cols].copy()
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
    """Spearman rank correlation between calibration metrics over the completed trials."""
    import pandas as pd
    from scipy.stats import spearmanr

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


def pareto_plot(
    records: list[TrialRecord], chosen: TrialRecord | None, path: str | Path, reps: Replicates | None = None
) -> Path:
    """Scatter of val accuracy vs val ECE with interval whiskers, the Pareto front joined, the champion circled."""
    import numpy as np

    from sweeps.reports import pyplot

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

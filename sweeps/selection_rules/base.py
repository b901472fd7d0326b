"""What every selection rule works with: the candidates (`TrialRecord`), their families, the Pareto front, the
accuracy comparisons with the most accurate candidate, and the way rules print numbers.

Layer 0 (beside the rules' table): numpy and the standard library. The bootstrap replicates a rule reads
(`sweeps.decide.uncertainty.Replicates`: has, interval, difference, difference_interval, significantly_greater,
level) and the selection settings (`sweeps.config.SelectionConfig`) are passed in; nothing here imports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sweeps.selection_rules.spec import RuleSpec

# The bootstrap replicates of sweeps.decide.uncertainty (a layer above: passed in, never imported here).
Replicates = Any

POST_TS = "ts"  # TrialRecord.post: temperature scaling on top of the trial (sweeps.contract.TS_PREFIX metrics)


def method_family(params: dict[str, Any]) -> str:
    """The training family a trial's searched params name (its `calibrator` choice)."""
    choice = str(params.get("calibrator", ""))
    if choice == "ce_es":
        return "CE with early stopping"
    if choice == "none":
        return "plain CE"
    if choice.startswith("posthoc_"):
        return f"post-hoc {choice.removeprefix('posthoc_')} scaling"
    return "one-go"


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
    reason: str | None = None  # why a trial did not complete (error, divergence, early stop)
    # A candidate derived from a trial after training (POST_TS: temperature scaling on top, fitted on the
    # trial's validation logits); `base_id` is then the trial's id. The trial's run, checkpoint and params.
    post: str = ""
    base_id: str | None = None

    @property
    def trial(self) -> str:
        """The Tune trial this candidate comes from (itself, or the trial a post-processed candidate is built on)."""
        return self.base_id or self.trial_id

    @property
    def family(self) -> str:
        """What kind of model this is, for people: one-go, CE with early stopping, plain CE, post-hoc, each
        optionally "+ TS" (temperature scaling on top)."""
        family = method_family(self.params)
        return f"{family} + TS" if self.post == POST_TS else family

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


def pct(v: float) -> str:
    """A rate as a percentage to one decimal."""
    return f"{100 * v:.1f} %"


def ci(reps: Replicates | None, r: TrialRecord, key: str) -> str:
    """' [lo, hi]' in the metric's own units (percent points for rates, as printed), or '' without replicates."""
    if reps is None or not reps.has(r.trial_id, key):
        return ""
    lo, hi = reps.interval(r.trial_id, key)
    if is_rate(key):
        return f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f" [{lo:.4f}, {hi:.4f}]"


def points(value: float, threshold: float, sign: str = "") -> str:
    """A rate in points (`sign` "+": always signed) to one decimal, or to more where one would round it onto or
    across `threshold` (in points), the value it is compared with: -1.96 against -2 reads -1.96, not -2.0."""
    v = 100 * value
    for decimals in range(1, 7):
        if (round(v, decimals) > threshold) == (v > threshold) and (round(v, decimals) < threshold) == (v < threshold):
            break
    return f"{v:{sign}.{decimals}f}"


def is_rate(key: str) -> bool:
    """Metrics printed in percent: accuracy and the calibration errors (not NLL, Brier or AURC)."""
    return not key.endswith(("nll", "brier", "aurc"))


def metric_name(key: str) -> str:
    """A validation metric's short name for people (ECE, acc, NLL, ...)."""
    name = key.removeprefix("val_")
    return {"ece": "ECE", "accuracy": "acc", "nll": "NLL"}.get(name, name)


def fmt_metric(key: str, v: float) -> str:
    """A metric's value as printed: rates in percent, the others to four decimals."""
    return pct(v) if is_rate(key) and 0.0 <= v <= 1.0 else f"{v:.4f}"


def most_accurate(ok: list[TrialRecord]) -> TrialRecord:
    """The most accurate candidate on validation: then the lowest val ECE, then the first of `ok` (sorted by id)."""
    return max(ok, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))


def accuracy_gaps(ok: list[TrialRecord], top: TrialRecord) -> dict[str, float]:
    """Each candidate's val accuracy gap to `top` (point estimates; >= 0 when `top` is the most accurate)."""
    return {r.trial_id: top.metrics["val_accuracy"] - r.metrics["val_accuracy"] for r in ok}


def accuracy_candidates(ok: list[TrialRecord], reps: Replicates) -> tuple[TrialRecord, dict[str, float]]:
    """The most accurate trial on validation and, per trial, the one-sided p-value of
    "this trial is less accurate than it" (small = significantly less accurate)."""
    best_acc = most_accurate(ok)
    pvals = {
        r.trial_id: (
            1.0 if r is best_acc else reps.significantly_greater(best_acc.trial_id, r.trial_id, "val_accuracy")[1]
        )
        for r in ok
    }
    return best_acc, pvals


def accuracy_lower_bounds(ok: list[TrialRecord], reps: Replicates) -> tuple[TrialRecord, dict[str, float]]:
    """The most accurate candidate on validation and, per candidate, the one-sided lower confidence bound (at the
    replicates' level) of its paired accuracy difference to it (0 for the most accurate itself)."""
    best_acc = most_accurate(ok)
    lower = {}
    for r in ok:
        if r is best_acc:
            lower[r.trial_id] = 0.0
            continue
        d = reps.difference(r.trial_id, best_acc.trial_id, "val_accuracy")
        lower[r.trial_id] = float(np.quantile(d, 1.0 - reps.level))
    return best_acc, lower


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


def check_inputs(ok: list[TrialRecord], cfg: Any, reps: Replicates | None, spec: RuleSpec) -> None:
    """Refuse, in one line, what rule `spec` cannot judge: a candidate without selection.metric (when it reads it),
    or a candidate without bootstrap replicates of its val accuracy (when the rule needs them)."""
    if spec.needs_replicates and (reps is None or any(not reps.has(r.trial_id, "val_accuracy") for r in ok)):
        raise ValueError(f"selection.rule {spec.name} needs bootstrap replicates of every completed trial")
    missing = [r.trial_id for r in ok if cfg.metric not in r.metrics] if "metric" in spec.reads else []
    if missing:
        raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")

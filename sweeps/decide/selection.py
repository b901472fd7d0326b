"""Model selection on validation metrics: the Pareto front and the champion rules.

Presentation (leaderboard, Pareto plot, rank agreement) is in sweeps/report/files.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeps.config import SelectionConfig
from sweeps.selection_rules import RULE_SPECS

# pandas, scipy and matplotlib are imported where used: the sweep's driver imports this module
# before its trials start and needs them only for selection and its reports.
if TYPE_CHECKING:
    from sweeps.decide.uncertainty import Replicates


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


def on_top_candidates(records: list[TrialRecord], prefix: str) -> list[TrialRecord]:
    """The "+ TS" candidate of every completed trial that reported temperature-scaling-on-top metrics (keys
    `prefix` + val_/test_...): same run, checkpoint and params, its own metrics."""
    out = []
    for r in records:
        metrics = {k.removeprefix(prefix): v for k, v in r.metrics.items() if k.startswith(prefix)}
        if r.status != "completed" or "val_accuracy" not in metrics or r.post:
            continue
        out.append(
            TrialRecord(
                trial_id=f"{r.trial_id}+{POST_TS}",
                label=f"{r.label} + TS",
                status=r.status,
                metrics=metrics,
                params=r.params,
                run_id=r.run_id,
                checkpoint=r.checkpoint,
                post=POST_TS,
                base_id=r.trial_id,
            )
        )
    return out


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
            f"{cfg.dominance_factor:g}x its val {_metric_name(m)} and accuracy not significantly lower than that pick's"
        )
        if best not in near:  # the dominance step may leave the pool: say so rather than imply the pool's promise
            rule += (
                "; the dominance step left the pool, so this champion IS significantly less accurate than the most "
                "accurate trial (the margin rule, selection.rule: margin, never leaves its set)"
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


def accuracy_lower_bounds(ok: list[TrialRecord], reps: Replicates) -> tuple[TrialRecord, dict[str, float]]:
    """The most accurate candidate on validation and, per candidate, the one-sided lower confidence bound (at the
    replicates' level) of its paired accuracy difference to it (0 for the most accurate itself)."""
    best_acc = max(ok, key=lambda r: (r.metrics["val_accuracy"], -r.metrics["val_ece"]))  # first of ties
    lower = {}
    for r in ok:
        if r is best_acc:
            lower[r.trial_id] = 0.0
            continue
        d = reps.difference(r.trial_id, best_acc.trial_id, "val_accuracy")
        lower[r.trial_id] = float(np.quantile(d, 1.0 - reps.level))
    return best_acc, lower


def within_margin(
    ok: list[TrialRecord], cfg: SelectionConfig, reps: Replicates
) -> tuple[TrialRecord, list[TrialRecord]]:
    """The most accurate candidate and the candidates non-inferior to it within selection.max_accuracy_loss:
    the one-sided lower confidence bound of the paired accuracy difference lies above minus the margin."""
    best_acc, lower = accuracy_lower_bounds(ok, reps)
    margin = cfg.max_accuracy_loss / 100.0
    return best_acc, [r for r in ok if lower[r.trial_id] > -margin or r is best_acc]


def _select_margin(ok: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None) -> tuple[TrialRecord, str]:
    if reps is None or any(not reps.has(r.trial_id, "val_accuracy") for r in ok):
        raise ValueError("selection.rule margin needs bootstrap replicates of every completed trial")
    missing = [r.trial_id for r in ok if cfg.metric not in r.metrics]
    if missing:
        raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")
    best_acc, kept = within_margin(ok, cfg, reps)
    sign = 1.0 if cfg.mode == "min" else -1.0
    m = cfg.metric
    best = min(kept, key=lambda r: (sign * r.metrics[m], r.metrics.get("val_nll", math.inf), r.trial_id))
    level = f"{100 * reps.level:.0f} %"
    margin = f"{cfg.max_accuracy_loss:g} pt"
    head = (
        f"{best.label} ({best.family}): val {_metric_name(m)} {_fmt_metric(m, best.metrics[m])}{_ci(reps, best, m)}, "
        f"val acc {_pct(best.metrics['val_accuracy'])}{_ci(reps, best, 'val_accuracy')} ({level} bootstrap intervals)"
    )
    if best is best_acc:
        trade = "Trade: none, it is also the most accurate candidate."
    else:
        gap = best_acc.metrics["val_accuracy"] - best.metrics["val_accuracy"]
        lo, hi = reps.difference_interval(best.trial_id, best_acc.trial_id, "val_accuracy")
        lower = float(np.quantile(reps.difference(best.trial_id, best_acc.trial_id, "val_accuracy"), 1 - reps.level))
        trade = (
            f"Trade: {100 * gap:.1f} pt less accurate on validation than the most accurate candidate {best_acc.label} "
            f"({best_acc.family}; difference {100 * -gap:+.1f} pt [{100 * lo:+.1f}, {100 * hi:+.1f}], one-sided lower "
            f"bound {100 * lower:+.1f} pt, within the {margin} margin), for val {_metric_name(m)} "
            f"{_fmt_metric(m, best.metrics[m])} against its {_fmt_metric(m, best_acc.metrics[m])}."
        )
    rule = (
        f"Rule: {'lowest' if cfg.mode == 'min' else 'highest'} val {_metric_name(m)} among the {len(kept)} of "
        f"{len(ok)} candidates whose val accuracy is at most {margin} below the most accurate's (selection."
        f"max_accuracy_loss; one-sided {level} paired bootstrap lower bound of the difference above -{margin})"
    )
    return best, f"{head}\n{trade}\n{rule}.\n{family_line(ok, kept, best, cfg, reps)}"


def family_line(
    ok: list[TrialRecord], kept: list[TrialRecord], champion: TrialRecord, cfg: SelectionConfig, reps: Replicates
) -> str:
    """Which family won and by how much: each other family's best candidate within the margin set, with the paired
    difference of the selection metric to the champion and its interval; the families outside the margin."""
    m, sign = cfg.metric, (1.0 if cfg.mode == "min" else -1.0)
    scale, unit = (100.0, " pt") if _is_rate(m) else (1.0, "")
    inside, outside = [], []
    for fam in sorted({r.family for r in ok} - {champion.family}):
        mine = [r for r in kept if r.family == fam]
        if not mine:
            best_acc = max(r.metrics["val_accuracy"] for r in ok if r.family == fam)
            outside.append(f"{fam} (best val acc {_pct(best_acc)})")
            continue
        top = min(mine, key=lambda r: (sign * r.metrics[m], r.trial_id))
        text = f"{fam} {_fmt_metric(m, top.metrics[m])}"
        if reps.has(top.trial_id, m) and reps.has(champion.trial_id, m):
            d = top.metrics[m] - champion.metrics[m]
            lo, hi = reps.difference_interval(top.trial_id, champion.trial_id, m)
            text += f", {scale * d:+.1f} [{scale * lo:+.1f}, {scale * hi:+.1f}]{unit}"
        inside.append(text)
    parts = [f"Won by family {champion.family} (val {_metric_name(m)} {_fmt_metric(m, champion.metrics[m])})"]
    if inside:
        parts.append(f"Others within the margin, against it: {'; '.join(inside)}")
    if outside:
        parts.append(f"Outside the margin: {', '.join(outside)}")
    return ". ".join(parts) + "."


def _select_min_metric(ok: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None) -> tuple[TrialRecord, str]:
    missing = [r.trial_id for r in ok if cfg.metric not in r.metrics]
    if missing:
        raise ValueError(f"selection.metric {cfg.metric!r} missing from trials {missing}")
    sign = 1.0 if cfg.mode == "min" else -1.0
    best = min(ok, key=lambda r: (sign * r.metrics[cfg.metric], r.trial_id))
    m = cfg.metric
    return best, (
        f"{best.label}: {'lowest' if cfg.mode == 'min' else 'highest'} {m} = {best.metrics[m]:.4f}{_ci(reps, best, m)}"
    )


@dataclass(frozen=True)
class SelectionRule:
    """One way to pick the champion: its function, whether it needs the bootstrap replicates (read once every
    trial finished), what it does in a line (docs, --help), and the selection.* settings it reads (recorded
    with its choice in selection.json)."""

    name: str
    pick: Callable[[list[TrialRecord], SelectionConfig, Replicates | None], tuple[TrialRecord, str]]
    needs_replicates: bool
    summary: str
    settings: tuple[str, ...] = ()

    def settings_of(self, cfg: SelectionConfig) -> dict[str, Any]:
        """The values of the settings this rule reads, by name."""
        return {name: getattr(cfg, name) for name in self.settings}


def select(records: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None = None) -> tuple[TrialRecord, str]:
    """Pick the champion by the configured rule; return it and a sentence saying why and what it trades."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.trial_id)
    if not ok:
        raise ValueError("no trial completed with finite validation metrics: nothing to select")
    return RULES[cfg.rule].pick(ok, cfg, reps)


def _select_pareto(ok: list[TrialRecord], cfg: SelectionConfig, reps: Replicates | None) -> tuple[TrialRecord, str]:
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


# Each rule of sweeps/selection_rules.py (its name, sentence, settings) with the function that picks.
_PICKS: dict[str, Callable[[list[TrialRecord], SelectionConfig, Replicates | None], tuple[TrialRecord, str]]] = {
    "margin": _select_margin,
    "noise_aware": _select_noise_aware,
    "pareto_min_ece_near_best_accuracy": _select_pareto,
    "min_metric": _select_min_metric,
}
if set(_PICKS) != set(RULE_SPECS):  # a rule without its function, or a function without its rule
    raise ImportError(f"selection rules {sorted(RULE_SPECS)} and their functions {sorted(_PICKS)} differ")
RULES: dict[str, SelectionRule] = {
    name: SelectionRule(name, _PICKS[name], spec.needs_replicates, spec.summary, spec.reads)
    for name, spec in RULE_SPECS.items()
}


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


def trial_errors(records: list[TrialRecord]) -> list[dict[str, str]]:
    """The trials that did not complete (errored, diverged, stopped): id, label, status and reason, for people."""
    return [
        {"trial_id": r.trial_id, "label": r.label, "status": r.status, "reason": " ".join((r.reason or "").split())}
        for r in records
        if r.status not in ("completed", "stopped_early")
    ]

"""A one-line progress report each time a trial ends: counts and the best trial so far."""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.config import SelectionConfig
from sweeps.search_space import describe_params
from sweeps.selection import TrialRecord, select
from sweeps.tracking import STOPPED_EARLY


class ProgressCallback(tune.Callback):
    """Prints '[done/total] ... best so far: ...' using the sweep's own selection rule."""

    def __init__(self, total: int, selection: SelectionConfig) -> None:
        self.total = total
        self.selection = selection

    def _line(self, trials: list, trial: Any, what: str) -> None:
        records = []
        for t in trials:
            r = t.last_result or {}
            if t.status == "TERMINATED" or t is trial:
                records.append(TrialRecord(
                    trial_id=t.trial_id, label=describe_params(t.config), status=str(r.get("status", "")),
                    metrics={k: float(v) for k, v in r.items()
                             if k.startswith("val_") and isinstance(v, (int, float)) and not isinstance(v, bool)}))
        finished = sum(t.status in ("TERMINATED", "ERROR") for t in trials) + 1
        best_txt = self._best_text(records)
        print(f"[{min(finished, self.total)}/{self.total} trials ended] {describe_params(trial.config)}: {what}; "
              f"{best_txt}", flush=True)

    def _best_text(self, records: list[TrialRecord]) -> str:
        ok = [r for r in records if r.ok]
        if not ok:
            return "no completed trial yet"
        if self.selection.rule == "noise_aware":
            # the rule needs every trial's predictions (read at the end); say what is known now
            acc = max(ok, key=lambda r: r.metrics["val_accuracy"])
            cal = min(ok, key=lambda r: r.metrics["val_ece"])
            return (f"most accurate so far: {acc.label} (val acc {acc.metrics['val_accuracy']:.4f}); "
                    f"lowest val ECE so far: {cal.label} ({cal.metrics['val_ece']:.4f})")
        best, _ = select(records, self.selection)
        return (f"best so far: {best.label} (val acc {best.metrics['val_accuracy']:.4f}, "
                f"val ECE {best.metrics['val_ece']:.4f})")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a finished (or diverged) trial."""
        r = trial.last_result or {}
        status = r.get("status", "stopped")
        if status == "completed":
            what = f"val acc {r.get('val_accuracy', float('nan')):.4f}, val ECE {r.get('val_ece', float('nan')):.4f}"
        elif status == STOPPED_EARLY:  # a scheduler decision, not a failure: the reason says it all
            what = r.get("reason") or "stopped early by the scheduler"
        else:
            what = f"{status} {r.get('reason', '')}".strip()
        self._line(trials, trial, what)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a trial that failed after its retries."""
        self._line(trials, trial, "ERROR (retries exhausted)")

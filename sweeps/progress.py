"""A one-line progress report each time a trial ends: counts and the best trial so far."""

from __future__ import annotations

from typing import Any

from ray import tune

from sweeps.config import SelectionConfig
from sweeps.search_space import describe_params
from sweeps.selection import TrialRecord, select


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
        try:
            best, _ = select(records, self.selection)
            best_txt = (f"best so far: {best.label} (val acc {best.metrics['val_accuracy']:.4f}, "
                        f"val ECE {best.metrics['val_ece']:.4f})")
        except ValueError:
            best_txt = "no completed trial yet"
        print(f"[{min(finished, self.total)}/{self.total} trials ended] {describe_params(trial.config)}: {what}; "
              f"{best_txt}", flush=True)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a finished (or diverged) trial."""
        r = trial.last_result or {}
        status = r.get("status", "stopped")
        what = (f"val acc {r.get('val_accuracy', float('nan')):.4f}, val ECE {r.get('val_ece', float('nan')):.4f}"
                if status == "completed" else f"{status} {r.get('reason', '')}".strip())
        self._line(trials, trial, what)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a trial that failed after its retries."""
        self._line(trials, trial, "ERROR (retries exhausted)")

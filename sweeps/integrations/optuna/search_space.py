"""The Optuna search space (define-by-run); what sampled params mean for a run is sweeps/trial_params.py."""

from __future__ import annotations

from typing import Any

from sweeps.config import BASELINE_CHOICES, SearchConfig
from sweeps.contract import REFERENCE_ATTR


class SearchSpace:
    """Define-by-run space: calibrator type, its learning rate (one-go only), and extra params.

    A picklable callable (not a closure) because Tune checkpoints the searcher with it.
    """

    def __init__(self, search: SearchConfig) -> None:
        self.calibrators = search.sampled_calibrators()
        self.references = search.reference_arms()
        self.patience = search.reference_patience
        self.lr_low, self.lr_high = search.calibrator_lr.low, search.calibrator_lr.high
        self.params = {k: v.model_dump() for k, v in search.params.items()}

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        """Sample one configuration on an optuna trial. The study's first trials are the reference arms, one each
        in order (by trial number: deterministic, never left to the sampler, and not repeated when a sweep grows):
        their choice is a constant of the trial (a user attribute), not a sampled value."""
        if trial.number < len(self.references):
            arm = self.references[trial.number]
            trial.set_user_attr(REFERENCE_ATTR, arm)
            self._extra(trial)
            fixed: dict[str, Any] = {"calibrator": arm}
            if arm == "ce_es":
                fixed["train.early_stopping_patience"] = self.patience
            return fixed
        choice = trial.suggest_categorical("calibrator", self.calibrators)
        if choice not in BASELINE_CHOICES:  # a one-go calibrator: its learning rate is searched
            trial.suggest_float("calibrator_lr", self.lr_low, self.lr_high, log=True)
        self._extra(trial)
        return None

    def _extra(self, trial: Any) -> None:
        for key, p in self.params.items():
            if p["type"] == "loguniform":
                trial.suggest_float(key, p["low"], p["high"], log=True)
            elif p["type"] == "uniform":
                trial.suggest_float(key, p["low"], p["high"])
            elif p["type"] == "int":
                trial.suggest_int(key, int(p["low"]), int(p["high"]))
            else:
                trial.suggest_categorical(key, p["values"])

"""What Ray Tune keeps in the driver per trial: its running statistics only for the keys the sweep asks it about.

For every numeric key of every result, Tune's `_TrainingRunMetadata.update_metric` keeps max, min, avg, last and the
last-5 and last-10 averages with a deque for each, and every trial's cached JSON state repeats them: with the ~140
numeric keys of a trial's final result (the metric family on two splits, the calibrator's numbers, the conformal
sets), ~0.4 MB per trial (tests/unit/sweeps/test_tune_memory.py measures it), so ~0.4 GB of the driver at
1,000 trials. The sweep never reads those statistics: selection reads each trial's last result and checkpoint,
MLflow gets every reported value as it comes, Optuna and the schedulers get the result itself. Tune uses them only
for `ResultGrid.get_best_result` / `ExperimentAnalysis.get_best_trial` by scope, so they are kept for the objectives,
the epoch and Tune's own time and iteration counters (what someone opening ray_results with Tune's analysis would
rank by), and for nothing else. Every result is still reported whole: `last_result`, the result files and the
callbacks see every key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

# Tune's own counters, and the epoch every report carries
ALWAYS_KEPT = frozenset({"epoch", "training_iteration", "time_total_s", "time_this_iter_s"})


@contextlib.contextmanager
def statistics_only_for(keys: Iterable[str]) -> Iterator[frozenset[str]]:
    """While inside, Tune keeps its per-metric statistics for `keys` (and ALWAYS_KEPT) only; yields the kept set."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    kept = frozenset(keys) | ALWAYS_KEPT
    original = _TrainingRunMetadata.update_metric

    def update_metric(self: Any, metric: str, value: Any, step: int | None = 1) -> None:
        if metric in kept:
            original(self, metric, value, step=step)

    _TrainingRunMetadata.update_metric = update_metric  # type: ignore[method-assign]
    try:
        yield kept
    finally:
        _TrainingRunMetadata.update_metric = original  # type: ignore[method-assign]

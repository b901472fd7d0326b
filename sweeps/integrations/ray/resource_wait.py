"""End a sweep whose trials wait too long for resources (resources.pending_timeout_s).

On a cluster that can add nodes (an autoscaler), `sweeps.checks.preflight` lets a sweep start although
no node fits a trial yet; if no node comes, Ray would keep the trials PENDING for ever. This
Tune callback raises `ResourcesUnavailable` once trials have been pending, with none of the
sweep's trials running, for longer than the timeout; `run_sweep` then marks the parent run
FAILED and `launch.py` prints one line. A resumed sweep starts a new wait.
"""

from __future__ import annotations

import time
from typing import Any

from ray import tune

from sweeps.contract import ResourcesUnavailable


class PendingTimeout(tune.Callback):
    """Raise ResourcesUnavailable after `timeout_s` with trials PENDING and none RUNNING."""

    def __init__(
        self, timeout_s: float | None, cpus_per_trial: float, gpus_per_trial: float, clock: Any = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self.cpus, self.gpus = cpus_per_trial, gpus_per_trial
        self.clock = clock
        self._since: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks with the experiment; a restored sweep starts a new wait.
        state = self.__dict__.copy()
        state.update(_since=None, clock=time.monotonic)
        return state

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self.timeout_s is None:
            return
        statuses = {t.status for t in trials}
        if "RUNNING" in statuses or "PENDING" not in statuses:
            self._since = None
            return
        now = self.clock()
        if self._since is None:
            self._since = now
        elif now - self._since > self.timeout_s:
            raise ResourcesUnavailable(self.message())

    def message(self) -> str:
        try:
            import ray

            total = ray.cluster_resources()
            have = f"; the cluster has {total.get('CPU', 0):g} CPU and {total.get('GPU', 0):g} GPU in all"
        except Exception:
            have = ""
        return (
            f"resources.pending_timeout_s: no trial could start within {self.timeout_s:g} s (each asks for "
            f"{self.cpus:g} CPU and {self.gpus:g} GPU on one node{have}); the sweep stopped: continue it "
            "with --resume once a node fits a trial, or lower resources.cpus_per_trial/gpus_per_trial"
        )

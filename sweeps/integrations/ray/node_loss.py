"""One line when a Ray node is lost while the sweep runs: which node, which trials were on it, what they do now.

Ray Tune retries a trial whose worker died (`resources.max_failures`) from its last checkpoint, on whatever
node has room, but says only that the actor died, once per trial, with a traceback. A user running on a
cluster needs to know that a node went away (a preempted spot instance, a drained Kubernetes node, a raylet
that crashed) and that nothing was lost; this callback watches the cluster's node table (the GCS's, a cheap
call, at most every `every_s` seconds from Tune's event loop) and prints that line once per lost node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ray import tune

from sweeps.trial_params import trial_label

NODE_TABLE_EVERY_S = 2.0  # how often the node table is read; a loss is announced at most this late after Ray knows


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())


def short_id(node_id: str) -> str:
    """A node id as Ray's CLI shortens it (its first 8 hex digits)."""
    return node_id[:8]


class NodeLossCallback(tune.Callback):
    """Prints `Ray node ADDRESS (ID) lost: ...` once for each node that was alive and is now dead."""

    def __init__(
        self,
        max_failures: int,
        every_s: float = NODE_TABLE_EVERY_S,
        nodes: Callable[[], list[dict[str, Any]]] = _ray_nodes,
        say: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.every_s = max_failures, every_s
        self._nodes, self._clock = nodes, clock
        self._say = say if say is not None else (lambda line: print(line, flush=True))
        self._alive: dict[str, str] = {}  # node id -> address, every node seen alive
        self._last_node: dict[str, str] = {}  # trial id -> the node of its last report
        # trial id -> the node it was on when its worker died: the GCS marks a node dead only after its health
        # checks fail (seconds to tens of seconds), by when Tune may have restarted the trial elsewhere
        self._died_on: dict[str, str] = {}
        self.lost: list[str] = []  # node ids announced, in order
        self._next = float("-inf")

    def setup(self, *args: Any, **info: Any) -> None:
        """The nodes alive when the experiment starts (a node already dead before is nothing this sweep lost)."""
        self._poll([])

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """Read the node table at most every `every_s` seconds; announce each newly dead node once."""
        if self._clock() >= self._next:
            self._poll(trials)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """Where the trial reported from."""
        if result.get("node_id"):
            self._last_node[trial.trial_id] = str(result["node_id"])

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial's worker died: remember its node and read the node table now (that node may be why)."""
        self._died(trial)
        self._poll(trials)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """As on_trial_recover, for a trial out of retries."""
        self._died(trial)
        self._poll(trials)

    def _died(self, trial: Any) -> None:
        node = self._last_node.get(trial.trial_id) or (trial.last_result or {}).get("node_id")
        if node:
            self._died_on[trial.trial_id] = str(node)

    def _poll(self, trials: list) -> None:
        self._next = self._clock() + self.every_s
        try:
            table = self._nodes()
        except Exception:  # noqa: BLE001 - the GCS briefly unreachable: the next poll tells
            return
        for node in table:
            nid, address = str(node.get("NodeID", "")), str(node.get("NodeManagerAddress", "?"))
            if not nid:
                continue
            if node.get("Alive"):
                self._alive[nid] = address
            elif nid in self._alive and nid not in self.lost:
                self.lost.append(nid)
                self._say(self.line(nid, self._alive[nid], trials))

    def line(self, node_id: str, address: str, trials: list) -> str:
        """The one line for a lost node and the unfinished trials whose last report came from it."""
        there = [
            t
            for t in trials
            if self._died_on.get(t.trial_id) == node_id
            or (
                self._last_node.get(t.trial_id, (t.last_result or {}).get("node_id")) == node_id
                and t.status != "TERMINATED"
            )
        ]
        what = f"Ray node {address} ({short_id(node_id)}) lost"
        if not there:
            return f"{what}; no trial of this sweep was running on it"
        names = ", ".join(trial_label(t) for t in there)
        if self.max_failures > 0:
            then = (
                f"{'it retries' if len(there) == 1 else 'they retry'} from the last checkpoint on the remaining "
                f"nodes (resources.max_failures = {self.max_failures})"
            )
        else:
            then = "no retries (resources.max_failures = 0): continue with --resume"
        return f"{what} with {len(there)} trial(s) running on it ({names}); {then}"

"""Which MLflow run each Tune trial of a sweep has, in this driver process (layer 0, standard library only).

The tracking callback (integrations/mlflow/tracking.py) notes a trial's run when it opens it; the Optuna searcher
(integrations/optuna/study.py) listens, to record the run on the study trial while that is still open (Optuna
refuses attributes on a finished trial), and reads the noted run when the trial completes. Neither integration
imports the other: both import this registry.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# (sweep, Tune trial id) -> MLflow run id, noted by the tracking callback when a trial's run opens, read by the
# Optuna searcher while the study trial is still open (Optuna refuses attributes on a finished trial).
_RUN_IDS: dict[tuple[str, str], str] = {}


_RUN_LISTENERS: dict[str, Any] = {}
# Listeners are told on a thread of their own: one that waits (the study database away) must not hold up the
# tracking writer that notes the runs, or a trial completing meanwhile would find its run not yet noted.
_TOLD: queue.Queue[tuple[str, str, str]] = queue.Queue()
_TELLER: threading.Thread | None = None
_TELLER_LOCK = threading.Lock()


def _tell_listeners() -> None:
    while True:
        sweep, trial_id, run_id = _TOLD.get()
        try:
            listener = _RUN_LISTENERS.get(sweep)
            if listener is not None:
                listener(trial_id, run_id)
        except Exception:  # noqa: BLE001 - a listener's failure is its own (the completion records the run too)
            log.debug("run listener of %s failed for trial %s", sweep, trial_id, exc_info=True)
        finally:
            _TOLD.task_done()


def note_run(sweep: str, trial_id: str, run_id: str) -> None:
    """Record the MLflow run of a trial of `sweep` (in this driver process); the sweep's listener is told on
    its own thread."""
    global _TELLER
    _RUN_IDS[(sweep, trial_id)] = run_id
    if sweep not in _RUN_LISTENERS:
        return
    with _TELLER_LOCK:
        if _TELLER is None or not _TELLER.is_alive():
            _TELLER = threading.Thread(target=_tell_listeners, name="run-listeners", daemon=True)
            _TELLER.start()
    _TOLD.put((sweep, trial_id, run_id))


def listeners_told(timeout_s: float = 5.0) -> bool:
    """Wait until every noted run was told to its listener (at most `timeout_s`); whether all were."""
    deadline = time.monotonic() + timeout_s
    while _TOLD.unfinished_tasks:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def listen_for_runs(sweep: str, listener: Any) -> None:
    """Call `listener(trial_id, run_id)` whenever a run of `sweep` is noted (the Optuna searcher's)."""
    _RUN_LISTENERS[sweep] = listener


def noted_run(sweep: str, trial_id: str) -> str | None:
    """The MLflow run id noted for this trial, or None."""
    return _RUN_IDS.get((sweep, trial_id))

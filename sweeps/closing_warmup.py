"""The closing's first imports, made while the trials run (issue 47 item 1).

The driver idles while Ray's workers train, then its closing pays for what it imports first: torch, calib_core's
metrics with their numba kernels (loaded from numba's cache on the first call of each signature), MLflow's
model-logging modules, matplotlib's first figure, the report's modules and Optuna's importance evaluators (sklearn,
scipy.stats; only for a sweep that can have importances, `steps_for`): about 4 s of CPU on an idle 2-core machine,
more than the bootstrap itself. `ClosingWarmup` does that
work in a daemon thread from the moment the trials start, in the order the closing needs it, one step at a time:

- it starts with the trials (nothing is spent on a sweep that fails during start-up) and stops at the next step
  when the sweep ends otherwise (`stop`, its context's exit: Ctrl+C, SIGTERM, a failure); a step that fails ends
  it quietly (the closing imports what is missing itself);
- `finish()`, as the closing begins, lets no further step start and waits for the one running (at most one import,
  a few seconds under load; a timeout beyond): the closing never imports beside it, so the two cannot meet in
  Python's import locks;
- the thread runs at a lower priority (nice + WARMUP_NICENESS, Linux, best effort) so the trials' workers keep the
  CPU they compete for; its steps are imports and calls on a few synthetic rows, never the sweep's data;
- `CALIB_CLOSING_WARMUP=0` turns it off (the closing then imports as before).

Signals reach only the main thread (Python's rule), so Ctrl+C and SIGTERM are handled as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)

ENV = "CALIB_CLOSING_WARMUP"
WARMUP_NICENESS = 5
FINISH_TIMEOUT_S = 60.0
# how long a stopped sweep waits for the step under way before the process exits (sweeps/service.py)
EXIT_WAIT_S = 15.0


def _torch() -> None:
    import torch  # noqa: F401


def _metrics() -> None:
    """calib_core.metrics and every numba kernel the bootstrap and the calibrated null call, on the dtypes a trial
    stores (float32 probabilities, int64 labels); the intervals' own code (torch quantiles)."""
    import numpy as np

    from sweeps.decide.uncertainty import compute_replicates

    rng = np.random.default_rng(0)
    n, k = 64, 4
    probs = rng.dirichlet(np.ones(k), n).astype(np.float32)
    labels = rng.integers(0, k, n).astype(np.int64)
    part: list[tuple[str | None, np.ndarray, np.ndarray]] = [(None, probs, labels)]
    preds = {"w": {"val": part, "test": part}}
    reps = compute_replicates(preds, num_bins=10, num_resamples=8, null_draws=4)
    for key in ("val_accuracy", "val_ece", "val_nll"):
        reps.interval("w", key)
    reps.difference_interval("w", "w", "val_accuracy")


def _model_logging() -> None:
    """What registering the champion imports: MLflow's pyfunc flavour and model signature, the export module."""
    import mlflow.models.signature  # noqa: F401
    import mlflow.pyfunc  # noqa: F401

    import sweeps.integrations.mlflow.champion_gate  # noqa: F401
    import sweeps.integrations.mlflow.model_export  # noqa: F401


def _plots() -> None:
    """matplotlib on Agg and its first figure (fonts, layout, the PNG writer), and a reliability diagram."""
    import io
    import tempfile
    from pathlib import Path

    import numpy as np

    from calib_core.metrics import reliability_diagram
    from sweeps.report.files import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3.0, 2.0))
    ax.errorbar([0.1, 0.2], [0.8, 0.9], xerr=[[0.01, 0.01], [0.02, 0.02]], fmt="o", capsize=2, label="a")
    ax.set_xlabel("x")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(io.BytesIO(), dpi=50)
    plt.close(fig)
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 32).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="calib-warm-") as d:
        reliability_diagram(probs, rng.integers(0, 3, 32), Path(d) / "r.png", num_bins=5, title="warm-up")


def _report() -> None:
    """The report's modules."""
    import sweeps.report.conformal  # noqa: F401
    import sweeps.report.html  # noqa: F401


def _importance() -> None:
    """Optuna's importance evaluators (sklearn and scipy.stats, ~1.5 s of CPU), for a report with importances."""
    import optuna.importance  # noqa: F401


# (name, step), in the order the closing needs them: the bootstrap, registration, then the report
STEPS: tuple[tuple[str, Callable[[], None]], ...] = (
    ("torch", _torch),
    ("metrics", _metrics),
    ("model_logging", _model_logging),
    ("plots", _plots),
    ("report", _report),
    ("importance", _importance),
)


def steps_for(importances: bool) -> tuple[tuple[str, Callable[[], None]], ...]:
    """The steps a sweep's closing will use: without parameter importances (too few sampled trials to have them)
    the importance evaluators' imports are work nobody would use."""
    return STEPS if importances else tuple(s for s in STEPS if s[0] != "importance")


def enabled() -> bool:
    """False when CALIB_CLOSING_WARMUP is 0 (or off, false, no)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


class ClosingWarmup:
    """The closing's imports in a daemon thread while the trials run: `start()` as they start, `finish()` as the
    closing begins, `stop()` (the context's exit) when the sweep ends otherwise. `done` names the steps that ran,
    `cpu_s` the thread's CPU seconds, `error` what ended it early ("" when nothing did)."""

    def __init__(self, steps: tuple[tuple[str, Callable[[], None]], ...] = STEPS) -> None:
        self.steps = steps
        self.done: list[str] = []
        self.cpu_s = 0.0
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClosingWarmup:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Begin the steps in the background (once; not when CALIB_CLOSING_WARMUP is off)."""
        if self._thread is not None or self._stop.is_set() or not enabled():
            return
        self._thread = threading.Thread(target=self._run, name="closing-warmup", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No further step starts (the running one ends on its own; the thread is a daemon)."""
        self._stop.set()

    def finish(self, timeout: float = FINISH_TIMEOUT_S) -> bool:
        """No further step starts; wait for the running one (up to `timeout` seconds). True when the thread ended
        (or never started)."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every step (as a long enough trial phase would; benchmarks and tests). True when the thread
        ended (or never started)."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        start = time.thread_time()
        with contextlib.suppress(Exception):  # a lower priority for this thread alone (Linux: a thread's own id)
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WARMUP_NICENESS)
        try:
            for name, step in self.steps:
                if self._stop.is_set():
                    return
                try:
                    step()
                except Exception as exc:  # the closing imports what is missing itself, and says what failed
                    self.error = f"{name}: {type(exc).__name__}: {exc}"
                    log.debug("closing warm-up stopped at %s", self.error)
                    return
                self.done.append(name)
        finally:
            self.cpu_s = time.thread_time() - start

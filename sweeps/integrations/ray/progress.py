"""What the sweep prints while it runs, made for people.

- `ProgressCallback`: one line each time a trial ends: trials done / total, time elapsed and an
  estimate of the time left, the trial's headline metrics and the best trials so far.
- `StatusReporter`: Ray Tune's status table every `every_s` seconds with the columns that matter
  here (calibrator, its learning rate, epoch, validation accuracy and ECE); no table at the end
  (the leaderboard follows). Ray 2.60's default ("new") output ignores a `progress_reporter` and
  prints a box of every metric for each finished trial, so `quiet_output` switches Tune to its
  classic engine (`RAY_AIR_NEW_OUTPUT=0`, as Ray's own custom-reporter examples do) for this one.
- `quiet_output`: the third-party chatter fixed at its source for the duration of a sweep (see there).
  `--verbose` skips it and keeps Tune's default output.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray import tune
from ray.tune import CLIReporter

from sweeps.config import SelectionConfig
from sweeps.contract import OUT_OF_MEMORY, STOPPED_EARLY, error_ending, failure_reason, is_number
from sweeps.decide.selection import RULES, TrialRecord, select
from sweeps.integrations.ray.retries import error_record, error_text
from sweeps.trial_params import describe_params


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class ProgressCallback(tune.Callback):
    """Prints '[done/total trials, elapsed, about T left] ... best so far: ...' (the sweep's own rule)."""

    def __init__(self, total: int, selection: SelectionConfig, offset: int = 0) -> None:
        self.total = total
        self.offset = offset  # trials finished in earlier Tune experiments of the sweep (a grown sweep)
        self.selection = selection
        self._t0: float | None = None
        self._done_at_start: int | None = None

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """The clock starts with the experiment (a resumed sweep's earlier trials do not count for the rate)."""
        self._t0 = time.monotonic()

    def continue_from(self, offset: int) -> None:
        """A further Tune experiment of the same sweep (a growth) starts with `offset` trials already finished."""
        self.offset, self._done_at_start = offset, None

    def timing(self, finished: int) -> str:
        """'elapsed, about T left' from the rate of the trials finished in this session."""
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if self._done_at_start is None:
            self._done_at_start = finished - 1
        elapsed = now - self._t0
        here = finished - self._done_at_start
        left = self.total - finished
        if left <= 0:
            return f"{_clock(elapsed)} elapsed"
        return f"{_clock(elapsed)} elapsed, about {_clock(elapsed / max(here, 1) * left)} left"

    def _line(self, trials: list, trial: Any, what: str) -> None:
        records = []
        for t in trials:
            r = t.last_result or {}
            if t.status == "TERMINATED" or t is trial:
                records.append(
                    TrialRecord(
                        trial_id=t.trial_id,
                        label=describe_params(t.config),
                        status=str(r.get("status", "")),
                        metrics={k: float(v) for k, v in r.items() if k.startswith("val_") and is_number(v)},
                    )
                )
        # the trial reported here counts once, whether Tune has marked it ended yet or not (it has by on_trial_error)
        ended = sum(t.status in ("TERMINATED", "ERROR") for t in trials if t is not trial)
        finished = min(self.offset + ended + 1, self.total)
        best_txt = self._best_text(records)
        print(
            f"[{finished}/{self.total} trials done, {self.timing(finished)}] {describe_params(trial.config)}: "
            f"{what}; {best_txt}",
            flush=True,
        )

    def _best_text(self, records: list[TrialRecord]) -> str:
        ok = [r for r in records if r.ok]
        if not ok:
            return "no completed trial yet"
        if RULES[self.selection.rule].needs_replicates:
            # the rule needs every trial's predictions (read at the end); say what is known now
            acc = max(ok, key=lambda r: r.metrics["val_accuracy"])
            cal = min(ok, key=lambda r: r.metrics["val_ece"])
            return (
                f"most accurate so far: {acc.label} (val acc {acc.metrics['val_accuracy']:.4f}); "
                f"lowest val ECE so far: {cal.label} ({cal.metrics['val_ece']:.4f})"
            )
        best, _ = select(records, self.selection)
        return (
            f"best so far: {best.label} (val acc {best.metrics['val_accuracy']:.4f}, "
            f"val ECE {best.metrics['val_ece']:.4f})"
        )

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a finished (or diverged) trial."""
        r = trial.last_result or {}
        status = r.get("status", "stopped")
        if status == "completed":
            what = f"val acc {r.get('val_accuracy', float('nan')):.4f}, val ECE {r.get('val_ece', float('nan')):.4f}"
        elif status == STOPPED_EARLY:  # a scheduler decision, not a failure: the reason says it all
            what = r.get("reason") or "stopped early by the scheduler"
        else:
            what = failure_reason(str(status), str(r.get("reason") or ""))
        self._line(trials, trial, what)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Report a trial that failed after its retries: why (one that ran out of memory says so), and where Tune
        keeps its traceback (not printed without --verbose)."""
        failures = int(getattr(trial, "num_failures", 0) or 0)
        status, reason = error_ending(error_text(trial), failures)
        if status != OUT_OF_MEMORY:
            where = f"; its traceback: {error_record(trial)}" if getattr(trial, "error_file", None) else ""
            reason = f"ERROR after {failures} failure{'' if failures == 1 else 's'}, no retry left: {reason}{where}"
        self._line(trials, trial, reason)


STATUS_EVERY_ENV = "CALIB_SWEEP_STATUS_S"  # seconds between two status tables (default 30)


class StatusReporter(CLIReporter):
    """Tune's status table with calibrator / lr columns and the headline metrics, every `every_s` seconds."""

    def __init__(self, extra_params: list[str] | tuple[str, ...] = (), every_s: float | None = None) -> None:
        if every_s is None:
            every_s = float(os.environ.get(STATUS_EVERY_ENV, "30"))
        params = {"calibrator": "calibrator", "calibrator_lr": "lr"}
        params.update({k: k.split(".")[-1] for k in extra_params})
        super().__init__(
            parameter_columns=params,
            metric_columns={"epoch": "epoch", "val_accuracy": "val acc", "val_ece": "val ECE"},
            max_report_frequency=int(every_s),
            print_intermediate_tables=True,
            max_progress_rows=20,
            max_error_rows=5,
            max_column_length=24,
        )
        self._every_s = every_s
        self._next_report = time.monotonic() + every_s  # the first table after `every_s`, not one of PENDING trials
        self._last_state: tuple = ()

    def should_report(self, trials: list, done: bool = False) -> bool:
        """At most every `every_s` seconds while trials run, and only when a trial's status or epoch changed
        since the last table; not at the end (the leaderboard says it better)."""
        now = time.monotonic()
        if done or now < self._next_report:
            return False
        state = tuple((t.trial_id, t.status, (t.last_result or {}).get("epoch")) for t in trials)
        if state == self._last_state:
            return False
        self._last_state, self._next_report = state, now + self._every_s
        return True

    def _current_best_trial(self, trials: list) -> tuple[None, None]:
        # Tune's "Current best trial" line looks every parameter column up in the best trial's config without a
        # default, and a reference arm (CE with early stopping) has no calibrator_lr: the lookup raised KeyError
        # and ended the sweep. The sweep's own progress line names the best so far, by its rule.
        return None, None

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        """The table and the resources in use; not the scheduler's name, nor Tune's driver staging folder
        ("Result logdir", which is not where results are kept: the sweep names that folder at the start)."""
        resources = [s for s in sys_info if s.startswith("Logical resource usage")]
        text = self._progress_str(trials, done, *resources)
        print("\n".join(ln for ln in text.rstrip().splitlines() if not ln.startswith("Result logdir:")), flush=True)


# Loggers whose lines say nothing a person running a sweep needs (each silenced here by name, up to
# WARNING, or ERROR for the last): MLflow creating its tables in a new store; MLflow checking the
# champion's input example; Ray announcing that the local cluster it starts uses token
# authentication (its default since 2.52; setting RAY_AUTH_MODE=token instead would silence it too,
# but Ray reads that variable when it is imported); Ray Train's "Checkpoint successfully created"
# (once per epoch per trial, in the trial processes: sweeps.integrations.ray.trainable applies QUIET_WORKER_LOGGERS).
QUIET_DRIVER_LOGGERS = {
    "mlflow.store.db.utils": logging.WARNING,
    "mlflow.pyfunc": logging.WARNING,
    "ray._private.authentication.authentication_token_setup": logging.ERROR,
}
QUIET_WORKER_LOGGERS = ("ray.train._internal.storage",)
TUNE_RUN_LOGGER = "ray.tune.tune"


class _AlreadySaid(logging.Filter):
    """Drops Tune's "Trials did not complete: [...]" (ERROR, at the end of a fit with failed trials): each of those
    trials had its line (ProgressCallback.on_trial_error) and has its row in the leaderboard."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Trials did not complete")


@contextmanager
def quiet_output(enabled: bool = True) -> Iterator[None]:
    """For the duration of a sweep: Tune's classic output engine (so StatusReporter applies), MLflow's
    artifact-download progress bars off (its documented MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR),
    Optuna at WARNING (its documented set_verbosity: no "A new study created" line; the service says
    where the study is), the loggers above. Everything is restored afterwards."""
    if not enabled:
        yield
        return
    import optuna

    # TUNE_PRINT_ALL_TRIAL_ERRORS (read when Tune's fit starts): no traceback on stderr for each failed trial; the
    # sweep says why in one line (integrations/ray/retries.py, on_trial_error) and the traceback stays in error.txt
    env = {
        "RAY_AIR_NEW_OUTPUT": "0",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "TUNE_PRINT_ALL_TRIAL_ERRORS": "0",
    }
    saved_env = {k: os.environ.get(k) for k in env}
    loggers = {name: logging.getLogger(name) for name in QUIET_DRIVER_LOGGERS}
    saved_levels = {name: lg.level for name, lg in loggers.items()}
    saved_optuna = optuna.logging.get_verbosity()
    os.environ.update(env)
    for name, lg in loggers.items():
        lg.setLevel(QUIET_DRIVER_LOGGERS[name])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    said = _AlreadySaid()
    logging.getLogger(TUNE_RUN_LOGGER).addFilter(said)
    try:
        yield
    finally:
        logging.getLogger(TUNE_RUN_LOGGER).removeFilter(said)
        optuna.logging.set_verbosity(saved_optuna)
        for name, lg in loggers.items():
            lg.setLevel(saved_levels[name])
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

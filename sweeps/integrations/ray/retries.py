"""One line when a trial fails and Ray Tune retries it: which trial, why in a few words, from where it goes on.

Ray Tune retries a failed trial (`resources.max_failures`) from its last checkpoint, and says so with a full
traceback on stderr, plus, when the trial's worker process died, Ray's paragraph on stdout about OOM killers and
`ray stop --force`. A person needs three facts: which trial, why (its node died, its process ended without a word,
Ray's memory monitor killed it, or its own error's last line: sweeps/contract.py `failure_words`) and what happens
now. Without --verbose the traceback and the paragraph are not printed (sweeps/integrations/ray/progress.py
`quiet_output`, sweeps/integrations/ray/worker_logs.py); the traceback stays in the trial's `error.txt`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune

from sweeps.contract import failure_words, is_number
from sweeps.trial_params import trial_label


def error_text(trial: Any) -> str:
    """The text of the trial's Tune error file ("" when it has none)."""
    err = getattr(trial, "error_file", None)
    return Path(err).read_text(errors="replace") if err and Path(err).is_file() else ""


def error_record(trial: Any) -> str:
    """Where the trial's error file stays: in its folder of the sweep's storage path (Tune copies it there from the
    session's staging folder, which goes with Ray), else where Tune wrote it."""
    folder = getattr(trial, "path", None)
    name = Path(str(getattr(trial, "error_file", "") or "")).name
    return f"{str(folder).rstrip('/')}/{name}" if folder and name else str(getattr(trial, "error_file", ""))


def retry_line(trial: Any, max_failures: int) -> str:
    """The line for a trial Tune is about to retry after a failure."""
    epoch = (getattr(trial, "last_result", None) or {}).get("epoch")
    when = f"after epoch {int(epoch)}" if is_number(epoch) else "before its first epoch"
    then = (
        "it retries from its last checkpoint"
        if getattr(trial, "checkpoint", None) is not None
        else "it starts again from the beginning (no checkpoint yet)"
    )
    failures = int(getattr(trial, "num_failures", 0) or 0)
    return (
        f"{trial_label(trial)} failed {when}: {failure_words(error_text(trial))}; {then} "
        f"(failure {failures}; resources.max_failures = {max_failures})"
    )


class TrialRetryCallback(tune.Callback):
    """Prints `retry_line` each time Tune recovers a trial (on_trial_recover: a retry follows)."""

    def __init__(self, max_failures: int, say: Callable[[str], None] | None = None) -> None:
        self.max_failures = max_failures
        self._say = say if say is not None else (lambda line: print(line, flush=True))

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial failed and will be retried."""
        self._say(retry_line(trial, self.max_failures))

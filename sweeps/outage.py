"""Waiting out a server the sweep cannot reach: one policy for every store it talks to (imports nothing here).

The MLflow tracking server (sweeps/integrations/mlflow/store.py) and the Optuna study's database
(sweeps/integrations/optuna/storage.py) each wrap their client calls in an `OutageRetry`, saying what is
down, which config field bounds the wait, how to tell an outage from a wrong call and which error ends the
wait. The policy: exponential backoff (1 s doubling to 10 s), one line when the server goes away (not one per
retry) and one when it is back; past the limit since the first failure, the store's `Unavailable` error with a
one-line reason naming the field and `--resume`, after which the sweep stops, resumable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

FIRST_WAIT_S = 1.0  # the first retry after a failed call; doubled each time
MAX_WAIT_S = 10.0  # ... up to this (the server is noticed back at most this late)
GIVE_UP_POLL_S = 0.5  # how often a wait looks at `give_up` (a stop signal ends it within this)


class Unavailable(RuntimeError):
    """A server stayed unreachable past its outage limit: the sweep stops, resumable with --resume."""


class OutageWaitStopped(RuntimeError):
    """The sweep is being stopped (Ctrl+C, SIGTERM) while a call waited for a server: the wait ends at once."""


def _say(line: str) -> None:
    print(line, flush=True)


class OutageRetry:
    """Retries calls that fail for an unreachable server, with exponential backoff, up to a limit.

    `what` names the server in the lines ("MLflow tracking server"), `where` its redacted address, `field`
    the config field holding `limit_s`; `is_outage(exc)` tells a failed connection from a wrong call (raised
    at once); `error` is raised past the limit. Safe to share between threads: one line per outage whichever
    thread notices it. `give_up()` (optional), looked at while waiting, ends the wait with OutageWaitStopped.
    A call that failed past the limit makes later calls of the same outage fail at once, without waiting.
    """

    def __init__(
        self,
        what: str,
        where: str,
        field: str,
        limit_s: float,
        is_outage: Callable[[BaseException], bool],
        error: type[Exception] = Unavailable,
        say: Any = None,
        sleep: Any = time.sleep,
        clock: Any = time.monotonic,
        give_up: Callable[[], bool] | None = None,
    ) -> None:
        self.what, self.where, self.field, self.limit_s = what, where, field, limit_s
        self.is_outage, self.error = is_outage, error
        self.say = say if say is not None else _say
        self.sleep, self.clock, self.give_up = sleep, clock, give_up
        self.down_since: float | None = None  # start of the current outage
        self.stopped = False  # the limit was passed: the sweep is stopping
        self._lock = threading.Lock()

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), retried while the server is unreachable."""
        wait = FIRST_WAIT_S
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:
                if not self.is_outage(exc):
                    raise
                waited = self._failed()
                if waited >= self.limit_s:
                    self.stopped = True
                    raise self.error(
                        f"{self.what} {self.where} unreachable for {waited:.0f} s, past "
                        f"{self.field}={self.limit_s:g}; the sweep stopped, continue it with "
                        "--resume once the server is back"
                    ) from None
                self._wait(min(wait, MAX_WAIT_S, self.limit_s - waited))
                wait *= 2
                continue
            self._succeeded()
            return out

    def _failed(self, how: str = "unreachable") -> float:
        """Seconds since the outage began, announcing it (`how` the server fails) when this failure is its first."""
        with self._lock:
            now = self.clock()
            if self.down_since is None:
                self.down_since = now
                self.say(
                    f"{self.what} {self.where} {how}; the sweep waits for it "
                    f"(retrying with backoff, up to {self.limit_s:g} s: {self.field})"
                )
            return float(now - self.down_since)

    def _succeeded(self) -> None:
        with self._lock:
            if self.down_since is not None:
                self.say(f"{self.what} is back after {self.clock() - self.down_since:.0f} s; the sweep goes on")
                self.down_since = None
                self.stopped = False

    def _wait(self, seconds: float) -> None:
        if self.give_up is None:
            self.sleep(seconds)
            return
        left = seconds
        while left > 0:
            if self.give_up():
                raise OutageWaitStopped(f"the sweep is stopping; it no longer waits for {self.what} {self.where}")
            step = min(GIVE_UP_POLL_S, left)
            self.sleep(step)
            left -= step
        if self.give_up():
            raise OutageWaitStopped(f"the sweep is stopping; it no longer waits for {self.what} {self.where}")

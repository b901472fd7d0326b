"""What the Ray workers print, as the driver forwards it: a worker's SIGTERM teardown is not for people.

Ray stops a worker with SIGTERM (an actor Tune has finished with, the idle workers at shutdown), and the
worker's handler raises SystemExit wherever Python happens to be. When that is a garbage-collection callback,
Python prints "Exception ignored in ... SystemExit: 1" to the worker's stderr and the driver forwards it: a
traceback after a sweep that went well. The filter drops exactly such blocks (a traceback through Ray's
`sigterm_handler` ending in SystemExit) and passes every other line, other tracebacks included, unchanged, but one:
Ray Tune's "Restored on <ip> from checkpoint: Checkpoint(...)", which a trial's worker logs (twice, through two
handlers) when it resumes. The sweep says that in its own words (a lost worker or node, `--resume`), and the
checkpoint's path is Tune's bookkeeping, not the user's. Abseil's mutex event log ("[mutex.cc : 452] RAW: Lock
blocking 0x... @ 0x..."), which Ray's C++ core in a worker sometimes writes to stderr (seen once in CI on a sweep that
went well), is dropped too: addresses of a lock in Ray's own code say nothing to people. Abseil's other raw lines (a
potential deadlock, a failed check) pass.

The raylet's notice that "A worker died or was killed while executing a task" (a paragraph on OOM killers and `ray
stop --force`, which Ray's error subscriber prints on the driver's stdout) is dropped too: the sweep's own line
says which trial failed and why (integrations/ray/retries.py). Other notices of the raylet pass.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

_STARTS = re.compile(r"^(Exception ignored in|Traceback \(most recent call last\):)")
_CHAINS = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
_TEARDOWN = "sigterm_handler"
_RESTORED = re.compile(r"\bRestored on \S+ from checkpoint: Checkpoint\(")  # ray.tune.Trainable.restore's info line
# abseil's PostSynchEvent lines: "Lock", "Unlock", "ReaderLock blocking", "TryLock failed", "Wait on", "SignalAll on"...
_MUTEX_EVENT = re.compile(r"^\[mutex\.cc : \d+\] RAW: (Reader)?(Try)?(Lock|Unlock|Wait|Signal)")
_HANDLER = "ray_print_logs"  # the name ray.init gives the driver's printing handler
_WORKER_DIED = "A worker died or was killed while executing a task"  # the raylet's notice (ray._raylet)


class TeardownFilter:
    """Drops SIGTERM teardown tracebacks, Tune's restore line and abseil's mutex events from workers' stderr; a block
    split over batches waits for its end."""

    def __init__(self) -> None:
        self._pending: dict[Any, list[str]] = {}  # per worker stream: an unfinished block's lines

    def lines(self, stream: Any, lines: list[str]) -> list[str]:
        """The `lines` of one batch from `stream` (a worker's stderr) that people should see."""
        shown: list[str] = []
        block = self._pending.pop(stream, None)
        ended = False  # the block has had an exception line; blank lines or a chained traceback may follow
        for line in lines:
            if block is not None and ended and line.strip() and not _CHAINS.match(line):
                shown.extend(_shown(block))
                block, ended = None, False
            if block is None:
                if _STARTS.match(line):
                    block = [line]
                elif not (_RESTORED.search(line) or _MUTEX_EVENT.match(line)):
                    shown.append(line)
                continue
            block.append(line)
            if _CHAINS.match(line):
                ended = False
            elif not _continues(line):
                ended = True
        if block is not None and ended:  # a finished block is not held for a chain that may never come
            shown.extend(_shown(block))
        elif block is not None:
            self._pending[stream] = block
        return shown

    def flush(self) -> dict[Any, list[str]]:
        """The unfinished blocks, by stream (shown as they are: their end never came)."""
        pending, self._pending = self._pending, {}
        return pending


def _continues(line: str) -> bool:
    """Whether a line inside a traceback block is not yet its final exception line."""
    return not line.strip() or line[0].isspace() or bool(_STARTS.match(line) or _CHAINS.match(line))


def _shown(block: list[str]) -> list[str]:
    """A finished block as people see it: nothing if it is a SIGTERM teardown, else whole."""
    raised = [ln for ln in block if ln.strip() and not _continues(ln)]
    teardown = all(ln.startswith("SystemExit") for ln in raised) and any(_TEARDOWN in ln for ln in block)
    return [] if teardown else block


@contextlib.contextmanager
def hide_worker_teardown() -> Iterator[None]:
    """While the sweep runs, the driver's printing of worker output skips SIGTERM teardown tracebacks (every
    printing handler ray.init installed in this process, each with its own filter), and the raylet's worker-death
    notice is not printed (Ray's error subscriber calls ray._private.worker.print_to_stdstream by name)."""
    import ray._private.worker as ray_worker
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    with dispatcher._lock:
        originals = [fn for name, fn in dispatcher.handlers if name == _HANDLER]
    wrapped = [_Filtered(fn) for fn in originals]  # none when Ray forwards nothing here (log_to_driver=False)
    for w in wrapped:
        _swap(dispatcher, w.print_logs, w)
    notices = _WithoutWorkerDeaths(ray_worker.print_to_stdstream)
    ray_worker.print_to_stdstream = notices
    try:
        yield
    finally:
        if ray_worker.print_to_stdstream is notices:
            ray_worker.print_to_stdstream = notices.print_to_stdstream
        for w in wrapped:
            if _swap(dispatcher, w, w.print_logs):  # still connected: what never finished is shown as it is
                w.flush()


class _WithoutWorkerDeaths:
    """Ray's print_to_stdstream, without the raylet's "A worker died or was killed while executing a task" notice."""

    def __init__(self, print_to_stdstream: Callable[..., None]) -> None:
        self.print_to_stdstream = print_to_stdstream

    def __call__(self, data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet" and data.get("lines"):
            lines = [ln for ln in data["lines"] if not str(ln).startswith(_WORKER_DIED)]
            if not lines:
                return
            data = {**data, "lines": lines}
        self.print_to_stdstream(data, ignore_prefix)


class _Filtered:
    """One printing handler of Ray's, behind a TeardownFilter of its own."""

    def __init__(self, print_logs: Callable[[dict[str, Any]], None]) -> None:
        self.print_logs = print_logs
        self.teardown = TeardownFilter()
        self.last: dict[Any, dict[str, Any]] = {}  # per stream, its last batch (what a flushed block is printed as)

    def __call__(self, data: dict[str, Any]) -> None:
        if data.get("is_err") and data.get("lines"):
            stream = (data.get("ip"), data.get("pid"))
            self.last[stream] = data
            data = {**data, "lines": self.teardown.lines(stream, list(data["lines"]))}
            if not data["lines"]:
                return
        self.print_logs(data)

    def flush(self) -> None:
        """Print what is held of unfinished blocks, as it is."""
        for stream, lines in self.teardown.flush().items():
            self.print_logs({**self.last[stream], "lines": lines})


def _swap(dispatcher: Any, old: Callable[..., Any], new: Callable[..., Any]) -> bool:
    """Replace the printing handler `old` by `new` in place; False when `old` is gone (Ray shut down)."""
    with dispatcher._lock:
        handlers = list(dispatcher.handlers)
        hit = [i for i, (name, fn) in enumerate(handlers) if name == _HANDLER and fn is old]
        for i in hit:
            handlers[i] = (_HANDLER, new)
        dispatcher.handlers = handlers
    return bool(hit)

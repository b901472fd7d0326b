"""Run a function on several threads at once and get its results (or its first error)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_on_threads(fn: Callable[[], T], n: int) -> list[T]:
    """Start ``n`` threads running ``fn`` together; return their results, or raise the first error."""
    results: list[T] = []
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def work() -> None:
        try:
            start.wait()
            results.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results

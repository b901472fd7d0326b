"""A worker's SIGTERM teardown traceback and Tune's restore line are not forwarded to people; every other line,
tracebacks included, is."""

from __future__ import annotations

import sys
import time

import pytest
from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

from sweeps.integrations.ray.worker_logs import TeardownFilter, hide_worker_teardown

# what a trial actor printed in CI (Ray 2.60, Python 3.11) when SIGTERM came during a garbage-collection callback
TEARDOWN = [
    "Exception ignored in: <function WeakSet.__init__.<locals>._remove at 0x7f451d3f25c0>",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/_weakrefset.py", line 39, in _remove',
    "    def _remove(item, selfref=ref(self)):",
    "",
    '  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1063, in sigterm_handler',
    "    raise_sys_exit_with_custom_error_message(",
    '  File "python/ray/_raylet.pyx", line 712, in ray._raylet.raise_sys_exit_with_custom_error_message',
    "SystemExit: 1",
]
REAL = [
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 3, in <module>',
    "    loss.backward()",
    "RuntimeError: CUDA error: out of memory",
]


def test_teardown_block_is_dropped_and_lines_around_it_kept():
    f = TeardownFilter()
    assert f.lines("w", ["epoch 1 done", *TEARDOWN, "bye"]) == ["epoch 1 done", "bye"]
    assert f.flush() == {}


def test_other_tracebacks_pass_whole():
    f = TeardownFilter()
    assert f.lines("w", [*REAL, "next"]) == [*REAL, "next"]
    # a SystemExit raised by the user's own code (not Ray's SIGTERM handler) is shown too
    own = ["Traceback (most recent call last):", '  File "/app/t.py", line 9, in main', "    sys.exit(1)"]
    own.append("SystemExit: 1")
    assert f.lines("w", own) == own
    # a chained traceback whose first part mentions SIGTERM but ends in another error is a real error
    chained = [*TEARDOWN[1:-1], "SystemExit: 1", ""]
    chained += ["During handling of the above exception, another exception occurred:", "", *REAL]
    assert f.lines("w", chained) == chained
    # and a teardown with blank lines after it is still one block, dropped
    assert f.lines("w", [*TEARDOWN, "", "", "next"]) == ["next"]


# what a retried trial's worker printed twice on the terminal in the node-loss test (Ray 2.60's Trainable.restore)
RESTORED = (
    "Restored on 192.0.2.2 from checkpoint: Checkpoint(filesystem=local, path=/tmp/shared/node-loss/"
    "train_trial_4c7ea930_2_calibrator=vector,calibrator_lr=0.0598_2026-12-05_12-24-02/checkpoint_000019)"
)


def test_tune_s_restore_line_is_dropped_and_nothing_else():
    f = TeardownFilter()
    assert f.lines("w", [RESTORED, "epoch 20 done", RESTORED]) == ["epoch 20 done"]
    # the words elsewhere, or a traceback that mentions them, are the user's and pass
    own = ["Restored on the second try", "the model was Restored on 2 GPUs"]
    assert f.lines("w", own) == own
    tb = [*REAL[:-1], f"ValueError: {RESTORED}"]
    assert f.lines("w", tb) == tb


# what a worker printed on the driver's stderr in CI during a demo sweep that went well
MUTEX_EVENTS = [
    "[mutex.cc : 452] RAW: Lock blocking 0x55d1e282ca90   @ 0x7faf5a22b1a2 0x7faf592fb23c 0x7faf59bc2022",
    "[mutex.cc : 452] RAW: Lock returning 0x55d1e282ca90   @ 0x7faf5a22b1a2 0x7faf592fb23c 0x7faf59bc2022",
    "[mutex.cc : 452] RAW: Unlock 0x55d1e282ca90   @ 0x7faf59bc2125 0x7faf5a24c3b0",
    "[mutex.cc : 452] RAW: ReaderTryLock failed 0x55d1e282ca90   @ 0x7faf59bc2125",
    "[mutex.cc : 452] RAW: SignalAll on 0x55d1e282ca90   @ 0x7faf59bc2125",
]


def test_abseil_mutex_events_are_dropped_and_its_warnings_pass():
    f = TeardownFilter()
    assert f.lines("w", ["epoch 1 done", *MUTEX_EVENTS, "epoch 2 done"]) == ["epoch 1 done", "epoch 2 done"]
    # abseil's warnings are not events and pass, as does the user's own mention of the words
    kept = [
        "[mutex.cc : 1384] RAW: Potential Mutex deadlock: ",
        "[mutex.cc : 1400] RAW: Check failed: mu->Lock held",
        "my [mutex.cc : 452] RAW: Lock notes",
    ]
    assert f.lines("w", kept) == kept


def test_block_split_over_batches_and_streams():
    f = TeardownFilter()
    assert f.lines("a", TEARDOWN[:4]) == []  # held: its end has not come
    assert f.lines("b", ["other worker"]) == ["other worker"]  # another stream is not held back
    assert f.lines("a", [*TEARDOWN[4:], "after"]) == ["after"]
    assert f.lines("a", REAL[:2]) == []
    assert f.flush() == {"a": REAL[:2]}  # never finished: shown as it is


def test_driver_printing_skips_teardown_and_is_restored():
    """Through Ray's own dispatcher as ray.init sets it up: the handler ray_print_logs is wrapped, then put back."""
    printed: list[dict] = []
    earlier: list[dict] = []  # a printing handler an earlier ray.init of this process left (a long-lived driver)

    def print_logs(data):
        printed.append(data)

    saved = list(dispatcher.handlers)
    dispatcher.add_handler("ray_print_logs", earlier.append)
    dispatcher.add_handler("ray_print_logs", print_logs)
    try:
        base = {"ip": "10.0.0.1", "pid": 8087, "actor_name": "train_trial", "job": "01000000"}
        with hide_worker_teardown():
            dispatcher.emit({**base, "is_err": True, "lines": TEARDOWN})
            dispatcher.emit({**base, "is_err": False, "lines": ["Traceback (most recent call last):"]})  # stdout as is
            dispatcher.emit({**base, "is_err": True, "lines": ["warning: x", *REAL[:2]]})
        for seen in (printed, earlier):
            assert [d["lines"] for d in seen] == [["Traceback (most recent call last):"], ["warning: x"], REAL[:2]]
            assert seen[-1]["actor_name"] == "train_trial"  # the unfinished block keeps its worker's prefix
        assert [fn for name, fn in dispatcher.handlers if name == "ray_print_logs"][-2:] == [earlier.append, print_logs]
    finally:
        dispatcher.handlers = saved


@pytest.mark.slow
def test_real_ray_worker_output(capfd):
    """A real Ray worker's stderr, as the driver prints it: the teardown block is gone, a real error is whole."""
    import ray

    ray.init(include_dashboard=False, num_cpus=1, logging_level="WARNING")
    try:

        @ray.remote
        def noisy(lines: list[str]) -> None:
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()

        with hide_worker_teardown():
            ray.get(noisy.remote(["before", *TEARDOWN, "after"]))
            ray.get(noisy.remote(REAL))
            deadline = time.monotonic() + 30
            seen = ""
            while REAL[-1] not in seen and time.monotonic() < deadline:  # the log monitor forwards within a second
                time.sleep(0.5)
                seen += capfd.readouterr().err
    finally:
        ray.shutdown()
    printed = [ln.split(")", 1)[-1].removeprefix("\x1b[0m ").strip() for ln in seen.splitlines() if "noisy pid=" in ln]
    assert printed == ["before", "after", *[ln.strip() for ln in REAL]], seen

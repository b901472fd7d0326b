"""A trial that fails: why in a few words from Ray's own error texts (real ActorDiedError and RayTaskError
instances), the one line when Tune retries it (sweeps/integrations/ray/retries.py), the line when it has no retry
left (ProgressCallback.on_trial_error), and what Ray and Tune would otherwise print: the raylet's worker-death
notice and Tune's "Trials did not complete" error are not shown, every other line is. The sweep: the killed-trial
case of tests/e2e/test_sweep_faults.py (slow)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import ray._private.worker as ray_worker
import ray.exceptions as rx
from ray.core.generated.common_pb2 import ActorDiedErrorContext

from sweeps.config import SelectionConfig
from sweeps.contract import error_ending, failure_words
from sweeps.integrations.ray.progress import TUNE_RUN_LOGGER, ProgressCallback, quiet_output
from sweeps.integrations.ray.retries import TrialRetryCallback, error_record, retry_line
from sweeps.integrations.ray.worker_logs import hide_worker_teardown

# Ray's exit detail for a worker process that vanished (SIGKILL, a segfault, the kernel's OOM killer), as it is
QUIET_EXIT = (
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
    "unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was "
    "killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed."
)


def _actor_died(message: str) -> str:
    """The text Tune writes to error.txt for a real ActorDiedError with Ray's `message`."""
    ctx = ActorDiedErrorContext(error_message=message, actor_id=b"\x01" * 16, class_name="ImplicitFunc", pid=7)
    return f"Failure # 1 (occurred at 2026-12-06_03-05-08)\n{rx.ActorDiedError(cause=ctx)}\n"


def _task_error(exc: Exception) -> str:
    """The text Tune writes for a trial's own exception (Ray's RayTaskError around it)."""
    try:
        raise exc
    except Exception as e:  # noqa: BLE001 - the real traceback Ray wraps
        wrapped = rx.RayTaskError("train", __import__("traceback").format_exc(), e)
    return f"Failure # 1 (occurred at 2026-12-06_03-05-08)\n{wrapped}\n"


def test_failure_words_from_ray_s_own_error_texts():
    assert failure_words(_actor_died(QUIET_EXIT)) == "its worker process ended without a word (killed, or crashed)"
    node = "The actor died because its node has died. Node Id: 5b1e..."
    assert failure_words(_actor_died(node)) == "its node died"
    exited = (
        "The actor is dead because its worker process has died. Worker exit type: USER_ERROR Worker exit detail: "
        "Worker exits with an exit code 3. The worker may have exceeded K8s pod memory limits."
    )
    assert failure_words(_actor_died(exited)) == "its worker process exited (Worker exits with an exit code 3)"
    assert failure_words(_task_error(ValueError("bad shape (3, 4)"))) == "ValueError: bad shape (3, 4)"
    # the last failure of a file with two: Tune appends one block per failure
    both = _task_error(ValueError("first")) + _actor_died(QUIET_EXIT).replace("# 1", "# 2")
    assert failure_words(both) == "its worker process ended without a word (killed, or crashed)"
    assert failure_words("") == "trial errored"
    # what the tracking callback tags a FAILED run with: the same words, not Ray's paragraph
    assert error_ending(_actor_died(QUIET_EXIT), attempts=3) == ("errored", failure_words(_actor_died(QUIET_EXIT)))


def _trial(tmp_path, text: str, epoch: int | None, checkpoint: object | None, failures: int) -> SimpleNamespace:
    folder = tmp_path / "train_trial_ab12_1"
    staged = tmp_path / "session" / "driver_artifacts" / "train_trial_ab12_1"
    staged.mkdir(parents=True)
    (staged / "error.txt").write_text(text)
    return SimpleNamespace(
        trial_id="ab12",
        config={"calibrator": "vector", "calibrator_lr": 0.0021},
        last_result=None if epoch is None else {"epoch": epoch},
        checkpoint=checkpoint,
        error_file=str(staged / "error.txt"),
        path=str(folder),
        num_failures=failures,
        status="RUNNING",
    )


def test_the_retry_line_names_the_trial_why_and_where_it_goes_on(tmp_path):
    said: list[str] = []
    trial = _trial(tmp_path, _actor_died(QUIET_EXIT), epoch=2, checkpoint=object(), failures=1)
    TrialRetryCallback(2, say=said.append).on_trial_recover(0, [trial], trial)
    assert said == [
        "vector lr=2.1e-03 failed after epoch 2: its worker process ended without a word (killed, or crashed); it "
        "retries from its last checkpoint (failure 1; resources.max_failures = 2)"
    ]
    fresh = _trial(tmp_path / "b", _task_error(RuntimeError("boom")), epoch=None, checkpoint=None, failures=2)
    assert retry_line(fresh, 3) == (
        "vector lr=2.1e-03 failed before its first epoch: RuntimeError: boom; it starts again from the beginning "
        "(no checkpoint yet) (failure 2; resources.max_failures = 3)"
    )


def test_a_trial_out_of_retries_says_why_and_where_its_traceback_is(tmp_path, capsys):
    progress = ProgressCallback(2, SelectionConfig(rule="min_metric", metric="val_ece"))
    other = SimpleNamespace(trial_id="cd34", config={"calibrator": "ce_es"}, last_result=None, status="RUNNING")
    dead = _trial(tmp_path, _actor_died(QUIET_EXIT), epoch=2, checkpoint=None, failures=1)
    dead.status = "ERROR"  # Tune marks it before or after the callback: it counts once either way
    progress.on_trial_error(0, [other, dead], dead)
    line = capsys.readouterr().out.strip()
    assert line.startswith("[1/2 trials done, "), line
    assert (
        "vector lr=2.1e-03: ERROR after 1 failure, no retry left: its worker process ended without a word (killed, or "
        f"crashed); its traceback: {tmp_path}/train_trial_ab12_1/error.txt; no completed trial yet"
    ) in line, line
    assert error_record(dead) == f"{tmp_path}/train_trial_ab12_1/error.txt"  # the sweep's copy, not Ray's staging


def test_the_raylet_s_worker_death_notice_is_not_printed_and_other_notices_are(monkeypatch):
    printed: list[list[str]] = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data["lines"]))
    original = ray_worker.print_to_stdstream
    notice = "A worker died or was killed while executing a task by an unexpected system error. To troubleshoot..."
    with hide_worker_teardown():
        assert ray_worker.print_to_stdstream is not original
        # as Ray's error subscriber (ray._private.worker.listen_error_messages) calls it, by the module's name
        ray_worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        ray_worker.print_to_stdstream({"lines": ["Task was cancelled"], "pid": "raylet", "is_err": False}, False)
        ray_worker.print_to_stdstream({"lines": [notice], "pid": 4242, "is_err": False}, False)  # a worker's own line
    assert ray_worker.print_to_stdstream is original
    assert printed == [["Task was cancelled"], [notice]]


def test_tune_s_trials_did_not_complete_error_is_not_printed_during_a_sweep(caplog):
    log = logging.getLogger(TUNE_RUN_LOGGER)
    with caplog.at_level(logging.ERROR, logger=TUNE_RUN_LOGGER):
        with quiet_output():
            log.error("Trials did not complete: %s", ["train_trial_ab12"])
            log.error("Something else went wrong")
        log.error("Trials did not complete: %s", ["after the sweep"])
    assert [r.getMessage() for r in caplog.records] == [
        "Something else went wrong",
        "Trials did not complete: ['after the sweep']",
    ]

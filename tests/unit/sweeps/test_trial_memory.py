"""A trial that runs out of memory (issue #36, fault 3), without starting Ray: which errors count as out of memory
(real exception instances: torch's CPU allocator, MemoryError, torch's and Ray's OutOfMemoryError, an actor Ray's
memory monitor killed, Ray's wrapper of a trial's error), what the trainable reports (one final report, FAILED
with its reason, no retry) and what the tracking callback, the progress line and the leaderboard make of it. The
sweep itself: tests/e2e/test_sweep_oom.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray.exceptions as rx
import torch
from ray.core.generated.common_pb2 import ActorDiedErrorContext

from calib_core.config import RunConfig
from calib_core.trainer import Diverged
from sweeps.config import SelectionConfig
from sweeps.contract import (
    ALLOCATION,
    FINAL_FILE,
    MEMORY_MONITOR,
    OUT_OF_MEMORY,
    TAG_REASON,
    TAG_STATUS,
    error_ending,
    failure_reason,
    memory_failure,
)
from sweeps.decide.selection import TrialRecord
from sweeps.integrations.mlflow.store import MlflowStore
from sweeps.integrations.mlflow.tracking import MLflowTrackingCallback
from sweeps.integrations.ray import trainable
from sweeps.integrations.ray.progress import ProgressCallback
from sweeps.report.files import format_leaderboard, leaderboard
from tests.unit.sweeps.test_sweep_asha import MemoryClient

# Past the 47-bit user address space (128 TiB): refused at once whatever the kernel's overcommit setting, nothing
# is touched.
BEYOND_ADDRESS_SPACE = 2**50

# What a call to an actor Ray's memory monitor killed raises in ray 2.60 (seen with the threshold set below the node's
# use): ray.exceptions.OutOfMemoryError with the raylet's message.
MONITOR_MESSAGE = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: a6080360) "
    "was 5.80GB used / 23.54GB limit (0.246364)\nOOM kill reason: Memory usage 6244073472B exceeded threshold"
)
# The actor's death as the GCS words it (its worker's exit type), for calls made once it is known dead.
MONITOR_KILL = (
    "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit "
    "detail: 1 worker(s) were killed due to the node running low on memory."
)


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the instance is what the test wants
        return exc
    raise AssertionError("nothing raised")


def _actor_died(message: str) -> rx.ActorDiedError:
    ctx = ActorDiedErrorContext(error_message=message, actor_id=b"\x01" * 16, class_name="ImplicitFunc", pid=1)
    return rx.ActorDiedError(cause=ctx)


def test_torch_cpu_allocator_failure_is_an_allocation_oom():
    exc = _raised(lambda: torch.empty(BEYOND_ADDRESS_SPACE, dtype=torch.uint8))
    assert type(exc) is RuntimeError
    kind, detail = memory_failure(exc)
    assert kind == ALLOCATION
    assert detail.startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate"), detail


def test_memory_error_and_torch_out_of_memory_error_are_allocation_ooms():
    exc = _raised(lambda: bytearray(2**62))
    assert isinstance(exc, MemoryError)
    assert memory_failure(exc) == (ALLOCATION, "MemoryError")
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity")
    assert memory_failure(cuda) == (ALLOCATION, str(cuda))
    windows = RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 80000000000 bytes.")
    assert memory_failure(windows) == (ALLOCATION, str(windows))


def test_ray_memory_monitor_kills_are_monitor_ooms():
    kind, detail = memory_failure(rx.OutOfMemoryError(MONITOR_MESSAGE))
    assert kind == MEMORY_MONITOR and detail.startswith("1 worker(s) were killed due to the node running low on memory")
    task = rx.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node ...")
    assert memory_failure(task) == (MEMORY_MONITOR, "Task was killed due to the node running low on memory.")
    kind, detail = memory_failure(_actor_died(MONITOR_KILL))
    assert kind == MEMORY_MONITOR and "NODE_OUT_OF_MEMORY" in detail


def test_ray_wrapped_trial_error_is_judged_by_its_cause():
    wrapped = rx.RayTaskError("train_trial", "Traceback ...\nMemoryError", MemoryError()).as_instanceof_cause()
    assert isinstance(wrapped, rx.RayError) and isinstance(wrapped, MemoryError)
    assert memory_failure(wrapped) == (ALLOCATION, "MemoryError")  # not Ray's monitor: the trial's own allocation
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    wrapped = rx.RayTaskError("train_trial", "Traceback ...", cuda).as_instanceof_cause()
    assert memory_failure(wrapped) == (ALLOCATION, str(cuda))
    other = rx.RayTaskError("train_trial", "Traceback ...", ValueError("bad shape")).as_instanceof_cause()
    assert memory_failure(other) is None
    try:  # an error raised while handling an OOM: the OOM is the cause
        try:
            raise MemoryError
        except MemoryError as first:
            raise RuntimeError("report failed") from first
    except RuntimeError as chained:
        assert memory_failure(chained) == (ALLOCATION, "MemoryError")


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (64x40 and 32x10)"),
        ValueError("out of memory"),  # not an allocator's error type
        Diverged("non-finite training loss in epoch 1"),
        _actor_died("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"),
        rx.RayActorError(),
        None,
    ],
)
def test_other_errors_are_not_out_of_memory(exc):
    assert memory_failure(exc) is None


def test_error_file_text_gives_status_and_reason():
    text = f"Failure # 1 (occurred at 2026-12-02)\nTraceback ...\nray.exceptions.OutOfMemoryError: {MONITOR_MESSAGE}\n"
    status, reason = error_ending(text, attempts=3)
    assert status == OUT_OF_MEMORY
    assert reason == (
        "out of memory: Ray's memory monitor killed the trial's worker (its node ran low on memory) on each of its "
        "3 attempts (resources.max_failures)"
    )
    assert error_ending("Traceback ...\nValueError: bad shape\n", attempts=3) == ("errored", "ValueError: bad shape")
    assert error_ending("", attempts=1) == ("errored", "trial errored")
    assert failure_reason("diverged", "non-finite loss") == "diverged: non-finite loss"  # the divergence path's words


@pytest.fixture
def tune_stub(monkeypatch, tmp_path) -> list[tuple[dict, Path | None]]:
    """train_trial outside Tune: its reports (result, a copy of the checkpoint folder)."""
    got: list[tuple[dict, Path | None]] = []

    def report(metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:
            import shutil

            kept = tmp_path / f"ckpt_{len(got)}"
            shutil.copytree(checkpoint.path, kept)
        got.append((dict(metrics), kept))

    monkeypatch.setattr(trainable.tune, "report", report)
    monkeypatch.setattr(trainable, "_node_id", lambda: "local")
    return got


def test_trial_whose_allocation_fails_reports_out_of_memory_once(tune_stub, monkeypatch):
    attempts = []

    def too_big(*args, **kwargs):
        attempts.append(1)
        args[-1].append(SimpleNamespace(epoch=2))  # the trainer, built, after two epochs
        torch.empty(BEYOND_ADDRESS_SPACE, dtype=torch.uint8)

    monkeypatch.setattr(trainable, "_train_trial", too_big)
    trainable.train_trial({"calibrator": "temperature"}, base=RunConfig().model_dump(mode="json"))
    assert len(attempts) == 1 and len(tune_stub) == 1
    final, ckpt = tune_stub[0]
    assert final["done"] is True and final["status"] == OUT_OF_MEMORY and final["epoch"] == 2
    assert final["reason"].startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    assert "not retried, the same config needs the same memory again" in final["reason"]
    assert final["val_ece"] != final["val_ece"] and final["val_accuracy"] != final["val_accuracy"]  # NaN: never ranks
    # A restored trial reports this again instead of running (train_trial reads FINAL_FILE first).
    assert json.loads((ckpt / FINAL_FILE).read_text())["status"] == OUT_OF_MEMORY


def test_trial_errors_other_than_memory_propagate(tune_stub, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(trainable, "_train_trial", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        trainable.train_trial({"calibrator": "temperature"}, base=RunConfig().model_dump(mode="json"))
    assert tune_stub == []


def _callback(client: MemoryClient) -> MLflowTrackingCallback:
    return MLflowTrackingCallback(
        MlflowStore("sqlite:///unused.db", client=client),
        "0",
        "parent",
        "oom-unit",
        base_tags={},
        trial_params=lambda c: ({"x": 1}, {"calib.label": str(c)}, RunConfig().model_dump(mode="json")),
    )


def _trial(tid: str, error_file: str | None = None, num_failures: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=tid,
        config={"calibrator": "temperature", "calibrator_lr": 0.01},
        last_result=None,
        checkpoint=None,
        error_file=error_file,
        num_failures=num_failures,
        status="RUNNING",
    )


def test_out_of_memory_trial_run_is_failed_with_its_reason(tmp_path, capsys):
    client = MemoryClient()
    cb = _callback(client)
    progress = ProgressCallback(2, SelectionConfig(rule="min_metric", metric="val_ece"))
    own, killed = _trial("own1"), _trial("killed1", str(tmp_path / "error.txt"), num_failures=3)
    (tmp_path / "error.txt").write_text(f"Traceback ...\nray.exceptions.ActorDiedError: {MONITOR_KILL}\n")
    for t in (own, killed):
        cb.on_trial_start(0, [], t)
    reason = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes; not retried"
    final = {"epoch": 0, "done": True, "status": OUT_OF_MEMORY, "reason": reason, **trainable.FAILED_OBJECTIVES}
    cb.on_trial_result(0, [], own, final)
    own.last_result = final
    cb.on_trial_complete(0, [], own)
    progress.on_trial_complete(0, [own, killed], own)
    cb.on_trial_error(0, [], killed)
    progress.on_trial_error(0, [own, killed], killed)

    runs = {r["tags"]["calib.trial_id"]: r for r in client.runs.values()}
    assert runs["own1"]["status"] == "FAILED" and runs["own1"]["tags"][TAG_STATUS] == OUT_OF_MEMORY
    assert runs["own1"]["tags"][TAG_REASON] == f"out of memory: {reason}"
    assert runs["killed1"]["status"] == "FAILED" and runs["killed1"]["tags"][TAG_STATUS] == OUT_OF_MEMORY
    assert runs["killed1"]["tags"][TAG_REASON].startswith("out of memory: Ray's memory monitor killed")
    out = capsys.readouterr().out.splitlines()
    assert f"out of memory: {reason}" in out[0]
    assert "out of memory: Ray's memory monitor killed the trial's worker" in out[1]


def test_leaderboard_says_out_of_memory():
    records = [
        TrialRecord("a", "temperature lr=1e-2", "completed", {"val_ece": 0.05, "val_accuracy": 0.9}),
        TrialRecord("b", "temperature lr=1e-2 width=big", OUT_OF_MEMORY, {}, reason="out of memory: ..."),
    ]
    text = format_leaderboard(leaderboard(records))
    row = next(line for line in text.splitlines() if "width=big" in line)
    assert "out of memory" in row


def test_worker_the_memory_monitor_killed_is_not_resumed_past_its_retries(monkeypatch):
    """Tune retried it resources.max_failures times already; the extra rounds for lost workers leave it ended."""
    from sweeps.integrations.ray import tuner as service
    from tests.unit.sweeps.test_sweep_lost_workers import FakeTuner, _patch_restore

    tuner = FakeTuner([[None, _actor_died(MONITOR_KILL)]])
    calls = _patch_restore(monkeypatch, tuner)
    results = service.fit_resuming_lost_workers(tuner, "/exp", object(), 2)
    assert calls == [] and tuner.fits == 1 and memory_failure(results[1].error) is not None


def test_selection_records_a_killed_worker_as_out_of_memory():
    from sweeps.finish import trial_records

    runs = SimpleNamespace(trial_runs_by_id=lambda experiment, sweep, runs=None: {})
    res = SimpleNamespace(metrics={"trial_id": "t1"}, path=None, error=_actor_died(MONITOR_KILL), config={})
    res.checkpoint = None
    (record,) = trial_records([res], runs, "0", "oom-unit")
    assert record.status == OUT_OF_MEMORY and "NODE_OUT_OF_MEMORY" in (record.reason or "")

"""MlflowStore's outage policy with a fake client: backoff, one line per outage, the limit (fast)."""

from __future__ import annotations

import pickle

import pytest
from mlflow.exceptions import MlflowException

from sweeps.integrations.mlflow.retry import OUTAGE_MAX_WAIT_S, OutageRetry, TrackingUnavailable, is_outage
from sweeps.integrations.mlflow.store import MlflowStore

REFUSED = MlflowException(
    "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with exception "
    "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: ... "
    "(Caused by NewConnectionError(... [Errno 111] Connection refused))"
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


class FlakyClient:
    """Fails `down` calls with a refused connection, then works; records what was delivered."""

    def __init__(self, down: int, error: Exception = REFUSED) -> None:
        self.down, self.error = down, error
        self.calls = 0
        self.delivered: list[tuple] = []

    def log_batch(self, run_id: str, metrics=(), params=()) -> None:
        self.calls += 1
        if self.calls <= self.down:
            raise self.error
        self.delivered.append((run_id, tuple((m.key, m.step, m.timestamp) for m in metrics)))


def make_store(client: FlakyClient, limit: float) -> tuple[MlflowStore, Clock, list[str]]:
    clock, lines = Clock(), []
    retry = OutageRetry("http://user:secret@tracking:5000", limit, say=lines.append, sleep=clock.sleep, clock=clock)
    store = MlflowStore("http://user:secret@tracking:5000", client=client, outage_timeout_s=limit, retry=retry)
    return store, clock, lines


def test_outage_waits_with_backoff_says_one_line_each_way_and_delivers_once():
    client = FlakyClient(down=6)
    store, clock, lines = make_store(client, limit=600)
    store.log_metrics("r1", {"val_ece": 0.1, "val_accuracy": 0.9}, step=3)
    assert clock.sleeps == [1, 2, 4, 8, OUTAGE_MAX_WAIT_S, OUTAGE_MAX_WAIT_S] and OUTAGE_MAX_WAIT_S == 10
    assert len(client.delivered) == 1  # delivered once, after the outage
    run_id, metrics = client.delivered[0]
    assert run_id == "r1" and {(k, s) for k, s, _ in metrics} == {("val_ece", 3), ("val_accuracy", 3)}
    assert len(lines) == 2, lines  # one line when it went, one when it came back, none per retry
    assert "unreachable" in lines[0] and "tracking.outage_timeout_s" in lines[0] and "secret" not in lines[0]
    assert "back after 35 s" in lines[1]
    # a second outage is announced again
    client.down, client.calls = 1, 0
    store.log_metrics("r1", {"val_ece": 0.2}, step=4)
    assert len(lines) == 4 and len(client.delivered) == 2


def test_retried_call_sends_the_same_metric_timestamps():
    client = FlakyClient(down=2)
    store, _, _ = make_store(client, limit=600)
    seen: list = []
    orig = client.log_batch

    def spy(run_id, metrics=(), params=()):
        seen.append(tuple(m.timestamp for m in metrics))
        return orig(run_id, metrics=metrics, params=params)

    client.log_batch = spy  # type: ignore[method-assign]
    store.log_metrics("r1", {"a": 1.0}, step=0)
    assert len(seen) == 3 and len(set(seen)) == 1  # an identical row: the SQL store keeps it once


def test_outage_past_the_limit_stops_with_one_line_naming_the_field():
    client = FlakyClient(down=10**6)
    store, clock, lines = make_store(client, limit=20)
    with pytest.raises(TrackingUnavailable) as info:
        store.log_metrics("r1", {"a": 1.0})
    msg = str(info.value)
    assert "\n" not in msg and "tracking.outage_timeout_s=20" in msg and "--resume" in msg and "secret" not in msg
    assert sum(clock.sleeps) == pytest.approx(20)  # the last wait is cut to the limit
    assert len(lines) == 1 and store.retry is not None and store.retry.stopped
    # later calls of the same outage fail at once, without waiting again
    n = len(clock.sleeps)
    with pytest.raises(TrackingUnavailable):
        store.log_metrics("r1", {"a": 1.0})
    assert len(clock.sleeps) == n


def test_errors_that_are_not_outages_are_raised_at_once():
    client = FlakyClient(down=1, error=MlflowException("INVALID_PARAMETER_VALUE: bad metric"))
    store, clock, lines = make_store(client, limit=600)
    with pytest.raises(MlflowException, match="bad metric"):
        store.log_metrics("r1", {"a": 1.0})
    assert clock.sleeps == [] and lines == []


def test_without_a_limit_the_store_does_not_wait():
    store = MlflowStore("http://tracking:5000", client=FlakyClient(down=1))
    with pytest.raises(MlflowException):
        store.log_metrics("r1", {"a": 1.0})


def test_outage_classification_and_pickling():
    assert is_outage(REFUSED)
    assert is_outage(ConnectionRefusedError())
    assert is_outage(MlflowException("API request to x failed with error code 503 != 200"))
    assert not is_outage(MlflowException("RESOURCE_DOES_NOT_EXIST: run x"))
    assert not is_outage(ValueError("x"))
    store = pickle.loads(pickle.dumps(MlflowStore("http://tracking:5000", outage_timeout_s=42)))
    assert store.outage_timeout_s == 42 and store.retry is not None and store.retry.limit_s == 42


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_outage_timeout_is_validated_in_one_line(value):
    from calib_core.config import ConfigError
    from sweeps.config import load_sweep_config

    with pytest.raises(ConfigError) as info:
        load_sweep_config(None, [f"tracking.outage_timeout_s={value}"])
    assert "tracking.outage_timeout_s" in str(info.value) and "\n" not in str(info.value)
    assert load_sweep_config(None, []).tracking.outage_timeout_s == 600

"""The Optuna study's database, riding out outages: every storage call waits for a database that went away.

`RetryingRDBStorage` is Optuna's RDBStorage with each storage call behind the sweep's outage policy
(sweeps/outage.py: backoff 1 s doubling to 10 s, one line when the database goes away and one when it is
back, StorageUnavailable past `search.storage_outage_timeout_s`). Only connection failures are retried
(`is_storage_outage`): a refused or dropped connection, a server shutting down or starting up; a wrong call
(bad data, a finished trial updated) is raised at once. Its engine checks each pooled connection before use
(`pool_pre_ping`), so the connections a restarted server dropped are replaced instead of failing a call.

A call is sent again unchanged; one that reached the database just before the connection dropped may have
been committed (a trial created twice is the only effect that could show, and needs a drop mid-commit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.storages import RDBStorage

from calib_core.redaction import redact
from sweeps.outage import OutageRetry, Unavailable

FIELD = "search.storage_outage_timeout_s"
WHAT = "Optuna study database"

# What the database drivers (psycopg, psycopg2, PyMySQL, mysqlclient) say when the server cannot be reached
# or dropped the connection (lower case); anything else a database says is a wrong call, raised at once.
_CONNECTION_TEXT = (
    "could not connect",
    "connection refused",
    "connection failed",
    "connection to server",
    "server closed the connection",
    "terminating connection",
    "connection timed out",
    "connection reset",
    "connection is closed",
    "connection already closed",
    "consuming input failed",
    "no connection to the server",
    "ssl connection has been closed",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "could not translate host name",
    "temporary failure in name resolution",
    "can't connect to mysql server",
    "lost connection to mysql server",
    "mysql server has gone away",
)

# The storage calls that reach the database: BaseStorage's methods and the private ones Optuna's
# _CachedStorage calls on its backend (a call made inside another is retried once, by the inner one).
RETRIED_CALLS = (
    "create_new_study",
    "delete_study",
    "set_study_user_attr",
    "set_study_system_attr",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_all_studies",
    "create_new_trial",
    "_create_new_trial",
    "set_trial_param",
    "_set_trial_param",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial_param",
    "get_trial_params",
    "set_trial_state_values",
    "set_trial_intermediate_value",
    "set_trial_user_attr",
    "set_trial_system_attr",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
    "get_trial",
    "get_all_trials",
    "_get_trials",
    "get_n_trials",
    "get_best_trial",
    "_get_best_trial_id",
    "record_heartbeat",
    "_get_stale_trial_ids",
)


class StorageUnavailable(Unavailable):
    """The Optuna study's database stayed unreachable past `search.storage_outage_timeout_s`."""


def is_storage_outage(exc: BaseException) -> bool:
    """Whether a storage call failed because the database could not be reached (not because the call was wrong).

    Optuna turns SQLAlchemy's errors into StorageInternalError (the original as its cause): the chain is read."""
    from sqlalchemy.exc import DBAPIError

    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 10:
        if isinstance(cur, Unavailable):
            return False  # an inner call already waited and gave up
        if isinstance(cur, (ConnectionError, TimeoutError)):
            return True
        if isinstance(cur, DBAPIError):
            if cur.connection_invalidated:
                return True
            text = str(cur).lower()
            if any(t in text for t in _CONNECTION_TEXT):
                return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


class RetryingRDBStorage(RDBStorage):
    """RDBStorage whose calls wait out an unreachable database (`outage_timeout_s`; None: fail at once).

    Picklable like RDBStorage (Ray Tune keeps the searcher in its experiment state): the policy is rebuilt
    from `outage_timeout_s` when unpickled. `configure` sets the limit and a stop check later (a resumed
    sweep's own setting, Ctrl+C)."""

    def __init__(self, url: str, outage_timeout_s: float | None = None, say: Any = None, **kwargs: Any) -> None:
        self.outage_timeout_s = outage_timeout_s
        self._say = say
        self._give_up: Callable[[], bool] | None = None
        self._retry = self._policy(url)
        self._call(super().__init__, url, **kwargs)  # creates the tables: the database is reached here

    def _policy(self, url: str) -> OutageRetry | None:
        if self.outage_timeout_s is None:
            return None
        return OutageRetry(
            WHAT,
            redact(url),
            FIELD,
            self.outage_timeout_s,
            is_storage_outage,
            StorageUnavailable,
            say=self._say,
            give_up=self._give_up,
        )

    def configure(self, outage_timeout_s: float | None, give_up: Callable[[], bool] | None = None) -> None:
        """Wait up to `outage_timeout_s` from now on; `give_up()` true ends a wait at once (OutageWaitStopped)."""
        self.outage_timeout_s, self._give_up = outage_timeout_s, give_up
        self._retry = self._policy(self.url)

    @property
    def retry(self) -> OutageRetry | None:
        """The outage policy every storage call goes through (None: no waiting)."""
        return self._retry

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        retry = self._retry
        return fn(*args, **kwargs) if retry is None else retry.call(fn, *args, **kwargs)

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        for key in ("_retry", "_give_up", "_say"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        self.outage_timeout_s = state.get("outage_timeout_s")
        self._say, self._give_up = None, None
        self._retry = self._policy(state["url"])
        self._call(super().__setstate__, state)  # reconnects and checks the tables


def _retried(name: str) -> Callable[..., Any]:
    def call(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(getattr(RDBStorage, name), self, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(RDBStorage, name).__doc__
    return call


for _name in RETRIED_CALLS:
    setattr(RetryingRDBStorage, _name, _retried(_name))


def make_rdb_storage(url: str, outage_timeout_s: float | None = None, **kwargs: Any) -> RetryingRDBStorage:
    """An RDBStorage for `url` that waits out outages up to `outage_timeout_s` (None: fails at once as Optuna
    does); a server's pooled connections are checked before use (`pool_pre_ping`), a caller's setting wins."""
    engine_kwargs = dict(kwargs.pop("engine_kwargs", None) or {})
    if not url.startswith("sqlite"):
        engine_kwargs.setdefault("pool_pre_ping", True)
    return RetryingRDBStorage(url, outage_timeout_s=outage_timeout_s, engine_kwargs=engine_kwargs, **kwargs)

"""The MLflow image turns on MLflow's credential cache (docker/mlflow-entrypoint.sh, MLFLOW_AUTH_CACHE_TTL_SECONDS);
what its comment promises holds against a real `mlflow server --app-name basic-auth` started through that entrypoint
from this virtualenv (one worker, SQLite; benchmarks/perf/bench_mlflow_auth.py's server): a wrong password is never
accepted, a password changed through MLflow's API takes effect at once on the worker that served the change, and one
changed in the database is refused once the TTL has passed (and accepted until then: that is the cache)."""

from __future__ import annotations

import sqlite3
import time

import pytest
import requests
from werkzeug.security import generate_password_hash

from benchmarks.perf.bench_mlflow_auth import Server

pytestmark = pytest.mark.slow
TTL = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("auth"), TTL)
    try:
        s.wait()
        yield s
    finally:
        s.stop()


def _user(server: Server, name: str, password: str) -> None:
    admin = requests.post(
        f"{server.url}/api/2.0/mlflow/users/create", json={"username": name, "password": password}, auth=server.admin
    )
    admin.raise_for_status()


def _status(server: Server, name: str, password: str) -> int:
    r = requests.get(f"{server.url}/api/2.0/mlflow/experiments/search?max_results=1", auth=(name, password))
    return r.status_code


def test_a_wrong_password_is_refused_even_after_the_right_one_was_cached(server):
    _user(server, "alice", "alice-first-password")
    assert _status(server, "alice", "alice-first-password") == 200
    assert _status(server, "alice", "alice-wrong-password") == 401


def test_a_password_changed_through_the_api_takes_effect_at_once(server):
    _user(server, "bob", "bob-first-password")
    assert _status(server, "bob", "bob-first-password") == 200  # cached now
    r = requests.patch(
        f"{server.url}/api/2.0/mlflow/users/update-password",
        json={"username": "bob", "password": "bob-second-password"},
        auth=server.admin,
    )
    r.raise_for_status()
    assert _status(server, "bob", "bob-first-password") == 401
    assert _status(server, "bob", "bob-second-password") == 200


def test_a_password_changed_in_the_database_is_refused_once_the_ttl_has_passed(server):
    _user(server, "carol", "carol-first-password")
    assert _status(server, "carol", "carol-first-password") == 200
    changed = time.monotonic()
    with sqlite3.connect(server.root / "auth.db") as db:
        db.execute(
            "UPDATE users SET password_hash = ? WHERE username = 'carol'",
            (generate_password_hash("carol-new-password"),),
        )
    # within the TTL the cached credential still passes: the cache is on (with it off this is 401)
    assert _status(server, "carol", "carol-first-password") == 200
    assert time.monotonic() - changed < TTL
    time.sleep(TTL + 0.5 - (time.monotonic() - changed))
    assert _status(server, "carol", "carol-first-password") == 401
    assert _status(server, "carol", "carol-new-password") == 200

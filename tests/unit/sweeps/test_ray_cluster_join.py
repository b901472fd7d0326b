"""Joining a cluster fails in one line that names the likely cause (issue #22 item 6: a wrong auth token)."""

import socket

import pytest
import ray

from calib_core.config import ConfigError
from sweeps.integrations.ray import cluster


@pytest.fixture
def open_port(monkeypatch):
    """A head whose port answers (the TCP probe passes) but whose ray.init fails as the test says."""
    monkeypatch.setattr(cluster, "probe_tcp", lambda host, port: None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def _join_failing(monkeypatch, port, message):
    def refuse(*a, **k):
        raise ConnectionError(message)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError) as err:
        cluster.connect_cluster()
    return str(err.value)


def test_a_refused_token_is_named(monkeypatch, open_port):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    line = _join_failing(monkeypatch, open_port, "Failed to connect to GCS at address 127.0.0.1 within 20 seconds")
    assert line.startswith("--cluster: could not join the Ray cluster at ")
    assert "most likely a wrong auth token" in line and "\n" not in line and len(line) <= 400


def test_an_explicit_authentication_error_is_named(monkeypatch, open_port):
    line = _join_failing(monkeypatch, open_port, "grpc status UNAUTHENTICATED: invalid token")
    assert "refused this driver's auth token" in line


def test_without_token_settings_the_hint_says_how_to_set_one(monkeypatch, open_port, tmp_path):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    line = _join_failing(monkeypatch, open_port, "Failed to connect to GCS")
    assert "set RAY_AUTH_MODE=token and its RAY_AUTH_TOKEN" in line

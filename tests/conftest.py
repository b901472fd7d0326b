"""Fixtures shared by several test files (pytest provides them by name; nothing to import).

* ``one_thread`` (module scope): torch on one thread for the module, restored after. A module of
  tiny problems opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
* ``no_network``: any attempt to open a network connection fails the test.

The header of a pytest run also says which Kustomize renderer the deploy tests use.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny problems: one thread is faster and steadier on a shared machine (restored after)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection raises (sockets, urllib, requests)."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    try:
        import requests

        monkeypatch.setattr(requests, "get", refuse)
        monkeypatch.setattr(requests.Session, "request", refuse)
    except ImportError:
        pass


def pytest_report_header(config: pytest.Config) -> str:
    from tests import deploy_render

    try:
        return f"deploy manifests rendered by: {deploy_render.renderer()}"
    except deploy_render.KustomizeError as exc:
        return f"deploy manifests: {exc}"

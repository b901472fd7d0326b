"""Fixtures shared by several test files (pytest provides them by name; nothing to import).

* ``one_thread`` (module scope): torch on one thread for the module, restored after. A module of
  tiny problems opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
* ``no_network``: any attempt to open a network connection fails the test.

The header of a pytest run also says which Kustomize renderer the deploy tests use. In the slow tier (`-m slow`),
the longest files come first (`SLOW_FIRST`).
"""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator

import pytest

# The slow tier (`make test-slow`: -n 2 --dist loadfile --no-loadscope-reorder) hands whole files to two workers
# in collection order. xdist's default order (most tests first) put the 10-minute soak, a single test, near the end:
# one worker ran it alone while the other went idle. Longest first instead (the tail is then a short file).
# Estimated minutes on the 2-core machine (docstrings, commit messages, sweeps a file launches); files not listed
# follow in collection order. A new file of several minutes belongs here.
SLOW_FIRST = (
    "tests/e2e/test_sweep_soak.py",  # ~10 min: 200 trials, 20 kills
    "tests/e2e/test_sweep_node_loss.py",  # ~4.6: 2 x a local 2-node cluster, 200-epoch trials
    "tests/e2e/test_sweep_faults.py",  # ~4: 5 sweeps
    "tests/e2e/test_sweep_configs_e2e.py",  # ~3.5: 4 sweeps (digits 6 x 6 epochs)
    "tests/e2e/test_sweep_slow_tracking.py",  # ~3.3: a sweep straight and through the slow proxy
    "tests/e2e/test_sweep_e2e.py",  # ~3.5: 3 sweeps, the dashboards in Chromium
    "tests/e2e/test_sweep_grow.py",  # ~3.5: 5 small sweeps
    "tests/e2e/test_sweep_outage.py",  # ~3: a 30 s outage, a stop and a resume
    "tests/e2e/test_sweep_signals.py",  # ~3
    "tests/e2e/test_sweep_stops_group.py",  # ~3
    "tests/e2e/test_pretrained_library_e2e.py",  # ~2
    "tests/e2e/test_conformal_sets_e2e.py",  # ~2: a 3-trial sweep, then its champion served over HTTP
    "tests/e2e/test_sweep_objectives.py",
    "tests/e2e/test_preflight_cluster.py",
    "tests/e2e/test_sweep_oom.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Every Ray this run starts (a sweep's own, a test cluster's) warns about a full disk at 99 %, not 95 %; every
    MLflow server it starts runs no job runner."""
    # A raylet whose temp-folder disk is over its threshold prints "... is over 95% full" to every driver, and a
    # shared CI machine's /tmp sat at 95.9 % (stop 51): that line became a second stderr line under a one-line
    # refusal. The disk of the machine running the tests is not what they test; sweeps outside tests keep Ray's 95 %.
    os.environ.setdefault("RAY_local_fs_capacity_threshold", "0.99")
    # The MLflow servers the tests start run as the Deployment's does (deploy/base/mlflow/deployment.yaml): without
    # MLflow's job runner (GenAI scorers, trace roll-ups; the sweep uses none). Its huey consumers, three processes
    # per server, took 394 s of CPU in one slow-tier run here, 12 % of the tier's CPU (a /proc census by process).
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`-m slow`: the files of SLOW_FIRST first, in its order; every file's own tests keep their order."""
    if (config.option.markexpr or "").strip() != "slow":
        return
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    index = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::", 1)[0], len(rank)), index[id(item)]))


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

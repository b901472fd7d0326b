"""`--cluster` against a real one-CPU Ray head on this machine: a trial that fits no node fails in
one line before anything is written; with an autoscaler assumed, resources.pending_timeout_s ends
the wait with one error line (exit 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sweep_helpers import FAST, launch, local_ray_cluster, mlflow_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[dict]:
    """A one-node, one-CPU cluster on loopback and an MLflow server; yields the launch environment."""
    d = tmp_path_factory.mktemp("cluster")
    with (
        local_ray_cluster(worker_cpus=None) as ray,
        mlflow_server(f"sqlite:///{d}/mlflow.db", d / "mlartifacts") as url,
    ):
        yield {"url": url, "shared": d, "env": ray["launch_env"]}


def test_trial_larger_than_every_node_fails_fast(cluster, tmp_path):
    proc = launch(
        tmp_path,
        "--cluster",
        "--cpus-per-trial",
        "2",
        "--name",
        "too-big",
        "--tracking-uri",
        cluster["url"],
        "--storage-path",
        str(cluster["shared"] / "results"),
        *FAST,
        env=cluster["env"],
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: resources.cpus_per_trial: a trial asks for 2 CPU and 0 GPU on one node")
    assert "the largest node has 1 CPU" in lines[0] and "no autoscaler" in lines[0]
    assert list(tmp_path.iterdir()) == []
    assert not (cluster["shared"] / "results").exists()


def test_pending_timeout_ends_the_wait_for_an_autoscaler(cluster, tmp_path):
    proc = launch(
        tmp_path,
        "--cluster",
        "--cpus-per-trial",
        "2",
        "--num-samples",
        "1",
        "--name",
        "waits",
        "--set",
        "resources.pending_timeout_s=8",
        "--tracking-uri",
        cluster["url"],
        "--storage-path",
        str(cluster["shared"] / "results"),
        *FAST,
        env={**cluster["env"], "CALIB_ASSUME_AUTOSCALING": "1"},
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "waiting at most 8 s" in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: resources.pending_timeout_s: no trial could start within 8 s"), proc.stderr[-3000:]
    from mlflow import MlflowClient

    client = MlflowClient(cluster["url"])
    exp = client.get_experiment_by_name("calib-sweeps")
    parent = client.search_runs([exp.experiment_id], filter_string="tags.`calib.sweep` = 'waits'")[0]
    assert parent.info.status == "FAILED"
    assert "ResourcesUnavailable" in parent.data.tags["calib.failure_reason"]

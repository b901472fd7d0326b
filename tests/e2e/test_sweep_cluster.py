"""A two-node Ray cluster on this machine: `launch.py --cluster` runs trials on both nodes."""

from __future__ import annotations

import pytest

from tests.sweep_helpers import FAST, launch, local_ray_cluster, mlflow_server, sweep_runs

pytestmark = pytest.mark.slow


def test_cluster_sweep_uses_both_nodes(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    with local_ray_cluster() as cluster:
        with mlflow_server(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "mlartifacts") as url:
            proc = launch(
                tmp_path,
                "--cluster",
                "--num-samples",
                "4",
                "--max-concurrent",
                "2",
                "--name",
                "two-node",
                "--tracking-uri",
                url,
                "--storage-path",
                str(shared),
                *FAST,
                env=cluster["launch_env"],
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            from mlflow import MlflowClient

            parents, children = sweep_runs(MlflowClient(url), "two-node")
        assert len(parents) == 1 and len(children) == 4
        assert all(r.info.status == "FINISHED" for r in children)
        nodes = {r.data.tags["calib.node_id"] for r in children}
        assert len(nodes) == 2, nodes

"""A two-node Ray cluster on this machine: `launch.py --cluster` runs trials on both nodes."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.sweep_helpers import FAST, free_port, launch, mlflow_server, stop_ray_under, sweep_runs

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).parent / "ray")


def test_cluster_sweep_uses_both_nodes(tmp_path):
    port = free_port()
    token = secrets.token_hex(32)
    # Ray's socket paths must stay under 107 bytes: pytest's tmp_path is too deep.
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_TMPDIR": ray_tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    shared = tmp_path / "shared"
    shared.mkdir()

    def ray_cmd(*args):
        return subprocess.run([RAY, *args], env=env, capture_output=True, text=True, timeout=180)

    head = ray_cmd(
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "1",
        "--include-dashboard",
        "false",
        "--resources",
        '{"head_node": 1}',
    )
    try:
        assert head.returncode == 0, head.stderr[-2000:]
        worker = ray_cmd(
            "start",
            "--address",
            f"127.0.0.1:{port}",
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            "1",
            "--resources",
            '{"worker_node": 1}',
        )
        assert worker.returncode == 0, worker.stderr[-2000:]
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
                env={k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
                | {"RAY_ADDRESS": f"127.0.0.1:{port}", "CALIB_SHARED_STORAGE": "1"},
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            from mlflow import MlflowClient

            parents, children = sweep_runs(MlflowClient(url), "two-node")
        assert len(parents) == 1 and len(children) == 4
        assert all(r.info.status == "FINISHED" for r in children)
        nodes = {r.data.tags["calib.node_id"] for r in children}
        assert len(nodes) == 2, nodes
    finally:
        stop_ray_under(ray_tmp)  # only this test's cluster (never `ray stop --force`)
        shutil.rmtree(ray_tmp, ignore_errors=True)

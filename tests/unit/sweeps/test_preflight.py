"""sweeps.checks.preflight in process: the cluster checks against a stubbed Ray, the pending-resources
timeout, the store checks (--resume of a finished sweep changes nothing) and the helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from calib_core.config import ConfigError
from sweeps import contract
from sweeps.checks import paths, preflight, servers
from sweeps.config import load_sweep_config
from sweeps.integrations.mlflow import existing
from sweeps.integrations.ray import cluster
from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"


def _cfg(*overrides: str):
    return load_sweep_config(None, list(overrides))


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "host,loop",
    [
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("mlflow", False),
        ("10.0.0.5", False),
        ("", False),
    ],
)
def test_loopback_hosts(host, loop):
    assert servers.is_loopback(host) is loop


def test_redact_hides_the_password():
    assert preflight.redact("postgresql://user:s3cret@db:5432/mlflow") == "postgresql://user:***@db:5432/mlflow"
    assert preflight.redact("http://mlflow:5000") == "http://mlflow:5000"


def test_mount_table_knows_proc():
    mount = paths._mount_of(Path("/proc/sys"))
    if mount is None:
        pytest.skip("no /proc/self/mountinfo")
    assert mount[1] == "proc"


def test_local_cpus_within_the_machine():
    assert 1 <= preflight.local_cpus() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("value", "hidden"), [("", True), ("-1", True), (" -1,0", True), ("0", False), ("GPU-5f3a,1", False), (None, False)]
)
def test_cuda_visible_devices_that_hide_every_device(monkeypatch, value, hidden):
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert preflight.cuda_devices_hidden() is hidden


def test_no_gpu_is_known_without_importing_torch():
    """CUDA_VISIBLE_DEVICES='' answers the local GPU count without torch's import (seconds in the driver, serial
    before the other checks: the --gpus-per-trial case of test_cli_malformed overran its limit under load)."""
    code = "import sys; from sweeps.checks import preflight; print(preflight.local_gpus(), 'torch' in sys.modules)"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["0", "False"], proc.stdout + proc.stderr


def test_dry_run_checks_values_but_not_the_environment(capsys):
    from sweeps.cli import main

    # a GPU request on a machine without one is a plan, not an error, in --dry-run
    assert main(["--dry-run", "--gpus-per-trial", "8", "--storage-path", "/proc/sys/x"]) == 0
    assert main(["--dry-run", "--set", "search.calibrator_lr.high=.inf"]) == 2
    assert "search.calibrator_lr.high: Input should be a finite number" in capsys.readouterr().err


def test_string_flags_are_taken_verbatim(tmp_path, monkeypatch, capsys):
    from sweeps.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["--dry-run", "--name", "2024"]) == 0  # YAML would read an int
    assert "name: '2024'" in capsys.readouterr().out


# --------------------------------------------------------------------------- the cluster, with Ray stubbed


@pytest.fixture()
def fake_ray(monkeypatch):
    import ray

    state = SimpleNamespace(nodes=[], autoscaler=(False, "the cluster has no autoscaler"))

    def nodes():
        return [{"Alive": True, "NodeManagerAddress": a, "Resources": r} for a, r in state.nodes]

    def cluster_resources():
        out: dict[str, float] = {}
        for _, r in state.nodes:
            for k, v in r.items():
                out[k] = out.get(k, 0.0) + v
        return out

    monkeypatch.setattr(ray, "nodes", nodes)
    monkeypatch.setattr(ray, "cluster_resources", cluster_resources)
    monkeypatch.setattr(cluster, "_autoscaler", lambda cpus, gpus: state.autoscaler)
    return state


def test_cluster_trial_fits_on_a_node(fake_ray, capsys):
    fake_ray.nodes = [("10.0.0.1", {"CPU": 8.0, "GPU": 1.0}), ("10.0.0.2", {"CPU": 4.0})]
    cluster.check_cluster(_cfg("resources.cpus_per_trial=4", "resources.gpus_per_trial=0.5"), False)
    assert "2 node(s), 12 CPU, 1 GPU" in capsys.readouterr().out


def test_cluster_too_small_without_autoscaler_fails_fast(fake_ray):
    # 12 CPUs in all, but a trial needs 6 on one node
    fake_ray.nodes = [("10.0.0.1", {"CPU": 4.0}), ("10.0.0.2", {"CPU": 8.0 - 4.0}), ("10.0.0.3", {"CPU": 4.0})]
    with pytest.raises(ConfigError) as exc:
        cluster.check_cluster(_cfg("resources.cpus_per_trial=6"), False)
    msg = str(exc.value)
    assert msg.startswith("resources.cpus_per_trial: a trial asks for 6 CPU and 0 GPU on one node")
    assert "the largest node has 4 CPU" in msg and "12 CPU" in msg and "no autoscaler" in msg
    assert "\n" not in msg


def test_cluster_without_gpus_names_the_gpu_field(fake_ray):
    fake_ray.nodes = [("10.0.0.1", {"CPU": 16.0})]
    with pytest.raises(ConfigError, match=r"^resources.gpus_per_trial: a trial asks for 1 CPU and 1 GPU"):
        cluster.check_cluster(_cfg("resources.gpus_per_trial=1"), False)


def test_cluster_that_autoscales_waits_with_the_timeout(fake_ray, capsys):
    fake_ray.nodes = [("10.0.0.1", {"CPU": 2.0})]
    fake_ray.autoscaler = (True, "the autoscaler can add node type 'gpu-worker'")
    cluster.check_cluster(_cfg("resources.gpus_per_trial=1", "resources.pending_timeout_s=120"), False)
    out = capsys.readouterr().out
    assert "node type 'gpu-worker'" in out and "waiting at most 120 s for it (resources.pending_timeout_s)" in out


def test_loopback_tracking_needs_every_node_on_this_machine(fake_ray, monkeypatch):
    cfg = _cfg("tracking.uri=http://127.0.0.1:5000")
    fake_ray.nodes = [("127.0.0.1", {"CPU": 2.0}), ("127.0.0.1", {"CPU": 2.0})]
    cluster.check_cluster(cfg, True)
    monkeypatch.setattr(cluster, "_this_machine", lambda: {"192.0.2.9"})
    fake_ray.nodes.append(("192.0.2.9", {"CPU": 2.0}))  # a node started here, with this machine's address
    cluster.check_cluster(cfg, True)
    fake_ray.nodes.append(("10.0.0.7", {"CPU": 2.0}))
    with pytest.raises(
        ConfigError,
        match=r"tracking.uri: 'http://127.0.0.1:5000' is a loopback address but the "
        r"cluster has nodes on other machines \(10.0.0.7\)",
    ):
        cluster.check_cluster(cfg, True)


def test_autoscaler_node_types(monkeypatch):
    import ray._private.state

    def group(name, max_count, **res):
        return SimpleNamespace(name=name, max_count=max_count, min_count=0, resources=res)

    config = SimpleNamespace(node_group_configs=[group("cpu", 10, CPU=8), group("gpu", 0, CPU=8, GPU=4)])
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: config)
    monkeypatch.delenv("CALIB_ASSUME_AUTOSCALING", raising=False)
    assert cluster._autoscaler(4, 0) == (True, "the autoscaler can add node type 'cpu'")
    assert cluster._autoscaler(4, 1)[0] is False  # the GPU group may not grow (max_count 0)
    monkeypatch.setenv("CALIB_ASSUME_AUTOSCALING", "1")
    assert cluster._autoscaler(4, 1)[0] is True


@pytest.mark.parametrize(
    "mapping,scales",
    [
        ({"ab12": "node_ab12"}, False),  # `ray start`: read-only
        ({"ab12": "ray.head.default", "cd34": "gpu-worker"}, True),
        ({}, False),
    ],
)
def test_autoscaler_v1_status(monkeypatch, mapping, scales):
    import json

    import ray._private.state
    import ray.experimental.internal_kv as kv

    monkeypatch.delenv("CALIB_ASSUME_AUTOSCALING", raising=False)
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: None)
    status = json.dumps({"autoscaler_report": {"node_type_mapping": mapping, "legacy": True}}).encode()
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: status if key == "__autoscaling_status" else None)
    assert cluster._autoscaler(2, 0)[0] is scales


@pytest.mark.parametrize("version,scales", [("0", False), ("2", True), (None, False)])
def test_autoscaler_v2_status(monkeypatch, version, scales):
    """KubeRay's autoscaler v2 reports no cluster config and no v1 status, only its state (a version that
    counts its reports; 0 where no autoscaler runs), found by the container test of the autoscaler sidecar."""
    import ray
    import ray._private.state
    import ray.autoscaler.v2.sdk as sdk
    import ray.experimental.internal_kv as kv

    monkeypatch.delenv("CALIB_ASSUME_AUTOSCALING", raising=False)
    monkeypatch.setattr(ray._private.state.state, "get_cluster_config", lambda: None)
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: None)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address="x:1"))
    stats = SimpleNamespace(autoscaler_version=version)
    monkeypatch.setattr(sdk, "get_cluster_status", lambda address: SimpleNamespace(stats=stats))
    assert cluster._autoscaler(2, 0) == (
        (True, "an autoscaler (v2) is running") if scales else (False, "the cluster has no autoscaler")
    )


# --------------------------------------------------------------------------- the pending-resources timeout


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _trials(*statuses: str) -> list:
    return [SimpleNamespace(status=s) for s in statuses]


def test_pending_timeout_ends_a_hopeless_wait():
    from sweeps.integrations.ray.resource_wait import PendingTimeout

    clock = _Clock()
    cb = PendingTimeout(60, 64, 0, clock=clock)
    cb.on_step_begin(0, _trials("PENDING", "PENDING"))
    clock.t = 59
    cb.on_step_begin(1, _trials("PENDING", "PENDING"))
    clock.t = 61
    with pytest.raises(
        contract.ResourcesUnavailable,
        match=r"^resources.pending_timeout_s: no trial could start "
        r"within 60 s \(each asks for 64 CPU and 0 GPU",
    ):
        cb.on_step_begin(2, _trials("PENDING", "PENDING"))


def test_pending_timeout_resets_while_a_trial_runs_and_can_be_off():
    from sweeps.integrations.ray.resource_wait import PendingTimeout

    clock = _Clock()
    cb = PendingTimeout(60, 1, 0, clock=clock)
    for step in range(10):  # a busy cluster: one trial at a time, the others wait their turn
        clock.t = step * 50
        cb.on_step_begin(step, _trials("RUNNING", "PENDING") if step % 2 else _trials("TERMINATED", "PENDING"))
    # off: the same hopeless wait that ends a sweep with a limit (the control) never ends one without it
    clock.t = 0
    on, off = PendingTimeout(60, 1, 0, clock=clock), PendingTimeout(None, 1, 0, clock=clock)
    on.on_step_begin(0, _trials("PENDING"))
    off.on_step_begin(0, _trials("PENDING"))
    clock.t = 1e9
    with pytest.raises(contract.ResourcesUnavailable):
        on.on_step_begin(1, _trials("PENDING"))
    for step in range(1, 5):
        clock.t = 1e9 * step
        assert off.on_step_begin(step, _trials("PENDING")) is None


def test_pending_timeout_pickles_without_its_wait():
    import pickle

    from sweeps.integrations.ray.resource_wait import PendingTimeout

    cb = PendingTimeout(5, 1, 0)
    cb.on_step_begin(0, _trials("PENDING"))
    assert cb._since is not None
    assert pickle.loads(pickle.dumps(cb))._since is None


# --------------------------------------------------------------------------- the store


def _fabricate_sweep(d: Path, name: str, status: str, register: bool) -> None:
    """A store as a finished sweep leaves it: a parent run with the champion's tags, the champion's
    trial run, and (register) a model version created from that run."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{d}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("calib-sweeps", artifact_location=(d / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name=name, tags={"calib.sweep": name, "calib.role": "parent"})
    trial = client.create_run(
        exp,
        tags={
            "calib.sweep": name,
            "calib.role": "trial",
            "calib.trial_id": "t1",
            "mlflow.parentRunId": parent.info.run_id,
        },
    )
    client.set_terminated(trial.info.run_id, "FINISHED")
    client.set_tag(parent.info.run_id, "calib.champion_trial", "t1")
    client.set_tag(parent.info.run_id, "calib.champion_run", trial.info.run_id)
    if register:
        client.create_registered_model("calibrated-mnist1d")
        mv = client.create_model_version(
            "calibrated-mnist1d", source=f"runs:/{trial.info.run_id}/model", run_id=trial.info.run_id
        )
        client.set_registered_model_alias("calibrated-mnist1d", "champion", mv.version)
    client.set_terminated(parent.info.run_id, status)


def _snapshot(d: Path) -> tuple:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{d}/mlflow.db")
    exp = client.get_experiment_by_name("calib-sweeps")
    runs = client.search_runs([exp.experiment_id])
    versions = client.search_model_versions("name = 'calibrated-mnist1d'")
    return (
        sorted((r.info.run_id, r.info.status, r.info.end_time, tuple(sorted(r.data.tags.items()))) for r in runs),
        sorted((v.version, v.run_id) for v in versions),
        sorted(str(p.relative_to(d)) for p in d.rglob("*")),
    )


def _launch(d: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    return subprocess.run(
        [sys.executable, str(LAUNCH), *args], cwd=d, capture_output=True, text=True, timeout=120, env=env
    )


def test_resume_of_a_finished_sweep_changes_nothing(tmp_path):
    _fabricate_sweep(tmp_path, "done", "FINISHED", register=True)
    before = _snapshot(tmp_path)
    proc = _launch(tmp_path, "--resume", "--name", "done")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep 'done' already finished with 1 trial: champion trial t1"), (
        proc.stdout
    )
    assert "calibrated-mnist1d version 1 (alias champion)" in lines[0] and "nothing changed" in lines[0]
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "ray_results").exists()

    # a count at or below the trials it has adds nothing; growing an in-memory study is refused, naming the field
    same = _launch(tmp_path, "--resume", "--name", "done", "--num-samples", "1")
    assert same.returncode == 0 and "nothing changed (--num-samples above 1 grows it)" in same.stdout, same.stdout
    memory = _launch(tmp_path, "--resume", "--name", "done", "--num-samples", "3", "--set", "search.storage=memory")
    assert memory.returncode == 2, memory.stdout + memory.stderr
    assert memory.stderr.startswith("error: search.num_samples: growing sweep 'done' from 1 to 3 trials needs")
    assert _snapshot(tmp_path) == before

    again = _launch(tmp_path, "--name", "done")  # without --resume: the name is taken
    assert again.returncode == 2
    assert again.stderr.startswith("error: name: sweep 'done' already exists") and "--resume" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_unfinished_or_unregistered_sweeps_are_resumed(tmp_path):
    _fabricate_sweep(tmp_path, "cut", "KILLED", register=True)
    assert (
        existing.check_store(
            _cfg(f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "name=cut", f"storage_path={tmp_path}/ray_results"),
            resume=True,
        )
        is None
    )
    other = tmp_path / "other"
    other.mkdir()
    _fabricate_sweep(other, "sel", "FINISHED", register=False)
    assert (
        existing.check_store(
            _cfg(f"tracking.uri=sqlite:///{other}/mlflow.db", "name=sel", f"storage_path={other}/ray_results"),
            resume=True,
        )
        is None
    )


def test_store_that_does_not_exist_is_not_created(tmp_path):
    cfg = _cfg(f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"storage_path={tmp_path}/ray_results")
    assert existing.check_store(cfg, resume=True) is None
    assert list(tmp_path.iterdir()) == []


def test_taken_name_in_the_tune_storage_is_refused(tmp_path):
    (tmp_path / "ray_results" / "old").mkdir(parents=True)
    (tmp_path / "ray_results" / "old" / "tuner.pkl").write_bytes(b"")
    cfg = _cfg(f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"storage_path={tmp_path}/ray_results", "name=old")
    with pytest.raises(ConfigError, match="^name: sweep 'old' already exists"):
        existing.check_store(cfg, resume=False)
    assert existing.check_store(cfg, resume=True) is None


def test_study_exists_on_a_database_server_without_optuna_tables(tmp_path):
    """A new database (no Optuna tables yet, as on a fresh PostgreSQL) holds no study, and is not
    an error; once a study exists it is found by name. (A `sqlite+pysqlite` URL takes the same
    SQLAlchemy path as a server URL.)"""
    import optuna

    db = tmp_path / "server.db"
    db.touch()
    url = f"sqlite+pysqlite:///{db}"
    assert existing._study_exists(url, "sweep") is False
    optuna.create_study(study_name="sweep", storage=url)
    assert existing._study_exists(url, "sweep") is True
    assert existing._study_exists(url, "other") is False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cluster_waits_for_a_store_that_comes_up_late(capsys):
    """On a cluster a database that starts listening 1.5 s after the check began is found (a Service whose pod
    is still starting); locally the same check fails at once; a store that never answers fails after the wait."""
    import socket
    import threading
    import time

    port = _free_port()
    url = f"postgresql://u:secret@127.0.0.1:{port}/db"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"search.storage: no database answers at 127.0.0.1:{port} \(Connection"):
        servers.check_study_storage(url, cluster=False)
    assert time.monotonic() - t0 < 1.0

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_late() -> None:
        time.sleep(1.5)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_late, daemon=True).start()
    t0 = time.monotonic()
    try:
        servers.check_study_storage(url, cluster=True)
    finally:
        server.close()
    waited = time.monotonic() - t0
    assert 1.4 < waited < 10, waited
    err = capsys.readouterr().err
    assert f"waiting up to {servers.CLUSTER_WAIT_S:g} s for 127.0.0.1:{port} (Connection refused)" in err
    assert "secret" not in err

    reason = servers.wait_for(lambda: "cannot resolve host 'mlflow'", "http://mlflow:5000", True, wait_s=1.0)
    assert reason == "cannot resolve host 'mlflow', still after 1 s"
    # a reason no wait can change fails at once
    t0 = time.monotonic()
    assert servers.wait_for(lambda: "HTTP 404 for x", "x", True, wait_s=30) == "HTTP 404 for x"
    assert time.monotonic() - t0 < 0.5

"""Helpers for the end-to-end sweep tests: run the CLI, read the MLflow store, serve the UI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "sweeps" / "launch.py"
ARTIFACTS = ROOT / "test-artifacts"
# Small but real: MNIST-1D, 2 epochs, a 1D CNN; each trial takes seconds on one core.
FAST = ["--set", "run.data.num_samples=1200", "--set", "run.train.epochs=2", "--set", "run.train.batch_size=64"]


def launch(cwd: Path, *args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python sweeps/launch.py ARGS` in `cwd` and return the finished process."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(LAUNCH), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )


def store_ready(cwd: Path) -> bool:
    """Whether the driver has finished creating its SQLite store in `cwd` (schema at this MLflow's head), read
    without MLflow: a client opened on a store still being created runs MLflow's table set-up too, and the two
    set-ups collide (`table _alembic_tmp_params already exists`)."""
    import sqlite3

    from mlflow.store.db.utils import _get_latest_schema_revision

    db = cwd / "mlflow.db"
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            has_parent = conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False
    return bool(row) and row[0] == _get_latest_schema_revision() and has_parent


def store(cwd: Path) -> MlflowClient:
    """A client on the sweep's default SQLite store in `cwd`."""
    return MlflowClient(f"sqlite:///{cwd.resolve()}/mlflow.db")


def sweep_runs(client: MlflowClient, sweep: str, experiment: str = "calib-sweeps") -> tuple[list, list]:
    """(parent runs, child runs) tagged with this sweep name."""
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`calib.sweep` = '{sweep}'", max_results=1000)
    parents = [r for r in runs if r.data.tags.get("calib.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("calib.role") == "trial"]
    return parents, children


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(backend_uri: str, artifacts_dir: Path) -> Iterator[str]:
    """An MLflow tracking server on loopback; yields its URL and stops it afterwards."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        str(artifacts_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(artifacts_dir.parent / f"mlflow-server-{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc, log.name)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def chromium_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver) from Debian's packages, or None when not installed."""
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def wait_http(url: str, proc: subprocess.Popen, log_path: str | Path, timeout: float = 90) -> None:
    """Wait until `url` answers 200; fails with the server log's tail when `proc` exits or `timeout` passes."""
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"no answer in {timeout:g} s"
            raise AssertionError(f"{url}: {why}; {log_path}:\n{Path(log_path).read_text()[-3000:]}")
        time.sleep(0.5)


@contextmanager
def optuna_dashboard(storage_url: str, log_dir: Path) -> Iterator[str]:
    """optuna-dashboard (the command the README shows) on loopback; yields its URL and stops it afterwards."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "optuna-dashboard"),
        storage_url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = open(log_dir / f"optuna-dashboard-{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/api/meta", proc, log.name)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@contextmanager
def headless_chromium(paths: tuple[str, str], window: str = "1600,3200") -> Iterator[object]:
    """A selenium driver on Debian's headless Chromium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--window-size={window}",
    ):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(paths[1]), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def stop_ray_under(temp_dir: str, grace_s: float = 15.0, gcs_port: int | None = None) -> list[int]:
    """Stop only the Ray processes this test started: those whose command line names `temp_dir` (the cluster's
    RAY_TMPDIR, so every raylet, GCS and worker of it carries its session folder there). Never `ray stop --force`,
    which kills every Ray cluster on the machine. The raylets first, as `ray stop` does (their workers go with
    them), then the monitors and dashboard, the GCS last: signalled all at once, raylets, GCS and autoscaler
    monitor each wait on another's answer and outlast any grace (15 s) until SIGKILLed; in this order the whole
    cluster is gone in about a second. `gcs_port`: also the Ray Client server `ray start --head` starts, whose
    command line names the GCS's address but not the folder. SIGTERM first, SIGKILL after `grace_s`; returns the
    pids."""
    import signal

    mine = os.getpid()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        client_server = gcs_port is not None and "ray.util.client.server" in cmd and f":{gcs_port} " in f"{cmd} "
        if temp_dir in cmd or client_server:
            found[int(entry.name)] = cmd
    raylets = [p for p, cmd in found.items() if cmd.split(" ")[0].endswith("/raylet")]
    gcs = [p for p, cmd in found.items() if cmd.split(" ")[0].endswith("/gcs_server")]
    rest = [p for p in found if p not in raylets and p not in gcs]

    def running(pids: list[int]) -> list[int]:
        alive = []
        for p in pids:
            try:
                state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                alive.append(p)
        return alive

    def signal_and_wait(pids: list[int], sig: int, until: float) -> None:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        while time.monotonic() < until and running(pids):
            time.sleep(0.1)

    deadline = time.monotonic() + grace_s
    for group in (raylets, rest, gcs):
        signal_and_wait(group, signal.SIGTERM, deadline)
    signal_and_wait(running(list(found)), signal.SIGKILL, time.monotonic() + 5.0)
    return list(found)


@contextmanager
def local_ray_cluster(worker_cpus: int | None = 1, node_death_s: float | None = None) -> Iterator[dict]:
    """A Ray cluster on this machine (a head with one CPU and resource `head_node`, and unless `worker_cpus` is
    None a worker with `worker_cpus` CPUs and `worker_node`), token-authenticated, in a short RAY_TMPDIR of its
    own; yields {"port", "ray_tmp", "env" (for `ray` commands), "launch_env" (for launch.py --cluster)}; stops
    only its own processes afterwards. `node_death_s`: the GCS marks a node dead after about that many seconds
    without an answer to its health checks (Ray's default is 5 missed checks 3 s apart, plus their timeouts)."""
    import secrets
    import tempfile

    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    token = secrets.token_hex(32)
    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_TMPDIR": ray_tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if node_death_s is not None:  # Ray's system config, read from RAY_<name> by every process `ray start` starts
        period_ms = max(100, int(node_death_s * 1000 / 5))
        env |= {
            "RAY_health_check_period_ms": str(period_ms),
            "RAY_health_check_timeout_ms": str(period_ms),
            "RAY_health_check_failure_threshold": "5",
        }

    def ray_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([ray, *args], env=env, capture_output=True, text=True, timeout=180)

    common = ["--node-ip-address", "127.0.0.1"]
    try:
        head = ray_cmd(
            "start", "--head", *common, "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false",
            "--resources", '{"head_node": 1}',
        )  # fmt: skip
        assert head.returncode == 0, head.stderr[-2000:]
        if worker_cpus is not None:
            worker = ray_cmd(
                "start", "--address", f"127.0.0.1:{port}", *common, "--num-cpus", str(worker_cpus),
                "--resources", '{"worker_node": 1}',
            )  # fmt: skip
            assert worker.returncode == 0, worker.stderr[-2000:]
        yield {
            "port": port,
            "ray_tmp": ray_tmp,
            "env": env,
            "launch_env": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_ADDRESS": f"127.0.0.1:{port}"}
            | {"CALIB_SHARED_STORAGE": "1"},
        }
    finally:
        stop_ray_under(ray_tmp, gcs_port=port)  # only this cluster (never `ray stop --force`)
        shutil.rmtree(ray_tmp, ignore_errors=True)

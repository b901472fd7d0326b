"""Tracking-server outages mid-sweep: announced once, waited out with backoff, bounded by tracking.outage_timeout_s;
the trials keep training meanwhile (MLflow writes run off Tune's event loop) and nothing they reported is lost.

A local `mlflow server` (SQLite backend) is stopped while trials run and started again on the same
port and backend; the sweep must then finish with one run per trial and every epoch step logged
exactly once. Past a short configured limit the sweep stops with a one-line reason and
`--resume` completes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.sweep_helpers import LAUNCH, free_port, launch, sweep_runs

pytestmark = pytest.mark.slow

EPOCHS = 5
ARGS = [
    "--num-samples",
    "3",
    "--max-concurrent",
    "1",
    "--set",
    "run.data.num_samples=1200",
    "--set",
    f"run.train.epochs={EPOCHS}",
    "--set",
    "run.train.batch_size=64",
]


class Server:
    """`mlflow server` on a fixed port and backend, stopped and started again at will."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        (root / "artifacts").mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root}/mlflow.db",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        raise AssertionError("mlflow server did not come up")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        self.proc = None


def _driver(cwd: Path, url: str, name: str, *extra: str) -> subprocess.Popen:
    # later --set values win: the outage test slows its trials down (data) so the outage overlaps training
    return subprocess.Popen(
        [sys.executable, str(LAUNCH), *ARGS, "--name", name, "--tracking-uri", url, *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for_epochs(client: MlflowClient, name: str, driver: subprocess.Popen, steps: int = 1) -> None:
    deadline = time.time() + 400
    while time.time() < deadline:
        time.sleep(1)
        assert driver.poll() is None, driver.stdout.read()[-3000:] if driver.stdout else ""
        try:
            children = sweep_runs(client, name)[1]
            if children and any(len(client.get_metric_history(c.info.run_id, "epoch_time")) >= steps for c in children):
                return
        except Exception:
            continue
    raise AssertionError("no trial logged an epoch in time")


def _check_complete(client: MlflowClient, name: str) -> None:
    parents, children = sweep_runs(client, name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 3 and all(r.info.status == "FINISHED" for r in children), [
        (r.data.tags.get("calib.trial_id"), r.info.status) for r in children
    ]
    for run in children:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch_time"))
        assert len(steps) == EPOCHS and len(set(steps)) == EPOCHS, (run.data.tags.get("calib.trial_id"), steps)
        for key in ("val_ece", "val_accuracy"):
            hist = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert len(hist) == len(set(hist)), (key, hist)


def _kill(driver: subprocess.Popen) -> None:
    try:
        os.killpg(driver.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    driver.wait(timeout=30)


def test_outage_is_announced_once_and_waited_out(tmp_path):
    server = Server(tmp_path / "server")
    server.start()
    # about a second per epoch here, so that most of the 15 epochs fall inside the 30 s outage, which starts
    # as soon as the first trial's run exists
    driver = _driver(tmp_path, server.url, "outage", "--set", "run.data.num_samples=16000")
    try:
        client = MlflowClient(server.url)
        _wait_for_epochs(client, "outage", driver, steps=0)
        server.stop()
        t_down = time.time()
        time.sleep(30)
        t_up = time.time()
        server.start()
        print(f"server down for {time.time() - t_down:.0f} s")
        out, _ = driver.communicate(timeout=900)
        print(out[-4000:])
        assert driver.returncode == 0, out[-4000:]
        waiting = [line for line in out.splitlines() if "unreachable" in line]
        back = [line for line in out.splitlines() if "is back after" in line]
        print("\n".join(["what the user saw:", *waiting, *back]))
        assert len(waiting) == 1 and "tracking.outage_timeout_s" in waiting[0], waiting
        assert len(back) == 1, back
        noise = [line for line in out.splitlines() if "Retry(" in line or "Max retries" in line]
        assert not noise, noise[:3]  # no line per retry from MLflow or urllib3
        _check_complete(client, "outage")
        # the trials kept training while the server was down: epochs measured inside the outage window
        # (metric timestamps are when the trial reported the epoch, seconds) reached the store afterwards
        _, children = sweep_runs(client, "outage")
        stamps = [m.timestamp / 1000 for r in children for m in client.get_metric_history(r.info.run_id, "epoch_time")]
        during = [t for t in stamps if t_down + 1 <= t <= t_up - 1]
        print(f"{len(during)} of {len(stamps)} epochs were measured while the server was down")
        assert len(during) >= 3, (t_down, t_up, sorted(stamps))
    finally:
        _kill(driver)
        server.stop()


def test_outage_past_the_limit_stops_and_resume_completes(tmp_path):
    server = Server(tmp_path / "server")
    server.start()
    driver = _driver(tmp_path, server.url, "limit", "--set", "tracking.outage_timeout_s=8")
    try:
        client = MlflowClient(server.url)
        _wait_for_epochs(client, "limit", driver, steps=2)
        server.stop()
        t_down = time.time()
        out, _ = driver.communicate(timeout=300)
        print(f"driver exited {time.time() - t_down:.0f} s after the server went down, code {driver.returncode}")
        print(out[-3000:])
        assert driver.returncode not in (0, None)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "tracking.outage_timeout_s=8" in errors[0] and "--resume" in errors[0], out[-3000:]
        assert "Traceback" not in out
        server.start()
        proc = launch(tmp_path, *ARGS, "--name", "limit", "--tracking-uri", server.url, "--resume", timeout=900)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        _check_complete(client, "limit")
    finally:
        _kill(driver)
        server.stop()

"""A slow, flaky tracking server (issue #36, fault 4): latency and intermittent HTTP 500s in front of MLflow.

A stdlib reverse proxy in front of a local `mlflow server` (SQLite backend) sleeps a seeded random
LATENCY_S per request and answers HTTP 500 to a seeded share of them: some without forwarding (the
server never saw the call) and some after forwarding (the server stored it, the client saw a 500: a
retry must not log it twice). The same short sweep runs straight against the server and through the
proxy; both must keep the service's promises (one run per trial, terminal statuses, every epoch step
logged once per metric, the champion registered once, no process left), and the test prints what the
latency cost: the trials' wall time either way and the writer queue's longest length (against its bound).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from sweeps.contract import TAG_QUEUE_MAX, TAG_QUEUE_WAIT
from sweeps.integrations.mlflow.sweep_runs import WRITER_QUEUE_BOUND
from sweeps.integrations.ray.session import SESSIONS_DIR, session_processes
from tests.sweep_helpers import LAUNCH, mlflow_server, sweep_runs

pytestmark = pytest.mark.slow

SEED = 36
# Seconds added to each request. At 1-3 s (the figure; CALIB_SLOW_TRACKING_LATENCY=1,3) the proxied sweep
# took 865 s in one run here (no result file: the user guide no longer quotes it), too long for the slow tier, which
# runs 0.1-0.3 s (~145 s).
LATENCY_S = tuple(float(x) for x in os.environ.get("CALIB_SLOW_TRACKING_LATENCY", "0.1,0.3").split(","))
FAIL_BEFORE = 0.10  # answered 500 without forwarding
FAIL_AFTER = 0.05  # forwarded (stored), then answered 500
EPOCHS = 3
ARGS = [
    "--num-samples",
    "2",
    "--max-concurrent",
    "2",
    "--set",
    "run.data.num_samples=1200",
    "--set",
    f"run.train.epochs={EPOCHS}",
    "--set",
    "run.train.batch_size=64",
]
EPOCH_KEYS = ("epoch_time", "val_ece", "val_accuracy")


class SlowFlakyProxy:
    """A threaded HTTP reverse proxy to `upstream` adding seeded latency and seeded HTTP 500s (counted)."""

    def __init__(
        self,
        upstream: str,
        latency_s: tuple[float, float],
        fail_before: float,
        fail_after: float,
        seed: int = SEED,
    ) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.latency_s, self.fail_before, self.fail_after = latency_s, fail_before, fail_after
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.counts = {"requests": 0, "500_before": 0, "500_after": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as MLflow's pooled session expects

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                out = b""
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    out += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return out

            def _send(self, code: int, headers: list[tuple[str, str]], body: bytes) -> None:
                self.send_response(code)
                for k, v in headers:
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                body = self._body()
                delay, fate = proxy.draw()
                time.sleep(delay)
                if fate == "500_before":
                    self._send(500, [("Content-Type", "text/plain")], b"Internal Server Error (proxy, not forwarded)")
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data, status, out_headers = resp.read(), resp.status, resp.getheaders()
                finally:
                    conn.close()
                if fate == "500_after":
                    self._send(500, [("Content-Type", "text/plain")], b"Internal Server Error (proxy, forwarded)")
                    return
                self._send(status, out_headers, data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="slow-proxy", daemon=True)

    def draw(self) -> tuple[float, str]:
        """(latency, fate) of the next request, from the seeded generator."""
        with self.lock:
            self.counts["requests"] += 1
            delay, r = self.rng.uniform(*self.latency_s), self.rng.random()
            fate = (
                "500_before" if r < self.fail_before else "500_after" if r < self.fail_before + self.fail_after else ""
            )
            if fate:
                self.counts[fate] += 1
            return delay, fate

    def __enter__(self) -> SlowFlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def _sweep(cwd: Path, url: str, name: str) -> tuple[subprocess.CompletedProcess, float, dict | None]:
    """Run the sweep to the end: (the finished driver, its wall time, its Ray session record while it ran)."""
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(LAUNCH), *ARGS, "--name", name, "--tracking-uri", url]
    cmd += ["--set", f"tracking.registered_model=calibrated-{name}"]
    start = time.monotonic()
    driver = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    record: dict | None = None
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(driver.stdout or []), daemon=True)
    reader.start()
    sessions = cwd / "ray_results" / SESSIONS_DIR
    try:
        while driver.poll() is None:
            if record is None and (sessions / f"{driver.pid}.json").is_file():
                try:
                    record = json.loads((sessions / f"{driver.pid}.json").read_text())
                except ValueError:
                    pass  # written as we read it
            time.sleep(0.5)
            assert time.monotonic() - start < 300 + 500 * max(LATENCY_S), "".join(out)[-4000:]  # ~400 requests
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
        driver.wait(timeout=30)
        reader.join(timeout=30)
    took = time.monotonic() - start
    (cwd / "driver.log").write_text("".join(out))  # for a failed run: what the driver said
    return subprocess.CompletedProcess(cmd, driver.returncode, "".join(out), ""), took, record


def _phases(out: str) -> dict[str, float]:
    """The driver's phase times (its `Timing:` line): start, trials, registration, ... in seconds."""
    from sweeps.report.timing import START_WORDS

    line = next((ln for ln in out.splitlines() if ln.startswith("Timing:")), "").replace(START_WORDS, "start")
    return {k.strip(): float(v) for k, v in re.findall(r"([a-zA-Z ]+?) (\d+(?:\.\d+)?)s", line.removeprefix("Timing:"))}


def _check_promises(client: MlflowClient, name: str, proc: subprocess.CompletedProcess, record: dict | None) -> dict:
    """The service's promises after a sweep; returns what was measured (trial wall times, the queue's length)."""
    assert proc.returncode == 0, proc.stdout[-4000:]
    # the driver's own lines (Ray forwards its trial workers' teardown noise, "(train_trial pid=...) Traceback")
    driver_lines = [ln for ln in proc.stdout.splitlines() if "pid=" not in ln[:40]]
    assert not [ln for ln in driver_lines if "Traceback" in ln], proc.stdout[-4000:]
    parents, children = sweep_runs(client, name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [p.info.status for p in parents]
    trial_ids = [r.data.tags.get("calib.trial_id") for r in children]
    assert len(children) == 2 and len(set(trial_ids)) == 2, trial_ids  # exactly one run per trial
    assert all(r.info.status == "FINISHED" for r in children), [(t, r.info.status) for t, r in zip(trial_ids, children)]
    for run in children:
        rid = run.info.run_id
        for key in EPOCH_KEYS:
            steps = sorted(m.step for m in client.get_metric_history(rid, key))
            assert steps == sorted(set(steps)) and len(steps) == EPOCHS, (
                run.data.tags.get("calib.trial_id"),
                key,
                steps,
            )
        for key in run.data.metrics:  # every other metric (final, test, intervals) logged once at its step
            hist = client.get_metric_history(rid, key)
            assert len(hist) == len({m.step for m in hist}), (key, [(m.step, m.value) for m in hist])
    model = f"calibrated-{name}"
    versions = client.search_model_versions(f"name = '{model}'")
    champion_run = parents[0].data.tags.get("calib.champion_run")
    assert len(versions) == 1 and versions[0].run_id == champion_run, [(v.version, v.run_id) for v in versions]
    assert client.get_model_version_by_alias(model, "champion").version == versions[0].version
    # nothing of the sweep outlives it: its Ray session's processes and its own process group are gone
    assert record is not None, "the driver never recorded its Ray session"
    assert session_processes(record["session_dir"], record.get("raylet_pids")) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(record["driver_pid"], 0)
    tags = parents[0].data.tags
    return {
        "trial_wall_s": sorted(float(r.data.metrics["wall_time"]) for r in children),
        "phases": _phases(proc.stdout),
        "queue_max": int(tags[TAG_QUEUE_MAX]),
        "queue_wait_s": float(tags[TAG_QUEUE_WAIT]),
    }


def test_slow_flaky_tracking_server_keeps_every_promise(tmp_path):
    with mlflow_server(f"sqlite:///{tmp_path}/mlflow.db", _artifacts(tmp_path)) as url:
        client = MlflowClient(url)  # read straight from the server: the checks go around the proxy
        direct, direct_s, direct_record = _sweep(tmp_path / "direct", url, "direct")
        base = _check_promises(client, "direct", direct, direct_record)
        with SlowFlakyProxy(url, LATENCY_S, FAIL_BEFORE, FAIL_AFTER) as proxy:
            slow, slow_s, slow_record = _sweep(tmp_path / "slow", proxy.url, "slow")
        print(slow.stdout[-3000:])
        got = _check_promises(client, "slow", slow, slow_record)
    said = [line for line in slow.stdout.splitlines() if "MLflow tracking server" in line]
    print(
        f"proxy: {proxy.counts['requests']} requests, latency {LATENCY_S[0]:g}-{LATENCY_S[1]:g} s each, "
        f"{proxy.counts['500_before']} answered 500 unforwarded, {proxy.counts['500_after']} after forwarding\n"
        f"sweep wall time: {direct_s:.0f} s direct, {slow_s:.0f} s through the proxy\n"
        f"driver's phases (s): {base['phases']} direct, {got['phases']} through the proxy\n"
        f"trial wall time (s): {base['trial_wall_s']} direct, {got['trial_wall_s']} through the proxy\n"
        f"writer queue: longest {base['queue_max']} direct, {got['queue_max']} through the proxy "
        f"(bound {WRITER_QUEUE_BOUND}); Tune waited {got['queue_wait_s']:g} s on it\n"
        f"what the user saw of it: {said}"
    )
    assert proxy.counts["500_before"] and proxy.counts["500_after"], proxy.counts  # both kinds were exercised
    assert got["queue_max"] < WRITER_QUEUE_BOUND and got["queue_wait_s"] == 0
    # the writer thread hides the latency from the trials: they train as fast as without it (loose: 2 loaded cores)
    assert sum(got["trial_wall_s"]) <= 2 * sum(base["trial_wall_s"]) + 5, (base, got)


def _artifacts(tmp_path: Path) -> Path:
    path = tmp_path / "server" / "artifacts"
    path.mkdir(parents=True)
    return path

"""What MLflow's basic auth costs the tracking server per request, with and without its credential cache.

    python -m benchmarks.perf.bench_mlflow_auth            # writes results/bench_mlflow_auth.md, .json
    python -m benchmarks.perf.bench_mlflow_auth --quick    # a small run into a temp folder (a check that it runs)

MLflow's basic-auth app checks the password hash (werkzeug's, MLflow's default parameters) on every request unless
`auth_cache_ttl_seconds` is set in its auth config, so a tracking server's CPU goes to hashing rather than to
tracking. The service's MLflow image sets it (docker/mlflow-entrypoint.sh, MLFLOW_AUTH_CACHE_TTL_SECONDS). Here
`mlflow server --app-name basic-auth` runs on this machine through that entrypoint (SQLite stores, one worker, plain
HTTP) with the cache off (0 s) and on (the entrypoint's default), the two servers in turn, `--rounds` times each. In each round a user that is
not the admin (as the sweep's own user is not) logs metrics to its run, one `runs/log-metric` request at a time over
one connection: what a trial's tracking does. Per round: requests per second (wall) and the server's CPU per request
(utime + stime of the server's process tree from /proc, before and after). Reported: the median over rounds with the
range, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    command_line,
    host_info,
    host_line,
    out_dir,
    read_json,
    utc_minute,
    utc_now,
    write_json,
    write_text,
)
from benchmarks.provenance import cpu_model, git_state

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "mlflow-entrypoint.sh"


def _entrypoint_ttl() -> int:
    """The cache TTL the image's entrypoint writes when MLFLOW_AUTH_CACHE_TTL_SECONDS is not set."""
    for line in ENTRYPOINT.read_text().splitlines():
        if line.startswith("ttl=") and ":-" in line:
            return int(line.split(":-", 1)[1].split("}", 1)[0])
    raise SystemExit(f'no default TTL (a line ttl="${{MLFLOW_AUTH_CACHE_TTL_SECONDS:-N}}") in {ENTRYPOINT}')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and every live descendant, from /proc."""
    tck = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(rest[1]), []).append(int(entry))
        stats[int(entry)] = (int(rest[11]) + int(rest[12])) / tck
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo += children.get(p, [])
    return total


class Server:
    """`mlflow server --app-name basic-auth` on SQLite in `root` through docker/mlflow-entrypoint.sh, its credential
    cache TTL `ttl` seconds (MLFLOW_AUTH_CACHE_TTL_SECONDS)."""

    def __init__(self, root: Path, ttl: int) -> None:
        self.root, self.ttl, self.port = root, ttl, _free_port()
        self.admin = ("admin", secrets.token_urlsafe(18))
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "MLFLOW_AUTH_CONFIG_PATH": str(root / "auth" / "basic_auth.ini"),
            "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{root / 'auth.db'}",
            "MLFLOW_AUTH_CACHE_TTL_SECONDS": str(ttl),
            "MLFLOW_AUTH_ADMIN_USERNAME": self.admin[0],
            "MLFLOW_AUTH_ADMIN_PASSWORD": self.admin[1],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "PROMETHEUS_MULTIPROC_DIR": "",
        }
        # the image's entrypoint writes the auth config (its cache TTL included) and execs `mlflow server`
        cmd = ["sh", str(ENTRYPOINT), "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
        cmd += ["--default-artifact-root", str(root / "artifacts")]
        self.log = open(root / "server.log", "w")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 120.0) -> None:
        """Until the server answers /health."""
        import requests

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"mlflow server exited ({self.proc.returncode}): {(self.root / 'server.log').read_text()[-2000:]}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise SystemExit(f"mlflow server gave no answer on /health within {timeout:.0f} s")

    def stop(self) -> None:
        """Stop the server's process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _session(server: Server) -> tuple[Any, str]:
    """A user that is not the admin, with an experiment and a run of its own: (its HTTP session, the run's id)."""
    import requests

    api = f"{server.url}/api/2.0/mlflow"
    admin = requests.Session()
    admin.auth = server.admin
    user = (f"sweep-{secrets.token_hex(4)}", secrets.token_urlsafe(18))
    admin.post(f"{api}/users/create", json={"username": user[0], "password": user[1]}).raise_for_status()
    s = requests.Session()
    s.auth = user
    exp = s.post(f"{api}/experiments/create", json={"name": f"bench-{secrets.token_hex(4)}"})
    exp.raise_for_status()
    run = s.post(f"{api}/runs/create", json={"experiment_id": exp.json()["experiment_id"]})
    run.raise_for_status()
    return s, run.json()["run"]["info"]["run_id"]


def measure(server: Server, requests_n: int) -> dict[str, float]:
    """`requests_n` log-metric requests of a non-admin user, one at a time: requests/s and server CPU ms/request."""
    s, run_id = _session(server)
    url = f"{server.url}/api/2.0/mlflow/runs/log-metric"
    body = {"run_id": run_id, "key": "val_ece", "value": 0.05, "timestamp": 0, "step": 0}
    s.post(url, json=body).raise_for_status()  # the connection open and the credential seen once, as in a trial
    cpu0, t0 = _tree_cpu(server.proc.pid), time.perf_counter()
    for step in range(1, requests_n + 1):
        r = s.post(url, json={**body, "step": step})
        if r.status_code != 200:
            raise SystemExit(f"log-metric answered {r.status_code}: {r.text[:300]}")
    wall, cpu = time.perf_counter() - t0, _tree_cpu(server.proc.pid) - cpu0
    return {
        "requests": requests_n,
        "wall_s": wall,
        "cpu_s": cpu,
        "per_s": requests_n / wall,
        "cpu_ms": 1e3 * cpu / requests_n,
    }


def _median_range(values: list[float], nd: int) -> str:
    return f"{statistics.median(values):.{nd}f} ({min(values):.{nd}f}-{max(values):.{nd}f})"


def markdown(data: dict[str, Any]) -> str:
    """The report: one row per cache setting, and the ratio."""
    rows = data["rows"]
    by: dict[int, list[dict[str, float]]] = {}
    for r in rows:
        by.setdefault(r["ttl"], []).append(r)
    off, on = by[0], by[data["ttl"]]
    med = {
        k: (statistics.median(r["per_s"] for r in v), statistics.median(r["cpu_ms"] for r in v)) for k, v in by.items()
    }
    lines = [
        "# MLflow's basic auth per request: the credential cache off and on (benchmarks/perf/bench_mlflow_auth.py)",
        "",
        f"Command: `{data['command']}`; {data['when']}, {data['host']}; commit {(data['git_commit'] or 'unknown')[:10]}"
        f"{'' if data['git_clean'] else ' (with uncommitted changes)'}. `mlflow server "
        f"--app-name basic-auth` (MLflow {data['mlflow']}, SQLite, 1 worker, HTTP) on this machine; a user that is "
        f"not the admin logs {data['requests']} metrics one request at a time; {data['rounds']} rounds per setting, "
        "the settings in turn. Median over rounds (range).",
        "",
        "| auth_cache_ttl_seconds | requests per second | server CPU per request, ms |",
        "|---|---|---|",
        f"| 0 (MLflow's default: the password hash checked on every request) | {_median_range([r['per_s'] for r in off], 1)} "
        f"| {_median_range([r['cpu_ms'] for r in off], 1)} |",
        f"| {data['ttl']} (the image's default) | {_median_range([r['per_s'] for r in on], 1)} "
        f"| {_median_range([r['cpu_ms'] for r in on], 1)} |",
        "",
        f"With the cache: {med[data['ttl']][0] / med[0][0]:.1f} times the requests per second, "
        f"{med[0][1] / med[data['ttl']][1]:.1f} times less server CPU per request (ratios of the medians).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench_mlflow_auth.md and .json."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60, help="log-metric requests per round (default 60)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per cache setting (default 3)")
    p.add_argument("--quick", action="store_true", help="30 requests, 1 round, into a temp folder")
    p.add_argument("--out", type=Path, default=None, help="where the .md / .json go (default: benchmarks/results)")
    p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json in --out, no run")
    args = p.parse_args(argv)
    if args.report_only:
        out = out_dir(args.out)
        write_text(out / "bench_mlflow_auth.md", markdown(read_json(out / "bench_mlflow_auth.json")))
        return 0
    if args.quick:
        args.requests, args.rounds = 30, 1
    import mlflow

    ttl = _entrypoint_ttl()
    out = out_dir(args.out, args.quick)
    work = Path(tempfile.mkdtemp(prefix="bench_mlflow_auth_"))
    rows: list[dict[str, Any]] = []
    try:
        servers: dict[int, Server] = {}
        try:
            for t in (0, ttl):
                (work / f"ttl{t}").mkdir()
                servers[t] = Server(work / f"ttl{t}", t)
            for s in servers.values():
                s.wait()
            for rnd in range(args.rounds):
                for t, s in servers.items():
                    r = measure(s, args.requests)
                    rows.append({"ttl": t, "round": rnd, **r})
                    print(f"ttl {t:>3} s, round {rnd + 1}: {r['per_s']:.1f} requests/s, {r['cpu_ms']:.1f} ms CPU each")
        finally:
            for s in servers.values():
                s.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit, clean = git_state()
    data = {
        "command": command_line(__file__, argv),
        "when": utc_minute(),
        "measured_at": utc_now(),
        "host": host_line(),
        "machine": {**host_info(), "cpu_model": cpu_model()},
        "git_commit": commit,
        "git_clean": clean,
        "mlflow": mlflow.__version__,
        "ttl": ttl,
        "requests": args.requests,
        "rounds": args.rounds,
        "rows": rows,
    }
    md = markdown(data)
    print(md)
    write_text(out / "bench_mlflow_auth.md", md)
    write_json(out / "bench_mlflow_auth.json", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

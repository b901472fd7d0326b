"""The CPU a sweep spends before its first trial, by process, and the wall time that CPU allows on this machine.

    python -m benchmarks.perf.bench_startup_cpu            # writes results/bench_startup_cpu.md, .json
    python -m benchmarks.perf.bench_startup_cpu --quick    # one run into a temp folder (a check that it runs)

Each run is `python sweeps/launch.py` (the demo config) in a fresh working directory, traced
(CALIB_STARTUP_TRACE, sweeps/start_steps.py). When the trace says the first trial begins, the CPU of the launch's
whole process tree is read from /proc (each process's utime + stime, plus the CPU of the children it has reaped: the
model/data check's child), then the sweep is stopped with SIGINT (its own handling: runs KILLED, Ray stopped).
The first run warms the caches the launch keeps (calib_core/cache_dir.py: the model/data check's answer, MLflow's
empty store); the report is over the runs after it, which is what a user's second launch sees.

The floor is the tree's CPU divided by the machine's cores: no schedule of that work, however parallel, starts the
first trial sooner on this machine. It is a floor for the work as it is, not for less work.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, command_line, host_line, out_dir, read_json, utc_now, write_json, write_text
from benchmarks.provenance import cpu_model, git_state

LAUNCH = ROOT / "sweeps" / "launch.py"
TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # (what a process's command line holds, its kind in the report), first match
    ("launch.py", "the sweep's driver (with the model/data check's child)"),
    ("raylet", "Ray: raylet"),
    ("gcs_server", "Ray: GCS"),
    ("DashboardAgent", "Ray: dashboard agent"),
    ("RuntimeEnvAgent", "Ray: runtime-env agent"),
    ("dashboard.py", "Ray: dashboard head"),
    ("log_monitor", "Ray: log monitor"),
    ("monitor.py", "Ray: monitor"),
    ("ray::", "Ray: workers"),
    ("default_worker", "Ray: workers"),
    ("setup_worker", "Ray: workers"),
)


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of the children it reaped) from /proc, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(v) for v in rest[11:15])
    return int(rest[1]), (utime + stime + cutime + cstime) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """Every live process under `root` (itself included): pid -> (command line, CPU seconds with reaped children)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = got
    inside = {root} if root in cpu else set()
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in inside and pid not in inside}
        inside |= new
        grew = bool(new)
    return {pid: (_cmdline(pid), cpu[pid]) for pid in inside}


def kind(cmdline: str) -> str:
    """The report's name for a process of the tree."""
    return next((name for mark, name in KINDS if mark in cmdline), "other")


def _steps(trace: str) -> dict[str, float]:
    """The start-up steps' seconds from a CALIB_STARTUP_TRACE file (`<time> end <step> <seconds>` lines)."""
    out = {}
    for line in trace.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1] == "end":
            out[parts[2]] = float(parts[3])
    return out


def run_once(workdir: Path, timeout_s: float = 180.0) -> dict[str, Any]:
    """One launch up to its first trial: wall seconds, the tree's CPU by kind, the steps' seconds."""
    trace = workdir / "startup-trace.txt"
    env = {**os.environ, "CALIB_STARTUP_TRACE": str(trace)}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(LAUNCH)],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    last: dict[int, tuple[str, float]] = {}
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the launch ended (exit {proc.returncode}) before its first trial")
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"no first trial within {timeout_s:.0f} s")
            last = tree_cpu(proc.pid) or last
            if trace.exists() and " begin trials" in trace.read_text():
                last = tree_cpu(proc.pid) or last
                break
            time.sleep(0.02)
        wall = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    by_kind: dict[str, float] = {}
    for cmd, seconds in last.values():
        by_kind[kind(cmd)] = by_kind.get(kind(cmd), 0.0) + seconds
    return {
        "wall_s": round(wall, 3),
        "cpu_s": {k: round(v, 3) for k, v in by_kind.items()},
        "steps": _steps(trace.read_text()),
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(runs: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """Medians over runs: wall to the first trial, CPU in all and by kind, the floor (CPU / cores), checks + Ray."""
    totals = [sum(r["cpu_s"].values()) for r in runs]
    kinds = sorted(
        {k for r in runs for k in r["cpu_s"]}, key=lambda k: -_median([r["cpu_s"].get(k, 0.0) for r in runs])
    )
    checks_ray = [r["steps"].get("checks", 0.0) + r["steps"].get("ray_start", 0.0) for r in runs]
    return {
        "runs": len(runs),
        "wall_s": _median([r["wall_s"] for r in runs]),
        "cpu_s": _median(totals),
        "floor_s": _median(totals) / cores,
        "checks_plus_ray_s": _median(checks_ray),
        "by_kind": {k: _median([r["cpu_s"].get(k, 0.0) for r in runs]) for k in kinds},
        "steps": {s: _median([r["steps"].get(s, 0.0) for r in runs]) for s in runs[0]["steps"]} if runs else {},
    }


def markdown(data: dict[str, Any]) -> str:
    """The report: the medians, the floor and the CPU by kind."""
    s = data["summary"]
    lines = [
        "# A sweep's start-up: its CPU and the floor it sets (benchmarks/perf/bench_startup_cpu.py)",
        "",
        f"Command: `{data['command']}`; {data['when']}; {data['host']}; commit {str(data['git_commit'])[:10]}"
        f"{'' if data['git_clean'] else ' (with uncommitted changes)'}. The demo config, {s['runs']} runs after one "
        "that warmed the caches; medians.",
        "",
        "| measure | seconds |",
        "|---|---|",
        f"| launch to the first trial (wall) | {s['wall_s']:.2f} |",
        f"| the start-up's checks + Ray start (the steps' own times) | {s['checks_plus_ray_s']:.2f} |",
        f"| CPU of the launch's process tree until then | {s['cpu_s']:.2f} |",
        f"| **floor: that CPU on {data['cores']} cores** | **{s['floor_s']:.2f}** |",
        "",
        "| process | CPU s |",
        "|---|---|",
        *(f"| {k} | {v:.2f} |" for k, v in s["by_kind"].items()),
        "",
        "| start-up step (sweeps/start_steps.py) | s |",
        "|---|---|",
        *(f"| {k} | {v:.2f} |" for k, v in s["steps"].items()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the launches and write bench_startup_cpu.md and .json."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="measured runs after the warm-up run (default 5)")
    p.add_argument("--quick", action="store_true", help="one measured run, into a temp folder")
    p.add_argument("--out", type=Path, default=None, help="where the .md / .json go (default: benchmarks/results)")
    p.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json in --out, no run")
    args = p.parse_args(argv)
    if args.report_only:
        out = out_dir(args.out)
        write_text(out / "bench_startup_cpu.md", markdown(read_json(out / "bench_startup_cpu.json")))
        return 0
    out = out_dir(args.out, args.quick)
    runs = []
    with tempfile.TemporaryDirectory(prefix="startup-cpu-") as tmp:
        for i in range(1 + (1 if args.quick else args.runs)):
            workdir = Path(tmp) / f"run{i}"
            workdir.mkdir()
            got = run_once(workdir)
            print(
                f"run {i}{' (warm-up)' if i == 0 else ''}: {got['wall_s']:.2f} s, CPU {sum(got['cpu_s'].values()):.2f} s"
            )
            if i > 0:
                runs.append(got)
    commit, clean = git_state()
    cores = os.cpu_count() or 1
    data = {
        "command": command_line(__file__, argv),
        "when": utc_now(),
        "host": host_line(),
        "cpu_model": cpu_model(),
        "cores": cores,
        "git_commit": commit,
        "git_clean": clean,
        "summary": summary(runs, cores),
        "runs": runs,
    }
    md = markdown(data)
    print(md)
    write_text(out / "bench_startup_cpu.md", md)
    write_json(out / "bench_startup_cpu.json", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/perf/bench_startup_cpu.py's own arithmetic: the process tree's CPU read from /proc against children that
burn a known amount (one alive, one already reaped), the steps read from a start-up trace, and the report's medians
and floor on hand-made runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.perf import bench_startup_cpu as bench

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_the_tree_counts_a_live_grandchild_and_a_reaped_child():
    # the child runs a 0.4 s burner to its end (reaped: in the child's own cutime), then starts a 0.3 s one that stays
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.4)!r}])\n"
        f"p = subprocess.Popen([sys.executable, '-c', {(BURN.format(s=0.3) + 'time.sleep(30)')!r}])\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        tree: dict[int, tuple[str, float]] = {}
        while time.monotonic() < deadline:
            tree = bench.tree_cpu(child.pid)
            if len(tree) == 2 and sum(c for _, c in tree.values()) >= 0.65:
                break
            time.sleep(0.1)
        assert len(tree) == 2, tree  # the child and its live burner; the reaped one is gone from /proc
        assert 0.65 <= sum(c for _, c in tree.values()) < 3.0, tree
        assert os.getpid() not in tree
    finally:
        child.kill()
        child.wait()


def test_steps_are_read_from_the_trace_and_processes_are_named():
    trace = "1.0 begin imports\n1.2 end imports 0.200\n1.2 begin checks\n2.7 end checks 1.500\n2.9 ray_session /x\n"
    assert bench._steps(trace) == {"imports": 0.2, "checks": 1.5}
    assert bench.kind("/venv/bin/python /repo/sweeps/launch.py").startswith("the sweep's driver")
    assert bench.kind(".../raylet --raylet_socket_name=...") == "Ray: raylet"
    assert bench.kind("ray::IDLE") == "Ray: workers"
    assert bench.kind("/usr/bin/git cat-file") == "other"


def test_the_summary_takes_medians_and_the_floor_is_cpu_over_cores():
    runs = [
        {"wall_s": w, "cpu_s": {"driver": d, "Ray: raylet": r}, "steps": {"checks": c, "ray_start": 2.0}}
        for w, d, r, c in ((4.0, 3.0, 1.0, 1.0), (5.0, 4.0, 2.0, 2.0), (6.0, 5.0, 3.0, 1.5))
    ]
    s = bench.summary(runs, cores=2)
    assert s["wall_s"] == 5.0 and s["cpu_s"] == 6.0 and s["floor_s"] == 3.0  # totals 4, 6, 8
    assert s["checks_plus_ray_s"] == 3.5 and s["by_kind"] == {"driver": 4.0, "Ray: raylet": 2.0}
    data = {"command": "x", "when": "t", "host": "h", "git_commit": "b" * 40, "git_clean": True, "cores": 2}
    md = bench.markdown({**data, "summary": s})
    assert "| **floor: that CPU on 2 cores** | **3.00** |" in md and "| driver | 4.00 |" in md

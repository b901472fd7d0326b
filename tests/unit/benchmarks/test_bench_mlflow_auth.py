"""benchmarks/perf/bench_mlflow_auth.py's own arithmetic: the report's medians and ratios on hand-made rows, the
process-tree CPU it reads from /proc against a child that burns a known amount, and the default TTL it reads from the
image's entrypoint. Its server is exercised by tests/unit/deploy/test_mlflow_auth_cache.py (slow tier)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.perf import bench_mlflow_auth as bench


def test_the_report_gives_medians_ranges_and_the_ratio_of_medians():
    rows = [{"ttl": 0, "per_s": v, "cpu_ms": c} for v, c in ((3.0, 300.0), (4.0, 250.0), (5.0, 200.0))]
    rows += [{"ttl": 30, "per_s": v, "cpu_ms": c} for v, c in ((60.0, 12.0), (80.0, 10.0), (70.0, 11.0))]
    data = {"command": "x", "when": "t", "host": "h", "git_commit": "a" * 40, "git_clean": True, "mlflow": "3"}
    md = bench.markdown({**data, "ttl": 30, "requests": 60, "rounds": 3, "rows": rows})
    assert "| 4.0 (3.0-5.0) | 250.0 (200.0-300.0) |" in md
    assert "| 70.0 (60.0-80.0) | 11.0 (10.0-12.0) |" in md
    assert "17.5 times the requests per second, 22.7 times less server CPU" in md  # 70 / 4, 250 / 11
    assert "commit aaaaaaaaaa." in md


def test_the_tree_cpu_counts_a_child_s_work():
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(5)"
    before = bench._tree_cpu(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while bench._tree_cpu(os.getpid()) - before < 0.35 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bench._tree_cpu(os.getpid()) - before >= 0.35
    finally:
        child.kill()
        child.wait()


def test_the_default_ttl_is_the_entrypoint_s():
    text = bench.ENTRYPOINT.read_text()
    assert f'ttl="${{MLFLOW_AUTH_CACHE_TTL_SECONDS:-{bench._entrypoint_ttl()}}}"' in text

"""A trial that runs out of memory in a real sweep (issue #36, fault 3): a search over a plugin model's width where
one value is far too large. That trial ends FAILED "out of memory" (its MLflow run, the printed leaderboard), is
attempted once (not retried: the same config needs the same memory again), the others complete, the champion is
registered once and no Ray process is left. The allocation is past the address space, so it fails at once whatever
the kernel's overcommit setting, and nothing is really allocated. Unit tests: tests/unit/sweeps/test_trial_memory.py."""

from __future__ import annotations

import json
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.sweep_helpers import FAST, launch, stop_ray_under, store, sweep_runs

pytestmark = pytest.mark.slow

HUGE = 2**44  # Linear(40, HUGE) asks for 2.5 PiB

PLUGIN = textwrap.dedent('''
    """A model whose width a sweep searches; each construction at an unbuildable width is counted."""
    import os

    import numpy as np
    from torch import nn

    from calib_core.models import Classifier, register_model


    @register_model("wide_net")
    class WideNet(Classifier):
        def __init__(self, num_classes, input_shape, width=16):
            super().__init__(num_classes, input_shape)
            if width > 10**6:
                with open(os.environ["CALIB_TEST_OOM_ATTEMPTS"], "a") as f:
                    f.write(f"{os.getpid()}\\n")
            self.body = nn.Sequential(nn.Flatten(1), nn.Linear(int(np.prod(self.input_shape)), width), nn.ReLU())
            self._make_head(width)

        def features(self, x):
            return self.body(x)
''')

CONFIG = textwrap.dedent(f"""
    name: oom
    plugins: [calib_oom_plugin]
    run:
      data: {{name: mnist1d, num_samples: 1200}}
      model: {{name: wide_net, kwargs: {{width: 16}}}}
      train: {{epochs: 2, batch_size: 64}}
    search:
      num_samples: 4
      references: []
      calibrators: [temperature]
      params:
        model.kwargs.width: {{type: choice, values: [16, {HUGE}]}}
    resources: {{max_concurrent: 2, max_failures: 2}}
    selection: {{num_resamples: 200}}
""")


def _ray_processes(ray_tmp: str) -> list[int]:
    """Processes whose command line names this sweep's Ray temp folder (its raylet, GCS and workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if ray_tmp in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _no_ray_left(ray_tmp: str) -> list[int]:
    """Waits up to 30 s for this sweep's Ray processes to end; the ones left (then stopped, only these)."""
    try:
        deadline = time.monotonic() + 30
        while _ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        return _ray_processes(ray_tmp)
    finally:
        stop_ray_under(ray_tmp)


def test_trial_out_of_memory_fails_with_reason_once_while_sweep_completes(tmp_path):
    (tmp_path / "calib_oom_plugin.py").write_text(PLUGIN)
    (tmp_path / "oom.yaml").write_text(CONFIG)
    attempts = tmp_path / "attempts.txt"
    ray_tmp = tempfile.mkdtemp(prefix="ro", dir="/tmp")  # Ray's socket paths must stay short
    started = time.monotonic()
    try:
        proc = launch(
            tmp_path,
            "--config",
            str(tmp_path / "oom.yaml"),
            "--seed",
            "1",
            env={"PYTHONPATH": str(tmp_path), "CALIB_TEST_OOM_ATTEMPTS": str(attempts), "RAY_TMPDIR": ray_tmp},
        )
    finally:
        left = _no_ray_left(ray_tmp)
    print(f"sweep took {time.monotonic() - started:.0f} s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert left == [], f"Ray processes left after the sweep: {left}"

    client = store(tmp_path)
    parents, children = sweep_runs(client, "oom")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4  # exactly one run per trial
    widths = {r.info.run_id: int(r.data.params["model.kwargs.width"]) for r in children}
    huge = [r for r in children if widths[r.info.run_id] == HUGE]
    fine = [r for r in children if widths[r.info.run_id] == 16]
    assert huge and fine, "seed 1 should sample both widths"
    for run in huge:
        assert run.info.status == "FAILED"
        assert run.data.tags["calib.status"] == "out_of_memory"
        reason = run.data.tags["calib.failure_reason"]
        assert reason.startswith("out of memory: DefaultCPUAllocator: can't allocate memory"), reason
        assert "not retried" in reason
    for run in fine:
        assert run.info.status == "FINISHED" and run.data.tags["calib.status"] == "completed"

    # Attempted once each: one construction at the huge width per such trial, and Tune saw no failure to retry.
    assert len(attempts.read_text().split()) == len(huge), attempts.read_text()
    trial_dirs = [p for p in (tmp_path / "ray_results" / "oom").iterdir() if p.is_dir() and p.name.startswith("train")]
    assert len(trial_dirs) == 4
    assert not [p for p in trial_dirs if (p / "error.txt").exists()]
    reports = {p.name: [json.loads(ln) for ln in (p / "result.json").read_text().splitlines()] for p in trial_dirs}
    oom = [r for r in reports.values() if r[-1].get("status") == "out_of_memory"]
    assert len(oom) == len(huge) and all(len(r) == 1 for r in oom), oom

    # What the user reads: the progress line and the leaderboard say "out of memory"; one champion, registered once.
    board = out[out.index("Leaderboard") :]
    rows = [line for line in board.splitlines() if f"width={HUGE}" in line]
    assert len(rows) == len(huge) and all("out of memory" in row for row in rows), board[:3000]
    assert out.count("Registered: models:/") == 1
    assert (tmp_path / "ray_results" / "oom" / "report.html").read_text().count("<td>out of memory</td>") == len(huge)
    champion = parents[0].data.tags["calib.champion_run"]
    assert champion in {r.info.run_id for r in fine}
    versions = client.search_model_versions("name='calibrated-mnist1d'")
    assert len(versions) == 1 and versions[0].run_id == champion
    said = [line for line in out.splitlines() if "out of memory" in line]
    assert any("out of memory: DefaultCPUAllocator" in line for line in said), out[-3000:]
    print("\n".join(said))


def test_worker_the_memory_monitor_kills_is_retried_max_failures_times_then_fails_out_of_memory(tmp_path):
    """Ray's memory monitor for real: with its threshold at 0.1 % of the node's memory it kills every trial worker
    of this sweep's own Ray (never another's) as soon as it runs. Tune retries the trial resources.max_failures
    times, then it ends FAILED "out of memory"; with no trial left to select from, the sweep ends with its error."""
    ray_tmp = tempfile.mkdtemp(prefix="rm", dir="/tmp")
    env = {"RAY_TMPDIR": ray_tmp, "RAY_memory_usage_threshold": "0.001", "RAY_memory_monitor_refresh_ms": "100"}
    started = time.monotonic()
    try:
        proc = launch(
            tmp_path,
            "--name",
            "monitor",
            "--num-samples",
            "1",
            "--no-reference-arms",
            *FAST,
            "--set",
            "search.calibrators=[temperature]",
            "--set",
            "resources.max_failures=1",
            env=env,
        )
    finally:
        left = _no_ray_left(ray_tmp)
    print(f"sweep took {time.monotonic() - started:.0f} s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "nothing to select" in out, out[-4000:]
    assert left == [], f"Ray processes left after the sweep: {left}"
    parents, children = sweep_runs(store(tmp_path), "monitor")
    assert len(parents) == 1 and len(children) == 1
    (run,) = children
    assert run.info.status == "FAILED" and run.data.tags["calib.status"] == "out_of_memory"
    reason = run.data.tags["calib.failure_reason"]
    assert reason == (
        "out of memory: Ray's memory monitor killed the trial's worker (its node ran low on memory) on each of its "
        "2 attempts (resources.max_failures)"
    ), reason
    assert f"{run.data.tags['calib.label']}: {reason}" in out  # the progress line
    # Tried 1 + max_failures times and not resumed again by the lost-worker rounds (tuner.fit_resuming_lost_workers).
    assert "ended when their worker died" not in out
    assert len(list((tmp_path / "ray_results" / "monitor").glob("train_trial_*"))) == 1

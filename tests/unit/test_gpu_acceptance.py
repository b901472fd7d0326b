"""The prepared GPU acceptance run (benchmarks/perf/gpu_acceptance.py, issue #49) stays runnable without a device:
its dry run skips every device part and says so, runs what CPU allows at tiny sizes, and writes nothing into
benchmarks/results; its readers (pytest counts, leaderboard rows, nvidia-smi samples) read what they are given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.common import RESULTS_DIR
from benchmarks.perf import gpu_acceptance as GA
from benchmarks.perf import gpu_sweep as GS
from benchmarks.perf import gpu_timings as GT

pytestmark = pytest.mark.usefixtures("one_thread")

SKIP = "no CUDA device" if not torch.cuda.is_available() else "--dry-run"


def _stamp(path: Path) -> tuple[bool, float]:
    return path.exists(), path.stat().st_mtime if path.exists() else 0.0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, one_thread):
    """One dry run for the module: (exit code, stdout, gpu.json, gpu.md, results stamps before and after)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("gpu")
    before = [_stamp(RESULTS_DIR / n) for n in ("gpu.md", "gpu.json")]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = GA.main(["--dry-run", "--out", str(out)])
    after = [_stamp(RESULTS_DIR / n) for n in ("gpu.md", "gpu.json")]
    report = json.loads((out / "gpu.json").read_text())
    return rc, buf.getvalue(), report, (out / "gpu.md").read_text(), before, after


def _part(report: dict, key: str) -> dict:
    return next(p for p in report["parts"] if p["key"] == key)


def test_dry_run_skips_every_device_part_and_says_so(dry_run):
    rc, stdout, report, md, before, after = dry_run
    assert rc == 0, stdout
    for key in "abcde":
        line = next(ln for ln in stdout.splitlines() if ln.startswith(f"[{key}] "))
        assert f": skipped: {SKIP}; ran instead: " in line, line
        assert _part(report, key)["status"] == f"skipped: {SKIP}"
        assert not _part(report, key)["failed"]
    assert f"summary: ran none; skipped a, b, c, d, e ({SKIP}); failed none" in stdout
    assert report["dry_run"] and "DRY RUN on CPU" in md
    assert before == after  # nothing measured on CPU lands in benchmarks/results


def test_dry_run_exercises_each_part_on_cpu(dry_run):
    _, _, report, md, _, _ = dry_run
    a, b, c, d, e = (_part(report, k) for k in "abcde")
    # (a) the marker still selects the GPU tests this repository has
    assert "tests/unit/calib_core/test_shift.py" in a["exercised"] and all(ok for _, ok in a["checks"])
    # (b) every contender timed, and our ECE equal to torchmetrics' (an independent implementation)
    names = {r["what"].split(" (")[0] for r in b["rows"]}
    for want in ("ECE, calib_core", "ECE, torchmetrics", "streaming ECE, torchmetrics", "bootstrap ECE, torchmetrics"):
        assert want in names
    assert all(r["seconds"] > 0 for r in b["rows"] if "seconds" in r)
    assert [r["gap"] <= 1e-5 for r in b["rows"] if "gap" in r] == [True, True]
    # (c), (d): the launcher accepted the sweep's command and resolved the reference arms on
    assert "--gpus-per-trial 0.5" in c["exercised"] and "0.5 GPU" in c["exercised"]
    assert all(ok for _, ok in c["checks"]) and all(ok for _, ok in d["checks"])
    assert "['ce_es']" in d["exercised"] and "temperature_on_top True" in d["exercised"]
    # (e) ResNet-18 both ways, ResNet-50 frozen and fine-tuned, each beside its command
    whats = [r["what"] for r in e["rows"]]
    assert "ResNet-18 epoch, plain CE" in whats and "ResNet-50 epoch, fine-tuned" in whats
    assert "ResNet-50 epoch, frozen (head only)" in whats
    assert all("Trainer(RunConfig(" in r["command"] for r in e["rows"] if "epoch," in r["what"])
    assert "ResNet-50: " in md and "| measurement | figure | command |" in md
    # provenance: commit, packages, CPU and threads
    assert report["provenance"]["git_commit"] and report["provenance"]["threads"] >= 1
    assert report["packages"]["torchmetrics"] and report["cpu_count"] >= 1


def test_pytest_counts_reads_the_closing_line():
    assert GA.pytest_counts("3 passed, 1 skipped, 162 deselected in 5.9s") == {
        "passed": 3,
        "skipped": 1,
        "deselected": 162,
    }
    assert GA.pytest_counts("13/175 tests collected (162 deselected) in 5.41s")["collected"] == 13
    assert GA.pytest_counts("1 failed, 2 errors in 1s") == {"failed": 1, "errors": 2}


def test_board_rows_mark_the_reference_arms():
    board = pd.DataFrame(
        [
            {"label": "ce_es", "calibrator": "ce_es", "status": "completed", "val_accuracy": 0.9},
            {"label": "ce_es + TS", "calibrator": "ce_es", "status": "completed", "val_accuracy": 0.9},
            {"label": "vector lr=1.0e-02", "calibrator": "vector", "status": "completed", "val_accuracy": 0.8},
            {"label": "vector lr=1.0e-02 + TS", "calibrator": "vector", "status": "completed", "val_accuracy": 0.8},
        ]
    )
    rows = GS.board_rows(board)
    assert [r["reference"] for r in rows] == [True, True, False, True]
    assert rows[2]["test_ece"] is None  # a column the board lacks reads as missing, not as an error


def test_sharing_needs_two_processes_at_once():
    one = {"sampled": True, "samples": 9, "max_processes_at_once": 1, "at_s": 2.0, "distinct_pids": 3}
    one["busiest"] = [{"pid": "11", "used_mib": "500"}]
    two = {
        **one,
        "max_processes_at_once": 2,
        "busiest": [{"pid": "11", "used_mib": "500"}, {"pid": "12", "used_mib": "480"}],
    }
    assert GS.sharing_row(one, "cmd")[1][1] is False
    row, (_, ok) = GS.sharing_row(two, "cmd")
    assert ok and "2 processes at once" in row["figure"] and "pid 12 480 MiB" in row["figure"]
    assert GS.sharing_row({"sampled": False, "why": "nvidia-smi not available"}, "cmd")[1][1] is False


def test_the_torchvision_fallback_is_torchvisions_resnet50_with_the_files_weights(tmp_path):
    """The model built when calib_core lacks torchvision/resnet50 computes what torchvision's ResNet-50 loaded
    from the same file computes (fc aside), and freezing leaves only the head to train."""
    from torchvision.models import resnet50

    weights = GT.fabricated_resnet50_weights(tmp_path)
    ours = GT._torchvision_resnet50(3, (3, 32, 32), weights, frozen=True).eval()
    ref = resnet50(weights=None)
    ref.load_state_dict(torch.load(weights, weights_only=True))
    ref.fc = torch.nn.Identity()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours.features(x), ref.eval()(x))
    assert {n for n, p in ours.named_parameters()} == {"head.weight", "head.bias"}


def test_the_sampler_counts_processes_that_came_after_it(tmp_path, monkeypatch):
    """A stand-in nvidia-smi: pid 100 is there before the sweep (left out); two trials' pids come later."""
    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{calls}"\n'
        f'n=$(wc -l < "{calls}")\n'
        'echo "100, 500"\n'
        'if [ "$n" -gt 1 ]; then echo "201, 300"; echo "202, 310"; fi\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sampler = GS.GpuSampler()
    assert sampler.before == {"100"}
    sampler.sample()
    summary = sampler.summary()
    assert summary["max_processes_at_once"] == 2 and summary["left_out_before"] == 1
    assert {a["pid"] for a in summary["busiest"]} == {"201", "202"}
    assert GS.sharing_row(summary, "cmd")[1][1] is True

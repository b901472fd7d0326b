"""GPU acceptance: the service's device paths on one CUDA device, in one prepared run of under 8 minutes (issue #49).

    python -m benchmarks.perf.gpu_acceptance             # on a CUDA machine: writes benchmarks/results/gpu.md, gpu.json
    python -m benchmarks.perf.gpu_acceptance --dry-run   # on CPU, device parts skipped, tiny sizes, a temporary --out

Parts, each reported with the command that produced its figures:
  (a) the GPU-marked tests (`pytest -m gpu` on the test files that carry the marker);
  (b) calib_core's metrics, streaming accumulator and paired bootstrap on the device, side by side with torchmetrics
      on the same device and tensors (benchmarks/perf/gpu_timings.py);
  (c) a 4-trial sweep at `--gpus-per-trial 0.5` on the embedded MNIST-1D demo (generated offline), nvidia-smi sampled
      to show two trials on the device at once, then the registered champion loaded with mlflow.pyfunc on CPU
      (benchmarks/perf/gpu_sweep.py);
  (d) the reference arms of that sweep (CE with early stopping, TS on top; on by default): their leaderboard rows;
  (e) one epoch of ResNet-18 on CIFAR-shaped fabricated data, one-go against plain CE, and one epoch of a torchvision
      ResNet-50 from a fabricated weights file, frozen and fine-tuned.
Without a CUDA device (or with --dry-run) every device part says "skipped: no CUDA device" and the code paths that
can run on CPU do, at tiny sizes: (a) collects the GPU tests, (b) and (e) run on CPU, (c) and (d) check the sweep
command with `launch --dry-run`. Output goes to a temporary folder unless --out is given, so no figure measured on
CPU lands in benchmarks/results. Exit code 1 when a part or one of its checks failed. gpu.md and the summary lines
come from benchmarks/perf/gpu_report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, command_line, utc_now, write_json, write_text
from benchmarks.perf.gpu_report import Part, describe_device, markdown, packages, run_part
from benchmarks.perf.gpu_sweep import sweep_parts

GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")


# ------------------------------------------------------------------------------------------
# (a) the GPU-marked tests
# ------------------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """Test files that carry the `gpu` marker (found by their text, so new ones join without a list to keep)."""
    found = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if GPU_MARK.search(p.read_text(errors="replace"))]
    return [str(p.relative_to(ROOT)) for p in found]


def pytest_counts(text: str) -> dict[str, int]:
    """pytest's closing counts ("3 passed, 1 skipped, 162 deselected"; "13/175 tests collected")."""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)\b", text)}
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    if collected:
        counts["collected"] = int(collected.group(1))
    return counts


def part_tests(part: Part, skip: str) -> None:
    """(a): run the GPU-marked tests; without a device, collect them (the marker must still select some)."""
    files = gpu_test_files()
    part.checks.append((f"the gpu marker is on tests in {len(files)} file(s)", bool(files)))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", *files]
    shown = "python -m pytest -q -rs -m gpu " + " ".join(files)
    if skip:
        part.skipped = skip
        proc = subprocess.run([*cmd, "--collect-only"], cwd=ROOT, capture_output=True, text=True, timeout=180)
        n = pytest_counts(proc.stdout).get("collected", 0)
        part.exercised = f"collected {n} GPU-marked test(s) with {shown} --collect-only"
        part.checks.append(("the marker selects at least one test", proc.returncode == 0 and n > 0))
        return
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    c = pytest_counts(proc.stdout)
    figure = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "skipped", "error", "errors") if k in c)
    part.rows.append({"what": "GPU-marked tests", "figure": figure or "no counts", "command": shown})
    skips = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    if skips:
        part.note = "skipped on the device: " + " | ".join(skips[:5])
    part.checks.append(("every GPU test passed (none failed or skipped)", proc.returncode == 0 and not skips))


# ------------------------------------------------------------------------------------------
# (b) and (e): in-process timings (benchmarks/perf/gpu_timings.py)
# ------------------------------------------------------------------------------------------
def part_metrics(part: Part, device: Any, skip: str) -> None:
    """(b): calib_core's metrics, streaming and bootstrap against torchmetrics on `device`."""
    from benchmarks.perf import gpu_timings as T

    sizes = T.TINY_METRICS if skip else T.MetricSizes()
    part.rows = T.time_metrics(device, sizes)
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()  # the sweep's trials get the memory back
    gaps = [r["gap"] for r in part.rows if "gap" in r]
    part.checks.append(
        ("ECE agrees with torchmetrics within 1e-5, one-shot and streaming", len(gaps) == 2 and max(gaps) <= 1e-5)
    )
    if skip:
        part.skipped = skip
        part.exercised = f"{len(part.rows)} rows on cpu at tiny sizes (N={sizes.n:,}, K={sizes.k}; not device figures)"


def part_training(part: Part, device: Any, skip: str) -> None:
    """(e): ResNet-18 one-go vs CE; torchvision ResNet-50 from a fabricated weights file, frozen and fine-tuned."""
    from benchmarks.perf import gpu_timings as T

    sizes = T.TINY_TRAIN if skip else T.TrainSizes()
    part.rows = T.resnet18_rows(device, sizes)
    rows50, how = T.resnet50_rows(device, sizes)
    part.rows += rows50
    part.note = f"ResNet-50: {how}"
    if skip:
        part.skipped = skip
        part.exercised = (
            f"{len(part.rows)} rows on cpu at tiny sizes (ResNet-18 on {sizes.r18_rows[0]} "
            f"{'x'.join(map(str, sizes.r18_shape))} images, ResNet-50 on {sizes.r50_rows[0]}; not device figures)"
        )


TITLE_B = "metrics, streaming and bootstrap vs torchmetrics on the device"
TITLE_E = "ResNet-18 one-go vs CE; torchvision ResNet-50 frozen and fine-tuned"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dry-run", action="store_true", help="CPU only, tiny sizes, device parts skipped (also without CUDA)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for gpu.md and gpu.json (default: benchmarks/results, or a temporary folder for a dry run)",
    )
    p.add_argument("--sweep-timeout", type=float, default=360.0, help="seconds the sweep of part (c) may take")
    p.add_argument("--check-champion", type=Path, default=None, metavar="DIR", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _report(argv: list[str] | None, skip: str, device_info: dict[str, Any], parts: list[Part], t0: float) -> dict:
    """gpu.json's content: the run, the device, provenance (commit, versions, CPU, threads) and the parts so far."""
    from benchmarks.provenance import provenance

    return {
        "command": command_line(__file__, argv),
        "date": utc_now(),
        "dry_run": bool(skip),
        "skip_reason": skip or None,
        "device": device_info,
        "provenance": provenance(),
        "packages": packages(),
        "cpu_count": os.cpu_count(),
        "total_s": time.perf_counter() - t0,
        "parts": [{**asdict(p), "status": p.status} for p in parts],
    }


def _summary(parts: list[Part], skip: str, total_s: float, out: Path) -> tuple[str, bool]:
    """The closing line, and whether every part and check passed (skips allowed)."""
    bad = [p.key for p in parts if p.failed or any(not ok for _, ok in p.checks)]
    ran = [p.key for p in parts if p.status == "ran"]
    skipped = [p.key for p in parts if p.skipped and not p.failed]
    line = (
        f"summary: ran {', '.join(ran) or 'none'}; skipped {', '.join(skipped) or 'none'}"
        + (f" ({skip})" if skip else "")
        + f"; failed {', '.join(bad) or 'none'}; {total_s:.0f} s; wrote {out / 'gpu.md'} and gpu.json"
    )
    return line, not bad


def main(argv: list[str] | None = None) -> int:
    """Run the parts, print their lines, write gpu.md and gpu.json; 1 when a part or a check failed."""
    args = parse_args(argv)
    if args.check_champion is not None:  # the CPU-only helper process of part (c)
        from benchmarks.perf.gpu_sweep import CHAMPION_MARK, check_champion

        print(CHAMPION_MARK + json.dumps(check_champion(args.check_champion), default=str))
        return 0
    import torch

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    skip = "no CUDA device" if not cuda else ("--dry-run" if args.dry_run else "")
    if skip:
        torch.set_num_threads(1)  # tiny problems: one thread, no spinning on a shared machine
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu_acceptance_")) if skip else RESULTS_DIR)
    device = torch.device("cpu" if skip else "cuda")
    device_info = describe_device(cuda)
    print(f"GPU acceptance on {device_info['torch']}" + (f" (dry run: {skip})" if skip else ""), flush=True)
    steps: list[Callable[[], list[Part]]] = [
        lambda: [run_part(Part("a", "GPU-marked tests"), lambda p: part_tests(p, skip))],
        lambda: [run_part(Part("b", TITLE_B), lambda p: part_metrics(p, device, skip))],
        lambda: sweep_parts(skip, args.sweep_timeout),
        lambda: [run_part(Part("e", TITLE_E), lambda p: part_training(p, device, skip))],
    ]
    parts: list[Part] = []
    for step in steps:
        parts += step()
        # written after every part: a run stopped by the device's time limit still leaves what it measured
        report = _report(argv, skip, device_info, parts, t0)
        write_json(out / "gpu.json", report)
        write_text(out / "gpu.md", markdown(report, parts))
    line, ok = _summary(parts, skip, time.perf_counter() - t0, out)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

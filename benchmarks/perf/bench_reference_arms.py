"""What the reference arms and temperature scaling on top cost: the demo sweep with and without them, side by side.

    python -m benchmarks.perf.bench_reference_arms [--repeats 2] [--num-samples 8]

Runs `sweeps/launch.py` (the default demo config) alternately as it is (the CE-with-early-stopping arm as the first
trial, temperature scaling on top of every trial, 16 candidates) and with `--no-reference-arms` (8 one-go trials,
8 candidates), each in a fresh folder, and reads the sweep's own Timing line; also times the TS-on-top fit alone
(calib_core.posthoc_on_top, the demo's validation and test sizes, one thread). Medians of --repeats runs; the two
settings alternate so that machine load drifts hit both. Writes benchmarks/results/bench_reference_arms.md/json.

The arm replaces one sampled one-go trial (the trial count is the user's), and early stopping can end it sooner, so
the trial phase may even shrink; what the arms add for certain is the fits (in the trials) and the doubled candidate
set (bootstrap, report, selection).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, command_line, host_line, utc_now, write_json, write_text
from sweeps.report.timing import START_PATTERN

LAUNCH = ROOT / "sweeps" / "launch.py"
TIMING = re.compile(
    START_PATTERN + r" (?P<ray>[\d.]+)s, trials (?P<trials>[\d.]+)s, selection and registration (?P<select>[\d.]+)s "
    r"\(closing the trials [\d.]+s, bootstrap (?P<bootstrap>[\d.]+)s"
)
SETTINGS = {"with arms and TS on top (default)": [], "--no-reference-arms": ["--no-reference-arms"]}


def one_sweep(extra: list[str], num_samples: int) -> dict[str, Any]:
    """One demo sweep in a fresh folder: its wall time and its own phase timings."""
    with tempfile.TemporaryDirectory(prefix="bench-arms-") as d:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(LAUNCH), "--num-samples", str(num_samples), *extra],
            cwd=d,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    m = TIMING.search(proc.stdout)
    if m is None:
        raise SystemExit("no Timing line in the sweep's output")
    candidates = re.search(r"among the \d+ of (\d+) candidates", proc.stdout)
    selection = proc.stdout[proc.stdout.index("Selection: ") : proc.stdout.index("Registered: ")].strip()
    return {
        "selection": selection,  # the sentence, kept for the README's example
        "wall_s": wall,
        **{f"{k}_s": float(v) for k, v in m.groupdict().items()},
        "candidates": float(candidates.group(1)) if candidates else float("nan"),
    }


def fit_alone(repeats: int = 7) -> float:
    """Median seconds of one TS-on-top fit and its metrics at the demo's sizes (900 val / 900 test rows, 10 classes)."""
    import torch

    from calib_core.metrics import compute_all
    from calib_core.posthoc_on_top import fit_temperature_on_top

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    zv, zt = torch.randn(900, 10, generator=g) * 4, torch.randn(900, 10, generator=g) * 4
    y = torch.randint(0, 10, (900,), generator=g)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit = fit_temperature_on_top([zv], y, [zt], folds=5, seed=0)
        compute_all(fit.val_logits[0], y, from_logits=True)
        compute_all(fit.test_logits[0], y, from_logits=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Run both settings alternately, print and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-samples", type=int, default=8)
    p.add_argument("--out", default=str(RESULTS_DIR / "bench_reference_arms"))
    args = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for i in range(args.repeats):
        for name, extra in SETTINGS.items():
            r = one_sweep(extra, args.num_samples)
            runs[name].append(r)
            print(
                f"[{i + 1}/{args.repeats}] {name}: wall {r['wall_s']:.1f}s, trials {r['trials_s']:.1f}s, "
                f"selection {r['select_s']:.1f}s",
                flush=True,
            )
    example = runs["with arms and TS on top (default)"][0].pop("selection")
    for rs in runs.values():
        for r in rs:
            r.pop("selection", None)
    keys = ("wall_s", "trials_s", "select_s", "bootstrap_s", "candidates")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    on, off = med["with arms and TS on top (default)"], med["--no-reference-arms"]
    fit_s = fit_alone()
    share = (on["select_s"] - off["select_s"] + args.num_samples * fit_s / 2) / off["wall_s"]
    lines = [
        "# What the reference arms and TS on top cost (benchmarks/perf/bench_reference_arms.py)",
        "",
        f"Command: `{command_line(__file__, argv)}`; {utc_now()}; {host_line()}. Medians of {args.repeats} runs per "
        "setting, alternating; one machine, loaded by other work: read the differences, not the absolute times.",
        "",
        "| setting | candidates | sweep wall, s | trials, s | selection + registration, s | bootstrap, s |",
        "|---|---|---|---|---|---|",
        *[
            f"| {name} | {m['candidates']:.0f} | {m['wall_s']:.1f} | {m['trials_s']:.1f} | {m['select_s']:.1f} | "
            f"{m['bootstrap_s']:.1f} |"
            for name, m in med.items()
        ],
        "",
        f"TS on top alone (5-fold cross-fit and full fit, metrics of both splits, 900 + 900 rows, one thread): "
        f"{1000 * fit_s:.0f} ms per trial.",
        "",
        f"What the arms add for certain (the selection phase's difference, and the fits spread over "
        f"{args.num_samples} trials on 2 cores): {100 * share:.1f} % of the sweep's wall time without them (aim: at "
        "most 15 %). The trial phase differs by the trials drawn: the arm replaces one sampled trial and early "
        "stopping may end it sooner.",
    ]
    text = "\n".join(lines) + "\n"
    write_text(Path(args.out).with_suffix(".md"), text)
    write_json(
        Path(args.out).with_suffix(".json"),
        {"runs": runs, "medians": med, "fit_s": fit_s, "share": share, "example_selection": example},
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

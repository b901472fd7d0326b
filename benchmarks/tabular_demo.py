"""The shipped tabular demo as a user runs it, recorded for the README (issue #34: its numbers from a result file).

    python -m benchmarks.tabular_demo [--out benchmarks/results/tabular_demo.json]

Runs `python sweeps/launch.py --config sweeps/configs/tabular_demo.yaml` unchanged in a fresh folder (scikit-learn's
bundled Wisconsin breast-cancer table, seed 0), then reads the sweep back from its MLflow store
(`sweeps.load_result`): every candidate's validation and test accuracy and ECE with the 95 % paired-bootstrap
intervals the sweep printed, the champion, and the selection sentence as printed. Nothing is tuned here and nothing
is chosen on test: the champion is the sweep's own (validation only); test numbers are reported for reference.
Prints a table and writes the JSON (with benchmarks/provenance.py's record); the README's `tabular_demo` block is
generated from it (benchmarks/readme_results.py).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, command_line, host_line, utc_now, write_json
from benchmarks.provenance import provenance

LAUNCH = ROOT / "sweeps" / "launch.py"
CONFIG = ROOT / "sweeps" / "configs" / "tabular_demo.yaml"
SWEEP = "tabular-demo"  # the config's `name`
METRICS = ("val_accuracy", "val_ece", "test_accuracy", "test_ece")


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def candidate_rows(board: Any) -> list[dict[str, Any]]:
    """Each leaderboard row (a trial, or a trial + TS) as label, family, status, trial id and METRICS with
    their intervals ({"value", "lo", "hi"}, fractions)."""
    rows = []
    for r in board.to_dict("records"):
        row: dict[str, Any] = {
            "trial_id": str(r["trial_id"]),
            "label": str(r["label"]),
            "family": str(r["family"]),
            "status": str(r["status"]),
        }
        for m in METRICS:
            row[m] = {"value": _num(r.get(m)), "lo": _num(r.get(f"{m}_ci_low")), "hi": _num(r.get(f"{m}_ci_high"))}
        rows.append(row)
    return rows


def split_sizes() -> dict[str, int]:
    """Rows in the demo's train / validation / test splits (its config's fractions and seed)."""
    from calib_core.data import load_dataset
    from sweeps.config import load_sweep_config

    run = load_sweep_config(CONFIG).run
    data = load_dataset(run.data, run.seed)
    return {"train": len(data.train.y), "val": len(data.val.y), "test": len(data.test.y)}


def run_demo() -> dict[str, Any]:
    """The demo sweep in a fresh folder: what it printed and what its store holds."""
    from sweeps.api import load_result

    with tempfile.TemporaryDirectory(prefix="tabular-demo-") as d:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(LAUNCH), "--config", str(CONFIG)], cwd=d, capture_output=True, text=True, timeout=3600
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"the demo sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
        out = proc.stdout
        selection = out[out.index("Selection: ") : out.index("Registered: ")].strip()
        registered = next(ln for ln in out.splitlines() if ln.startswith("Registered: "))
        result = load_result(SWEEP, workdir=d)
        rows = candidate_rows(result.leaderboard)
    champion = next(r for r in rows if r["trial_id"] == result.champion_trial_id)
    return {
        "wall_s": wall,
        "selection": selection,
        "registered": registered,
        "champion_trial_id": result.champion_trial_id,
        "champion": champion,
        "candidates": rows,
    }


def _pct(c: dict[str, float | None]) -> str:
    if c.get("value") is None:
        return "n/a"
    lo, hi = c.get("lo"), c.get("hi")
    ci = f" [{100 * lo:.1f}, {100 * hi:.1f}]" if lo is not None and hi is not None else ""
    return f"{100 * c['value']:.1f}{ci}"


def table(rec: dict[str, Any]) -> str:
    """The candidates as a Markdown table, the champion marked (validation decides; test for reference)."""
    lines = [
        "| candidate | family | val acc % | val ECE % | test acc % | test ECE % |",
        "|---|---|---|---|---|---|",
    ]
    for r in rec["candidates"]:
        mark = " (champion)" if r["trial_id"] == rec["champion_trial_id"] else ""
        lines.append(f"| {r['label']}{mark} | {r['family']} | " + " | ".join(_pct(r[m]) for m in METRICS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the demo once, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS_DIR / "tabular_demo.json"))
    args = p.parse_args(argv)
    rec = {
        "command": command_line(__file__, argv),
        "date": utc_now(),
        "host": host_line(),
        "demo_command": "python sweeps/launch.py --config sweeps/configs/tabular_demo.yaml",
        "provenance": provenance(),
        "splits": split_sizes(),
        **run_demo(),
    }
    write_json(Path(args.out), rec)
    print(table(rec))
    print()
    print(rec["selection"])
    print(f"wall {rec['wall_s']:.0f} s; written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

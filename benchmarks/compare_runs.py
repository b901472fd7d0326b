"""Compare the runs of two raw reproduction files value by value (timings left out).

    python benchmarks/compare_runs.py BEFORE/reproduce_raw.json AFTER/reproduce_raw.json

For a refactor that must not change results (e.g. `reproduce.py --quick` and `reproduce_mtl.py
--quick` before and after): prints one line per differing value and a count; exit 1 if any differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# wall-clock and load measurements differ run to run by nature
VOLATILE = {"wall_s", "median_epoch_time", "loadavg_start", "loadavg_end", "shift_eval_s", "posthoc_stage_s"}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k not in VOLATILE:
                out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def run_values(path: Path) -> dict[str, Any]:
    """{'<run key> seed=<s>.<field path>': value} of a raw file's runs, timings left out."""
    runs = json.loads(path.read_text())["runs"]
    out: dict[str, Any] = {}
    for r in runs:
        name = f"{r.get('dataset', '')}/{r['key']} seed={r['seed']}"
        out.update(_flatten({k: v for k, v in r.items() if k not in ("key", "seed", "dataset")}, name))
    return out


def differences(before: Path, after: Path) -> list[str]:
    """One line per value that differs (or exists on one side only)."""
    a, b = run_values(before), run_values(after)
    lines = [f"{k}: {a.get(k, '<missing>')!r} -> {b.get(k, '<missing>')!r}" for k in sorted(set(a) | set(b))]
    return [line for line, k in zip(lines, sorted(set(a) | set(b))) if a.get(k, object()) != b.get(k, object())]


def main(argv: list[str] | None = None) -> int:
    """Print the differences and their count; exit 1 when there are any."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args(argv)
    diff = differences(args.before, args.after)
    for line in diff:
        print(line)
    n = len(run_values(args.before))
    print(f"{len(diff)} differences in {n} compared values")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())

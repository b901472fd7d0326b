"""The way a sweep's config travels through sweeps/: the files it visits in order, from `api.run_sweep`.

    python -m benchmarks.perf.config_trail [--trials 2] [--before TREE] [--out benchmarks/results/config_trail.md]

Follows the config as data: every call, on the driver's main thread, of a function defined under
`sweeps/` that receives the `SweepConfig` or a part of it (its run, search, selection, tracking, resources
models) among its arguments (the config's own methods and validators excluded: there it is at home, not
passed on), from `run_sweep`'s entry to its return, on a
small local sweep (MNIST-1D, 1,200 rows, 2 epochs). Consecutive calls in one file make one *stay*; a stay in
a file the config had already left is a *return*. Start-up is the part before the first call into
`integrations/ray/tuner.py`. With `--before TREE` (e.g. `git worktree add /tmp/old 88f157a`) that checkout
is traced too, in its own process with its own code, and both are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, command_line, utc_minute, write_text

# Runs in a fresh process whose working directory is the traced checkout.
TRACER = r"""
import json, sys, tempfile
from pathlib import Path

root = Path.cwd().resolve()
sys.path.insert(0, str(root))
from pydantic import BaseModel
from sweeps.api import run_sweep

# the config and every part of it (run, search, selection, tracking, resources, ...): models of these modules
config_modules = ("sweeps.config", "calib_core.config", "sweeps.selection_rules")

sweeps_dir = str(root / "sweeps") + "/"
calls = []

def profile(frame, event, arg):
    if event != "call":
        return
    path = frame.f_code.co_filename
    if not path.startswith(sweeps_dir):
        return
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if names and names[0] in ("self", "cls"):
        owner = frame.f_locals.get(names[0])
        owner = owner if isinstance(owner, type) else type(owner)
        if owner.__module__ in config_modules:
            return  # the config's own methods and validators: the config at home, not passed on
    if any(
        isinstance(v, BaseModel) and type(v).__module__ in config_modules
        for v in (frame.f_locals.get(n) for n in names)
    ):
        calls.append([path[len(str(root)) + 1:], code.co_name])

overrides = [o for o in sys.argv[2:]]
with tempfile.TemporaryDirectory() as work:
    sys.setprofile(profile)
    try:
        run_sweep(None, overrides=overrides, workdir=work)
    finally:
        sys.setprofile(None)
Path(sys.argv[1]).write_text(json.dumps(calls))
"""

TUNER = "sweeps/integrations/ray/tuner.py"


def stays(calls: list[list[str]]) -> list[dict[str, Any]]:
    """Consecutive calls in one file folded into stays: file, functions, and whether the file was left before."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path, func in calls:
        if out and out[-1]["file"] == path:
            out[-1]["functions"].append(func)
            continue
        out.append({"file": path, "functions": [func], "return": path in seen})
        seen.add(path)
    return out


def summary(trail: list[dict[str, Any]]) -> dict[str, int]:
    """Stays, distinct files and returns of a trail."""
    return {
        "stays": len(trail),
        "files": len({s["file"] for s in trail}),
        "returns": sum(s["return"] for s in trail),
    }


def trace(tree: Path, trials: int) -> list[list[str]]:
    """The (file, function) calls that received the config in a sweep run from `tree`'s code."""
    overrides = [
        f"search.num_samples={trials}",
        "run.data.num_samples=1200",
        "run.train.epochs=2",
        "run.train.batch_size=64",
        f"name=trail-{os.getpid()}",
    ]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", TRACER, out.name, *overrides],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            raise SystemExit(f"the traced sweep in {tree} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())


def start_up(calls: list[list[str]]) -> list[list[str]]:
    """The calls before the first one into the tuner (Tune's set-up): start-up."""
    for i, (path, _) in enumerate(calls):
        if path == TUNER:
            return calls[:i]
    return calls


def table(traces: dict[str, list[list[str]]]) -> str:
    """Markdown: counts per traced tree, whole run and start-up, then each trail in order."""
    lines = ["| tree | part | stays | files | returns |", "|---|---|---|---|---|"]
    for name, calls in traces.items():
        for part, sub in (("run_sweep to its return", calls), ("start-up (before the tuner)", start_up(calls))):
            s = summary(stays(sub))
            lines.append(f"| {name} | {part} | {s['stays']} | {s['files']} | {s['returns']} |")
    for name, calls in traces.items():
        lines += ["", f"{name}, stays in order (* = a return):", ""]
        for i, s in enumerate(stays(calls), 1):
            mark = "*" if s["return"] else " "
            lines.append(f"{i:3d}{mark} {s['file']}: {', '.join(dict.fromkeys(s['functions']))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Trace this checkout (and --before's) and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--before", type=Path, help="another checkout to trace side by side")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "config_trail.md", help="the report (Markdown)")
    args = ap.parse_args(argv)
    traces = {}
    if args.before:
        traces[f"before ({_commit(args.before)})"] = trace(args.before.resolve(), args.trials)
    traces[f"this checkout ({_commit(ROOT)})"] = trace(ROOT, args.trials)
    text = table(traces)
    print(text)
    head = (
        "# The config's way through sweeps/ (issue #33 item 2)\n\n"
        f"Command: `{command_line(__file__, argv)}`, generated {utc_minute()}, commit {_commit(ROOT)}. "
        "How it is counted: the module docstring of `benchmarks/perf/config_trail.py`.\n\n"
    )
    write_text(args.out, head + text + "\n")


def _commit(tree: Path) -> str:
    """The checkout's commit (short), with "+ changes" when its tracked files differ from it."""
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=tree, capture_output=True, text=True).stdout
    return sha[:10] + (" + changes" if dirty.strip() else "")


if __name__ == "__main__":
    main()

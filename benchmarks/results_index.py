"""benchmarks/results/INDEX.md: each result file with the command that wrote it, its commit and its date, as
the file itself records them (issue #33 item 4).

    python -m benchmarks.results_index           # rewrite INDEX.md
    python -m benchmarks.results_index --check   # exit 1 when INDEX.md is not what the files say

Read from the files only (never from git, so the index is the same on any clone): a JSON's `command`, `date`
(or `utc`, `generated`) and `git_commit` (or `commit`, `provenance.git_commit`) at the top level or one level
down; a Markdown report's `Command: `...`` line, its first date and the commit(s) it names. What a file does
not record is shown as "not recorded", so the gaps are visible. A JSON and the Markdown report of the same
stem are one entry; a folder is one entry (its files, its size, the report that reads it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"
NOT_RECORDED = "not recorded"
_DATE = re.compile(r"\b(20\d\d-\d\d-\d\d(?:[ T]\d\d:\d\d(?::\d\d)?)?(?: UTC)?)")
_COMMAND = re.compile(r"Command: `([^`]+)`")
_COMMIT = re.compile(r"\bcommits?(?:\(s\))? ([0-9a-f]{7,40})\b")
_KEYS = {"command": ("command",), "date": ("date", "utc", "generated"), "commit": ("git_commit", "commit")}


def _from_json(data: Any) -> dict[str, str]:
    """command / date / commit recorded at the top level of a JSON object or one level down."""
    found: dict[str, str] = {}
    levels = [data] if isinstance(data, dict) else []
    if isinstance(data, dict):
        levels += [v for v in data.values() if isinstance(v, dict)]
    for level in levels:
        for what, keys in _KEYS.items():
            for k in keys:
                v = level.get(k)
                if what not in found and isinstance(v, str) and v.strip():
                    found[what] = v.strip()
    return found


def _from_markdown(text: str) -> dict[str, str]:
    """command / date / commit as a Markdown report states them in its opening lines."""
    head = "\n".join(text.splitlines()[:12])
    found: dict[str, str] = {}
    if m := _COMMAND.search(head):
        found["command"] = m.group(1).strip()
    if m := _DATE.search(head):
        found["date"] = m.group(1)
    commits = list(dict.fromkeys(_COMMIT.findall(head)))
    if commits:
        found["commit"] = ", ".join(c[:10] for c in commits)
    return found


# a running study's append-only rows (method_study_c_full), merged into its table and removed when it stops: not a result
JOURNAL = ".journal.csv"


# Results whose code has left the tree (issue #45 item 5: superseded studies retired to history): result stem ->
# (a commit that holds the code, the command that reproduces the result there, from the repository root of that
# checkout). The result files and their protocols stay; each command is the one the result records, in the runner's form
# at that commit. A test checks that each stem has files here, that the script is gone from the tree and that the
# commit holds it.
SUPERSEDED_AT = "dad0c155e4daba9bb35c335734b7facffcff5d74"  # the last commit with the superseded studies' code
RETIRED: dict[str, tuple[str, str]] = {
    "ablation_head_lr": ("e9bf36ffb3df05cbd70d55ee50b9cd39261db0fa", "python benchmarks/ablation_head_lr.py"),
    "method_study": (SUPERSEDED_AT, "python -m benchmarks.studies method_study --note NOTE"),
    # protocols B and A: the report from the committed compact rows (a fresh run goes to --raw, then study_compact)
    "method_study_v2": (SUPERSEDED_AT, "python -m benchmarks.studies method_study_v2 --report-only"),
    "method_study_v2_compact": (
        SUPERSEDED_AT,
        "python -m benchmarks.studies method_study_v2 --raw RAW --regimes overconf,noise20,imbalance10,mtl,digits_wide --workers 2 && "
        "python -m benchmarks.studies study_compact RAW benchmarks/results/method_study_v2_compact",
    ),
    "method_study_v2a": (
        SUPERSEDED_AT,
        "python -m benchmarks.studies method_study_v2 --protocol benchmarks/studies/protocols/method_study_v2a.yaml --report-only",
    ),
    "method_study_v2a_compact": (
        SUPERSEDED_AT,
        "python -m benchmarks.studies method_study_v2 --protocol benchmarks/studies/protocols/method_study_v2a.yaml --raw RAW --workers 2 && "
        "python -m benchmarks.studies study_compact RAW benchmarks/results/method_study_v2a_compact",
    ),
    # the untuned multi-task matrix (protocols A and C tune every method)
    "reproduce_mtl": (
        SUPERSEDED_AT,
        "python -m benchmarks.studies reproduce_mtl --seeds 5 --cal-lrs 1e-5,1e-4,1e-3,1e-2,1e-1,1 --resume benchmarks/results/reproduce_mtl_raw.json",
    ),
    "reproduce_mtl_raw": (
        SUPERSEDED_AT,
        "python -m benchmarks.studies reproduce_mtl --seeds 5 --cal-lrs 1e-5,1e-4,1e-3,1e-2,1e-1,1 --resume benchmarks/results/reproduce_mtl_raw.json",
    ),
    "selection": (SUPERSEDED_AT, "python -m benchmarks.studies bench_selection"),
    "selection_heldout": (SUPERSEDED_AT, "python -m benchmarks.studies bench_selection --heldout --threads 1"),
    "selection_confirm": (SUPERSEDED_AT, "python -m benchmarks.studies bench_selection --confirm --threads 1"),
}

# Results whose recorded command no longer runs because the code moved (it is in the tree, under another name):
# result stem -> the command that writes it now.
MOVED: dict[str, str] = {
    "selection_v3": "python -m benchmarks.studies selection_v3 --report-only",
}


def _kept(f: Path) -> bool:
    return f.is_file() and not f.name.endswith(JOURNAL)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if _kept(f)) if path.is_dir() else path.stat().st_size


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1024**2 else f"{n / 1024**2:.1f} MB"


def _short(commit: str) -> str:
    return ", ".join(c.strip()[:10] for c in commit.split(",")) if commit != NOT_RECORDED else commit


def entries(results: Path = RESULTS) -> list[dict[str, str]]:
    """One entry per result stem (its .json, .md, .png, ... together) and per folder, sorted by name."""
    stems: dict[str, list[Path]] = {}
    for p in sorted(results.iterdir()):
        if p.name == INDEX.name or p.name.startswith(".") or p.name.endswith(JOURNAL):
            continue
        key = p.name if p.is_dir() else p.name.split(".")[0]
        stems.setdefault(key, []).append(p)
    out = []
    for stem, paths in sorted(stems.items()):
        info: dict[str, str] = {}
        for p in paths:
            if p.suffix == ".json" or p.name.endswith(".json.gz"):  # the large results are stored gzipped
                try:
                    data = p.read_bytes()
                    found = _from_json(json.loads(gzip.decompress(data) if p.suffix == ".gz" else data))
                except (ValueError, OSError):
                    found = {}
            elif p.suffix == ".md":
                found = _from_markdown(p.read_text())
            else:
                found = {}
            for k, v in found.items():
                info.setdefault(k, v)
        if paths[0].is_dir():
            files = sorted(f for f in paths[0].rglob("*") if _kept(f))
            info.setdefault("what", f"folder: {len(files)} files")
            raw = stem.removesuffix("_compact")  # a study's compact form is read where its raw folder was named
            readers = sorted(q.name for q in results.glob("*.md") if f"results/{raw}/" in q.read_text())
            if readers:
                info.setdefault("command", "read by " + ", ".join(readers))
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in paths)
        out.append(
            {
                "stem": stem,
                "files": names,
                "size": _human(sum(_size(p) for p in paths)),
                "command": info.get("command", NOT_RECORDED),
                "commit": _short(info.get("commit", NOT_RECORDED)),
                "date": info.get("date", NOT_RECORDED),
            }
        )
    return out


def render(results: Path = RESULTS) -> str:
    """INDEX.md's text."""
    rows = entries(results)
    total = sum(_size(p) for p in results.iterdir() if p.name != INDEX.name and not p.name.endswith(JOURNAL))
    lines = [
        "# benchmarks/results: what each file is and where it came from",
        "",
        "Generated by `python -m benchmarks.results_index` from what each file records (never from git);",
        f"`{NOT_RECORDED}` marks what a file does not say. {len(rows)} entries, {_human(total)} in all. Commands are",
        "as each run recorded them; the scripts now run from the repository root as `python -m benchmarks.perf.NAME`",
        "(speed and scale) or `python -m benchmarks.studies NAME` (method and selection studies).",
        "",
        "| files | size | command | commit | date |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cmd = r["command"].replace("|", "\\|")
        cmd = f"`{cmd}`" if r["command"] != NOT_RECORDED and not cmd.startswith("read by") else cmd
        lines.append(f"| {r['files']} | {r['size']} | {cmd} | {r['commit']} | {r['date']} |")
    return "\n".join(lines + _retired_lines(results)) + "\n"


def _retired_lines(results: Path) -> list[str]:
    """The sections naming, for each result whose code moved, the command now, and for each whose code has left the
    tree, the commit and command that reproduce it."""
    files = {e["stem"]: e["files"] for e in entries(results)}
    lines = []
    moved = [stem for stem in MOVED if stem in files]
    if moved:
        lines += ["", "## Moved study code", "", "| files | run now as |", "|---|---|"]
        lines += [f"| {files[stem]} | `{MOVED[stem]}` |" for stem in moved]
    shown = [stem for stem in RETIRED if stem in files]
    if not shown:
        return lines
    lines += [
        "",
        "## Retired study code",
        "",
        "These results come from studies that later ones superseded; their code has left the tree (issue #45), their",
        "result files and protocols stay. Each is reproduced from history, from the repository root:",
        "",
        "| files | reproduce with |",
        "|---|---|",
    ]
    for stem in shown:
        commit, command = RETIRED[stem]
        lines.append(f"| {files[stem]} | `git checkout {commit[:10]} && {command}` |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Write INDEX.md, or with --check say whether it is current."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when INDEX.md differs from the files")
    a = p.parse_args(argv)
    text = render()
    if a.check:
        current = INDEX.read_text() if INDEX.is_file() else ""
        if current != text:
            print(f"{INDEX.relative_to(ROOT)} is out of date: run python -m benchmarks.results_index", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

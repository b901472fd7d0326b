"""benchmarks/results/INDEX.md (benchmarks/results_index.py): current with the files, and read from what each file
records (a hand-made results folder)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import results_index
from benchmarks.results_index import INDEX, MOVED, NOT_RECORDED, RETIRED, entries, render
from benchmarks.studies.__main__ import STUDIES
from tests.paths import ROOT


def test_the_committed_index_is_what_the_result_files_say():
    assert INDEX.read_text() == render(), (
        "benchmarks/results/INDEX.md is out of date: python -m benchmarks.results_index"
    )


def test_entries_read_command_commit_and_date_from_the_files(tmp_path):
    (tmp_path / "a.json").write_text(
        json.dumps({"x": 1, "command": "python benchmarks/a.py --n 3", "provenance": {"git_commit": "f" * 40}})
    )
    (tmp_path / "a.md").write_text("# A\n\nCommand: `python benchmarks/a.py --n 3`; 2026-12-01 10:00 UTC.\n")
    (tmp_path / "b.json").write_text(json.dumps({"rows": [1, 2]}))
    (tmp_path / "c.md").write_text("# C\n\nRuns made at commit(s) 3ca46f087b (dirty); see results/d/.\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "rows.npz").write_bytes(b"\0" * 2048)
    got = {e["files"]: e for e in entries(tmp_path)}
    assert got["a.json, a.md"] | {"size": "-"} == {
        "stem": "a",
        "files": "a.json, a.md",
        "size": "-",
        "command": "python benchmarks/a.py --n 3",
        "commit": "f" * 10,
        "date": "2026-12-01 10:00 UTC",
    }
    assert (got["b.json"]["command"], got["b.json"]["commit"], got["b.json"]["date"]) == (NOT_RECORDED,) * 3
    assert got["c.md"]["commit"] == "3ca46f087b"
    assert got["d/"]["size"] == "2.0 KB" and got["d/"]["command"] == "read by c.md"


def test_a_running_studys_journal_is_not_a_result(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "rows.npz").write_bytes(b"\0" * 2048)
    before = render(tmp_path)
    (tmp_path / "d" / "full_runs.journal.csv").write_text("regime,seed\nnoise20,1\n" * 100)
    (tmp_path / "e_runs.journal.csv").write_text("regime,seed\n")
    assert render(tmp_path) == before and [e["files"] for e in entries(tmp_path)] == ["d/"]


def test_a_gzipped_result_json_is_read_and_written_by_its_plain_name(tmp_path):
    """Large results are stored as `X.json.gz` (issue #31: benchmarks/results under 15 MB): the index reads them as
    one entry with their report, `read_json("X.json")` finds the gzipped form, and writing it removes a stale plain
    copy that would be read first."""
    from benchmarks.common import json_path, read_json, write_json

    (tmp_path / "a.json").write_text(json.dumps({"old": True}))
    write_json(tmp_path / "a.json.gz", {"command": "python -m benchmarks.studies a", "date": "2026-12-01"})
    (tmp_path / "a.md").write_text("# A\n")
    assert not (tmp_path / "a.json").exists() and json_path(tmp_path / "a.json") == tmp_path / "a.json.gz"
    assert read_json(tmp_path / "a.json")["command"] == read_json(tmp_path / "a.json.gz")["command"]
    (e,) = entries(tmp_path)
    assert (e["files"], e["command"], e["date"]) == ("a.json.gz, a.md", "python -m benchmarks.studies a", "2026-12-01")
    before = (tmp_path / "a.json.gz").read_bytes()
    write_json(tmp_path / "a.json.gz", read_json(tmp_path / "a.json"))
    assert (tmp_path / "a.json.gz").read_bytes() == before  # mtime 0: the same content, the same bytes


def test_the_results_folder_stays_under_its_budget():
    """Issue #31: `benchmarks/results` under 15 MB in the working tree (the files git tracks: a running study's
    journal is not a result yet), and no one study's compact folder over 10 MB."""
    import subprocess

    root = INDEX.parent
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", str(root)], capture_output=True, check=True, cwd=root
    ).stdout.split(b"\0")
    files = [root.parents[1] / f.decode() for f in listed if f]
    sizes = {f: f.stat().st_size for f in files if f.is_file()}
    total = sum(sizes.values())
    assert total < 15e6, f"benchmarks/results holds {total / 1e6:.1f} MB of tracked files (budget 15 MB)"
    per_folder: dict[str, int] = {}
    for f, n in sizes.items():
        if f.parent != root:
            per_folder[f.parent.name] = per_folder.get(f.parent.name, 0) + n
    assert all(n < 10e6 for n in per_folder.values()), per_folder


def _script(command: str) -> str:
    """The script a command runs: `python -m benchmarks.studies NAME ...` or `python benchmarks/x.py ...`."""
    if m := re.match(r"python -m benchmarks\.studies (\w+)", command):
        return f"benchmarks/studies/{m.group(1)}.py"
    return command.split()[1]


def test_each_retired_result_is_here_its_code_only_in_history():
    """Issue #45 item 5: a retired study's results stay, its script is gone from the tree and from the runner, and the
    commit INDEX.md names holds that script (so `git checkout <commit> && <command>` reproduces the result)."""
    stems = {e["stem"] for e in entries()}
    assert set(RETIRED) <= stems
    for stem, (commit, command) in RETIRED.items():
        script = _script(command)
        assert not (ROOT / script).exists(), f"{stem}: {script} is still in the tree"
        assert Path(script).stem not in STUDIES, stem
        assert re.fullmatch(r"[0-9a-f]{40}", commit), stem
        held = subprocess.run(["git", "cat-file", "-e", f"{commit}:{script}"], cwd=ROOT, capture_output=True)
        if held.returncode and subprocess.run(["git", "cat-file", "-e", commit], cwd=ROOT).returncode:
            pytest.skip(f"{commit} is not in this clone (shallow)")
        assert held.returncode == 0, f"{stem}: {commit} holds no {script}"
    for stem, command in MOVED.items():
        assert stem in stems and (ROOT / _script(command)).is_file(), stem


def test_retired_and_moved_results_are_named_in_the_index(tmp_path, monkeypatch):
    (tmp_path / "old.json").write_text(json.dumps({"command": "python benchmarks/old.py"}))
    (tmp_path / "new.md").write_text("# New\n\nCommand: `python benchmarks/x.py`\n")
    monkeypatch.setattr(results_index, "RETIRED", {})
    monkeypatch.setattr(results_index, "MOVED", {})
    assert "## Retired" not in render(tmp_path) and "## Moved" not in render(tmp_path)
    monkeypatch.setattr(results_index, "RETIRED", {"old": ("a" * 40, "python -m benchmarks.studies old --n 2")})
    monkeypatch.setattr(results_index, "MOVED", {"new": "python -m benchmarks.studies new"})
    text = render(tmp_path)
    assert "| old.json | `git checkout aaaaaaaaaa && python -m benchmarks.studies old --n 2` |" in text
    assert "| new.md | `python -m benchmarks.studies new` |" in text

"""One validation path (issue #36 item 6): a value gets the same answer whether it comes from the config file,
`--set` or a flag.

Hypothesis draws one string (control characters, `~user`, very long names, non-ASCII and astral text, URI
prefixes, white space) and puts it in one field three ways: in a YAML config file, as `--set KEY=VALUE` (the
value written as a YAML double-quoted string, as a person would quote it) and, where the field has one, as the
flag (`--name`, `--storage-path`, `--tracking-uri`). `launch.main` runs each with `--dry-run` in-process (fast:
no interpreter start-up) in a fresh folder, and the three answers must agree: the same exit code, and on exit 2
the same field at the start of the one `error: <field>: ...` line. A few fixed values (those found in the
issue) also run as subprocesses: one line, exit 2, no traceback, nothing written.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import ROOT

LAUNCH = ROOT / "sweeps" / "launch.py"

# field -> its flag (None: config file and --set only)
FIELDS: dict[str, str | None] = {
    "name": "--name",
    "storage_path": "--storage-path",
    "tracking.uri": "--tracking-uri",
    "search.storage": None,
    "run.data.root": None,
    "run.model.weights": None,
}
PREFIXES = ("", "/tmp/", "~", "~nosuchuser-calib/", "sqlite:///", "sqlite:////tmp/", "file:///tmp/", "s3://b/")
PIECES = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),  # any text but lone surrogates (argv cannot)
    st.sampled_from(["\x00", "\x01", "\n", "\t", "\x7f", "\x85", "\u200f", "😀", "é", " ", "/", "..", "~", "a" * 300]),
)
VALUES = st.builds(lambda p, parts: p + "".join(parts), st.sampled_from(PREFIXES), st.lists(PIECES, max_size=4))


def _nested(key: str, value: str) -> dict:
    out: dict = {}
    node = out
    parts = key.split(".")
    for k in parts[:-1]:
        node = node.setdefault(k, {})
    node[parts[-1]] = value
    return out


def _yaml_scalar(value: str) -> str:
    """`value` as one YAML double-quoted scalar (escapes for control characters), as a person quotes it in --set."""
    text = yaml.safe_dump(value, default_style='"', width=float("inf"), allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _answer(argv: list[str], files: dict[str, str], cwd: Path) -> tuple[int, str | None, str]:
    """(exit code, the field named by the `error:` line or None, stderr) of launch.main(argv) run in `cwd`."""
    from sweeps.cli import main

    for name, text in files.items():
        (cwd / name).write_text(text, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = int(exc.code or 0)
    finally:
        os.chdir(old)
    stderr = err.getvalue()
    m = re.match(r"error: ([\w.\[\]-]+):", stderr)
    return code, (m.group(1) if m else None), stderr


def _three_ways(key: str, value: str) -> dict[str, tuple[int, str | None, str]]:
    answers = {}
    ways: dict[str, tuple[list[str], dict[str, str]]] = {
        "file": (["--config", "c.yaml"], {"c.yaml": yaml.safe_dump(_nested(key, value), allow_unicode=True)}),
        "--set": (["--config", "c.yaml", "--set", f"{key}={_yaml_scalar(value)}"], {"c.yaml": "name: x\n"}),
    }
    if FIELDS[key]:
        ways["flag"] = (["--config", "c.yaml", f"{FIELDS[key]}={value}"], {"c.yaml": "name: x\n"})
    for way, (argv, files) in ways.items():
        with tempfile.TemporaryDirectory() as d:
            if key == "name":  # the flag and --set replace the base file's name; the file gives it alone
                files = {"c.yaml": files["c.yaml"]} if way == "file" else files
            answers[way] = _answer([*argv, "--dry-run"], files, Path(d))
            assert not [p.name for p in Path(d).iterdir() if p.name != "c.yaml"], f"{way} wrote files"
    return answers


@settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(sorted(FIELDS)), value=VALUES)
def test_file_set_and_flag_give_the_same_answer(key: str, value: str) -> None:
    answers = _three_ways(key, value)
    summary = {way: (code, field) for way, (code, field, _) in answers.items()}
    assert len(set(summary.values())) == 1, f"{key}={value!r}: {summary}\n" + "\n".join(
        f"{w}: {e.strip()[:300]}" for w, (_, _, e) in answers.items()
    )
    for way, (code, field, err) in answers.items():
        assert code in (0, 2), (way, code, err)
        assert "Traceback" not in err, (way, err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1, (way, err)
            # a value in a path field is refused by that field (the flags with their own field name)
            assert field is not None, (way, err)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("storage_path", "~nosuchuser-calib/x", "no such user"),  # was a RuntimeError traceback
        ("run.data.root", "~nosuchuser-calib/x", "no such user"),  # config file only: was a traceback
        ("storage_path", "/tmp/a\x01b", "control character"),  # was accepted and became a folder name
        ("storage_path", "/tmp/a\nb", "control character"),
        ("tracking.uri", "sqlite:////tmp/a\tb.db", "control character"),
        ("search.storage", "sqlite:////tmp/\x1b.db", "control character"),
        ("run.data.root", "/tmp/" + "a" * 300, "longer than 255 bytes"),
    ],
)
def test_path_values_refused_in_one_line_from_every_source(key: str, value: str, says: str) -> None:
    for way, (code, field, err) in _three_ways(key, value).items():
        assert (code, field) == (2, key), (way, err)
        assert says in err and len(err.strip().splitlines()) == 1, (way, err)


def test_astral_text_in_a_flag_stays_text(tmp_path: Path) -> None:
    """A flag's value is taken as given (it once went through JSON with ASCII escapes, and YAML read an emoji
    back as two lone surrogates)."""
    code, _, err = _answer(["--storage-path", "/tmp/😀", "--dry-run"], {}, tmp_path)
    assert code == 0, err


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", 'run.data.root="~nosuchuser-calib/x"', "--set", "run.data.name=cifar10"],
        ["--storage-path", "/tmp/a\x01b"],
    ],
)
def test_refused_without_dry_run_before_anything_is_written(tmp_path: Path, argv: list[str]) -> None:
    """Without --dry-run too (where the file-system checks run): one line, exit 2, nothing written."""
    proc = subprocess.run(
        [sys.executable, str(LAUNCH), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert list(tmp_path.iterdir()) == []

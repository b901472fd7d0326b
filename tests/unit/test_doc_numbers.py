"""Every number the user reads in README.md and docs/*.md is either in a block generated from a committed result
file (benchmarks/readme_results.py; tests/unit/benchmarks/test_readme_results.py checks those) or on the allow-list
tests/unit/doc_numbers_allow.yaml: a version, a size, a flag, a config default, a protocol's setting, each entry
with its reason (issue #45 item 3). A result quoted in prose fails here, so does a changed allowed number (the entry
is a phrase: `Python 3.11`, not `3.11`), and so does an entry that no longer matches anything.

Code is not prose: fenced and indented code blocks, `inline code`, HTML comments, link targets and snippet lines
(`--8<--`) are left out. So is an identifier's digit (`resnet18`, `MNIST-1D`, `cifar10`).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.paths import ROOT

ALLOW = Path(__file__).with_name("doc_numbers_allow.yaml")
GENERATED = re.compile(r"<!-- generated:(\w+) -->.*?<!-- /generated:\1 -->", re.S)
NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")


def doc_files(root: Path = ROOT) -> list[str]:
    return ["README.md", *(str(p.relative_to(root)) for p in sorted((root / "docs").glob("*.md")))]


def _blank(m: re.Match[str]) -> str:
    """The match with everything but its newlines blanked (line numbers and offsets stay)."""
    return re.sub(r"[^\n]", " ", m.group(0))


def prose(text: str) -> str:
    """`text` with its code, generated blocks, comments, link targets and snippet lines blanked out."""
    text = GENERATED.sub(_blank, text)
    text = re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", _blank, text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", _blank, text, flags=re.S)
    lines = text.split("\n")
    in_code = False
    for i, ln in enumerate(lines):
        prev_blank = i == 0 or not lines[i - 1].strip()
        if ln.startswith("    ") and (in_code or prev_blank) and not re.match(r"\s*([-*+]|\d+\.)\s", ln):
            in_code = True  # an indented code block: 4 spaces after a blank line, not a list item's continuation
        elif ln.strip():
            in_code = False
        if in_code or ln.lstrip().startswith("--8<--"):
            lines[i] = " " * len(ln)
    text = "\n".join(lines)
    text = re.sub(r"`(?:(?!\n\s*\n)[^`])+`", _blank, text)  # inline code, also across a line break
    text = re.sub(r"\]\([^)\n]*\)", lambda m: "]" + " " * (len(m.group(0)) - 1), text)
    # a list item's or a heading's number, a section or issue reference: structure, not a claim
    text = re.sub(
        r"^(\s*(?:#+\s+)?)\d+\.(?=\s)",
        lambda m: m.group(1) + " " * (len(m.group(0)) - len(m.group(1))),
        text,
        flags=re.M,
    )
    text = re.sub(r"(?:#|\b(?:section|sections|item|step|issue) )\d+[a-z]?\b|(?<=[\s;:])\(\d\)(?= )", _blank, text)
    return text


def numbers(text: str) -> list[tuple[int, str]]:
    """(offset, token) of every number in the prose of `text`; a digit inside an identifier is not one."""
    p = prose(text)
    out = []
    for m in NUMBER.finditer(p):
        before = p[m.start() - 1] if m.start() else " "
        before2 = p[m.start() - 2] if m.start() > 1 else " "
        if before.isalpha() or before in "_." or (before in "-/" and before2.isalpha()):
            continue  # resnet18, MNIST-1D, v2, ...
        if m.group(0)[0] in "-+" and before.isalnum():
            m_start, token = m.start() + 1, m.group(0)[1:]  # 1.1-2.0: the range's second number
        else:
            m_start, token = m.start(), m.group(0)
        if token and token[0] in "-+" and not token[1:]:
            continue
        out.append((m_start, token))
    return out


def _flat(s: str) -> str:
    return re.sub(r"\s+", " ", s)


def allow_list() -> list[dict]:
    return yaml.safe_load(ALLOW.read_text())["allow"]


def _phrase_pattern(phrase: str) -> re.Pattern[str]:
    words = [re.escape(w) for w in phrase.split()]
    return re.compile(r"(?<![\w.])" + r"\s+".join(words) + r"(?![\w])")


def unlisted(path: str, text: str, entries: list[dict]) -> tuple[list[str], set[tuple[int, str]]]:
    """The numbers of `text` (file `path`) no allow-list entry covers, as 'path:line: token in «context»', and
    the indices of the entries that covered something."""
    p = prose(text)
    covered: list[tuple[int, int]] = []
    used: set[tuple[int, str]] = set()
    for i, e in enumerate(entries):
        if e["files"] != "*" and path not in e["files"]:
            continue
        for phrase in e["phrases"]:
            for m in _phrase_pattern(phrase).finditer(p):
                covered.append((m.start(), m.end()))
                used.add((i, phrase))
    problems = []
    for off, token in numbers(text):
        if any(a <= off < b for a, b in covered):
            continue
        line = p.count("\n", 0, off) + 1
        ctx = _flat(p[max(0, off - 50) : off + len(token) + 30]).strip()
        problems.append(f"{path}:{line}: {token} in «{ctx}»")
    return problems, used


def check(root: Path = ROOT, texts: dict[str, str] | None = None) -> list[str]:
    """Every problem: an unlisted number, an entry without a reason, an entry that matches nothing."""
    entries = allow_list()
    problems: list[str] = []
    used: set[tuple[int, str]] = set()
    for path in doc_files(root):
        text = texts[path] if texts and path in texts else (root / path).read_text()
        found, u = unlisted(path, text, entries)
        problems += found
        used |= u
    for i, e in enumerate(entries):
        if not str(e.get("reason", "")).strip():
            problems.append(f"allow-list entry {e['phrases']!r} has no reason")
        for phrase in e["phrases"]:
            if (i, phrase) not in used:
                problems.append(f"allow-list phrase {phrase!r} matches nothing in {e['files']}: remove it")
    return problems


def test_every_prose_number_is_generated_or_allowed():
    problems = check()
    assert not problems, "numbers in prose that no result file or allow-list entry backs:\n" + "\n".join(problems)


def test_a_changed_prose_number_fails():
    readme = (ROOT / "README.md").read_text()
    assert "generated:lead_accuracy -->1.1-2.0 pt<" in readme or "lead_accuracy" in readme
    # the lead sentence's range written by hand instead of generated, and changed: this test fails on it
    changed = re.sub(r"<!-- generated:lead_accuracy -->.*?<!-- /generated:lead_accuracy -->", "1.1-2.1 pt", readme)
    problems = check(texts={"README.md": changed})
    assert any("README.md" in p and "2.1 in «" in p for p in problems), problems
    # a number an entry allows, changed: the phrase no longer matches, so the number is unlisted
    changed = readme.replace("Python 3.11", "Python 3.12", 1)
    assert changed != readme
    assert any("3.12 in «" in p for p in check(texts={"README.md": changed}))


def test_code_and_identifiers_are_not_prose():
    text = "resnet18 and MNIST-1D, `--num-samples 4`\n\n    python x.py --seed 3\n\n```\n5\n```\nsee [a](b2.md) 7\n"
    assert [t for _, t in numbers(text)] == ["7"]
    assert [t for _, t in numbers("1.1-2.0 pt and -0.5 and 10^4")] == ["1.1", "2.0", "-0.5", "10", "4"]

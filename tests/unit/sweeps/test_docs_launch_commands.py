"""Every `python sweeps/launch.py ...` command that README.md and docs/*.md give a user resolves and passes the
config checks as written (issue #45 item 4: the README's and the docs' commands still run in tests). Each runs as
`--dry-run` (config, validation and resource plan; no data read, nothing written; `--resume` dropped, since a dry
run has nothing to resume): a renamed flag, a config key that moved or a bad value in the docs fails here. The
sweeps themselves run elsewhere: the demo and digits commands in tests/e2e/test_sweep_configs_e2e.py, the pretrained
one in tests/e2e/test_pretrained_library_e2e.py, docs/extending.md's in tests/unit/test_docs_commands.py."""

from __future__ import annotations

import re
import shlex

import pytest

from sweeps import cli
from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LAUNCH = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?python sweeps/launch\.py(.*)$")


def launch_commands() -> list[tuple[str, str]]:
    """(file, arguments) of every launch command in a fenced or indented code block, continuations joined."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        blocks = [m.group(1) for m in re.finditer(r"^```(?:bash)?\n(.*?)^```", text, re.S | re.M)]
        blocks += [m.group(0) for m in re.finditer(r"^    \S.*\n(?:^     .*\n)*", text, re.M)]
        for block in blocks:
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                m = LAUNCH.match(re.sub(r"\s+#.*$", "", line.strip()))
                if m:
                    out.append((str(doc.relative_to(ROOT)), m.group(1).strip()))
    return out


COMMANDS = launch_commands()


def test_the_docs_give_the_commands_users_run():
    files = {f for f, _ in COMMANDS}
    assert {"README.md", "docs/guide.md", "docs/own-data.md", "docs/cluster.md"} <= files, files
    assert any("pretrained_image_folder.yaml" in c for f, c in COMMANDS if f == "README.md")


@pytest.mark.parametrize(("doc", "args"), COMMANDS, ids=[f"{f}:{a[:40]}" for f, a in COMMANDS])
def test_each_command_passes_the_config_checks(doc, args, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the docs' config paths are from the repository root
    argv = shlex.split(args)
    if "--help" in argv:
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 0
        return
    argv = [a for a in argv if a != "--resume"]
    rc = cli.main([*argv, "--dry-run"] if "--dry-run" not in argv else argv)
    assert rc == 0, f"{doc}: python sweeps/launch.py {args}\n{capsys.readouterr().err}"

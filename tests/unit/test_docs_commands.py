"""docs/extending.md runs as written (issue #24 item 8): its Python blocks, put together, are the plugin module
`my_plugins`, and every command of its shell blocks runs from the repository root with `/path/to/plugins`
pointing at that module's folder, exit 0."""

from __future__ import annotations

import re
import shlex
import subprocess

from tests.paths import ROOT

DOC = ROOT / "docs" / "extending.md"


def _blocks(text: str, lang: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)]


def _commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_extending_md_plugin_and_commands_run_as_written(tmp_path):
    text = DOC.read_text()
    python = _blocks(text, "python")
    assert python and python[0].lstrip().startswith("# my_plugins.py")
    (tmp_path / "my_plugins.py").write_text("\n\n".join(python))
    commands = [c for b in _blocks(text, "bash") for c in _commands(b)]
    assert len(commands) >= 2 and all("/path/to/plugins" in c for c in commands), commands
    outputs = []
    for cmd in commands:
        cmd = cmd.replace("/path/to/plugins", shlex.quote(str(tmp_path)))
        proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        outputs.append(proc.stdout)
    # the dry run resolved the plugin's names; the registry lists the plugin's model
    assert "wide_mlp" in outputs[0] and "my_signals" in outputs[0] and "bias_shift" in outputs[0]
    assert "wide_mlp" in outputs[1]

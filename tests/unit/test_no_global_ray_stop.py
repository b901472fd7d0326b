"""No code or test of this project stops Ray processes it did not start (issue #23 item 9)."""

import re
from pathlib import Path

from tests.paths import ROOT

# `ray stop --force` (as a shell line or an argument list) kills every Ray cluster on the machine
# (an argument list with "stop", "--force", or a shell line that runs it; prose that warns against it is fine)
PATTERN = re.compile(r"""["']stop["']\s*,\s*["']--force["']|^\s*(?:\$\s*)?(?:\S*/)?ray\s+stop\b[^`]*--force""")


def test_nothing_runs_ray_stop_force():
    offenders = []
    for folder in ("sweeps", "tests", "benchmarks", "calib_core", "deploy", "docker", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".yml", "") and path != Path(__file__):
                try:
                    text = path.read_text(errors="ignore")
                except OSError:
                    continue
                for i, line in enumerate(text.splitlines(), 1):
                    if PATTERN.search(line) and not line.lstrip().startswith("#"):
                        offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_pattern_catches_both_spellings():
    assert PATTERN.search('subprocess.run([RAY, "stop", "--force"])')
    assert PATTERN.search("ray stop --force")
    assert PATTERN.search("  .venv/bin/ray stop --force")
    assert PATTERN.search('ray_cmd("stop", "--force")')
    assert not PATTERN.search("ray stop")
    assert not PATTERN.search("stop_ray_under(tmp)  # never `ray stop --force`")

"""The study runner (benchmarks/studies/__main__.py, issue #33 item 4): it lists the studies, every one it names is
importable, and `python -m benchmarks.studies STUDY ARGS` runs the study as its main module, worker processes too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.studies.__main__ import STUDIES
from tests.paths import ROOT


def _run(*args: str, env_path: Path | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "benchmarks.studies", *args]
    env = None
    if env_path is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(env_path), str(ROOT)])}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def test_every_named_study_is_a_module_with_a_main_block():
    for name, (module, _) in STUDIES.items():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, (name, module)
        assert 'if __name__ == "__main__":' in Path(spec.origin).read_text(), module


def test_listing_and_an_unknown_study():
    listed = _run()
    assert listed.returncode == 0 and all(name in listed.stdout for name in STUDIES)
    unknown = _run("no_such_study")
    assert unknown.returncode == 2 and "unknown study 'no_such_study'" in unknown.stderr


def test_a_study_runs_as_its_own_module_would():
    via_runner = _run("method_study_c_power")
    direct = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.method_study_c_power"], cwd=ROOT, capture_output=True, text=True
    )
    assert via_runner.returncode == direct.returncode == 0, via_runner.stderr
    assert via_runner.stdout == direct.stdout and via_runner.stdout.strip()


def test_arguments_and_spawned_workers_reach_the_study(tmp_path):
    (tmp_path / "toy_study.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp
            import sys

            def square(x):
                return x * x

            if __name__ == "__main__":
                n = int(sys.argv[1])
                with mp.get_context("spawn").Pool(2) as pool:
                    print(sys.argv[1:], sum(pool.map(square, range(n))))
            """
        )
    )
    code = (
        "import sys; from benchmarks.studies import __main__ as runner; "
        "runner.STUDIES['toy'] = ('toy_study', 'a toy'); sys.exit(runner.main(['toy', '4', '--flag']))"
    )
    proc = _run(env_path=tmp_path, code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['4', '--flag'] 14"

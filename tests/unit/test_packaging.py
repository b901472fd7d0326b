"""What `pip install .` ships: calib_core and sweeps, not benchmarks/ or the tests (issue #33 item 4)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.paths import ROOT

SHIPPED = ("calib_core", "sweeps")


def _wheel_tops(src: Path, out: Path) -> set[str]:
    """The top-level names inside the wheel that pip builds from `src` (no network, no dependencies)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {name.split("/")[0] for name in z.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _copy_of_the_project(dst: Path, packages: tuple[str, ...]) -> Path:
    """The build's inputs (pyproject, README, the packages) copied, so the build writes nothing in the checkout."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dst / name)
    for pkg in packages:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "results"))
    return dst


def test_the_wheel_ships_calib_core_and_sweeps_only(tmp_path):
    src = _copy_of_the_project(tmp_path / "src", (*SHIPPED, "benchmarks", "tests"))
    assert _wheel_tops(src, tmp_path / "wheel") == set(SHIPPED)
    # the check sees a package that would ship: one added to the include list is in the wheel
    text = (src / "pyproject.toml").read_text()
    assert 'include = ["calib_core*", "sweeps*"]' in text
    (src / "pyproject.toml").write_text(text.replace('"sweeps*"]', '"sweeps*", "benchmarks*"]'))
    shutil.rmtree(src / "build", ignore_errors=True)
    assert _wheel_tops(src, tmp_path / "wheel2") == {*SHIPPED, "benchmarks"}

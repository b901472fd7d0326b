#!/usr/bin/env python3
"""Fetch the reference implementation of Nixon et al.'s General Calibration Error.

The reference is ``uncertainty_metrics/numpy/general_calibration_error.py`` from the PyPI
package ``uncertainty-metrics==0.0.81`` (google/uncertainty-metrics). Only that numpy module
is used: the package's ``__init__`` imports TensorFlow, which we neither need nor install.

Why not ``pip install uncertainty-metrics==0.0.81``: its wheel carries invalid metadata
(``scikit-learn (>=0.20.0tensorflow>=2.0.0)`` in Requires-Dist), which pip >= 24.1 refuses
even with ``--no-deps``. So this script makes a throw-away virtual environment, installs a
pip older than 24.1 into it, lets that pip *download* the wheel (it is never installed),
checks the wheel's sha256 against the pinned value below, and extracts the one module to

    tests/reference/_vendor/uncertainty_metrics_0_0_81/general_calibration_error.py

(git-ignored: ``tests/reference/_vendor/``). Everything goes through pip and the package
index that pip is configured with, so it works wherever ``pip install`` works.

Usage (idempotent; exits 0 at once when the module is already there and intact):

    python tests/reference/fetch_uncertainty_metrics.py [--force] [--quiet]

Exit status 0 on success, 1 when the reference could not be fetched (the reason is printed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

PACKAGE = "uncertainty-metrics"
VERSION = "0.0.81"
WHEEL_NAME = "uncertainty_metrics-0.0.81-py2.py3-none-any.whl"
WHEEL_SHA256 = "8ac6b82ca65e881d5cb38a698426951f2d96457ee8fa4af1217bfd20e41ed038"
MEMBER = "uncertainty_metrics/numpy/general_calibration_error.py"
OLD_PIP = "pip>=21,<24.1"

HERE = Path(__file__).resolve().parent
VENDOR_DIR = HERE / "_vendor" / "uncertainty_metrics_0_0_81"
MODULE_PATH = VENDOR_DIR / "general_calibration_error.py"
STAMP_PATH = VENDOR_DIR / "SOURCE.txt"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def is_present() -> bool:
    """True when the extracted module exists and matches the recorded wheel hash."""
    if not (MODULE_PATH.is_file() and STAMP_PATH.is_file()):
        return False
    stamp = STAMP_PATH.read_text(encoding="utf-8")
    return f"module_sha256={_sha256(MODULE_PATH)}" in stamp and WHEEL_SHA256 in stamp


def _run(cmd: list[str], quiet: bool, extra_env: dict | None = None) -> None:
    env = dict(os.environ)
    env.update(extra_env or {})
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(
            f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        )
    if not quiet and res.stdout.strip():
        print(res.stdout.strip().splitlines()[-1])


def _old_pip_in_venv(workdir: Path, quiet: bool) -> tuple[list[str], dict]:
    """A throw-away venv whose pip is older than 24.1."""
    env_dir = workdir / "oldpip-venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # The pip that ensurepip bundles may already be old enough (Python 3.11: pip 23.x); make sure.
    _run([str(py), "-m", "pip", "install", "-q", OLD_PIP], quiet)
    return [str(py), "-m", "pip"], {}


def _old_pip_in_target(workdir: Path, quiet: bool) -> tuple[list[str], dict]:
    """Fallback without venv/ensurepip: install an old pip into a folder, run it via PYTHONPATH."""
    target = workdir / "oldpip-target"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), OLD_PIP], quiet)
    return [sys.executable, "-m", "pip"], {"PYTHONPATH": str(target)}


def _download_wheel(workdir: Path, quiet: bool) -> Path:
    """Download (never install) the wheel with a pip older than 24.1."""
    errors = []
    for make in (_old_pip_in_venv, _old_pip_in_target):
        dest = workdir / f"dl-{make.__name__}"
        dest.mkdir()
        try:
            pip, env = make(workdir, quiet)
            _run(
                pip
                + ["download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(dest), f"{PACKAGE}=={VERSION}"],
                quiet,
                env,
            )
            break
        except Exception as exc:  # noqa: BLE001 - try the next way, report all at the end
            errors.append(f"{make.__name__}: {exc}")
    else:
        raise RuntimeError("; ".join(errors))
    wheel = dest / WHEEL_NAME
    if not wheel.is_file():
        found = ", ".join(p.name for p in dest.iterdir()) or "nothing"
        raise RuntimeError(f"pip download produced {found}, expected {WHEEL_NAME}")
    return wheel


def _extract(wheel: Path) -> None:
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"sha256 mismatch for {wheel.name}: got {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read(MEMBER)
    VENDOR_DIR.mkdir(parents=True, exist_ok=True)
    MODULE_PATH.write_bytes(source)
    STAMP_PATH.write_text(
        f"{MEMBER} extracted from {WHEEL_NAME} (PyPI {PACKAGE}=={VERSION}, Apache-2.0)\n"
        f"wheel_sha256={WHEEL_SHA256}\nmodule_sha256={_sha256(MODULE_PATH)}\n",
        encoding="utf-8",
    )


def fetch(force: bool = False, quiet: bool = False) -> Path:
    """Make sure the reference module is on disk; return its path. Raises RuntimeError."""
    if is_present() and not force:
        return MODULE_PATH
    with tempfile.TemporaryDirectory(prefix="fetch-um-") as tmp:
        wheel = _download_wheel(Path(tmp), quiet)
        _extract(wheel)
    if not is_present():
        raise RuntimeError(f"extracted module at {MODULE_PATH} failed its integrity check")
    return MODULE_PATH


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="download again even if present")
    ap.add_argument("--quiet", action="store_true", help="print only errors")
    args = ap.parse_args(argv)
    try:
        path = fetch(force=args.force, quiet=args.quiet)
    except Exception as exc:  # noqa: BLE001 - report any failure as one message
        print(f"fetch_uncertainty_metrics: could not fetch the reference: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"reference GCE module: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

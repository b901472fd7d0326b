"""Where things are, for tests at any depth of tests/ (unit/, e2e/, containers/)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
TESTS = ROOT / "tests"

"""Benchmark scripts that print Markdown tables into benchmarks/results/.

The package is part of the editable install (pyproject.toml's package list), so a script runs as
``python benchmarks/<name>.py`` or ``python -m benchmarks.<name>`` alike, and imports what the
scripts share from ``benchmarks.common``.
"""

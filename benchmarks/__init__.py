"""Benchmark scripts that print Markdown tables into benchmarks/results/.

Layers: ``perf/`` (speed and scale), ``studies/`` (method and selection studies, one runner, their protocols in
``studies/protocols/``), ``results/`` (the output; ``results/INDEX.md`` names each file's command, commit and date),
and what the scripts share here (``common``, ``provenance``). Not an installed package: the scripts run from the
repository root as modules, ``python -m benchmarks.perf.<name>`` or ``python -m benchmarks.studies <study>``.
"""

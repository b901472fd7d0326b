"""Method and selection studies: which calibration method, which champion rule, which sampler (issue #33 item 4).

One runner: ``python -m benchmarks.studies`` lists them, ``python -m benchmarks.studies STUDY [ARGS...]`` runs one
(the same as ``python -m benchmarks.studies.STUDY [ARGS...]``), from the repository root. The pre-registered protocols
are in ``protocols/`` beside them, the results in ``benchmarks/results/``.
"""

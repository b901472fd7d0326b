"""Speed and scale: what the service and the metrics cost, measured side by side (issue #33 item 4).

Run from the repository root as modules, e.g. ``python -m benchmarks.perf.bench_streaming``:

- bench_metrics: calib_core's metrics against torchmetrics and netcal;
- bench_streaming: the streaming accumulator against one-shot metrics;
- bench_bootstrap: the paired bootstrap of every metric (and, with --coverage, its interval coverage);
- bench_sweep: the service's overhead and concurrency against a plain loop, and (--startup) its start-up phases;
- bench_reference_arms: what the reference arms and TS on top cost in the demo sweep;
- bench_scale: how the service's costs grow with the number of trials;
- soak: a long sweep under killed workers, the driver's memory against trials finished;
- gpu_acceptance: the device paths on one CUDA device (tests, metrics vs torchmetrics, a fractional-GPU sweep,
  ResNet epochs), prepared to run when a device is lent; `--dry-run` on CPU (tests/unit/test_gpu_acceptance.py).

Each writes its figures under benchmarks/results/ (benchmarks/results/INDEX.md lists them).
"""

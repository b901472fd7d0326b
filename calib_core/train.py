"""Train one run from a config file: `python -m calib_core.train --config FILE [--set k=v ...]`.

Prints one JSON line: status, reason, epochs_run, wall_time, val and test metrics (accuracy,
nll, brier, ece, sce, ace, tace, mce) and the calibrator's description (its temperature or its
parameter count). The line is standard JSON: a non-finite number (NaN, inf, e.g. the temperature
of a diverged run) is written as null. Exit status: 0 completed, 1 diverged, 2 bad config or
data/model options.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

REPORTED = ("accuracy", "nll", "brier", "ece", "sce", "ace", "tace", "mce")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m calib_core.train", description="Train one calibrated classifier and print its metrics as JSON."
    )
    p.add_argument("--config", help="YAML run config (seed, device, num_threads, data, model, train)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. train.epochs=5 (repeatable)",
    )
    return p


def _jsonable(obj: Any) -> Any:
    """`obj` with every non-finite number as None (standard JSON has no NaN or Infinity), other
    numbers (numpy, 0-dim tensors) as float and anything else unknown as its str."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    try:
        x = float(obj)
    except (TypeError, ValueError, RuntimeError):  # not a number (or a tensor of several)
        return str(obj)
    return x if math.isfinite(x) else None


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from calib_core.config import ConfigError
    from calib_core.plugins import load_run_config

    try:
        cfg = load_run_config(args.config, args.overrides)
    except ConfigError as exc:
        return _fail(str(exc).replace("\n", " "))

    from calib_core.data import load_dataset
    from calib_core.trainer import make_trainer

    try:
        data = load_dataset(cfg.data, cfg.seed)
        trainer = make_trainer(cfg, data)
    except (ValueError, FileNotFoundError) as exc:  # options the schema cannot check (model kwargs, data root, ...)
        return _fail(" ".join(str(exc).split()))
    result = trainer.fit()
    out = {
        "status": result.status,
        "reason": result.reason,
        "epochs_run": result.epochs_run,
        "wall_time": round(result.wall_time, 3),
        "method": cfg.train.method,
        "val": {k: result.val_metrics[k] for k in REPORTED if k in result.val_metrics},
        "test": {k: result.test_metrics[k] for k in REPORTED if k in result.test_metrics},
        "calibrator": result.calibrator_info,
    }
    print(json.dumps(_jsonable(out), allow_nan=False))
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())

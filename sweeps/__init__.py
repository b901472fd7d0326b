"""The sweep service: CLI, config, search space, Ray Tune trainable, MLflow tracking, selection.

`from sweeps import run_sweep` is the Python API (sweeps/api.py); importing `sweeps` alone stays
cheap (Ray, MLflow and torch are imported when a sweep runs).
"""

from typing import Any

__all__ = ["ConfigError", "SweepError", "SweepIncomplete", "SweepResult", "load_result", "run_sweep"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sweeps import api

        return getattr(api, name)
    raise AttributeError(f"module 'sweeps' has no attribute {name!r}")

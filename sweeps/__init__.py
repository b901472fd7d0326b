"""The sweep service: CLI, config, checks, decisions, reports, integrations (Ray, MLflow, Optuna), service.

`from sweeps import run_sweep` is the Python API (sweeps/api.py); importing `sweeps` stays cheap (Ray,
MLflow and torch are imported when a sweep runs).
"""

from sweeps.api import ConfigError, SweepError, SweepIncomplete, SweepResult, load_result, run_sweep

__all__ = ["ConfigError", "SweepError", "SweepIncomplete", "SweepResult", "load_result", "run_sweep"]

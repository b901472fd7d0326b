"""The sweep service: CLI, config, checks, decisions, reports, integrations (Ray, MLflow, Optuna), service.

`from sweeps import run_sweep` is the Python API (sweeps/api.py); importing `sweeps` is cheap (Ray, MLflow and
torch are imported when a sweep runs; the API's own modules, pydantic's config among them, when a name below is
first used): `sweeps/launch.py` installs its Ctrl+C handling (sweeps/start_steps.py) before anything heavy loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeps.api import ConfigError, SweepError, SweepIncomplete, SweepResult, load_result, run_sweep

__all__ = ["ConfigError", "SweepError", "SweepIncomplete", "SweepResult", "load_result", "run_sweep"]


def __getattr__(name: str) -> Any:
    """The API's names, imported from sweeps/api.py when first used."""
    if name in __all__:
        from sweeps import api

        return getattr(api, name)
    raise AttributeError(f"module 'sweeps' has no attribute {name!r}")

"""calib_core: calibration metrics, calibrators, the one-go trainer, models and data.

A pure library: it imports torch, numpy and matplotlib, never ray, optuna or mlflow.
"""

__version__ = "0.1.0"

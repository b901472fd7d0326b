"""Decisions from trial metrics: uncertainty (paired bootstrap) and the champion rules.

Imports no ray, mlflow or optuna."""

"""Adapters to the third-party services, one subpackage each: ray/, mlflow/, optuna/."""

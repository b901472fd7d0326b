"""Optuna: the study and the search space."""

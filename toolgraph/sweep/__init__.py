"""Hyperparameter sweeps on Optuna: toolgraph sweep."""

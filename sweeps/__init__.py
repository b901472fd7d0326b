"""The sweep service: CLI, config, search space, Ray Tune trainable, MLflow tracking, selection."""

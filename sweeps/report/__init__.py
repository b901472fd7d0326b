"""What people read: report files (diagrams, tables, leaderboard, Pareto plot, rank agreement).

Imports no ray, mlflow or optuna."""

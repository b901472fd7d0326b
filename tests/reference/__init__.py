"""Independent references for the metric tests (see uncertainty_metrics_ref.py)."""

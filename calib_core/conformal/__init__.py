"""Split conformal prediction sets on a classifier's probabilities: LAC/THR, APS (randomised and not) and RAPS.

One module per score (lac.py, aps.py, raps.py) over a shared core (core.py: checks, ranked mass, sets from scores);
quantile.py holds the quantile conventions (the service's finite-sample one, MAPIE's, torch-uncertainty's), split.py
the methods by name with calibrate / prediction_sets, measures.py coverage and set size. Pure torch (numpy for MAPIE's
quantile only); probabilities in, never logits.
"""

from .measures import class_coverage, covered, set_sizes, stratum_coverage, summary, worst
from .quantile import CONVENTIONS, FINITE_SAMPLE, MAPIE, TORCH_UNCERTAINTY, conformal_quantile, finite_sample_rank
from .split import (
    METHODS,
    Method,
    calibrate,
    calibration_scores,
    get_method,
    label_scores,
    prediction_sets,
    uniform_draws,
)

__all__ = [
    "CONVENTIONS",
    "FINITE_SAMPLE",
    "MAPIE",
    "METHODS",
    "TORCH_UNCERTAINTY",
    "Method",
    "calibrate",
    "calibration_scores",
    "class_coverage",
    "conformal_quantile",
    "covered",
    "finite_sample_rank",
    "get_method",
    "label_scores",
    "prediction_sets",
    "set_sizes",
    "stratum_coverage",
    "summary",
    "uniform_draws",
    "worst",
]

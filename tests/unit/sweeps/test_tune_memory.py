"""Ray Tune's per-metric statistics in the driver, kept for the objectives only: real Tune Trial objects fed a final
result as wide as a sweep's, side by side with Tune as it is."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from sweeps.integrations.ray.tune_memory import ALWAYS_KEPT, statistics_only_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

OBJECTIVES = ("val_accuracy", "val_ece")


def _result(i: int) -> dict:
    """A final result with ~140 numeric keys, as a trial's (two splits x the metric family, conformal sets, ...)."""
    r = {
        f"{s}_{m}": 0.1 + i * 1e-4 + j * 1e-3
        for s in ("val", "test")
        for j, m in enumerate(
            ["accuracy", "ece", "nll", "brier", "mce", "sce", "classwise_ece", "rmsce", "ace", "tace", "aurc"]
        )
    }
    r.update(
        {
            f"{s}_cp_{meth}_{a}_{q}": 0.5 + i * 1e-4
            for s in ("val", "test")
            for meth in ("lac", "aps", "raps")
            for a in ("0.02", "0.05", "0.1", "0.2", "0.3")
            for q in ("coverage", "size", "worst_class", "worst_size")
        }
    )
    r.update(
        {
            "epoch": 2,
            "training_iteration": 2,
            "time_total_s": 1.5,
            "time_this_iter_s": 0.7,
            "done": True,
            "status": "completed",
            "node_id": "n",
            "config": {"calibrator": "vector", "calibrator_lr": 0.002},
        }
    )
    return r


def _trials(n: int) -> tuple[list, float]:
    """n Tune trials, each given two results and its JSON state made (Tune caches it); the traced KB per trial."""
    from ray.tune import PlacementGroupFactory
    from ray.tune.experiment.trial import Trial

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    trials = []
    for i in range(n):
        t = Trial(
            "__fake",
            config={"calibrator": "vector"},
            trial_id=f"t{i:04d}",
            stub=True,
            placement_group_factory=PlacementGroupFactory([{"CPU": 1}]),
        )
        for step in (1, 2):
            t.update_last_result({**_result(i), "training_iteration": step})
        t.get_json_state()
        trials.append(t)
    gc.collect()
    kb = (tracemalloc.get_traced_memory()[0] - before) / n / 1024
    tracemalloc.stop()
    return trials, kb


def test_tune_keeps_statistics_for_the_objectives_only_and_every_result_whole():
    wide = _result(0)
    numeric = {k for k, v in wide.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert len(numeric) > 130
    plain, plain_kb = _trials(50)
    with statistics_only_for(OBJECTIVES) as kept:
        trimmed, trimmed_kb = _trials(50)
    assert kept == set(OBJECTIVES) | ALWAYS_KEPT
    assert set(trimmed[0].metric_analysis) == (kept & numeric)
    assert set(plain[0].metric_analysis) >= numeric  # Tune as it is: every numeric key
    for t, p in zip(trimmed, plain, strict=True):
        assert {k: v for k, v in t.last_result.items() if k != "date"} == {
            k: v for k, v in p.last_result.items() if k != "date"
        }  # every key still reported
        assert t.metric_analysis["val_ece"] == p.metric_analysis["val_ece"]  # the same statistics where kept
    # the saving is most of Tune's per-trial memory (~390 KB of it here before)
    assert trimmed_kb < 0.35 * plain_kb, (trimmed_kb, plain_kb)
    # outside the block Tune is as it was
    after, _ = _trials(2)
    assert set(after[0].metric_analysis) >= numeric


def test_a_trial_s_state_round_trips_through_tune_s_json():
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    with statistics_only_for(OBJECTIVES):
        (t,), _ = _trials(1)
        again = _TrainingRunMetadata.from_json_state(t.run_metadata.get_json_state())
        again.last_result = {}
        for key, value in _result(1).items():
            if isinstance(value, float):
                again.update_metric(key, value, step=3)
    assert again.metric_analysis["val_accuracy"]["last"] == pytest.approx(_result(1)["val_accuracy"])
    assert again.metric_analysis["val_accuracy"]["max"] == pytest.approx(_result(1)["val_accuracy"])
    assert "test_nll" not in again.metric_analysis and "test_nll" not in again.metric_n_steps

"""The sweep's status table (sweeps.integrations.ray.progress.StatusReporter) with a reference arm among the trials:
the CE-with-early-stopping arm has no calibrator_lr, and Tune's "Current best trial" line looked every parameter
column up without a default (KeyError: 'calibrator_lr' ended three demo sweeps on a loaded machine, when a table
came due while the arm was the best trial)."""

from __future__ import annotations

from ray.tune.experiment import Trial

from sweeps.integrations.ray.progress import StatusReporter


def _trial(config: dict, ece: float) -> Trial:
    t = Trial("calib_trial", config=config, stub=True)
    t.set_status(Trial.TERMINATED)
    t.run_metadata.last_result = {"val_ece": ece, "val_accuracy": 0.9, "epoch": 3, "config": config}
    return t


def test_the_reference_arm_as_best_trial_does_not_end_the_table():
    import pytest
    from ray.tune.progress_reporter import _best_trial_str

    arm = _trial({"method": "ce", "early_stopping": True}, 0.01)  # the best, and without calibrator_lr
    onego = _trial({"calibrator": "temperature", "calibrator_lr": 0.01}, 0.05)
    reporter = StatusReporter(every_s=1)
    assert reporter.set_search_properties("val_ece", "min")
    with pytest.raises(KeyError):  # what Tune's line does with the arm: why the reporter leaves it out
        _best_trial_str(arm, "val_ece", reporter._parameter_columns)
    assert reporter._current_best_trial([arm, onego]) == (None, None)  # no "Current best trial" line

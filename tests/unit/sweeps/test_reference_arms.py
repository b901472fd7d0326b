"""The reference arm is a trial of the study without a sampled value: parameter importances leave it out."""

from __future__ import annotations

import optuna

from sweeps.config import SearchConfig
from sweeps.integrations.optuna.search_space import SearchSpace
from sweeps.integrations.optuna.study import param_importances


def test_importances_are_over_the_sampled_trials_only(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=url, sampler=optuna.samplers.RandomSampler(seed=0))
    space = SearchSpace(SearchConfig(calibrators=["temperature", "vector"]))
    for i in range(7):
        t = study.ask()
        fixed = space(t) or {}
        value = 0.1 if fixed else t.params["calibrator_lr"] + (0.5 if t.params["calibrator"] == "vector" else 0.0)
        study.tell(t, value + 0.001 * i)
    assert study.trials[0].user_attrs["reference_arm"] == "ce_es" and not study.trials[0].params
    imp, note = param_importances(url, "s", ["val_ece"])
    assert imp is not None and set(imp["val_ece"]) == {"calibrator", "calibrator_lr"}
    assert "over the 6 completed sampled trials (reference arms left out)" in note


def test_on_top_candidates_without_the_selection_metric_do_not_compete():
    from sweeps.decide.selection import TrialRecord
    from sweeps.finish import candidates

    rec = TrialRecord(
        "a",
        "t",
        "completed",
        {"val_accuracy": 0.9, "val_ece": 0.05, "val_shift_ece": 0.1, "ts_val_accuracy": 0.9, "ts_val_ece": 0.01},
        params={"calibrator": "temperature"},
    )
    assert [c.trial_id for c in candidates([rec])] == ["a", "a+ts"]
    assert [c.trial_id for c in candidates([rec], "val_shift_ece")] == ["a"]  # shift is measured as trained only
    assert "ts_val_ece" not in candidates([rec])[0].metrics

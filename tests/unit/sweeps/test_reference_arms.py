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


def test_too_few_sampled_trials_for_importances_are_counted_in_words(tmp_path):
    """The reference arm and one sampled trial: no importances, and the note counts one trial (singular) and says
    how many are needed."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=url, sampler=optuna.samplers.RandomSampler(seed=0))
    space = SearchSpace(SearchConfig(calibrators=["temperature", "vector"]))
    for _ in range(2):
        t = study.ask()
        space(t)
        study.tell(t, 0.1)
    imp, note = param_importances(url, "s", ["val_ece"])
    assert imp is None
    assert note.startswith("Only 1 completed sampled trial: too few for parameter importances (4 needed;"), note


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


def test_importances_possible_counts_the_sampled_trials_only():
    from types import SimpleNamespace

    from sweeps.integrations.optuna.study import MIN_IMPORTANCE_TRIALS, importances_possible

    arms = len(SearchConfig().reference_arms())
    assert arms >= 1  # the reference arms are on by default: they must not count

    def cfg(n: int) -> SimpleNamespace:
        return SimpleNamespace(search=SearchConfig(num_samples=n))

    assert not importances_possible(cfg(arms + MIN_IMPORTANCE_TRIALS - 1), more_trials=False)
    assert importances_possible(cfg(arms + MIN_IMPORTANCE_TRIALS), more_trials=False)
    assert importances_possible(cfg(1), more_trials=True)  # a resumed or grown study may hold more


def test_too_few_trials_import_no_importance_evaluator(tmp_path):
    """fANOVA's imports (sklearn, ~1.5 s of CPU) only when there is something to rank: a fresh interpreter that
    asks for the importances of a 3-trial study must not load optuna.importance."""
    import subprocess
    import sys

    db = tmp_path / "o.db"
    code = f"""
import sys, optuna
from sweeps.integrations.optuna.study import param_importances
url = "sqlite:///{db}"
study = optuna.create_study(study_name="s", storage=url)
for i in range(3):
    t = study.ask(); t.suggest_float("calibrator_lr", 1e-3, 1.0, log=True); study.tell(t, 0.1 * i)
imp, note = param_importances(url, "s", ["val_ece"])
print(imp, "optuna.importance" in sys.modules, note)
"""
    from tests.paths import ROOT

    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("None False Only 3 completed sampled trials"), out.stdout

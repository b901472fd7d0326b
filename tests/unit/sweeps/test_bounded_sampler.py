"""The sweep's sampler (sweeps/integrations/optuna/sampler.py): Optuna's TPE shown a bounded history.

Up to its bound it is TPE, draw for draw; past it TPE never reads more than window + elite trials, and for one
objective those are exactly the last `window` plus the `elite` best older ones (the archive kept between asks agrees
with the history computed from scratch). The sweep's searcher uses it.
"""

from __future__ import annotations

import math
import pickle
import time

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.samplers import TPESampler
from optuna.trial import TrialState

from sweeps.integrations.optuna.sampler import (
    HISTORY_ELITE,
    HISTORY_WINDOW,
    BoundedTPESampler,
    _HistoryView,
    bounded_history,
    make_sampler,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
DIRECTIONS = {1: ["minimize"], 2: ["maximize", "minimize"]}
CALIBRATORS = ["temperature", "matrix", "none"]


def space(trial: optuna.Trial) -> None:
    """The sweep's shape of space: a categorical choice and a log-uniform lr that only some choices have."""
    choice = trial.suggest_categorical("calibrator", CALIBRATORS)
    if choice != "none":
        trial.suggest_float("calibrator_lr", 1e-4, 1e-1, log=True)


def values(params: dict, objectives: int) -> list[float]:
    """A deterministic objective of the params (val ECE down; with two, val accuracy up as well)."""
    lr = params.get("calibrator_lr", 1e-2)
    ece = abs(math.log10(lr) + 2.5) * 0.01 + CALIBRATORS.index(params["calibrator"]) * 0.003
    return [ece] if objectives == 1 else [0.9 - ece / 2, ece]


def search(sampler: optuna.samplers.BaseSampler, trials: int, objectives: int, concurrency: int = 2) -> list[dict]:
    """Ask/tell `trials` times with `concurrency` trials in flight (the oldest told first); the params asked."""
    study = optuna.create_study(directions=DIRECTIONS[objectives], sampler=sampler)
    asked, pending = [], []
    for _ in range(trials):
        if len(pending) >= concurrency:
            t = pending.pop(0)
            study.tell(t, values(t.params, objectives))
        t = study.ask()
        space(t)
        asked.append(dict(t.params))
        pending.append(t)
    return asked


@pytest.mark.parametrize("objectives", [1, 2])
def test_suggestions_are_tpes_up_to_the_bound(objectives):
    window, elite = 14, 4
    n = window + elite + 1  # the last ask that sees at most window + elite other trials
    plain = search(TPESampler(seed=7), n + 12, objectives)
    bounded = search(BoundedTPESampler(seed=7, window=window, elite=elite), n + 12, objectives)
    assert bounded[:n] == plain[:n]
    assert bounded != plain  # past the bound the history differs (a check that the bound acts)


def test_the_sweep_sampler_is_tpe_with_the_sweeps_bounds():
    s = make_sampler(3)
    assert isinstance(s, TPESampler) and (s.window, s.elite) == (HISTORY_WINDOW, HISTORY_ELITE)
    assert search(s, 30, 2) == search(TPESampler(seed=3), 30, 2)  # far below the bound: TPE itself


def test_the_searcher_uses_the_bounded_sampler():
    from sweeps.config import load_sweep_config
    from sweeps.integrations.optuna.study import make_searcher

    cfg = load_sweep_config(None, [], {"name": "bounded", "search.storage": "memory", "search.seed": 5})
    searcher = make_searcher(cfg, seed_offset=2)
    searcher._setup_study(searcher._mode)
    sampler = searcher._ot_study.sampler
    assert isinstance(sampler, BoundedTPESampler) and (sampler.window, sampler.elite) == (HISTORY_WINDOW, HISTORY_ELITE)
    assert search(sampler, 12, 2) == search(TPESampler(seed=7), 12, 2)  # seeded with search.seed + the offset


@pytest.mark.parametrize("value", [0, -1])
def test_bounds_are_checked(value):
    with pytest.raises(ValueError, match="window"):
        BoundedTPESampler(window=value)
    with pytest.raises(ValueError, match="elite"):
        BoundedTPESampler(elite=-1)


# one step of a generated search: ask a new trial, or finish the oldest running one (as COMPLETE with a value, FAIL
# or PRUNED)
STEP = st.one_of(
    st.just(("ask",)),
    st.tuples(st.just("complete"), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
    st.just(("fail",)),
    st.just(("prune",)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.integers(1, 6),
    elite=st.integers(0, 4),
    objectives=st.sampled_from([1, 2]),
    steps=st.lists(STEP, min_size=5, max_size=45),
)
def test_tpe_never_reads_more_than_window_plus_elite(window, elite, objectives, steps):
    sizes: list[int] = []
    original = TPESampler._sample

    def spy(self, study, trial, search_space):
        """What TPE's _sample is handed: the study itself (then at most window + elite other trials) or a view."""
        if isinstance(study, _HistoryView):
            everything = study._study._get_trials(deepcopy=False)
            shown = study._get_trials(deepcopy=False)
            if objectives == 1:  # the archive kept between asks is exact: the history as computed from scratch
                scratch = bounded_history(everything, trial.number, study.directions, window, elite)
                assert [t.number for t in shown] == [t.number for t in scratch]
            older = [t for t in shown if t.number < len(everything) - 1 - window]
            assert len(older) <= elite and all(t.state == TrialState.COMPLETE for t in older)
        else:
            shown = [t for t in study._get_trials(deepcopy=False) if t.number != trial.number]
        assert all(t.number != trial.number for t in shown)
        sizes.append(len(shown))
        return original(self, study, trial, search_space)

    study = optuna.create_study(
        directions=DIRECTIONS[objectives],
        sampler=BoundedTPESampler(seed=0, window=window, elite=elite, n_startup_trials=2),
    )
    running: list[optuna.Trial] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TPESampler, "_sample", spy)
        for step in steps:
            if step[0] == "ask" or not running:
                t = study.ask()
                space(t)
                running.append(t)
            elif step[0] == "complete":
                study.tell(running.pop(0), list(step[1 : 1 + objectives]))
            else:
                study.tell(running.pop(0), state=TrialState.FAIL if step[0] == "fail" else TrialState.PRUNED)
    assert max(sizes, default=0) <= window + elite


def test_best_older_trials_kept_and_archive_survives_pickling():
    window, elite = 5, 3
    sampler = BoundedTPESampler(seed=1, window=window, elite=elite, n_startup_trials=2)
    study = optuna.create_study(sampler=sampler)
    # trial 2 and 4 are the best; they leave the window and stay in the history as elite
    for i, v in enumerate([0.5, 0.4, 0.01, 0.6, 0.02, 0.7, 0.8, 0.9, 0.3, 0.65, 0.75, 0.85]):
        study.add_trial(
            optuna.trial.create_trial(
                params={"calibrator": "none"},
                distributions={"calibrator": optuna.distributions.CategoricalDistribution(CALIBRATORS)},
                value=v if i != 3 else None,
                state=TrialState.COMPLETE if i != 3 else TrialState.FAIL,
            )
        )
    current = study.ask()
    view = sampler.history_view(study, study._storage.get_trial(current._trial_id))
    assert [t.number for t in view._get_trials(deepcopy=False)] == [1, 2, 4, 7, 8, 9, 10, 11]
    restored = pickle.loads(pickle.dumps(sampler))
    assert restored._archive is None  # rebuilt from the study at its next ask
    again = restored.history_view(study, study._storage.get_trial(current._trial_id))
    assert [t.number for t in again._get_trials(deepcopy=False)] == [1, 2, 4, 7, 8, 9, 10, 11]


@pytest.mark.slow
def test_ask_at_ten_thousand_trials_is_fast():
    """n = 10^4 completed trials of two objectives (the sweep's default): the bounded sampler's ask against plain
    TPE's on the same study, interleaved, in CPU seconds (the aim is <= 50 ms wall, benchmarks/perf/bench_sampler.py;
    here a ratio and a loose bound, for a shared CI machine)."""
    dist = {
        "calibrator": optuna.distributions.CategoricalDistribution(CALIBRATORS),
        "calibrator_lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
    }
    trials = []
    for i in range(10_000):
        params = {"calibrator": CALIBRATORS[i % 2], "calibrator_lr": 10 ** (-4 + 3 * ((i * 7919) % 10_000) / 10_000)}
        trials.append(optuna.trial.create_trial(params=params, distributions=dist, values=values(params, 2)))
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="s", directions=DIRECTIONS[2]).add_trials(trials)
    studies = {
        "bounded": optuna.load_study(study_name="s", storage=storage, sampler=make_sampler(0)),
        "tpe": optuna.load_study(study_name="s", storage=storage, sampler=TPESampler(seed=0)),
    }
    times: dict[str, list[float]] = {k: [] for k in studies}
    for _ in range(6):
        for name, study in studies.items():
            t0 = time.process_time()
            t = study.ask()
            space(t)
            times[name].append(time.process_time() - t0)
            study.tell(t, values(t.params, 2))
    # medians of the warm asks (the first builds the bounded sampler's archive from the whole study)
    bounded, tpe = (sorted(times[k][1:])[2] for k in ("bounded", "tpe"))
    assert bounded < 0.1 and bounded < tpe / 3, times

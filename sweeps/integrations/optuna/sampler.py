"""The sweep's sampler: Optuna's TPE shown a bounded history, so one ask stays cheap at 10^4 trials.

Optuna's TPESampler rebuilds its two Parzen estimators from every finished (and, with constant_liar, running) trial
at each suggestion, in Python loops over the trials: ~0.2 s per ask at 10^4 trials of the sweep's space
(benchmarks/results/bench_sampler.md), serial in the sweep's driver. `BoundedTPESampler` is the same TPE (its
subclass, every option as Optuna's) shown only the last `window` trials plus the `elite` best older ones: TPE's
weights already ramp the oldest trials of its "above" estimator down towards 1/n, and the best ones (its "below"
estimator, 25 of them for one objective) are kept. Up to `window + elite` trials it sees exactly what TPE sees, so
its suggestions are TPE's, draw for draw (same seed). The bound must not be small: TPE sizes its "below" set from the
trials it is shown (10 %, at most 25 for one objective), so a bound under 250 trials shrinks that set as well, which
made the searches much weaker in the benchmark; above it only the "above" estimator loses trials (for two objectives
the "below" set stays at 10 % of what is shown, the elite first).

How: TPE reads the trials through `study._get_trials` inside `TPESampler._sample` (both its relative and its
independent path); `_sample` is handed a view of the study whose `_get_trials` returns the bounded history and
which answers everything else as the study does.
"""

from __future__ import annotations

import copy
from collections.abc import Container, Sequence
from typing import Any, cast

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
from optuna.samplers._tpe.sampler import _split_complete_trials_multi_objective
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

# Chosen by benchmarks/perf/bench_sampler.py (results/bench_sampler.md): ask time at 10^4 trials within its aim
# with the search quality of plain TPE on bench_search's tabulated objective.
HISTORY_WINDOW = 1000
HISTORY_ELITE = 100


class _HistoryView:
    """A study as TPE sees it: `_get_trials` returns only the chosen trials; everything else is the study's."""

    def __init__(self, study: Study, trials: list[FrozenTrial]) -> None:
        self._study = study
        self._history = trials

    def _get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        trials = self._history if states is None else [t for t in self._history if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        """The chosen trials (Study.get_trials' signature)."""
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[FrozenTrial]:
        """The chosen trials, copied (Study.trials)."""
        return self._get_trials(deepcopy=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class BoundedTPESampler(TPESampler):
    """Optuna's TPESampler that sees at most the last `window` trials plus the `elite` best older completed ones.

    Every other argument is TPESampler's. The older trials are ranked as TPE picks its "below" trials: by value for
    one objective, by TPE's own split for several (non-domination rank, ties at the cut by hypervolume contribution).
    The elite is kept from one ask to the next and merged with the trials that left the window since (an ask costs
    O(window + elite), not O(n)): for one objective that is exactly the best `elite` older trials; for several, TPE's
    pick among the previous elite and the newcomers (an archive, as NSGA-II keeps one)."""

    def __init__(self, *, window: int = HISTORY_WINDOW, elite: int = HISTORY_ELITE, **kwargs: Any) -> None:
        if window < 1 or elite < 0:
            raise ValueError(f"window must be >= 1 and elite >= 0, got window={window}, elite={elite}")
        super().__init__(**kwargs)
        self.window, self.elite = window, elite
        self._archive: _Archive | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_archive"] = None  # rebuilt from the study at the next ask (e.g. after --resume)
        return state

    def _sample(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return super()._sample(self.history_view(study, trial), trial, search_space)

    def history_view(self, study: Study, trial: FrozenTrial) -> Study:
        """The study itself while it holds at most window + elite trials besides `trial`, else a view of the
        bounded history (what `_sample` hands TPE)."""
        # every trial, in number order (both Optuna storages sort by number: samplers rely on it), from this ask's
        # snapshot of the study: TPE's start-up check took it, so an RDB study is not read again (TPE itself reads it
        # afresh for each parameter under constant_liar, for running trials another process may have finished; the
        # sweep's driver alone asks and tells)
        trials = study._get_trials(deepcopy=False, use_cache=True)
        if len(trials) <= self.window + self.elite + 1:
            return study
        if trials[-1].number != len(trials) - 1:  # numbers not 0..n-1 (not an Optuna storage): no archive
            self._archive = None
            history = bounded_history(trials, trial.number, study.directions, self.window, self.elite)
            return cast("Study", _HistoryView(study, history))
        recent = [t for t in trials[-(self.window + 1) :] if t.number != trial.number][-self.window :]
        start = recent[0].number
        archive = self._archive
        if archive is None or not archive.continues(study, trials, start):
            archive = _Archive(study.study_name, study._study_id)
        archive.advance(trials, start, trial.number, study.directions, self.elite)
        self._archive = archive
        return cast("Study", _HistoryView(study, archive.elite + [t for t in recent if t.state in _SHOWN]))


_SHOWN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)  # what TPE reads (it filters further)


class _Archive:
    """The best completed trials numbered below `start` (the window's first), kept between asks."""

    def __init__(self, study_name: str, study_id: int) -> None:
        self.key = (study_name, study_id)
        self.start = 0  # trials below this number have been considered
        self.elite: list[FrozenTrial] = []
        self.open: list[int] = []  # considered while unfinished: looked at again until they finish

    def continues(self, study: Study, trials: Sequence[FrozenTrial], start: int) -> bool:
        """Whether this archive was built on this study's trials (a restored or reused sampler starts afresh)."""
        return (
            self.key == (study.study_name, study._study_id)
            and start >= self.start
            and all(e.number < len(trials) and trials[e.number]._trial_id == e._trial_id for e in self.elite)
        )

    def advance(
        self,
        trials: Sequence[FrozenTrial],
        start: int,
        current: int,
        directions: Sequence[StudyDirection],
        elite: int,
    ) -> None:
        """Merge the trials that left the window (and the earlier ones that finished since) into the elite."""
        fresh = self.open + list(range(self.start, start))
        done = [trials[i] for i in fresh if i != current and trials[i].state == TrialState.COMPLETE]
        self.open = [i for i in fresh if i == current or not trials[i].state.is_finished()]
        self.start = start
        if done:
            self.elite = best_trials(sorted(self.elite + done, key=lambda t: t.number), directions, elite)


def best_trials(done: list[FrozenTrial], directions: Sequence[StudyDirection], k: int) -> list[FrozenTrial]:
    """The `k` best of `done` (completed, in number order) as TPE picks its "below" trials, in number order: by value
    for one objective (ties: the earlier trial, as TPE's stable sort keeps them); for several, TPE's own split (the
    first non-domination ranks, ties at the cut broken by hypervolume contribution, so the elite spreads over the front
    instead of filling up with repeats of one point)."""
    if len(done) <= k:
        return list(done)
    if k == 0:
        return []
    if len(directions) > 1:
        below, _ = _split_complete_trials_multi_objective(done, cast("Study", _Directions(directions)), k)
        return below
    sign = -1.0 if directions[0] == StudyDirection.MAXIMIZE else 1.0
    loss = np.array([t.values[0] for t in done], dtype=np.float64) * sign
    keep = np.argsort(loss, kind="stable")[:k]
    return [done[i] for i in sorted(keep)]


class _Directions:
    """What TPE's multi-objective split reads of a study: its directions."""

    def __init__(self, directions: Sequence[StudyDirection]) -> None:
        self.directions = list(directions)


def bounded_history(
    trials: Sequence[FrozenTrial], current: int, directions: Sequence[StudyDirection], window: int, elite: int
) -> list[FrozenTrial]:
    """From scratch: the last `window` trials by number (other than `current`) that TPE reads, plus the `elite` best
    completed trials before them, in number order (what the archive keeps for one objective)."""
    ordered = sorted((t for t in trials if t.number != current), key=lambda t: t.number)
    recent, older = ordered[len(ordered) - window :], ordered[: max(0, len(ordered) - window)]
    done = [t for t in older if t.state == TrialState.COMPLETE]
    shown = best_trials(done, directions, elite) + [t for t in recent if t.state in _SHOWN]
    return sorted(shown, key=lambda t: t.number)


def make_sampler(seed: int) -> BoundedTPESampler:
    """The sweep's sampler: TPESampler(seed=seed) with Optuna's defaults, as Ray Tune's OptunaSearch builds it, shown
    the last HISTORY_WINDOW trials plus the HISTORY_ELITE best older ones."""
    return BoundedTPESampler(seed=seed, window=HISTORY_WINDOW, elite=HISTORY_ELITE)

"""The replay logic of benchmarks/studies/bench_search.py on synthetic tables with known answers (no training)."""

from __future__ import annotations

import math

import pytest

from benchmarks.studies.bench_search import (
    RANDOM,
    TPE_SWEEP,
    Table,
    cell_key,
    grid_cells,
    grid_order,
    hypervolume,
    lr_grid,
    multi_hits,
    nearest_lr,
    replay,
    sampling_mass,
    search_space,
    single_hits,
    summarise,
    trials_to_hit,
    verdict,
)

LOW, HIGH = 1e-4, 1e-1
CALS = ["temperature", "matrix", "none"]


def _table(best: str | None = None, fail: str | None = None, n_lrs: int = 4) -> Table:
    """Every cell at val ECE 0.10, accuracy 0.90; `best` at ECE 0.01 (accuracy 0.95); `fail` diverged."""
    lrs = lr_grid(LOW, HIGH, n_lrs)
    cells = {}
    for c, lr in grid_cells(CALS, lrs):
        k = cell_key(c, lr)
        cells[k] = {"calibrator": c, "lr": lr, "status": "completed", "val_accuracy": 0.90, "val_ece": 0.10}
        if k == best:
            cells[k].update(val_accuracy=0.95, val_ece=0.01)
        if k == fail:
            cells[k] = {"calibrator": c, "lr": lr, "status": "diverged"}
    return Table(CALS, lrs, cells)


def test_grid_cells_and_lrs():
    lrs = lr_grid(LOW, HIGH, 4)
    assert lrs == [1e-4, 1e-3, 1e-2, 1e-1]
    assert lr_grid(LOW, HIGH, 15)[::2] == lr_grid(LOW, HIGH, 8)  # the 8-point grid nests in the 15-point one
    cells = grid_cells(CALS, lrs)
    assert len(cells) == 2 * 4 + 1 and ("none", None) in cells  # a baseline choice is one cell, no lr


def test_nearest_grid_lr_in_log_space():
    lrs = [1e-4, 1e-3, 1e-2, 1e-1]
    assert nearest_lr(1e-3, lrs) == 1e-3
    assert nearest_lr(3.0e-4, lrs) == 1e-4  # below the geometric midpoint 3.16e-4 (arithmetic would say 1e-3)
    assert nearest_lr(3.3e-4, lrs) == 1e-3
    assert nearest_lr(5e-2, lrs) == 1e-1
    assert nearest_lr(1e-7, lrs) == 1e-4 and nearest_lr(10.0, lrs) == 1e-1
    t = _table()
    assert t.key({"calibrator": "matrix", "calibrator_lr": 0.004}) == cell_key("matrix", 1e-2)
    assert t.key({"calibrator": "none"}) == "none"


def test_sampling_mass_sums_to_one_and_ends_get_half():
    t = _table()
    masses = {k: sampling_mass(t, k, LOW, HIGH) for k in t.cells}
    assert math.isclose(sum(masses.values()), 1.0)
    assert math.isclose(masses["none"], 1 / 3)
    end, inner = masses[cell_key("matrix", 1e-4)], masses[cell_key("matrix", 1e-3)]
    assert math.isclose(inner, 2 * end) and math.isclose(end, 1 / 3 / 6)


def test_hits():
    best = cell_key("matrix", 1e-2)
    t = _table(best=best)
    assert single_hits(t) == {best}
    assert multi_hits(t) == {best}
    # a cell 0.4 pt less accurate with an ECE within 10 % of the best also counts in the multi case
    near = cell_key("temperature", 1e-3)
    t.cells[near].update(val_accuracy=0.946, val_ece=0.0105)
    assert multi_hits(t) == {best, near} and single_hits(t) == {best, near}
    t.cells[near].update(val_accuracy=0.944)  # 0.6 pt: too inaccurate
    assert multi_hits(t) == {best}


def test_trials_to_hit():
    assert trials_to_hit(["a", "b", "c"], {"a"}) == 1  # the first cell is the best: 1 trial
    assert trials_to_hit(["a", "b", "c"], {"c", "b"}) == 2
    assert trials_to_hit(["a", "b"], {"z"}) is None


@pytest.mark.parametrize("seed", range(5))
def test_grid_search_hits_the_best_cell_by_its_last_trial(seed):
    best = cell_key("temperature", 1e-1)
    t = _table(best=best)
    order = grid_order(t, seed)
    assert sorted(order) == sorted(t.cells)  # every cell once
    assert 1 <= trials_to_hit(order, single_hits(t)) <= len(t.cells)
    assert order == grid_order(t, seed)  # reproducible


def test_replay_first_trial_best_is_one():
    """A table where every cell is within 10 % of the best: any sampler hits on trial 1."""
    import optuna

    t = _table()
    space = search_space(CALS, LOW, HIGH)
    for objective in ("single", "multi"):
        visited = replay(t, space, optuna.samplers.RandomSampler(seed=0), 3, objective, concurrency=2)
        assert len(visited) == 3 and all(k in t.cells for k in visited)
        hits = single_hits(t) if objective == "single" else multi_hits(t)
        assert trials_to_hit(visited, hits) == 1


def test_replay_failed_cells_and_sweeps_tpe_starts_as_random():
    """Diverged cells are told FAIL without breaking the search; the sweep's TPE (n_startup_trials=10)
    draws exactly random search's first trials for the same seed."""
    import optuna

    t = _table(best=cell_key("matrix", 1e-3), fail=cell_key("temperature", 1e-2))
    space = search_space(CALS, LOW, HIGH)
    for objective in ("single", "multi"):
        tpe = replay(t, space, optuna.samplers.TPESampler(seed=3), 14, objective, concurrency=2)
        rnd = replay(t, space, optuna.samplers.RandomSampler(seed=3), 14, objective, concurrency=2)
        assert tpe[:10] == rnd[:10]


def test_random_replay_follows_the_sampling_mass():
    import optuna

    t = _table()
    visited = replay(t, search_space(CALS, LOW, HIGH), optuna.samplers.RandomSampler(seed=0), 600, "single")
    for k in (cell_key("matrix", 1e-4), cell_key("matrix", 1e-3), "none"):
        p = sampling_mass(t, k, LOW, HIGH)
        se = math.sqrt(p * (1 - p) / len(visited))
        assert abs(visited.count(k) / len(visited) - p) < 4 * se


def test_hypervolume():
    ref = (0.0, 1.0)
    assert math.isclose(hypervolume([(1.0, 0.0)], ref), 1.0)
    assert math.isclose(hypervolume([(0.5, 0.5)], ref), 0.25)
    # two non-dominated points: union of [0, .8] x [.6, 1] and [0, .4] x [.2, 1]
    assert math.isclose(hypervolume([(0.8, 0.6), (0.4, 0.2)], ref), 0.8 * 0.4 + 0.4 * 0.4)
    # a dominated point and points outside the reference box add nothing
    assert math.isclose(hypervolume([(0.8, 0.6), (0.4, 0.2), (0.3, 0.7), (-1.0, 0.1)], ref), 0.48)


def test_summarise_counts_hits_by_budget_and_pairs_with_random():
    def rows(ts):
        return [
            {
                "trials_to_hit": x,
                "trials_to_hit@0.25": x,
                "trials_to_hit@0.5": 1,
                "ece_ratio@8": 1.0,
                "ece_ratio@16": 1.0,
                "ece_ratio@32": 1.0,
            }
            for x in ts
        ]

    runs = {TPE_SWEEP: rows([1, 9, 40, None]), RANDOM: rows([1, 20, None, None])}
    s = summarise(runs, "single", cap=64)
    assert s[TPE_SWEEP]["hit"] == {"8": 0.25, "16": 0.5, "32": 0.5, "64": 0.75}
    assert s[RANDOM]["hit"]["32"] == 0.5 and s[RANDOM]["censored"] == 2
    assert math.isclose(s[TPE_SWEEP]["mean_trials"], (1 + 9 + 40 + 64) / 4)  # censored counts as the cap
    assert math.isclose(s[TPE_SWEEP]["hit_vs_random"]["16"][0], 0.25)
    assert s[TPE_SWEEP]["hit_loose"]["0.25"]["16"] == 0.5 and s[RANDOM]["hit_loose"]["0.5"]["8"] == 1.0


def test_verdict_says_no_when_tpe_is_random_at_eight_trials():
    def res(tpe_hits16):
        s = summarise(
            {
                TPE_SWEEP: [
                    {
                        "trials_to_hit": t,
                        "trials_to_hit@0.25": t,
                        "trials_to_hit@0.5": t,
                        "ece_ratio@8": 1.0,
                        "ece_ratio@16": 1.0,
                        "ece_ratio@32": 1.0,
                    }
                    for t in tpe_hits16
                ],
                RANDOM: [
                    {
                        "trials_to_hit": t,
                        "trials_to_hit@0.25": t,
                        "trials_to_hit@0.5": t,
                        "ece_ratio@8": 1.0,
                        "ece_ratio@16": 1.0,
                        "ece_ratio@32": 1.0,
                    }
                    for t in [1] * 5 + [None] * 45
                ],
            },
            "single",
            cap=64,
        )
        return {"d": {"single": {"summary": s, "tpe_first8_equals_random": 1.0}}}

    text = "\n".join(verdict(res([1] * 5 + [12] * 45)))  # same at 8, far better by 16
    assert "**Verdict: no.**" in text and "keeping TPE" in text
    text = "\n".join(verdict(res([1] * 5 + [None] * 45)))  # identical throughout
    assert "**Verdict: no.**" in text and "neither" in text

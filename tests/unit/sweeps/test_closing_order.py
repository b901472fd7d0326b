"""The closing chooses and registers the champion first, then computes the other intervals and writes the report
(issue 47 item 1). What the rule reads first (sweep_replicates with choice_only) and what complete_replicates adds
after give every replicate, null, point and bound the one-pass computation gave, key for key and in the same order;
the champion, its sentence and the terminal's leaderboard are the same from the first part alone, for every rule;
and the service registers the champion (and prints it) before it computes the deferred intervals."""

from __future__ import annotations

import io
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calib_core.metrics import METRIC_NAMES
from sweeps.config import SweepConfig
from sweeps.decide.selection import TrialRecord, choose
from sweeps.decide.uncertainty import FULL_DETAIL_TRIALS
from sweeps.finish import add_detail, candidates, choice_replicates, complete_replicates, sweep_replicates
from sweeps.report.files import BOARD_SHOWN, board_order, format_leaderboard, leaderboard
from sweeps.selection_rules import RULE_SPECS

SETS = ("lac", "aps")


class _Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextmanager
    def as_directory(self):
        yield str(self.path)


def _sweep(tmp_path: Path, n_trials: int, rows: int = 150, ts: bool = True) -> list[TrialRecord]:
    """Trials with stored predictions (and, with `ts`, + TS ones) and conformal rows, as a sweep's checkpoints."""
    rng = np.random.default_rng(n_trials)
    k = 5
    labels = {s: rng.integers(0, k, rows) for s in ("val", "test")}
    records = []
    for i in range(n_trials):
        acc, conf = rng.uniform(0.5, 0.9), rng.uniform(0.4, 0.99)
        arrays, metrics = {}, {}
        for pre in ("", "ts_") if ts else ("",):
            for split, y in labels.items():
                right = rng.random(rows) < acc
                top = np.where(right, y, (y + rng.integers(1, k, rows)) % k)
                p = np.full((rows, k), (1 - conf) / (k - 1), dtype=np.float32)
                p[np.arange(rows), top] = conf
                arrays[f"{pre}{split}_probs"], arrays[f"{pre}{split}_labels"] = p, y
                metrics[f"{pre}{split}_accuracy"] = float((p.argmax(1) == y).mean())
                metrics[f"{pre}{split}_ece"] = abs(conf - metrics[f"{pre}{split}_accuracy"])
                metrics[f"{pre}{split}_nll"] = 1.0
                for method in SETS:
                    size = rng.integers(1, k + 1, rows).astype(np.int32)
                    arrays[f"{pre}cp_{method}_a10_{split}_size"] = size
                    arrays[f"{pre}cp_{method}_a10_{split}_covered"] = (rng.random(rows) < 0.9).astype(np.uint8)
                    metrics[f"{pre}{split}_cp_{method}_a10_size"] = float(size.mean())
                    metrics[f"{pre}{split}_cp_{method}_a10_coverage"] = 0.9
        d = tmp_path / f"t{i:02d}"
        d.mkdir()
        np.savez(d / "predictions.npz", **arrays)
        records.append(
            TrialRecord(
                trial_id=f"t{i:02d}",
                label=f"trial {i}",
                status="completed",
                metrics=metrics,
                params={"calibrator": "temperature" if i % 2 else "vector"},
                checkpoint=_Checkpoint(d),
            )
        )
    return records


def _cfg(rule: str) -> SweepConfig:
    selection = {"num_resamples": 200, "rule": rule}
    if rule == "smallest_sets":
        selection.update(sets_method="lac", sets_alpha=0.1)
    return SweepConfig.model_validate({"selection": selection})


@pytest.mark.parametrize(
    ("n_trials", "rule"),
    [
        *((5, rule) for rule in sorted(RULE_SPECS)),
        (FULL_DETAIL_TRIALS + 6, "margin"),
        # more candidates than the terminal shows: a rule that reads no replicates gets those of a few first
        *((12, rule) for rule in sorted(RULE_SPECS) if not RULE_SPECS[rule].needs_replicates),
        (FULL_DETAIL_TRIALS + 6, "most_accurate_ts"),
    ],
)
def test_choice_first_then_the_rest_is_the_one_pass_computation(tmp_path, n_trials, rule):
    cfg = _cfg(rule)
    records = candidates(_sweep(tmp_path, n_trials, ts=n_trials < FULL_DETAIL_TRIALS), cfg.selection.metric)
    # before: every metric in one pass (beyond FULL_DETAIL_TRIALS, the detail trials), then the champion's detail
    full = sweep_replicates(records, cfg)
    before = choose(records, cfg.selection, full)
    add_detail(full, records, cfg, before.champion.trial_id)
    # now: what the choice and the printed lines read, the choice, then the rest
    first = choice_replicates(records, cfg)
    now = choose(records, cfg.selection, first)
    ok = [r for r in records if r.ok]
    if RULE_SPECS[rule].needs_replicates or len(ok) <= BOARD_SHOWN:
        assert set(first.values) == {r.trial_id for r in ok}
    else:  # the shown rows, the champion and the most accurate candidate only
        shown = {r.trial_id for r in board_order(records)[:BOARD_SHOWN]}
        assert set(first.values) == shown | {now.champion.trial_id, now.most_accurate.trial_id}
        assert len(first.values) < len(ok)
    assert now.champion.trial_id == before.champion.trial_id and now.sentence == before.sentence
    assert now.standings == before.standings
    sets_read = rule == "smallest_sets"
    for keys in first.values.values():  # accuracy and ECE, and the conformal means only when the rule reads them
        allowed = {f"{s}_{m}" for s in ("val", "test") for m in ("accuracy", "ece", "nll", "brier")}
        assert {k for k in keys if "_cp_" not in k} == allowed
        assert any("_cp_" in k for k in keys) == sets_read
    shown = [
        format_leaderboard(leaderboard(records, c.champion, r, cfg.selection, c))
        for c, r in ((now, first), (before, full))
    ]
    assert shown[0] == shown[1]  # the terminal's leaderboard, printed before the rest is computed
    complete_replicates(first, records, cfg, now.champion.trial_id)
    for attr in ("values", "points", "nulls", "bounds", "groups"):
        got, want = getattr(first, attr), getattr(full, attr)
        assert list(got) == list(want), attr
        for tid in want:
            assert list(got[tid]) == list(want[tid]), (attr, tid)  # the same keys in the same order
            for key, value in want[tid].items():
                np.testing.assert_array_equal(got[tid][key], value)
    assert all(first.has(now.champion.trial_id, f"test_{m}") for m in METRIC_NAMES)


class _Store:
    """What the closing calls on MLflow, as calls recorded in `events`."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def log_artifacts(self, run_id, files):
        self.events.append("report files")

    def set_tags(self, run_id, tags):
        pass

    def log_metrics(self, run_id, metrics, step=0):
        pass

    def terminate(self, run_id, status):
        self.events.append(f"parent {status}")


def test_the_champion_is_registered_and_printed_before_the_deferred_intervals(tmp_path, monkeypatch):
    from sweeps import service
    from sweeps.report.timing import PhaseClock
    from sweeps.start_steps import Startup

    events: list[str] = []
    records = _sweep(tmp_path, 4)
    cfg = _cfg("margin")
    seen_at_registration = {}

    def register(cfg, store, chosen, promote, acc):
        reps = seen["reps"]
        seen_at_registration.update(
            champion=chosen.trial_id,
            acc=acc,
            deferred=[m for m in METRIC_NAMES if reps.has(chosen.trial_id, f"val_{m}")],
        )
        events.append("registered")
        print("(registered)")
        return "1", "champion", ""

    seen = {}
    real_first, real_rest = service.choice_replicates, service.complete_replicates

    def first(records, cfg):
        seen["reps"] = real_first(records, cfg)
        events.append("choice replicates")
        return seen["reps"]

    def rest(reps, records, cfg, champion_id):
        events.append("deferred intervals")
        print("(deferred intervals)")
        real_rest(reps, records, cfg, champion_id)

    def report(*args, **kwargs):
        events.append("html report")

    monkeypatch.setattr(service, "choice_replicates", first)
    monkeypatch.setattr(service, "complete_replicates", rest)
    monkeypatch.setattr(service, "register_champion", register)
    monkeypatch.setattr(service, "mark_champion", lambda *a, **k: events.append("study marked"))
    monkeypatch.setattr(service, "write_report", report)
    run = SimpleNamespace(
        cfg=cfg, store=_Store(events), opened=SimpleNamespace(experiment_id="1", parent_id="p"), exp_path=str(tmp_path)
    )
    clock = PhaseClock()
    for phase in ("ray_start", "trials", "closing"):
        clock.end(phase)
    out = io.StringIO()
    with redirect_stdout(out):
        result = service._choose_and_register(run, records, False, False, clock, Startup())
    assert events == [
        "choice replicates",
        "registered",
        "study marked",
        "deferred intervals",
        "report files",
        "html report",
        "parent FINISHED",
    ]
    assert seen_at_registration["deferred"] == ["accuracy", "nll", "brier", "ece"]  # nothing else was computed yet
    assert set(seen_at_registration["acc"]) == {"val", "test"}
    text = out.getvalue()
    order = ["(registered)", "Leaderboard", "Selection: ", "Registered: models:/", "Writing every metric's intervals"]
    order += ["(deferred intervals)", "Timing: "]
    at = [text.index(s) for s in order]
    assert at == sorted(at), text
    assert result.champion_trial_id == seen_at_registration["champion"]
    assert set(result.intervals[result.champion_trial_id]) >= {f"test_{m}" for m in METRIC_NAMES}
    t = result.timings
    assert t["champion_s"] <= t["selection_registration_s"]


def test_board_order_is_pandas_sort_by_val_ece_then_trial_id():
    """The rows choice_replicates gives intervals first are the rows a terminal shows: board_order against pandas'
    sort (NaN last, stable) on random boards with ties, NaN and missing values."""
    import pandas as pd

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        records = []
        for i in rng.permutation(n):
            kind = rng.random()
            metrics = {} if kind < 0.1 else {"val_ece": float("nan") if kind < 0.2 else float(rng.integers(0, 5)) / 10}
            records.append(TrialRecord(trial_id=f"t{i:02d}", label="", status="completed", metrics=metrics))
        df = pd.DataFrame([{"trial_id": r.trial_id, "val_ece": r.metrics.get("val_ece", np.nan)} for r in records])
        want = df.sort_values(["val_ece", "trial_id"], na_position="last", kind="stable")["trial_id"].tolist()
        if not any("val_ece" in r.metrics for r in records):  # the leaderboard had no val_ece column to sort by
            want = [r.trial_id for r in records]
        assert [r.trial_id for r in board_order(records)] == want

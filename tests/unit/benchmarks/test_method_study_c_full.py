"""Protocol C's full factorial (benchmarks/studies/method_study_c_full.py): the pigeonhole bootstrap, Holm, the verdict
rules against hand computations, the edge rule, and a --tiny study end to end (provenance in every row,
resumption reruns nothing, an interrupted study draws what an uninterrupted one draws, the re-tune path, the
report's numbers recomputed from the gzip CSV)."""

from __future__ import annotations

import copy
import csv
import gzip
import json
import math

import numpy as np
import pytest

from benchmarks.provenance import FIELDS
from benchmarks.studies import method_study_c_full as full
from benchmarks.studies import method_study_c_slice as msc


def test_pigeonhole_bootstrap_recovers_a_known_mean_difference():
    rng = np.random.default_rng(5)
    n_r, n_s, mu = 3, 24, -0.02
    a, b = rng.normal(0, 0.01, n_r), rng.normal(0, 0.03, n_s)
    d = mu + (a - a.mean())[:, None] + (b - b.mean())[None, :]  # additive, plug-in mean exactly mu
    draws = full.pigeonhole_draws(d, 10_000, 31)
    # each draw is the mean over the crossed resample: check the first draws against an explicit loop
    g = np.random.default_rng(31)
    ir, is_ = g.integers(0, n_r, size=(10_000, n_r)), g.integers(0, n_s, size=(10_000, n_s))
    for i in range(200):
        assert draws[i] == pytest.approx(d[np.ix_(ir[i], is_[i])].mean(), abs=1e-15)
    # additive model: a draw's variance is var(a)/R + var(b)/S (population variances)
    expected_sd = math.sqrt(np.var(a) / n_r + np.var(b) / n_s)
    assert draws.mean() == pytest.approx(mu, abs=3 * expected_sd / 100)
    assert draws.std() == pytest.approx(expected_sd, rel=0.03)
    t = full.Pigeonhole(10_000, 31)
    s = t.summary(d)
    assert s["mean"] == pytest.approx(mu, abs=1e-15) and s["n_replicates"] == 3 and s["n_seeds"] == 24
    assert s["replicate_means"] == pytest.approx(list(mu + a - a.mean()), abs=1e-15)
    lo, hi = t.interval(s, 0.95)
    assert lo < mu < hi
    assert (lo, hi) == pytest.approx(tuple(np.quantile(draws, [0.025, 0.975])))
    # one-sided p = share of draws on the wrong side of the bound
    assert t.p(s, ("below", 0.0)) == pytest.approx(float(np.mean(draws >= 0.0)))
    assert t.p(s, ("above", -0.01)) == pytest.approx(float(np.mean(draws <= -0.01)))
    assert t.tost(s, 0.01) == max(t.p(s, ("above", -0.01)), t.p(s, ("below", 0.01)))
    const = t.summary(np.full((3, 24), 0.5))
    assert t.interval(const, 0.95) == pytest.approx((0.5, 0.5)) and t.p(const, ("below", 0.6)) == 0.0


def test_holm_and_the_verdict_rules_with_the_bootstrap():
    # hand computation: sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert msc.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    spec = msc.load_spec()
    rng = np.random.default_rng(0)

    def grid(mean, sd, rep_sd=0.0):
        return mean + rep_sd * rng.standard_normal((3, 1)) + sd * rng.standard_normal((3, 24))

    tester = full.Pigeonhole(10_000, 31)
    better = {"ece": grid(-0.03, 0.005), "debiased_l2_ce": grid(-0.03, 0.005), "nll": grid(-0.05, 0.01)}
    better["accuracy"] = grid(0, 0.001)
    worse = {**better, "nll": grid(0.05, 0.01)}
    mixed = {**better, "ece": grid(0.0, 0.02, 0.01)}
    res = msc.evaluate_claim({"a": better, "b": worse, "c": mixed}, "better", spec, msc.REPORT_METRICS, tester)
    assert [res[r]["verdict"] for r in "abc"] == ["established", "refuted", "not settled"]
    # Holm across the regimes of the claim: the reported p's are Holm's of the raw bootstrap p's
    for metric in msc.REPORT_METRICS:
        est, _ = msc.claim_tests("better", metric, spec["margins"])
        raw = [float(np.mean(full.pigeonhole_draws(x[metric], 10_000, 31) >= est[1])) for x in (better, worse, mixed)]
        if metric == "accuracy":
            raw = [
                float(np.mean(full.pigeonhole_draws(x[metric], 10_000, 31) <= est[1])) for x in (better, worse, mixed)
            ]
        assert [res[r]["metrics"][metric]["p_establish_holm"] for r in "abc"] == pytest.approx(msc.holm(raw))
    same = {"ece": grid(0, 0.002), "debiased_l2_ce": grid(0, 0.002), "nll": grid(0, 0.005), "accuracy": grid(0, 0.002)}
    far = {**same, "nll": grid(0.2, 0.01)}
    res = msc.evaluate_claim({"a": same, "b": far, "c": same, "d": same}, "matches", spec, msc.REPORT_METRICS, tester)
    assert [res[r]["verdict"] for r in "abcd"] == ["established", "refuted", "established", "established"]
    m = res["a"]["metrics"]["nll"]
    assert m["level_adj"] == pytest.approx(1 - 2 * 0.05 / 4) and m["p_tost_holm"] < 0.05
    assert m["ci_adj"][0] < m["ci95"][0] < m["ci95"][1] < m["ci_adj"][1]
    assert "p_tost_holm" not in res["a"]["metrics"]["accuracy"]


def test_edge_rule_detects_and_widens():
    rule = {"fraction": 0.05, "widen_decades": 1, "exempt": ["weight_decay_low"]}
    space = {"lr": [1e-4, 0.3], "weight_decay": [1e-6, 0.1]}
    chosen = {1: {"lr": 0.29, "weight_decay": 1.1e-6}, 2: {"lr": 0.01, "weight_decay": 0.09}, 3: {"lr": 1.2e-4}}
    hits = full.edge_hits(space, chosen, rule)
    assert {(h["replicate"], h["param"], h["edge"]) for h in hits} == {
        (1, "lr", "high"),
        (2, "weight_decay", "high"),
        (3, "lr", "low"),
    }
    wider = full.widen(space, hits, rule)
    assert wider["lr"] == pytest.approx([1e-5, 3.0]) and wider["weight_decay"] == pytest.approx([1e-6, 1.0])
    # 0.01 in [1e-4, 0.3] sits at 0.58 of the log range: no hit
    assert full.edge_hits(space, {1: {"lr": 0.01, "weight_decay": 1e-3}}, rule) == []


def _csv_rows(path):
    with gzip.open(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def test_tiny_full_study_end_to_end(tmp_path):
    spec = msc.load_spec()
    pl = full.plan(spec, tiny=True)
    out = tmp_path / "a"
    n = full.run_full(spec, ["overconf"], out, tiny=True)
    rows = full.read_rows(out)
    _check_rows(spec, pl, out, rows, n)
    # resumption: nothing is rerun
    assert full.run_full(spec, ["overconf"], out, tiny=True) == 0
    _check_an_interrupted_study_draws_the_same(spec, rows, tmp_path / "b")
    text, rec = full.build_full_report(spec, out, "cmd", tiny=True)
    _check_claims_from_the_csv(spec, pl, out, text, rec)
    _check_winners_curse(rec, rows)
    _check_the_edge_rules_retune(spec, pl, out)
    _check_mixed_commits_refused(spec, out)


def _check_rows(spec, pl, out, rows, n):
    """Every row's count, fields and split discipline, and the compact arrays' keys."""
    assert not full.journal_path(out).exists()  # merged into the table at the end
    tune = [r for r in rows if r["stage"] == "tune"]
    evals = [r for r in rows if r["stage"] == "eval"]
    assert len(tune) == 8 * 3 * pl["trials"] * 2 and len(evals) == 8 * 3 * len(pl["eval_seeds"]) * 2
    shared = [r for r in tune if r["shared_from"]]
    assert len(shared) >= 4 * 3 * pl["startup_trials"] * 2  # the ts cells' random start-up trials
    assert n == len(tune) - len(shared) + len(evals) // 2
    for r in rows:
        assert all(f in r for f in FIELDS) and r["source_sha256"] and r["optuna"] and r["threads"] == 1
        assert r["status"] == "completed" and r["git_commit"]
    assert all(r["test_nll"] is None for r in tune)  # tuning never reads the test split
    assert all(r["test_nll"] is not None and r["val_objective"] is not None for r in evals)
    with np.load(full.rows_file(out, "overconf")) as z:
        keys = {f.rsplit("/", 1)[0] for f in z.files}
    assert keys == {
        f"overconf/{o}/{p}/rep1/seed{s}" for o, p in full.storage(spec, True)["cells"] for s in pl["eval_seeds"]
    }


def _check_an_interrupted_study_draws_the_same(spec, rows, b):
    """An interrupted study (stopped mid-trial, resumed) draws and computes what the uninterrupted one did."""
    assert full.run_full(spec, ["overconf"], b, tiny=True, limit=15) == 15
    assert full.run_full(spec, ["overconf"], b, tiny=True, limit=25) == 25
    first = {full._key(r): r for r in rows}
    later = full.read_rows(b)
    assert len(later) >= 40
    for r in later:
        x = first[full._key(r)]
        assert json.loads(r["params"]) == json.loads(x["params"])
        assert r["val_objective"] == x["val_objective"] and r["val_nll_ts_crossfit"] == x["val_nll_ts_crossfit"]


def _check_claims_from_the_csv(spec, pl, out, text, rec):
    """The report's claims recomputed from the gzip CSV with the csv module only."""
    raw = [r for r in _csv_rows(msc.table_path(out, "full")) if r["stage"] == "eval"]
    cell = {(r["objective"], r["cell_post"], r["post"], int(r["replicate"]), int(r["seed"])): r for r in raw}
    for name, claim in spec["claims"].items():
        (ma, pa), (mb, pb) = claim["method"].split("/"), claim["reference"].split("/")
        x = rec["claims"][name]["per_regime"]["overconf"]
        assert x["replicates"] == [1, 2, 3] and x["seeds"] == pl["eval_seeds"] and x["complete"]
        for metric in msc.REPORT_METRICS:
            d = np.array(
                [
                    [
                        float(cell[(ma, pa, pa, k, s)][f"test_{metric}"])
                        - float(cell[(mb, pb, pb, k, s)][f"test_{metric}"])
                        for s in pl["eval_seeds"]
                    ]
                    for k in (1, 2, 3)
                ]
            )
            m = x["metrics"][metric]
            assert m["mean"] == pytest.approx(d.mean(), abs=1e-12)
            assert m["replicate_means"] == pytest.approx(list(d.mean(axis=1)), abs=1e-12)
            est, ref = msc.claim_tests(claim["kind"], metric, spec["margins"])
            draws = full.pigeonhole_draws(d, spec["bootstrap"]["resamples"], spec["bootstrap"]["seed"])

            def wrong(t, draws=draws):
                return np.mean(draws >= t[1]) if t[0] == "below" else np.mean(draws <= t[1])

            assert m["p_establish_holm"] == pytest.approx(wrong(est))  # one regime: Holm leaves p as is
            assert m["p_refute_holm"] == pytest.approx(wrong(ref))
        assert f"**Overall: {rec['claims'][name]['overall']}**" in text


def _check_winners_curse(rec, rows):
    """The chosen trial's tuning value is the mean of its two tuning rows."""
    for key, wc in rec["winners_curse"].items():
        _, o, p = key.split("/")
        for k, w in wc.items():
            t = rec["tuning"][key]["replicates"][k]
            vals = [
                r["val_objective"]
                for r in rows
                if r["stage"] == "tune"
                and (r["objective"], r["cell_post"], r["replicate"], r["trial"]) == (o, p, k, t["chosen_trial"])
            ]
            assert w["tuning_value"] == pytest.approx(float(np.mean(vals)), abs=1e-12)


def _check_the_edge_rules_retune(spec, pl, out):
    """The edge rule's re-tune path: refused without an edge hit, then (a wide rule: every cell hits) round 1."""
    strict = copy.deepcopy(spec)
    strict["edge_rule"]["fraction"] = 0.0
    with pytest.raises(SystemExit, match="no edge hit"):
        full.run_full(strict, ["overconf"], out, tiny=True, retune=["onego_ts/none"])
    wide = copy.deepcopy(spec)
    wide["edge_rule"]["fraction"] = 0.5
    wide["edge_rule"]["exempt"] = []
    assert full.run_full(wide, ["overconf"], out, tiny=True, retune=["onego_ts/none"]) > 0
    rows = full.read_rows(out)
    r1 = [r for r in rows if (r["objective"], r["cell_post"], r["round"]) == ("onego_ts", "none", 1)]
    assert len([r for r in r1 if r["stage"] == "eval"]) == 3 * len(pl["eval_seeds"]) * 2
    space = json.loads(next(r for r in r1 if r["stage"] == "tune")["space"])
    base = spec["objectives"]["onego_ts"]["tune"]
    assert any(space[k] != pytest.approx(list(v)) for k, v in base.items())  # an edge moved by a decade
    assert all(space[k][0] in (v[0], v[0] / 10) and space[k][1] in (v[1], v[1] * 10) for k, v in base.items())
    _, rec = full.build_full_report(spec, out, "cmd", tiny=True, bootstrap=False)
    assert rec["rounds"]["overconf/onego_ts/none"] == 1 and rec["tuning"]["overconf/onego_ts/none"]["round"] == 1


def _check_mixed_commits_refused(spec, out):
    """Rows of another commit: refused unless allowed."""
    rows = full.read_rows(out)
    for r in rows:
        r["git_commit"] = "0" * 40
    msc.write_table(msc.table_path(out, "full"), rows, full.COLUMNS, full._order)
    with pytest.raises(ValueError, match="refusing to mix commits"):
        full.run_full(spec, ["overconf"], out, tiny=True)
    assert full.run_full(spec, ["overconf"], out, tiny=True, allow_mixed=True) == 0


def test_a_background_study_stops_on_sigterm_or_an_ignored_sigint_with_its_journal_merged(tmp_path):
    """Started in the background by a shell (SIGINT ignored, as bash sets it for `&` without job control), the
    study still stops on SIGINT, and on SIGTERM, the way Ctrl+C stops it: the journal merged into the table."""
    import signal
    import subprocess
    import sys
    import time

    from benchmarks.common import ROOT

    code = (
        "import sys; from pathlib import Path; "
        "from benchmarks.studies import method_study_c_slice as msc, method_study_c_full as full; "
        "full.stop_on_signals(); full.run_full(msc.load_spec(), ['overconf'], Path(sys.argv[1]), tiny=True)"
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        out = tmp_path / sig.name
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(out)],
            cwd=ROOT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while not full.journal_path(out).is_file() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert full.journal_path(out).is_file(), "no row was journalled"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]  # stopped, not finished
        assert not full.journal_path(out).exists() and full.read_rows(out), sig.name  # merged into the table


def test_a_row_journalled_but_not_yet_in_memory_survives_the_merge(tmp_path):
    """A stop signal can end RunTable.add between its fsynced journal line and its update of the rows in memory;
    the merge then still writes that row (it reads the table and the journal back from disk)."""
    from benchmarks.common import ROOT

    results = ROOT / "benchmarks" / "results" / "method_study_c"
    committed = msc.read_table(msc.table_path(results, full.STUDY), full.INTS)
    first, second = committed[0], committed[1]
    stopping = full.RunTable(tmp_path)  # the study's table, as the stop finds it
    stopping.add([first])
    full.RunTable(tmp_path).add([second])  # journalled on disk, absent from `stopping`'s memory
    stopping.merge()
    assert not full.journal_path(tmp_path).exists()
    assert {full._key(r) for r in full.read_rows(tmp_path)} == {full._key(first), full._key(second)}

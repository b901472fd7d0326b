"""Protocol C's harness (benchmarks/studies/method_study_c_slice.py): compact storage, resumption, provenance,
statistics."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from benchmarks.provenance import FIELDS
from benchmarks.studies import method_study_c_slice as msc
from benchmarks.studies.row_encoding import CONF_BINS, CONF_SCALE, SUBBINS, library_bins, quantize_conf


def test_holm_matches_the_step_down_rule():
    # sorted p: 0.01, 0.02, 0.04, 0.30 with m = 4 -> 0.04, 0.06, 0.08, 0.30 (monotone)
    assert msc.holm([0.04, 0.01, 0.30, 0.02]) == pytest.approx([0.08, 0.04, 0.30, 0.06])
    assert math.isnan(msc.holm([0.5, math.nan])[1]) and msc.holm([0.5, math.nan])[0] == 0.5


def test_claim_verdicts_follow_the_protocol_rules():
    spec = msc.load_spec()
    rng = np.random.default_rng(0)
    n = 24

    def d(mean, sd):
        return list(mean + sd * rng.standard_normal(n))

    better = {"ece": d(-0.03, 0.005), "debiased_l2_ce": d(-0.03, 0.005), "nll": d(-0.05, 0.01), "accuracy": d(0, 0.001)}
    worse = {**better, "nll": d(0.05, 0.01)}
    mixed = {**better, "ece": d(0.0, 0.02)}
    res = msc.evaluate_claim({"a": better, "b": worse, "c": mixed}, "better", spec, msc.REPORT_METRICS)
    assert [res[r]["verdict"] for r in "abc"] == ["established", "refuted", "not settled"]
    # matches: within the margins is established, an NLL worse by far more than 0.03 nats is refuted
    same = {"ece": d(0, 0.002), "debiased_l2_ce": d(0, 0.002), "nll": d(0, 0.005), "accuracy": d(0, 0.002)}
    far = {**same, "nll": d(0.2, 0.01)}
    res = msc.evaluate_claim({"a": same, "b": far, "c": same, "d": same}, "matches", spec, msc.REPORT_METRICS)
    assert [res[r]["verdict"] for r in "abcd"] == ["established", "refuted", "established", "established"]
    assert res["a"]["metrics"]["nll"]["level_adj"] == pytest.approx(1 - 2 * 0.05 / 4)
    lo, hi = res["a"]["metrics"]["nll"]["ci_adj"]
    lo95, hi95 = res["a"]["metrics"]["nll"]["ci95"]
    assert lo < lo95 < hi95 < hi  # the adjusted interval is the wider one


def test_compact_arrays_round_trip():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.full(4, 0.5), 101)
    labels = rng.integers(-1, 4, 101)  # -1 = missing
    z = msc.compact_task_arrays(probs, labels, "t0_")
    conf, correct, keep, k = msc.unpack_task(z, "t0_")
    assert k == 4 and keep.tolist() == (labels >= 0).tolist()
    u16 = quantize_conf(probs[keep].max(1))
    assert z["t0_conf"].dtype == np.uint8  # one byte a row, bin-exact (benchmarks/studies/row_encoding.py)
    assert library_bins(conf).tolist() == library_bins(u16 / CONF_SCALE).tolist()
    assert np.abs(conf - u16 / CONF_SCALE).max() <= 1 / (CONF_BINS * SUBBINS) + 1e-12  # one sub-bin at most
    assert correct.tolist() == (probs[keep].argmax(1) == labels[keep]).tolist()
    old = {**z, "t0_conf": u16}  # rows written before the recode (uint16) still read
    del old["t0_binsum"]
    assert msc.unpack_task(old, "t0_")[0].tolist() == (u16 / CONF_SCALE).tolist()


def test_tiny_slice_writes_rows_with_provenance_resumes_and_refuses_mixed_commits(tmp_path):
    spec = msc.load_spec()
    assert msc.run_slice(spec, ["overconf"], tmp_path, tiny=True, limit=1) == 1
    rows = msc.read_table(msc.table_path(tmp_path))
    assert len(rows) == 2 and {r["post"] for r in rows} == {"none", "ts"}
    for r in rows:
        assert all(f in r for f in FIELDS) and r["source_sha256"] and r["threads"] == 1
        assert r["status"] == "completed" and r["test_ece"] is not None
    ts = [r for r in rows if r["post"] == "ts"]
    assert all(r["temperature"] and r["val_nll_ts_crossfit"] is not None for r in ts)
    with np.load(msc.rows_path(tmp_path, "overconf")) as z:
        assert any(f.startswith("overconf/ce_es/ts/seed1/t0_conf") for f in z.files)
    # resumable: the finished run is not rerun, the next job runs
    assert msc.run_slice(spec, ["overconf"], tmp_path, tiny=True, limit=1) == 1
    rows = msc.read_table(msc.table_path(tmp_path))
    assert len(rows) == 4 and len({(r["method"], r["seed"]) for r in rows}) == 2
    # rows made at another commit: refused unless allowed
    rows = msc.read_table(msc.table_path(tmp_path))
    for r in rows:
        r["git_commit"] = "0" * 40
    msc.write_table(msc.table_path(tmp_path), rows)
    with pytest.raises(ValueError, match="refusing to mix commits"):
        msc.run_slice(spec, ["overconf"], tmp_path, tiny=True, limit=0)
    assert msc.run_slice(spec, ["overconf"], tmp_path, tiny=True, allow_mixed=True, limit=0) == 0
    # the table is a plain gzip CSV with a header row
    with gzip.open(msc.table_path(tmp_path), "rt") as f:
        assert f.readline().startswith("regime,method,seed,post,")

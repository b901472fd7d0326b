"""The committed full-factorial report of protocol C (benchmarks/results/method_study_c.md / .json) is recomputed from
its compact table alone (method_study_c/full_runs.csv.gz): every claim's per-regime verdict, interval and Holm
p-values, and the overall verdicts, by the study's code; and each claim's paired mean differences and replicate
means independently, reading the gzip CSV with the csv module only."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections import defaultdict

import pytest

from benchmarks.common import RESULTS_DIR
from benchmarks.studies import method_study_c_full as full
from benchmarks.studies import method_study_c_slice as msc

REPORT_JSON = RESULTS_DIR / "method_study_c.json"
TABLE = RESULTS_DIR / "method_study_c" / "full_runs.csv.gz"
pytestmark = pytest.mark.skipif(not (REPORT_JSON.is_file() and TABLE.is_file()), reason="no committed full results")


def _published() -> dict:
    return json.loads(REPORT_JSON.read_text())


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), (sorted(a), sorted(b))
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == (pytest.approx(b, abs=1e-12, rel=1e-12) if isinstance(b, float) else b)


def test_every_claim_recomputed_from_the_table():
    pub = _published()
    assert pub["regimes"] == ["overconf", "noise20", "imbalance10", "mtl"] and all(pub["complete"].values())
    rec = json.loads(json.dumps(full.full_record(msc.load_spec(), msc.OUT, bootstrap=False), default=str))
    assert set(rec["claims"]) == set(pub["claims"])
    for name, claim in rec["claims"].items():
        assert claim["overall"] == pub["claims"][name]["overall"], name
        for regime, x in claim["per_regime"].items():
            p = pub["claims"][name]["per_regime"][regime]
            assert (x["verdict"], x["replicates"], x["seeds"]) == (p["verdict"], p["replicates"], p["seeds"])
            _same(x["metrics"], p["metrics"])
    _same(rec["means"], pub["means"])
    _same(rec["winners_curse"], pub["winners_curse"])


def test_paired_differences_from_the_raw_csv_independently():
    """Each claim's mean difference (method cell minus reference cell, paired by replicate and seed, the cells'
    latest tuning round, each cell's own post-processing) and its replicate means, from the CSV alone."""
    spec = msc.load_spec()
    pub = _published()
    with gzip.open(TABLE, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["stage"] == "eval" and r["status"] == "completed"]
    latest: dict[tuple, int] = defaultdict(int)
    for r in rows:
        key = (r["regime"], r["objective"], r["cell_post"])
        latest[key] = max(latest[key], int(r["round"]))
    cell: dict[tuple, dict] = {}
    for r in rows:
        if r["post"] == r["cell_post"] and int(r["round"]) == latest[(r["regime"], r["objective"], r["cell_post"])]:
            cell[(r["regime"], r["objective"], r["post"], int(r["replicate"]), int(r["seed"]))] = r
    checked = 0
    for name, claim in spec["claims"].items():
        (ma, pa), (mb, pb) = claim["method"].split("/"), claim["reference"].split("/")
        for regime, p in pub["claims"][name]["per_regime"].items():
            for metric, m in p["metrics"].items():
                per_rep = []
                for k in p["replicates"]:
                    d = [
                        float(cell[(regime, ma, pa, k, s)][f"test_{metric}"])
                        - float(cell[(regime, mb, pb, k, s)][f"test_{metric}"])
                        for s in p["seeds"]
                    ]
                    per_rep.append(sum(d) / len(d))
                assert m["n_replicates"] == len(per_rep) and m["n_seeds"] == len(p["seeds"])
                assert m["replicate_means"] == pytest.approx(per_rep, abs=1e-12)
                assert m["mean"] == pytest.approx(sum(per_rep) / len(per_rep), abs=1e-12)
                assert m["ci95"][0] < m["mean"] < m["ci95"][1]
                checked += 1
    assert checked == 5 * 4 * 4  # claims x regimes x metrics

"""The committed slice report (benchmarks/results/method_study_c_slice.md / .json) is recomputed from the compact
files alone (slice_runs.csv.gz, slice_rows_<regime>.npz): every claim's paired differences, intervals, Holm
p-values and verdicts, the means, and one per-seed bootstrap half-width."""

from __future__ import annotations

import csv
import gzip
import json
import math

import numpy as np
import pytest

from benchmarks.common import RESULTS_DIR
from benchmarks.studies import method_study_c_slice as msc

REPORT_JSON = RESULTS_DIR / "method_study_c_slice.json"
REPORT_MD = RESULTS_DIR / "method_study_c_slice.md"
pytestmark = pytest.mark.skipif(
    not (REPORT_JSON.is_file() and msc.table_path(msc.OUT).is_file()), reason="no committed slice results"
)


def _close(a, b, tol=1e-12):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _close(a[k], b[k], tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, tol)
    elif isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            assert a is b
        elif math.isnan(a):
            assert math.isnan(b)
        else:
            assert a == pytest.approx(b, abs=tol, rel=tol)
    else:
        assert a == b


def _published() -> dict:
    return json.loads(REPORT_JSON.read_text())


def test_claims_means_and_reproduction_recomputed_from_the_table():
    spec = msc.load_spec()
    pub = _published()
    rec = json.loads(json.dumps(msc.slice_record(spec, msc.OUT, bootstrap=False), default=str))
    for name, claim in rec["claims"].items():
        assert claim["overall"] == pub["claims"][name]["overall"]
        for r, x in claim["per_regime"].items():
            p = pub["claims"][name]["per_regime"][r]
            assert x["verdict"] == p["verdict"] and x["seeds"] == p["seeds"]
            _close(x["metrics"], p["metrics"])
    _close(rec["means"], pub["means"])
    _close(rec["reproduction"], pub["reproduction"])


def test_paired_differences_from_the_raw_csv_independently():
    """Read the gzip CSV with the csv module only and recompute each claim's mean difference and 95 % t interval."""
    from scipy import stats

    spec = msc.load_spec()
    pub = _published()
    with gzip.open(msc.table_path(msc.OUT), "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "completed"]
    cell = {(r["regime"], r["method"], r["post"], int(r["seed"])): r for r in rows}
    for name, claim in spec["slice"]["claims"].items():
        (ma, pa), (mb, pb) = claim["method"].split("/"), claim["reference"].split("/")
        for r, p in pub["claims"][name]["per_regime"].items():
            seeds = [s for s in spec["slice"]["seeds"] if (r, ma, pa, s) in cell and (r, mb, pb, s) in cell]
            for k in msc.REPORT_METRICS:
                d = np.array(
                    [float(cell[(r, ma, pa, s)][f"test_{k}"]) - float(cell[(r, mb, pb, s)][f"test_{k}"]) for s in seeds]
                )
                m = p["metrics"][k]
                assert m["n"] == len(d)
                assert m["mean"] == pytest.approx(float(d.mean()), abs=1e-12)
                if len(d) > 1:
                    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
                    assert m["ci95"][0] == pytest.approx(d.mean() - half, abs=1e-12)
                    assert m["ci95"][1] == pytest.approx(d.mean() + half, abs=1e-12)


def test_markdown_quotes_the_json():
    pub = _published()
    text = REPORT_MD.read_text()
    for claim in pub["claims"].values():
        assert f"**Overall: {claim['overall']}**" in text
        for x in claim["per_regime"].values():
            for k in msc.REPORT_METRICS:
                m = x["metrics"][k]
                assert f"{msc._pt(m['mean'], msc._scale(k))} [{msc._pt(m['ci95'][0], msc._scale(k))}," in text


def test_one_per_seed_bootstrap_half_width_recomputed_from_the_arrays():
    spec = msc.load_spec()
    pub = _published()
    claim = spec["slice"]["claims"]["s1_no_posthoc"]
    regime = "mtl" if "mtl" in pub["claims"]["s1_no_posthoc"]["per_regime"] else next(iter(pub["regimes"]))
    published = pub["claims"]["s1_no_posthoc"]["per_regime"][regime].get("ece_bootstrap_half_width_median")
    if published is None or (isinstance(published, float) and math.isnan(published)):
        pytest.skip("the report was built without the bootstrap")
    a, b = tuple(claim["method"].split("/")), tuple(claim["reference"].split("/"))
    seeds = [s for s in msc.array_seeds(spec)]
    with np.load(msc.rows_path(msc.OUT, regime)) as z:
        hw = msc.per_seed_half_widths(z, regime, a, b, seeds, spec["slice"]["bootstrap_resamples"])
    assert float(np.median(hw)) == pytest.approx(published, abs=1e-12)

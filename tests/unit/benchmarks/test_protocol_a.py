"""What protocol C takes from protocols B and A (benchmarks/studies/protocol_a.py, issue #45 item 5: their studies left
the tree, these functions stayed): A's tuned parameters read from its committed compact form are the ones its published
result records, a run's configuration is the regime's backbone with the method's options and parameters, and the seeded
TPE search replays, fails and repeats as protocol C's resumption needs."""

from __future__ import annotations

import gzip
import json
import math

from benchmarks.common import PROTOCOLS, RESULTS_DIR, read_json
from benchmarks.studies import protocol_a as pa


def test_a_s_chosen_parameters_are_its_published_ones(tmp_path):
    spec = pa.load_spec(PROTOCOLS / "method_study_v2a.yaml")
    chosen = json.loads(gzip.decompress((RESULTS_DIR / "method_study_v2a_compact" / "chosen.json.gz").read_bytes()))
    for rel, rec in chosen.items():  # only the tuning choices of A's compact form, as a raw folder
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(rec))
    published = read_json(RESULTS_DIR / "method_study_v2a.json")["tuning"]
    assert published
    for cell, rec in published.items():
        regime, method = cell.split("/")
        assert pa.chosen_params(spec, regime, method, tmp_path) == rec["params"], cell
    b = pa.load_spec()  # protocol B: plain CE and TS have nothing to tune
    untuned = [m for m, v in b["methods"].items() if "tune" not in v]
    assert untuned and all(pa.chosen_params(b, "overconf", m, tmp_path) == {} for m in untuned)
    tuned = next(m for m, v in spec["methods"].items() if "tune" in v)
    assert pa.chosen_params(spec, "overconf", tuned, tmp_path / "none") is None  # not tuned yet


def test_a_run_is_the_regime_s_backbone_with_the_method_s_options():
    spec = pa.load_spec(PROTOCOLS / "method_study_v2a.yaml")
    regime, method = "overconf", next(m for m, v in spec["methods"].items() if v["train"])
    cfg = pa.run_config(spec, regime, method, 7, {"lr": 0.5})
    assert cfg["seed"] == 7 and cfg["device"] == "cpu" and cfg["num_threads"] == int(spec.get("threads", 1))
    want = {**spec["regimes"][regime]["run"].get("train", {}), **spec["methods"][method]["train"], "lr": 0.5}
    assert cfg["train"] == want and cfg["data"] == spec["regimes"][regime]["run"]["data"]
    assert spec["regimes"][regime]["run"]["train"] != cfg["train"]  # the spec itself is left as it was


def test_the_tpe_search_is_seeded_replays_and_records_failures():
    ranges = {"lr": (1e-4, 1e-1)}

    def value(i, p):
        return math.inf if i == 2 else (math.log10(p["lr"]) + 2) ** 2

    a = pa.tpe_search(ranges, 6, 3, 11, value)
    assert a == pa.tpe_search(ranges, 6, 3, 11, value)  # same seed, same history: same draws
    assert [t["trial"] for t in a] == list(range(6)) and a[2]["value"] == math.inf
    fixed = {"lr": 0.001}
    b = pa.tpe_search(ranges, 3, 3, 11, value, replay=lambda i: fixed if i == 1 else None)
    assert b[1]["params"] == fixed and b[1]["value"] == value(1, fixed)

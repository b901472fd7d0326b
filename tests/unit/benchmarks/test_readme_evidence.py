"""The README's first screen quotes protocol A's tuned backbone learning rates: they come from the result file."""

from __future__ import annotations

import re

from benchmarks.common import read_json
from benchmarks.readme_results import HOLDERS
from tests.paths import ROOT


def _range(tuning: dict, method: str) -> str:
    lrs = [v["params"]["lr"] for k, v in tuning.items() if k.split("/")[1] == method]

    def fmt(x: float) -> str:
        return f"{x:.4f}" if x < 0.001 else f"{x:.3f}"

    return f"{fmt(min(lrs))}-{fmt(max(lrs))}"


def test_backbone_lr_sentence_matches_protocol_a() -> None:
    tuning = read_json(ROOT / "benchmarks" / "results" / "method_study_v2a.json")["tuning"]  # or .json.gz
    want = (
        f"{_range(tuning, 'onego_ts')} against plain CE's {_range(tuning, 'ce')} and CE with early stopping's "
        f"{_range(tuning, 'ce_es')}"
    )
    block = re.search(
        r"<!-- generated:backbone_lr -->(.*?)<!-- /generated:backbone_lr -->",
        (ROOT / HOLDERS["backbone_lr"]).read_text(),
    )
    assert block is not None
    assert block.group(1) == want

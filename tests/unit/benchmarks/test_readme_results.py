"""The docs' result statements come from the result files (issue #21 item 7): every generated block, in whichever
file readme_results.HOLDERS says holds it (README.md, docs/*.md)."""

import json
import math

import pytest

from benchmarks import readme_results
from benchmarks.common import ROOT


def test_readme_result_blocks_match_the_result_files():
    for path, (old, new) in readme_results.render_all(ROOT).items():
        assert new == old, f"{path}: run python -m benchmarks.readme_results"


def test_every_block_is_held_once_and_only_where_holders_says():
    assert set(readme_results.HOLDERS) == set(readme_results.BLOCKS)
    docs = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))]
    for name in readme_results.BLOCKS:
        holding = [d for d in docs if f"<!-- generated:{name} -->" in (ROOT / d).read_text()]
        assert holding == [readme_results.HOLDERS[name]], (name, holding)


def test_inline_blocks_stay_inline():
    text = "a <!-- generated:x -->old<!-- /generated:x --> b\n"
    assert readme_results.render(text, {"x": lambda: "new"}) == "a <!-- generated:x -->new<!-- /generated:x --> b\n"


def _heldout(ratio_lo: float) -> dict:
    row = {
        "ece_ratio_to_old": [0.8, ratio_lo, 0.95],
        "ece_regret": [0.004, 0.001, 0.007],
        "acc_gap": [0.006, 0.002, 0.01],
        "sweeps": 12,
    }
    # the protocol's decision per rule, as the study recorded it beside its summary
    criteria = {"helps": ["mnist1d"], "hurts": [], "gaps": {"mnist1d": 0.006}, "meets": True}
    name = "noise_aware (default: Bonferroni, half-ECE dominance)"
    return {
        "meta": {"first_seed": 2000, "seeds": 12, "criteria": {name: criteria}},
        "summary": {"mnist1d": {"rules": {name: row}}},
    }


def test_a_changed_number_in_a_result_file_changes_the_block(tmp_path):
    (tmp_path / "selection_heldout.json").write_text(json.dumps(_heldout(0.70)))
    a = readme_results.selection_heldout(tmp_path)
    assert "0.80x the old rule's [0.70, 0.95] (helps)" in a and "regret 0.40 pt [0.10, 0.70]" in a
    (tmp_path / "selection_heldout.json").write_text(json.dumps(_heldout(0.71)))
    b = readme_results.selection_heldout(tmp_path)
    assert a != b
    # the README test above would then fail: a block written from `a` does not render to itself under `b`
    text = "x\n<!-- generated:selection_heldout -->\n" + a + "\n<!-- /generated:selection_heldout -->\n"
    assert readme_results.render(text, {"selection_heldout": lambda: b}) != text


def test_verdict_words_follow_the_interval():
    hurts = _heldout(1.05)
    hurts["summary"]["mnist1d"]["rules"]["noise_aware (default: Bonferroni, half-ECE dominance)"][
        "ece_ratio_to_old"
    ] = [
        1.2,
        1.05,
        1.4,
    ]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "selection_heldout.json").write_text(json.dumps(hurts))
        assert "(hurts)" in readme_results.selection_heldout(Path(d))


def _v3(gap: float, met: bool) -> dict:
    rules = {
        name: {"acc_gap": [gap, gap - 0.001, gap + 0.001], "ece_ratio": {"ratio": 0.6, "lo": 0.5, "hi": 0.7}}
        for name in ("margin 0.5", "margin 1", "margin 2")
    }
    return {
        "meta": {"seeds": list(range(2200, 2212))},
        "summary": {"mnist1d": {"seeds": list(range(12)), "rules": rules}},
        "verdict": {
            "margins": {n: {"qualifies": met} for n in rules},
            "default": {"margin_pt": 0.5 if met else 1.0, "met": met},
        },
    }


def test_selection_v3_block_follows_its_file(tmp_path):
    assert "no result file yet" in readme_results.selection_v3(tmp_path)
    (tmp_path / "selection_v3.json").write_text(json.dumps(_v3(0.004, True)))
    a = readme_results.selection_v3(tmp_path)
    assert "gap 0.40 [0.30, 0.50] pt, ECE 0.60x [0.50, 0.70]" in a and "the default margin is **0.5 pt**" in a
    (tmp_path / "selection_v3.json").write_text(json.dumps(_v3(0.004, False)))
    b = readme_results.selection_v3(tmp_path)
    assert "**no margin qualifies**" in b and "provisional 1 pt stays" in b


def test_the_slice_block_reads_its_file(tmp_path):
    assert "No slice result yet" in readme_results.method_study_c_slice(tmp_path)
    real = readme_results.method_study_c_slice()
    assert real.count("seeds):") >= 5 and "matches CE_es + TS" in real


# Protocols B's and A's blocks give each claim row's paired t interval (readme_results.paired_ci, moved from the
# retired method_study.py with its tests). With n = 3 seeds the t distribution has 2 degrees of freedom, whose CDF and
# quantile have closed forms: F(t) = 1/2 + t / (2 sqrt(2 + t^2)) and F^-1(p) = (2p - 1) / sqrt(2 p (1 - p)).
def cdf2(t: float) -> float:
    return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))


def q2(p: float) -> float:
    return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))


def test_closed_forms_are_the_t_distribution_with_2_df():
    assert q2(0.975) == pytest.approx(4.302652729749464, abs=1e-9)  # the table value
    assert cdf2(q2(0.95)) == pytest.approx(0.95, abs=1e-12)


def test_paired_ci_hand_computed():
    # d = [1, 2, 6]: mean 3, sd sqrt(((-2)^2 + (-1)^2 + 3^2) / 2) = sqrt(7), se = sqrt(7 / 3)
    c = readme_results.paired_ci([1.0, 2.0, 6.0])
    se = math.sqrt(7.0 / 3.0)
    assert c["n"] == 3 and c["mean"] == pytest.approx(3.0) and c["sd"] == pytest.approx(math.sqrt(7.0))
    assert c["lo"] == pytest.approx(3.0 - 4.302652729749464 * se, abs=1e-9)  # -3.572411
    assert c["hi"] == pytest.approx(9.572411, abs=1e-6)
    # two-sided t-test of mean 0: p = 2 (1 - F(3 / se))
    assert c["p"] == pytest.approx(2.0 * (1.0 - cdf2(3.0 / se)), abs=1e-12)
    # paired differences of two methods are what goes in: (a - b) per seed
    a, b = [0.10, 0.20, 0.65], [0.09, 0.18, 0.59]
    assert readme_results.paired_ci([x - y for x, y in zip(a, b)])["mean"] == pytest.approx(0.03)

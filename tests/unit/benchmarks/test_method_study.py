"""The method study's statistics on hand-computed cases (benchmarks/studies/method_study.py).

With n = 3 seeds the t distribution has 2 degrees of freedom, whose CDF and quantile have
closed forms: F(t) = 1/2 + t / (2 sqrt(2 + t^2)) and F^-1(p) = (2p - 1) / sqrt(2 p (1 - p)).
"""

from __future__ import annotations

import math

import pytest

from benchmarks.studies.method_study import matches_verdict, overall_verdict, paired_ci, tost


def cdf2(t: float) -> float:
    return 0.5 + t / (2.0 * math.sqrt(2.0 + t * t))


def q2(p: float) -> float:
    return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))


def test_closed_forms_are_the_t_distribution_with_2_df():
    assert q2(0.975) == pytest.approx(4.302652729749464, abs=1e-9)  # the table value
    assert cdf2(q2(0.95)) == pytest.approx(0.95, abs=1e-12)


def test_paired_ci_hand_computed():
    # d = [1, 2, 6]: mean 3, sd sqrt(((-2)^2 + (-1)^2 + 3^2) / 2) = sqrt(7), se = sqrt(7 / 3)
    c = paired_ci([1.0, 2.0, 6.0])
    se = math.sqrt(7.0 / 3.0)
    assert c["n"] == 3 and c["mean"] == pytest.approx(3.0) and c["sd"] == pytest.approx(math.sqrt(7.0))
    assert c["lo"] == pytest.approx(3.0 - 4.302652729749464 * se, abs=1e-9)  # -3.572411
    assert c["hi"] == pytest.approx(9.572411, abs=1e-6)
    # two-sided t-test of mean 0: p = 2 (1 - F(3 / se))
    assert c["p"] == pytest.approx(2.0 * (1.0 - cdf2(3.0 / se)), abs=1e-12)
    # paired differences of two methods are what goes in: (a - b) per seed
    a, b = [0.10, 0.20, 0.65], [0.09, 0.18, 0.59]
    assert paired_ci([x - y for x, y in zip(a, b)])["mean"] == pytest.approx(0.03)


def test_tost_hand_computed_not_equivalent():
    # d = [1, 2, 6], margin 4: t_upper = (3 - 4) / se = -0.654654, t_lower = (3 + 4) / se = 4.582576
    r = tost([1.0, 2.0, 6.0], margin=4.0, alpha=0.05)
    assert r["p_upper"] == pytest.approx(0.289958, abs=1e-6)  # F(-0.654654) = 0.5 - 0.654654 / (2 sqrt(2.428571))
    assert r["p_lower"] == pytest.approx(0.022233, abs=1e-6)  # 1 - F(4.582576) = 0.5 - 4.582576 / (2 sqrt(23))
    assert r["p"] == pytest.approx(0.289958, abs=1e-6) and not r["equivalent"]
    se = math.sqrt(7.0 / 3.0)
    assert r["lo"] == pytest.approx(3.0 - q2(0.95) * se, abs=1e-9)
    assert r["hi"] == pytest.approx(3.0 + q2(0.95) * se, abs=1e-9)


def test_tost_hand_computed_equivalent():
    # d = [0.1, 0.2, 0.3], margin 1: mean 0.2, sd 0.1, se 0.1 / sqrt(3)
    r = tost([0.1, 0.2, 0.3], margin=1.0)
    se = 0.1 / math.sqrt(3.0)
    assert r["p_upper"] == pytest.approx(cdf2(-0.8 / se), abs=1e-12) == pytest.approx(0.002584, abs=1e-6)
    assert r["p_lower"] == pytest.approx(1.0 - cdf2(1.2 / se), abs=1e-12) == pytest.approx(0.001154, abs=1e-6)
    assert r["equivalent"] and r["p"] == pytest.approx(0.002584, abs=1e-6)
    # the same test is the 90 % interval inside the margins
    assert -1.0 < r["lo"] and r["hi"] < 1.0


def test_tost_degenerate_cases():
    assert tost([0.2, 0.2, 0.2], margin=0.5)["equivalent"]
    assert not tost([0.7, 0.7], margin=0.5)["equivalent"]
    assert not tost([0.1], margin=0.5)["equivalent"]
    with pytest.raises(ValueError):
        tost([0.1, 0.2], margin=0.0)


def test_matches_verdicts():
    m = 0.005
    # tiny ECE differences, accuracy unchanged: established
    v = matches_verdict([0.001, -0.001, 0.0005, -0.0005, 0.0], [0.001, 0.0, -0.001, 0.002, 0.0], m, m)
    assert v["verdict"] == "established", v
    # ECE clearly worse by more than the margin: refuted
    v = matches_verdict([0.020, 0.021, 0.019, 0.022], [0.0, 0.0, 0.001, -0.001], m, m)
    assert v["verdict"] == "refuted" and "ECE worse" in v["reason"]
    # ECE equivalent but accuracy lower by more than its margin: refuted
    v = matches_verdict([0.0, 0.001, -0.001, 0.0], [-0.03, -0.031, -0.029, -0.03], m, m)
    assert v["verdict"] == "refuted" and "accuracy" in v["reason"]
    # noisy: neither
    v = matches_verdict([0.01, -0.012, 0.015, -0.009], [0.01, -0.01, 0.0, 0.005], m, m)
    assert v["verdict"] == "not settled"
    # ECE better by more than the margin: "matches" holds a fortiori
    v = matches_verdict([-0.02, -0.021, -0.019], [0.0, 0.001, 0.0], m, m)
    assert v["verdict"] == "established" and "better" in v["reason"] and not v["tost"]["equivalent"]
    # ECE better, possibly by more than the margin (TOST fails on the lower side only): established too
    v = matches_verdict([-0.002, -0.012, -0.004, -0.010], [0.0, 0.001, 0.0, -0.001], m, m)
    assert v["tost"]["lo"] < -m < v["tost"]["hi"] < m and not v["tost"]["equivalent"]
    assert v["verdict"] == "established"
    # ECE non-inferior but accuracy not shown non-inferior: not settled
    v = matches_verdict([0.001, -0.001, 0.0005, -0.0005], [0.01, -0.02, 0.015, -0.012], m, m)
    assert v["verdict"] == "not settled" and "accuracy" in v["reason"]


def test_overall_verdict():
    assert overall_verdict(["established", "established"]) == "established"
    assert overall_verdict(["established", "not settled"]) == "not settled"
    assert overall_verdict(["established", "refuted"]) == "refuted"
    assert overall_verdict([]) == "not settled"


@pytest.mark.parametrize("name", ["cpu", "cifar10_resnet18", "cifar100_wrn28_10"])
def test_study_configs_generate_valid_sweep_configs(name, tmp_path):
    """Every (regime, method) of every study config becomes a sweep config the service accepts."""
    from benchmarks.studies.method_study import CONFIG_DIR, load_spec, sweep_config
    from sweeps.config import SweepConfig

    spec = load_spec(CONFIG_DIR / f"{name}.yaml")
    (tmp_path / "service").mkdir()
    assert len(spec["evaluation"]["seeds"]) >= 10
    n = 0
    for regime, reg in spec["regimes"].items():
        for method in reg["methods"]:
            cfg = SweepConfig.model_validate(sweep_config(spec, regime, method, tmp_path))
            assert cfg.search.num_samples == reg.get("trials", spec["tuning"]["trials"])  # the same for every method
            assert cfg.search.metric == cfg.selection.metric == "val_nll" and cfg.selection.rule == "min_metric"
            assert {"train.lr", "train.weight_decay"} <= set(cfg.search.params)
            n += 1
    assert n >= 7
    for claim in spec["claims"].values():
        assert set(claim["regimes"]) <= set(spec["regimes"])

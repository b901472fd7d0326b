"""calib_core.conformal.served: the quantiles a deployed model stores and its sets from them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from calib_core.conformal import calibrate, prediction_sets
from calib_core.conformal.served import served_quantile, served_record, served_sets, stored_alphas, with_temperature


def _problem(n: int = 300, k: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(n, k, generator=g, dtype=torch.float64), 1)
    return p, torch.multinomial(p, 1, generator=g).squeeze(1)


def test_the_record_is_json_and_holds_the_finite_sample_quantiles() -> None:
    p, y = _problem()
    record = json.loads(json.dumps(served_record(p, y, [0.2, 0.1, 0.001, 0.1])))  # plain JSON, no Infinity
    assert record["convention"] == "finite_sample" and record["calibration_rows"] == 300
    assert list(record["quantiles"]) == ["lac", "aps", "raps"]
    assert stored_alphas(record) == [0.001, 0.1, 0.2]
    for method, per in record["quantiles"].items():
        assert per["0.1"] == calibrate(method, p, y, 0.1) and per["0.2"] == calibrate(method, p, y, 0.2)
        assert per["0.001"] is None  # 300 rows: no finite quantile at alpha 0.001
        assert served_quantile(record, method, 0.001) == math.inf
    q = record["quantiles"]["raps"]["0.1"]
    assert torch.equal(served_sets(record, p, alpha=0.1, method="raps"), prediction_sets("raps", p, q))
    assert torch.equal(served_sets(record, p, alpha=0.1), prediction_sets("lac", p, record["quantiles"]["lac"]["0.1"]))
    assert bool(served_sets(record, p, alpha=0.001, method="aps").all())  # every label


def test_refusals_are_one_line_naming_what_is_stored() -> None:
    p, y = _problem()
    record = served_record(p, y, [0.05, 0.1])
    for method, alpha, says in (
        ("lac", 0.07, "params alpha: 0.07 has no stored quantile; stored: 0.05, 0.1"),
        ("lac", "0.1", "params alpha: '0.1' is not a number; stored: 0.05, 0.1"),
        ("thr", 0.1, "params method: 'thr' has no stored quantiles; stored: lac, aps, raps"),
        ("aps_randomized", 0.1, "params method: randomised APS is not served"),
    ):
        with pytest.raises(ValueError) as e:
            served_quantile(record, method, alpha)
        assert str(e.value).startswith(says) and "\n" not in str(e.value)
    assert served_quantile(record, "lac", 0.1 + 1e-12) == record["quantiles"]["lac"]["0.1"]
    with pytest.raises(ValueError, match="is not one this code reads"):
        served_quantile({**record, "convention": "mapie"}, "lac", 0.1)
    with pytest.raises(ValueError, match="is not served"):
        served_record(p, y, [0.1], methods=["aps_randomized"])


def test_with_temperature_is_softmax_of_the_divided_logits() -> None:
    g = torch.Generator().manual_seed(1)
    z = 3 * torch.randn(50, 4, generator=g, dtype=torch.float64)
    got = with_temperature(torch.softmax(z, 1), 1.7)
    assert torch.allclose(got, torch.softmax(z / 1.7, 1), atol=1e-12)
    with pytest.raises(ValueError, match="temperature"):
        with_temperature(torch.softmax(z, 1), 0.0)

"""calib_core.evaluation: shift rows equal the metrics on corrupt_split; missing labels are
skipped; OOD metrics come from ood_report; multi-task outputs are scored per task and averaged."""

from __future__ import annotations

import pytest
import torch

from calib_core.data import DataSplits, Split
from calib_core.evaluation import mean_shift_ece, ood_metrics, shift_metrics
from calib_core.metrics import accuracy, ece
from calib_core.ood import ood_report
from calib_core.shift import corrupt_split, list_corruptions

L, K = 40, 3
W = torch.randn(L, K, generator=torch.Generator().manual_seed(0))


def _proba(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ W, dim=1)


def _mt_proba(x: torch.Tensor) -> list[torch.Tensor]:
    return [_proba(x), torch.softmax((x @ W)[:, :2] * 0.5, dim=1)]


def _data(multi: bool = False) -> DataSplits:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(97, L, generator=g)
    y = (x @ W).argmax(1)
    y = torch.where(torch.rand(97, generator=g) < 0.3, torch.randint(0, K, (97,), generator=g), y)
    tasks = None
    if multi:
        y2 = (x[:, 0] > 0).long()
        y2[::3] = -1
        y = torch.stack([y, y2], 1)
        tasks = (("main", K), ("side", 2))
    s = Split(x, y)
    return DataSplits(train=s, val=s, test=s, num_classes=K, input_shape=(L,), name="sig", tasks=tasks)


def test_shift_rows_match_metrics_on_the_corrupted_split():
    d = _data()
    rows = shift_metrics(_proba, d, seed=3)
    names = list_corruptions("signal")
    assert [(r["corruption"], r["severity"]) for r in rows] == [(n, s) for n in names for s in range(1, 6)]
    r = rows[7]
    split = corrupt_split(d.test, r["corruption"], r["severity"], 3)
    p = _proba(split.x)
    assert r["accuracy"] == pytest.approx(float(accuracy(p, split.y)))
    assert r["ece"] == pytest.approx(float(ece(p, split.y)))
    assert mean_shift_ece(rows) == pytest.approx(sum(r["ece"] for r in rows) / len(rows))


def test_multitask_shift_rows_skip_missing_labels_and_average_tasks():
    d = _data(multi=True)
    rows = shift_metrics(_mt_proba, d, seed=3, names=[list_corruptions("signal")[0]], severities=[2])
    (r,) = rows
    split = corrupt_split(d.test, r["corruption"], 2, 3)
    p = _mt_proba(split.x)[1]
    keep = split.y[:, 1] >= 0
    assert r["side_ece"] == pytest.approx(float(ece(p[keep], split.y[keep, 1])))
    assert r["ece"] == pytest.approx((r["main_ece"] + r["side_ece"]) / 2)


def test_ood_metrics_use_the_test_split():
    d = _data()
    x_out = torch.randn(50, L, generator=torch.Generator().manual_seed(5)) * 0.05  # near-uniform predictions
    got = ood_metrics(_proba, d, x_out)
    assert got == ood_report(_proba(d.test.x), _proba(x_out))
    assert got["msp_auroc"] > 0.9
    mt = ood_metrics(_mt_proba, _data(multi=True), x_out)
    assert mt["msp_auroc"] == pytest.approx((mt["main_msp_auroc"] + mt["side_msp_auroc"]) / 2)


def test_make_ood_inputs_shapes_determinism_and_kinds():
    import pytest as _pytest

    from calib_core.evaluation import make_ood_inputs

    x = torch.arange(5 * 40, dtype=torch.float32).reshape(5, 40)
    a = make_ood_inputs(x, "permuted", seed=3)
    assert a.shape == x.shape and torch.equal(a, make_ood_inputs(x, "permuted", seed=3))
    assert not torch.equal(a, make_ood_inputs(x, "permuted", seed=4))
    # each row keeps exactly its own values, in another order
    assert torch.equal(a.sort(dim=1).values, x.sort(dim=1).values) and not torch.equal(a, x)
    g = make_ood_inputs(torch.zeros(2000, 1, 8, 8), "gaussian_noise", seed=0)
    assert g.shape == (2000, 1, 8, 8) and abs(float(g.mean())) < 0.02 and abs(float(g.std()) - 1) < 0.02
    with _pytest.raises(ValueError, match="allowed"):
        make_ood_inputs(x, "svhn", seed=0)

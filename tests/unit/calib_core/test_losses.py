"""Losses: label smoothing equals torch's, focal with fixed gamma and the FLSD-53 schedule."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from calib_core.losses import cross_entropy, flsd53_gamma, focal_loss, label_smoothing_loss, make_loss

K = 4


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.1, 0.3])
def test_label_smoothing_matches_torch(eps):
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(23, K, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (23,), generator=g)
    torch.testing.assert_close(label_smoothing_loss(z, y, eps), F.cross_entropy(z, y, label_smoothing=eps))


def test_flsd53_gamma_schedule_on_hand_values():
    p = torch.tensor([0.0, 0.1, 0.1999, 0.2, 0.5, 1.0])
    assert flsd53_gamma(p).tolist() == [5.0, 5.0, 5.0, 3.0, 3.0, 3.0]


def test_flsd53_focal_loss_hand_computed():
    # Two samples, 3 classes. Sample 0: p_true = 0.1 (gamma 5); sample 1: p_true = 0.7 (gamma 3).
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.1, 0.7]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    z = probs.log()
    want = -((0.9**5) * math.log(0.1) + (0.3**3) * math.log(0.7)) / 2
    assert float(focal_loss(z, y)) == pytest.approx(want, rel=1e-10)
    # fixed gamma
    want2 = -((0.9**2) * math.log(0.1) + (0.3**2) * math.log(0.7)) / 2
    assert float(focal_loss(z, y, 2.0)) == pytest.approx(want2, rel=1e-10)


def test_focal_gamma_zero_is_cross_entropy_and_gradients_are_finite():
    g = torch.Generator().manual_seed(1)
    z = (5 * torch.randn(17, K, generator=g)).requires_grad_()
    y = torch.randint(0, K, (17,), generator=g)
    torch.testing.assert_close(focal_loss(z, y, 0.0), cross_entropy(z, y))
    focal_loss(z, y).backward()
    assert torch.isfinite(z.grad).all()


def test_make_loss_dispatch():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(9, K, generator=g)
    y = torch.randint(0, K, (9,), generator=g)
    torch.testing.assert_close(make_loss("ce")(z, y), F.cross_entropy(z, y))
    torch.testing.assert_close(
        make_loss("label_smoothing", label_smoothing=0.2)(z, y), F.cross_entropy(z, y, label_smoothing=0.2)
    )
    torch.testing.assert_close(make_loss("focal", focal_gamma=1.0)(z, y), focal_loss(z, y, 1.0))
    torch.testing.assert_close(make_loss("focal")(z, y), focal_loss(z, y))

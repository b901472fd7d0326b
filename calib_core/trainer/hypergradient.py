"""The unrolled (DARTS-style) backbone loss: the backbone is the leader of the Stackelberg
game and anticipates the calibrator's next step.

    phi' = phi - eta_c * grad_phi L_cal(theta, phi)        (create_graph: phi' depends on theta)
    L_unrolled(theta) = L_backbone(theta, phi')

Differentiating L_unrolled w.r.t. theta gives dL/dtheta + (dphi'/dtheta)^T dL/dphi', exactly,
through autograd (second derivatives of the calibrator's loss: cheap for temperature, vector,
matrix and Dirichlet calibrators). The look-ahead is one plain gradient step of size eta_c,
whatever optimizer the calibrator uses for its real steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from calib_core.calibrators import Calibrator


def lookahead_params(calibrator: Calibrator, cal_inputs: Tensor, cal_labels: Tensor, eta: float) -> dict[str, Tensor]:
    """phi' = phi - eta * grad_phi [CE(calibrator(cal_inputs)) + reg], differentiable in the inputs."""
    names, params = zip(*[(n, p) for n, p in calibrator.named_parameters() if p.requires_grad])
    loss = F.cross_entropy(calibrator(cal_inputs), cal_labels) + calibrator.regularization()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    return {n: p - eta * g for n, p, g in zip(names, params, grads)}


def unrolled_loss(
    calibrator: Calibrator,
    cal_inputs: Tensor,
    cal_labels: Tensor,
    bb_inputs: Tensor,
    bb_labels: Tensor,
    eta: float,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
) -> Tensor:
    """The backbone's loss through the looked-ahead calibrator phi'. `cal_inputs` and
    `bb_inputs` must not be detached from the backbone, so the result carries both terms."""
    new = lookahead_params(calibrator, cal_inputs, cal_labels, eta)
    return loss_fn(functional_call(calibrator, new, (bb_inputs,)), bb_labels)

"""Temperature scaling on top of a trained model (calib_core.posthoc_on_top): the cross-fitted validation
predictions equal a by-hand out-of-fold fit (scipy's scalar minimiser, not LBFGS), the test predictions use the
temperature fitted on all validation rows, and the exported model carries the temperatures (issue #35 item 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from calib_core.posthoc_on_top import TemperatureOnTopModel, fit_temperature_on_top
from calib_core.trainer.calibrator_batches import kfold_indices


def _nll(z: np.ndarray, y: np.ndarray, t: float) -> float:
    return float(-log_softmax(z / t, axis=1)[np.arange(len(y)), y].mean())


def _fit_by_hand(z: np.ndarray, y: np.ndarray) -> float:
    res = minimize_scalar(
        lambda lt: _nll(z, y, float(np.exp(lt))), bounds=(-5, 5), method="bounded", options={"xatol": 1e-10}
    )
    return float(np.exp(res.x))


def _overconfident(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(0, 1, (n, k))
    z[np.arange(n), y] += 1.5
    return (4.0 * z).astype(np.float32), y  # logits 4x too sharp


def test_cross_fitted_validation_logits_match_a_by_hand_out_of_fold_fit() -> None:
    z, y = _overconfident(300, 5, 0)
    zt, _ = _overconfident(200, 5, 1)
    fit = fit_temperature_on_top([torch.from_numpy(z)], torch.from_numpy(y), [torch.from_numpy(zt)], folds=5, seed=3)
    want = np.empty_like(z, dtype=np.float64)
    for fold in kfold_indices(len(z), 5, 3):  # the same fold assignment, fitted by another optimiser
        f = fold.numpy()
        rest = np.setdiff1d(np.arange(len(z)), f)
        t = _fit_by_hand(z[rest].astype(np.float64), y[rest])
        want[f] = z[f] / t
    np.testing.assert_allclose(fit.val_logits[0].numpy(), want, rtol=2e-4, atol=2e-4)
    t_all = _fit_by_hand(z.astype(np.float64), y)
    assert fit.temperatures[0] == pytest.approx(t_all, rel=1e-4)
    assert fit.temperatures[0] > 2.0  # it undoes the sharpening
    np.testing.assert_allclose(fit.test_logits[0].numpy(), zt / t_all, rtol=2e-4, atol=2e-4)
    # out-of-fold predictions are a little worse than in-sample ones, never better on average here
    assert _nll(want, y, 1.0) >= _nll(z.astype(np.float64), y, t_all) - 1e-9


def test_multi_task_fits_one_temperature_per_task_on_its_labelled_rows() -> None:
    z0, y0 = _overconfident(240, 3, 5)
    z1, y1 = _overconfident(240, 2, 6)
    z1 = z1 / 8.0  # under-confident task: T < 1
    y1 = y1.copy()
    y1[::3] = -1  # a third of the rows unlabelled for task 1
    labels = torch.from_numpy(np.stack([y0, y1], axis=1))
    fit = fit_temperature_on_top(
        [torch.from_numpy(z0), torch.from_numpy(z1)], labels, [torch.from_numpy(z0), torch.from_numpy(z1)], seed=0
    )
    keep = y1 >= 0
    assert fit.temperatures[0] == pytest.approx(_fit_by_hand(z0.astype(np.float64), y0), rel=1e-4)
    assert fit.temperatures[1] == pytest.approx(_fit_by_hand(z1[keep].astype(np.float64), y1[keep]), rel=1e-4)
    assert fit.temperatures[1] < 1.0 < fit.temperatures[0]
    # unlabelled rows get the full fit's logits
    np.testing.assert_allclose(
        fit.val_logits[1][~torch.from_numpy(keep)].numpy(), z1[~keep] / fit.temperatures[1], rtol=1e-5
    )


def test_bad_inputs_are_named() -> None:
    z = torch.zeros(10, 3)
    with pytest.raises(ValueError, match="non-finite"):
        fit_temperature_on_top([z.clone().fill_(float("nan"))], torch.zeros(10, dtype=torch.long), [z])
    with pytest.raises(ValueError, match="one K"):
        fit_temperature_on_top([z], torch.zeros(10, dtype=torch.long), [torch.zeros(4, 2)])
    with pytest.raises(ValueError, match="temperatures"):
        TemperatureOnTopModel(torch.nn.Identity(), [0.0])


def test_the_exported_model_divides_by_the_temperature() -> None:
    from calib_core.export import (
        build_calibrated_model,
        load_calibrated_model,
        state_dict_for_export,
        with_temperature_on_top,
    )
    from calib_core.models import create_model
    from calib_core.trainer.result import CalibratedModel

    torch.manual_seed(0)
    inner = CalibratedModel(create_model("mlp", 4, (8,)), None).eval()
    spec = {
        "format": "calib_core.calibrated_classifier",
        "format_version": 1,
        "model": {"name": "mlp", "kwargs": {}},
        "input_shape": [8],
        "num_classes": 4,
        "tasks": None,
        "calibrator": None,
    }
    wrapped = TemperatureOnTopModel(inner, [2.5]).eval()
    spec_ts = with_temperature_on_top(spec, [2.5])
    assert spec_ts["format_version"] == 2
    rebuilt = load_calibrated_model(spec_ts, state_dict_for_export(wrapped))
    x = torch.randn(6, 8)
    with torch.no_grad():
        np.testing.assert_allclose(rebuilt(x).numpy(), (inner(x) / 2.5).numpy(), rtol=1e-6)
    assert isinstance(build_calibrated_model(spec), CalibratedModel)  # no temperatures: the plain model

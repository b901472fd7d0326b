"""Label noise and long-tailed profiles (calib_core/data/perturb.py) against their definitions."""

import pytest
import torch

from calib_core.config import DataConfig
from calib_core.data import load_dataset
from calib_core.data.perturb import class_keep_fractions


def test_keep_fractions_follow_the_exponential_profile():
    f = class_keep_fractions(10, 10.0)
    assert f[0] == 1.0 and f[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(f, f[1:]))
    assert f[3] == pytest.approx(10 ** (-3 / 9))
    with pytest.raises(ValueError, match="imbalance_ratio"):
        class_keep_fractions(10, 0.5)


def test_label_noise_flips_to_another_class_at_the_rate_asked():
    clean = load_dataset(DataConfig(name="mnist1d", num_samples=4000), seed=3)
    noisy = load_dataset(DataConfig(name="mnist1d", num_samples=4000, label_noise=0.3), seed=3)
    for a, b in ((clean.train, noisy.train), (clean.val, noisy.val), (clean.test, noisy.test)):
        assert torch.equal(a.x, b.x)
        rate = (a.y != b.y).float().mean().item()
        n = len(a.y)
        # binomial: 4 standard errors
        assert abs(rate - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    # every flipped label lands on each of the other classes about equally often
    flipped = noisy.train.y[clean.train.y != noisy.train.y] - clean.train.y[clean.train.y != noisy.train.y]
    shifts = torch.bincount(flipped % 10, minlength=10)
    assert shifts[0] == 0 and shifts[1:].min() > 0
    again = load_dataset(DataConfig(name="mnist1d", num_samples=4000, label_noise=0.3), seed=3)
    assert torch.equal(again.train.y, noisy.train.y)


def test_imbalance_keeps_each_class_in_proportion_in_every_split():
    data = load_dataset(DataConfig(name="mnist1d", num_samples=6000, imbalance_ratio=10.0), seed=1)
    base = load_dataset(DataConfig(name="mnist1d", num_samples=6000), seed=1)
    keep = class_keep_fractions(10, 10.0)
    for split, ref in ((data.train, base.train), (data.val, base.val), (data.test, base.test)):
        got = torch.bincount(split.y, minlength=10)
        full = torch.bincount(ref.y, minlength=10)
        for k in range(10):
            assert abs(int(got[k]) - round(keep[k] * int(full[k]))) <= 1


def test_perturbations_refuse_multitask_data_and_bad_values():
    with pytest.raises(ValueError, match="single-task"):
        load_dataset(DataConfig(name="mnist1d_mtl", num_samples=1000, label_noise=0.1), seed=0)
    with pytest.raises(ValueError, match="label_noise"):
        DataConfig(name="mnist1d", label_noise=0.95)

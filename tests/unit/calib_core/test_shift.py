"""Corruption suite (calib_core.shift): strength monotone in severity, seeded, shape/dtype/device kept."""

from __future__ import annotations

import colorsys
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from calib_core import shift as S
from calib_core.config import DataConfig
from calib_core.data import DataSplits, Split, channel_stats, load_dataset, standardize
from calib_core.data.mnist1d import generate_mnist1d

IMAGE = S.list_corruptions("image")
SIGNAL = S.list_corruptions("signal")
RANDOM = {("image", "gaussian_noise"), ("image", "shot_noise")} | {("signal", n) for n in SIGNAL}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def natural():
    """12 natural RGB 32x32 crops (scikit-learn's bundled photos), standardised; (x, stats, pixels)."""
    from sklearn.datasets import load_sample_images

    imgs = load_sample_images().images
    rng = np.random.default_rng(0)
    crops = []
    for k in range(12):
        im = imgs[k % 2]
        r, c = rng.integers(0, im.shape[0] - 128), rng.integers(0, im.shape[1] - 128)
        crops.append(im[r : r + 128, c : c + 128])
    u8 = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)
    u8 = torch.round(F.avg_pool2d(u8.double(), 4)).to(torch.uint8)  # (12, 3, 32, 32)
    mean255, std255 = channel_stats(u8)
    stats = {"mean": (mean255 / 255).tolist(), "std": (std255 / 255).tolist()}
    return standardize(u8, mean255, std255), stats, u8.double() / 255


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    return torch.from_numpy(load_digits().images[:96].astype(np.float32) / 16.0).unsqueeze(1)  # (96, 1, 8, 8) in [0, 1]


@pytest.fixture(scope="module")
def signals():
    x, _ = generate_mnist1d(200, seed=0)
    x = torch.from_numpy(x)
    mean, std = channel_stats(x)
    return standardize(x, mean, std)  # (200, 40)


def _batch(kind, natural, digits, signals, which):
    if kind == "signal":
        return signals, None
    if which == "natural":
        return natural[0], natural[1]
    return digits, {"scale": 1 / 16}


def _strengths(x, kind, name, stats, seed=3):
    clean = S.to_pixels(x, stats).double() if kind == "image" else x.double()
    out = []
    for sev in S.SEVERITIES:
        y = S.corrupt(x, name, sev, generator=_gen(seed), stats=stats)
        y = S.to_pixels(y, stats).double() if kind == "image" else y.double()
        out.append(float(((y - clean) ** 2).mean()))
    return out


CASES = [("image", n, w) for n in IMAGE for w in ("natural", "digits")] + [("signal", n, "mnist1d") for n in SIGNAL]


@pytest.mark.parametrize("kind,name,which", CASES)
def test_strength_strictly_increasing_with_severity(kind, name, which, natural, digits, signals):
    x, stats = _batch(kind, natural, digits, signals, which)
    s = _strengths(x, kind, name, stats)
    assert s[0] > 0 and all(a < b for a, b in zip(s, s[1:])), (name, which, s)


@pytest.mark.parametrize("which", ["natural", "digits"])
def test_contrast_std_drop_increasing(which, natural, digits, signals):
    x, stats = _batch("image", natural, digits, signals, which)
    clean_std = S.to_pixels(x, stats).std(dim=(2, 3)).mean()
    drops = [
        float(clean_std - S.to_pixels(S.corrupt(x, "contrast", k, stats=stats), stats).std(dim=(2, 3)).mean())
        for k in S.SEVERITIES
    ]
    assert drops[0] > 0 and all(a < b for a, b in zip(drops, drops[1:])), drops


@pytest.mark.parametrize("kind,name", [("image", n) for n in IMAGE] + [("signal", n) for n in SIGNAL])
def test_deterministic_under_seed_and_seeds_differ(kind, name, natural, signals):
    x, stats = (natural[0], natural[1]) if kind == "image" else (signals, None)
    a = S.corrupt(x, name, 3, generator=_gen(7), stats=stats)
    b = S.corrupt(x, name, 3, generator=_gen(7), stats=stats)
    c = S.corrupt(x, name, 3, generator=_gen(8), stats=stats)
    assert torch.equal(a, b)
    assert not torch.equal(a, x)
    if (kind, name) in RANDOM:
        assert not torch.equal(a, c)
    else:
        assert torch.equal(a, c) and torch.equal(a, S.corrupt(x, name, 3, stats=stats))  # no generator needed


@pytest.mark.parametrize("kind,name", [("image", n) for n in IMAGE] + [("signal", n) for n in SIGNAL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_device_preserved(kind, name, dtype, natural, signals):
    shapes = [natural[0].to(dtype)] if kind == "image" else [signals.to(dtype), signals.to(dtype).unsqueeze(1)]
    stats = natural[1] if kind == "image" else None
    for x in shapes:
        y = S.corrupt(x, name, 5, generator=_gen(), stats=stats)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
        assert torch.isfinite(y).all()
    if kind == "signal":  # (N, L) and (N, 1, L) give the same corruption
        y2 = S.corrupt(shapes[0], name, 4, generator=_gen(1))
        y3 = S.corrupt(shapes[1], name, 4, generator=_gen(1))
        assert torch.equal(y2, y3.squeeze(1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind,name", [("image", n) for n in IMAGE] + [("signal", n) for n in SIGNAL])
def test_cuda_matches_cpu_with_cpu_generator(kind, name, natural, signals):
    x, stats = (natural[0], natural[1]) if kind == "image" else (signals, None)
    cpu = S.corrupt(x, name, 4, generator=_gen(5), stats=stats)
    gpu = S.corrupt(x.cuda(), name, 4, generator=_gen(5), stats=stats)
    assert gpu.device.type == "cuda" and gpu.dtype == x.dtype
    if name == "jpeg_quantization":  # ends on 8-bit levels: a rounding tie may flip by one level
        assert (gpu.cpu() - cpu).abs().max() < 2.5 / 255 / min(natural[1]["std"])
    else:
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-5)
    # a generator on the data's device draws there
    g = torch.Generator(device="cuda").manual_seed(5)
    assert S.corrupt(x.cuda(), name, 4, generator=g, stats=stats).device.type == "cuda"


def test_standardisation_round_trip_and_identity_parameters(natural, digits, signals):
    x, stats, pixels = natural
    assert (S.to_pixels(x, stats).double() - pixels).abs().max() < 1e-6
    torch.testing.assert_close(S.from_pixels(S.to_pixels(x, stats), stats), x, atol=1e-5, rtol=0)
    for name, identity in (("gaussian_noise", 0.0), ("contrast", 1.0), ("brightness", 0.0), ("pixelate", 1.0)):
        for batch, st in ((x, stats), (digits, None), (digits, {"scale": 1 / 16})):
            y = S.corrupt_with_param(batch, name, identity, generator=_gen(), stats=st)
            torch.testing.assert_close(y, batch, atol=2e-5, rtol=0)
    for name, identity in (("gaussian_noise", 0.0), ("time_shift", 0.0), ("amplitude_scale", 0.0), ("time_warp", 0.0)):
        torch.testing.assert_close(
            S.corrupt_with_param(signals, name, identity, generator=_gen()), signals, atol=1e-6, rtol=0
        )


def test_outputs_are_valid_pixels_and_stats_are_used(natural):
    x, stats, _ = natural
    for name in IMAGE:
        p = S.to_pixels(S.corrupt(x, name, 5, generator=_gen(), stats=stats), stats)
        assert p.min() >= -1e-5 and p.max() <= 1 + 1e-5
    # the same pixels standardised differently give the same corrupted pixels
    other = {"mean": [0.1, 0.2, 0.3], "std": [0.5, 0.6, 0.7]}
    x2 = S.from_pixels(S.to_pixels(x, stats), other)
    for name in ("contrast", "brightness", "gaussian_noise"):
        a = S.to_pixels(S.corrupt(x, name, 2, generator=_gen(1), stats=stats), stats)
        b = S.to_pixels(S.corrupt(x2, name, 2, generator=_gen(1), stats=other), other)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_reference_definitions(natural):
    """Against independent implementations: scipy's Gaussian filter, colorsys HSV, PIL's JPEG."""
    from PIL import Image
    from scipy.ndimage import gaussian_filter

    _, _, pixels = natural
    p = pixels[:2]  # float64 (2, 3, 32, 32)
    im = p.numpy()
    for sigma in S.severity_params("image", "gaussian_blur"):
        ref = np.stack(
            [[gaussian_filter(im[i, c], sigma, mode="nearest", truncate=4.0) for c in range(3)] for i in range(2)]
        )
        np.testing.assert_allclose(S.corrupt_with_param(p, "gaussian_blur", sigma).numpy(), ref, atol=1e-12)
    c = S.severity_params("image", "brightness")[4]
    hw = im[0].transpose(1, 2, 0)
    ref = np.array(
        [
            [colorsys.hsv_to_rgb(*(lambda h, s, v: (h, s, min(v + c, 1.0)))(*colorsys.rgb_to_hsv(*px))) for px in row]
            for row in hw
        ]
    )
    np.testing.assert_allclose(
        S.corrupt_with_param(p[:1], "brightness", c)[0].numpy().transpose(1, 2, 0), ref, atol=1e-12
    )
    grey = torch.rand(3, 1, 8, 8, generator=_gen(), dtype=torch.float64)  # grey: V = x, brightness = clip(x + c)
    torch.testing.assert_close(S.corrupt_with_param(grey, "brightness", 0.3), (grey + 0.3).clamp(0, 1))
    k = S.severity_params("image", "contrast")[2]
    m = p.mean(dim=(2, 3), keepdim=True)
    torch.testing.assert_close(S.corrupt(p, "contrast", 3), ((p - m) * k + m).clamp(0, 1))
    # JPEG-like quantisation is close to a real JPEG codec without chroma subsampling
    u8 = np.round(im[0].transpose(1, 2, 0) * 255).astype(np.uint8)
    for quality in S.severity_params("image", "jpeg_quantization")[::2]:
        buf = io.BytesIO()
        Image.fromarray(u8).save(buf, "JPEG", quality=quality, subsampling=0)
        ref = np.asarray(Image.open(buf)).astype(np.float64) / 255
        mine = S.corrupt_with_param(p[:1], "jpeg_quantization", quality)[0].numpy().transpose(1, 2, 0)
        assert np.abs(mine - ref).mean() < 0.3 * np.abs(ref - u8 / 255).mean()
    assert torch.equal(S.jpeg_quant_table(50)[0, :3], torch.tensor([16.0, 11.0, 10.0], dtype=torch.float64))
    # pixelate at an integer ratio is block averaging
    blocks = F.interpolate(F.avg_pool2d(p, 4), scale_factor=4, mode="nearest")
    torch.testing.assert_close(S.corrupt_with_param(p, "pixelate", 0.25), blocks)
    assert S.pixelate_sizes(32) == [30, 28, 27, 24, 20] and S.pixelate_sizes(8) == [7, 6, 5, 4, 3]


def test_noise_statistics(natural):
    _, _, pixels = natural
    mid = torch.full((4, 3, 32, 32), 0.5, dtype=torch.float64)  # no clipping at 0.5
    for sev, c in zip(S.SEVERITIES, S.severity_params("image", "gaussian_noise")):
        d = S.corrupt(mid, "gaussian_noise", sev, generator=_gen(sev)) - mid
        assert abs(float(d.std()) - c) < 0.1 * c and abs(float(d.mean())) < 0.01
    lam = S.severity_params("image", "shot_noise")[4]
    y = S.corrupt(mid, "shot_noise", 5, generator=_gen())
    assert torch.allclose(y * lam, torch.round(y * lam))  # counts / lam
    assert abs(float(y.mean()) - 0.5) < 0.01 and abs(float(y.var()) - 0.5 / lam) < 0.15 * 0.5 / lam


def test_signal_corruptions_exact(signals):
    x = signals[:16]
    y = S.corrupt(x, "time_shift", 2, generator=_gen(4))
    step = 4  # round(0.1 * 40)
    for i in range(len(x)):
        assert torch.equal(y[i], torch.roll(x[i], step)) or torch.equal(y[i], torch.roll(x[i], -step))
    a = S.corrupt(x, "amplitude_scale", 4, generator=_gen(4))  # d = 1: factor 2 or 1/2 about the mean
    m = x.mean(dim=1, keepdim=True)
    ratio = (a - m).norm(dim=1) / (x - m).norm(dim=1)
    assert torch.all(((ratio - 2).abs() < 1e-4) | ((ratio - 0.5).abs() < 1e-4))
    assert torch.allclose(a.mean(dim=1), x.mean(dim=1), atol=1e-5)
    w = S.corrupt(x.double(), "time_warp", 5, generator=_gen(4))  # d = 0.5: stretch 1.5 or 1/1.5 about the centre
    t = np.arange(40.0)
    for i in range(len(x)):
        refs = [np.interp(np.clip(19.5 + (t - 19.5) / s, 0, 39), t, x[i].double().numpy()) for s in (1.5, 1 / 1.5)]
        assert min(np.abs(w[i].numpy() - r).max() for r in refs) < 1e-12
    # signal corruptions commute with an affine standardisation (noise in standardised units aside)
    mu, sd = 0.7, 2.5
    for name in ("time_shift", "amplitude_scale", "time_warp"):
        a = S.corrupt(x * sd + mu, name, 3, generator=_gen(9))
        b = S.corrupt(x, name, 3, generator=_gen(9)) * sd + mu
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_common_random_numbers_across_severities(natural):
    x, stats, _ = natural
    d1 = S.corrupt(x, "gaussian_noise", 1, generator=_gen(2), stats=stats) - x
    d2 = S.corrupt(x, "gaussian_noise", 2, generator=_gen(2), stats=stats) - x
    unclipped = (d1.abs() > 0) & (d2.abs() > 0)
    corr = torch.corrcoef(torch.stack([d1[unclipped], d2[unclipped]]))[0, 1]
    assert corr > 0.9  # same draws, larger scale


def test_errors(natural, signals):
    x, stats, _ = natural
    with pytest.raises(ValueError, match="allowed: gaussian_noise, shot_noise"):
        S.corrupt(x, "fog", 1, stats=stats)
    with pytest.raises(ValueError, match="allowed: gaussian_noise, time_shift"):
        S.corrupt(signals, "contrast", 1)
    for bad in (0, 6, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="1, 2, 3, 4, 5"):
            S.corrupt(x, "contrast", bad, stats=stats)
    with pytest.raises(ValueError, match="random"):
        S.corrupt(x, "gaussian_noise", 1, stats=stats)
    with pytest.raises(ValueError, match=r"not \[0, 1\]"):
        S.corrupt(x, "contrast", 1)  # standardised images without their stats
    with pytest.raises(ValueError, match="channels"):
        S.corrupt(x, "contrast", 1, stats={"mean": [0.5, 0.5], "std": [0.2, 0.2]})
    with pytest.raises(ValueError, match="shape"):
        S.corrupt(torch.zeros(5), "contrast", 1)
    with pytest.raises(ValueError, match="image, signal"):
        S.list_corruptions("audio")
    with pytest.raises(ValueError, match="1, 2, 3, 4, 5"):
        next(S.shift_suite(Split(x, torch.zeros(len(x), dtype=torch.long)), 0, stats=stats, severities=[7]))


def test_corrupt_split_and_suite():
    d = load_dataset(DataConfig(name="digits"), seed=0)
    kinds = list(S.shift_suite(d, seed=1))
    assert [(n, s) for n, s, _ in kinds] == [(n, s) for n in IMAGE for s in S.SEVERITIES]
    clean_x = d.test.x.clone()
    for _name, _sev, split in kinds:
        assert split.x.shape == d.test.x.shape and torch.equal(split.y, d.test.y)
    assert torch.equal(d.test.x, clean_x)  # the clean split is untouched
    a = S.corrupt_split(d.test, "shot_noise", 2, seed=1, stats=d.stats)
    b = S.corrupt_split(d.test, "shot_noise", 2, seed=1, stats=d.stats)
    c = S.corrupt_split(d.test, "shot_noise", 2, seed=2, stats=d.stats)
    assert torch.equal(a.x, b.x) and not torch.equal(a.x, c.x)
    assert torch.equal(dict(((n, s), sp) for n, s, sp in kinds)[("shot_noise", 2)].x, a.x)
    # standardised image sets: the suite un-standardises with the data's stats
    x = torch.rand(6, 3, 8, 8, generator=_gen())
    mean, std = channel_stats(x)
    ds = DataSplits(
        *(Split(standardize(x, mean, std), torch.zeros(6, dtype=torch.long)),) * 3,
        num_classes=2,
        input_shape=(3, 8, 8),
        name="toy",
        stats={"mean": mean.tolist(), "std": std.tolist()},
    )
    name, sev, sp = next(S.shift_suite(ds, 0, names=["contrast"], severities=[5]))
    torch.testing.assert_close(S.to_pixels(sp.x, ds.stats), S.corrupt(x, "contrast", 5), atol=1e-5, rtol=0)
    # signals: MNIST-1D
    m = load_dataset(DataConfig(name="mnist1d", num_samples=200), seed=0)
    out = list(S.shift_suite(m, 0, severities=[1]))
    assert [n for n, _, _ in out] == SIGNAL and all(sp.x.shape == m.test.x.shape for _, _, sp in out)

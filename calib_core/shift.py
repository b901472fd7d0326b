"""Dataset shift: a corruption suite for test splits at severities 1..5.

Images (N, C, H, W), in the spirit of CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019,
"Benchmarking Neural Network Robustness to Common Corruptions and Perturbations"):

    gaussian_noise    x + N(0, c^2), c = [0.04, 0.06, 0.08, 0.09, 0.10]
    shot_noise        Poisson(x * c) / c, c = [500, 250, 100, 75, 50]
    gaussian_blur     Gaussian filter, sigma = [0.4, 0.6, 0.7, 0.8, 1.0] pixels (truncate 4 sigma,
                      edge-replicating border, channels blurred separately: skimage's `gaussian`)
    contrast          (x - m) * c + m, m the per-image per-channel mean, c = [0.75, 0.5, 0.4, 0.3, 0.15]
    brightness        HSV value + c, c = [0.05, 0.1, 0.15, 0.2, 0.3]
    jpeg_quantization JPEG-like 8x8 block-DCT coefficient quantisation at quality [80, 65, 58, 50, 40]
    pixelate          resample to an int(c * size) grid per side and back, by exact area
                      averaging; c = [0.95, 0.9, 0.85, 0.75, 0.65]

The numbers are the CIFAR-10-C tables of `make_cifar_c.py` in github.com/hendrycks/robustness
(ImageNet-C/create_c). Every image corruption is defined on pixels in [0, 1] and ends with a
clip to [0, 1] (the clip is part of the corruption's definition, as in the reference). Notes on
where we differ from the reference implementation:

* jpeg_quantization is *not* a JPEG codec: it converts to YCbCr (JFIF), takes the orthonormal
  8x8 DCT of each block (edge-replicated to a multiple of 8), quantises the coefficients with
  the standard JPEG tables (ITU T.81 Annex K) scaled to the quality as libjpeg does, and
  inverts, ending on 8-bit levels. It has no chroma subsampling (PIL uses 4:2:0) and no
  entropy coding (which is lossless anyway). Grey images use the luminance table only;
  images with C not in (1, 3) quantise every channel with the luminance table.
* brightness adds c to V = max(r, g, b) and rescales (r, g, b) by V'/V, which is exactly
  rgb2hsv -> V += c, clip -> hsv2rgb (hue and saturation unchanged; a black pixel, S = 0,
  becomes grey V').
* pixelate: the reference resizes with PIL's BOX filter down to int(c * 32) and back up,
  which snaps each output pixel to the nearest coarse cell. At these mild, non-integer ratios
  (32 -> 30, 28, 27, 24, 20) the snapping misaligns the grid and the mean squared change is
  *not* monotone in the severity (on natural 32x32 crops we measured 1.45e-3, 1.41e-3,
  1.62e-3, 1.47e-3, 1.78e-3). We therefore cut the image into an s x s grid of equal cells,
  average each cell exactly by area and render each pixel back as the area average of the
  cells it overlaps: classic block pixelation when s divides the size, area-weighted mixing
  of the two cells a pixel straddles otherwise (measured: 4.9e-4 ... 8.7e-4, increasing).
  s = int(c * H); for small images where two severities give the same s (8x8 digits) each
  severity takes at least one cell less than the previous one, so severities stay distinct.

Standardised inputs: our loaders standardise images per channel with the train mean/std
(`DataSplits.stats["mean"]`, `["std"]`, in [0, 1] pixel units: x = (pixel - mean) / std). Pass
those `stats`: the image is un-standardised to pixels, corrupted, clipped and re-standardised.
With `stats=None` (or stats without "mean", e.g. digits, whose x is pixel / 16 in [0, 1]) x
must already be in [0, 1]. A ValueError is raised when the un-standardised input lies outside
[0, 1] (by more than 1e-3): wrong stats would otherwise be clipped silently.

1-D signals (N, L) or (N, C, L), e.g. MNIST-1D, with parameters modelled on MNIST-1D's own
generator (which scales, translates and adds noise to its templates):

    gaussian_noise   x + N(0, c^2) in units of the train std, c = [0.1, 0.2, 0.35, 0.5, 0.75]
    time_shift       circular shift by +-round(f * L) steps, f = [0.05, 0.1, 0.15, 0.2, 0.25]
    amplitude_scale  m + a (x - m), m the per-sample mean, a = (1 + d)^(+-1), d = [0.25, 0.5, 0.75, 1, 1.5]
    time_warp        x(c + (t - c) / s), linear interpolation, edges held, s = (1 + d)^(+-1),
                     d = [0.1, 0.2, 0.3, 0.4, 0.5]

(sign +- drawn per sample). Signal corruptions commute with a per-channel affine
standardisation, so they run on standardised tensors directly; `stats` is accepted and unused
for signals (noise is in standardised units, i.e. relative to the train std).

Randomness: random corruptions draw from the explicit `generator` (on the generator's device,
then moved to x's device, so a CPU generator gives the same corruption on any device). The
draws do not depend on the severity: with one seed, severity k + 1 applies the same noise,
shift direction, ... as severity k, only stronger ("common random numbers").
`corrupt_split` / `shift_suite` seed one CPU generator per (seed, corruption name).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from calib_core.data.splits import DataSplits, Split

SEVERITIES = (1, 2, 3, 4, 5)
KINDS = ("image", "signal")
_RANGE_ATOL = 1e-3  # how far un-standardised pixels may stray outside [0, 1] before we refuse
_SPLIT_CHUNK = 1024  # rows per chunk in corrupt_split (bounds temporary memory)


@dataclass(frozen=True)
class Corruption:
    name: str
    kind: str  # "image" | "signal"
    params: tuple[Any, ...]  # one parameter per severity 1..5
    fn: Callable[..., Tensor]  # fn(x, param, generator, severity) -> Tensor
    random: bool


# --- random draws on the generator's device --------------------------------------------------
def _gen_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _randn(shape: Sequence[int], generator: torch.Generator | None, like: Tensor) -> Tensor:
    noise = torch.randn(tuple(shape), generator=generator, device=_gen_device(generator), dtype=like.dtype)
    return noise.to(like.device)


def _signs(n: int, generator: torch.Generator | None, like: Tensor) -> Tensor:
    """(n,) of +-1 in like's dtype and device."""
    bits = torch.randint(0, 2, (n,), generator=generator, device=_gen_device(generator))
    return (bits * 2 - 1).to(device=like.device, dtype=like.dtype)


# --- standardisation ------------------------------------------------------------------------
def _stats_tensors(stats: Mapping[str, Any] | None, x: Tensor) -> tuple[Tensor, Tensor] | None:
    if stats is None:
        return None
    if not isinstance(stats, Mapping):
        raise ValueError(
            f"stats must be a mapping like DataSplits.stats (keys 'mean', 'std') or None, got {type(stats).__name__}"
        )
    has_mean, has_std = "mean" in stats, "std" in stats
    if has_mean != has_std:
        raise ValueError("stats needs both 'mean' and 'std' (or neither)")
    if not has_mean:
        return None  # e.g. digits: {"scale": 1/16}, x is already in [0, 1]
    c = x.shape[1]
    shape = (1, -1) + (1,) * (x.dim() - 2)
    out = []
    for key in ("mean", "std"):
        v = torch.as_tensor(stats[key], dtype=torch.float64).flatten()
        if v.numel() not in (1, c):
            raise ValueError(f"stats[{key!r}] has {v.numel()} values for {c} channels")
        if not torch.isfinite(v).all() or (key == "std" and (v <= 0).any()):
            raise ValueError(f"stats[{key!r}] must be finite{' and > 0' if key == 'std' else ''}, got {v.tolist()}")
        out.append(v.to(device=x.device, dtype=x.dtype).view(shape))
    return out[0], out[1]


def to_pixels(x: Tensor, stats: Mapping[str, Any] | None) -> Tensor:
    """Un-standardise images: x * std + mean per channel (x itself, as a copy, without stats)."""
    ms = _stats_tensors(stats, x)
    return x.clone() if ms is None else x * ms[1] + ms[0]


def from_pixels(p: Tensor, stats: Mapping[str, Any] | None) -> Tensor:
    """Re-standardise images: (p - mean) / std per channel (p itself without stats)."""
    ms = _stats_tensors(stats, p)
    return p if ms is None else (p - ms[0]) / ms[1]


# --- image corruptions on pixels in [0, 1] ---------------------------------------------------
def _gaussian_noise(p: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    return (p + c * _randn(p.shape, generator, p)).clamp_(0.0, 1.0)


def _shot_noise(p: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    rate = (p.clamp(0.0, 1.0) * c).to(_gen_device(generator))
    counts = torch.poisson(rate, generator=generator).to(p.device)
    return (counts / c).clamp_(0.0, 1.0)


def gaussian_kernel1d(
    sigma: float, *, truncate: float = 4.0, dtype: torch.dtype = torch.float32, device: Any = None
) -> Tensor:
    """Normalised 1-D Gaussian of radius int(truncate * sigma + 0.5), as scipy.ndimage builds it."""
    radius = int(truncate * float(sigma) + 0.5)
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / float(sigma)) ** 2)
    return (k / k.sum()).to(dtype=dtype, device=device)


def _gaussian_blur(p: Tensor, sigma: float, generator: torch.Generator | None, severity: int) -> Tensor:
    n, c, h, w = p.shape
    k = gaussian_kernel1d(sigma, dtype=p.dtype, device=p.device)
    r = (k.numel() - 1) // 2
    y = p.reshape(n * c, 1, h, w)
    y = F.conv2d(F.pad(y, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1))
    y = F.conv2d(F.pad(y, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1))
    return y.reshape(n, c, h, w).clamp_(0.0, 1.0)


def _contrast(p: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    m = p.mean(dim=(2, 3), keepdim=True)
    return ((p - m) * c + m).clamp_(0.0, 1.0)


def _brightness(p: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    v = p.amax(dim=1, keepdim=True)
    v_new = (v + c).clamp(0.0, 1.0)
    scale = torch.where(v > 0, v_new / torch.where(v > 0, v, torch.ones_like(v)), torch.zeros_like(v))
    out = torch.where(v > 0, p * scale, v_new.expand_as(p))
    return out.clamp_(0.0, 1.0)


# JPEG (ITU T.81 Annex K) quantisation tables, row-major over (vertical, horizontal) frequency
# fmt: off
_JPEG_LUMA = (
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
)
_JPEG_CHROMA = (
    17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99,
    99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99,
)
# fmt: on


def jpeg_quant_table(quality: int, *, chroma: bool = False) -> Tensor:
    """The libjpeg (IJG) table for `quality` in 1..100: floor((T * s + 50) / 100) clipped to [1, 255]."""
    q = min(max(int(quality), 1), 100)
    s = 5000 // q if q < 50 else 200 - 2 * q
    base = torch.tensor(_JPEG_CHROMA if chroma else _JPEG_LUMA, dtype=torch.int64).view(8, 8)
    return ((base * s + 50) // 100).clamp(1, 255).to(torch.float64)


def _dct_matrix(dtype: torch.dtype, device: Any) -> Tensor:
    k = torch.arange(8, dtype=torch.float64)
    d = torch.cos((2 * k[None, :] + 1) * k[:, None] * math.pi / 16) * math.sqrt(2 / 8)
    d[0] /= math.sqrt(2)
    return d.to(dtype=dtype, device=device)  # orthonormal DCT-II: coef = D @ block @ D.T


def _jpeg_quantization(p: Tensor, quality: int, generator: torch.Generator | None, severity: int) -> Tensor:
    n, c, h, w = p.shape
    v = p.clamp(0.0, 1.0) * 255.0
    if c == 3:
        r, g, b = v.unbind(1)
        y = 0.299 * r + 0.587 * g + 0.114 * b
        cb = -0.168736 * r - 0.331264 * g + 0.5 * b + 128.0
        cr = 0.5 * r - 0.418688 * g - 0.081312 * b + 128.0
        planes = torch.stack([y, cb, cr], 1)
        chroma = jpeg_quant_table(quality, chroma=True)
        tables = [jpeg_quant_table(quality), chroma, chroma]
    else:
        planes = v
        tables = [jpeg_quant_table(quality)] * c
    q = torch.stack(tables).to(dtype=p.dtype, device=p.device).view(1, c, 1, 1, 8, 8)
    ph, pw = (-h) % 8, (-w) % 8
    planes = F.pad(planes - 128.0, (0, pw, 0, ph), mode="replicate") if ph or pw else planes - 128.0
    hb, wb = planes.shape[2] // 8, planes.shape[3] // 8
    blocks = planes.reshape(n, c, hb, 8, wb, 8).permute(0, 1, 2, 4, 3, 5)  # (N, C, hb, wb, 8, 8)
    d = _dct_matrix(p.dtype, p.device)
    coef = d @ blocks @ d.T
    coef = torch.round(coef / q) * q
    blocks = d.T @ coef @ d
    planes = blocks.permute(0, 1, 2, 4, 3, 5).reshape(n, c, hb * 8, wb * 8)[:, :, :h, :w] + 128.0
    if c == 3:
        y, cb, cr = planes.unbind(1)
        r = y + 1.402 * (cr - 128.0)
        g = y - 0.344136 * (cb - 128.0) - 0.714136 * (cr - 128.0)
        b = y + 1.772 * (cb - 128.0)
        planes = torch.stack([r, g, b], 1)
    return torch.round(planes.clamp(0.0, 255.0)) / 255.0


def pixelate_sizes(size: int, factors: Sequence[float] = (0.95, 0.9, 0.85, 0.75, 0.65)) -> list[int]:
    """int(c * size) per severity, forced strictly decreasing (>= 1) for small sizes."""
    out, prev = [], size
    for c in factors:
        s = max(1, min(int(size * c), prev - 1))
        out.append(s)
        prev = s
    return out


def area_resample_matrix(size: int, cells: int) -> Tensor:
    """(cells, size) float64: cell i's exact area average of pixels [0, size) cut in `cells` equal parts."""
    edges = torch.linspace(0.0, float(size), cells + 1, dtype=torch.float64)
    j = torch.arange(size, dtype=torch.float64)
    overlap = torch.minimum(edges[1:, None], j[None, :] + 1) - torch.maximum(edges[:-1, None], j[None, :])
    overlap = overlap.clamp_(min=0.0)
    return overlap / (size / cells)


def _pixelate_operator(size: int, cells: int, dtype: torch.dtype, device: Any) -> Tensor:
    down = area_resample_matrix(size, cells)  # (cells, size), rows sum to 1
    up = down.T * (size / cells)  # (size, cells): pixel j's area average of the cells, rows sum to 1
    return (up @ down).to(dtype=dtype, device=device)


def _pixelate(p: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    h, w = p.shape[2], p.shape[3]
    sh = pixelate_sizes(h)[severity - 1] if severity else max(1, int(h * c))
    sw = pixelate_sizes(w)[severity - 1] if severity else max(1, int(w * c))
    mh = _pixelate_operator(h, sh, p.dtype, p.device)
    mw = _pixelate_operator(w, sw, p.dtype, p.device)
    return (mh @ p @ mw.T).clamp_(0.0, 1.0)


_PIXELATE = (0.95, 0.9, 0.85, 0.75, 0.65)


# --- signal corruptions on (N, C, L), standardised -------------------------------------------
def _sig_noise(x: Tensor, c: float, generator: torch.Generator | None, severity: int) -> Tensor:
    return x + c * _randn(x.shape, generator, x)


def _shift_steps(length: int, f: float, severity: int) -> int:
    if not severity:
        return int(round(f * length))
    steps, prev = [], 0
    for fk in _TIME_SHIFT:
        s = max(int(round(fk * length)), prev + 1)
        steps.append(s)
        prev = s
    return steps[severity - 1]


def _time_shift(x: Tensor, f: float, generator: torch.Generator | None, severity: int) -> Tensor:
    n, c, length = x.shape
    shift = (_signs(n, generator, x).long() * _shift_steps(length, f, severity)).view(n, 1, 1)
    idx = (torch.arange(length, device=x.device).view(1, 1, length) - shift) % length  # out[t] = x[t - s]
    return x.gather(2, idx.expand(n, c, length))


def _amplitude_scale(x: Tensor, d: float, generator: torch.Generator | None, severity: int) -> Tensor:
    base = torch.as_tensor(1.0 + d, dtype=x.dtype, device=x.device)
    a = torch.pow(base, _signs(x.shape[0], generator, x)).view(-1, 1, 1)
    m = x.mean(dim=2, keepdim=True)
    return m + a * (x - m)


def _time_warp(x: Tensor, d: float, generator: torch.Generator | None, severity: int) -> Tensor:
    n, c, length = x.shape
    s = torch.pow(torch.as_tensor(1.0 + d, dtype=x.dtype, device=x.device), _signs(n, generator, x)).view(n, 1)
    centre = (length - 1) / 2.0
    t = torch.arange(length, device=x.device, dtype=x.dtype).view(1, length)
    src = (centre + (t - centre) / s).clamp(0.0, length - 1.0)  # (N, L), edges held
    lo = src.floor().long().clamp(max=length - 1)
    hi = (lo + 1).clamp(max=length - 1)
    wt = (src - lo.to(x.dtype)).unsqueeze(1)
    x_lo = x.gather(2, lo.unsqueeze(1).expand(n, c, length))
    x_hi = x.gather(2, hi.unsqueeze(1).expand(n, c, length))
    return x_lo + wt * (x_hi - x_lo)


_TIME_SHIFT = (0.05, 0.1, 0.15, 0.2, 0.25)

_CORRUPTIONS: dict[str, dict[str, Corruption]] = {
    "image": {
        c.name: c
        for c in (
            Corruption("gaussian_noise", "image", (0.04, 0.06, 0.08, 0.09, 0.10), _gaussian_noise, True),
            Corruption("shot_noise", "image", (500, 250, 100, 75, 50), _shot_noise, True),
            Corruption("gaussian_blur", "image", (0.4, 0.6, 0.7, 0.8, 1.0), _gaussian_blur, False),
            Corruption("contrast", "image", (0.75, 0.5, 0.4, 0.3, 0.15), _contrast, False),
            Corruption("brightness", "image", (0.05, 0.1, 0.15, 0.2, 0.3), _brightness, False),
            Corruption("jpeg_quantization", "image", (80, 65, 58, 50, 40), _jpeg_quantization, False),
            Corruption("pixelate", "image", _PIXELATE, _pixelate, False),
        )
    },
    "signal": {
        c.name: c
        for c in (
            Corruption("gaussian_noise", "signal", (0.1, 0.2, 0.35, 0.5, 0.75), _sig_noise, True),
            Corruption("time_shift", "signal", _TIME_SHIFT, _time_shift, True),
            Corruption("amplitude_scale", "signal", (0.25, 0.5, 0.75, 1.0, 1.5), _amplitude_scale, True),
            Corruption("time_warp", "signal", (0.1, 0.2, 0.3, 0.4, 0.5), _time_warp, True),
        )
    },
}


# --- public API ------------------------------------------------------------------------------
def list_corruptions(kind: str) -> list[str]:
    """Corruption names for `kind` ("image" or "signal"), in suite order."""
    if kind not in _CORRUPTIONS:
        raise ValueError(f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    return list(_CORRUPTIONS[kind])


def severity_params(kind: str, name: str) -> tuple[Any, ...]:
    """The parameter of `name` at severities 1..5 (see the module docstring)."""
    return _lookup(kind, name).params


def input_kind(x: Tensor) -> str:
    """ "image" for (N, C, H, W), "signal" for (N, L) or (N, C, L)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch tensor, got {type(x).__name__}")
    if x.dim() == 4:
        return "image"
    if x.dim() in (2, 3):
        return "signal"
    raise ValueError(f"expected images (N, C, H, W) or signals (N, L) / (N, C, L), got shape {tuple(x.shape)}")


def _lookup(kind: str, name: str) -> Corruption:
    allowed = list_corruptions(kind)
    if name not in allowed:
        raise ValueError(f"unknown corruption {name!r} for {kind} inputs; allowed: {', '.join(allowed)}")
    return _CORRUPTIONS[kind][name]


def _check_severity(severity: Any) -> int:
    if isinstance(severity, bool) or not isinstance(severity, int) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(map(str, SEVERITIES))}, got {severity!r}")
    return int(severity)


def corrupt(
    x: Tensor,
    name: str,
    severity: int,
    *,
    generator: torch.Generator | None = None,
    stats: Mapping[str, Any] | None = None,
) -> Tensor:
    """Apply corruption `name` at `severity` (1..5) to a batch; same shape, dtype and device.

    Random corruptions need `generator` (a torch.Generator; the result is a function of its
    state); deterministic ones ignore it. `stats` is the data's standardisation (see module
    docstring). Unknown names or severities raise ValueError listing the allowed values.
    """
    kind = input_kind(x)
    corr = _lookup(kind, name)
    severity = _check_severity(severity)
    return _apply(x, corr, corr.params[severity - 1], severity, generator, stats)


def corrupt_with_param(
    x: Tensor,
    name: str,
    param: Any,
    *,
    generator: torch.Generator | None = None,
    stats: Mapping[str, Any] | None = None,
) -> Tensor:
    """Like `corrupt` with an explicit parameter in place of a severity (e.g. contrast 1.0 = identity)."""
    kind = input_kind(x)
    return _apply(x, _lookup(kind, name), param, 0, generator, stats)


def _apply(
    x: Tensor, corr: Corruption, param: Any, severity: int, generator: torch.Generator | None, stats: Any
) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.shape[0] == 0:
        return x.clone()
    if corr.random and generator is None:
        raise ValueError(f"corruption {corr.name!r} is random: pass generator=torch.Generator().manual_seed(seed)")
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if corr.kind == "signal":
        squeeze = work.dim() == 2
        s = work.unsqueeze(1) if squeeze else work
        out = corr.fn(s, param, generator, severity)
        out = out.squeeze(1) if squeeze else out
        return out.to(x.dtype)
    p = to_pixels(work, stats)
    lo, hi = torch.aminmax(p)
    if not (torch.isfinite(lo) and torch.isfinite(hi)) or lo < -_RANGE_ATOL or hi > 1 + _RANGE_ATOL:
        raise ValueError(
            f"images un-standardised with stats={None if stats is None else dict(stats)} "
            f"span [{float(lo):.4g}, {float(hi):.4g}], "
            "not [0, 1]: pass the data's stats (DataSplits.stats) or pixels in [0, 1]"
        )
    out = corr.fn(p.clamp_(0.0, 1.0), param, generator, severity)
    return from_pixels(out, stats).to(x.dtype)


def corruption_seed(seed: int, name: str) -> int:
    """The generator seed `corrupt_split` uses for (seed, name): independent across names."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def corrupt_split(
    split: Split, name: str, severity: int, seed: int, *, stats: Mapping[str, Any] | None = None
) -> Split:
    """A corrupted copy of `split` (labels shared), deterministic in (seed, name, severity).

    One CPU generator seeded with `corruption_seed(seed, name)` (the same for every severity:
    common random numbers) walks the rows in chunks of 1024, so memory stays bounded and the
    result does not depend on the split's device.
    """
    kind = input_kind(split.x)
    _lookup(kind, name)
    _check_severity(severity)
    gen = torch.Generator(device="cpu").manual_seed(corruption_seed(seed, name))
    parts = [corrupt(chunk, name, severity, generator=gen, stats=stats) for chunk in split.x.split(_SPLIT_CHUNK)]
    x = torch.cat(parts) if parts else split.x.clone()
    return Split(x, split.y)


def shift_suite(
    data: DataSplits | Split,
    seed: int,
    *,
    names: Sequence[str] | None = None,
    severities: Sequence[int] = SEVERITIES,
    stats: Mapping[str, Any] | None = None,
) -> Iterator[tuple[str, int, Split]]:
    """Yield (name, severity, corrupted test Split) for every corruption of the data's kind.

    `data` is a DataSplits (its test split and its `stats` are used) or a bare Split (pass
    `stats`). Splits are built lazily, one at a time.
    """
    if isinstance(data, DataSplits):
        split, stats = data.test, (data.stats if stats is None else stats)
    elif isinstance(data, Split):
        split = data
    else:
        raise TypeError(f"shift_suite needs a DataSplits or a Split, got {type(data).__name__}")
    kind = input_kind(split.x)
    chosen = list_corruptions(kind) if names is None else [_lookup(kind, n).name for n in names]
    sevs = [_check_severity(s) for s in severities]
    for name in chosen:
        for sev in sevs:
            yield name, sev, corrupt_split(split, name, sev, seed, stats=stats)

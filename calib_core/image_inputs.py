"""Images as users hold them, to the uint8 pixels (N, C, H, W) a model was trained on.

`pixel_batch(raw, mode=..., size=..., resize=...)` takes what a caller has and converts it as
calib_core/data/image_folder.py decodes a file (PIL `convert(mode)`, then PIL's resize with the recorded filter):

- arrays (numpy, torch, nested lists): (N, H, W) grey, (N, H, W, C) channels last as PIL and numpy give them,
  or (N, C, H, W) channels first; uint8 / integers 0..255, or floats: 0..255 (`np.asarray(img, float)`), or 0..1
  (torchvision's `ToTensor`) when the batch's largest value is at most 1 (`pixels="0..255"` / `"0..1"` says which
  instead); float pixels are rounded to the nearest integer, as an 8-bit image file holds them;
- PIL images, one or a list (any mode PIL converts: L, RGB, RGBA, P, I;16, ...);
- encoded image files (PNG, JPEG, anything PIL opens): bytes, or base64 text (a `data:image/...;base64,` prefix
  is allowed), one or a list, a 1-D array of them, or a table (pandas DataFrame / Series, a dict) with one column
  of them, as MLflow's scoring server parses a JSON request;
- a list of arrays of different sizes (each one image, laid out as above).

Every refusal is an `InvalidInputError` of one line naming the expected and the received shape or type, never the
values themselves.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from calib_core.export import InvalidInputError

PIXEL_SCALES = ("auto", "0..255", "0..1")
LAYOUTS = ("HWC", "CHW")
CHANNEL_COUNTS = (1, 3, 4)  # grey, RGB, RGBA: what a decoded image file has
EXPECTED = (
    "images: arrays (N, H, W), (N, H, W, C) or (N, C, H, W) (uint8, or float 0..255 / 0..1), PIL images, "
    "or PNG/JPEG files as bytes or base64 text"
)


def pixel_batch(
    raw: Any,
    *,
    mode: str,
    size: tuple[int, int],
    resize: str | None,
    layout: str | None = None,
    pixels: str | None = None,
) -> np.ndarray:
    """uint8 (N, C, H, W) for the model's `mode` (RGB: C=3, L: C=1) and `size` (H, W), converted as the loader did;
    `resize` is the record's filter ("PIL bilinear"; None: the model takes its training size only)."""
    if layout not in (None, "", *LAYOUTS):
        raise InvalidInputError(f"layout {layout!r} is neither 'HWC' nor 'CHW'")
    if pixels not in (None, "", *PIXEL_SCALES):
        raise InvalidInputError(f"pixels {pixels!r} is none of {', '.join(PIXEL_SCALES)}")
    channels = 1 if mode == "L" else 3
    raw = _unwrap(raw)
    items = _items(raw)
    if items is None:
        arr = _pixel_array(raw, pixels or "auto")
        if arr.ndim == 3 and arr.shape[-1] in (3, 4) and arr.shape[-1] != size[1]:
            raise InvalidInputError(
                f"expected a batch of images (N, H, W) grey or (N, H, W, C); got shape {tuple(arr.shape)}, which "
                "looks like one colour image: pass a batch of one (x[None])"
            )
        chw = _to_chw(arr, channels, layout or None)
        if chw.shape[1] == channels and chw.shape[2:] == tuple(size):
            return chw  # already what the loader produced: PIL would change nothing
        return _stack([_from_chw(img) for img in chw], mode, size, resize)
    return _stack(
        [_decode(item, i, pixels or "auto", layout or None) for i, item in enumerate(items)], mode, size, resize
    )


# ---------------------------------------------------------------------------- what the caller passed
def _is_encoded(v: Any) -> bool:
    return isinstance(v, (str, bytes, bytearray, memoryview))


def _is_item(v: Any) -> bool:
    from PIL import Image

    return isinstance(v, Image.Image) or _is_encoded(v)


def _unwrap(raw: Any) -> Any:
    """A table's one column of images (pandas DataFrame / Series, a dict: how MLflow's scoring server parses a JSON
    request) as a list; anything else as it is."""
    if hasattr(raw, "columns") and hasattr(raw, "iloc"):  # a pandas DataFrame
        cols = [str(c) for c in raw.columns]
        if len(cols) != 1:
            raise InvalidInputError(
                f"expected a table with one column of images (base64 PNG/JPEG text); got {len(cols)} columns "
                f"({', '.join(cols[:5])}{', ...' if len(cols) > 5 else ''})"
            )
        return list(raw.iloc[:, 0])
    if isinstance(raw, Mapping):  # {"image": [...]}: a JSON request's named input
        if len(raw) != 1:
            raise InvalidInputError(f"expected one named input of images; got {len(raw)} ({', '.join(map(str, raw))})")
        return _unwrap(next(iter(raw.values())))
    if hasattr(raw, "to_numpy") and not isinstance(raw, torch.Tensor):  # a pandas Series
        return list(raw.to_numpy())
    return raw


def _items(raw: Any) -> list[Any] | None:
    """The images one by one (PIL images, encoded files, arrays of their own sizes), or None for one array batch."""
    if _is_item(raw):
        return [raw]
    if isinstance(raw, np.ndarray) and raw.dtype.kind in "USO":
        if raw.ndim != 1:
            raise InvalidInputError(
                f"expected encoded images as a list (N,); got an array of {raw.dtype.kind} values of shape "
                f"{tuple(raw.shape)}"
            )
        raw = list(raw)
    if isinstance(raw, (list, tuple)) and raw:
        if any(_is_item(v) for v in raw):
            return list(raw)
        if all(isinstance(v, (np.ndarray, torch.Tensor)) for v in raw) and len({tuple(v.shape) for v in raw}) > 1:
            return list(raw)  # images of several sizes, one array each
    return None


def _pixel_array(raw: Any, pixels: str) -> np.ndarray:
    """The batch as uint8 in any of the layouts, from integer or float pixel values."""
    if isinstance(raw, torch.Tensor):
        arr = raw.detach().cpu().numpy()
    else:
        try:
            arr = np.asarray(raw)
        except ValueError:  # ragged nested lists
            raise InvalidInputError(f"expected {EXPECTED}; got a list that is not a rectangular array") from None
    if arr.dtype.kind in "iu":
        if pixels == "0..1":
            raise InvalidInputError(f"pixels '0..1' is for float pixels; got dtype {arr.dtype} (integers are 0..255)")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 255):
            raise InvalidInputError(f"integer pixel values must lie in 0..255; got {int(arr.min())}..{int(arr.max())}")
        return arr.astype(np.uint8, copy=False)
    if arr.dtype.kind != "f":
        raise InvalidInputError(f"expected {EXPECTED}; got an array of dtype {arr.dtype}")
    if not np.isfinite(arr).all():
        raise InvalidInputError("pixel values must be finite; got NaN or infinite values")
    top = float(arr.max()) if arr.size else 0.0
    scale = 255.0 if pixels == "0..1" or (pixels == "auto" and top <= 1.0) else 1.0
    # integer steps of 0..255 (or 0..1 in 1/255 steps); half a step of slack for float round-off
    lo, hi = (float(arr.min()) if arr.size else 0.0) * scale, top * scale
    if lo < -0.5 or hi > 255.5:
        what = "0..1" if scale == 255.0 else "0..255"
        raise InvalidInputError(
            f"float pixel values must lie in {what}; got {lo / scale:.4g}..{hi / scale:.4g} (pixels: '0..255' or "
            "'0..1' says which scale they use)"
        )
    return np.clip(np.rint(arr.astype(np.float64) * scale), 0, 255).astype(np.uint8)


def _to_chw(arr: np.ndarray, channels: int, layout: str | None) -> np.ndarray:
    """(N, C', H, W) from (N, H, W), (N, H, W, C) or (N, C, H, W)."""
    if arr.ndim == 3:
        return arr[:, None]
    if arr.ndim != 4:
        raise InvalidInputError(f"expected {EXPECTED}; got an array of shape {tuple(arr.shape)}")
    last, first = arr.shape[-1] in CHANNEL_COUNTS, arr.shape[1] in CHANNEL_COUNTS
    if layout is None:
        layout = "HWC" if last and (not first or arr.shape[-1] == channels) else "CHW" if first else ""
    if layout == "HWC":
        return arr.transpose(0, 3, 1, 2)
    if layout == "CHW":
        return arr
    raise InvalidInputError(
        f"cannot tell the channels of images of shape {tuple(arr.shape)}: neither the last nor the second dimension "
        "is 1, 3 or 4 (expected (N, H, W, C) or (N, C, H, W))"
    )


# ---------------------------------------------------------------------------- one image
def _from_chw(chw: np.ndarray) -> Any:
    """One uint8 image (C', H, W) as a PIL image (L, RGB or RGBA)."""
    from PIL import Image

    if chw.shape[0] not in CHANNEL_COUNTS:
        raise InvalidInputError(f"an image has {chw.shape[0]} channels; expected 1, 3 or 4")
    hwc = chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0)
    return Image.fromarray(np.ascontiguousarray(hwc))


def _decode(item: Any, i: int, pixels: str, layout: str | None) -> Any:
    """Item i as a PIL image: a PIL image as it is, an encoded file opened, an array (one image) converted."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item
    if isinstance(item, (np.ndarray, torch.Tensor, list, tuple)):
        one = _pixel_array(item, pixels)
        if one.ndim not in (2, 3):
            raise InvalidInputError(f"image {i}: expected (H, W), (H, W, C) or (C, H, W); got shape {one.shape}")
        return _from_chw(_to_chw(one[None], 0, layout)[0])
    if not _is_encoded(item):
        raise InvalidInputError(f"expected {EXPECTED}; image {i} is a {type(item).__name__}")
    data = bytes(item) if not isinstance(item, str) else _unbase64(item, i)
    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidInputError(
            f"image {i}: {len(data)} bytes that PIL cannot decode as an image file ({type(exc).__name__})"
        ) from None
    return im


def _unbase64(text: str, i: int) -> bytes:
    body = text.strip()
    if body.startswith("data:") and "," in body:  # a data URI: data:image/png;base64,....
        body = body.split(",", 1)[1]
    try:
        return base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(
            f"image {i}: a string of {len(text)} characters that is not base64 (a PNG/JPEG file as base64 text)"
        ) from None


def resample_filter(resize: str | None) -> Any:
    """PIL's filter for a record's `resize` ("PIL bilinear", "PIL bicubic", ...); bilinear when unnamed."""
    from PIL import Image

    name = (resize or "").split()[-1].upper() if resize else "BILINEAR"
    try:
        return Image.Resampling[name]
    except KeyError:
        raise InvalidInputError(f"the model records an unknown resize filter {resize!r}") from None


def _stack(images: Sequence[Any], mode: str, size: tuple[int, int], resize: str | None) -> np.ndarray:
    """Each PIL image converted to `mode` and resized to `size` as image_folder.py decodes a file; (N, C, H, W)."""
    h, w = size
    out = []
    for i, im in enumerate(images):
        im = im.convert(mode)
        if im.size != (w, h):
            if not resize:
                raise InvalidInputError(
                    f"expected images of {h}x{w} pixels (the model was trained without a resize); image {i} is "
                    f"{im.size[1]}x{im.size[0]}"
                )
            im = im.resize((w, h), resample_filter(resize))
        a = np.asarray(im, dtype=np.uint8)
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    return np.stack(out) if out else np.zeros((0, 1 if mode == "L" else 3, h, w), dtype=np.uint8)


__all__ = ["EXPECTED", "LAYOUTS", "PIXEL_SCALES", "pixel_batch", "resample_filter"]

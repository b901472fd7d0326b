"""Bin-exact one-byte storage of the studies' compact row confidences, and the rows files' two layouts (issue #31:
`benchmarks/results` under 15 MB).

    python -m benchmarks.studies.row_encoding FILE.npz [...]          # recode uint16 confidences in place
    python -m benchmarks.studies.row_encoding --pack FILE.npz [...]   # ... and write the packed layout

**What the rows are for.** The compact row arrays of protocols A, B (`method_study_v2a_compact/rows.npz`,
`method_study_v2_compact/rows.npz`) and C (`method_study_c/*_rows_*.npz`) hold, per evaluation run and task (key
prefix `P`), each labelled test row's top-label confidence (`P + "conf"`), its correctness (`P + "correct"`,
bit-packed), the labelled-row mask (`P + "keep"`, bit-packed) and `P + "n"` = [rows, labelled rows, K]. They
serve one purpose: the per-seed paired bootstrap of ECE differences, 15 equal-width bins
(`calib_core.metrics.binning`, float64 as the readers rebuild the rows). Two storages of the confidence, told
apart by its dtype (`decode_conf`):

- **uint16**: `u = rint(conf x 65535)`, read as `u / 65535` (the first form: ~14.7 bits of entropy a row, it
  does not compress);
- **uint8** (`encode_conf`): `q = bin x M + sub`, `bin` the 15-bin index (0-15; 15 holds 1.0 alone) that
  calib_core's own binning (`EvenBinner`) gives `u / 65535`, `sub` its sub-bin among M = `SUBBINS` equal parts of
  the bin (clipped to [0, M - 1]), plus `P + "binsum"`: per bin, the exact sum of the task's uint16 values in it
  (int64, 16 entries). A row reads as its sub-bin's centre plus its bin's offset `binsum / 65535 / n_bin - mean
  centre`, so every row keeps its 15-bin (checked on encoding with the library's binning: values sit exactly on
  k/15, since 65535 / 15 = 4369) and every bin's confidence sum is the uint16 one: the bootstrap's bin counts
  and correctness sums are exact, and in a resample each bin's confidence sum is off only by the resample's
  weights times within-bin errors of mean zero. A task whose decoded rows would leave their bin or move the
  readers' rebuilt top label (the confidence first, (1 - conf) / (K - 1) elsewhere: a decoded value below
  1 / K) stays uint16; none does in the studies' files.

**Why the offset, and why M = 4** (`python -m benchmarks.studies.row_encoding_check --subbins ...` prints every
claim row; a claim row's half-width is the median over 24 seeds of the 95 % percentile half-width of the paired
bootstrap ECE(method) - ECE(reference), 1000 resamples; below, the largest |change| over the 19 claim rows of
each protocol against the uint16 arrays, against the published value in brackets). Decoding at the sub-bin
centre alone shifts a bin's mean confidence (most top-bin rows sit in its upper sub-bin) by up to half a
sub-bin, and the shift scales with the resample's bin count, a first-order change of the interval: B 5.6e-4
(M = 4), 2.9e-4 (M = 8), 1.8e-4 (M = 17); A 2.3e-4, 1.6e-4, 9.3e-5. With the per-bin offset: B 1.23e-4
(1.37e-4) at M = 4, 7.3e-5 (2.1e-4) at M = 8; A 9.5e-5 at M = 2, 4.1e-5 (4.2e-5) at M = 4, 2.6e-5 (2.2e-5) at
M = 8. The uint16 arrays themselves (rounded from the runs' float32 confidences, which moves a few rows across a
bin edge) differ from the published B values by up to 2.35e-4 (A: 1.5e-5), so no storage of these arrays
reproduces every published B half-width to 1e-4. For scale: the bootstrap's own Monte Carlo error (1000
resamples, normal approximation) is ~5e-4 on one seed's B half-width and ~1.4e-4 on the median of 24, and the
half-widths are printed to 0.01 pt (1e-4). M = 4 rather than 8 keeps ~1.4 MB more room under the 15 MB budget
for protocol C to finish (A's packed file: 5.70 MB at M = 4, 6.61 MB at M = 8, 17.95 MB as uint16; B's: 0.68,
0.78, 3.36 MB; C's member files shrink to ~0.43 of their uint16 size).

**Layouts** (`read_rows` reads both; each gives the same {key: array} dict):

- *member*: one .npz member per array (`np.savez_compressed`), what the study writers append to;
- *packed* (`write_rows(..., packed=True)`, LZMA-compressed zip members, which `np.load` reads): every task's
  arrays concatenated (`_packed_conf8`, `_packed_conf16`, `_packed_correct`, `_packed_keep` bit-packed over all
  tasks, `_packed_n`, `_packed_binsum`), integer scalars (the `multitask` flags) in one array, the key order
  kept; for finished studies only (A, B), since it saves the ~350 bytes a member costs (~0.8 MB in A or B).
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

CONF_SCALE = 65535  # uint16 storage: rint(conf x 65535)
CONF_BINS = 15  # the studies' ECE bins
SUBBINS = 4  # uint8 storage: sub-bins per bin (M); at most 17 (15 M + 1 codes must fit a byte)
PACKED = "packed-tasks-v1"

__all__ = [
    "CONF_BINS",
    "CONF_SCALE",
    "SUBBINS",
    "Rows",
    "decode_conf",
    "encode_conf",
    "encode_task",
    "library_bins",
    "quantize_conf",
    "read_rows",
    "recode_arrays",
    "recode_file",
    "task_conf",
    "write_rows",
]


# ------------------------------------------------------------------------------------------
# the encoding
# ------------------------------------------------------------------------------------------
def library_bins(conf: np.ndarray) -> np.ndarray:
    """The 15-bin index (0-15) calib_core's even binning gives each float64 value (as the bootstrap bins them)."""
    import torch

    from calib_core.metrics.binning import EvenBinner

    binner = EvenBinner(CONF_BINS, [None], torch.float64, "cpu")
    v = torch.from_numpy(np.ascontiguousarray(conf, dtype=np.float64))
    return binner.sub_bin[binner.sub_index(v)].numpy()


def quantize_conf(conf: np.ndarray) -> np.ndarray:
    """uint16 storage of float confidences; new rows are encoded from it, so a file written now and a uint16 file
    recoded later hold the same codes."""
    return np.rint(np.asarray(conf, dtype=np.float64) * CONF_SCALE).astype(np.uint16)


def _centres(q: np.ndarray, m: int) -> np.ndarray:
    top = CONF_BINS * m
    return np.where(q >= top, 1.0, (q.astype(np.float64) + 0.5) / top)


def decode_conf(stored: np.ndarray, binsum: np.ndarray | None = None, m: int = SUBBINS) -> np.ndarray:
    """Float64 confidences from either storage: uint16 -> u / 65535; uint8 -> the sub-bin's centre, plus the bin's
    offset when its `binsum` (exact per-bin sums of the uint16 values) is given."""
    a = np.asarray(stored)
    if a.dtype == np.uint16:
        return a.astype(np.float64) / CONF_SCALE
    if a.dtype != np.uint8:
        raise TypeError(f"confidences stored as {a.dtype}: expected uint16 or uint8")
    c = _centres(a, m)
    if binsum is None or not len(a):
        return c
    b = np.minimum(a // m, CONF_BINS).astype(np.int64)
    n = np.bincount(b, minlength=CONF_BINS + 1)
    offset = (np.asarray(binsum, dtype=np.float64) / CONF_SCALE - np.bincount(b, c, CONF_BINS + 1)) / np.maximum(n, 1)
    return c + offset[b]


def encode_conf(u16: np.ndarray, m: int = SUBBINS) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes `bin x m + sub`, int64 per-bin sums of the uint16 values) of one task's uint16 confidences."""
    if not 1 <= m <= 17:
        raise ValueError(f"sub-bins per bin must be 1-17 to fit a byte, got {m}")
    u = np.asarray(u16)
    if u.dtype != np.uint16:
        raise TypeError(f"expected uint16 confidences, got {u.dtype}")
    v = u.astype(np.float64) / CONF_SCALE
    b = library_bins(v).astype(np.int64)
    sub = np.clip(np.floor(v * (CONF_BINS * m)).astype(np.int64) - b * m, 0, m - 1)
    q = np.where(b >= CONF_BINS, CONF_BINS * m, b * m + sub).astype(np.uint8)
    binsum = np.bincount(b, u.astype(np.float64), CONF_BINS + 1).round().astype(np.int64)
    return q, binsum


def _top_first(conf: np.ndarray, k: int) -> np.ndarray:
    """Whether the readers' rebuilt row [conf, (1 - conf) / (K - 1), ...] has its first argmax at column 0."""
    return conf >= (1.0 - conf) / (k - 1)


def encode_task(u16: np.ndarray, k: int, m: int = SUBBINS) -> dict[str, np.ndarray]:
    """One task's stored confidence arrays, {"conf": uint8 codes, "binsum": per-bin sums}, or {"conf": the uint16
    values unchanged} if a decoded row would leave its 15-bin or move the rebuilt top label."""
    u = np.asarray(u16)
    q, binsum = encode_conf(u, m)
    c = decode_conf(q, binsum, m)
    if np.array_equal(library_bins(c), library_bins(decode_conf(u))) and (
        k < 2 or np.array_equal(_top_first(c, k), _top_first(decode_conf(u), k))
    ):
        return {"conf": q, "binsum": binsum}
    return {"conf": u}


def task_conf(z: Any, prefix: str, m: int = SUBBINS) -> np.ndarray:
    """The float64 confidences of task `prefix` in a rows mapping (`read_rows`, an `np.load` file, a dict)."""
    files = z.files if hasattr(z, "files") else list(z)
    return decode_conf(z[f"{prefix}conf"], z[f"{prefix}binsum"] if f"{prefix}binsum" in files else None, m)


def recode_arrays(arrays: dict[str, np.ndarray], m: int = SUBBINS) -> dict[str, int]:
    """Recode, in the dict (key order kept, `binsum` right after its `conf`), every uint16 `P + "conf"` array whose
    `P + "n"` names K; return counts."""
    counts = {"recoded": 0, "kept_uint16": 0, "already_uint8": 0}
    out: dict[str, np.ndarray] = {}
    for key, a in arrays.items():
        if key.endswith("binsum") and key in out:
            continue
        out[key] = a
        if not key.endswith("conf") or a.dtype == np.uint8:
            counts["already_uint8"] += int(key.endswith("conf"))
            continue
        prefix = key[: -len("conf")]
        if a.dtype != np.uint16 or f"{prefix}n" not in arrays:
            raise ValueError(f"{key}: {a.dtype} confidences without a sibling {prefix}n")
        enc = encode_task(a, int(arrays[f"{prefix}n"][2]), m)
        out[key] = enc["conf"]
        if "binsum" in enc:
            out[f"{prefix}binsum"] = enc["binsum"]
        counts["recoded" if "binsum" in enc else "kept_uint16"] += 1
    arrays.clear()
    arrays.update(out)
    return counts


# ------------------------------------------------------------------------------------------
# the two layouts
# ------------------------------------------------------------------------------------------
class Rows(Mapping[str, np.ndarray]):
    """A rows file's arrays by key, whichever layout it has (`.files` lists the keys, as `np.load` does)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._d = arrays
        self.files = list(arrays)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __enter__(self) -> Rows:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _tasks(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Prefixes P of the complete tasks (P + conf, correct, keep, n) in key order."""
    return [
        k[: -len("conf")]
        for k, a in arrays.items()
        if k.endswith("conf")
        and a.dtype in (np.uint8, np.uint16)
        and all(k[: -len("conf")] + s in arrays for s in ("correct", "keep", "n"))
    ]


def _pack(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tasks = _tasks(arrays)
    task_keys = {p + s for p in tasks for s in ("conf", "correct", "keep", "n", "binsum")}
    n = np.stack([np.asarray(arrays[p + "n"], dtype=np.int64) for p in tasks]) if tasks else np.zeros((0, 3), np.int64)
    wide = np.array([arrays[p + "conf"].dtype == np.uint16 for p in tasks], dtype=bool)
    has_sum = np.array([p + "binsum" in arrays for p in tasks], dtype=bool)
    scalars = [k for k, a in arrays.items() if k not in task_keys and a.shape == () and a.dtype == np.int64]
    out: dict[str, np.ndarray] = {
        "_packed_layout": np.array(PACKED),
        "_packed_keys": np.array(list(arrays)),
        "_packed_tasks": np.array(tasks),
        "_packed_n": n,
        "_packed_wide": wide,
        "_packed_has_binsum": has_sum,
        "_packed_binsum": np.stack([arrays.get(p + "binsum", np.zeros(CONF_BINS + 1, np.int64)) for p in tasks])
        if tasks
        else np.zeros((0, CONF_BINS + 1), np.int64),
        "_packed_conf8": np.concatenate(
            [arrays[p + "conf"] for p, w in zip(tasks, wide) if not w] or [np.zeros(0, np.uint8)]
        ),
        "_packed_conf16": np.concatenate(
            [arrays[p + "conf"] for p, w in zip(tasks, wide) if w] or [np.zeros(0, np.uint16)]
        ),
        "_packed_correct": np.packbits(
            np.concatenate(
                [np.unpackbits(arrays[p + "correct"], count=int(r[1])) for p, r in zip(tasks, n)] or [[]]
            ).astype(np.uint8)
        ),
        "_packed_keep": np.packbits(
            np.concatenate(
                [np.unpackbits(arrays[p + "keep"], count=int(r[0])) for p, r in zip(tasks, n)] or [[]]
            ).astype(np.uint8)
        ),
        "_packed_scalar_keys": np.array(scalars),
        "_packed_scalar_values": np.array([int(arrays[k]) for k in scalars], dtype=np.int64),
    }
    for k, a in arrays.items():
        if k not in task_keys and k not in scalars:
            if k.startswith("_packed_"):
                raise ValueError(f"{k}: reserved name")
            out[k] = a
    return out


def _unpack(z: Any) -> dict[str, np.ndarray]:
    tasks = [str(p) for p in z["_packed_tasks"]]
    n, wide, has_sum, binsum = z["_packed_n"], z["_packed_wide"], z["_packed_has_binsum"], z["_packed_binsum"]
    conf8, conf16 = z["_packed_conf8"], z["_packed_conf16"]
    correct = np.unpackbits(z["_packed_correct"], count=int(n[:, 1].sum()) if len(n) else 0)
    keep = np.unpackbits(z["_packed_keep"], count=int(n[:, 0].sum()) if len(n) else 0)
    got: dict[str, np.ndarray] = {}
    i8 = i16 = ic = ik = 0
    for t, p in enumerate(tasks):
        n_all, n_kept = int(n[t, 0]), int(n[t, 1])
        if wide[t]:
            got[p + "conf"], i16 = conf16[i16 : i16 + n_kept], i16 + n_kept
        else:
            got[p + "conf"], i8 = conf8[i8 : i8 + n_kept], i8 + n_kept
        got[p + "correct"], ic = np.packbits(correct[ic : ic + n_kept]), ic + n_kept
        got[p + "keep"], ik = np.packbits(keep[ik : ik + n_all]), ik + n_all
        got[p + "n"] = n[t].copy()
        if has_sum[t]:
            got[p + "binsum"] = binsum[t].copy()
    for k, v in zip(z["_packed_scalar_keys"], z["_packed_scalar_values"], strict=True):
        got[str(k)] = np.array(v, dtype=np.int64)
    order = [str(k) for k in z["_packed_keys"]]
    for k in z.files:
        if not k.startswith("_packed_"):
            got[k] = z[k]
            if k not in order:  # appended by a writer that knows only the member layout
                order.append(k)
    return {k: got[k] for k in order}


def is_packed(path: Path) -> bool:
    with np.load(path, allow_pickle=False) as z:
        return "_packed_layout" in z.files


def read_rows(path: Path) -> Rows:
    """Every array of a rows file, in memory, by key (the member layout's keys, whichever layout is on disk)."""
    with np.load(path, allow_pickle=False) as z:
        if "_packed_layout" in z.files:
            if str(z["_packed_layout"]) != PACKED:
                raise ValueError(f"{path}: unknown rows layout {str(z['_packed_layout'])!r}")
            return Rows(_unpack(z))
        return Rows({k: z[k] for k in z.files})


def rows_bytes(arrays: Mapping[str, np.ndarray], packed: bool = False) -> bytes:
    """A rows file's bytes: the member layout as `np.savez_compressed` writes it, or the packed layout (LZMA)."""
    buf = io.BytesIO()
    if not packed:
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_LZMA) as zf:
        for k, a in _pack(dict(arrays)).items():
            info = zipfile.ZipInfo(k + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_LZMA
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(a), allow_pickle=False)
    return buf.getvalue()


def write_rows(path: Path, arrays: Mapping[str, np.ndarray], packed: bool = False) -> None:
    """Write a rows file atomically: a temporary file beside it, then renamed over it."""
    path = Path(path)
    data = rows_bytes(arrays, packed)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, (path.stat().st_mode if path.exists() else 0o644) & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def recode_file(path: Path, pack: bool | None = None, m: int = SUBBINS) -> dict[str, Any]:
    """Recode a rows file's uint16 confidences in place (atomic write), keeping its layout unless `pack` says which;
    returns counts and the sizes before and after. Reading the result gives the same arrays but the recoded
    confidences (and their `binsum`)."""
    path = Path(path)
    before = path.stat().st_size
    was_packed = is_packed(path)
    arrays = dict(read_rows(path))
    counts = recode_arrays(arrays, m)
    packed = was_packed if pack is None else pack
    if counts["recoded"] or packed != was_packed:
        write_rows(path, arrays, packed)
    return {**counts, "packed": packed, "bytes_before": before, "bytes_after": path.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("files", nargs="+", type=Path, help="rows .npz files to recode in place")
    p.add_argument("--pack", action="store_true", help="write the packed layout (finished studies only)")
    a = p.parse_args(argv)
    for f in a.files:
        r = recode_file(f, True if a.pack else None)
        print(f"{f}: {r['bytes_before']:,} -> {r['bytes_after']:,} bytes; {r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

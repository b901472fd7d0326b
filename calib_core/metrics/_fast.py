"""Compiled CPU kernels (numba) for the two passes that dominate large CPU inputs.

Used only for CPU tensors of at least :data:`FAST_MIN_ELEMENTS` values; smaller inputs,
other devices and every error case take the plain torch path, so error messages and the
numbers are the same either way (tests/unit/calib_core/test_metrics_fast.py checks both paths agree).

* :func:`scan_rows` validates an (N, K) probability matrix *and* finds each row's
  confidence and first argmax in one read of the matrix. The vectorised torch path needs
  three reads (min/max, row sums, argmax) and the argmax alone costs more than the other
  two together. For float32 the first argmax comes from an int64 max over the keys
  ``(bits << 32) | (K - 1 - j)``, which vectorises; float64 rows are searched for their max
  while still in L1. Values are compared through their IEEE bit patterns as integers: for
  non-negative floats the integer order is the float order, integer max/min vectorise, and
  any negative number, -0.0, NaN or inf shows up as a bit pattern outside
  ``[0, bits(1.0)]``, which sends the input to the torch path (which names the problem).
* :func:`even_histogram` (1-D values) and :func:`even_histogram_2d` (every entry of a
  matrix, per column or pooled) are the bucketize + bincount of even binning in one loop,
  each thread filling its own partial bins; the float64 sums equal the torch path's up to
  the order of additions.
* :func:`adaptive_columns` gives class-conditional adaptive-bin statistics of a float32
  matrix without sorting its columns: per column, a histogram of the values' top 16 bits
  (count and float64 sum per bucket) locates each equal-mass edge's bucket by cumulative
  counts; only those buckets are gathered and sorted to read the edges exactly, and every
  other bucket lies wholly inside one bin. Same edges, counts and correctness counts as
  the sort path; sums up to the order of float64 additions.

Parallelism: the row range is split over ``torch.get_num_threads()`` Python threads (the
kernels release the GIL), not numba's own thread pool, so concurrent callers are safe and
the thread budget a trial sets for torch also bounds these kernels.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: Matrices with fewer values than this use the torch path (no compile cost for small data).
FAST_MIN_ELEMENTS = 1 << 18
#: The same for the 1-D values of :func:`even_histogram`.
FAST_MIN_VALUES = 1 << 16

#: Below this many rows per thread, splitting over threads costs more than it saves.
_MIN_ROWS_PER_THREAD = 1 << 14

_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_ONE_BITS = {
    np.dtype(np.float32): int(np.float32(1.0).view(np.int32)),
    np.dtype(np.float64): int(np.float64(1.0).view(np.int64)),
}

#: Set to 1 to keep every input on the torch path (e.g. to rule the kernels out when debugging).
DISABLE_ENV = "CALIB_METRICS_NO_JIT"

_kernels: dict[str, Callable] | None = None
_enabled = os.environ.get(DISABLE_ENV, "").strip().lower() not in ("1", "true", "yes")


def set_enabled(flag: bool) -> bool:
    """Turn the compiled path on or off (tests compare both); returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


def _njit(fn: Callable, **opts) -> Callable:
    import numba

    try:
        return numba.njit(nogil=True, cache=True, **opts)(fn)
    except RuntimeError:  # no writable cache location (read-only image): compile per process
        return numba.njit(nogil=True, cache=False, **opts)(fn)


def _build() -> dict[str, Callable] | None:
    """Compile (or load from numba's cache) the kernels; None when numba is unavailable."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return None

    # reassoc lets LLVM vectorise the row sum; no nnan/ninf, so NaN and inf still propagate
    fast = {"reassoc", "nsz", "arcp", "contract"}

    def scan_search(p, bits, tol, conf, pred, lo, hi):
        k = p.shape[1]
        gmin = np.int64(bits[lo, 0])
        gmax = np.int64(bits[lo, 0])
        off = 0
        for i in range(lo, hi):
            s = 0.0
            mx = bits[i, 0]
            mn = bits[i, 0]
            for j in range(k):
                s += p[i, j]
                b = bits[i, j]
                mx = max(mx, b)
                mn = min(mn, b)
            idx = 0
            for j in range(k):  # the row is in L1 now; first maximal index, like np.argmax
                if bits[i, j] == mx:
                    idx = j
                    break
            conf[i] = p[i, idx]
            pred[i] = idx
            if not abs(s - 1.0) <= tol:  # written so that a NaN sum counts as off
                off += 1
            gmin = min(gmin, np.int64(mn))
            gmax = max(gmax, np.int64(mx))
        return gmin, gmax, off

    def scan_key32(p, bits, tol, conf, pred, lo, hi):
        # float32 only: the key (bits << 32) | (K - 1 - j) has its maximum at the row's first
        # maximal entry, and an int64 max reduction vectorises where a search loop cannot
        k = p.shape[1]
        gmin = np.int64(bits[lo, 0])
        gmax = np.int64(bits[lo, 0])
        off = 0
        for i in range(lo, hi):
            s = 0.0
            key = np.int64(-1) << 62
            mn = bits[i, 0]
            for j in range(k):
                s += p[i, j]
                b = bits[i, j]
                key = max(key, (np.int64(b) << 32) | np.int64(k - 1 - j))
                mn = min(mn, b)
            idx = k - 1 - (key & 0xFFFFFFFF)
            conf[i] = p[i, idx]
            pred[i] = idx
            if not abs(s - 1.0) <= tol:  # written so that a NaN sum counts as off
                off += 1
            gmin = min(gmin, np.int64(mn))
            gmax = max(gmax, key >> 32)
        return gmin, gmax, off

    def hist(values, bounds, groups, num_sub, flags, counts, sums, flag_sums, lo, hi):
        nb = bounds.shape[0]
        grouped = groups.shape[0] > 0
        flagged = flags.shape[0] > 0
        for i in range(lo, hi):
            v = values[i]
            slot = 0
            for b in range(nb):  # number of boundaries <= v (bucketize right=True); branch-free
                slot += bounds[b] <= v
            if grouped:
                slot += groups[i] * num_sub
            counts[slot] += 1.0
            sums[slot] += v
            if flagged:
                flag_sums[slot] += flags[i]
        return 0

    def hist2d(p, bounds, num_sub, columns, counts, sums, lo, hi):
        k = p.shape[1]
        nb = bounds.shape[0]
        for i in range(lo, hi):
            for j in range(k):
                v = p[i, j]
                slot = 0
                for b in range(nb):
                    slot += bounds[b] <= v
                if columns:
                    slot += j * num_sub
                counts[slot] += 1.0
                sums[slot] += v
        return 0

    def aurc_reps(w, order, err, first, out, lo, hi):
        # one pass per resample down the confidence order; a tie block's rows are accepted
        # together, so when its lowest entry is reached the block adds its weight times the
        # error rate of every row at least as confident (one division per block)
        n = order.shape[0]
        wrow = np.empty(w.shape[1])
        for b in range(lo, hi):
            for i in range(w.shape[1]):  # a sequential copy first: gathers from memory would miss
                wrow[i] = w[b, i]
            acc = 0.0
            errs = 0.0
            total = 0.0
            bw = 0.0
            be = 0.0
            for i in range(n - 1, -1, -1):
                wi = wrow[order[i]]
                bw += wi
                be += wi * err[i]
                if first[i] == i:  # the block is complete; an undrawn block adds 0
                    acc += bw
                    errs += be
                    total += bw * errs / max(acc, 1.0)
                    bw = 0.0
                    be = 0.0
            out[b] = total / acc
        return 0

    def adaptive_cols(bits, tbits, tvals, nb, cnt, sums, edges, lo, hi):
        # adaptive bins of columns lo..hi-1 of a float32 (N, K) matrix, each column its own group,
        # without sorting a column: the columns are copied W at a time into contiguous rows; per
        # column a histogram of the top 16 bits (sign, exponent, 7 mantissa bits) gives each
        # bucket's count and float64 sum and, by cumulative counts, the bucket holding each
        # edge's sorted rank; only those buckets (and each threshold's) are gathered and sorted.
        # Every other bucket lies wholly inside one bin. Returns 1 (nothing written for the
        # column) on a value outside [0, 1] by its bits (e.g. -0.0), for the sort path to serve.
        n = bits.shape[0]
        nt = tbits.shape[0]
        ne = nb - 1
        width = 16
        nbk = (0x3F800000 >> 16) + 1
        tile = 256
        bblk = np.empty((width, n), np.int32)
        hc = np.zeros(nbk, np.int32)
        hs = np.zeros(nbk)
        cum = np.zeros(nbk + 1, np.int64)
        slot = np.full(nbk, -1, np.int32)
        t0 = tbits[0] if nt > 0 else -1
        t1 = tbits[1] if nt > 1 else -1
        buf = np.empty(n, np.float32)
        ms = nt * (ne + 1)
        seg_b = np.empty(ms, np.int64)
        seg_s = np.empty(ms + 1, np.int64)
        seg_f = np.empty(ms, np.int64)
        seg_sort = np.zeros(ms, np.bool_)
        le = np.zeros(nt, np.int64)
        rk = np.empty((nt, max(ne, 1)), np.int64)
        eb = np.empty((nt, max(ne, 1)), np.int64)
        for b0 in range(lo, hi, width):
            w = min(width, hi - b0)
            for i0 in range(0, n, tile):  # transposed in tiles that stay in L1
                i1 = min(n, i0 + tile)
                for j in range(w):
                    for i in range(i0, i1):
                        bblk[j, i] = bits[i, b0 + j]
            for j in range(w):
                col = b0 + j
                bv = bblk[j]
                v = bv.view(np.float32)
                le0 = 0
                le1 = 0
                for i in range(n):
                    b = bv[i]
                    if np.uint32(b) > np.uint32(0x3F800000):  # checked before indexing: -0.0, NaN, > 1
                        return 1
                    hc[b >> 16] += 1
                    hs[b >> 16] += v[i]
                    le0 += b <= t0  # the first two thresholds in registers
                    le1 += b <= t1
                le[0] = le0
                if nt > 1:
                    le[1] = le1
                for t in range(2, nt):
                    le[t] = 0
                    for i in range(n):
                        le[t] += bv[i] <= tbits[t]
                ulo = 0
                while hc[ulo] == 0:
                    ulo += 1
                uhi = nbk
                while hc[uhi - 1] == 0:
                    uhi -= 1  # buckets ulo..uhi-1 hold the column
                for u in range(ulo + 1):
                    cum[u] = 0
                for u in range(ulo, uhi):
                    cum[u + 1] = cum[u] + hc[u]
                for u in range(uhi, nbk):
                    cum[u + 1] = n
                nseg = 0
                for t in range(nt):
                    start = le[t]
                    kept = n - start
                    step = kept / nb
                    for e in range(ne):
                        off = min(np.round((e + 1) * step), kept - 1.0)
                        r = min(start + max(np.int64(off), 0), n - 1)
                        u = np.searchsorted(cum, r, side="right") - 1  # cum[u] <= r < cum[u + 1]
                        rk[t, e] = r
                        eb[t, e] = u
                        if slot[u] < 0:
                            slot[u] = nseg
                            seg_b[nseg] = u
                            seg_sort[nseg] = False
                            nseg += 1
                        seg_sort[slot[u]] = True
                    if tbits[t] >= 0:
                        u = tbits[t] >> 16
                        if slot[u] < 0 and hc[u] > 0:
                            slot[u] = nseg
                            seg_b[nseg] = u
                            seg_sort[nseg] = False
                            nseg += 1
                seg_s[0] = 0
                for s in range(nseg):
                    seg_s[s + 1] = seg_s[s] + hc[seg_b[s]]
                    seg_f[s] = seg_s[s]
                for i in range(n):
                    s = slot[bv[i] >> 16]
                    if s >= 0:
                        buf[seg_f[s]] = v[i]
                        seg_f[s] += 1
                for s in range(nseg):
                    if seg_sort[s]:
                        buf[seg_s[s] : seg_s[s + 1]].sort()
                for t in range(nt):
                    for e in range(ne):
                        u = eb[t, e]
                        edges[t, col, e] = buf[seg_s[slot[u]] + rk[t, e] - cum[u]]
                    # buckets without an edge or a threshold lie inside one bin: after the
                    # edges of lower buckets, and dropped when below the threshold's bucket
                    tb = tbits[t] >> 16 if tbits[t] >= 0 else -1
                    e = 0
                    for u in range(max(tb + 1, ulo), uhi):
                        if hc[u] == 0 or slot[u] >= 0:
                            continue
                        while e < ne and eb[t, e] < u:
                            e += 1
                        cnt[t, col, e] += hc[u]
                        sums[t, col, e] += hs[u]
                    for i in range(seg_s[nseg]):
                        x = buf[i]
                        if x > tvals[t]:
                            e = 0
                            while e < ne and edges[t, col, e] <= x:
                                e += 1
                            cnt[t, col, e] += 1.0
                            sums[t, col, e] += x
                for s in range(nseg):
                    slot[seg_b[s]] = -1
                hc[ulo:uhi] = 0
                hs[ulo:uhi] = 0.0
        return 0

    def adaptive_correct(p_true, labels, edges, tvals, out):
        # correctness sums of class-conditional adaptive bins: row i counts in its label's group
        nt, _, ne = edges.shape
        for i in range(p_true.shape[0]):
            c = labels[i]
            x = p_true[i]
            for t in range(nt):
                if x > tvals[t]:
                    e = 0
                    while e < ne and edges[t, c, e] <= x:
                        e += 1
                    out[t, c, e] += 1.0
        return 0

    def even_reps(w, sub, v, corr_col, cnt, sums, cor, lo, hi):
        # per resample b: each drawn row adds its count to its sub-bin in every column, its
        # weighted value to the sums, and to the correctness sums of the column it is correct in
        n, c = sub.shape
        for b in range(lo, hi):
            for i in range(n):
                wi = np.float64(w[b, i])
                if c >= 4 and wi == 0.0:  # skipping undrawn rows pays only for several columns
                    continue
                for j in range(c):
                    s = sub[i, j]
                    cnt[b, j, s] += wi
                    sums[b, j, s] += wi * v[i, j]
                cc = corr_col[i]
                if cc >= 0:
                    cor[b, cc, sub[i, cc]] += wi
        return 0

    def adaptive_all(w, order, v, c, tie_start, starts, nb, out_cnt, out_sum, out_cor, lo, hi):
        # per resample b and group k, along the group's fixed sorted order: sums of weights,
        # weighted values and weighted correctness per block of L entries (vectorised
        # reductions), their prefix sums, then for each threshold the equal-mass edge positions
        # by binary search over the block prefixes and a scan inside one block; the bin
        # statistics are differences of prefix sums at the bounds: O(N + bins L) per resample
        # and group, no pass per threshold and no sort
        g, n = order.shape
        nt = starts.shape[1]
        L = 32
        nblk = (n + L - 1) // L
        bw = np.empty(nblk + 1)
        bs = np.empty(nblk + 1)
        bc = np.empty(nblk + 1)
        bounds = np.empty(nb + 1, np.int64)
        pw = np.empty(nb + 1)
        ps = np.empty(nb + 1)
        pc = np.empty(nb + 1)
        wrow = np.empty(w.shape[1])
        gc = 4  # groups per sweep over the resamples: their sorted arrays stay in L2
        for g0 in range(0, g, gc):
            for b in range(lo, hi):
                for i in range(w.shape[1]):  # a sequential copy first: gathers from memory would miss
                    wrow[i] = w[b, i]
                for k in range(g0, min(g, g0 + gc)):
                    ok = order[k]
                    vk = v[k]
                    ck = c[k]
                    bw[0] = 0.0
                    bs[0] = 0.0
                    bc[0] = 0.0
                    for blk in range(nblk):
                        sw = 0.0
                        sv = 0.0
                        sc = 0.0
                        base = blk * L
                        if base + L <= n:
                            for r in range(32):  # a constant trip count: unrolled and vectorised
                                wi = wrow[ok[base + r]]
                                sw += wi
                                sv += wi * vk[base + r]
                                sc += wi * ck[base + r]
                        else:
                            for i in range(base, n):
                                wi = wrow[ok[i]]
                                sw += wi
                                sv += wi * vk[i]
                                sc += wi * ck[i]
                        bw[blk + 1] = bw[blk] + sw
                        bs[blk + 1] = bs[blk] + sv
                        bc[blk + 1] = bc[blk] + sc
                    total = bw[nblk]
                    for t in range(nt):
                        s0 = starts[k, t]
                        # weight before s0: block prefix plus the start of s0's block
                        before = bw[s0 // L]
                        for i in range((s0 // L) * L, s0):
                            before += wrow[ok[i]]
                        kept = total - before
                        if kept <= 0.0:
                            continue
                        step = kept / nb
                        bounds[0] = s0
                        for j in range(1, nb):
                            q = min(np.round(j * step), kept - 1.0) + before  # round half to even, as numpy
                            # entry holding resample position q: the first with cumulative weight > q
                            blk = np.searchsorted(bw, q, side="right") - 1  # bw[blk] <= q < bw[blk + 1]
                            cum = bw[blk]
                            src = blk * L
                            while True:
                                cum += wrow[ok[src]]
                                if cum > q:
                                    break
                                src += 1
                            bounds[j] = tie_start[k, src]  # values equal to an edge belong to the bin above
                        bounds[nb] = n
                        for j in range(nb + 1):  # prefix sums at each bound
                            p = bounds[j]
                            blk = p // L
                            sw = bw[blk]
                            sv = bs[blk]
                            sc = bc[blk]
                            for i in range(blk * L, p):
                                wi = wrow[ok[i]]
                                sw += wi
                                sv += wi * vk[i]
                                sc += wi * ck[i]
                            pw[j] = sw
                            ps[j] = sv
                            pc[j] = sc
                        for j in range(nb):
                            out_cnt[t, k, b, j] = pw[j + 1] - pw[j]
                            out_sum[t, k, b, j] = ps[j + 1] - ps[j]
                            out_cor[t, k, b, j] = pc[j + 1] - pc[j]
        return 0

    def bin_errors(cnt, sums, cor, bin_of, keep, nbins, norm, out):
        # per row m: sub-bin statistics collapsed into bins (sub-bin s -> bin_of[s] when
        # keep[s]), then the calibration error of binning.group_errors (0: l1, 1: l2, 2: max)
        m_rows, s_sub = cnt.shape
        bc = np.empty(nbins)
        bd = np.empty(nbins)
        for m in range(m_rows):
            bc[:] = 0.0
            bd[:] = 0.0
            for s in range(s_sub):
                if keep[s]:
                    bc[bin_of[s]] += cnt[m, s]
                    bd[bin_of[s]] += cor[m, s] - sums[m, s]
            n = 0.0
            err = 0.0
            for j in range(nbins):
                n += bc[j]
                if norm == 0:
                    err += abs(bd[j])
                elif bc[j] > 0.0:
                    if norm == 1:
                        err += bd[j] * bd[j] / bc[j]
                    else:
                        err = max(err, abs(bd[j]) / bc[j])
            if n <= 0.0:
                out[m] = 0.0
            elif norm == 2:
                out[m] = err
            else:
                out[m] = err / n
        return 0

    return {
        "scan64": _njit(scan_search, fastmath=fast),
        "scan32": _njit(scan_key32, fastmath=fast),
        "hist": _njit(hist),
        "hist2d": _njit(hist2d),
        "aurc_reps": _njit(aurc_reps),
        "adaptive_cols": _njit(adaptive_cols),
        "bin_errors": _njit(bin_errors),
        "even_reps": _njit(even_reps),
        "adaptive_all": _njit(adaptive_all, fastmath=fast),
        "adaptive_correct": _njit(adaptive_correct),
    }


_build_lock = threading.Lock()


def _get() -> dict[str, Callable] | None:
    global _kernels
    if _kernels is None:
        with _build_lock:
            if _kernels is None:
                _kernels = _build() or {}
    return _kernels or None


def _kernel(name: str) -> Callable:
    """The compiled kernel ``name``; callers check :func:`usable` first, so missing kernels
    (numba unavailable) are a programming error here."""
    kernels = _get()
    if kernels is None:
        raise RuntimeError(f"compiled metric kernel {name!r} requested but numba kernels are unavailable")
    return kernels[name]


def usable(t: Tensor, min_elements: int | None = None) -> bool:
    """True when ``t`` has at least ``min_elements`` values (default :data:`FAST_MIN_ELEMENTS`),
    is a contiguous float32/float64 CPU tensor, and the kernels exist."""
    least = FAST_MIN_ELEMENTS if min_elements is None else min_elements
    return (
        _enabled
        and t.device.type == "cpu"
        and t.dtype in (torch.float32, torch.float64)
        and t.numel() >= least
        and t.is_contiguous()
        and _get() is not None
    )


_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _split(kernel: Callable, n: int, args: Callable[[int], tuple], min_rows: int = _MIN_ROWS_PER_THREAD) -> list:
    """Run ``kernel(*args(t), lo, hi)`` on consecutive row ranges, one per thread, in parallel.

    ``args(t)`` gives the arguments of the t-th range (so each can write its own partial
    results). Ranges follow ``torch.get_num_threads()``; results come back in range order.
    """
    global _pool, _pool_pid
    threads = max(1, min(torch.get_num_threads(), n // min_rows))
    cuts = [n * t // threads for t in range(threads + 1)]
    if threads == 1:
        return [kernel(*args(0), 0, n)]
    with _pool_lock:
        # a forked child inherits the pool object but not its threads: make a new one there
        if _pool is None or _pool_pid != os.getpid() or _pool._max_workers < threads:
            _pool = ThreadPoolExecutor(max(threads, 2), thread_name_prefix="calib-metrics")
            _pool_pid = os.getpid()
        pool = _pool
    futures = [pool.submit(kernel, *args(t), cuts[t], cuts[t + 1]) for t in range(threads)]
    return [f.result() for f in futures]


@dataclass
class RowScan:
    """One read of an (N, K) matrix: the top label of each row and whether the matrix is a
    valid probability matrix (every value a non-negative float <= 1, so no -0.0, NaN or inf,
    and every row sum, accumulated in float64, within the tolerance of 1)."""

    conf: Tensor
    pred: Tensor
    valid: bool


def scan_rows(p: Tensor, row_sum_tol: float) -> RowScan:
    """Confidence and first argmax of each row, and the validity check, in one pass."""
    arr = p.numpy()
    scan = _kernel("scan32" if arr.dtype == np.float32 else "scan64")
    n = arr.shape[0]
    bits = arr.view(_BITS[arr.dtype])
    conf = np.empty(n, dtype=arr.dtype)
    pred = np.empty(n, dtype=np.int64)
    parts = _split(scan, n, lambda t: (arr, bits, row_sum_tol, conf, pred))
    lo = min(int(part[0]) for part in parts)
    hi = max(int(part[1]) for part in parts)
    rows_off = sum(int(part[2]) for part in parts)
    valid = lo >= 0 and hi <= _ONE_BITS[arr.dtype] and rows_off == 0
    return RowScan(torch.from_numpy(conf), torch.from_numpy(pred), valid)


def _threaded_sums(kernel: Callable, n: int, sizes: list[int], args: Callable[[int], tuple]) -> list[np.ndarray]:
    """Run ``kernel(*args(t), *partials_t, lo, hi)`` over row ranges, each thread adding into
    its own zeroed float64 arrays of the given sizes; return those arrays summed over threads."""
    threads = max(1, torch.get_num_threads())
    partials = [np.zeros((threads, size), dtype=np.float64) for size in sizes]
    _split(kernel, n, lambda t: (*args(t), *(a[t] for a in partials)))
    return [a.sum(axis=0) for a in partials]


def even_histogram(
    values: Tensor, boundaries: Tensor, groups: Tensor | None, num_groups: int, flags: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per-(group, sub-bin) counts, value sums and flag sums (float64, shape (G, S)), where a
    value's sub-bin is the number of ``boundaries`` <= it. Same numbers as bucketize + bincount
    up to the order of float64 additions (each thread sums its own range, then ranges add up)."""
    num_sub = boundaries.numel() + 1
    size = num_groups * num_sub
    g = groups.numpy().astype(np.int64, copy=False) if groups is not None else np.empty(0, dtype=np.int64)
    f = flags.numpy().view(np.uint8) if flags is not None else np.empty(0, dtype=np.uint8)
    v, b = values.numpy(), boundaries.numpy()
    counts, sums, flag_sums = _threaded_sums(
        _kernel("hist"), v.shape[0], [size, size, size if flags is not None else 0], lambda t: (v, b, g, num_sub, f)
    )
    view = (num_groups, num_sub)
    out_flags = torch.from_numpy(flag_sums).view(view) if flags is not None else None
    return torch.from_numpy(counts).view(view), torch.from_numpy(sums).view(view), out_flags


def even_histogram_2d(probs: Tensor, boundaries: Tensor, columns: bool) -> tuple[Tensor, Tensor]:
    """Counts and value sums per (column or pooled group, sub-bin) over every entry of an
    (N, K) matrix, float64, shape (K or 1, S). Same numbers as the torch path's chunked
    bucketize + bincount up to the order of float64 additions."""
    arr, b = probs.numpy(), boundaries.numpy()
    num_sub = b.shape[0] + 1
    groups = arr.shape[1] if columns else 1
    counts, sums = _threaded_sums(
        _kernel("hist2d"), arr.shape[0], [groups * num_sub] * 2, lambda t: (arr, b, num_sub, columns)
    )
    view = (groups, num_sub)
    return torch.from_numpy(counts).view(view), torch.from_numpy(sums).view(view)


def aurc_replicates(w: Tensor, order: Tensor, err: Tensor, first: Tensor) -> Tensor:
    """Bootstrap replicates (B,) of AURC from confidence order, errors and tie-block starts."""
    wn = w.numpy()
    out = np.zeros(wn.shape[0])
    args = (wn, order.numpy(), err.numpy().astype(np.float64), first.numpy(), out)
    _split(_kernel("aurc_reps"), wn.shape[0], lambda t: args, min_rows=8)
    return torch.from_numpy(out)


def adaptive_columns(
    probs: Tensor, p_true: Tensor, labels: Tensor, thresholds: list[float], num_bins: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None:
    """Class-conditional adaptive-bin statistics of every column of a float32 (N, K) matrix.

    ``thresholds`` are floored thresholds (values kept when > t; -inf keeps all). Returns
    (counts, sums, correct, edges, kept), shapes (T, K, B) float64 x 3, (T, K, B - 1) float32,
    (T, K) int64 -- the numbers of the sort path (bins by the same edges, so the same counts;
    sums up to the order of float64 additions) -- or None when a value's bits are outside
    [0, 1] (the sort path then serves).
    """
    arr = probs.numpy()
    n, k = arr.shape
    nt = len(thresholds)
    tv = np.asarray(thresholds, dtype=np.float64)
    tb = np.array([-1 if t == -np.inf else int(np.float32(t).view(np.int32)) for t in thresholds], dtype=np.int32)
    cnt = np.zeros((nt, k, num_bins))
    sums = np.zeros((nt, k, num_bins))
    edges = np.zeros((nt, k, num_bins - 1), dtype=np.float32)
    bits = arr.view(np.int32)
    bad = _split(_kernel("adaptive_cols"), k, lambda t: (bits, tb, tv, num_bins, cnt, sums, edges), min_rows=1)
    if any(bad):
        return None
    corr = np.zeros((nt, k, num_bins))
    _kernel("adaptive_correct")(p_true.numpy(), labels.numpy(), edges, tv, corr)
    kept = np.rint(cnt.sum(axis=2)).astype(np.int64)
    return (
        torch.from_numpy(cnt),
        torch.from_numpy(sums),
        torch.from_numpy(corr),
        torch.from_numpy(edges),
        torch.from_numpy(kept),
    )


def even_replicates_scatter(
    w: Tensor, sub: Tensor, values: Tensor, corr_col: Tensor, num_sub: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Bootstrap replicates of even-bin sub-bin statistics (calib_core.metrics.bootstrap):
    (counts, value sums, correctness sums), each (B, C, num_sub) float64, where row i of the
    data lies in sub-bin ``sub[i, j]`` of column j and is correct in column ``corr_col[i]``
    (-1: none). One pass over each resample's drawn rows; resamples split over threads."""
    wn = w.numpy()
    b = wn.shape[0]
    c = sub.shape[1]
    out = [np.zeros((b, c, num_sub)) for _ in range(3)]
    args = (wn, sub.numpy(), values.numpy(), corr_col.numpy(), *out)
    _split(_kernel("even_reps"), b, lambda t: args, min_rows=8)
    cnt, val, cor = out
    return torch.from_numpy(cnt), torch.from_numpy(val), torch.from_numpy(cor)


def adaptive_replicates_groups(
    w: Tensor, order: Tensor, v: Tensor, c: Tensor, tie_start: Tensor, starts: Tensor, num_bins: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Bootstrap replicates of adaptive-bin statistics of G groups of N values at once: ``order``
    (G, N) sorts each group's values ``v`` (G, N, sorted, float64) with correctness ``c``,
    ``tie_start`` (G, N) the first sorted index of each value's tie block, ``starts`` (G, T)
    each threshold's first kept index. Returns (counts, value sums, correctness sums), each
    (T, G, B, num_bins) float64, every resample's edges derived from its own kept values."""
    wn = w.numpy()
    b = wn.shape[0]
    g, t = starts.shape
    out = [np.zeros((t, g, b, num_bins)) for _ in range(3)]
    args = (wn, order.numpy(), v.numpy(), c.numpy(), tie_start.numpy(), starts.numpy(), num_bins, *out)
    _split(_kernel("adaptive_all"), b, lambda t: args, min_rows=8)
    cnt, val, cor = out
    return torch.from_numpy(cnt), torch.from_numpy(val), torch.from_numpy(cor)


_NORM_CODES = {"l1": 0, "l2": 1, "max": 2}


def bin_errors(
    counts: np.ndarray,
    sums: np.ndarray,
    correct: np.ndarray,
    norm: str,
    bin_of: np.ndarray,
    keep: np.ndarray,
    nbins: int,
) -> Tensor:
    """binning.group_errors of (M, S) float64 sub-bin statistics collapsed into ``nbins`` bins
    (sub-bin s adds to bin ``bin_of[s]`` where ``keep[s]``), without (M, bins) temporaries: (M,)."""
    out = np.empty(counts.shape[0])
    _kernel("bin_errors")(
        counts, sums, correct, bin_of.astype(np.int64), keep.astype(np.bool_), nbins, _NORM_CODES[norm], out
    )
    return torch.from_numpy(out)

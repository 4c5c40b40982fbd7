"""Exact top-k on the GPU: radix select of the k-th magnitude (cupy only).

|x| of a float32 is its bit pattern with the sign cleared, and for
non-negative floats the unsigned-integer order is the float order, so the
k-th largest magnitude is found digit by digit on the 31-bit key: bits
30..20 (2048 bins), 19..10 (1024), 9..0 (1024), by ``tk_hist`` (block-private
shared-memory histograms, 4 copies against same-bin serialisation) and
``tk_find`` (one warp: the bin holding the k-th key, the state kept on the
device) of ``kernels/cuda/radix.cu``.  The entries in that bin and above (k
plus one bin: a few percent of n) are compacted in index order by the select
kernel, and the later passes and the final tie-aware select run on those
candidates only: two full reads of x.  Error feedback's sum (``add``) rides
on the first pass (``tk_hist_add``: x += add as it is histogrammed), which
saves the separate pass over x (docs/BENCHMARKS.md, "Fixed cost per call").

Up to ``TOPK_SMALL_MAX`` entries one launch of one block (``tk_small``) does
it all, the same key radix select in four 8-bit digits, then an ordered write,
with no host read; Ok-Topk's caps mostly see such sizes.  Measurements:
docs/BENCHMARKS.md, "GPU kernels" and "Exact top-k of a small array in one
launch".
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ._cuda_build import NOKEY, NULL, kernel, key_to_float, on_input_device, read_back, \
    sm_count, workspace
from ._cuda_select import lookback_select
from ._cuda_sparse import add_into
from ._xp import is_stream_ordered

HIST_THREADS = 512
#: up to this many entries the radix select reads x three times instead of
#: reading the candidate count back to the host (no synchronisation)
RADIX_NOREAD_MAX = 1 << 18
#: up to this many entries, exact top-k runs in one launch of one block
#: (``tk_small``) instead of the radix select's histogram passes and host read
TOPK_SMALL_MAX = 1 << 14

# radix workspace, in uint32 words: histograms of 2048 + 1024 + 1024 bins, then
# the state (S_* in radix.cu: prefix, remaining rank, bin count, _, above_key,
# tie_key, need, error flag)
_H1, _H2, _H3, _ST, _RADIX_WORDS = 0, 2048, 3072, 4096, 4112
S_PREFIX = 0


def hist(src, m, st, hist_ptr, shift, nbits, copies, add=None):
    """Launch tk_hist over m keys of src; st and hist_ptr are device pointers (int).
    ``add`` (pass 1): tk_hist_add, which first does src += add (same length)."""
    grid = max(1, min((m // 4 + 2 * HIST_THREADS - 1) // (2 * HIST_THREADS), 4 * sm_count()))
    tail = (np.int64(m), np.uint64(st), np.uint64(hist_ptr), np.int32(shift), np.int32(nbits),
            np.int32(copies))
    kernel("tk_hist" if add is None else "tk_hist_add")(
        (grid,), (HIST_THREADS,), (src, *tail) if add is None else (src, add, *tail),
        shared_mem=(copies << nbits) * 4)


def _find(hist_ptr, nbits, shift, st, k, pass_):
    kernel("tk_find")((1,), (32,), (np.uint64(hist_ptr), np.int32(nbits), np.int32(shift),
                                    np.uint64(st), np.uint32(k), np.int32(pass_)))


def _low_digits(src, m, st, base):
    """Passes 2 and 3: bits 19..10 and 9..0 over m keys of src."""
    hist(src, m, st, base + 4 * _H2, 10, 10, 1)
    _find(base + 4 * _H2, 10, 10, st, 0, 2)
    hist(src, m, st, base + 4 * _H3, 0, 10, 1)
    _find(base + 4 * _H3, 10, 0, st, 0, 3)


def radix(x, k, noread_max=RADIX_NOREAD_MAX, add=None):
    """The k-th largest magnitude key of float32 x, found on the device.

    1. Histogram of key bits 30..20 over x (full read; with ``add``, x += add
       first, in the same pass: error feedback fused), find the bin b1 of
       the k-th key.  The host reads 3 words: how many keys lie in bins >= b1
       (m = k - remaining rank + count of b1).
    2. Ordered compaction of those m entries (index, value) with the select
       kernel (full read; m is about k plus one bin: a few percent of n).
    3. Histograms of bits 19..10 and 9..0 over the m candidates only.
    When the candidates are most of x (heavy ties), step 2 is skipped and
    step 3 reads x; so it is for x of up to ``noread_max`` entries, without
    the host read (three reads of a small x cost less than the wait), and
    for any x inside ``kernels.stream_ordered()``.
    Returns (ws, st, src, m, gather): the workspace, the device address of the
    state (its words 4..6 are the select parameters), the array the final
    select reads, its length and its original indices (None when src is x).
    """
    n = x.size
    stream = cp.cuda.get_current_stream()
    ws = workspace(_RADIX_WORDS // 2, stream, "radix")
    base = ws.buf.data.ptr
    st = base + 4 * _ST
    cp.cuda.runtime.memsetAsync(base, 0, 4 * _RADIX_WORDS, stream.ptr)
    hist(x, n, st, base + 4 * _H1, 20, 11, 4, add)
    _find(base + 4 * _H1, 11, 20, st, k, 1)
    if n <= noread_max or is_stream_ordered():  # read x again rather than wait for the host
        _low_digits(x, n, st, base)
        return ws, st, x, n, None
    w = read_back(ws, st, 16, stream).view(np.uint32)
    prefix1, krem, h = int(w[0]), int(w[1]), int(w[2])
    m = (k - krem) + h
    if m <= n // 2:
        ci, cv = cp.empty(m, np.int32), cp.empty(m, np.float32)
        lookback_select("sel_thr8", x, None, n, prefix1, NOKEY, 0, None, m, ci, cv,
                        read_total=False)
        src, gather = cv, ci
    else:
        src, gather, m = x, None, n
    _low_digits(src, m, st, base)
    return ws, st, src, m, gather


@on_input_device
def key_histogram(x, prefix: int, shift: int, nbits: int) -> np.ndarray:
    """``kernels.key_histogram`` on the device: tk_hist over x with the
    prefix in its state word, then one read of the 2**nbits (<= 16) bins."""
    stream = cp.cuda.get_current_stream()
    ws = workspace(12, stream, "keyhist")        # 24 u32 words: 16 bins, then the state
    base = ws.buf.data.ptr
    cp.cuda.runtime.memsetAsync(base, 0, 4 * 24, stream.ptr)
    ws.buf.view(cp.uint32)[16 + S_PREFIX:17 + S_PREFIX].fill(prefix)
    hist(x, x.size, base + 4 * 16, base, shift, nbits, 4)
    return read_back(ws, base, 4 << nbits, stream).view(np.uint32)[:1 << nbits].astype(np.int64)


@on_input_device
def kth_key(x, k: int) -> int:
    """The k-th largest 31-bit magnitude key of float32 x (1 <= k <= n)."""
    ws, st, *_ = radix(x, k)
    w = read_back(ws, st, 32, cp.cuda.get_current_stream()).view(np.uint32)
    if w[7]:
        raise RuntimeError("radix select lost count of the keys (kernel bug)")
    return int(w[5])


@on_input_device
def kth_magnitude(x, k: int) -> float:
    return key_to_float(kth_key(x, k))


def _topk_small(x, k: int, idx=None):
    out_idx, out_val = cp.empty(k, np.int32), cp.empty(k, np.float32)
    kernel("tk_small")((1,), (1024,), (x, idx if idx is not None else NULL, np.int32(x.size),
                                       np.int32(k), out_idx, out_val))
    return out_idx, out_val


@on_input_device
def topk_select(x, k: int, *, add=None, small_max: int = TOPK_SMALL_MAX,
                noread_max: int = RADIX_NOREAD_MAX):
    """Exact top-k by magnitude, ties to the lowest indices: (idx sorted, values).

    ``x``: flat, aligned float32 (``prepare``), 0 < k < x.size.  ``add``
    (the same, or None): x += add first, fused into the first pass.  Radix select
    of the k-th key (two full reads of x, one host read of three words; see
    :func:`radix` for ``noread_max``), then one ordered select over the
    candidates that takes every key above it and the first ``need`` equal to
    it.  Output size k.  Up to ``small_max`` entries: one launch of
    ``tk_small`` instead.  The defaults are the library's; other values serve
    tests and benchmarks (the results are the same).
    """
    if x.size <= small_max:
        if add is not None:
            add_into(x, add)
        return _topk_small(x, k)
    _, st, src, m, gather = radix(x, k, noread_max, add)
    out_idx, out_val = cp.empty(k, np.int32), cp.empty(k, np.float32)
    lookback_select("sel_topk8" if gather is not None else "sel_topkx8", src, gather, m,
                    0, 0, 0, st + 16, k, out_idx, out_val, read_total=False)
    return out_idx, out_val


@on_input_device
def cap_select(idx, vals, k: int, *, small_max: int = TOPK_SMALL_MAX,
               noread_max: int = RADIX_NOREAD_MAX):
    """The ``k`` largest-magnitude entries of the COO set (int32 ``idx``,
    float32 ``vals``, 0 < k < size), ties to the lowest positions, order kept:
    ``(idx[keep], vals[keep])`` with ``keep = topk_select(vals, k)[0]``, the
    gather fused into the select when the set is small (``small_max``)."""
    if vals.size <= small_max:
        return _topk_small(vals, k, idx)
    keep = topk_select(vals, k, small_max=small_max, noread_max=noread_max)[0]
    return idx[keep], vals[keep]

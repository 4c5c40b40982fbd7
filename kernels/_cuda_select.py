"""Threshold selection on the GPU: |x| >= t to COO, index-ordered (cupy only).

Two launch paths over ``kernels/cuda/select.cu``, same result:

- one pass (``sel_thr8``): a single-pass stream compaction with a decoupled
  look-back (Merrill & Garland, 2016; what CUB's DeviceSelect does).  Block b
  loads tile b (8192 entries, coalesced float4 loads), ranks its selected
  entries with one warp scan of byte-packed per-chunk counts, publishes its
  count, sums its predecessors' counts back to the nearest inclusive prefix
  and writes its entries at ``prefix + rank``.  Tiles are ranked by index and
  entries inside a tile in index order, so the output is sorted with no sort
  and no atomics on output slots.  Read 4n bytes once, write 8 per entry.
- two launches (``sel_local8`` + ``sel_stitch8``), the default from n =
  ``LOCAL_MIN_N``: the pass over the data waits for nothing (each tile
  compacts its entries into its own scratch slot, sized from the previous
  call's count), then the stitch finds each group of up to 32 tiles' output
  offset with one look-back per group and copies the entries out.  A tile
  whose entries overflow its slot is selected again from the input by the
  stitch, so the result is exact for any data.

Why these two, and what else was tried: docs/BENCHMARKS.md, "GPU kernels",
"Tiles of 16384, values kept, persistent grid" and "Two launches: tile-local
compaction, then a stitch".
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ._cuda_build import NOKEY, NULL, kernel, on_input_device, read_back, sm_count, \
    threshold_key, workspace

SEL_THREADS = 256
#: entries per tile of every select kernel: 256 threads x 8 float4
SEL_TILE = SEL_THREADS * 4 * 8
#: the two-launch path serves inputs of at least this many entries ...
LOCAL_MIN_N = 1 << 24
#: ... whose expected count (the previous call's, else the output capacity)
#: is at most this share of n: the scratch would not pay beyond it
LOCAL_MAX_SHARE = 1 / 16
LOCAL_STAGE = 1024       # the most scratch entries per tile (shared-memory stage)
STITCH_GROUP = 32        # the most tiles per sel_stitch block
#: threshold_select's ``path`` values
PATHS = ("auto", "lookback", "local")

#: the last selected count per input size: sizes the next call's output
_CAP_HINT: dict[int, int] = {}


def lookback_select(name, a, in_idx, n, above_key, tie_key, need, dparams, cap,
                    out_idx, out_val, *, read_total=True):
    """One launch of a one-pass select kernel (``sel_thr8``, ``sel_topk8``,
    ``sel_topkx8``) over n entries of ``a``.

    Returns (#above, #ties) over all n entries when ``read_total`` (this
    synchronises the stream), else None.  ``dparams``: a device pointer (int)
    to (above_key, tie_key, need) for the sel_topk* kernels, or None.
    """
    ntiles = (n + SEL_TILE - 1) // SEL_TILE
    stream = cp.cuda.get_current_stream()
    ws = workspace(ntiles, stream, "select")
    base = ws.buf.data.ptr
    cp.cuda.runtime.memsetAsync(base, 0, ntiles * 8, stream.ptr)
    kernel(name)(
        (ntiles,), (SEL_THREADS,),
        (a, NULL if in_idx is None else in_idx, np.int64(n), np.uint32(above_key),
         np.uint32(tie_key), np.uint32(need), NULL if dparams is None else np.uint64(dparams),
         np.uint32(cap), out_idx, out_val, np.uint64(base)))
    if not read_total:
        return None
    s = int(read_back(ws, base + (ntiles - 1) * 8, 8, stream)[0])
    if s >> 62 != 2:
        raise RuntimeError("select kernel left its last tile unfinished (kernel bug)")
    return (s >> 31) & 0x7FFFFFFF, s & 0x7FFFFFFF


def stitch_group(ntiles: int) -> int:
    """Tiles per sel_stitch block: the fewest (a power of two, at most 32)
    that fit the launch in one wave of four blocks per SM."""
    g = 1
    while g < STITCH_GROUP and -(-ntiles // g) > 4 * sm_count():
        g *= 2
    return g


def local_cap(ntiles: int, expected: int) -> int:
    """Scratch entries per tile for sel_local: twice the expected count per
    tile plus 64, a multiple of 32, at most LOCAL_STAGE; tiles over it are
    selected again from the input by sel_stitch."""
    per = -(-2 * int(expected) // max(1, ntiles)) + 64
    return min(LOCAL_STAGE, -(-per // 32) * 32)


def local_select(a, n, above_key, cap, out_idx, out_val, lcap, scratch=None, *,
                 read_total=True, stitch_only=False):
    """sel_local8 then sel_stitch8 over n entries of ``a``.

    ``scratch``: (counts uint32[ntiles], idx int32[ntiles * lcap],
    val float32[ntiles * lcap]) or None (taken from cupy's pool).  With
    ``stitch_only`` the local pass is skipped (its scratch is reused: a
    second stitch into a larger output).  Returns (scratch, #selected) when
    ``read_total`` (this synchronises the stream), else (scratch, None).
    """
    ntiles = (n + SEL_TILE - 1) // SEL_TILE
    stream = cp.cuda.get_current_stream()
    if scratch is None:
        scratch = (cp.empty(ntiles, cp.uint32), cp.empty(ntiles * lcap, cp.int32),
                   cp.empty(ntiles * lcap, cp.float32))
    counts, s_idx, s_val = scratch
    gsize = stitch_group(ntiles)
    ngroups = (ntiles + gsize - 1) // gsize
    ws = workspace(ngroups, stream, "select")
    base = ws.buf.data.ptr
    if stitch_only:
        cp.cuda.runtime.memsetAsync(base, 0, ngroups * 8, stream.ptr)
    else:                                   # sel_local8 zeroes the status words
        kernel("sel_local8")(
            (ntiles,), (SEL_THREADS,),
            (a, np.int64(n), np.uint32(above_key), np.uint32(lcap), counts, s_idx, s_val,
             np.uint64(base), np.uint32(ngroups)))
    kernel("sel_stitch8")(
        (ngroups,), (SEL_THREADS,),
        (a, np.int64(n), np.uint32(above_key), np.uint32(lcap), np.uint32(cap),
         np.uint32(ntiles), np.uint32(gsize), counts, s_idx, s_val, out_idx, out_val,
         np.uint64(base)))
    if not read_total:
        return scratch, None
    s = int(read_back(ws, base + (ngroups - 1) * 8, 8, stream)[0])
    if s >> 62 != 2:
        raise RuntimeError("stitch kernel left its last tile unfinished (kernel bug)")
    return scratch, (s >> 31) & 0x7FFFFFFF


def _default_cap(n: int) -> int:
    last = _CAP_HINT.get(n)
    if last is None:
        return min(n, max(1 << 16, n >> 4))
    return min(n, max(1 << 12, 2 * last + 1024))


def _outputs(size):
    return cp.empty(size, np.int32), cp.empty(size, np.float32)


@on_input_device
def threshold_select(x, threshold, *, cap: int | None = None, path: str = "auto"):
    """COO of |x| >= threshold: (int32 indices sorted ascending, values).

    ``x``: flat, 16-byte aligned float32 (``prepare``).  One pass over x;
    ``path`` "auto" takes two launches (the second over the selected entries
    only, except tiles whose entries overflow their scratch slot, which it
    selects again from x) for n >= LOCAL_MIN_N when the expected count is at
    most LOCAL_MAX_SHARE of n, else the one-pass kernel; "lookback" and
    "local" force one of them at any n and count (for tests and benchmarks).
    The output buffer holds ``cap`` entries (default: twice the last count
    for this size, else n/16); if more are selected, the entries are written
    again (the local path re-runs only its stitch) into a buffer of the exact
    size.  Returns views of that buffer.
    """
    if path not in PATHS:
        raise ValueError(f"threshold path {path!r} not in {PATHS}")
    n = x.size
    key = threshold_key(threshold)
    c = n if key == 0 else min(n, cap if cap is not None else _default_cap(n))
    expected = _CAP_HINT.get(n, c)
    if path == "local" or (path == "auto" and n >= LOCAL_MIN_N
                           and expected <= LOCAL_MAX_SHARE * n):
        return _threshold_select_local(x, key, c, expected)
    out_idx, out_val = _outputs(c)
    total, _ = lookback_select("sel_thr8", x, None, n, key, NOKEY, 0, None, c,
                               out_idx, out_val)
    _CAP_HINT[n] = total
    if total > c:
        out_idx, out_val = _outputs(total)
        again, _ = lookback_select("sel_thr8", x, None, n, key, NOKEY, 0, None, total,
                                   out_idx, out_val)
        assert again == total
        return out_idx, out_val
    return out_idx[:total], out_val[:total]


def _threshold_select_local(x, key, c, expected):
    n = x.size
    lcap = local_cap((n + SEL_TILE - 1) // SEL_TILE, expected)
    out_idx, out_val = _outputs(c)
    scratch, total = local_select(x, n, key, c, out_idx, out_val, lcap)
    _CAP_HINT[n] = total
    if total > c:
        out_idx, out_val = _outputs(total)
        _, again = local_select(x, n, key, total, out_idx, out_val, lcap, scratch,
                                stitch_only=True)
        assert again == total
        return out_idx, out_val
    return out_idx[:total], out_val[:total]

"""Sparse arithmetic on COO sets (index array + value array).

Every function is deterministic: the same inputs in the same order give
bitwise-identical outputs, which is what keeps replicas from drifting when
several ranks reduce the same gathered data.
"""
from __future__ import annotations

import numpy as np

from ._xp import array_module, cuda_kernels, index_dtype


def _stable_argsort(xp, a):
    if xp is np:
        return np.argsort(a, kind="stable")
    return xp.argsort(a)  # cupy's argsort is always stable (thrust stable_sort_by_key)


def _runs(xp, idx, val):
    """Sort a COO set by index (stably) into runs of equal indices: (the
    distinct indices, the values in sorted order, the start of each run)."""
    order = _stable_argsort(xp, idx)
    sidx = idx[order]
    new = xp.empty(sidx.size, dtype=bool)
    new[0] = True
    xp.not_equal(sidx[1:], sidx[:-1], out=new[1:])
    starts = xp.flatnonzero(new)
    return sidx[starts], val[order], starts


def coo_sum(indices, values, n: int | None = None):
    """Merge several COO sets (or one concatenated set with repeats) into one.

    Args:
        indices: one index array, or a sequence of them.
        values: the matching value array(s).
        n: size of the index space (only used for the index dtype).

    Returns:
        (unique sorted indices, summed values).  The entries of one index are
        summed in their order of appearance in the concatenated input, the
        way ``np.add.reduceat`` does it (first + pairwise sum of the rest);
        the GPU path reproduces that order, so both give identical bits.
    """
    if isinstance(indices, (list, tuple)):
        xp = array_module(values[0]) if len(values) else None
        if xp is None:
            raise ValueError("coo_sum needs at least one COO set")
        idx = xp.concatenate(list(indices)) if len(indices) > 1 else indices[0]
        val = xp.concatenate(list(values)) if len(values) > 1 else values[0]
    else:
        idx, val = indices, values
        xp = array_module(val)
    if idx.size == 0:
        return idx.astype(index_dtype(n or 0), copy=False), val
    uidx, sval, starts = _runs(xp, idx, val)
    if starts.size == sval.size:
        return uidx, sval
    cu = cuda_kernels(sval)
    if cu is not None and sval.dtype in (np.float32, np.float64):
        return uidx, cu.segment_sums(sval, starts)  # numpy's reduceat order, bitwise
    # (cupy's own add.reduceat differences a running sum: not numpy's bits, and
    # inexact under cancellation; on cupy it serves only other value dtypes)
    return uidx, xp.add.reduceat(sval, starts)


def scatter_add(dense, indices, values, *, runs=None):
    """dense[indices] += values, repeated indices accumulated in order. In place.

    Deterministic on both paths: repeats are added one after another in
    input order, starting from the dense value (``np.add.at``'s order).  On
    the GPU (float32) that is a kernel with one thread per run of equal
    indices, after a stable sort only when the indices are not already
    non-decreasing; no float atomics, whose order varies from run to run.
    ``runs``: offsets (host ints, first 0, last the size) of consecutive
    pieces each already non-decreasing (e.g. every rank's sorted selection,
    gathered): on the GPU one launch per piece, no check and no sort (the
    same order of additions).
    """
    xp = array_module(dense)
    if not indices.size:
        return dense
    cu = cuda_kernels(dense)
    if (cu is not None and dense.dtype == np.float32 and values.dtype == np.float32
            and dense.flags.c_contiguous and indices.dtype in (np.int32, np.int64)
            and type(indices) is type(dense)):
        idx = indices.reshape(-1)
        vals = values.reshape(-1)
        if idx.size != vals.size:
            raise ValueError(f"{idx.size} indices for {vals.size} values")
        if runs is None:
            if idx.size > 1 and not bool((idx[1:] >= idx[:-1]).all()):
                order = xp.argsort(idx)  # stable
                idx, vals = idx[order], vals[order]
            runs = (0, idx.size)
        idx, vals = xp.ascontiguousarray(idx), xp.ascontiguousarray(vals)
        for a, b in zip(runs[:-1], runs[1:]):
            if b > a:
                cu.scatter_add_sorted(dense.reshape(-1), idx[a:b], vals[a:b])
        return dense
    xp.add.at(dense, indices, values)
    return dense


def zero_at(dense, indices):
    """dense[indices] = 0, in place (the residual's entries a selection sent)."""
    cu = cuda_kernels(dense)
    if (cu is not None and dense.dtype == np.float32 and dense.flags.c_contiguous
            and indices.dtype in (np.int32, np.int64) and type(indices) is type(dense)):
        if indices.size:
            cu.zero_at(dense.reshape(-1), array_module(dense).ascontiguousarray(indices))
        return dense
    dense.reshape(-1)[indices] = 0
    return dense


def add_into(acc, x):
    """acc += x, in place (error feedback); one vectorized pass on the GPU."""
    cu = fused_add(acc, x)
    if cu is not None:
        cu.add_into(acc, x)
        return acc
    acc += x
    return acc


def _in_place(a):
    """``kernels._cuda`` when its kernels can read and write ``a`` where it
    lies (a float32 cupy array, C-contiguous, 16-byte aligned), else None."""
    cu = cuda_kernels(a)
    if cu is not None and a.dtype == np.float32 and a.flags.c_contiguous \
            and a.data.ptr % 16 == 0:
        return cu
    return None


def fused_add(acc, x):
    """``kernels._cuda`` when its kernels can add ``x`` into ``acc`` in place
    (both ``_in_place``, the same size), else None."""
    cu = _in_place(acc)
    if cu is not None and type(x) is type(acc) and x.size == acc.size and _in_place(x):
        return cu
    return None


def to_dense(indices, values, n: int, dtype=None):
    """A new dense vector of length ``n`` holding the COO set (indices unique)."""
    xp = array_module(values)
    out = xp.zeros(n, dtype=dtype or values.dtype)
    if indices.size:
        out[indices] = values
    return out


def region_bounds(n: int, parts: int):
    """Boundaries (length parts+1, host ints) cutting [0, n) into near-equal parts."""
    q, r = divmod(n, parts)
    bounds = [0]
    for j in range(parts):
        bounds.append(bounds[-1] + q + (1 if j < r else 0))
    return bounds


def split_by_bounds(indices, bounds):
    """Offsets splitting a sorted index array by region boundaries.

    Returns host ints ``offs`` of length len(bounds) with region j holding
    indices[offs[j]:offs[j+1]].
    """
    xp = array_module(indices)
    b = xp.asarray(bounds, dtype=indices.dtype if indices.size else "int64")
    offs = xp.searchsorted(indices, b)
    offs = [int(o) for o in (offs.get() if hasattr(offs, "get") else offs)]
    offs[0], offs[-1] = 0, int(indices.size)
    return offs


# -- index coding for the wire (host arrays) -----------------------------------
_CODE_RAW, _CODE_U16, _CODE_U8 = 0, 1, 2
_GAP_WIDTHS = {_CODE_U16: (np.uint16,), _CODE_U8: (np.uint8, np.uint16)}  # escape layers


def _gap_layers(gaps, widths):
    """Split gaps into escape layers: layer j holds, for every gap that
    escaped layers 0..j-1, the gap if it is below the maximum of the unsigned
    ``widths[j]``, else 0 (the escape: no gap is 0); the last layer holds the
    remaining gaps whole.  Returns the list of layer arrays."""
    layers, rest = [], gaps
    for w in widths:
        fits = rest < np.iinfo(w).max
        layers.append(np.where(fits, rest, 0).astype(w))
        rest = rest[~fits]
    layers.append(rest)
    return layers


def encode_indices(idx) -> np.ndarray:
    """Wire bytes of a sorted, duplicate-free host (numpy) index array,
    delta-coded when shorter.

    One format byte, then: raw (the index bytes); u16 (the gaps to the
    previous index in 2 bytes, 0 escaping to the index dtype); or u8 (gaps in
    1 byte, 0 escaping to 2 bytes, whose 0 escapes to the index dtype),
    whichever is shortest for this array.  The first index and the widest
    escapes follow in the index dtype.  No indices: no bytes.  Gaps are
    about n/k: u8 suits 1% densities, u16 sparser ones, raw a few indices
    spread far apart, so a message grows by the format byte at most.
    """
    if idx.size == 0:
        return np.empty(0, np.uint8)                      # nothing to send, not even a format
    raw = np.concatenate([np.array([_CODE_RAW], np.uint8), idx.view(np.uint8)])
    if idx.size < 2:
        return raw
    gaps = np.diff(idx)
    best = raw
    for code, widths in _GAP_WIDTHS.items():
        layers = _gap_layers(gaps, widths)
        layers[-1] = np.concatenate([idx[:1], layers[-1]]).astype(idx.dtype, copy=False)
        size = 1 + sum(a.nbytes for a in layers)
        if size < best.size:
            best = np.concatenate([np.array([code], np.uint8)] + [a.view(np.uint8) for a in layers])
    return best


def decode_indices(buf, m: int, dtype) -> np.ndarray:
    """Inverse of ``encode_indices`` for ``m`` indices of ``dtype`` (host arrays)."""
    dtype = np.dtype(dtype)
    if m == 0:
        return np.empty(0, dtype)
    code, body = int(buf[0]), buf[1:]
    if code == _CODE_RAW:
        return body.copy().view(dtype)                    # copy: aligned whatever the offset
    gaps, off = None, 0
    n_next = m - 1                                        # entries in the current layer
    for w in _GAP_WIDTHS[code]:
        layer = body[off:off + n_next * np.dtype(w).itemsize].copy().view(w)
        off += layer.nbytes
        if gaps is None:
            gaps = layer.astype(dtype)
            esc = np.flatnonzero(layer == 0)
        else:
            gaps[esc] = layer
            esc = esc[layer == 0]
        n_next = esc.size
    tail = body[off:].copy().view(dtype)                  # the first index, then the rest
    gaps[esc] = tail[1:]
    out = np.empty(m, dtype=dtype)
    out[0] = tail[0]
    np.cumsum(gaps, out=out[1:])
    out[1:] += tail[0]
    return out

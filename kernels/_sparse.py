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
    order = _stable_argsort(xp, idx)
    sidx = idx[order]
    sval = val[order]
    new = xp.empty(sidx.size, dtype=bool)
    new[0] = True
    xp.not_equal(sidx[1:], sidx[:-1], out=new[1:])
    starts = xp.flatnonzero(new)
    uidx = sidx[starts]
    if starts.size == sidx.size:
        return uidx, sval
    cu = cuda_kernels(sval)
    if cu is not None and sval.dtype in (np.float32, np.float64):
        return uidx, cu.segment_sums(sval, starts)  # numpy's reduceat order, bitwise
    # (cupy's own add.reduceat differences a running sum: not numpy's bits, and
    # inexact under cancellation; it serves only the CUDA-off path)
    return uidx, xp.add.reduceat(sval, starts)


def scatter_add(dense, indices, values):
    """dense[indices] += values, repeated indices accumulated in order. In place.

    Deterministic on both paths: repeats are added one after another in
    input order, starting from the dense value (``np.add.at``'s order).  On
    the GPU (float32) that is a kernel with one thread per run of equal
    indices, after a stable sort only when the indices are not already
    non-decreasing; no float atomics, whose order varies from run to run.
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
        if idx.size > 1 and not bool((idx[1:] >= idx[:-1]).all()):
            order = xp.argsort(idx)  # stable
            idx, vals = idx[order], vals[order]
        cu.scatter_add_sorted(dense.reshape(-1), xp.ascontiguousarray(idx),
                              xp.ascontiguousarray(vals))
        return dense
    xp.add.at(dense, indices, values)
    return dense


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

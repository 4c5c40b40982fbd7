"""Sparse arithmetic on COO sets (index array + value array).

Every function is deterministic: the same inputs in the same order give
bitwise-identical outputs, which is what keeps replicas from drifting when
several ranks reduce the same gathered data.
"""
from __future__ import annotations

from ._xp import array_module, index_dtype


def coo_sum(indices, values, n: int | None = None):
    """Merge several COO sets (or one concatenated set with repeats) into one.

    Args:
        indices: one index array, or a sequence of them.
        values: the matching value array(s).
        n: size of the index space (only used for the index dtype).

    Returns:
        (unique sorted indices, summed values).  Summation order per index is
        the order of appearance in the concatenated input.
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
    order = xp.argsort(idx, kind="stable")
    sidx = idx[order]
    sval = val[order]
    new = xp.empty(sidx.size, dtype=bool)
    new[0] = True
    xp.not_equal(sidx[1:], sidx[:-1], out=new[1:])
    starts = xp.flatnonzero(new)
    uidx = sidx[starts]
    if starts.size == sidx.size:
        return uidx, sval
    return uidx, xp.add.reduceat(sval, starts)


def scatter_add(dense, indices, values):
    """dense[indices] += values, repeated indices accumulated in order. In place."""
    xp = array_module(dense)
    if indices.size:
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

"""Deterministic sparse arithmetic on the GPU over ``kernels/cuda/sparse.cu``
(cupy only): bitwise the numpy path's results, no float atomics.

``seg_sum_*``: ``np.add.reduceat`` computes a0 + pairwise(a1..am) (NumPy's
pairwise summation: a plain loop under 8 terms, 8 accumulators up to 128,
halving above); reproducing that order makes the GPU ``coo_sum`` bitwise
equal to the CPU one, which keeps replicas on mixed hosts identical.
``seg_scatter_add_*``: on index-sorted input each run of equal indices is
added by one thread in input order, starting from the dense value: exactly
``np.add.at``'s order (float atomics would vary it, and the rounding, from
run to run).  ``zero_at_*``: the selected entries of a residual zeroed;
``add_into_f32``: error feedback's acc += x in one vectorized pass.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ._cuda_build import kernel, on_input_device, sm_count

_THREADS = 256


def _grid(m: int) -> int:
    return max(1, min((m + _THREADS - 1) // _THREADS, 32 * sm_count()))


@on_input_device
def segment_sums(sval, starts):
    """out[s] = np.add.reduceat(sval, starts)[s], bitwise (float32 / float64)."""
    nseg, m = starts.size, sval.size
    out = cp.empty(nseg, sval.dtype)
    starts = starts.astype(cp.int64, copy=False)
    name = "seg_sum_f32" if sval.dtype == np.float32 else "seg_sum_f64"
    kernel(name)((_grid(nseg),), (_THREADS,), (sval, starts, np.int64(nseg), np.int64(m), out))
    return out


@on_input_device
def scatter_add_sorted(dense, idx, vals):
    """dense[idx] += vals for non-decreasing idx, each run in input order."""
    m = idx.size
    name = "seg_scatter_add_i32" if idx.dtype == np.int32 else "seg_scatter_add_i64"
    kernel(name)((_grid(m),), (_THREADS,), (dense, np.int64(dense.size), idx, vals, np.int64(m)))
    return dense


@on_input_device
def zero_at(dense, idx):
    """dense[idx] = 0 (float32 dense, int32 / int64 idx)."""
    m = idx.size
    name = "zero_at_i32" if idx.dtype == np.int32 else "zero_at_i64"
    kernel(name)((_grid(m),), (_THREADS,), (dense, np.int64(dense.size), idx, np.int64(m)))


@on_input_device
def add_into(acc, x):
    """acc += x (float32, C-contiguous, both 16-byte aligned): one pass, float4 loads."""
    n = acc.size
    blocks = max(1, min(-(-n // (4 * _THREADS)), 32 * sm_count()))
    kernel("add_into_f32")((blocks,), (_THREADS,), (acc, x, np.int64(n)))

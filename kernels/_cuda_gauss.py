"""Gaussiank's statistics on the GPU: mean / std and counts at several
thresholds, over ``kernels/cuda/gaussian.cu`` (cupy only).

Full-grid kernels reduced in a fixed order, so the same bits on every run
(cupy's own reductions to a scalar run on one block: docs/BENCHMARKS.md,
"Staged writes, and Gaussiank's selection").
"""
from __future__ import annotations

import math

import cupy as cp
import numpy as np

from ._cuda_build import NOKEY, NULL, kernel, on_input_device, read_back, sm_count, workspace

GS_THREADS = 256
#: thresholds one count_at_least_many launch handles
COUNT_KEYS = 16
_GS_COUNT = ((1, "gs_count1"), (4, "gs_count4"), (16, "gs_count16"))
# "gauss" workspace, in uint64 words: mean, var, keys (16 uint32), counts
# (16 uint32), then the per-block partial sums
_GS_MEAN, _GS_VAR, _GS_KEYS, _GS_COUNTS, _GS_PART = 0, 1, 2, 10, 32


def _gs_grid(n: int) -> int:
    # 8 blocks of 256 per SM (full occupancy), 2 float4 per thread per step
    return max(1, min((n // 4 + 2 * GS_THREADS - 1) // (2 * GS_THREADS), 8 * sm_count()))


@on_input_device
def mean_std(x):
    """(mean, std) of float32 x in float64, as ``numpy.mean`` / ``numpy.std`` with
    ``dtype=float64`` define them: sum(x) / n, then sqrt(sum((x - mean)^2) / n).

    Two reads over a fixed grid, reduced in a fixed order (the same bits on
    every run; they may differ from NumPy's pairwise sums in the last bits),
    one host read-back.
    """
    n = x.size
    grid = _gs_grid(n)
    stream = cp.cuda.get_current_stream()
    ws = workspace(_GS_PART + grid, stream, "gauss")
    base = ws.buf.data.ptr
    part = np.uint64(base + 8 * _GS_PART)
    mean = base + 8 * _GS_MEAN
    partial, finish = kernel("gs_partial"), kernel("gs_finish")
    partial((grid,), (GS_THREADS,), (x, np.int64(n), NULL, part))
    finish((1,), (32,), (part, np.int32(grid), np.int64(n), np.uint64(mean)))
    partial((grid,), (GS_THREADS,), (x, np.int64(n), np.uint64(mean), part))
    finish((1,), (32,), (part, np.int32(grid), np.int64(n), np.uint64(base + 8 * _GS_VAR)))
    h = read_back(ws, mean, 16, stream).view(np.float64)
    return float(h[0]), math.sqrt(float(h[1]))


@on_input_device
def count_at_least_many(x, keys) -> list[int]:
    """[#{i : key(x_i) >= key} for key in keys] (float32 x): one read of x per
    COUNT_KEYS keys, one host read-back each."""
    keys = [int(k) for k in keys]
    out: list[int] = []
    for lo in range(0, len(keys), COUNT_KEYS):
        out += _count_block(x, keys[lo:lo + COUNT_KEYS])
    return out


def _count_block(x, keys):
    n = x.size
    width, name = next((w, nm) for w, nm in _GS_COUNT if w >= len(keys))
    stream = cp.cuda.get_current_stream()
    ws = workspace(_GS_PART, stream, "gauss")
    base = ws.buf.data.ptr
    host = ws.host.view(np.uint32)      # free: the last read-back was waited for
    host[:] = NOKEY
    host[:len(keys)] = keys
    cp.cuda.runtime.memcpyAsync(base + 8 * _GS_KEYS, host.ctypes.data, 4 * COUNT_KEYS,
                                cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
    cp.cuda.runtime.memsetAsync(base + 8 * _GS_COUNTS, 0, 4 * COUNT_KEYS, stream.ptr)
    kernel(name)((_gs_grid(n),), (GS_THREADS,),
                 (x, np.int64(n), np.uint64(base + 8 * _GS_KEYS), np.uint64(base + 8 * _GS_COUNTS)))
    h = read_back(ws, base + 8 * _GS_COUNTS, 4 * width, stream).view(np.uint32)
    return [int(c) for c in h[:len(keys)]]


@on_input_device
def count_at_least(x, key: int) -> int:
    """#{i : key(x_i) >= key}: one read, no temporary (float32 x)."""
    return count_at_least_many(x, [key])[0]

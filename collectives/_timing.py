"""The one timing primitive the profiler, the tuner and the benchmarks share.

Like ``cupyx.profiler.benchmark``: warm-up calls, then timed repeats, each
started after a barrier and closed with a device synchronization when the
work runs on a GPU; the time of a repeat is the slowest rank's, since a
collective is only done when every rank is.
"""
from __future__ import annotations

import time

import numpy as np


def timeit(fn, *, comm=None, warmup: int = 2, repeat: int = 10, sync=None) -> np.ndarray:
    """Time ``fn()``; returns the per-repeat seconds (max over ranks), raw.

    Args:
        fn: zero-argument callable.
        comm: a Communicator; when given, repeats are aligned by a barrier and
            the slowest rank's time is kept (identical on every rank).
        warmup: untimed calls first (compilation, caches, connections).
        repeat: timed calls.
        sync: called after ``fn`` inside the timed region (e.g. a CUDA stream
            synchronize) so asynchronous work is counted.
    """
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    out = np.empty(repeat, dtype=np.float64)
    for i in range(repeat):
        if comm is not None:
            comm.barrier()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        out[i] = time.perf_counter() - t0
    if comm is not None and comm.size > 1:
        out = comm._allreduce(out, "max")  # timing control data: not counted as traffic
    return out

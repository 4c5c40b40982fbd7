"""The one timing primitive the profiler, the tuner and the benchmarks share.

Like ``cupyx.profiler.benchmark``: warm-up calls, then timed repeats, each
started after a barrier and closed with a device synchronization when the
work runs on a GPU; the time of a repeat is the slowest rank's, since a
collective is only done when every rank is.

``timeit_interleaved`` times several callables side by side: repeat i runs
each of them once, starting at the i-th (round robin), so a drift of the
machine (load, clock, allocator state) falls on all of them alike and their
ratios stay meaningful on a shared machine where absolute times do not.
"""
from __future__ import annotations

import time

import numpy as np


def timeit_interleaved(fns, *, comm=None, warmup: int = 2, repeat: int = 10,
                       sync=None, between=None) -> np.ndarray:
    """Time each of ``fns`` ``repeat`` times, interleaved; returns seconds of
    shape (len(fns), repeat), the slowest rank's (identical on every rank).

    Warm-up: ``warmup`` untimed rounds over all of ``fns``.  Timed round i
    calls ``fns[(i + j) % m]`` for j = 0..m-1, each after a barrier, so no
    callable always follows the same one.  ``comm``, ``sync`` and ``between``
    as ``timeit``.
    """
    fns = list(fns)
    m = len(fns)
    for _ in range(warmup):
        for fn in fns:
            fn()
            if sync:
                sync()
    out = np.empty((m, repeat), dtype=np.float64)
    for i in range(repeat):
        for j in range(m):
            a = (i + j) % m
            if between is not None:
                between()
            if comm is not None:
                comm.barrier()
            t0 = time.perf_counter()
            fns[a]()
            if sync:
                sync()
            out[a, i] = time.perf_counter() - t0
    if comm is not None and comm.size > 1 and out.size:
        out = comm._allreduce(out, "max")  # timing control data: not counted as traffic
    return out


def timeit(fn, *, comm=None, warmup: int = 2, repeat: int = 10, sync=None,
           between=None) -> np.ndarray:
    """Time ``fn()``; returns the per-repeat seconds (max over ranks), raw.

    Args:
        fn: zero-argument callable.
        comm: a Communicator; when given, repeats are aligned by a barrier and
            the slowest rank's time is kept (identical on every rank).
        warmup: untimed calls first (compilation, caches, connections).
        repeat: timed calls.
        sync: called after ``fn`` inside the timed region (e.g. a CUDA stream
            synchronize) so asynchronous work is counted.
        between: called before each timed call, outside the timed region (e.g.
            a pause: a training step calls its allreduce after a forward and
            backward pass, not back to back; see ``autotune bench --gap-ms``).
    """
    return timeit_interleaved([fn], comm=comm, warmup=warmup, repeat=repeat, sync=sync,
                              between=between)[0]

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

import functools
import time

import numpy as np


def timeit_interleaved(fns, *, comm=None, warmup: int = 2, repeat=10, sync=None,
                       between=None, batch=1, rotate: bool = True,
                       slowest: bool = True) -> np.ndarray:
    """Time each of ``fns`` ``repeat`` times, interleaved; returns seconds of
    shape (len(fns), max repeat), the slowest rank's (identical on every rank).

    Warm-up: ``warmup`` untimed rounds over all of ``fns``.  Timed round i
    calls ``fns[(i + j) % m]`` for j = 0..m-1, each after a barrier, so no
    callable always follows the same one (``rotate=False``: always in the
    order given).  ``comm``, ``sync`` and ``between`` as ``timeit``.

    ``repeat`` and ``batch`` are an int or one int per callable.  A callable
    with fewer repeats than the others takes part in the first rounds only;
    its row is NaN past its repeats.  ``batch``: calls per timed repeat (a
    repeat of a microsecond call is then long against the barrier's exit
    skew); the times are per call (the repeat's time / batch).
    ``slowest=False`` keeps this rank's own times (no reduction over ranks;
    the barriers still align the repeats).
    """
    fns = list(fns)
    m = len(fns)
    reps = [int(r) for r in repeat] if np.ndim(repeat) else [int(repeat)] * m
    batches = [int(b) for b in batch] if np.ndim(batch) else [int(batch)] * m
    for _ in range(warmup):
        for fn in fns:
            fn()
            if sync:
                sync()
    out = np.zeros((m, max(reps, default=0)), dtype=np.float64)
    for i in range(out.shape[1]):
        for j in range(m):
            a = (i + j) % m if rotate else j
            if i >= reps[a]:
                continue
            fn, nb = fns[a], batches[a]
            if between is not None:
                between()
            if comm is not None:
                comm.barrier()
            t0 = time.perf_counter()
            for _ in range(nb):
                fn()
            if sync:
                sync()
            out[a, i] = (time.perf_counter() - t0) / nb
    if slowest and comm is not None and comm.size > 1 and out.size:
        out = comm.control_allreduce(out, "max")  # timing control data: not counted as traffic
    for a, r in enumerate(reps):
        out[a, r:] = np.nan
    return out


def pause(seconds: float):
    """A ``between`` for :func:`timeit`: sleep ``seconds`` (untimed) before each
    timed call, as a training step calls its allreduce after its forward and
    backward pass; None (no pause) for 0."""
    return functools.partial(time.sleep, seconds) if seconds > 0 else None


def timeit(fn, *, comm=None, warmup: int = 2, repeat: int = 10, sync=None,
           between=None, batch: int = 1, slowest: bool = True) -> np.ndarray:
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
        batch: calls of ``fn`` per timed repeat; the times are per call.
        slowest: False keeps this rank's own times (no reduction over ranks).
    """
    return timeit_interleaved([fn], comm=comm, warmup=warmup, repeat=repeat, sync=sync,
                              between=between, batch=batch, slowest=slowest)[0]

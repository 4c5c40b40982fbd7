"""Every registered allreduce algorithm at fixed (n, P, density).

Timed runs go under real MPI with every rank running pytest
(``python -m tests.benchmarks`` launches ``mpiexec -n P python -m pytest``
on this file); rounds are fixed and each starts after a barrier, so ranks
stay in lockstep, and rank 0's time of a call is what is recorded (it ends
when rank 0 holds the result): with numpy data the CPU time of rank 0's
process (the tool runs the ranks with ``OMPI_MCA_mpi_yield_when_idle=1``, so a
rank waiting for a descheduled peer mostly gives its core away instead of
counting the wait), with cupy data wall time.  Each algorithm is judged against
the native allreduce (``mpi``, resp. ``nccl``) on the same data, called after a
barrier before each of its rounds.  Without a launcher (CI smoke) the same code
runs at P = 1, and ``test_bench_tool.py`` runs it under mpiexec at P = 2.

Timed: n = 2^20 float32, density 1%; smoke: n = 4103.  The data are fixed
and seeded per rank; the sparse algorithms run with error feedback on one
tensor name, cycling through four inputs.  After timing, one more call is
verified on every rank, the verdict agreed collectively:
  * the output is bitwise identical on all ranks;
  * dense algorithms: the output equals the float64 sum within rounding;
  * sparse algorithms: outputs + residuals over ranks == residuals before +
    inputs (error feedback loses nothing), traffic within the algorithm's bound.

``AUTOTUNE_BENCH_ARRAY=cupy`` puts the data on the GPU and uses the NCCL
backend (one GPU per rank).
"""
from __future__ import annotations

import itertools
import os
import time
import zlib

import numpy as np
import pytest

import kernels
from autotune.launch import under_mpi
from collectives import ALGORITHMS

ARRAY = os.environ.get("AUTOTUNE_BENCH_ARRAY", "numpy")
if ARRAY not in ("numpy", "cupy"):
    raise ValueError(f"AUTOTUNE_BENCH_ARRAY must be numpy or cupy, got {ARRAY!r}")
BACKEND = "nccl" if ARRAY == "cupy" else "mpi"
DENSITY = 0.01
SMOKE_N = 4103
TIMED_N = 1 << 20
SEED = 20261126
EPS32 = float(np.finfo(np.float32).eps)


def _world_size() -> int:
    if not under_mpi():
        return 1
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


P = _world_size()
# host data: CPU time of rank 0's process (what other processes on the cores take is not
# counted; python -m tests.benchmarks makes waiting ranks yield); GPU data: wall time
pytestmark = pytest.mark.benchmark(timer=time.process_time if ARRAY == "numpy" else time.perf_counter)
NAMES = [name for name, cls in ALGORITHMS.items() if BACKEND in cls.backends]


SIZES = {"smoke": SMOKE_N, "timed": TIMED_N}  # conftest parametrizes ``n`` from this


@pytest.fixture(params=NAMES, ids=[f"{a}-P{P}-d{DENSITY:g}-{ARRAY}" for a in NAMES])
def name(request):
    return request.param


@pytest.fixture(scope="module")
def comm():
    from collectives import MPICommunicator

    world = MPICommunicator()
    if BACKEND == "nccl":
        from collectives import NCCLCommunicator

        return NCCLCommunicator(world)
    return world


def _xp():
    if ARRAY == "cupy":
        import cupy

        return cupy
    return np


def _sync():
    if ARRAY == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _sum_sync(x):
    out = x.sum()
    _sync()
    return out


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _sum64(world, a: np.ndarray) -> np.ndarray:
    from mpi4py import MPI

    out = np.empty(a.size, np.float64)
    world.Allreduce(np.ascontiguousarray(a, np.float64), out, op=MPI.SUM)
    return out


def test_allreduce(benchmark, measure, comm, name, n, request):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    xp = _xp()
    algo = ALGORITHMS[name](comm)
    rng = np.random.default_rng([SEED, comm.rank, n])
    host_inputs = [rng.standard_normal(n, dtype=np.float32) for _ in range(4)]
    inputs = itertools.cycle([xp.asarray(h) for h in host_inputs])

    this_round = []

    def setup():  # untimed: align the ranks before every round
        comm.barrier()
        this_round[:] = [next(inputs)]
        return (this_round[0],), {}

    def call(x, algo=algo):
        out = algo(x, name="grad", density=DENSITY)
        _sync()
        return out

    if name == BACKEND:  # the native allreduce: the reference of the dense algorithms
        measure("allreduce", call, setup=setup, reference=True)
    elif not algo.lossy:  # communication-bound: against the native allreduce of the data
        native = ALGORITHMS[BACKEND](comm)
        measure("allreduce", call, setup=setup,
                reference=(f"native {BACKEND} allreduce", lambda: call(this_round[0], native),
                           comm.barrier))
    else:  # selection-bound: against one read pass over the round's input, like the kernels
        measure("allreduce", call, setup=setup,
                reference=("read pass x.sum()", lambda: _sum_sync(this_round[0]), comm.barrier),
                # Ok-Topk adapts from call to call (its fastest calls, a few in 200, took
                # 1.9-2.6 ms against a median of 4.3-5.3): the typical call is what is gated
                gate="median" if name == "oktopk" else None)

    # one verified call on top (the state after the timed rounds is realistic)
    x = host_inputs[0]
    before = _host(algo.state("grad").residual).copy() if algo.lossy else None
    world.Barrier()
    out = _host(call(xp.asarray(x)))
    traffic = algo.last_traffic.total()
    hashes = world.allgather(zlib.crc32(np.ascontiguousarray(out).view(np.uint8)))
    problems = []
    if len(set(hashes)) != 1:
        problems.append(f"outputs differ across ranks (CRC {hashes})")
    scale = _sum64(world, np.abs(x) + (np.abs(before) if algo.lossy else 0))
    if algo.lossy:
        after = _host(algo.state("grad").residual)
        lhs = out + _sum64(world, after)
        rhs = _sum64(world, before + x.astype(np.float64))
        tol = 16 * P * EPS32 * scale + 1e-30
        bad = np.flatnonzero(np.abs(lhs - rhs) > tol)
        if bad.size:
            problems.append(f"error feedback lost mass at {bad.size} entries, e.g. {bad[:3]}")
        bound = type(algo).traffic_bound(n, P, kernels.k_from_density(n, DENSITY), 4)
        if max(traffic.bytes_sent, traffic.bytes_recv) > bound:
            problems.append(f"traffic {traffic.bytes_sent}/{traffic.bytes_recv} B "
                            f"above the bound {bound} B")
    else:
        err = np.abs(out - _sum64(world, x))
        tol = 4 * P * EPS32 * scale + 1e-30
        if (err > tol).any():
            problems.append(f"dense result off the float64 sum by up to {err.max():.3g}")
    # every rank fails together or passes together (no rank left in a collective)
    everyone = world.allgather(problems)
    assert not any(everyone), "; ".join(f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps)
    benchmark.extra_info.update(n=n, P=P, density=DENSITY, array=ARRAY,
                                bytes_sent_rank0=traffic.bytes_sent, bytes_recv_rank0=traffic.bytes_recv)

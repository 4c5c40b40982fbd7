"""Ok-Topk's calls that refresh its thresholds (every tau' calls), one at a time.

    mpirun -n 1 python -m benchmarks.oktopk_refresh --log2n 20,27 [--calls 70] [--backend nccl]

Times each call of ``collectives.ALGORITHMS["oktopk"]`` on the same cupy input
(density 1%, the library's tau' = 32), each followed by a device synchronize,
and splits them by ``last_stats["refresh"]``: a refresh call also searches
the exact global threshold (a distributed radix select, 8 rounds of 4-bit
digits).  Prints the median of the other calls and every refresh call's time
(the first includes one-time compilation).  Reproduces docs/BENCHMARKS.md,
"Fixed cost per call" (the refresh line).  GPU (cupy); ``--backend mpi`` runs
over host MPI with staged buffers.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.oktopk_refresh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", default="20,27", help="comma list of log2 sizes")
    ap.add_argument("--calls", type=int, default=70)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--backend", choices=("nccl", "mpi"), default="nccl")
    args = ap.parse_args(argv)
    import cupy as cp

    import collectives

    comm = collectives.MPICommunicator()
    if args.backend == "nccl":
        comm = collectives.NCCLCommunicator(comm)
    for lg in [int(s) for s in args.log2n.split(",")]:
        x = cp.asarray(np.random.default_rng([lg, comm.rank]).standard_normal(1 << lg,
                                                                              dtype=np.float32))
        alg = collectives.ALGORITHMS["oktopk"](comm)
        plain, refresh = [], []
        for _ in range(args.calls):
            comm.barrier()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            alg(x, name="g", density=args.density)
            cp.cuda.Device().synchronize()
            dt = (time.perf_counter() - t0) * 1e3
            (refresh if alg.last_stats["refresh"] else plain).append(dt)
        if comm.rank == 0:
            print(f"n=2^{lg} P={comm.size}: other calls median {np.median(plain):.2f} ms "
                  f"(max {max(plain):.1f}); refresh calls " + ", ".join(f"{t:.1f}" for t in refresh)
                  + " ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

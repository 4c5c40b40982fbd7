"""cProfile of one algorithm's steady-state calls, printed by rank 0.

    mpirun -n 4 python -m benchmarks.call_profile N ALGORITHM cpu|gpu

gpu: cupy arrays through NCCL.  ``--api``: through ``autotune.allreduce`` (validation and
dispatch included) instead of the algorithm object.  10 warm-up calls, then ``--calls``
profiled (default 30); prints the
time per call (inflated by cProfile) and the 22 functions with the most own
time.  Used to find where Ok-Topk's fixed cost per call goes (BENCHMARKS.md,
"Cost model and its error" / "Fixed cost per call").
"""
import argparse
import cProfile
import pstats
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.call_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, help="elements per rank")
    ap.add_argument("algorithm", help="a registered algorithm name")
    ap.add_argument("device", choices=("cpu", "gpu"))
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--api", action="store_true", help="profile autotune.allreduce")
    args = ap.parse_args(argv)

    import collectives
    from collectives import ALGORITHMS

    comm = collectives.MPICommunicator()
    if args.device == "gpu":
        import cupy as xp
        comm = collectives.NCCLCommunicator(comm)
        sync = xp.cuda.Device().synchronize
    else:
        xp, sync = np, (lambda: None)
    if args.api:
        import autotune

        autotune.init(comm)
        lossy = ALGORITHMS[args.algorithm].lossy

        def A(x, *, name, density):
            return autotune.allreduce(x, name=name, algorithm=args.algorithm,
                                      density=density if lossy else None)
    else:
        A = ALGORITHMS[args.algorithm](comm)
    rng = np.random.default_rng(comm.rank)
    x = xp.asarray(rng.standard_t(2, args.n).astype(np.float32))
    for _ in range(10):
        A(x, name="g", density=args.density)
    sync()
    comm.barrier()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(args.calls):
        A(x, name="g", density=args.density)
    sync()
    pr.disable()
    dt = (time.perf_counter() - t0) / args.calls
    if comm.rank == 0:
        print(f"== {args.algorithm} n={args.n} P={comm.size} {args.device}: "
              f"{dt*1e3:.3f} ms/call (under cProfile)")
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

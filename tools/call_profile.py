"""cProfile of one algorithm's steady-state calls, printed by rank 0.

    mpirun -n 4 python tools/call_profile.py N ALGORITHM cpu|gpu

gpu: cupy arrays through NCCL.  10 warm-up calls, then 30 profiled; prints the
time per call (inflated by cProfile) and the 22 functions with the most own
time.  Used to find where Ok-Topk's fixed cost per call goes (BENCHMARKS.md,
"Cost model: fixed cost per call").
"""
import cProfile
import pstats
import sys
import time

import numpy as np
import collectives
from collectives import ALGORITHMS

n, algo, dev = int(sys.argv[1]), sys.argv[2], sys.argv[3]
comm = collectives.MPICommunicator()
if dev == "gpu":
    import cupy as xp
    comm = collectives.NCCLCommunicator(comm)
    sync = xp.cuda.Device().synchronize
else:
    xp, sync = np, (lambda: None)
A = ALGORITHMS[algo](comm)
rng = np.random.default_rng(comm.rank)
x = xp.asarray(rng.standard_t(2, n).astype(np.float32))
for _ in range(10):
    A(x, name="g", density=0.01)
sync(); comm.barrier()
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable()
for _ in range(30):
    A(x, name="g", density=0.01)
sync(); pr.disable()
dt = (time.perf_counter() - t0) / 30
if comm.rank == 0:
    print(f"== {algo} n={n} P={comm.size} {dev}: {dt*1e3:.3f} ms/call (under cProfile)")
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)

"""Paired A/B of a ``kernels._cuda`` setting inside one algorithm's GPU calls.

The same algorithm instance is called with the setting at A and at B in
alternation (``collectives.timeit_interleaved``, 40 rounds), so both see the
same state, data and machine drift; prints the medians and the median paired
difference (B - A) with its interquartile range.  Default: the exact top-k's
one-block path (``TOPK_SMALL_MAX`` 0 = always the radix select, vs its default).

    mpirun -n 2 python3 tools/kernel_ab.py oktopk,gtopk [ATTR A B]
"""
import sys

import cupy
import numpy as np

import collectives
from collectives import ALGORITHMS, timeit_interleaved
from kernels import _cuda

comm = collectives.NCCLCommunicator(collectives.MPICommunicator())
sync = cupy.cuda.get_current_stream().synchronize
attr = sys.argv[2] if len(sys.argv) > 2 else "TOPK_SMALL_MAX"
va = type(getattr(_cuda, attr))(sys.argv[3]) if len(sys.argv) > 3 else 0
vb = type(getattr(_cuda, attr))(sys.argv[4]) if len(sys.argv) > 4 else getattr(_cuda, attr)
for algo in sys.argv[1].split(","):
    for e in (20, 22, 24):
        for d in (0.01, 0.001):
            n = 1 << e
            x = cupy.asarray(np.random.default_rng([e, comm.rank]).standard_t(2, n).astype(np.float32))
            a = ALGORITHMS[algo](comm, check_finite=False)

            def call(v):
                def f():
                    setattr(_cuda, attr, v)
                    a(x, name="ab", density=d)
                return f
            t = 1e3 * timeit_interleaved([call(va), call(vb)], comm=comm, warmup=5,
                                         repeat=40, sync=sync)
            diff = t[1] - t[0]
            if comm.rank == 0:
                print(f"{algo:9s} 2^{e} d={d}: {attr}={va!r} {np.median(t[0]):.3f} ms, "
                      f"={vb!r} {np.median(t[1]):.3f} ms; paired diff median {np.median(diff):+.3f} "
                      f"(IQR {np.percentile(diff, 25):+.3f} .. {np.percentile(diff, 75):+.3f})",
                      flush=True)

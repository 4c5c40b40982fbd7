"""Exact top-k on one GPU: the radix select with its host read of the candidate
count, the same without it (x read three times), and the one-block kernel
(tk_small), by size m and k = m/4, 4m/5, for ``topk_select`` and for
``cap_select`` (top-k of a COO set, gather included).  Host and GPU time
per call (cupyx.profiler.benchmark, medians of 200).

    python3 tools/topk_small_bench.py
"""
import sys
from pathlib import Path

import cupy as cp
import numpy as np
from cupyx.profiler import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import _cuda  # noqa: E402

rng = np.random.default_rng(0)
#: (small_max, noread_max) of each path: radix + host read, radix without, one block
PATHS = ((0, 0), (0, 1 << 20), (1 << 20, 0))
print("m | k | radix + host read (cpu/gpu us) | radix, no read | one block | cap: radix + read | no read | one block")
for e in range(8, 20):
    m = 1 << e
    x = cp.asarray(rng.standard_t(2, m).astype(np.float32))
    idx = cp.asarray(np.sort(rng.choice(1 << 30, m, replace=False)).astype(np.int32))
    for k in (m // 4, (4 * m) // 5):
        row = []
        for fn in (_cuda.topk_select, lambda v, k, **kw: _cuda.cap_select(idx, v, k, **kw)):
            for sm, nr in PATHS:
                r = benchmark(fn, (x, k), {"small_max": sm, "noread_max": nr},
                              n_repeat=200, n_warmup=10)
                row.append(f"{1e6 * np.median(r.cpu_times):.0f}/{1e6 * np.median(r.gpu_times):.0f}")
        print(f"2^{e} | {k} | " + " | ".join(row), flush=True)

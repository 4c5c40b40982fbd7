"""Exact top-k on one GPU, by path: the radix select with its host read of the
candidate count, the same without it (x read three times), and the one-block
kernel (tk_small), by size m and k = m/4, 4m/5, for ``topk_select`` and for
``cap_select`` (top-k of a COO set, gather included).  Host and GPU time per
call (cupyx.profiler.benchmark, medians of 200).  Reproduces the kernel table
of docs/BENCHMARKS.md, "Exact top-k of a small array in one launch".

    python -m benchmarks.topk_small_bench [--log2m 8:19] [--repeat 200]

The path is chosen through the kernels' documented arguments
``topk_select(x, k, small_max=, noread_max=)`` / ``cap_select(..., small_max=,
noread_max=)`` of ``kernels._cuda`` (the cupy backend; results are the same
on every path, only the time differs).  Needs a CUDA GPU and cupy.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

#: (small_max, noread_max) of each path: radix + host read, radix without, one block
PATHS = ((0, 0), (0, 1 << 20), (1 << 20, 0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.topk_small_bench",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2m", default="8:19", help="sizes 2^a..2^b (a:b)")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args(argv)
    try:
        import cupy as cp
        from cupyx.profiler import benchmark
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:  # noqa: BLE001 - any reason cupy cannot run here
        print(f"topk_small_bench needs a CUDA GPU and cupy ({e})", file=sys.stderr)
        return 2
    from kernels import _cuda

    lo, hi = (int(v) for v in args.log2m.split(":"))
    rng = np.random.default_rng(0)
    print("m | k | radix + host read (cpu/gpu us) | radix, no read | one block "
          "| cap: radix + read | no read | one block")
    for e in range(lo, hi + 1):
        m = 1 << e
        x = _cuda.prepare(cp.asarray(rng.standard_t(2, m).astype(np.float32)))
        idx = cp.asarray(np.sort(rng.choice(1 << 30, m, replace=False)).astype(np.int32))
        for k in (m // 4, (4 * m) // 5):
            row = []
            for fn in (_cuda.topk_select, lambda v, k, **kw: _cuda.cap_select(idx, v, k, **kw)):
                for sm, nr in PATHS:
                    r = benchmark(fn, (x, k), {"small_max": sm, "noread_max": nr},
                                  n_repeat=args.repeat, n_warmup=10)
                    row.append(f"{1e6 * np.median(r.cpu_times):.0f}/"
                               f"{1e6 * np.median(r.gpu_times):.0f}")
            print(f"2^{e} | {k} | " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

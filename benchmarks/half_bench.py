"""What half-precision inputs cost: the same allreduce on float32 and on float16 /
bfloat16 inputs (widened to float32, rounded back), interleaved, medians.

    mpiexec -n 2 python -m benchmarks.half_bench [--backend nccl] [--device cuda]
        [--log2n 20,24] [--algorithms dense,oktopk] [--density 0.01] [--rounds 30]

Prints one line per (algorithm, n): the median over rounds of the slowest rank's ms
per call (``collectives.timeit_interleaved``) for float32, float16 and bfloat16 torch
tensors (torch needed), and the ratios to float32.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import autotune
import collectives
from collectives import MPICommunicator


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.half_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["mpi", "nccl"], default="mpi")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--log2n", default="20,24")
    ap.add_argument("--algorithms", default="dense,oktopk")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    if args.backend == "nccl":
        from collectives import NCCLCommunicator

        comm = autotune.init(NCCLCommunicator(MPICommunicator()))
    else:
        comm = autotune.init()
    dev = "cpu"
    if args.device == "cuda":
        dev = f"cuda:{getattr(comm, 'device', comm.rank % torch.cuda.device_count())}"
        torch.cuda.set_device(torch.device(dev))
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    g = torch.Generator(device=dev).manual_seed(comm.rank)
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    if comm.rank == 0:
        print(f"P={comm.size} backend={args.backend} device={args.device} "
              f"density={args.density}; ms per call, median of {args.rounds}")
        print("algorithm | n | float32 | float16 (x) | bfloat16 (x)")
    for alg in args.algorithms.split(","):
        for e in (int(v) for v in args.log2n.split(",")):
            n = 1 << e
            xs = {dt: torch.randn(n, generator=g, device=dev).to(dt) for dt in dtypes}
            fns = [lambda dt=dt: autotune.allreduce(
                xs[dt], name=f"{alg}.{e}.{dt}", algorithm=alg,
                density=None if alg == "dense" else args.density) for dt in dtypes]
            # the slowest rank's time per call, interleaved rounds
            t = collectives.timeit_interleaved(fns, comm=comm, warmup=3, repeat=args.rounds,
                                               sync=sync)
            med = dict(zip(dtypes, np.median(t, axis=1)))
            if comm.rank == 0:
                f32 = med[torch.float32]
                print(f"{alg} | 2^{e} | {1e3 * f32:.3f} | "
                      f"{1e3 * med[torch.float16]:.3f} ({med[torch.float16] / f32:.2f}) | "
                      f"{1e3 * med[torch.bfloat16]:.3f} ({med[torch.bfloat16] / f32:.2f})",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

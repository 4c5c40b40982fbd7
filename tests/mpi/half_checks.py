"""Half-precision inputs under mpiexec: reduced in float32, rounded back.

    mpiexec -n P python -m tests.mpi.half_checks [--backend mpi|nccl] [--array host|gpu]
                                                 [--no-torch]

For every registered algorithm the backend supports, through ``autotune.allreduce``
(where half precision is handled), with fresh random data and three calls per tensor
(so residuals carry over):
  * float16 (numpy on the host, cupy on the GPU) and torch's float16 and bfloat16
    (when torch is installed and not --no-torch; CUDA tensors with --array gpu);
  * the output has the input's type, dtype, shape and device, is bitwise identical
    on every rank, and equals the same algorithm run on the float32 widening of the
    same inputs (under another name) rounded to the input's dtype; a sparse
    algorithm's residual is float32;
  * float16 on one rank and float32 (or bfloat16) on the others, and a non-contiguous
    half-precision tensor, raise the same error on every rank; so does a non-contiguous
    float32 tensor through ``auto`` and ``resolve``.
Exits non-zero (aborting the job) on the first failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import autotune
from collectives import ALGORITHMS, MPICommunicator
from tests.mpi import identical, run_cases

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.rank, WORLD.size
SHAPE = (37, 29)          # 1073 values: odd, not a power of two
DENSITY = 0.05


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def host_bytes(a) -> bytes:
    """The raw bytes of a numpy / cupy array or torch tensor (bfloat16 too)."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch

        return a.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    if mod.startswith("cupy"):
        return a.get().tobytes()
    return np.ascontiguousarray(a).tobytes()


class Kind:
    """One half-precision input kind: how to make it, widen it, and what comes back."""

    def __init__(self, label: str, make, widen, module: str, dtype: str, device: str):
        self.label, self.make, self.widen = label, make, widen
        self.module, self.dtype, self.device = module, dtype, device


def kinds(array: str, torch_kinds: bool) -> list[Kind]:
    out = []
    if array == "host":
        out.append(Kind("numpy float16", lambda x: x.astype(np.float16),
                        lambda h: h.astype(np.float32), "numpy", "float16", "cpu"))
    else:
        import cupy

        out.append(Kind("cupy float16", lambda x: cupy.asarray(x.astype(np.float16)),
                        lambda h: h.astype(cupy.float32), "cupy", "float16", "cuda"))
    if not torch_kinds:
        return out
    try:
        import torch
    except ImportError:
        return out
    dev = "cpu" if array == "host" else "cuda"
    for dt in (torch.float16, torch.bfloat16):
        out.append(Kind(f"torch {str(dt).removeprefix('torch.')}", lambda x, dt=dt: torch.as_tensor(x, device=dev).to(dt),
                        lambda h: h.float(), "torch", str(dt).removeprefix("torch."), dev))
    return out


def describe(a) -> tuple[str, str, tuple, str]:
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        return mod, str(a.dtype).removeprefix("torch."), tuple(a.shape), a.device.type
    return mod, a.dtype.name, tuple(a.shape), "cuda" if mod == "cupy" else "cpu"


def equal(a, b) -> bool:
    return host_bytes(a) == host_bytes(b)


def expect_error(fn, exc, match: str, what: str) -> None:
    try:
        fn()
    except exc as e:
        check(match in str(e), f"{what}: wrong message {e}")
        return
    raise AssertionError(f"{what}: no {exc.__name__} raised")


def case_algorithms(ks: list[Kind], rng) -> int:
    n = 0
    comm = autotune.init()
    names = [a for a, cls in ALGORITHMS.items() if cls.supports(comm)]
    for kind in ks:
        for alg in names:
            lossy = ALGORITHMS[alg].lossy
            dens = DENSITY if lossy else None
            tag = f"{kind.label}.{alg}"
            for call in range(3):
                x = (rng.standard_normal(SHAPE) * (1 + 3 * rng.random())).astype(np.float32)
                h = kind.make(x)
                out = autotune.allreduce(h, name=f"half.{tag}", algorithm=alg, density=dens)
                ref = autotune.allreduce(kind.widen(h), name=f"wide.{tag}", algorithm=alg,
                                         density=dens)
                what = f"{tag} call {call}"
                check(describe(out) == (kind.module, kind.dtype, SHAPE, kind.device),
                      f"{what}: got {describe(out)}")
                check(identical(WORLD, np.frombuffer(host_bytes(out), np.uint8)),
                      f"{what}: outputs differ across ranks")
                check(equal(out, _round(ref, h)),
                      f"{what}: differs from the float32 run rounded to {kind.dtype}")
            if lossy:
                res = autotune.algorithm_instance(alg).state(f"half.{tag}").residual
                check(res.dtype == np.float32, f"{tag}: residual dtype {res.dtype}")
            n += 1
    return n


def _round(ref, like):
    """``ref`` (float32, the input's kind) rounded to ``like``'s dtype."""
    if type(like).__module__.startswith("torch"):
        return ref.to(like.dtype)
    return ref.astype(like.dtype)


def case_errors(ks: list[Kind], rng) -> int:
    n = 0
    x = rng.standard_normal(SHAPE).astype(np.float32)
    f16 = ks[0]
    if P > 1:   # float16 on rank 0, float32 elsewhere: the caller's dtypes differ
        mixed = f16.make(x) if RANK == 0 else f16.widen(f16.make(x))
        for alg in ("dense", "oktopk", "auto"):
            expect_error(lambda: autotune.allreduce(mixed, name="mixed", algorithm=alg,
                                                    density=DENSITY),
                         ValueError, "dtype differs", f"mixed float16/float32 {alg}")
            n += 1
    for kind in ks:
        t = kind.make(x).T                              # non-contiguous
        for alg in ("dense", "oktopk", "auto"):
            expect_error(lambda: autotune.allreduce(t, name="nc", algorithm=alg,
                                                    density=DENSITY),
                         ValueError, "not contiguous", f"{kind.label} non-contiguous {alg}")
            n += 1
    # float32 itself: a non-contiguous view raises through auto and resolve too
    # (validation looks at the array unless the input was widened)
    x32 = ks[0].widen(ks[0].make(x)).T
    for fn, what in ((lambda: autotune.allreduce(x32, name="nc32"), "auto"),
                     (lambda: autotune.dispatch.resolve(x32, name="nc32"), "resolve"),
                     (lambda: autotune.allreduce(x32, algorithm="dense"), "dense")):
        expect_error(fn, ValueError, "not contiguous", f"float32 non-contiguous {what}")
        n += 1
    torch_kinds = [k for k in ks if k.module == "torch"]
    if len(torch_kinds) == 2 and P > 1:   # float16 on rank 0, bfloat16 elsewhere
        a, b = torch_kinds
        t = a.make(x) if RANK == 0 else b.make(x)
        expect_error(lambda: autotune.allreduce(t, algorithm="dense"),
                     ValueError, "dtype differs", "mixed float16/bfloat16")
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["mpi", "nccl"], default="mpi")
    ap.add_argument("--array", choices=["host", "gpu"], default="host")
    ap.add_argument("--no-torch", dest="torch", action="store_false",
                    help="leave out torch's float16 and bfloat16 (its import is most of a run)")
    args = ap.parse_args(argv)
    if args.backend == "nccl":
        from collectives import NCCLCommunicator

        autotune.init(NCCLCommunicator(MPICommunicator(WORLD)))
    else:
        autotune.init(MPICommunicator(WORLD))
    seed = WORLD.bcast(int(os.environ.get("HALF_SEED", time.time_ns() % 2**32)), 0)
    rng = np.random.default_rng([seed, RANK])
    ks = kinds(args.array, args.torch)
    if RANK == 0:
        print(f"half_checks P={P} seed={seed} backend={args.backend} array={args.array} "
              f"kinds={[k.label for k in ks]}", flush=True)
    return run_cases(WORLD, "half_checks",
                     {"algorithms": lambda: case_algorithms(ks, rng),
                      "errors": lambda: case_errors(ks, rng)}, seed)


if __name__ == "__main__":
    sys.exit(main())

"""The conformance suite, run under ``mpiexec -n P`` for every registered algorithm.

Each case draws fresh random data (seeded from the wall clock and printed so a
failure can be replayed with CONFORMANCE_SEED) and asserts DESIGN.md's
invariants:
  1. bitwise-identical output on all ranks;
  2. dense algorithms equal the float64 sum within floating-point tolerance;
  3. conservation under error feedback: over the iterations,
     sum(outputs) + sum(residuals over ranks) == sum(inputs over ranks);
  4. measured traffic per rank within the algorithm's bound;
  6. bad input gives the same clear error on every rank.
Every registered algorithm runs, and the VARIANTS (name@key=value: an algorithm
with non-default constructor options).
Run:  mpiexec -n 4 python -m tests.mpi.conformance [--quick] [--algorithms a,b]
          [--backend mpi|nccl] [--array numpy|cupy|torch] [--plugin MODULE]
(--array cupy/torch put the data on the GPU; torch goes through autotune.allreduce
and DLPack, so it also checks that the output comes back as a torch CUDA tensor.)
Exits non-zero (and aborts the MPI job) on the first failure.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import kernels
from autotune.dispatch import parse_spec
import collectives
from collectives import ALGORITHMS, MPICommunicator
from tests.mpi import VARIANTS, abort_job, identical

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()
EPS32 = float(np.finfo(np.float32).eps)


class Failure(AssertionError):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failure(msg)


def all_ranks_agree(flag: bool) -> bool:
    return bool(WORLD.allreduce(int(bool(flag)), op=MPI.MIN))


# -- data -----------------------------------------------------------------------
def draw(dist: str, n: int, rng: np.random.Generator, it: int = 0) -> np.ndarray:
    """Fresh data of one distribution; differs per rank and per iteration."""
    if dist == "gaussian":
        x = rng.standard_normal(n)
    elif dist == "heavy":  # Student-t, 1.5 degrees of freedom: gradient-like tails
        x = rng.standard_t(1.5, n)
    elif dist == "ties":  # few distinct magnitudes: many ties at the threshold
        x = rng.integers(-3, 4, n).astype(np.float64)
    elif dist == "hot":  # every rank's large values in one shared region
        x = rng.standard_normal(n) * 1e-3
        lo = n // 3
        hi = max(lo + 1, lo + n // 10)
        x[lo:hi] = rng.standard_normal(hi - lo) * 10.0
    elif dist == "equal":  # all values equal (one random value per rank/iteration)
        x = np.full(n, rng.uniform(-2, 2))
    else:
        raise ValueError(dist)
    return np.ascontiguousarray(x, dtype=np.float32)


def gather_sum64(x) -> np.ndarray:
    out = np.empty(x.size, dtype=np.float64)
    WORLD.Allreduce(np.ascontiguousarray(x, dtype=np.float64), out, op=MPI.SUM)
    return out


# -- how the algorithm is reached ------------------------------------------------
OPTS = {"backend": "mpi", "array": "numpy"}
_COMM = {}
_CASE = [0]


def communicator():
    key = OPTS["backend"]
    if key not in _COMM:
        if key == "nccl":
            from collectives import NCCLCommunicator

            _COMM[key] = NCCLCommunicator(MPICommunicator(WORLD))
        else:
            _COMM[key] = MPICommunicator(WORLD)
    return _COMM[key]


def to_host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith("torch"):
        check(a.is_cuda, "torch output left the GPU")
        a = a.cpu().numpy()
        return a
    return a.get()


class Caller:
    """Calls one algorithm on the configured backend and array type."""

    def __init__(self, spec: str):
        name, kw = parse_spec(spec)
        self.algo = ALGORITHMS[name](communicator(), **kw)
        self.name = name
        _CASE[0] += 1
        self.tensor = f"t{_CASE[0]}"
        if OPTS["array"] == "torch":
            import autotune

            autotune.init(communicator(), options={name: kw})

    @staticmethod
    def _device(x: np.ndarray, asarray):
        """The same values on the device, keeping non-contiguity (a strided view)."""
        if x.flags.c_contiguous:
            return asarray(x)
        return asarray(np.repeat(x, 2))[::2]

    def __call__(self, x: np.ndarray, density):
        mode = OPTS["array"]
        if mode == "numpy":
            return self.algo(x, name=self.tensor, density=density)
        if mode == "cupy":
            import cupy

            out = self.algo(self._device(x, cupy.asarray), name=self.tensor, density=density)
            check(type(out).__module__.startswith("cupy"), "cupy input, non-cupy output")
            return to_host(out)
        import torch
        import autotune

        t = self._device(x, lambda a: torch.as_tensor(a, device="cuda"))
        out = autotune.allreduce(t, name=self.tensor, algorithm=self.name, density=density)
        check(isinstance(out, torch.Tensor) and out.device == t.device, "torch output type/device")
        return to_host(out)

    @property
    def impl(self):
        if OPTS["array"] == "torch":
            import autotune

            return autotune.algorithm_instance(self.name)
        return self.algo

    def residual(self):
        return to_host(self.impl.state(self.tensor).residual)


# -- cases ----------------------------------------------------------------------
def run_case(name: str, n: int, dist: str, density: float, iters: int, rng) -> str:
    call = Caller(name)
    algo = call.algo
    lossy = algo.lossy
    k = kernels.k_from_density(n, density)
    bound = type(algo).traffic_bound(n, P, k, 4)
    cum_in = np.zeros(n, np.float64)
    cum_abs = np.zeros(n, np.float64)
    cum_out = np.zeros(n, np.float64)
    prev = None
    for it in range(iters):
        x = draw(dist, n, rng, it)
        out = call(x, density)
        check(out.shape == (n,) and out.dtype == np.float32,
              f"output shape/dtype {out.shape}/{out.dtype}")
        # the output is the caller's: no later call may reuse its memory (scratch)
        check(prev is None or np.array_equal(prev[0], prev[1]),
              "an earlier call's output changed during a later call")
        prev = (out, out.copy())
        check(identical(WORLD, out), "outputs differ across ranks")
        t = call.impl.last_traffic.total()
        check(t.bytes_sent <= bound and t.bytes_recv <= bound,
              f"traffic sent={t.bytes_sent} recv={t.bytes_recv} above bound {bound} B "
              f"(it {it}, by phase {call.impl.last_traffic.as_dict()})")
        cum_in += x
        cum_abs += np.abs(x)
        cum_out += out
        if not lossy:
            ref = gather_sum64(x)
            scale = gather_sum64(np.abs(x))
            err = np.abs(out - ref)
            tol = 4 * P * EPS32 * scale + 1e-30
            check(bool((err <= tol).all()),
                  f"dense result off the float64 sum: max err {err.max():.3g}, "
                  f"tol at worst {tol[np.argmax(err - tol)]:.3g}")
    inputs = gather_sum64(cum_in)
    scale = gather_sum64(cum_abs)
    if lossy:
        residuals = gather_sum64(call.residual())
        lhs = cum_out + residuals
        err = np.abs(lhs - inputs)
        tol = 16 * iters * P * EPS32 * scale + 1e-30
        bad = np.flatnonzero(err > tol)
        check(bad.size == 0,
              f"conservation broken at {bad.size} entries, e.g. index {bad[:3]}: "
              f"outputs+residuals={lhs[bad[:3]]} inputs={inputs[bad[:3]]}")
    return "ok"


BAD_CASES = ("int-dtype", "int-dtype-one-rank", "non-contiguous", "nan-one-rank",
             "inf", "shape-differs", "empty", "density-0", "density-gt-1")


def bad_input(case: str, rng):
    x = rng.standard_normal(64).astype(np.float32)
    density = 0.1
    last = P - 1
    if case == "int-dtype":
        x = x.astype(np.int32)
    elif case == "int-dtype-one-rank":
        x = x.astype(np.int64) if RANK == last else x
    elif case == "non-contiguous":
        x = rng.standard_normal(128).astype(np.float32)[::2]
    elif case == "nan-one-rank":
        if RANK == last:
            x[5] = np.nan
    elif case == "inf":
        x[0] = np.inf
    elif case == "shape-differs":
        x = rng.standard_normal(65 if RANK == 0 else 64).astype(np.float32)
        if P == 1:
            return None
    elif case == "empty":
        x = x[:0]
    elif case == "density-0":
        density = 0.0
    elif case == "density-gt-1":
        density = 1.5
    return x, density


def run_bad(name: str, case: str, rng) -> str:
    call = Caller(name)
    if case.startswith("density") and not call.algo.lossy:
        return "n/a"
    got = bad_input(case, rng)
    if got is None:
        return "n/a"
    x, density = got
    t0 = time.perf_counter()
    try:
        call(x, density)
        if case in ("nan-one-rank", "inf"):
            # device inputs are flagged on the device and reported at the check
            # that ends a step (host inputs raised in the call already)
            collectives.report_nonfinite(call.algo.comm)
        kind, msg = "none", ""
    except (TypeError, ValueError) as e:
        kind, msg = type(e).__name__, str(e)
    took = time.perf_counter() - t0
    kinds = WORLD.allgather(kind)
    check(all(kk == kinds[0] for kk in kinds) and kinds[0] != "none",
          f"bad input {case!r}: errors per rank {kinds}")
    check(len(msg) > 10, f"bad input {case!r}: unclear message {msg!r}")
    check(took < 5.0, f"bad input {case!r}: took {took:.1f}s to fail")
    return kinds[0]


#: the large size on the GPU (its multi-block selection paths start at 2^18) and on the CPU,
#: where the one path that depends on n (the sampled k-th largest of kernels._select, from
#: 8 x its sample) starts at 2^15: 2^16 takes it at both densities, for 1/16 of the time
LARGE = 2**20
LARGE_HOST = 2**16
assert LARGE_HOST >= 8 * kernels._select._SAMPLE, "the host's large size misses the sampled path"
#: process counts that also run the large size on the host (at P > 4 ranks share a core of
#: the 2-core CI machine and its cases cost most): 1, a power of two and the smallest
#: non-power of two; every P runs every smaller size (the GPU stages run LARGE at their P)
LARGE_AT = (1, 2, 3)


SMALL_CALLS = 4  # error-feedback calls per case below the large size: residuals carried, thresholds reused
EVERY_P = ("gaussian", "hot")            # the one-hot region: the traffic bound's worst case
ROTATING = ("heavy", "ties", "equal")    # one of these per P, chosen by P


def distributions() -> list[str]:
    """The distributions this P runs: EVERY_P and one of ROTATING, so that across
    the P the suite runs (1..8) every distribution meets every size, power of two
    or not, while each P pays for three (on two cores the suite's time is the
    number of calls at large P)."""
    return [*EVERY_P, ROTATING[P % len(ROTATING)]]


def plan(n: int, dist: str, density: float) -> list[tuple[float, int]]:
    """(density, calls) of one size and distribution.

    Below the large size: both densities, SMALL_CALLS calls of error feedback
    each.  At it two calls each (a residual carried into a second call, a
    reused threshold): the Gaussian case at both densities, the one-hot region
    and the rotating distribution at one.
    """
    if n < LARGE_HOST:
        return [(d, SMALL_CALLS) for d in (density, 0.001)]
    if dist == "gaussian":
        return [(d, 2) for d in (density, 0.001)]
    return [(0.001 if dist in ("heavy", "equal") else density, 2)]


def main(argv=None) -> int:
    # --plugin first: the modules it names register their algorithms before the
    # default --algorithms list is read from the registry
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                     help="import MODULE first (e.g. one that registers an algorithm); "
                          "repeatable")
    for module in pre.parse_known_args(argv)[0].plugin:
        importlib.import_module(module)
    ap = argparse.ArgumentParser(parents=[pre])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--algorithms", default=",".join([*ALGORITHMS, *VARIANTS]),
                    help="registered names, or name@key=value+... for a variant")
    ap.add_argument("--density", type=float, default=0.05)
    ap.add_argument("--backend", choices=["mpi", "nccl"], default="mpi")
    ap.add_argument("--array", choices=["numpy", "cupy", "torch"], default="numpy")
    args = ap.parse_args(argv)
    OPTS["backend"], OPTS["array"] = args.backend, args.array
    seed = int(os.environ.get("CONFORMANCE_SEED", time.time_ns() % 2**32))
    seed = WORLD.bcast(seed, 0)
    rng = np.random.default_rng([seed, RANK])
    classes = {a: ALGORITHMS[parse_spec(a)[0]] for a in args.algorithms.split(",") if a}
    names = [a for a, cls in classes.items() if cls.supports(communicator())]
    big = LARGE_HOST if args.array == "numpy" else LARGE
    large = not args.quick and (P in LARGE_AT or args.array != "numpy")
    sizes = [1, max(1, P - 1), 1001, 4096 + 7] + ([big] if large else [])
    dists = distributions()
    if RANK == 0:
        print(f"conformance P={P} seed={seed} backend={args.backend} array={args.array} "
              f"algorithms={names}", flush=True)
    cases = 0
    current = ""
    try:
        for name in names:
            t0 = time.perf_counter()
            for n in sizes:
                for dist in dists:
                    for density, iters in plan(n, dist, args.density):
                        current = f"{name} n={n} dist={dist} density={density}"
                        run_case(name, n, dist, density, iters, rng)
                        cases += 1
                        if not classes[name].lossy:
                            break
            for case in BAD_CASES:
                current = f"{name} bad input {case}"
                run_bad(name, case, rng)
                cases += 1
            if RANK == 0:
                print(f"  {name:10s} ok  ({time.perf_counter() - t0:.1f}s)", flush=True)
    except Exception:
        return abort_job(WORLD, current, seed)
    if RANK == 0:
        print(f"conformance P={P}: {cases} cases passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

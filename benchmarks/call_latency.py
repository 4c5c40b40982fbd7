"""Per-call latency, each call synchronized, against the raw native allreduce.

    mpirun -n 2 python -m benchmarks.call_latency --log2n 10,16,20,22 \\
        --algorithms raw,nccl,dense,auto,oktopk,topka,gtopk \\
        --profile profiles/gpu_h200_nvlink_p2.json --json out.json
    autotune launch -n 2 -m benchmarks.call_latency --device cpu --algorithms raw,mpi,dense

Every round times each variant once (interleaved, after a host barrier): a call
of ``autotune.allreduce`` on n float32 values (GPU: a cupy array, then a
synchronize of the current stream; CPU: a numpy array over MPI).  ``raw`` is
ncclAllReduce (CPU: MPI_Allreduce) through the library's own communicator
into a preallocated buffer.  ``floor`` (GPU) is the memory floor of a sparse
algorithm's local work with error feedback: one fused kernel (float4 loads and
stores) that reads the gradient and the residual and writes the residual and
the output (4n values moved; issue #25's "memory floor").  Prints the median per variant
and size (microseconds).  ``--stages ALG``: also one synchronized call of ALG
split into its host stages (the input's view, validation, the algorithm's
enqueue, the wait for the device), and the two pieces validation adds to a
raw ncclAllReduce (its host exchange of two ints, its device NaN/Inf scan),
each timed alone in the same rounds (GPU: the scan is a device kernel; on the
CPU the stages alone).  Where the host time of one variant
goes, function by function: ``benchmarks.call_profile``.
"""
import argparse
import functools
import json
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.call_latency", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2n", default="10,16,20,22", help="comma list of log2 sizes")
    ap.add_argument("--algorithms", default="raw,nccl,dense,oktopk",
                    help="comma list: raw, floor, auto or registered algorithm names")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--profile", help="profile for algorithm 'auto'")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="gpu: cupy arrays over NCCL (default); cpu: numpy arrays over MPI")
    ap.add_argument("--stages", metavar="ALG", help="also split one call of ALG into stages")
    args = ap.parse_args(argv)
    import collectives

    if args.stages and args.stages not in collectives.ALGORITHMS:
        ap.error(f"--stages: a registered algorithm ({', '.join(collectives.ALGORITHMS)}), "
                 f"got {args.stages!r}")

    import autotune

    gpu = args.device == "gpu"
    if gpu:
        import cupy as xp
        from cupy.cuda import nccl

        comm = collectives.NCCLCommunicator(collectives.MPICommunicator())
        mpi, sync = comm.mpi, xp.cuda.get_current_stream().synchronize
    else:
        xp, comm = np, collectives.MPICommunicator()
        mpi, sync = comm, None
    autotune.init(comm, profile=args.profile)
    algos = args.algorithms.split(",")
    sizes = [int(s) for s in args.log2n.split(",")]
    rng = np.random.default_rng(1234 + comm.rank)
    results: dict = {}

    for lg in sizes:
        n = 1 << lg
        x = xp.asarray(rng.standard_normal(n, dtype=np.float32))
        out = xp.empty_like(x)
        name = f"g{n}"

        def raw():  # the native allreduce through the library's own communicator
            if gpu:
                comm.nccl.allReduce(x.data.ptr, out.data.ptr, n, nccl.NCCL_FLOAT32,
                                    nccl.NCCL_SUM, xp.cuda.get_current_stream().ptr)
            else:
                comm.comm.Allreduce(x, out)

        if "floor" in algos:
            if not gpu:
                ap.error("floor: GPU only")
            resid, floor_kernel = xp.zeros_like(x), _floor_kernel()

        def floor():  # read x and the residual, write the residual and the output
            floor_kernel(x, resid, out)

        special = {"raw": raw, "floor": floor}
        calls = [special[a] if a in special else functools.partial(
            autotune.allreduce, x, name=name, algorithm=a, density=args.density) for a in algos]
        # in the order given, after a barrier each, this rank's own times (printed by rank 0)
        times = collectives.timeit_interleaved(calls, comm=mpi, warmup=args.warmup,
                                               repeat=args.rounds, sync=sync, rotate=False,
                                               slowest=False)
        med = {a: float(np.median(t)) * 1e6 for a, t in zip(algos, times)}
        if args.stages:
            med["stages"] = _stages(comm, mpi, x, raw, args, sync)
        results[lg] = med
        if "auto" in algos and comm.rank == 0:
            picks = {k.name: c.algorithm for k, c in autotune.decisions().items()}
            med["auto_pick"] = picks.get(name)
        if comm.rank == 0 and args.stages:
            print(f"n=2^{lg} {args.stages} stages: "
                  + "  ".join(f"{k} {v:.1f}" for k, v in med["stages"].items()), flush=True)
        if comm.rank == 0:
            print(f"n=2^{lg}: " + "  ".join(f"{a} {med[a]:.0f}" for a in algos)
                  + (f"  (auto picks {med.get('auto_pick')})" if "auto" in algos else "")
                  + "  [us, median of %d]" % args.rounds, flush=True)

    if args.json and comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"P": comm.size, "density": args.density, "us": results}, f, indent=1)
    return 0


_FLOOR = r"""
extern "C" __global__ void ef_floor(const float4* __restrict__ x, float4* __restrict__ r,
                                   float4* __restrict__ out, const long long n4)
{
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n4;
         j += (long long)gridDim.x * blockDim.x) {
        const float4 a = x[j];
        float4 b = r[j];
        b.x += a.x; b.y += a.y; b.z += a.z; b.w += a.w;
        out[j] = b;
        b.x *= 0.5f; b.y *= 0.5f; b.z *= 0.5f; b.w *= 0.5f;
        r[j] = b;
    }
}
"""


@functools.cache
def _floor_kernel():
    """x, r, out -> out = x + r, r = out / 2: float4 loads and stores (n a multiple of 4)."""
    import cupy

    fn = cupy.RawKernel(_FLOOR, "ef_floor")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def run(x, r, out):
        n4 = x.size // 4
        fn((min(-(-n4 // 256), 32 * sms),), (256,), (x, r, out, np.int64(n4)))
    return run


def _stages(comm, mpi, x, raw, args, sync) -> dict:
    """Median us of each host stage of one synchronized call of ``args.stages``
    (what ``autotune.allreduce`` does, step by step; the input's view is the
    library's own internal step), and of ``raw`` (ncclAllReduce) preceded by
    validation's exchange (two ints over the library's MPI communicator), or by
    its NaN/Inf scan (``kernels.flag_nonfinite``)."""
    import autotune
    import kernels
    from autotune._convert import as_array
    from collectives import validate

    alg = args.stages
    algo = autotune.algorithm_instance(alg)
    kw = {"density": args.density} if algo.lossy else {}
    pieces = {}
    if args.device == "gpu":
        mine = np.zeros(2, np.int64)
        every = np.zeros(2 * comm.size, np.int64)
        mask = kernels.array_module(x).zeros(1, dtype=np.uint64)
        pieces = {"exchange+raw": lambda: (mpi.comm.Allgather(mine, every), raw()),
                  "scan+raw": lambda: (kernels.flag_nonfinite(x, 1, mask), raw())}
    sync = sync or (lambda: None)
    rows = []
    for r in range(args.warmup + args.rounds):
        row = []
        mpi.barrier()
        t0 = time.perf_counter()
        arr, _ = as_array(x)
        t1 = time.perf_counter()
        validate(comm, arr, density=kw.get("density"), tag="str:stages", call=f"{alg}/sum")
        t2 = time.perf_counter()
        algo(arr, name="stages", validated=True, **kw)
        t3 = time.perf_counter()
        sync()
        t4 = time.perf_counter()
        row += [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0]
        for f in pieces.values():
            mpi.barrier()
            t0 = time.perf_counter()
            f()
            sync()
            row.append(time.perf_counter() - t0)
        if r >= args.warmup:
            rows.append(row)
    med = np.median(np.array(rows), axis=0) * 1e6
    names = ["view", "validate", "enqueue", "wait", "total", *pieces]
    return {k: float(v) for k, v in zip(names, med)}


if __name__ == "__main__":
    raise SystemExit(main())

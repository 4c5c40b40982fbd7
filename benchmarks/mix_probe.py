"""Why is an algorithm slower when other algorithms' calls run in between?

Times one algorithm (``--target``, default topka) on the same data under
several schedules, in one process per rank, and prints its median per call and
its split (select / comm / reduce, each phase closed by a stream synchronize on
GPUs):

  alone        the target only (fresh instance)
  with X       rounds of [target, X] for each other algorithm X
  idle T ms    rounds of [target, host sleep of T ms]: the GPU idles as it
               does while a host-staged MPI call runs (power state, clocks)
  spin T ms    rounds of [target, host busy loop of T ms]: GPU idle, CPU busy
  gpu T ms     rounds of [target, one GPU kernel spinning T ms, waited for]:
               one SM busy, CPU in the synchronize (spin-wait by default)
  mm T ms      rounds of [target, float32 matmuls (2048^2) for T ms]: every SM
               busy, as a training step's forward and backward keep them
  with all     rounds of [target, every other algorithm]
  all+free     as 'with all', the memory pool's free blocks released before
               each target call (untimed): is it the allocator?
  all+devsync  as 'with all', a device-wide synchronize before each target call
               (untimed): is it work left running on another stream?
  alone again  the target only, after all of the above: is the slowdown a
               lasting state (communicator, pool) or only while the others run?

Each schedule builds fresh algorithm instances and drops them afterwards.
Run:  mpirun -n 2 python -m benchmarks.mix_probe --backend nccl --log2n 24 --density 0.001
      [--json FILE]   (host data with --backend mpi: a CPU check of the probe itself)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import collectives
from collectives import ALGORITHMS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.mix_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("mpi", "nccl"), default="nccl")
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--target", default="topka")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--idle-ms", default="1,10,50", help="host sleeps to interleave (comma list)")
    ap.add_argument("--only", help="comma list of schedules to run (labels as printed)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    comm = collectives.MPICommunicator()
    gpu = args.backend == "nccl"
    if gpu:
        import cupy

        comm = collectives.NCCLCommunicator(comm)
        comm.sync_phases = True
        stream_sync = cupy.cuda.get_current_stream().synchronize
        pool = cupy.get_default_memory_pool()
    n = 1 << args.log2n
    rng = np.random.default_rng([7, comm.rank])
    x = rng.standard_t(2.0, n).astype(np.float32)
    if gpu:
        x = cupy.asarray(x)
    others = [a for a, c in ALGORITHMS.items() if a != args.target and c.supports(comm)]

    def make(name):
        algo = ALGORITHMS[name](comm, check_finite=False)
        return lambda: algo(x, name="probe", density=args.density), algo

    def pause(spec):
        kind, ms = spec.split(":")
        t = float(ms) / 1e3
        if kind == "idle":
            return lambda: time.sleep(t)
        if kind == "spin":
            def spin():
                end = time.perf_counter() + t
                while time.perf_counter() < end:
                    pass
            return spin
        if kind == "mm":
            a = cupy.random.standard_normal((2048, 2048), dtype=cupy.float32)

            def mm():
                end = time.perf_counter() + t
                while time.perf_counter() < end:
                    a @ a
                    stream_sync()
            return mm
        clock = cupy.cuda.Device().attributes["ClockRate"] * 1e3   # Hz
        kern = cupy.RawKernel(r"""extern "C" __global__ void spin(long long c) {
            long long s = clock64(); while (clock64() - s < c) {} }""", "spin")
        return lambda: (kern((1,), (1,), (np.int64(t * clock),)), stream_sync())

    def schedule(partners, before_target=None):
        """Median seconds of the target per call and its mean split, over
        ``repeat`` rounds of [target, *partners] (after ``warmup`` rounds)."""
        fn, algo = make(args.target)
        calls = [pause(p) if ":" in p else make(p)[0] for p in partners]
        times, splits = [], []
        for r in range(args.warmup + args.repeat):
            if before_target:
                before_target()
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            if gpu:
                stream_sync()
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                times.append(dt)
                splits.append(algo.last_traffic.by_kind())
            for c in calls:
                comm.barrier()
                c()
                if gpu:
                    stream_sync()
        t = comm.control_allreduce(np.array(times), "max")
        split = {k: 1e3 * float(np.mean([s.get(k, 0.0) for s in splits]))
                 for k in ("select", "comm", "reduce")}
        return {"median_ms": 1e3 * float(np.median(t)), "min_ms": 1e3 * float(t.min()),
                "split_ms": split}

    plan = [("alone", [], None)]
    plan += [(f"with {p}", [p], None) for p in others]
    for kind in ("idle", "spin") + (("gpu", "mm") if gpu else ()):
        plan += [(f"{kind} {t} ms", [f"{kind}:{t}"], None) for t in args.idle_ms.split(",") if t]
    plan += [("with all", others, None)]
    if gpu:
        plan += [("all+free", others, pool.free_all_blocks),
                 ("all+devsync", others, cupy.cuda.Device().synchronize)]
    plan += [("alone again", [], None)]
    if args.only:
        keep = set(args.only.split(","))
        plan = [p for p in plan if p[0] in keep]
    rows = []
    for label, partners, hook in plan:
        res = schedule(partners, hook)
        res["schedule"] = label
        rows.append(res)
        if comm.rank == 0:
            s = res["split_ms"]
            print(f"{label:22s} {res['median_ms']:8.3f} ms (min {res['min_ms']:.3f})  "
                  f"select {s['select']:.3f}  comm {s['comm']:.3f}  reduce {s['reduce']:.3f}",
                  flush=True)
    if comm.rank == 0 and args.json:
        meta = {"P": comm.size, "n": n, "density": args.density, "target": args.target,
                "backend": args.backend, "repeat": args.repeat, "warmup": args.warmup}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``autotune bench``: every algorithm versus native MPI_Allreduce, time and traffic.

Run under MPI (``mpiexec -n 4 autotune bench`` or ``autotune bench --np 4``).
For each n it times every algorithm on the same heavy-tailed gradient-like
data, reports the median per call (slowest rank), the speedup over native
MPI_Allreduce measured in the same run, the bytes each rank sent (max over
ranks), and the split of time into selection / communication / reduction.
On GPUs (``--backend nccl`` or ``--device gpu``) data lives in device memory,
the baseline is ncclAllReduce (resp. MPI_Allreduce) and each phase ends with
a stream synchronize so the split is honest (this removes any overlap).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from collectives import ALGORITHMS, BACKENDS, pause, timeit, timeit_interleaved

from .dispatch import parse_spec


def sweep(comm, sizes, algorithms, density: float, repeat: int, warmup: int, seed: int = 0,
          progress=None, device: str = "cpu", baseline: str | None = None, order: str = "auto",
          gap_s: float = 0.0):
    """Time every algorithm at every n; one row per (n, algorithm).

    ``order="interleaved"`` runs repeat i of every algorithm before repeat i+1 of
    any (``collectives.timeit_interleaved``), so slow drifts of a shared machine
    fall on all algorithms of a size alike and their ratios (speedups, the regret
    study's best/chosen) are measured side by side.  It keeps every algorithm's
    state and scratch alive for the whole size (more memory), and each call
    finds the caches as the other algorithms left them.  ``"sequential"`` runs
    each algorithm's warm-up and repeats in turn and frees it before the next.
    ``"auto"`` (default): interleaved for host data, sequential on GPUs, where
    the other algorithms' calls put a pause before each call and a paused GPU
    call is slower (docs/BENCHMARKS.md, "Side by side" and "Calls after a gap").

    ``baseline``: the algorithm the speedups are measured against (default: the
    backend's native allreduce, ``comm.native``).

    ``gap_s`` > 0 pauses that long (host sleep, untimed) before every timed
    call, as a training step calls its allreduce after its forward and
    backward pass rather than back to back (docs/BENCHMARKS.md, "Calls after a
    gap", has what such a pause costs on a GPU).
    """
    order = resolve_order(order, device)
    baseline = comm.native if baseline is None else baseline
    between = pause(gap_s)
    rows = []
    rng = np.random.default_rng([seed, comm.rank])
    sync = None
    if device == "gpu":
        import cupy

        sync = cupy.cuda.get_current_stream().synchronize
        comm.sync_phases = True
    for n in sizes:
        x = rng.standard_t(2.0, n).astype(np.float32)
        if device == "gpu":
            x = cupy.asarray(x)
        calls, splits = [], []
        for name in algorithms:
            base_name, kw = parse_spec(name)
            algo = ALGORITHMS[base_name](comm, check_finite=False, **kw)
            mine: list = []

            def call(algo=algo, mine=mine):
                algo(x, name="bench", density=density)
                mine.append(algo.last_traffic)

            calls.append(call)
            splits.append(mine)
        if order == "interleaved":
            all_times = timeit_interleaved(calls, comm=comm, warmup=warmup, repeat=repeat,
                                           sync=sync, between=between)
        else:
            all_times = None
        size_rows = []
        for i, name in enumerate(algorithms):
            if all_times is None:
                times = timeit(calls[i], comm=comm, warmup=warmup, repeat=repeat, sync=sync,
                               between=between)
                calls[i] = None         # free this algorithm's state before the next
            else:
                times = all_times[i]
            size_rows.append(_row(comm, n, name, density, times, splits[i][warmup:]))
            if progress:
                progress(size_rows[-1])
        del calls, splits
        base = next((r["median_s"] for r in size_rows if r["algorithm"] == baseline), None)
        for r in size_rows:
            if base:
                r["speedup_vs_baseline"] = base / r["median_s"]
                r["baseline"] = baseline
        rows += size_rows
    return rows


def resolve_order(order: str, device: str) -> str:
    """``order`` as ``sweep`` runs it: ``"auto"`` is interleaved on host data,
    sequential on GPUs (see ``sweep``)."""
    if order not in ("auto", "sequential", "interleaved"):
        raise ValueError(f"order must be 'auto', 'sequential' or 'interleaved', got {order!r}")
    if order == "auto":
        return "sequential" if device == "gpu" else "interleaved"
    return order


def _row(comm, n, name, density, times, timed) -> dict:
    med = float(np.median(times))
    sent = max(t.bytes_sent() for t in timed)
    sent = int(comm.control_allreduce(np.array([sent], dtype=np.int64), "max")[0])
    kinds: dict[str, float] = {}
    for t in timed:
        for kk, v in t.by_kind().items():
            kinds[kk] = kinds.get(kk, 0.0) + v / len(timed)
    return {
        "n": n, "P": comm.size, "algorithm": name, "density": density,
        "median_s": med, "min_s": float(times.min()), "times_s": times.tolist(),
        "bytes_sent_max": sent, "split_s": kinds,
    }


def _size(n: int) -> str:
    """2^e for a power of two, else the number."""
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


def format_table(rows) -> str:
    lines = ["| P | n | algorithm | median ms | speedup vs baseline | MB sent/rank | select ms | comm ms | reduce ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["split_s"]
        lines.append(
            f"| {r['P']} | {_size(r['n'])} | {r['algorithm']} | {1e3 * r['median_s']:.2f} | "
            f"{r.get('speedup_vs_baseline', float('nan')):.2f}x | {r['bytes_sent_max'] / 1e6:.2f} | "
            f"{1e3 * s.get('select', 0):.2f} | {1e3 * s.get('comm', 0):.2f} | {1e3 * s.get('reduce', 0):.2f} |")
    return "\n".join(lines)


def main(args) -> int:
    comm = BACKENDS[args.backend]()
    base = comm.native
    algos = (args.algorithms.split(",") if args.algorithms else
             [base] + [a for a, c in ALGORITHMS.items() if a != base and c.supports(comm)])
    if base not in algos:
        algos = [base] + algos
    unknown = [a for a in algos if parse_spec(a)[0] not in ALGORITHMS]
    if unknown:
        if comm.rank == 0:
            print(f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}", file=sys.stderr)
        return 2
    if args.sizes:
        sizes = [int(v) for v in args.sizes.split(",")]
    else:
        lo, hi = (int(v) for v in args.log2n.split(":"))
        sizes = [1 << e for e in range(lo, hi + 1)]

    def progress(r):
        if comm.rank == 0:
            print(f"  P={r['P']} n={_size(r['n'])} {r['algorithm']:10s} "
                  f"{1e3 * r['median_s']:9.2f} ms  sent {r['bytes_sent_max'] / 1e6:8.2f} MB",
                  flush=True)

    device = args.device if args.device in comm.devices else comm.devices[0]
    rows = sweep(comm, sizes, algos, args.density, args.repeat, args.warmup, progress=progress,
                 device=device, baseline=base, order=args.order, gap_s=args.gap_ms / 1e3)
    if comm.rank == 0:
        print(format_table(rows))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"rows": rows, "meta": _meta(comm, args, device)}, f, indent=1)
    return 0


def _meta(comm, args, device: str) -> dict:
    """What a stored sweep needs to be compared with another: when, where, how."""
    import datetime
    import platform

    import autotune

    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cores": os.cpu_count(), "machine": platform.machine(), "P": comm.size,
        "autotune": autotune.__version__, "numpy": np.__version__, "device": device,
        "order": resolve_order(args.order, device),
        "options": {k: getattr(args, k) for k in
                    ("log2n", "sizes", "density", "algorithms", "repeat", "warmup", "backend", "order",
                     "gap_ms")},
    }

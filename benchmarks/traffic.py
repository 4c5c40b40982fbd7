"""Traffic study: bytes per rank of every algorithm over the sparse lower bound.

Run (one process count per launch):

    mpiexec -n 8 python -m benchmarks.traffic [--n 1048576] [--density 0.01]

or, outside MPI, ``python -m benchmarks.traffic --np 2,4,8,16`` to launch
each P in turn and print one table.

For each algorithm it runs ``--iters`` calls with error feedback on the same
heavy-tailed, drifting gradient stream (``benchmarks.gradient_stream``)
and records, per call, the bytes each rank sent and received (the
Communicator's accounting, control counts included).  Reported per call:
max over ranks, divided by the lower bound of any sparse allreduce that
delivers k values + k indices to every rank, 2k(P-1)/P words (4 bytes
each): the mean over the steady state (calls >= ``--warmup``; iteration 0
starts from an empty residual and exact thresholds, which flatters the
threshold-reusing algorithms), the worst call, and the first call.
Ok-Topk's ratio is also split by phase (reduce / balance / allgatherv /
control) and checked against Table 1's upper end 6k(P-1)/P words.
"""
from __future__ import annotations

from benchmarks import study_parser
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from autotune.dispatch import parse_spec

DEFAULT_ALGOS = "dense,topka,topkdsa,gtopk,gaussiank,oktopk,topka2a"


def run(comm, *, n: int, density: float, iters: int, warmup: int, algorithms, seed: int = 0):
    from collectives import ALGORITHMS

    import kernels

    from benchmarks import gradient_stream

    P = comm.size
    k = kernels.k_from_density(n, density)
    lower = 2 * k * (P - 1) / P * 4 if P > 1 else 1.0
    rows = []
    for spec in algorithms:
        name, kw = parse_spec(spec)
        algo = ALGORITHMS[name](comm, check_finite=False, **kw)
        stream = gradient_stream(n, comm.rank, seed=seed)
        sent, recv, avg = [], [], []
        phases: dict[str, int] = {}   # Ok-Topk: bytes per phase kind, summed over calls
        ncalls = 0
        for it in range(iters):
            algo(next(stream), name="grad", density=density)
            t = algo.last_traffic
            tot = t.total()
            mx = comm.control_allreduce(np.array([tot.bytes_sent, tot.bytes_recv], np.int64), "max")
            sent.append(int(mx[0]))
            recv.append(int(mx[1]))
            # mean over ranks: sent and received totals are equal across the job
            avg.append(int(comm.control_allreduce(np.array([tot.bytes_sent], np.int64), "sum")[0]) / P)
            if name == "oktopk" and not kw and it >= warmup:
                ncalls += 1
                for ph, c in t.phases.items():
                    if c.bytes_sent or c.bytes_recv:
                        # comm:<detail> by detail, everything else by kind
                        head, _, detail = ph.partition(":")
                        kind = detail if head == "comm" else head
                        phases[kind] = phases.get(kind, 0) + max(c.bytes_sent, c.bytes_recv)
        s = np.array(sent[warmup:], dtype=np.float64) / lower
        r = np.array(recv[warmup:], dtype=np.float64) / lower
        a = np.array(avg[warmup:], dtype=np.float64) / lower
        row = {
            "P": P, "n": n, "density": density, "k": k, "algorithm": spec,
            "rank_mean": float(a.mean()),
            "iters": iters, "warmup": warmup, "lower_bound_bytes": lower,
            "sent_mean": float(s.mean()), "recv_mean": float(r.mean()),
            "sent_max": float(s.max()), "recv_max": float(r.max()),
            "first_sent": sent[0] / lower, "first_recv": recv[0] / lower,
            "bound_bytes": int(type(algo).traffic_bound(n, P, k, 4)),
            "max_bytes": int(max(max(sent), max(recv))),
        }
        if name == "oktopk" and not kw:
            # this rank's mean per phase (bytes, max of the two directions), then max over ranks
            names = ["reduce", "balance", "allgather", "control"]
            local = np.array([phases.get(p, 0) / max(ncalls, 1) for p in names], dtype=np.float64)
            worst = comm.control_allreduce(local, "max")
            row["oktopk_phases"] = {p: float(v / lower) for p, v in zip(names, worst)}
            row["table1_upper_bytes"] = 6 * k * (P - 1) / P * 4
        rows.append(row)
        if comm.rank == 0:
            print(f"  P={P} {spec:10s} sent {row['sent_mean']:.3f}x (max {row['sent_max']:.3f}) "
                  f"recv {row['recv_mean']:.3f}x (max {row['recv_max']:.3f})", flush=True)
    return rows


def format_table(rows) -> str:
    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    Ps = sorted({r["P"] for r in rows})
    by = {(r["P"], r["algorithm"]): r for r in rows}
    head = "| algorithm | " + " | ".join(f"P={p} sent / recv (worst)" for p in Ps) + " |"
    lines = [head, "|---|" + "---|" * len(Ps)]
    for a in algos:
        cells = []
        for p in Ps:
            r = by.get((p, a))
            cells.append("" if r is None else
                         f"{r['sent_mean']:.2f} / {r['recv_mean']:.2f} "
                         f"({max(r['sent_max'], r['recv_max']):.2f})")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += ["", "Mean over ranks (total bytes sent by all ranks / P, steady-state mean):", "",
              "| algorithm | " + " | ".join(f"P={p}" for p in Ps) + " |", "|---|" + "---|" * len(Ps)]
    for a in algos:
        lines.append(f"| {a} | " + " | ".join(
            f"{by[(p, a)]['rank_mean']:.3f}" if (p, a) in by else "" for p in Ps) + " |")
    ok = [by[(p, "oktopk")] for p in Ps if (p, "oktopk") in by]
    if ok:
        kinds = list(ok[0]["oktopk_phases"])
        lines += ["", "Ok-Topk by phase (mean over steady-state calls, max over ranks, "
                  "max of sent/recv, in units of the lower bound):", "",
                  "| phase | " + " | ".join(f"P={r['P']}" for r in ok) + " |",
                  "|---|" + "---|" * len(ok)]
        for kk in kinds:
            lines.append(f"| {kk} | " + " | ".join(
                f"{r['oktopk_phases'].get(kk, 0.0):.3f}" for r in ok) + " |")
        lines.append("| worst call, bytes / 6k(P-1)/P words | " + " | ".join(
            f"{r['max_bytes'] / r['table1_upper_bytes']:.3f}" for r in ok) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = study_parser("traffic", __doc__, n=1 << 20, iters=80, warmup=16,
                      warmup_help="calls excluded from the steady-state mean")
    ap.add_argument("--algorithms", default=DEFAULT_ALGOS,
                    help="comma-separated; name@key=value+key=value passes constructor "
                         "keywords, e.g. oktopk@tau=1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here (rank 0)")
    ap.add_argument("--np", help="outside MPI: comma-separated process counts to launch")
    args = ap.parse_args(argv)

    from autotune.launch import mpiexec_argv, one_host_env, under_mpi

    if args.np and not under_mpi():
        rows = []
        for p in [int(v) for v in args.np.split(",")]:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "rows.json")
                rest = [a for a in (argv if argv is not None else sys.argv[1:])]
                i = rest.index("--np") if "--np" in rest else None
                if i is not None:
                    del rest[i:i + 2]
                rest = [a for a in rest if not a.startswith("--np=")]
                cmd = mpiexec_argv(p, [sys.executable, "-m", "benchmarks.traffic",
                                       *rest, "--json", out])
                rc = subprocess.call(cmd, env=one_host_env(os.environ))
                if rc:
                    return rc
                with open(out) as f:
                    rows += json.load(f)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(format_table(rows))
        return 0

    import collectives

    comm = collectives.MPICommunicator()
    algos = [a for a in args.algorithms.split(",") if a]
    if comm.rank == 0:
        print(f"traffic study P={comm.size} n={args.n} density={args.density} "
              f"iters={args.iters} warmup={args.warmup}", flush=True)
    rows = run(comm, n=args.n, density=args.density, iters=args.iters, warmup=args.warmup,
               algorithms=algos, seed=args.seed)
    if comm.rank == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        print(format_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Selection-quality study: how much of the exact global top-k each algorithm delivers.

Run:

    mpiexec -n 4 python -m benchmarks.quality [--n 262144] [--iters 200] \
        [--plot docs/quality_tau.png]

Every configuration runs ``--iters`` calls with error feedback on the same
gradient stream (``benchmarks.gradient_stream``: a slowly drifting,
heavy-tailed signal shared by all ranks plus per-rank heavy-tailed noise,
per-layer scales).

Definitions, per call t:
  * a_r = residual_r + x_r: what rank r holds for the exchange (its input
    plus everything error feedback kept back); A = sum over ranks of a_r.
  * the exact global top-k update: A_T, A restricted to T = the k largest
    |A| (k = density n).  This is what an ideal sparse allreduce with error
    feedback would apply.
  * capture(t) = ||A_{T and S}|| / ||A_T||, S = the output's support: the
    fraction of the ideal update's L2 norm sitting on coordinates the
    algorithm delivered.  1 means it found every top-k coordinate.
  * error(t) = ||out - A_T|| / ||A_T||: also counts partial sums (an output
    entry missing the contributions of ranks that did not select it) and
    entries outside T.
  * held back(t) = ||sum_r residual_r|| / ||sum_r x_r||, after the call:
    how many calls' worth of gradient error feedback still owes the model
    (algorithm-independent yardstick: the same for every algorithm's A).
  * repeat(t): the share of each rank's exact local top-k of a_r that was
    also in its local top-k at t-1 (mean over ranks): values selected,
    sent, left in the residual, and offered again.
  * nnz/k: output entries per k (TopkA, TopkDSA, Gaussiank and TopKA2A
    deliver the union of the local selections, up to P k entries; gTopk
    and Ok-Topk at most k).
Reported: means over calls >= ``--warmup`` (the residuals have filled).
"""
from __future__ import annotations

from benchmarks import study_parser
import json
import sys

import numpy as np

DEFAULT_CONFIGS = ("topka,topkdsa,gtopk,gaussiank,topka2a,"
                   "oktopk:1,oktopk:8,oktopk:32,oktopk:128,"
                   "oktopk:1@residuals=owner,oktopk:8@residuals=owner,"
                   "oktopk:32@residuals=owner,oktopk:128@residuals=owner")


def _parse(cfg: str):
    """``algorithm[:tau_prime][@key=value+...]`` -> (name, tau_prime, keywords)."""
    from autotune.dispatch import parse_spec

    head, kw = parse_spec(cfg)
    name, _, tp = head.partition(":")
    return name, (int(tp) if tp else None), kw


def run(comm, *, n: int, density: float, iters: int, warmup: int, configs, seed: int = 0,
        df: float = 3.0):
    from mpi4py import MPI

    import kernels
    from collectives import ALGORITHMS

    from benchmarks import gradient_stream

    world = comm.comm
    k = kernels.k_from_density(n, density)
    rows = []
    for cfg in configs:
        name, tau_prime, kw = _parse(cfg)
        if tau_prime:
            kw["tau_prime"] = tau_prime
        algo = ALGORITHMS[name](comm, check_finite=False, **kw)
        stream = gradient_stream(n, comm.rank, seed=seed, df=df)
        cap, err, nnz, lbytes, held, repeat = [], [], [], [], [], []
        prev = None
        A = np.empty(n, np.float64)
        R = np.empty(n, np.float64)
        X = np.empty(n, np.float64)
        for it in range(iters):
            x = next(stream)
            st = algo.states.get("grad")
            a = x.astype(np.float64) + (st.residual if st is not None else 0.0)
            world.Allreduce(a, A, op=MPI.SUM)          # measurement only, not counted
            mark = np.zeros(n, bool)
            mark[kernels.topk_indices(a, k)] = True
            if prev is not None:
                repeat.append(world.allreduce(int(np.count_nonzero(mark & prev))) / (k * comm.size))
            prev = mark
            out = algo(x, name="grad", density=density)
            T = kernels.topk_indices(A, k)
            AT = A[T]
            norm_t = float(np.linalg.norm(AT))
            delivered = out[T] != 0
            ideal = np.zeros(n, np.float64)
            ideal[T] = AT
            cap.append(float(np.linalg.norm(AT[delivered])) / norm_t if norm_t else 1.0)
            err.append(float(np.linalg.norm(out - ideal)) / norm_t if norm_t else 0.0)
            nnz.append(int(np.count_nonzero(out)) / k)
            lbytes.append(algo.last_traffic.bytes_sent())
            # held back: what error feedback still owes, in calls' worth of gradient
            world.Allreduce(algo.state("grad").residual.astype(np.float64), R, op=MPI.SUM)
            world.Allreduce(x.astype(np.float64), X, op=MPI.SUM)
            held.append(float(np.linalg.norm(R) / max(np.linalg.norm(X), 1e-300)))
        sent = comm.control_allreduce(np.array([np.mean(lbytes[warmup:])]), "max")[0]
        row = {
            "config": cfg, "algorithm": name, "tau_prime": tau_prime, "P": comm.size,
            "n": n, "density": density, "k": k, "iters": iters, "warmup": warmup, "df": df,
            "capture_mean": float(np.mean(cap[warmup:])),
            "capture_min": float(np.min(cap[warmup:])),
            "error_mean": float(np.mean(err[warmup:])),
            "nnz_per_k": float(np.mean(nnz[warmup:])),
            "held_back": float(np.mean(held[warmup:])),
            "repeat": float(np.mean(repeat[warmup:])),
            "sent_over_lower_bound": float(sent / (2 * k * (comm.size - 1) / comm.size * 4))
            if comm.size > 1 else 0.0,
            "capture": cap, "error": err, "held": held,
        }
        rows.append(row)
        if comm.rank == 0:
            print(f"  {cfg:12s} capture {row['capture_mean']:.4f} (min {row['capture_min']:.4f}) "
                  f"error {row['error_mean']:.4f} nnz/k {row['nnz_per_k']:.2f} "
                  f"held back {row['held_back']:.2f} repeat {row['repeat']:.3f}", flush=True)
    return rows


def _label(r) -> str:
    """The row's algorithm with its constructor keywords, without tau'."""
    return r["algorithm"] + ("@" + r["config"].split("@", 1)[1] if "@" in r["config"] else "")


def format_table(rows) -> str:
    lines = ["| algorithm | tau' | capture (mean) | capture (worst call) | error (mean) | "
             "held back (mean) | local top-k repeat | output nnz / k | bytes sent / lower bound |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tp = r["tau_prime"] if r["tau_prime"] else ("32" if r["algorithm"] == "oktopk" else "-")
        lines.append(f"| {_label(r)} | {tp} | {r['capture_mean']:.4f} | "
                     f"{r['capture_min']:.4f} | {r['error_mean']:.4f} | {r['held_back']:.2f} | "
                     f"{r.get('repeat', float('nan')):.3f} | "
                     f"{r['nnz_per_k']:.2f} | "
                     f"{r['sent_over_lower_bound']:.2f} |")
    return "\n".join(lines)


def plot(rows, path: str, warmup: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    ok: dict[str, list] = {}   # Ok-Topk rows by variant (the default first)
    for r in sorted((r for r in rows if r["algorithm"] == "oktopk"), key=lambda r: "@" in r["config"]):
        ok.setdefault(_label(r), []).append(r)
    others = [r for r in rows if r["algorithm"] != "oktopk"]
    window = 5
    kern = np.ones(window) / window

    def smooth(v):
        return np.arange(window - 1, len(v)), np.convolve(v, kern, mode="valid")

    for i, (label, group) in enumerate(ok.items()):
        for r in group:   # the default's every tau', a variant's tau' = 32 only
            if i == 0 or (r["tau_prime"] or 32) == 32:
                ax1.plot(*smooth(r["capture"]), lw=1.5 if i == 0 else 1,
                         label=f"{label} tau'={r['tau_prime'] or 32}")
    for r, style in zip([r for r in others if r["algorithm"] in ("gtopk", "topka")], ("k--", "k:")):
        ax1.plot(*smooth(r["capture"]), style, lw=1, label=r["algorithm"])
    ax1.axvline(warmup, color="grey", lw=0.8, ls=":")
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("capture: share of the exact global top-k's\n"
                   "L2 norm delivered (moving avg of 5)")
    ax1.set_title(f"Ok-Topk threshold reuse interval tau' (P={rows[0]['P']}, "
                  f"n={rows[0]['n']}, density={rows[0]['density']})")
    ax1.legend(fontsize=8, loc="upper right")
    ax1.grid(alpha=0.3)

    taus = sorted({r["tau_prime"] or 32 for group in ok.values() for r in group})
    for label, group in ok.items():
        ax2.plot([r["tau_prime"] or 32 for r in group], [r["capture_mean"] for r in group], "o-",
                 label=label)
    groups: dict[float, list[str]] = {}
    for r in others:
        groups.setdefault(round(r["capture_mean"], 4), []).append(r["algorithm"])
    for i, (v, names) in enumerate(sorted(groups.items())):
        ax2.axhline(v, lw=0.8, ls=":", color=f"C{i + len(ok)}")
        ax2.annotate(" = ".join(names), (taus[0], v), fontsize=7, va="bottom",
                     color=f"C{i + len(ok)}")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(taus)
    ax2.set_xticklabels([str(t) for t in taus])
    ax2.set_xlabel("tau' (exact thresholds every tau' calls)")
    ax2.set_ylabel("mean capture")
    ax2.set_title(f"mean over calls {warmup}..{rows[0]['iters'] - 1}")
    ax2.legend(fontsize=8, loc="center right")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = study_parser("quality", __doc__, n=1 << 18, iters=200, warmup=20)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="comma-separated algorithm[:tau_prime][@key=value+...] entries")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--df", type=float, default=3.0,
                    help="Student-t degrees of freedom of signal and noise")
    ap.add_argument("--json", help="write the rows (with per-call series) here")
    ap.add_argument("--plot", help="write the tau' figure here (PNG, needs matplotlib)")
    ap.add_argument("--replot", metavar="JSON",
                    help="no MPI: redraw --plot (and the table) from an earlier --json")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            rows = json.load(f)
        print(format_table(rows))
        if args.plot:
            plot(rows, args.plot, rows[0]["warmup"])
        return 0

    import collectives

    comm = collectives.MPICommunicator()
    if comm.rank == 0:
        print(f"quality study P={comm.size} n={args.n} density={args.density} "
              f"iters={args.iters} warmup={args.warmup} df={args.df}", flush=True)
    rows = run(comm, n=args.n, density=args.density, iters=args.iters, warmup=args.warmup,
               configs=[c for c in args.configs.split(",") if c], seed=args.seed, df=args.df)
    if comm.rank == 0:
        print(format_table(rows), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f)
        if args.plot:
            plot(rows, args.plot, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())

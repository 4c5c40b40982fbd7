"""The ``autotune`` command line."""
from __future__ import annotations

import argparse
import subprocess
import sys

from . import __version__
from ._mpirun import mpi_env, mpiexec_argv, under_mpi


def _relaunch(args, argv) -> int | None:
    """With ``--np P`` outside MPI, start P ranks of this same command."""
    if getattr(args, "np", None) and not under_mpi():
        rest = []
        skip = False
        for a in argv:
            if skip:
                skip = False
                continue
            if a == "--np":
                skip = True
                continue
            if a.startswith("--np="):
                continue
            rest.append(a)
        cmd = mpiexec_argv(args.np, [sys.executable, "-m", "autotune.cli", *rest])
        return subprocess.call(cmd, env=mpi_env())
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autotune",
        description="Hardware-aware autotuning allreduce: measure the machine, pick the "
                    "fastest dense or sparse (Ok-Topk, gTopk, ...) algorithm per tensor.")
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser("bench", help="time every algorithm against native MPI_Allreduce")
    b.add_argument("--np", type=int, help="launch this many ranks with mpiexec")
    b.add_argument("--log2n", default="16:24", help="range of log2(n), e.g. 16:24")
    b.add_argument("--density", type=float, default=0.01)
    b.add_argument("--algorithms", default="",
                   help="comma-separated (default: all); name@key=value+... for options, "
                        "e.g. oktopk@residuals=owner")
    b.add_argument("--repeat", type=int, default=10)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--out", help="write the raw rows (and the run's settings) as JSON")
    b.add_argument("--order", choices=["auto", "interleaved", "sequential"], default="auto",
                   help="interleaved: repeat i of every algorithm before repeat i+1 of any, so "
                        "ratios are measured side by side; sequential: each algorithm's repeats "
                        "in turn (less memory); auto (default): interleaved on host data, "
                        "sequential on GPUs")
    b.add_argument("--gap-ms", type=float, default=0.0,
                   help="pause this long before every timed call (untimed), as a training step "
                        "calls its allreduce after a forward and backward pass; default 0: back "
                        "to back")
    b.add_argument("--backend", choices=["mpi", "nccl"], default="mpi",
                   help="communicator: MPI, or NCCL between GPUs (data on the GPU)")
    b.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="where the data lives (gpu with the MPI backend: staged or CUDA-aware)")

    pr = sub.add_parser(
        "profile", help="measure this machine (alpha/beta, algorithms, selection cost, xi) "
                        "and write a profile",
        description="Measure the machine under MPI and write one JSON profile (rank 0). "
                    "Run as `mpiexec -n P autotune profile` or `autotune profile --np P`.")
    pr.add_argument("--np", type=int, help="launch this many ranks with mpiexec")
    pr.add_argument("--quick", action="store_true",
                    help="fewer sizes, repeats and cases (about a minute on 4 ranks)")
    pr.add_argument("--sizes", choices=["tiny", "quick", "full"],
                    help="measurement plan (overrides --quick; 'tiny' is for tests)")
    pr.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="where tensors live (gpu: cupy arrays)")
    pr.add_argument("--backend", choices=["mpi", "nccl"], default="mpi",
                    help="communicator the primitives and algorithms are measured through: MPI, "
                         "or NCCL between GPUs (with --device gpu; MPI stays for control)")
    pr.add_argument("--refit", metavar="FILE",
                    help="measure nothing: refit FILE's alpha/beta (and regime segments) from its "
                         "stored raw samples, write it back (or to --out)")
    pr.add_argument("--network", metavar="LABEL",
                    help="network label stored in the fingerprint, e.g. shm, tcp-1gbit, aries "
                         "(default: shm on one host)")
    pr.add_argument("--out", metavar="FILE", help="profile to write (default: "
                                                  "profile-<network>-P<P>.json)")
    pr.add_argument("--gradients", metavar="DIR",
                    help="measure xi on gradient snapshots: *.npy files, each a (workers, n) "
                         "float array of one step (default: a built-in training run)")
    pr.add_argument("--max-bytes", metavar="SIZE", help="largest message in the alpha/beta sweep "
                                                        "(e.g. 8M)")
    pr.add_argument("--algorithms", default="", help="comma-separated (default: all registered)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--quiet", action="store_true", help="no progress bar or summary")

    sh = sub.add_parser("show", help="print a readable summary of a profile")
    sh.add_argument("file", metavar="FILE")
    sh.add_argument("--strict", action="store_true",
                    help="fail if the profile comes from another machine")

    pl = sub.add_parser("plot", help="write PNGs of a profile's fits and algorithm times")
    pl.add_argument("file", metavar="FILE")
    pl.add_argument("--outdir", default=".", metavar="DIR")

    se = sub.add_parser("select", help="explain which algorithm a profile picks for (n, P, density)")
    se.add_argument("--profile", required=True, metavar="FILE")
    se.add_argument("--n", type=int, required=True)
    se.add_argument("--P", type=int, required=True)
    se.add_argument("--density", type=float, default=0.01)
    se.add_argument("--exact", action="store_true", help="lossless algorithms only (unnamed tensors)")

    tu = sub.add_parser("tune", help="tune density, tau' and tau (optuna) under an accuracy guard")
    tu.add_argument("--profile", required=True, metavar="FILE")
    tu.add_argument("--n", type=int, required=True)
    tu.add_argument("--P", type=int, required=True)
    tu.add_argument("--algorithm", default="oktopk")
    tu.add_argument("--density-min", type=float, default=0.01,
                    help="the accuracy guard: the lowest density searched (default 1%%, where "
                         "the convergence tables train at parity with dense)")
    tu.add_argument("--density-max", type=float, default=0.1)
    tu.add_argument("--xi-max", type=float, default=None,
                    help="also require the profile's xi <= this (off by default: measured xi "
                         "is not monotone in density; `autotune show` prints it per density)")
    tu.add_argument("--capture-min", type=float, default=None,
                    help="also require the top-k entries to carry at least this share of the "
                         "gradient's norm (the profile's xi.captured_norm; profiles from "
                         "2026-11-27 on)")
    tu.add_argument("--tau-prime-max", type=int, default=64)
    tu.add_argument("--trials", type=int, default=60)
    tu.add_argument("--storage", metavar="FILE", help="journal file: the study resumes from it")
    tu.add_argument("--seed", type=int, default=0)
    return p


def _load_profile(path, strict: bool = False):
    from .profile import Profile, local_fingerprint

    return Profile.load(path, current=local_fingerprint(), strict=strict)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    rc = _relaunch(args, argv)
    if rc is not None:
        return rc
    if args.command == "bench":
        from . import bench

        return bench.main(args)
    if args.command == "profile":
        from . import profiler

        return profiler.main(args)
    if args.command in ("show", "plot"):
        from .profile import ProfileError

        try:
            prof = _load_profile(args.file, strict=getattr(args, "strict", False))
        except ProfileError as e:
            print(f"autotune {args.command}: error: {e}", file=sys.stderr)
            return 2
        if prof.foreign:
            print(f"autotune {args.command}: warning: {prof.path} is from another machine: "
                  + "; ".join(prof.foreign), file=sys.stderr)
        if args.command == "show":
            from .report import show_text

            print(show_text(prof))
            return 0
        try:
            from .report import plot
            import matplotlib  # noqa: F401
        except ImportError:
            print("autotune plot: error: matplotlib is not installed; install it with "
                  "`pip install 'autotune-collectives[plot]'` (or `pip install matplotlib`)",
                  file=sys.stderr)
            return 2
        for path in plot(prof, args.outdir):
            print(f"wrote {path}")
        return 0
    if args.command in ("select", "tune"):
        from .profile import ProfileError

        try:
            prof = _load_profile(args.profile)
        except ProfileError as e:
            print(f"autotune {args.command}: error: {e}", file=sys.stderr)
            return 2
        if args.command == "select":
            from .selector import Selector

            d = Selector(prof.data).choose(args.n, args.P, args.density, lossy_ok=not args.exact)
            print(f"profile {prof.path} ({prof.fingerprint.get('network', '?')})")
            print(d.explain())
            return 0
        from .tuner import tune

        try:
            r = tune(prof.data, args.n, args.P, algorithm=args.algorithm,
                     density_min=args.density_min, density_max=args.density_max,
                     xi_max=args.xi_max, capture_min=args.capture_min,
                     tau_prime_max=args.tau_prime_max, trials=args.trials,
                     storage=args.storage, seed=args.seed)
        except ValueError as e:
            print(f"autotune tune: error: {e}", file=sys.stderr)
            return 2
        guard = f"density >= {args.density_min:g}" + (
            f", xi <= {args.xi_max:g}" if args.xi_max is not None else "") + (
            f", captured norm >= {args.capture_min:g}" if args.capture_min is not None else "")
        print(f"{args.algorithm} n={args.n} P={args.P}: density={r.density:.5f} tau'={r.tau_prime} "
              f"tau={r.tau} predicted {1e3 * r.time_s:.3f} ms/iteration, "
              f"xi={'-' if r.xi is None else f'{r.xi:.3g}'} "
              f"(guard {guard}, tau' <= {args.tau_prime_max}; "
              f"{'feasible' if r.feasible else 'NO feasible trial: best infeasible shown'}, "
              f"{r.trials} trials)")
        print(f"use: autotune.allreduce(tensor, name=..., algorithm={args.algorithm!r}, "
              f"density={r.density:.5f}, tau_prime={r.tau_prime}, tau={r.tau})")
        return 0
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

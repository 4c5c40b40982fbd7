"""The ``autotune`` command line."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import zlib

from . import __version__
from .launch import launch, under_mpi


# -- argument types: each rejects a bad value with one line ------------------------------
def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse


def _float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {s!r}")
    return v


def _fraction(s: str) -> float:
    """A density or a share: 0 < v <= 1."""
    v = _float(s)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {s}")
    return v


def _positive(s: str) -> float:
    v = _float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


def _non_negative(s: str) -> float:
    v = _float(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


LOG2N_MAX = 32  # 2^32 float32 values: 16 GiB per rank and buffer


def _log2_range(s: str) -> str:
    """'LO:HI' (or one exponent E, meaning E:E), 0 <= LO <= HI <= LOG2N_MAX;
    returned as 'LO:HI'."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"expected LO:HI (exponents of 2, e.g. 16:24) or one "
                                         f"exponent, got {s!r}")
    lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
    if lo > hi:
        raise argparse.ArgumentTypeError(f"LO must be <= HI, got {s!r}")
    if hi > LOG2N_MAX:
        raise argparse.ArgumentTypeError(f"exponents above {LOG2N_MAX} (2^{LOG2N_MAX} values) "
                                         f"do not fit in memory, got {s!r}")
    return f"{lo}:{hi}"


def _sizes(s: str) -> str:
    """'N,N,...': positive sizes up to 2^LOG2N_MAX; returned normalised 'N,N,...'."""
    try:
        vals = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1 or max(vals) > 1 << LOG2N_MAX:
        raise argparse.ArgumentTypeError(f"expected sizes N,N,... in 1..2^{LOG2N_MAX}, "
                                         f"got {s!r}")
    return ",".join(str(v) for v in vals)


MIN_SWEEP_BYTES = 4 << 10  # below this the alpha/beta sweep has too few sizes to fit


def _byte_size(s: str) -> str:
    """A size such as 8M, 64KiB or 65536 (>= 4K); returned unchanged (the
    profiler parses it)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(?:i?b)?\s*", s.lower())
    try:
        v = float(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2]] if m else None
    except ValueError:
        v = None
    if v is None:
        raise argparse.ArgumentTypeError(f"expected a size such as 8M, 64K or 65536, got {s!r}")
    if v < MIN_SWEEP_BYTES:
        raise argparse.ArgumentTypeError(f"must be at least 4K (the sweep needs several sizes), "
                                         f"got {s!r}")
    return s


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block): ``PROG: error: ...``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _mpi_options(p, what: str) -> None:
    p.add_argument("--np", type=_int_at_least(1), metavar="P",
                   help=f"outside MPI: start P ranks of this same {what} with the environment's "
                        "mpiexec (as `autotune launch -n P` does); ignored under mpiexec")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="autotune",
        description="Hardware-aware autotuning allreduce: measure the machine, pick the "
                    "fastest dense or sparse (Ok-Topk, gTopk, ...) algorithm per tensor.")
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    p.commands = {}

    la = sub.add_parser(
        "launch", help="run a Python script (or -m module) on P ranks under mpiexec",
        description="Run `python SCRIPT ARGS` (or `python -m MODULE ARGS`) on P ranks with this "
                    "same interpreter under the mpiexec that came with it, with what Open MPI "
                    "needs as root and with more ranks than cores. Everything after the script "
                    "(or the module) goes to it. The exit status is the ranks': 0 when all "
                    "exited 0, else the first failure's.",
        usage="autotune launch [-h] -n P (SCRIPT | -m MODULE) [ARGS ...]",
        allow_abbrev=False)
    la.add_argument("-n", "--np", type=_int_at_least(1), required=True, metavar="P",
                    help="number of ranks (more than the cores is allowed: they share them)")
    la.add_argument("-m", dest="module", metavar="MODULE",
                    help="run a module (`python -m MODULE`) instead of a script")
    la.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                    help="the script and its arguments (with -m: the module's arguments)")
    p.commands["launch"] = la

    b = sub.add_parser("bench", help="time every algorithm against native MPI_Allreduce",
                       description="Time every algorithm against the native allreduce under MPI "
                                   "(`autotune launch -n P -m autotune.cli bench`, "
                                   "`mpiexec -n P autotune bench` or `autotune bench --np P`); "
                                   "every rank must get the same options (checked).")
    _mpi_options(b, "command")
    b.add_argument("--log2n", type=_log2_range, default="16:24", metavar="LO:HI",
                   help="tensor sizes n = 2^LO ... 2^HI float32 values per rank (one exponent: "
                        "one size; default %(default)s)")
    b.add_argument("--sizes", type=_sizes, metavar="N,N,...",
                   help="explicit tensor sizes (float32 values per rank) instead of --log2n, "
                        "e.g. 3001,250007: sizes no profile sampled")
    b.add_argument("--density", type=_fraction, default=0.01,
                   help="share of the values the sparse algorithms send, in (0, 1] "
                        "(default %(default)s)")
    b.add_argument("--algorithms", default="",
                   help="comma-separated (default: all); name@key=value+... for options, "
                        "e.g. oktopk@residuals=owner")
    b.add_argument("--repeat", type=_int_at_least(1), default=10,
                   help="timed calls per algorithm and size, >= 1 (default %(default)s)")
    b.add_argument("--warmup", type=_int_at_least(0), default=3,
                   help="untimed calls before them, >= 0 (default %(default)s)")
    b.add_argument("--out", metavar="FILE",
                   help="write the raw rows (and the run's settings) as JSON")
    b.add_argument("--order", choices=["auto", "interleaved", "sequential"], default="auto",
                   help="interleaved: repeat i of every algorithm before repeat i+1 of any, so "
                        "ratios are measured side by side; sequential: each algorithm's repeats "
                        "in turn (less memory); auto (default): interleaved on host data, "
                        "sequential on GPUs")
    b.add_argument("--gap-ms", type=_non_negative, default=0.0, metavar="MS",
                   help="pause this long (>= 0) before every timed call (untimed), as a training "
                        "step calls its allreduce after a forward and backward pass; default 0: "
                        "back to back")
    b.add_argument("--backend", choices=["mpi", "nccl"], default="mpi",
                   help="communicator: MPI, or NCCL between GPUs (data on the GPU)")
    b.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="where the data lives (gpu with the MPI backend: staged or CUDA-aware)")
    p.commands["bench"] = b

    pr = sub.add_parser(
        "profile", help="measure this machine (alpha/beta, algorithms, selection cost, xi) "
                        "and write a profile",
        description="Measure the machine under MPI and write one JSON profile (rank 0). "
                    "Run as `autotune profile --np P` or `mpiexec -n P autotune profile`; "
                    "every rank must get the same options (checked). Progress goes to rank 0's "
                    "stderr: a bar on a terminal, else a line every 2 s.")
    _mpi_options(pr, "command")
    pr.add_argument("--quick", action="store_true",
                    help="fewer sizes, repeats and cases: about 15 s on 4 ranks of an idle "
                         "2-core machine, where the full plan takes about 80 s (longer under "
                         "load or over a slow network)")
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
    pr.add_argument("--max-bytes", type=_byte_size, metavar="SIZE",
                    help="largest message in the alpha/beta sweep, at least 4K (e.g. 8M; default: "
                         "the plan's largest)")
    pr.add_argument("--algorithms", default="", help="comma-separated (default: all registered)")
    pr.add_argument("--seed", type=_int_at_least(0), default=0,
                    help="seed of the measured data and of the xi training run (default 0)")
    pr.add_argument("--quiet", action="store_true", help="no progress or summary")
    p.commands["profile"] = pr

    sh = sub.add_parser("show", help="print a readable summary of a profile")
    sh.add_argument("file", metavar="FILE", help="a profile (JSON)")
    sh.add_argument("--strict", action="store_true",
                    help="fail if the profile comes from another machine")
    p.commands["show"] = sh

    pl = sub.add_parser("plot", help="write PNGs of a profile's fits and algorithm times")
    pl.add_argument("file", metavar="FILE", help="a profile (JSON)")
    pl.add_argument("--outdir", default=".", metavar="DIR",
                    help="directory for the PNGs (default: the current one)")
    p.commands["plot"] = pl

    se = sub.add_parser("select",
                        help="explain which algorithm a profile picks for (n, P, density)")
    se.add_argument("--profile", required=True, metavar="FILE", help="a profile (JSON)")
    se.add_argument("--n", type=_int_at_least(1), required=True,
                    help="tensor size: values per rank, >= 1")
    se.add_argument("--P", type=_int_at_least(1), required=True,
                    help="number of ranks, >= 1")
    se.add_argument("--density", type=_fraction, default=0.01,
                    help="share of the values a sparse algorithm sends, in (0, 1] "
                         "(default %(default)s)")
    se.add_argument("--exact", action="store_true",
                    help="lossless algorithms only (unnamed tensors)")
    p.commands["select"] = se

    tu = sub.add_parser("tune", help="tune density, tau' and tau (optuna) under an accuracy guard",
                        description="Tune a sparse algorithm's density, tau' and tau on a "
                                    "profile's predictions, and compare the result with the "
                                    "fastest exact (lossless) algorithm there.")
    tu.add_argument("--profile", required=True, metavar="FILE", help="a profile (JSON)")
    tu.add_argument("--n", type=_int_at_least(1), required=True,
                    help="tensor size: values per rank, >= 1")
    tu.add_argument("--P", type=_int_at_least(1), required=True, help="number of ranks, >= 1")
    tu.add_argument("--algorithm", default="oktopk",
                    help="the sparse algorithm to tune (default %(default)s)")
    tu.add_argument("--density-min", type=_fraction, default=0.01,
                    help="the accuracy guard: the lowest density searched, in (0, 1] (default "
                         "1%%, where the convergence tables train at parity with dense)")
    tu.add_argument("--density-max", type=_fraction, default=0.1,
                    help="the highest density searched, in (0, 1] and >= --density-min "
                         "(default %(default)s)")
    tu.add_argument("--xi-max", type=_positive, default=None,
                    help="also require the profile's xi <= this, > 0 (off by default: measured "
                         "xi is not monotone in density; `autotune show` prints it per density)")
    tu.add_argument("--capture-min", type=_fraction, default=None,
                    help="also require the top-k entries to carry at least this share, in (0, 1], "
                         "of the gradient's norm (the profile's xi.captured_norm; profiles from "
                         "2026-11-27 on)")
    tu.add_argument("--tau-prime-max", type=_int_at_least(1), default=64,
                    help="largest threshold-refresh interval tau' allowed, >= 1 "
                         "(default %(default)s)")
    tu.add_argument("--trials", type=_int_at_least(1), default=60,
                    help="optuna trials in all, counting those in --storage, >= 1 "
                         "(default %(default)s)")
    tu.add_argument("--storage", metavar="FILE", help="journal file: the study resumes from it")
    tu.add_argument("--seed", type=_int_at_least(0), default=0,
                    help="seed of optuna's sampler (default 0)")
    p.commands["tune"] = tu
    return p


def _load_profile(path, strict: bool = False):
    from .profile import Profile, local_fingerprint

    return Profile.load(path, current=local_fingerprint(), strict=strict)


# -- launch ------------------------------------------------------------------------------
def _split_launch(rest: list[str]) -> tuple[list[str], list[str]]:
    """Split ``autotune launch``'s own options from the program and its
    arguments: the program starts at the first word that is not an option of
    launch, right after ``-m MODULE``, or after ``--``."""
    head, i = [], 0
    while i < len(rest):
        a = rest[i]
        if a == "--":
            return head, rest[i + 1:]
        if a in ("-n", "--np"):
            head += rest[i:i + 2]
            i += 2
        elif a == "-m":
            return head + rest[i:i + 2], rest[i + 2:]
        elif a.startswith("-m"):
            return head + [a], rest[i + 1:]
        elif a.startswith("-"):
            head.append(a)  # -n4, --np=4, -h, or a mistake argparse reports
            i += 1
        else:
            return head, rest[i:]
    return head, []


def _launch(parser, args) -> int:
    err = parser.commands["launch"].error
    if args.module is None and not args.program:
        err("give a script to run (or -m MODULE)")
    if under_mpi():
        err("this process already runs under MPI: run the script directly")
    argv = ["-m", args.module, *args.program] if args.module is not None else args.program
    try:
        return launch(args.np, argv)
    except (RuntimeError, OSError) as e:
        print(f"autotune launch: error: {e}", file=sys.stderr)
        return 2


def _relaunch(args, argv) -> int | None:
    """With ``--np P`` outside MPI, start P ranks of this same command."""
    if not getattr(args, "np", None) or under_mpi() or getattr(args, "refit", None):
        return None
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
    return launch(args.np, ["-m", "autotune.cli", *rest])


# -- every rank must be started alike ------------------------------------------------------
def _option(key: str) -> str:
    return "the command" if key == "command" else "--" + key.replace("_", "-")


def _agree_args(args, exit_code: int = 2) -> str | None:
    """Under MPI with more than one rank: None when every rank parsed the same
    arguments, else one message, the same on every rank.  ``args`` None: this
    rank stopped while parsing (``exit_code``: 0 after printing help or the
    version, else it printed its error).  Collective (an allgather of a CRC on
    a duplicate of COMM_WORLD; the arguments themselves only on a mismatch)."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.size == 1:
        return None
    mine = ({"unparsed": exit_code} if args is None
            else {k: v for k, v in vars(args).items() if k != "np"})
    text = json.dumps(mine, sort_keys=True, default=str)
    comm = MPI.COMM_WORLD.Dup()
    try:
        crcs = comm.allgather(zlib.crc32(text.encode()))
        if len(set(crcs)) == 1:
            return None
        every = [json.loads(t) for t in comm.allgather(text)]
    finally:
        comm.Free()
    stopped = [(i, e["unparsed"]) for i, e in enumerate(every) if "unparsed" in e]
    if stopped:
        failed = [i for i, c in stopped if c]
        ranks = ", ".join(map(str, failed or [i for i, _ in stopped]))
        return (f"rank(s) {ranks} could not parse their arguments (the error is printed above)"
                if failed else f"rank(s) {ranks} printed help or the version and stopped")
    r = next(i for i, c in enumerate(crcs) if c != crcs[0])
    keys = sorted((k for k in set(every[0]) | set(every[r]) if every[0].get(k) != every[r].get(k)),
                  key=lambda k: (k != "command", k))
    diff = "; ".join(f"{_option(k)} {json.dumps(every[r].get(k))} where rank 0 has "
                     f"{json.dumps(every[0].get(k))}" for k in keys[:3])
    return (f"every rank must be started with the same arguments, but rank {r} has {diff}"
            + (f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""))


# -- tune ----------------------------------------------------------------------------------
def _tune(args, prof) -> int:
    from .tuner import tune

    try:
        r = tune(prof, args.n, args.P, algorithm=args.algorithm,
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
    ms = 1e3 * r.time_s
    print(f"{args.algorithm} n={args.n} P={args.P}: density={r.density:.5f} tau'={r.tau_prime} "
          f"tau={r.tau} predicted {ms:.3f} ms/iteration, "
          f"xi={'-' if r.xi is None else f'{r.xi:.3g}'} "
          f"(guard {guard}, tau' <= {args.tau_prime_max}; "
          f"{'feasible' if r.feasible else 'NO feasible trial: best infeasible shown'}, "
          f"{r.trials} trials)")
    tuned = (f"autotune.allreduce(tensor, name=..., algorithm={args.algorithm!r}, "
             f"density={r.density:.5f}, tau_prime={r.tau_prime}, tau={r.tau})")
    if r.exact_algorithm is None:
        print("best exact algorithm: - (the profile predicts no lossless algorithm)")
        print(f"use: {tuned}")
        return 0
    ems = 1e3 * r.exact_time_s
    print(f"best exact algorithm: {r.exact_algorithm}, predicted {ems:.3f} ms/iteration "
          f"(lossless, same n and P)")
    if r.sparse_pays:
        print(f"sparse pays: {args.algorithm} is predicted {ems / ms:.2f}x faster than "
              f"{r.exact_algorithm}")
        print(f"use: {tuned}")
    else:
        print(f"sparse does not pay on this profile: the tuned {args.algorithm} is predicted "
              f"{ms / ems:.2f}x slower than {r.exact_algorithm}, which is exact; "
              f"use the exact allreduce: autotune.allreduce(tensor, name=..., "
              f"algorithm={r.exact_algorithm!r})")
        print(f"(tuned setting, should you sparsify anyway: {tuned})")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "launch":
        head, program = _split_launch(argv[1:])
        args = parser.parse_args(["launch", *head])
        args.program = program
        return _launch(parser, args)
    # under a launcher the ranks agree on their arguments before running anything, so
    # no rank runs a collective command while another has left (launch, above, starts
    # a job of its own)
    agreed = under_mpi()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        # Under MPI a rank that cannot parse its arguments (or printed help)
        # must not leave the others waiting in the agreement: it joins it.
        if not agreed:
            raise
        code = e.code if isinstance(e.code, int) else 2
        _agree_args(None, code)
        return code
    if agreed:
        msg = _agree_args(args)
        if msg:
            print(f"autotune {args.command or ''}: error: {msg}".replace("  ", " "),
                  file=sys.stderr, flush=True)
            return 2
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

        if args.command == "tune":
            from collectives import ALGORITHMS

            sparse = sorted(a for a, cls in ALGORITHMS.items() if cls.lossy)
            err = parser.commands["tune"].error
            if args.density_min > args.density_max:
                err(f"--density-min {args.density_min:g} is above --density-max "
                    f"{args.density_max:g}")
            if args.algorithm not in sparse:
                err(f"--algorithm {args.algorithm!r}: tune takes a sparse algorithm, one of "
                    f"{', '.join(sparse)}")
        try:
            prof = _load_profile(args.profile)
        except ProfileError as e:
            print(f"autotune {args.command}: error: {e}", file=sys.stderr)
            return 2
        if args.command == "select":
            from .selector import Selector

            d = Selector(prof).choose(args.n, args.P, args.density, lossy_ok=not args.exact)
            print(f"profile {prof.path} ({prof.fingerprint.get('network', '?')})")
            print(d.explain())
            return 0
        return _tune(args, prof)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

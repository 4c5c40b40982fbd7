"""The ``autotune`` command line."""
from __future__ import annotations

import argparse
import os
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
    b.add_argument("--algorithms", default="", help="comma-separated (default: all)")
    b.add_argument("--repeat", type=int, default=10)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--out", help="write the raw rows as JSON")
    return p


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
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

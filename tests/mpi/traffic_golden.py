"""Per-rank, per-phase traffic of every algorithm on fixed seeded data (the golden counts).

Under mpiexec, writes what every rank sent and received, per call and phase,
to a JSON file (rank 0 writes):

    mpiexec -n 4 python -m tests.mpi.traffic_golden --out traffic.json

Without a launcher, ``--update`` regenerates the golden file on purpose (after
a deliberate change of an algorithm's volume), launching itself at every P in
``PS`` with the environment's mpiexec:

    python -m tests.mpi.traffic_golden --update

tests/test_traffic_regression.py compares a fresh run with
tests/data/traffic_golden.json exactly.  The data are fixed: float32
standard normal from ``default_rng([SEED, rank, n, call])``; each algorithm
runs ``CALLS`` calls with error feedback on one tensor name, so threshold
reuse and refresh paths are covered.  Phases without traffic (selection,
reduction) are left out; validation is not the algorithm's traffic.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "traffic_golden.json"
SEED = 9
SIZES = (4103, 1 << 16)
DENSITY = 0.01
CALLS = 4
PS = (3, 4)
FIELDS = ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")


def settings() -> dict:
    return {"seed": SEED, "sizes": list(SIZES), "density": DENSITY, "calls": CALLS,
            "fields": list(FIELDS)}


def measure(comm) -> dict:
    """{algorithm: {"n=N": [call][rank] -> {phase: [4 counts]}}} on rank 0, None elsewhere."""
    from collectives import ALGORITHMS

    out = {}
    for name, cls in ALGORITHMS.items():
        if not cls.supports(comm):
            continue
        out[name] = {}
        for n in SIZES:
            algo = cls(comm)
            calls = []
            for call in range(CALLS):
                rng = np.random.default_rng([SEED, comm.rank, n, call])
                x = rng.standard_normal(n, dtype=np.float32)
                algo(x, name="golden", density=DENSITY)
                mine = {phase: [int(getattr(c, f)) for f in FIELDS]
                        for phase, c in sorted(algo.last_traffic.phases.items())
                        if any(getattr(c, f) for f in FIELDS)}
                calls.append(comm.comm.gather(mine, root=0))
            out[name][f"n={n}"] = calls
    return out if comm.rank == 0 else None


def _leaf(obj) -> bool:
    """A phase table {phase: [counts]} or a scalar: written on one line."""
    if isinstance(obj, dict):
        return all(not isinstance(v, (dict, list)) or
                   (isinstance(v, list) and all(not isinstance(i, (dict, list)) for i in v))
                   for v in obj.values())
    return not isinstance(obj, list)


def dumps(obj, indent: int = 0) -> str:
    """JSON with one line per rank's phase table (diffs stay readable)."""
    pad = " " * indent
    if _leaf(obj) or not obj:
        return json.dumps(obj)
    if isinstance(obj, dict):
        body = ",\n".join(f"{pad} {json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items())
        return "{\n" + body + f"\n{pad}}}"
    body = ",\n".join(f"{pad} {dumps(v, indent + 1)}" for v in obj)
    return "[\n" + body + f"\n{pad}]"


def run_at(nprocs: int) -> dict:
    """Launch this runner under mpiexec at ``nprocs`` ranks; return its counts."""
    from autotune.launch import mpiexec_argv, one_host_env

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "traffic.json"
        argv = mpiexec_argv(nprocs, [sys.executable, "-m", "tests.mpi.traffic_golden",
                                     "--out", str(out)])
        p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=one_host_env(os.environ))
        if p.returncode != 0:
            raise RuntimeError(f"traffic runner at P={nprocs} exited {p.returncode}:\n"
                               f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        doc = json.loads(out.read_text())
    if doc["settings"] != settings() or doc["P"] != nprocs:
        raise RuntimeError(f"runner wrote settings {doc['settings']} at P={doc['P']}")
    return doc["counts"]


def update(path: Path = GOLDEN) -> None:
    doc = {"about": "per-rank traffic per call and phase [" + ", ".join(FIELDS) + "]; "
                    "regenerate with: python -m tests.mpi.traffic_golden --update",
           "settings": settings(),
           "P": {str(p): run_at(p) for p in PS}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(doc) + "\n")
    print(f"wrote {path.relative_to(ROOT)} (P = {', '.join(map(str, PS))})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mpi.traffic_golden")
    ap.add_argument("--out", type=Path, help="under mpiexec: write this run's counts here")
    ap.add_argument("--update", action="store_true",
                    help="without a launcher: regenerate tests/data/traffic_golden.json")
    args = ap.parse_args(argv)
    if args.update:
        from autotune.launch import under_mpi

        if under_mpi():
            ap.error("--update launches its own mpiexec: run it without one")
        update()
        return 0
    if args.out is None:
        ap.error("give --out FILE (under mpiexec) or --update")
    from collectives import MPICommunicator
    from tests.mpi import abort_job

    comm = MPICommunicator()
    try:
        counts = measure(comm)
    except Exception:
        return abort_job(comm.comm, "traffic golden run", SEED)
    if comm.rank == 0:
        doc = {"settings": settings(), "P": comm.size, "counts": counts}
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

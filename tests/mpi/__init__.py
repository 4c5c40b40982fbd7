"""Runner modules executed under mpiexec by the pytest suite."""
import sys
import traceback
import zlib

import numpy as np

# non-default constructor options whose invariants the conformance suite checks
# like a registered algorithm's (name@key=value+...)
VARIANTS = ["oktopk@residuals=owner"]


def abort_job(world, what: str, seed) -> int:
    """Report the failing case with its traceback and seed, then end the MPI job
    (a failing rank must not leave the others waiting in a collective)."""
    sys.stdout.flush()
    sys.stderr.write(f"[rank {world.Get_rank()}] FAILED {what} "
                     f"(P={world.Get_size()}, seed={seed})\n" + traceback.format_exc())
    sys.stderr.flush()
    world.Abort(1)
    return 1


def run_cases(world, label: str, cases, seed=None) -> int:
    """Run ``cases`` (name -> callable returning how many checks it made) in
    order; rank 0 prints each ``  name  ok (n)`` and ``<label> P=<P>: <total>
    cases passed``.  The first failure ends the job through ``abort_job``."""
    total = 0
    for name, case in cases.items():
        try:
            done = case()
        except Exception:
            return abort_job(world, f"{label} {name}", seed)
        total += done
        if world.Get_rank() == 0:
            print(f"  {name:10s} ok ({done})", flush=True)
    if world.Get_rank() == 0:
        print(f"{label} P={world.Get_size()}: {total} cases passed", flush=True)
    return 0


def identical(world, a) -> bool:
    """Whether the host array ``a`` is bitwise the same, size included, on every rank."""
    h = zlib.crc32(np.ascontiguousarray(a).view(np.uint8))
    hs = world.allgather((h, a.size))
    return all(v == hs[0] for v in hs)

"""Runner modules executed under mpiexec by the pytest suite."""
import sys
import traceback

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

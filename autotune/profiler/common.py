"""What every part of the profiler shares: its error, agreement among ranks, the
control communicator, the host's load and the array module of a device."""
from __future__ import annotations

import os

import numpy as np


class ProfilerError(RuntimeError):
    """A problem every rank agrees on (bad option, missing device, bad input files)."""


# -- helpers ------------------------------------------------------------------------
def _agree_max(comm, value: float) -> float:
    """The max over ranks (uncounted control traffic)."""
    if comm.size == 1:
        return float(value)
    return float(comm.control_allreduce(np.array([value], dtype=np.float64), "max")[0])


def _agree_error(comm, msg: str | None) -> None:
    """Raise the same ProfilerError on every rank if any rank has a message."""
    bad = _agree_max(comm, 1.0 if msg else 0.0)
    if bad:
        first = comm.bcast_obj(msg if comm.rank == 0 else None, 0)
        # the message of the lowest failing rank would need a gather; rank 0's,
        # or a generic one, is enough to say what to fix
        raise ProfilerError(first or msg or "a rank failed its checks (see its output)")


def _control(comm):
    """The MPI communicator under ``comm`` (itself on the MPI backend): NCCL has
    no sleeping barrier and no library string, and control data is host data."""
    return getattr(comm, "mpi", comm)


def _loadavg() -> list | None:
    """The host's 1/5/15-minute load averages (other work skews timings)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _xp(device: str):
    if device == "gpu":
        import cupy

        return cupy, cupy.cuda.get_current_stream().synchronize
    return np, None

"""``allreduce(tensor)``: one call, every registered algorithm, one answer on every rank.

The forced path (``algorithm="dense"``, ``"oktopk"``, ...) needs no profile.
``algorithm="auto"`` asks the selector (autotune.selector) when a profile is
loaded; until then, and always for tensors without a name, it uses the exact
``dense`` algorithm: a tensor without a name is never given a lossy algorithm,
because error feedback needs somewhere to keep its residual.
"""
from __future__ import annotations

import collectives
from collectives import ALGORITHMS

from ._convert import as_array

_STATE: dict = {"comm": None, "algos": {}}


def init(comm=None):
    """Set up the communicator (MPI world by default).  Idempotent.

    Args:
        comm: a ``collectives.Communicator`` or an ``mpi4py`` communicator.
    Returns:
        the Communicator in use.
    """
    if comm is None and _STATE["comm"] is not None:
        return _STATE["comm"]
    if comm is None:
        comm = collectives.MPICommunicator()
    elif not isinstance(comm, collectives.Communicator):
        comm = collectives.MPICommunicator(comm)
    _STATE["comm"] = comm
    _STATE["algos"] = {}
    return comm


def algorithm_instance(name: str):
    """The per-process instance of a registered algorithm (it holds the
    error-feedback states of all tensors that use it)."""
    comm = init()
    algos = _STATE["algos"]
    if name not in algos:
        if name not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {name!r}; registered: {sorted(ALGORITHMS)}")
        algos[name] = ALGORITHMS[name](comm)
    return algos[name]


def allreduce(tensor, *, name: str | None = None, algorithm: str = "auto",
              density: float | None = None, op: str = "sum"):
    """Sum ``tensor`` over all ranks (``op="mean"`` divides by P).

    Args:
        tensor: numpy array, cupy array or torch tensor (any shape; float32 or
            float64; contiguous).
        name: the tensor's stable name (e.g. the parameter's); required for
            sparse algorithms, which keep its error-feedback residual.
        algorithm: a name from ``collectives.ALGORITHMS`` or ``"auto"``.
        density: fraction of values a sparse algorithm sends (default 1%).
        op: ``"sum"`` or ``"mean"``.

    Returns:
        the reduced tensor, identical on every rank, of the input's type,
        shape and device.

    Example::

        import numpy as np, autotune
        g = np.random.default_rng().standard_normal(1 << 20, dtype=np.float32)
        s = autotune.allreduce(g, name="fc1.weight", algorithm="oktopk", density=0.01)
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    arr, adapter = as_array(tensor)
    if algorithm == "auto":
        algorithm = "dense"
    algo = algorithm_instance(algorithm)
    out = algo(arr, name=name, density=density)
    if op == "mean":
        out /= algo.comm.size
    return adapter.back(out)

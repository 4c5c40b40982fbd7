"""Moving bytes: allreduce algorithms over a Communicator.

``ALGORITHMS`` maps each registered name to its class::

    from collectives import ALGORITHMS, MPICommunicator
    comm = MPICommunicator()
    algo = ALGORITHMS["gtopk"](comm)
    out = algo(grad, name="fc1.weight", density=0.01)
    print(algo.last_traffic.total().bytes_sent)
"""
from ._base import (ALGORITHMS, Algorithm, agree, SparseAllreduce, SparseState, check_intervals, register,
                    validate)
from ._comm import Communicator, MPICommunicator, PhaseCounters, Traffic, mpi_library_version
from ._timing import timeit, timeit_interleaved
from ._nccl import NCCLCommunicator
from ._dense import Dense, NativeMPI, NativeNCCL, rabenseifner
from ._topk import GaussianK, TopkA
from ._tree import GTopk, TopkDSA
from ._oktopk import OkTopk
from ._topka2a import TopKA2A

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "agree",
    "Communicator",
    "Dense",
    "GTopk",
    "GaussianK",
    "MPICommunicator",
    "NCCLCommunicator",
    "NativeMPI",
    "NativeNCCL",
    "OkTopk",
    "PhaseCounters",
    "SparseAllreduce",
    "SparseState",
    "TopkA",
    "TopKA2A",
    "TopkDSA",
    "Traffic",
    "check_intervals",
    "rabenseifner",
    "register",
    "timeit",
    "timeit_interleaved",
    "mpi_library_version",
    "validate",
]

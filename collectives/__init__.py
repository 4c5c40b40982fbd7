"""Moving bytes: allreduce algorithms over a Communicator.

``ALGORITHMS`` maps each registered name to its class::

    from collectives import ALGORITHMS, MPICommunicator
    comm = MPICommunicator()
    algo = ALGORITHMS["gtopk"](comm)
    out = algo(grad, name="fc1.weight", density=0.01)
    print(algo.last_traffic.bytes_sent())
"""
from kernels import stream_ordered  # whether the algorithms' selections may wait for the device

from ._base import (ALGORITHMS, BACKENDS, ITEM, Algorithm, Prices, SparseAllreduce,
                    SparseState, ceil_log2, register, unregister)
from ._validate import agree, check_intervals, report_nonfinite, validate
from ._base import CallRecord, Observation, observe
from ._comm import Communicator, MPICommunicator, PhaseCounters, Traffic, mpi_library_version
from ._timing import pause, timeit, timeit_interleaved
from ._nccl import NCCLCommunicator
from ._dense import Dense, NativeMPI, NativeNCCL, rabenseifner
from ._topk import GaussianK, GaussianKState, TopkA
from ._tree import GTopk, TopkDSA
from ._oktopk import OkTopk, OkTopkState
from ._topka2a import TopKA2A

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BACKENDS",
    "agree",
    "CallRecord",
    "Communicator",
    "Dense",
    "GTopk",
    "GaussianK",
    "GaussianKState",
    "ITEM",
    "MPICommunicator",
    "NCCLCommunicator",
    "NativeMPI",
    "NativeNCCL",
    "Observation",
    "OkTopk",
    "OkTopkState",
    "PhaseCounters",
    "Prices",
    "SparseAllreduce",
    "SparseState",
    "TopkA",
    "TopKA2A",
    "TopkDSA",
    "Traffic",
    "ceil_log2",
    "check_intervals",
    "rabenseifner",
    "register",
    "report_nonfinite",
    "stream_ordered",
    "unregister",
    "pause",
    "timeit",
    "timeit_interleaved",
    "mpi_library_version",
    "observe",
    "validate",
]

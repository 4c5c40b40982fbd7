"""Algorithm base class, the registry, per-tensor state and input validation."""
from __future__ import annotations

import abc
import inspect
import math
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

import kernels

from ._comm import Communicator, MPICommunicator, Traffic
from ._nccl import NCCLCommunicator
from ._validate import SUPPORTED_DTYPES, agree, check_intervals, validate

__all__ = [
    "ALGORITHMS",
    "BACKENDS",
    "agree",
    "Algorithm",
    "ITEM",
    "Prices",
    "SparseAllreduce",
    "SparseState",
    "check_intervals",
    "ceil_log2",
    "register",
    "SUPPORTED_DTYPES",
    "union_size",
    "unregister",
]

ALGORITHMS: dict[str, type["Algorithm"]] = {}

# The backends: name -> Communicator class; each declares its ``native``
# allreduce (a registered algorithm name), the baseline ``autotune bench`` times.
BACKENDS: dict[str, type[Communicator]] = {
    c.backend: c for c in (MPICommunicator, NCCLCommunicator)}



def register(cls):
    """Class decorator: add an Algorithm subclass to ``ALGORITHMS`` under ``cls.name``.

    Checks the declarations every consumer relies on (the dispatcher, the cost
    model, the selector, ``autotune bench``, the conformance suite): a name,
    ``lossy`` as a bool, backends from ``BACKENDS``, and no abstract method
    left (``_call``, ``traffic_bound``, ``cost``).

    Raises:
        TypeError: a declaration is missing or abstract.
        ValueError: the name is taken by another class, or a backend is unknown.
    """
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} must declare a class attribute name = '...'")
    if name in ALGORITHMS and ALGORITHMS[name] is not cls:
        raise ValueError(f"algorithm {name!r} registered twice")
    if not isinstance(cls.lossy, bool):
        raise TypeError(f"algorithm {name!r}: lossy must be True or False, got {cls.lossy!r}")
    unknown = [b for b in cls.backends if b not in BACKENDS]
    if unknown or not cls.backends:
        raise ValueError(f"algorithm {name!r}: backends {cls.backends!r} must be a non-empty "
                         f"tuple from {sorted(BACKENDS)}")
    if inspect.isabstract(cls):
        raise TypeError(f"algorithm {name!r} does not implement "
                        f"{', '.join(sorted(cls.__abstractmethods__))}")
    ALGORITHMS[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove ``name`` from ``ALGORITHMS`` (a plug-in's tests clean up with it).

    Instances already made keep working; dispatchers made earlier may still
    cache them.
    """
    del ALGORITHMS[name]


# -- what the cost terms are written against ------------------------------------------
ITEM = 4  # bytes of a float32 value or an int32 index, as the cost terms count them


def ceil_log2(P: int) -> int:
    """ceil(log2 P), 0 for P = 1: rounds of a tree or recursive-doubling step."""
    return math.ceil(math.log2(P)) if P > 1 else 0


def union_size(n: int, k: int, P: int) -> float:
    """Expected size of the union of P local top-k sets (heuristic: partial overlap)."""
    return min(float(n), k * P ** 0.9)


@runtime_checkable
class Prices(Protocol):
    """What an algorithm's ``cost`` may ask of a machine: seconds per primitive.

    ``autotune.costmodel.Machine`` implements it from a profile (each message
    priced in the size regime covering it); collectives knows nothing of
    profiles.  Message sizes ``m`` are bytes, ``n`` element counts.
    """

    def t_p2p(self, m: float, active: int | None = None) -> float:
        """One point-to-point message of m bytes while ``active`` ranks send
        (None: all of them); on one shared link their bytes add up."""

    def t_allgather(self, m: float, P: int) -> float:
        """Allgather of m bytes per rank."""

    def t_alltoall(self, m: float, P: int) -> float:
        """Alltoall of m bytes to each peer."""

    def t_allreduce(self, m: float, P: int) -> float:
        """The native allreduce of m bytes."""

    def t_bcast(self, m: float, P: int) -> float:
        """Broadcast of m bytes."""

    def dense_passes(self, n: float, streams: int = 4, active: int | None = None) -> float:
        """``streams`` full reads or writes of n elements (default 4: the
        error-feedback sum acc = r + x and the dense output) while ``active``
        ranks do such work (None: all of them); where ranks share cores, fewer
        get more of them."""

    def topk(self, n: float) -> float:
        """Exact top-k selection over n elements."""

    def threshold(self, n: float) -> float:
        """One threshold-selection scan over n elements."""

    def reduce(self, n: float) -> float:
        """Sparse (COO) reduction of n entries."""


# -- state -----------------------------------------------------------------------
class SparseState:
    """Per-tensor state every sparse algorithm has (error feedback and counts).

    Fields, grouped as in PyTorch's PowerSGDState:
      tuned:      density, tau (region-boundary refresh interval), tau_prime
                  (threshold refresh interval)
      internal:   residual, iteration
      statistics: selected_local, selected_global (counts at the last call)

    An algorithm needing more per tensor (Ok-Topk's reused thresholds and
    regions) subclasses it, with its own ``__slots__``, and names the
    subclass in its ``state_class``.
    """

    __slots__ = (
        "density", "tau", "tau_prime",
        "residual", "iteration",
        "selected_local", "selected_global",
    )

    def __init__(self, n: int, dtype, xp=np, *, density: float, tau: int = 64, tau_prime: int = 32):
        if not (0.0 < density <= 1.0):
            raise ValueError(f"density must be in (0, 1], got {density!r}")
        check_intervals(tau=tau, tau_prime=tau_prime)
        self.density = float(density)
        self.tau = int(tau)
        self.tau_prime = int(tau_prime)
        self.residual = xp.zeros(n, dtype=dtype)
        self.iteration = 0
        self.selected_local = 0
        self.selected_global = 0

    @property
    def n(self) -> int:
        return int(self.residual.size)

    @property
    def k(self) -> int:
        return kernels.k_from_density(self.n, self.density)


# -- algorithms ------------------------------------------------------------------
class Algorithm(abc.ABC):
    """An allreduce algorithm bound to a communicator.

    Call it as ``algo(x, name=..., density=...)``; the output is a new flat
    array (same dtype, same array module) identical on every rank.
    ``last_traffic`` holds the per-phase counters of the latest call.
    """

    name: ClassVar[str]
    lossy: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("mpi", "nccl")

    @classmethod
    def supports(cls, comm: Communicator) -> bool:
        return comm.backend in cls.backends

    def __init__(self, comm: Communicator, *, check_finite: bool = True):
        if not self.supports(comm):
            raise RuntimeError(f"algorithm {self.name!r} needs a {' or '.join(self.backends)} "
                               f"communicator, got {comm.backend!r}")
        self.comm = comm
        self.check_finite = check_finite
        self.last_traffic = Traffic()
        self._workspace: dict = {}

    def scratch(self, ref, size: int, dtype=None, tag: str = ""):
        """A scratch vector of ``size`` elements (of ``dtype``, default ``ref``'s)
        on ``ref``'s device, kept by this instance and handed out again on later
        calls (contents undefined).

        Large temporaries are the dear part of a big CPU allreduce when they are
        fresh: the kernel zeroes every new page (BENCHMARKS, "Fresh large buffers
        cost a page-zeroing pass").  One buffer per (device, dtype, tag) is kept,
        grown on demand.
        """
        xp = kernels.array_module(ref)
        dtype = np.dtype(ref.dtype if dtype is None else dtype)
        key = (xp.__name__, dtype.str, tag)
        buf = self._workspace.get(key)
        if buf is None or buf.size < size:
            buf = self._workspace[key] = xp.empty(int(size), dtype=dtype)
        return buf[:size]

    def kernel_work(self, ref):
        """The ``work`` callable the selection kernels take: scratch on ``ref``'s
        device under the kernels' own tags (see ``kernels._select._workspace``)."""
        return lambda tag, size, dtype: self.scratch(ref, size, dtype, "kernel:" + tag)

    def __call__(self, x, *, name: str | None = None, density: float | None = None,
                 validated: bool = False, **kw):
        if not validated:  # the dispatcher validates once itself before deciding
            validate(self.comm, x, density=density if self.lossy else None,
                     check_finite=self.check_finite, tag="" if name is None else str(name),
                     params=kw if self.lossy else None, call=self.name)
        x = x.reshape(-1)
        with self.comm.capture() as traffic:  # validation is not the algorithm's traffic
            out = self._call(x, name=name, density=density, **kw)
        self.last_traffic = traffic
        if _OBSERVERS:  # after the call is complete: an observer's error leaves no half state
            if density is None and self.lossy:
                density = getattr(self, "default_density", None)
            stats = getattr(self, "last_stats", None)
            rec = CallRecord(self, name, int(x.size), density, self.last_traffic,
                             None if stats is None else dict(stats), x, out)
            for obs in tuple(_OBSERVERS):
                obs.callback(rec)
        return out

    @abc.abstractmethod
    def _call(self, x, *, name, density, **kw): ...

    @staticmethod
    @abc.abstractmethod
    def traffic_bound(n: int, P: int, k: int, itemsize: int = 4) -> int:
        """Upper bound on the bytes one rank sends, and on those it receives, per call."""

    @staticmethod
    @abc.abstractmethod
    def cost(prices: Prices, n: int, P: int, k: int, *, tau_prime: int = 32,
             tau: int = 64) -> float:
        """Modelled seconds per call at n elements, P ranks and k selected per rank
        (the paper's Table 1 terms plus local compute, priced by ``prices``; the
        implementation's fixed cost per call is fitted apart, by the cost model)."""


# -- observers: per-call tracing -------------------------------------------------
class CallRecord:
    """What an observer sees of one completed algorithm call (read only).

    ``algorithm``: the instance; ``name``: the tensor name given (or None);
    ``size``: input elements; ``density``: the call's (a lossy algorithm's
    default when none was given; None for lossless ones); ``traffic``: the
    call's ``last_traffic``; ``stats``: a copy of the algorithm's
    ``last_stats`` dict where it keeps one (Ok-Topk), else None; ``x`` / ``out``:
    the flat input and the output (do not modify them).
    """

    __slots__ = ("algorithm", "name", "size", "density", "traffic", "stats", "x", "out")

    def __init__(self, algorithm, name, size, density, traffic, stats, x, out):
        self.algorithm, self.name, self.size, self.density = algorithm, name, size, density
        self.traffic, self.stats, self.x, self.out = traffic, stats, x, out

    def __repr__(self) -> str:
        return (f"CallRecord({self.algorithm.name!r}, name={self.name!r}, size={self.size}, "
                f"density={self.density}, bytes_sent={self.traffic.bytes_sent()})")


class Observation:
    """The handle :func:`observe` returns: ``remove()`` (or leaving a ``with``
    block) stops the calls."""

    __slots__ = ("callback",)

    def __init__(self, callback):
        self.callback = callback

    def remove(self) -> None:
        _OBSERVERS[:] = [o for o in _OBSERVERS if o is not self]

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_OBSERVERS: list[Observation] = []


def observe(callback) -> Observation:
    """Call ``callback(record)`` (a :class:`CallRecord`) after every algorithm
    call in this process, on this rank, in registration order, until the
    returned handle's ``remove()``.

    Observers run once the call is complete (output computed, per-tensor state
    and ``last_traffic`` updated), so what they see is final.  An exception
    in an observer propagates to the caller of the algorithm (observers after
    it do not see that call); the algorithm's state is that of the completed
    call, so later calls proceed as without the observer, but that call's
    output does not reach the caller.  An observer that communicates must do
    so on every rank alike.
    """
    if not callable(callback):
        raise TypeError(f"observe needs a callable, got {callback!r}")
    h = Observation(callback)
    _OBSERVERS.append(h)
    return h


class SparseAllreduce(Algorithm):
    """Base of the top-k family: error feedback around a stateless exchange.

    Subclasses implement ``_exchange(acc, state, x) -> out`` where ``acc`` is
    the residual buffer and ``x`` the new input: first they add x into acc
    (``kernels.add_into``, or ``_take_topk``, which fuses the sum into the
    selection on the GPU); they must zero in ``acc`` exactly the entries
    whose values reached the output (or move dropped partial sums into it),
    so that conservation holds:
    sum(outputs) + sum(residuals over ranks) == sum(inputs).
    """

    lossy = True
    default_density = 0.01
    state_class: ClassVar[type[SparseState]] = SparseState  # what ``_call`` makes per tensor

    def __init__(self, comm: Communicator, *, tau: int = 64, tau_prime: int = 32, **kw):
        super().__init__(comm, **kw)
        self.tau = tau
        self.tau_prime = tau_prime
        self.states: dict[str, SparseState] = {}

    def state(self, name: str) -> SparseState:
        return self.states[name]

    def forget(self, which) -> list[str]:
        """Drop the state (residual, thresholds) of every tensor whose name
        starts with ``which`` (a str), or is in ``which`` (a set of names);
        returns their names.  Local: callers make sure every rank forgets
        alike (``autotune.forget``), since a tensor's next call starts afresh,
        as at its first."""
        if isinstance(which, str):
            gone = [name for name in list(self.states) if str(name).startswith(which)]
        else:
            gone = [name for name in list(self.states) if name in which]
        for name in gone:
            del self.states[name]
        return gone

    def drop_nonfinite_residuals(self) -> list[str]:
        """Zero every residual holding NaN or Inf (after a non-finite input was
        reported); returns the tensors' names."""
        dropped = []
        for name, st in self.states.items():
            if not bool(kernels.array_module(st.residual).isfinite(st.residual).all()):
                st.residual.fill(0)
                dropped.append(name)
        return dropped

    def _call(self, x, *, name, density, tau: int | None = None, tau_prime: int | None = None):
        """``tau`` / ``tau_prime`` (None: keep the tensor's, initially the
        instance's) set this tensor's refresh intervals from this call on."""
        if name is None:
            raise ValueError(
                f"{self.name} keeps error-feedback state per tensor: pass name=...")
        check_intervals(tau=tau, tau_prime=tau_prime)
        density = self.default_density if density is None else density
        st = self.states.get(name)
        if st is None or st.n != x.size or st.residual.dtype != x.dtype:
            if st is not None:
                raise ValueError(f"tensor {name!r} changed size or dtype "
                                 f"({st.n}/{st.residual.dtype} -> {x.size}/{x.dtype})")
            xp = kernels.array_module(x)
            st = self.states[name] = self.state_class(
                x.size, x.dtype, xp, density=density, tau=self.tau, tau_prime=self.tau_prime)
        st.density = float(density)
        if tau is not None:
            st.tau = int(tau)
        if tau_prime is not None:
            st.tau_prime = int(tau_prime)
        out = self._exchange(st.residual, st, x)
        st.iteration += 1
        return out

    def _take_topk(self, acc, st: SparseState, x):
        """acc += x, then the exact local top-k of ``acc`` (on the GPU the sum
        is fused into the selection's first pass); the selected values leave
        the residual (for algorithms that deliver every selected value to the
        output)."""
        with self.comm.phase("select"):
            idx, vals = kernels.topk_select(acc, st.k, work=self.kernel_work(acc), add=x)
            kernels.zero_at(acc, idx)
        st.selected_local = int(idx.size)
        return idx, vals

    def _take_regions(self, acc, st: SparseState, x):
        """``_take_topk`` plus the index space cut into P equal regions (the
        region-based exchanges): (idx, vals, bounds, array module)."""
        idx, vals = self._take_topk(acc, st, x)
        return idx, vals, kernels.region_bounds(acc.size, self.comm.size), \
            kernels.array_module(acc)

    @abc.abstractmethod
    def _exchange(self, acc, state: SparseState, x): ...

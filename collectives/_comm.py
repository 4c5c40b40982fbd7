"""The Communicator: the few operations the algorithms need, with traffic accounting.

Every backend counts, per rank and per named phase, the bytes and messages it
sends and receives, and the wall time spent inside each phase.  Point-to-point
operations are counted exactly.  Native collectives (allgather(v), alltoallv,
allreduce, bcast) are counted with the volume of the bandwidth-optimal
algorithm for that collective (ring allgather: each rank sends its block to
P-1 ranks and receives the P-1 others; allreduce: 2m(P-1)/P each way; binomial
bcast), which is also what the paper's Table 1 assumes.
"""
from __future__ import annotations

import abc
import ctypes
import logging
import sys
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Communicator", "MPICommunicator", "Traffic", "PhaseCounters", "mpi_library_version"]

log = logging.getLogger("collectives")


@dataclass
class PhaseCounters:
    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    seconds: float = 0.0

    def __add__(self, o: "PhaseCounters") -> "PhaseCounters":
        return PhaseCounters(
            self.bytes_sent + o.bytes_sent,
            self.bytes_recv + o.bytes_recv,
            self.msgs_sent + o.msgs_sent,
            self.msgs_recv + o.msgs_recv,
            self.seconds + o.seconds,
        )

    def __sub__(self, o: "PhaseCounters") -> "PhaseCounters":
        return PhaseCounters(
            self.bytes_sent - o.bytes_sent,
            self.bytes_recv - o.bytes_recv,
            self.msgs_sent - o.msgs_sent,
            self.msgs_recv - o.msgs_recv,
            self.seconds - o.seconds,
        )


@dataclass
class Traffic:
    """Per-phase counters of one rank.  ``traffic[phase]`` -> PhaseCounters."""

    phases: dict[str, PhaseCounters] = field(default_factory=dict)

    def __getitem__(self, phase: str) -> PhaseCounters:
        c = self.phases.get(phase)
        if c is None:
            c = self.phases[phase] = PhaseCounters()
        return c

    def total(self) -> PhaseCounters:
        t = PhaseCounters()
        for c in self.phases.values():
            t = t + c
        return t

    def bytes_sent(self) -> int:
        """``total().bytes_sent`` without the sum of every counter."""
        return sum(c.bytes_sent for c in self.phases.values())

    def copy(self) -> "Traffic":
        return Traffic({k: PhaseCounters(**vars(v)) for k, v in self.phases.items()})

    def since(self, earlier: "Traffic") -> "Traffic":
        out = Traffic()
        for k, v in self.phases.items():
            d = v - earlier.phases.get(k, PhaseCounters())
            if d != PhaseCounters():
                out.phases[k] = d
        return out

    def by_kind(self) -> dict[str, float]:
        """Seconds grouped by phase kind: the part of the name before ':'."""
        out: dict[str, float] = {}
        for k, v in self.phases.items():
            kind = k.split(":", 1)[0]
            out[kind] = out.get(kind, 0.0) + v.seconds
        return out

    def as_dict(self) -> dict:
        return {k: vars(v).copy() for k, v in self.phases.items()}


def _nbytes(buf) -> int:
    return int(buf.nbytes)


class _Phase:
    """``Communicator.phase``'s block: time and traffic go to one phase name."""

    __slots__ = ("comm", "name", "prev", "t0")

    def __init__(self, comm: "Communicator", name: str):
        self.comm, self.name = comm, name

    def __enter__(self):
        self.prev, self.comm._phase = self.comm._phase, self.name
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        comm = self.comm
        try:
            if comm.sync_phases:
                comm._sync()
        finally:
            dt = time.perf_counter() - self.t0
            comm.traffic[self.name].seconds += dt
            for cap in comm._captures:
                cap[self.name].seconds += dt
            comm._phase = self.prev
        return False


class _Capture:
    """``Communicator.capture``'s block: yields the Traffic of what runs inside."""

    __slots__ = ("comm", "traffic")

    def __init__(self, comm: "Communicator"):
        self.comm, self.traffic = comm, Traffic()

    def __enter__(self) -> Traffic:
        self.comm._captures.append(self.traffic)
        return self.traffic

    def __exit__(self, *exc):
        self.comm._captures.pop()  # nested blocks close innermost first
        return False


class Communicator(abc.ABC):
    """Abstract communicator.  Arrays are flat and contiguous.

    Subclasses implement the ``_`` primitives; the public methods add
    accounting.  All ranks must call collectives in the same order.
    """

    backend: str = "abstract"
    native: str = ""  # the backend's own allreduce: a registered algorithm's name
    devices: tuple[str, ...] = ()  # where its data may live ("cpu", "gpu"), preferred first

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self.traffic = Traffic()
        self._phase = "other"
        # the Traffic of each call in progress (Algorithm.__call__), innermost last
        self._captures: list[Traffic] = []
        # non-finite device inputs not yet reported (collectives._validate.DeviceFlags)
        self.device_flags = None
        # When True, each phase ends with a device synchronize so that its
        # seconds include the asynchronous GPU work it launched (benchmarks).
        self.sync_phases = False

    # -- accounting -----------------------------------------------------
    # (on every call's path: plain context-manager objects, no generators)
    def phase(self, name: str) -> "_Phase":
        """Attribute traffic and time inside the block to ``name``.

        Names are ``kind`` or ``kind:detail`` where kind is ``select``,
        ``comm``, ``reduce`` or ``control``.
        """
        return _Phase(self, name)

    def capture(self) -> "_Capture":
        """Yield a Traffic that collects what happens inside the block (on top
        of the running ``traffic``): one call's counters, without copying the
        running totals."""
        return _Capture(self)

    def _count(self, sent: int, recv: int, msent: int, mrecv: int) -> None:
        name = self._phase
        for t in (self.traffic, *self._captures):
            c = t[name]
            c.bytes_sent += sent
            c.bytes_recv += recv
            c.msgs_sent += msent
            c.msgs_recv += mrecv

    # -- point to point -------------------------------------------------
    def send(self, buf, dest: int, tag: int = 0) -> None:
        self._send(buf, dest, tag)
        self._count(_nbytes(buf), 0, 1, 0)

    def recv(self, buf, source: int, tag: int = 0) -> None:
        self._recv(buf, source, tag)
        self._count(0, _nbytes(buf), 0, 1)

    def sendrecv(self, sendbuf, dest: int, recvbuf, source: int, tag: int = 0) -> None:
        self._sendrecv(sendbuf, dest, recvbuf, source, tag)
        s, r = _nbytes(sendbuf), _nbytes(recvbuf)
        self._count(s, r, int(s > 0), int(r > 0))

    def isend(self, buf, dest: int, tag: int = 0):
        self._count(_nbytes(buf), 0, 1, 0)
        return self._isend(buf, dest, tag)

    def irecv(self, buf, source: int, tag: int = 0):
        self._count(0, _nbytes(buf), 0, 1)
        return self._irecv(buf, source, tag)

    def waitall(self, requests) -> None:
        self._waitall(list(requests))

    # -- collectives ----------------------------------------------------
    def allgather(self, sendbuf):
        """Gather equal-sized blocks: returns array of shape (P, *sendbuf.shape)."""
        out = self._allgather(sendbuf)
        self._count_allgather(_nbytes(sendbuf))
        return out

    def _count_allgather(self, b: int) -> None:
        """A ring allgather of b bytes per rank: b to each of the P-1 others, from each."""
        p = self.size - 1
        self._count(b * p, b * p, p, p)

    def allgatherv(self, sendbuf, counts=None):
        """Gather blocks of varying length; returns (concatenation, counts).

        ``counts`` (host ints, one per rank) may be given when every rank
        already knows them; otherwise they are exchanged first (control).
        """
        if counts is None:
            counts = self.allgather_ints([sendbuf.size])[:, 0]
        counts = np.asarray(counts, dtype=np.int64)
        out = self._allgatherv(sendbuf, counts)
        item = sendbuf.dtype.itemsize
        sent = _nbytes(sendbuf) * (self.size - 1)
        recv = int(counts.sum() - counts[self.rank]) * item
        others = int(np.count_nonzero(counts)) - int(counts[self.rank] > 0)
        self._count(sent, recv, (self.size - 1) if sendbuf.size else 0, others)
        return out, counts

    def alltoallv(self, sendbufs, recvcounts=None):
        """Send ``sendbufs[j]`` to rank j; returns the list of received arrays.

        All send buffers share one dtype.  ``recvcounts`` (host ints) may be
        given when known; otherwise counts are exchanged first (control).
        """
        if len(sendbufs) != self.size:
            raise ValueError("alltoallv needs one send buffer per rank")
        sendcounts = np.array([b.size for b in sendbufs], dtype=np.int64)
        if recvcounts is None:
            recvcounts = self.alltoall_ints(sendcounts)
        recvcounts = np.asarray(recvcounts, dtype=np.int64)
        out = self._alltoallv(sendbufs, sendcounts, recvcounts)
        item = sendbufs[0].dtype.itemsize if sendbufs else 0
        me = self.rank
        s = int(sendcounts.sum() - sendcounts[me]) * item
        r = int(recvcounts.sum() - recvcounts[me]) * item
        ms = int(np.count_nonzero(sendcounts)) - int(sendcounts[me] > 0)
        mr = int(np.count_nonzero(recvcounts)) - int(recvcounts[me] > 0)
        self._count(s, r, ms, mr)
        return out

    def allreduce(self, buf, op: str = "sum"):
        """Native allreduce (the vendor's MPI_Allreduce / ncclAllReduce)."""
        out = self._allreduce(buf, op)
        self._count_allreduce(_nbytes(buf))
        return out

    def _count_allreduce(self, nbytes: int) -> int:
        """Count a native allreduce of ``nbytes`` as the ring moves it; the bytes sent."""
        p = self.size
        b = -(-2 * nbytes * (p - 1) // p) if p > 1 else 0  # ceil
        self._count(b, b, 2 * (p - 1) if p > 1 else 0, 2 * (p - 1) if p > 1 else 0)
        return b

    def control_allreduce(self, buf, op: str = "sum"):
        """The same native allreduce, left out of the traffic counters.

        For measurement bookkeeping around the algorithms (the slowest rank's
        time, the busiest rank's bytes): a new array, ``op`` one of ``sum``,
        ``max``, ``min``.  Collective like the rest: every rank calls it in the
        same order.  Host (numpy) arrays on the NCCL backend go through MPI.
        """
        if op not in ("sum", "max", "min"):
            raise ValueError(f"op must be 'sum', 'max' or 'min', got {op!r}")
        return self._allreduce(buf, op)

    def bcast(self, buf, root: int = 0):
        """Broadcast ``buf`` from ``root`` in place (binomial-tree accounting)."""
        self._bcast(buf, root)
        p, rel = self.size, (self.rank - root) % self.size
        low = rel & -rel if rel else 1 << max(p - 1, 1).bit_length()
        children = sum(1 for j in range(max(p, 2).bit_length()) if (1 << j) < low and rel + (1 << j) < p)
        b = _nbytes(buf)
        self._count(b * children, b if rel else 0, children, int(rel > 0))
        return buf

    # small control-plane helpers (counts, flags); counted like the rest
    def allgather_ints(self, values) -> np.ndarray:
        """Host ints from every rank: array (P, len(values)), int64."""
        a = np.array(values, dtype=np.int64).reshape(-1)
        out = self._allgather_ints(a)
        self._count_allgather(a.nbytes)
        return out

    def _allgather_ints(self, a):
        return self._allgather(a)

    def alltoall_ints(self, values) -> np.ndarray:
        a = np.ascontiguousarray(np.asarray(values, dtype=np.int64))
        out = self._alltoall(a)
        self._count(8 * (self.size - 1), 8 * (self.size - 1), self.size - 1, self.size - 1)
        return out

    def bcast_obj(self, obj, root: int = 0):
        """Broadcast a small picklable control object (never loaded from disk)."""
        return self._bcast_obj(obj, root)

    def barrier(self) -> None:
        self._barrier()

    def split(self, color: int, key: int = 0) -> "Communicator":
        return self._split(color, key)

    def idle_barrier(self, poll_s: float = 1e-3) -> None:
        """A barrier whose waiting ranks sleep instead of spinning.

        For ranks that sit out a measurement on a sub-communicator: on an
        oversubscribed host a spinning barrier would steal the cores being
        measured.  Backends without a nonblocking barrier spin.
        """
        self._barrier()

    def library_version(self) -> str | None:
        """The communication library and its version (for machine fingerprints)."""
        return None

    def _sync(self) -> None:
        """Wait for device work queued by this rank (no-op on the host)."""
        cp = sys.modules.get("cupy")
        if cp is not None:
            cp.cuda.get_current_stream().synchronize()

    # -- backend primitives -----------------------------------------------
    @abc.abstractmethod
    def _send(self, buf, dest, tag): ...
    @abc.abstractmethod
    def _recv(self, buf, source, tag): ...
    @abc.abstractmethod
    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag): ...
    @abc.abstractmethod
    def _isend(self, buf, dest, tag): ...
    @abc.abstractmethod
    def _irecv(self, buf, source, tag): ...
    @abc.abstractmethod
    def _waitall(self, requests): ...
    @abc.abstractmethod
    def _allgather(self, sendbuf): ...
    @abc.abstractmethod
    def _allgatherv(self, sendbuf, counts): ...
    @abc.abstractmethod
    def _alltoall(self, ints): ...
    @abc.abstractmethod
    def _alltoallv(self, sendbufs, sendcounts, recvcounts): ...
    @abc.abstractmethod
    def _allreduce(self, buf, op): ...
    @abc.abstractmethod
    def _bcast(self, buf, root): ...
    @abc.abstractmethod
    def _bcast_obj(self, obj, root): ...
    @abc.abstractmethod
    def _barrier(self): ...
    @abc.abstractmethod
    def _split(self, color, key): ...


def _mpi_cuda_aware() -> bool:
    """Whether the loaded MPI accepts device pointers (Open MPI's MPIX query)."""
    try:
        fn = ctypes.CDLL(None).MPIX_Query_cuda_support
    except (AttributeError, OSError):
        return False
    fn.restype = ctypes.c_int
    return bool(fn())


def mpi_library_version() -> str | None:
    """The MPI library's name and version, e.g. ``Open MPI v5.0.8`` (no communication)."""
    from mpi4py import MPI

    first = MPI.Get_library_version().strip().splitlines()[0]
    return " ".join(first.split(",")[0].split())


class MPICommunicator(Communicator):
    """MPI backend over mpi4py, on a communicator of its own.

    The caller's communicator is duplicated once here (collective over its
    ranks, as the MPI standard advises libraries to do): the library's
    messages and the caller's can never match each other, whatever tags or
    wildcard receives the caller uses.

    Host (numpy) buffers go straight to MPI.  Device (cupy) buffers go
    directly too when MPI is CUDA-aware (after a stream synchronize, since MPI
    does not know cupy's streams); otherwise they are staged through host
    memory, reported once in the log and in ``staging``.

    Args:
        comm: an ``mpi4py.MPI.Comm``; defaults to ``MPI.COMM_WORLD``.
        dup: duplicate ``comm`` (default); False only for a communicator
            the library made itself (``split``).
        cuda_aware: whether MPI takes device buffers directly; None (default)
            asks MPI (``MPIX_Query_cuda_support``), False stages them through
            the host.
    """

    backend = "mpi"
    native = "mpi"  # MPI_Allreduce (NativeMPI)
    devices = ("cpu", "gpu")

    def __init__(self, comm=None, *, dup: bool = True, cuda_aware: bool | None = None):
        from mpi4py import MPI

        self._MPI = MPI
        comm = comm if comm is not None else MPI.COMM_WORLD
        self.comm = comm.Dup() if dup else comm
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self.cuda_aware = _mpi_cuda_aware() if cuda_aware is None else bool(cuda_aware)
        self.staging = False

    # device buffers: direct (CUDA-aware) or staged through the host
    def _tx(self, buf):
        """A buffer MPI can read."""
        if isinstance(buf, np.ndarray):
            return buf
        if self.cuda_aware:
            sys.modules["cupy"].cuda.get_current_stream().synchronize()
            return buf
        self._note_staging()
        return buf.get()

    def _rx(self, buf):
        """(buffer MPI can write, callback to run once the data is in)."""
        if isinstance(buf, np.ndarray):
            return buf, None
        if self.cuda_aware:
            sys.modules["cupy"].cuda.get_current_stream().synchronize()
            return buf, None
        self._note_staging()
        tmp = np.empty(buf.shape, dtype=buf.dtype)
        return tmp, lambda: buf.set(tmp)

    def _like(self, ref, arr):
        """Return ``arr`` (host) in the array module of ``ref``."""
        if isinstance(ref, np.ndarray) or (self.cuda_aware and not isinstance(arr, np.ndarray)):
            return arr
        return sys.modules["cupy"].asarray(arr)

    def _empty(self, ref, shape, dtype):
        if isinstance(ref, np.ndarray) or not self.cuda_aware:
            return np.empty(shape, dtype=dtype)
        return sys.modules["cupy"].empty(shape, dtype=dtype)

    def _note_staging(self):
        if not self.staging:
            self.staging = True
            log.warning("MPI is not CUDA-aware: device buffers are staged through host memory")

    def _send(self, buf, dest, tag):
        self.comm.Send(self._tx(buf), dest, tag)

    def _recv(self, buf, source, tag):
        rb, done = self._rx(buf)
        self.comm.Recv(rb, source, tag)
        if done:
            done()

    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag):
        rb, done = self._rx(recvbuf)
        self.comm.Sendrecv(self._tx(sendbuf), dest, tag, rb, source, tag)
        if done:
            done()

    def _isend(self, buf, dest, tag):
        return self.comm.Isend(self._tx(buf), dest, tag)

    def _irecv(self, buf, source, tag):
        rb, done = self._rx(buf)
        req = self.comm.Irecv(rb, source, tag)
        return (req, done) if done else req

    def _waitall(self, requests):
        reqs = [r[0] if isinstance(r, tuple) else r for r in requests]
        self._MPI.Request.Waitall(reqs)
        for r in requests:
            if isinstance(r, tuple):
                r[1]()

    def _allgather(self, sendbuf):
        sb = self._tx(sendbuf)
        out = self._empty(sb, (self.size,) + sendbuf.shape, sendbuf.dtype)
        self.comm.Allgather(sb, out)
        return self._like(sendbuf, out)

    def _allgather_ints(self, a):
        out = np.empty((self.size, a.size), dtype=np.int64)
        self.comm.Allgather(a, out)
        return out

    def _allgatherv(self, sendbuf, counts):
        sb = self._tx(sendbuf)
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        out = self._empty(sb, int(counts.sum()), sendbuf.dtype)
        self.comm.Allgatherv(sb, [out, counts, displs, self._mpitype(sendbuf)])
        return self._like(sendbuf, out)

    def _alltoall(self, ints):
        out = np.empty_like(ints)
        self.comm.Alltoall(ints, out)
        return out

    def _alltoallv(self, sendbufs, sendcounts, recvcounts):
        ref = sendbufs[0]
        xp = np if isinstance(ref, np.ndarray) else sys.modules["cupy"]
        sbuf = self._tx(xp.concatenate(sendbufs) if len(sendbufs) > 1 else ref)
        sdis = np.zeros_like(sendcounts)
        np.cumsum(sendcounts[:-1], out=sdis[1:])
        rdis = np.zeros_like(recvcounts)
        np.cumsum(recvcounts[:-1], out=rdis[1:])
        rbuf = self._empty(sbuf, int(recvcounts.sum()), ref.dtype)
        t = self._mpitype(ref)
        self.comm.Alltoallv([sbuf, sendcounts, sdis, t], [rbuf, recvcounts, rdis, t])
        rbuf = self._like(ref, rbuf)
        return [rbuf[rdis[j]: rdis[j] + recvcounts[j]] for j in range(self.size)]

    def _allreduce(self, buf, op):
        ops = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}
        sb = self._tx(buf)
        out = self._empty(sb, buf.shape, buf.dtype)
        self.comm.Allreduce(sb, out, ops[op])
        return self._like(buf, out)

    def _bcast(self, buf, root):
        rb, done = self._rx(buf)
        if rb is not buf and self.rank == root:
            rb[...] = buf.get()
        self.comm.Bcast(rb, root)
        if done:
            done()

    def _bcast_obj(self, obj, root):
        return self.comm.bcast(obj, root)

    def _barrier(self):
        self.comm.Barrier()

    def _split(self, color, key):
        return MPICommunicator(self.comm.Split(color, key), dup=False, cuda_aware=self.cuda_aware)

    def idle_barrier(self, poll_s: float = 1e-3) -> None:
        req = self.comm.Ibarrier()
        while not req.Test():
            time.sleep(poll_s)

    def library_version(self) -> str | None:
        return mpi_library_version()

    def _mpitype(self, arr):
        from mpi4py.util.dtlib import from_numpy_dtype

        return from_numpy_dtype(np.dtype(arr.dtype))

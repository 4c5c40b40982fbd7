"""NCCL backend: payloads move GPU to GPU through ``cupy.cuda.nccl``.

Bootstrapped over MPI (rank 0 makes the unique id and broadcasts it), one GPU
per rank (``device = local rank % GPUs``).  Operations NCCL lacks
(allgatherv, alltoallv) are grouped send/recv.  Host (numpy) buffers — the
small control arrays algorithms use for counts — travel over the MPI
communicator underneath, so counts may reach the host but payloads never do.

Streams: every NCCL call is enqueued on cupy's *current* stream, the same
stream the kernels run on, so results are ordered without the caller ever
synchronizing.  Non-blocking isend/irecv are deferred and issued together as
one NCCL group at ``waitall`` (NCCL has no request objects).
"""
from __future__ import annotations

import numpy as np

from ._comm import Communicator, MPICommunicator
from ._validate import _device_flags

__all__ = ["NCCLCommunicator"]


class _Deferred:
    __slots__ = ("kind", "buf", "peer")

    def __init__(self, kind, buf, peer):
        self.kind, self.buf, self.peer = kind, buf, peer


class NCCLCommunicator(Communicator):
    """NCCL for device buffers, MPI for host control data.

    Args:
        mpi: an MPICommunicator (or mpi4py communicator) spanning the same ranks.
        device: CUDA device id; default local rank modulo the visible GPUs.
    """

    backend = "nccl"
    native = "nccl"  # ncclAllReduce (NativeNCCL)
    devices = ("gpu",)

    def __init__(self, mpi=None, device: int | None = None):
        import cupy
        from cupy.cuda import nccl

        self._cp, self._nccl = cupy, nccl
        if mpi is None or not isinstance(mpi, MPICommunicator):
            mpi = MPICommunicator(mpi)
        self.mpi = mpi
        super().__init__(mpi.rank, mpi.size)
        ngpu = cupy.cuda.runtime.getDeviceCount()
        if ngpu == 0:
            raise RuntimeError("NCCLCommunicator: no CUDA device visible")
        if device is None:
            local = mpi.comm.Split_type(mpi._MPI.COMM_TYPE_SHARED).Get_rank()
            device = local % ngpu
        self.device = int(device)
        cupy.cuda.Device(self.device).use()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi.bcast_obj(uid, 0)
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._types = {
            np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
            np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int32): nccl.NCCL_INT32,
            np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8,
        }
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
        self._avg = 4 if nccl.get_version() >= 21000 else None  # ncclAvg
        self._pending: list[_Deferred] = []

    # helpers
    def _dev(self, buf) -> bool:
        return not isinstance(buf, np.ndarray)

    def _t(self, buf):
        return self._types[np.dtype(buf.dtype)]

    @property
    def _stream(self):
        return self._cp.cuda.get_current_stream().ptr

    def _p2p(self, kind, buf, peer):
        if buf.size == 0:
            return
        if kind == "send":
            self.nccl.send(buf.data.ptr, buf.size, self._t(buf), peer, self._stream)
        else:
            self.nccl.recv(buf.data.ptr, buf.size, self._t(buf), peer, self._stream)

    def _group(self, ops):
        self._nccl.groupStart()
        try:
            for kind, buf, peer in ops:
                self._p2p(kind, buf, peer)
        finally:
            self._nccl.groupEnd()

    # point to point
    def _send(self, buf, dest, tag):
        if not self._dev(buf):
            return self.mpi._send(buf, dest, tag)
        self._group([("send", buf, dest)])

    def _recv(self, buf, source, tag):
        if not self._dev(buf):
            return self.mpi._recv(buf, source, tag)
        self._group([("recv", buf, source)])

    def _sendrecv(self, sendbuf, dest, recvbuf, source, tag):
        if not self._dev(sendbuf):
            return self.mpi._sendrecv(sendbuf, dest, recvbuf, source, tag)
        self._group([("send", sendbuf, dest), ("recv", recvbuf, source)])

    def _isend(self, buf, dest, tag):
        return self._defer("send", buf, dest) if self._dev(buf) else self.mpi._isend(buf, dest, tag)

    def _irecv(self, buf, source, tag):
        return self._defer("recv", buf, source) if self._dev(buf) else \
            self.mpi._irecv(buf, source, tag)

    def _defer(self, kind: str, buf, peer) -> _Deferred:
        """A device send/recv kept for the NCCL group that ``waitall`` issues."""
        d = _Deferred(kind, buf, peer)
        self._pending.append(d)
        return d

    def _waitall(self, requests):
        mine = {id(r) for r in requests if isinstance(r, _Deferred)}
        host = [r for r in requests if not isinstance(r, _Deferred)]
        ops = [(d.kind, d.buf, d.peer) for d in self._pending if id(d) in mine]
        self._pending = [d for d in self._pending if id(d) not in mine]
        if ops:
            self._group(ops)
        if host:
            self.mpi._waitall(host)

    # collectives
    def _allgather(self, sendbuf):
        if not self._dev(sendbuf):
            return self.mpi._allgather(sendbuf)
        out = self._cp.empty((self.size,) + sendbuf.shape, dtype=sendbuf.dtype)
        if sendbuf.size:
            self.nccl.allGather(sendbuf.data.ptr, out.data.ptr, sendbuf.size, self._t(sendbuf),
                                self._stream)
        return out

    def _allgatherv(self, sendbuf, counts):
        if not self._dev(sendbuf):
            return self.mpi._allgatherv(sendbuf, counts)
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        out = self._cp.empty(int(counts.sum()), dtype=sendbuf.dtype)
        me = self.rank
        out[displs[me]:displs[me] + counts[me]] = sendbuf
        ops = []
        for j in range(self.size):
            if j != me:
                ops.append(("send", sendbuf, j))
                ops.append(("recv", out[displs[j]:displs[j] + counts[j]], j))
        self._group(ops)
        return out

    def _allgather_ints(self, a):
        return self.mpi._allgather_ints(a)

    def _alltoall(self, ints):
        return self.mpi._alltoall(ints)  # host control data

    def _alltoallv(self, sendbufs, sendcounts, recvcounts):
        if not self._dev(sendbufs[0]):
            return self.mpi._alltoallv(sendbufs, sendcounts, recvcounts)
        me = self.rank
        outs = [self._cp.empty(int(c), dtype=sendbufs[0].dtype) for c in recvcounts]
        outs[me][...] = sendbufs[me]
        ops = []
        for j in range(self.size):
            if j != me:
                ops.append(("send", sendbufs[j], j))
                ops.append(("recv", outs[j], j))
        self._group(ops)
        return outs

    def _allreduce(self, buf, op):
        if not self._dev(buf):
            return self.mpi._allreduce(buf, op)
        out = self._cp.empty_like(buf)
        if buf.size:
            self.nccl.allReduce(buf.data.ptr, out.data.ptr, buf.size, self._t(buf), self._ops[op],
                                self._stream)
        return out

    def mean_inplace(self, x, stream, tag: str = "") -> int:
        """Average the device array ``x`` over the ranks in place, enqueued on
        ``stream`` (a cupy stream; ``ExternalStream`` for another library's),
        nothing read back: ``x`` is first scanned for NaN / Inf into the device
        flags (reported by ``report_nonfinite`` under ``tag``), then
        ncclAllReduce averages it (ncclAvg: each rank scales by 1/P, NCCL sums;
        bitwise identical on every rank).  Counted as the native allreduce;
        returns the bytes this rank sent.  No agreement check: for
        callers that checked ``x``'s layout across ranks once (``validate``)
        and reduce the same layout again in the same order on every rank (the
        DDP hook's buckets).  ``x``: C-contiguous float32 / float64 on this
        communicator's device."""
        _device_flags(self).note(x, tag, stream)
        op = self._ops["sum"] if self._avg is None else self._avg  # ncclAvg: NCCL >= 2.10
        self.nccl.allReduce(x.data.ptr, x.data.ptr, x.size, self._t(x), op, stream.ptr)
        if self._avg is None:
            with stream:
                x *= 1.0 / self.size
        return self._count_allreduce(x.nbytes)

    def _bcast(self, buf, root):
        if not self._dev(buf):
            return self.mpi._bcast(buf, root)
        if buf.size:
            self.nccl.bcast(buf.data.ptr, buf.size, self._t(buf), root, self._stream)

    def _bcast_obj(self, obj, root):
        return self.mpi._bcast_obj(obj, root)

    def _barrier(self):
        self._cp.cuda.get_current_stream().synchronize()
        self.mpi._barrier()

    def _split(self, color, key):
        sub = self.mpi._split(color, key)
        return NCCLCommunicator(sub, device=self.device)

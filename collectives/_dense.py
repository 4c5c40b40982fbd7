"""Dense allreduce: Rabenseifner's algorithm and the native MPI baseline."""
from __future__ import annotations

import kernels

from ._base import ITEM, Algorithm, Prices, ceil_log2, register


def rabenseifner(comm, x, scratch=None):
    """Rabenseifner allreduce of flat ``x``; returns a new array.

    ``scratch(size)``, if given, supplies the receive buffer (a vector of
    x's dtype and device whose contents may be overwritten; see
    ``Algorithm.scratch``); without it one is allocated per call.

    Steps (Thakur, Rabenseifner & Gropp 2005):
      0. Non-power-of-two P: with p2 = 2^floor(log2 P) and r = P - p2, each
         even rank i < 2r sends its vector to i+1 and sits out; the p2
         remaining ranks continue.
      1. Reduce-scatter by recursive halving: log2(p2) rounds, exchanging
         half of the current range with the partner at distance p2/2, p2/4...
      2. Allgather by recursive doubling: the mirror image.
      3. Ranks that sat out receive the result from their partner.

    Cost: 2 log2(p2) alpha + 2 n (p2-1)/p2 beta (+ 2 n beta when P != p2).
    Works for any n: blocks are near-equal and may be empty (n < P).
    Each block's sum is computed by exactly one rank and then copied, so the
    output is bitwise identical on all ranks.
    """
    P, rank = comm.size, comm.rank
    buf = x.copy()
    if P == 1:
        return buf
    xp = kernels.array_module(x)
    n = x.size
    p2 = 1 << (P.bit_length() - 1)
    r = P - p2

    def tmp_buffer():
        return scratch(n) if scratch is not None else xp.empty_like(buf)

    def actual(newrank: int) -> int:
        return 2 * newrank + 1 if newrank < r else newrank + r

    with comm.phase("comm:fold"):
        if rank < 2 * r:
            if rank % 2 == 0:
                comm.send(buf, rank + 1, tag=11)
                newrank = -1
            else:
                tmp = tmp_buffer()
                comm.recv(tmp, rank - 1, tag=11)
                buf += tmp
                newrank = rank // 2
        else:
            newrank = rank - r

    if newrank >= 0:
        bounds = kernels.region_bounds(n, p2)
        tmp = tmp_buffer()
        lo, hi = 0, p2
        d = p2 >> 1
        with comm.phase("comm:reduce-scatter"):
            while d >= 1:
                partner = actual(newrank ^ d)
                mid = (lo + hi) // 2
                if newrank & d:
                    keep, give = (mid, hi), (lo, mid)
                else:
                    keep, give = (lo, mid), (mid, hi)
                ka, kb = bounds[keep[0]], bounds[keep[1]]
                ga, gb = bounds[give[0]], bounds[give[1]]
                comm.sendrecv(buf[ga:gb], partner, tmp[ka:kb], partner, tag=12)
                buf[ka:kb] += tmp[ka:kb]
                lo, hi = keep
                d >>= 1
        with comm.phase("comm:allgather"):
            d = 1
            while d < p2:
                partner = actual(newrank ^ d)
                # partner's range is my range's sibling of the same size
                size = hi - lo
                plo = lo + size if (newrank & d) == 0 else lo - size
                phi = plo + size
                comm.sendrecv(buf[bounds[lo]:bounds[hi]], partner,
                              buf[bounds[plo]:bounds[phi]], partner, tag=13)
                lo, hi = min(lo, plo), max(hi, phi)
                d <<= 1

    with comm.phase("comm:unfold"):
        if rank < 2 * r:
            if rank % 2 == 1:
                comm.send(buf, rank - 1, tag=14)
            else:
                comm.recv(buf, rank + 1, tag=14)
    return buf


@register
class Dense(Algorithm):
    """Exact dense allreduce by Rabenseifner's algorithm (any P, any n)."""

    name = "dense"

    def _call(self, x, *, name, density, **kw):
        return rabenseifner(self.comm, x, lambda size: self.scratch(x, size))

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        if P == 1:
            return 0
        p2 = 1 << (P.bit_length() - 1)
        # reduce-scatter + allgather: 2 n (p2-1)/p2 (blocks may be uneven by one
        # element per round); fold/unfold: n each way when P is not a power of 2
        rounds = p2.bit_length() - 1
        words = 2 * (n * (p2 - 1) // p2 + rounds) + (n if P != p2 else 0)
        return words * itemsize

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        if P == 1:
            return 0.0
        p2 = 1 << (P.bit_length() - 1)
        lg = ceil_log2(p2)
        # recursive halving then doubling: step s moves n/2^s elements each way,
        # among the p2 ranks of the power of two
        t = 2 * sum(prices.t_p2p(n * ITEM / (1 << s), p2) for s in range(1, lg + 1))
        # elementwise sums of the reduce-scatter: a + b -> a, 3 streams per element
        # (not prices.reduce, the sparse COO merge: sort-based, ~10x dearer per entry),
        # made by the p2 ranks while the extra ones wait; step s sums n/2^s elements,
        # at the rate of vectors that size (the halves soon fit in a cache)
        t += sum(prices.dense_passes(n / (1 << s), 3, p2) for s in range(1, lg + 1))
        if P != p2:  # the P - p2 extra ranks fold in, then get the result: one way each
            t += 2 * prices.t_p2p(n * ITEM, P - p2) + prices.dense_passes(n, 3, P - p2)
        return t


@register
class NativeMPI(Algorithm):
    """The vendor's MPI_Allreduce: the baseline CPU users would otherwise call.

    On an NCCL communicator this still goes through MPI (device buffers
    directly if MPI is CUDA-aware, else staged through the host).
    """

    name = "mpi"

    def _call(self, x, *, name, density, **kw):
        comm = getattr(self.comm, "mpi", self.comm)
        with self.comm.phase("comm:allreduce"), comm.capture() as inner:
            out = comm.allreduce(x, "sum")
            if comm is not self.comm:  # account it on the communicator the caller reads
                moved = inner.total()
                self.comm._count(moved.bytes_sent, moved.bytes_recv, moved.msgs_sent, moved.msgs_recv)
            return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        return -(-2 * n * itemsize * (P - 1) // P) if P > 1 else 0

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        # NativeNCCL inherits it: the profile prices its own backend's allreduce
        return prices.t_allreduce(n * ITEM, P) if P > 1 else 0.0


@register
class NativeNCCL(NativeMPI):
    """ncclAllReduce: the baseline GPU users would otherwise call (NCCL backend only)."""

    name = "nccl"
    backends = ("nccl",)

    def _call(self, x, *, name, density, **kw):
        with self.comm.phase("comm:allreduce"):
            return self.comm.allreduce(x, "sum")

"""TopKA2A: local top-k, one all-to-all of sparse shards, owners reduce, allgather back."""
from __future__ import annotations

import numpy as np

import kernels

from ._base import Prices, SparseAllreduce, register
from ._tree import TopkDSA

__all__ = ["TopKA2A"]

_CTRL = 8  # bytes of one int64 count


def _pack_region(idx, vals, lo: int, hi: int, xp):
    """One byte buffer holding a COO set inside [lo, hi), in its cheaper form.

    Dense (the hi-lo values) when that is no larger than sparse (values then
    indices), else sparse.  A dense buffer is exactly (hi-lo) * itemsize bytes
    and a sparse one always fewer, so the receiver tells them apart by size.
    """
    L = hi - lo
    item = vals.dtype.itemsize
    if L > 0 and idx.size * (item + idx.dtype.itemsize) >= L * item:
        dense = xp.zeros(L, dtype=vals.dtype)
        dense[idx - lo] = vals
        return dense.view(xp.uint8)
    if idx.size == 0:
        return xp.empty(0, dtype=xp.uint8)
    return xp.concatenate([vals.view(xp.uint8), idx.view(xp.uint8)])


def _unpack_region(buf, lo: int, hi: int, val_dtype, idx_dtype, xp):
    """Inverse of ``_pack_region``: (indices, values) with global indices."""
    L = hi - lo
    item = np.dtype(val_dtype).itemsize
    if L > 0 and buf.size == L * item:
        dense = buf.copy().view(val_dtype)      # copy: aligned whatever the offset
        nz = xp.flatnonzero(dense)
        return (nz + lo).astype(idx_dtype), dense[nz]
    m = buf.size // (item + np.dtype(idx_dtype).itemsize)
    vals = buf[:m * item].copy().view(val_dtype)
    idx = buf[m * item:].copy().view(idx_dtype)
    return idx, vals


@register
class TopKA2A(SparseAllreduce):
    """TopKA2A (Peng et al., ICPP'24): sparse reduce-scatter by one alltoallv.

    Steps:
      1. Exact local top-k (these values leave the residual: every one of
         them reaches the output).
      2. The index space is cut into P equal regions; region j's entries go
         to rank j in ONE alltoallv of byte buffers (values and indices
         packed together; a region is sent dense instead when that is no
         larger).  One collective instead of TopkDSA's two.
      3. Each owner sums its region (deterministic COO merge).
      4. The reduced regions are allgathered (allgatherv), each in its
         cheaper form, and every rank assembles the identical output.

    Cost: (P + log P) alpha (alltoallv + allgatherv; plus two small count
    exchanges) + [4k(P-1)/P, 2k(P-1)/P + 2k(P-1)] beta: the reduce-scatter
    moves ~2k(P-1)/P words; the allgather moves each region's union of
    indices, k/P (ranks agree on positions) to k (disjoint) per region.
    The owner of a region where everyone's values fall receives up to
    (P-1) k entries; ``traffic_bound`` is that honest worst case.

    Tuning: best at small P or when the ranks' top-k positions overlap
    (the union stays near k); at large P with little overlap the allgather
    term grows like TopkA's and Ok-Topk's balanced phases win.
    """

    name = "topka2a"

    def _exchange(self, acc, st, x):
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        idx, vals, bounds, xp = self._take_regions(acc, st, x)
        n = acc.size
        with comm.phase("select"):
            offs = kernels.split_by_bounds(idx, bounds)
            shards = [_pack_region(idx[offs[j]:offs[j + 1]], vals[offs[j]:offs[j + 1]],
                                   bounds[j], bounds[j + 1], xp) for j in range(P)]
        with comm.phase("comm:alltoallv"):
            got = comm.alltoallv(shards)
        lo, hi = bounds[rank], bounds[rank + 1]
        with comm.phase("reduce"):
            parts = [_unpack_region(b, lo, hi, acc.dtype, idx.dtype, xp) for b in got]
            ri, rv = kernels.coo_sum([p[0] for p in parts], [p[1] for p in parts], n)
            mine = _pack_region(ri, rv, lo, hi, xp)
        with comm.phase("comm:allgather"):
            allb, counts = comm.allgatherv(mine)
        with comm.phase("reduce"):
            out = xp.zeros(n, dtype=acc.dtype)
            off, total = 0, 0
            for j in range(P):
                c = int(counts[j])
                gi, gv = _unpack_region(allb[off:off + c], bounds[j], bounds[j + 1],
                                        acc.dtype, idx.dtype, xp)
                out[gi] = gv
                total += int(gi.size)
                off += c
        st.selected_global = total
        return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        """Bytes per rank per direction, at most (e = bytes of a value + index,
        L = the longest region, ceil(n/P)):
          sent <= k e (its top-k, each region in the cheaper form)
                  + (P-1) min(P k e, L itemsize)   (its reduced region, P-1 times)
          recv <= (P-1) min(k e, L itemsize)       (a hot region's owner)
                  + min(P k e, (P-1) L itemsize)   (the other reduced regions)
        plus 16(P-1) bytes of counts (alltoallv, allgatherv).
        """
        if P == 1:
            return 0
        e = itemsize + (4 if n < 2**31 else 8)
        L = -(-n // P)
        sent = k * e + (P - 1) * min(P * k * e, L * itemsize)
        recv = (P - 1) * min(k * e, L * itemsize) + min(P * k * e, (P - 1) * L * itemsize)
        return max(sent, recv) + 2 * _CTRL * (P - 1)

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        """TopkDSA's terms: the same alltoall of top-k shards, owner reduce and
        allgather of the reduced regions (one message each way instead of two)."""
        return TopkDSA.cost(prices, n, P, k)

"""Tree- and region-based sparse allreduces: gTopk and TopkDSA (SparCML)."""
from __future__ import annotations

import math

import numpy as np

import kernels

from ._base import ITEM, Prices, SparseAllreduce, ceil_log2, register, union_size

_CTRL = 8  # bytes of one int64 count


def _send_coo(comm, idx, vals, dest, tag):
    comm.send(np.array([idx.size], dtype=np.int64), dest, tag)
    if idx.size:
        comm.send(idx, dest, tag + 1)
        comm.send(vals, dest, tag + 2)


def _recv_coo(comm, source, tag, idx_dtype, val_dtype, xp):
    cnt = np.empty(1, dtype=np.int64)
    comm.recv(cnt, source, tag)
    m = int(cnt[0])
    idx = xp.empty(m, dtype=idx_dtype)
    vals = xp.empty(m, dtype=val_dtype)
    if m:
        comm.recv(idx, source, tag + 1)
        comm.recv(vals, source, tag + 2)
    return idx, vals


def _bcast_coo(comm, idx, vals, xp):
    cnt = np.array([idx.size if comm.rank == 0 else 0], dtype=np.int64)
    comm.bcast(cnt, 0)
    m = int(cnt[0])
    if comm.rank != 0:
        idx = xp.empty(m, dtype=idx.dtype)
        vals = xp.empty(m, dtype=vals.dtype)
    if m:
        comm.bcast(idx, 0)
        comm.bcast(vals, 0)
    return idx, vals


@register
class GTopk(SparseAllreduce):
    """gTopk (Shi et al., ICDCS'19): global top-k by pairwise merging, any P.

    Steps:
      1. Each rank selects its exact local top-k (these values leave its residual).
      2. ceil(log2 P) rounds; in round r (d = 2^r) rank i with i mod 2d == d
         sends its current set to i-d, which sums the two sets and keeps the
         top-k.  Works for any P: a rank without a partner in a round waits.
      3. Rank 0 broadcasts the global set (binomial tree).

    No mass is lost: the partial sums a merging rank drops are added to that
    rank's own residual, so they are sent again in a later iteration.

    Cost: 2 ceil(log2 P) alpha + 2k ceil(log2 P) beta per direction per rank
    (Table 1 counts both directions: 4k log P).
    """

    name = "gtopk"

    def _exchange(self, acc, st, x):
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        xp = kernels.array_module(acc)
        k = st.k
        idx, vals = self._take_topk(acc, st, x)
        d = 1
        while d < P:
            if rank % (2 * d) == d:
                with comm.phase("comm:tree"):
                    _send_coo(comm, idx, vals, rank - d, tag=20)
                break
            if rank + d < P:
                with comm.phase("comm:tree"):
                    ri, rv = _recv_coo(comm, rank + d, 20, idx.dtype, vals.dtype, xp)
                with comm.phase("reduce"):
                    idx, vals = kernels.coo_sum([idx, ri], [vals, rv])
                    if idx.size > k:
                        keep = kernels.topk_indices(vals, k)
                        mask = xp.ones(idx.size, dtype=bool)
                        mask[keep] = False
                        kernels.scatter_add(acc, idx[mask], vals[mask])  # dropped: keep in residual
                        idx, vals = idx[keep], vals[keep]
            d <<= 1
        with comm.phase("comm:bcast"):
            idx, vals = _bcast_coo(comm, idx, vals, xp)
        st.selected_global = int(idx.size)
        with comm.phase("reduce"):
            return kernels.to_dense(idx, vals, acc.size)

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        return rounds * (2 * k * itemsize + _CTRL)

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        merge = prices.reduce(2 * k) + prices.topk(2 * k)
        # round j: the ranks r = 2^j mod 2^(j+1) send (fewer each round)
        rounds = sum(prices.t_p2p(2 * k * ITEM, len(range(1 << j, P, 2 << j))) + merge
                     for j in range(ceil_log2(P)))
        return (prices.dense_passes(n) + prices.topk(n) + rounds
                + prices.t_bcast(2 * k * ITEM, P) + prices.reduce(k))


def _encode_region(idx, vals, lo: int, hi: int, xp):
    """The cheaper wire form of a COO set inside [lo, hi): sparse (idx, vals)
    or dense (empty idx, hi-lo values)."""
    L = hi - lo
    if L > 0 and 2 * idx.size >= L:
        dense = xp.zeros(L, dtype=vals.dtype)
        dense[idx - lo] = vals
        return idx[:0], dense
    return idx, vals


@register
class TopkDSA(SparseAllreduce):
    """TopkDSA, SparCML's dynamic sparse allreduce (Renggli et al., SC'19).

    Steps:
      1. Exact local top-k; the index space is cut into P equal regions.
      2. Sparse reduce-scatter: region j's entries go to rank j (alltoallv),
         each sent dense instead when that is smaller (2 nnz >= length).
      3. Owners sum their region; the result is allgathered (allgatherv),
         again in whichever form is smaller.

    Cost (Table 1): (P + 2 log P) alpha + [4k(P-1)/P, 2k + n(P-1)/P] beta.
    The upper end bounds what a rank sends; the owner of a region where all
    ranks' values fall can receive up to (P-1) min(2k, n/P) more in step 2.
    """

    name = "topkdsa"

    def _exchange(self, acc, st, x):
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        idx, vals, bounds, xp = self._take_regions(acc, st, x)
        n = acc.size
        offs = kernels.split_by_bounds(idx, bounds)
        send_i, send_v = [], []
        for j in range(P):
            a, b = offs[j], offs[j + 1]
            ei, ev = _encode_region(idx[a:b], vals[a:b], bounds[j], bounds[j + 1], xp)
            send_i.append(ei)
            send_v.append(ev)
        with comm.phase("comm:reduce-scatter"):
            ri = comm.alltoallv(send_i)
            rv = comm.alltoallv(send_v)
        lo, hi = bounds[rank], bounds[rank + 1]
        with comm.phase("reduce"):
            if any(i.size == 0 and v.size == hi - lo and v.size > 0 for i, v in zip(ri, rv)):
                region = xp.zeros(hi - lo, dtype=acc.dtype)
                for i, v in zip(ri, rv):
                    if i.size == 0 and v.size:
                        region += v
                    else:
                        kernels.scatter_add(region, i - lo, v)
                ridx = (xp.flatnonzero(region) + lo).astype(idx.dtype)
                mi, mv = ridx, region[ridx - lo]
            else:
                mi, mv = kernels.coo_sum(list(ri), list(rv), n)
            mi, mv = _encode_region(mi, mv, lo, hi, xp)
        with comm.phase("comm:allgather"):
            gi, ci = comm.allgatherv(mi)
            gv, cv = comm.allgatherv(mv)
        with comm.phase("reduce"):
            out = xp.zeros(n, dtype=acc.dtype)
            oi = ov = 0
            total = 0
            for j in range(P):
                ni, nv = int(ci[j]), int(cv[j])
                if ni == 0 and nv > 0:
                    out[bounds[j]:bounds[j + 1]] = gv[ov:ov + nv]
                else:
                    out[gi[oi:oi + ni]] = gv[ov:ov + nv]
                total += nv
                oi += ni
                ov += nv
        st.selected_global = total
        return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        if P == 1:
            return 0
        region = -(-n // P)
        payload = (P - 1) * min(2 * k, region) + max(2 * k, (P - 1) * region)
        control = 4 * _CTRL * (P - 1)
        return payload * itemsize + control

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        u = union_size(n, k, P)
        per_peer = min(2 * k / P, n / P) * ITEM
        region = min(2 * u / P, n / P) * ITEM
        return (prices.dense_passes(n) + prices.topk(n) + prices.t_alltoall(per_peer, P)
                + prices.reduce(k) + prices.t_allgather(region, P) + prices.reduce(u))

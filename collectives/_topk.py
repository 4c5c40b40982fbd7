"""Allgather-based sparse allreduces: TopkA and Gaussiank."""
from __future__ import annotations

import numpy as np

import kernels

from ._base import ITEM, Prices, SparseAllreduce, SparseState, register


def allgather_coo(comm, idx, vals, n: int, *, equal_counts: bool):
    """Allgather every rank's COO set and sum them into a dense vector.

    Identical on all ranks: every rank scatter-adds the same gathered arrays
    in the same (rank) order.  ``idx``: sorted (as the selections return them).
    """
    xp = kernels.array_module(vals)
    with comm.phase("comm:allgather"):
        if equal_counts:
            gi = comm.allgather(idx).reshape(-1)
            gv = comm.allgather(vals).reshape(-1)
            counts = [idx.size] * comm.size
        else:
            gi, counts = comm.allgatherv(idx)
            gv, _ = comm.allgatherv(vals, counts)
    with comm.phase("reduce"):
        out = xp.zeros(n, dtype=vals.dtype)
        # every rank's indices are sorted (the selections'): added run by run, rank order
        kernels.scatter_add(out, gi, gv, runs=np.concatenate([[0], np.cumsum(counts)]).tolist())
    return out


@register
class TopkA(SparseAllreduce):
    """TopkA: exact local top-k, allgather of (index, value), sum.

    Cost (paper Table 1): log P alpha + 2k(P-1) beta.  Simple and fast at
    small P; the volume grows linearly in P.
    """

    name = "topka"

    def _exchange(self, acc, st, x):
        comm = self.comm
        idx, vals = self._take_topk(acc, st, x)
        out = allgather_coo(comm, idx, vals, acc.size, equal_counts=True)
        st.selected_global = st.selected_local * comm.size
        return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        return 2 * k * (P - 1) * itemsize

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        return (prices.dense_passes(n) + prices.topk(n) + prices.t_allgather(2 * k * ITEM, P)
                + prices.reduce(k * P))


class GaussianKState(SparseState):
    """Gaussiank's per-tensor state: ``SparseState`` plus, under statistics,
    local_threshold (the threshold the Gaussian fit gave at the last call)."""

    __slots__ = ("local_threshold",)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.local_threshold: float | None = None


@register
class GaussianK(SparseAllreduce):
    """Gaussiank (Shi et al.): threshold from a Gaussian fit, corrected toward k.

    Selection costs a few O(n) passes instead of a partition; counts then
    differ across ranks, so the exchange is an allgatherv.  The selection is
    capped at k so the volume stays within Table 1's 2k(P-1).
    """

    name = "gaussiank"
    state_class = GaussianKState

    def _exchange(self, acc, st, x):
        comm = self.comm
        kernels.add_into(acc, x)
        with comm.phase("select"):
            idx, vals, thr = kernels.gaussian_select(acc, st.k, st.density,
                                                    work=self.kernel_work(acc))
            kernels.zero_at(acc, idx)
        st.local_threshold = thr
        st.selected_local = int(idx.size)
        out = allgather_coo(comm, idx, vals, acc.size, equal_counts=False)
        return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        # payload 2k(P-1) words + the counts exchange (P-1 int64)
        return 2 * k * (P - 1) * itemsize + 8 * (P - 1)

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        # mean/std + up to a few counting passes + the final selection
        return (prices.dense_passes(n) + 4 * prices.threshold(n)
                + prices.t_allgather(2 * k * ITEM, P) + prices.reduce(k * P))

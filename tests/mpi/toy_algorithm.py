"""A plug-in algorithm, defined and registered outside collectives: "toy".

It shows (tests/test_registry.py) that one module is all a new algorithm
needs: once imported, the conformance suite (``--plugin tests.mpi.toy_algorithm``),
the cost model, the selector and ``autotune bench`` all reach it.

Every rank allgathers every rank's vector and sums the blocks in rank order:
exact up to rounding, and bitwise identical on every rank since every rank
adds the same arrays in the same order.  O(nP) traffic: a test, not a contender.
"""
from __future__ import annotations

from collectives import ITEM, Algorithm, Prices, register

__all__ = ["Toy"]


@register
class Toy(Algorithm):
    """Allgather, then sum in rank order (exact; host or device arrays)."""

    name = "toy"
    lossy = False
    backends = ("mpi",)

    def _call(self, x, *, name, density, **kw):
        with self.comm.phase("comm:allgather"):
            blocks = self.comm.allgather(x)
        with self.comm.phase("reduce"):
            out = blocks[0].copy()
            for b in blocks[1:]:
                out += b
        return out

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        return n * itemsize * (P - 1)  # its vector to, and every other one from, P-1 ranks

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        if P == 1:
            return 0.0
        # P-1 sums a + b -> a of 3 streams each
        return prices.t_allgather(n * ITEM, P) + prices.dense_passes(n, 3 * (P - 1))

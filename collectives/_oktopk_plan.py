"""Ok-Topk's host-side planning and wire helpers (see ``_oktopk.OkTopk``).

Quota apportioning, block balancing, the per-call volume plan and budget,
the exact distributed k-th-magnitude search, and the windowed point-to-point
transfers.  The planning helpers are pure functions of host ints (every rank
computes the same), so the unit tests exercise them without MPI.
"""
from __future__ import annotations

import math

import numpy as np

import kernels

_CTRL = 8           # bytes of one int64 count
_RADIX_BITS = 4     # bits resolved per round of the global k-th magnitude search
_QUOTA = 1.0        # the reduce step's quota Q, in units of the fair share k(P-1)/P
_QUOTA_BOUND = 5 / 4  # the Q that OkTopk.traffic_bound allows for (>= _QUOTA; see _budgets)


# -- host-side planning (pure, deterministic: every rank computes the same) ----
def _apportion(counts, total: int) -> np.ndarray:
    """Cut ``counts`` down to ``total`` in proportion (largest remainder).

    Returns ``q`` with ``0 <= q <= counts`` and ``q.sum() == min(total, counts.sum())``.
    Remainders go to the largest fractional parts, ties to the lowest rank, so
    the result is a pure function of its inputs (all ranks agree).
    """
    c = np.asarray(counts, dtype=np.int64)
    s = int(c.sum())
    if s <= total:
        return c.copy()
    if total <= 0:
        return np.zeros_like(c)
    num = c * np.int64(total)          # < 2^62: counts and totals stay below 2^31
    q = num // s
    frac = num % s
    rem = int(total - q.sum())
    if rem:
        order = np.lexsort((np.arange(c.size), -frac))
        q[order[:rem]] += 1
    return q


def _blocks(total: int, q) -> np.ndarray:
    """Equal blocks of ``total`` entries over ranks; the ``total % P`` extra
    entries go to the ranks already holding most (fewest moves), ties to the
    lowest rank."""
    q = np.asarray(q, dtype=np.int64)
    P = q.size
    b = np.full(P, total // P, dtype=np.int64)
    rem = total % P
    if rem:
        order = np.lexsort((np.arange(P), -q))
        b[order[:rem]] += 1
    return b


def _balance_plan(q, b) -> list[tuple[int, int, int]]:
    """Moves (src, dst, count) turning holdings ``q`` into ``b`` (same sum).

    Ranks over their block send their surplus to ranks under theirs, both
    taken in rank order: each rank sends max(0, q-b) and receives
    max(0, b-q) entries, the least any repacking can move.
    """
    q = np.asarray(q, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    sur = [(r, int(q[r] - b[r])) for r in range(q.size) if q[r] > b[r]]
    dfc = [(r, int(b[r] - q[r])) for r in range(q.size) if b[r] > q[r]]
    plan, i, j = [], 0, 0
    while i < len(sur) and j < len(dfc):
        (s, a), (d, c) = sur[i], dfc[j]
        m = min(a, c)
        plan.append((s, d, m))
        sur[i], dfc[j] = (s, a - m), (d, c - m)
        if a == m:
            i += 1
        if c == m:
            j += 1
    return plan


def _phase2_volume(G: int, g, S, R, P: int):
    """Entries each rank sends / receives over the whole call if the global
    result keeps ``G`` entries: reduce (S, R) + balance + allgatherv."""
    q = _apportion(g, G)
    b = _blocks(G, q)
    sent = S + np.maximum(q - b, 0) + b * (P - 1)
    recv = R + np.maximum(b - q, 0) + (G - b)
    return sent, recv, q, b


def _fit_global(g, S, R, budget: int, G_max: int, P: int) -> int:
    """Largest G <= G_max whose total per-rank volume fits ``budget`` entries.

    Binary search over G; only checked-feasible values are ever returned
    (G = 0 is feasible because the reduce quotas are below the budget).
    """
    g = np.asarray(g, dtype=np.int64)
    S = np.asarray(S, dtype=np.int64)
    R = np.asarray(R, dtype=np.int64)
    hi = min(int(G_max), int(g.sum()))
    if P == 1:
        return hi

    def fits(G):
        sent, recv, _, _ = _phase2_volume(G, g, S, R, P)
        return bool((sent <= budget).all() and (recv <= budget).all())

    if fits(hi):
        return hi
    lo = 0                       # feasible
    while hi - lo > 1:           # hi infeasible
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _budgets(P: int, k: int, quota: float = _QUOTA) -> tuple[int, int]:
    """(Q, B): the reduce-step quota and the whole call's budget, in entries
    (one entry = one value + one index), per rank and per direction.

    Q = ``quota`` x the fair share k(P-1)/P (at least 1).
    B = floor(3k(P-1)/P) entries = 6k(P-1)/P words, Table 1's upper end;
    raised to Q + P when k is below about P, so that one entry can still be
    allgathered (its holder sends it P-1 times) after a full reduce step.
    ``OkTopk.traffic_bound`` takes B at ``_QUOTA_BOUND``, which is never
    below the B the algorithm plans with.
    """
    if P == 1:
        return 0, 0
    share = k * (P - 1) / P
    Q = max(1, int(math.floor(quota * share)))
    B = max(int(3 * k * (P - 1) // P), Q + P)
    return Q, B


def _radix_rounds(itemsize: int) -> int:
    return -(-(8 * itemsize - 1) // _RADIX_BITS)


def _global_kth(comm, mags, k: int) -> float:
    """Exact k-th largest value of the union of every rank's ``mags``.

    ``mags`` are this rank's non-negative, non-zero floats (its reduced
    region).  Radix select on the bit patterns, which order non-negative
    IEEE floats like the floats themselves: each round every rank counts its
    surviving candidates per 4-bit digit, one allreduce of 16 int64 sums
    the histograms, and all ranks step into the digit holding the k-th
    largest.  ceil(31/4) = 8 rounds for float32 (16 for float64), each
    ~2*128 (P-1)/P bytes per rank: about 2 KiB per refresh, independent of
    k and n.  Integer counts make the result identical on every rank.
    If fewer than k values exist it returns the smallest (select all);
    with none at all, 0.0.  float32 on a GPU: each round's histogram is one
    kernel over all of ``mags`` that counts only the keys under the prefix
    found so far (``kernels.key_histogram``), instead of a bincount and a
    compaction of the survivors (the same counts, so the same result).
    """
    xp = kernels.array_module(mags)
    itype = np.int32 if mags.dtype.itemsize == 4 else np.int64
    nbits = 8 * mags.dtype.itemsize - 1
    device = kernels.is_device_array(mags) and mags.dtype == np.float32
    cand = None if device else mags.view(itype)  # the survivors (host path)
    prefix, shift, kk = 0, nbits, None
    while shift > 0:
        s = min(_RADIX_BITS, shift)
        shift -= s
        if device:
            local = (kernels.key_histogram(mags, prefix << (shift + s), shift, s) if mags.size
                     else np.zeros(1 << s, np.int64))
        else:
            digit = (cand >> shift) & ((1 << s) - 1)
            local = (xp.bincount(digit, minlength=1 << s) if digit.size
                     else xp.zeros(1 << s, np.int64))
        local = np.ascontiguousarray(
            local.get() if hasattr(local, "get") else local, dtype=np.int64)
        tot = comm.allreduce(local, "sum") if comm.size > 1 else local
        if kk is None:
            kk = min(int(k), int(tot.sum()))
            if kk == 0:
                return 0.0
        cum = np.cumsum(tot[::-1])
        i = int(np.searchsorted(cum, kk))      # first cum >= kk
        d = (1 << s) - 1 - i
        kk -= int(cum[i] - tot[d])             # those strictly above digit d
        prefix = (prefix << s) | d
        if not device:
            cand = cand[digit == d]
    return float(np.array([prefix], dtype=itype).view(mags.dtype)[0])


def _magnitude_select(x, threshold: float, work=None):
    """COO of |x| >= threshold, never selecting zeros (threshold 0 = all non-zeros)."""
    xp = kernels.array_module(x)
    if threshold > 0:
        return kernels.threshold_select(x, threshold, work=work)
    idx = xp.flatnonzero(x).astype(kernels.index_dtype(x.size), copy=False)
    return idx, x[idx]


def _without(xp, a, lo: int, hi: int):
    """``a`` less the slice [lo, hi): a view when that slice is at either end."""
    if lo == 0:
        return a[hi:]
    if hi == a.size:
        return a[:lo]
    return xp.concatenate([a[:lo], a[hi:]])


def _windowed(comm, groups, window: int):
    """Run groups of (kind, peer, buf, tag) transfers, ``window`` groups at a time.

    Each rank's list must follow one order shared by all ranks: in the
    reduce step group i is rotation step i on every rank (a transfer sits in
    the same group on both of its sides); in the balance step each rank's
    moves are a subsequence of the shared plan.  Then the earliest
    unfinished transfer is always posted on both sides, so waiting on a
    window never deadlocks, whatever the MPI protocol (eager or rendezvous).
    At most ``window`` groups are in flight.
    """
    for a in range(0, len(groups), window):
        reqs = []
        for group in groups[a:a + window]:
            for kind, peer, buf, tag in group:
                if kind == "send":
                    reqs.append(comm.isend(buf, peer, tag))
                else:
                    reqs.append(comm.irecv(buf, peer, tag))
        comm.waitall(reqs)

"""Ok-Topk: near-optimal sparse allreduce (Li & Hoefler, PPoPP'22, Algorithm 1).

The module holds the algorithm (``OkTopk``) and the small host-side planning
helpers it needs (quota apportioning, block balancing, the exact distributed
k-th-magnitude search).  The helpers are pure functions of host ints, so the
unit tests exercise them without MPI.
"""
from __future__ import annotations

import math

import numpy as np

import kernels

from ._base import SparseAllreduce, register

__all__ = ["OkTopk"]

_CTRL = 8          # bytes of one int64 count
_RADIX_BITS = 4    # bits resolved per round of the global k-th magnitude search
_REDUCE_CAP = 5 / 4  # largest reduce-step quota Q, in units of the fair share k(P-1)/P
_TAG_REDUCE = 40
_TAG_BALANCE = 50
_RESIDUAL_RULES = ("contributor", "owner")


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


def _budgets(P: int, k: int, reduce_cap: float = _REDUCE_CAP) -> tuple[int, int]:
    """(Q, B): the reduce-step quota and the whole call's budget, in entries
    (one entry = one value + one index), per rank and per direction.

    B = floor(3k(P-1)/P) entries = 6k(P-1)/P words, Table 1's upper end;
    raised to Q + P when k is below about P, so that one entry can still be
    allgathered (its holder sends it P-1 times) after a full reduce step.
    """
    if P == 1:
        return 0, 0
    share = k * (P - 1) / P
    Q = max(1, int(math.floor(reduce_cap * share)))
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
    with none at all, 0.0.
    """
    xp = kernels.array_module(mags)
    itype = np.int32 if mags.dtype.itemsize == 4 else np.int64
    nbits = 8 * mags.dtype.itemsize - 1
    cand = mags.view(itype)
    prefix, shift, kk = 0, nbits, None
    while shift > 0:
        s = min(_RADIX_BITS, shift)
        shift -= s
        digit = (cand >> shift) & ((1 << s) - 1)
        local = xp.bincount(digit, minlength=1 << s) if digit.size else xp.zeros(1 << s, np.int64)
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


@register
class OkTopk(SparseAllreduce):
    """Ok-Topk (Li & Hoefler, PPoPP'22): O(k) sparse allreduce with error feedback.

    Every rank selects its local top-k (by a threshold), the index space is
    cut into P regions holding about the same number of selected values, the
    owner of each region sums what falls into it, and the global top-k of the
    sums (by a global threshold) is repacked into equal blocks and
    allgathered.  Thresholds are computed exactly only every ``tau_prime``
    calls and reused in between; region boundaries every ``tau`` calls.

    Steps of one call (P ranks, n entries, k = round(density n)):
      1. Local selection: ``|acc| >= local_threshold``: the exact k-th
         magnitude at refresh calls, else the previous threshold, rescaled
         when the count left the band [lo k, hi k] (see ``_nudge``).  The
         candidates are capped at ``local_cap`` k by magnitude, so a reused
         threshold that lets too much through still sends the exact local
         top-k (the cap's partition runs over the candidates only, not n).
      2. Boundaries (at the first call, every ``tau`` calls, and after a call
         whose reduce load was out of balance by more than ``rebalance``):
         each rank proposes the P-1 quantiles of its selected indices; one
         allreduce of P int64 gives their count-weighted mean, so all ranks
         cut identically and each region holds ~1/P of the selected values,
         wherever they cluster (not equal lengths).  The imbalance test uses
         the counts every rank already has from step 5: no extra message.
      3. Split and reduce: region j's values go to rank j with rotating
         partners (step i: send to rank+i, receive from rank-i), ``window``
         partners in flight.  Counts first (one alltoall); a rank sends at
         most Q = ``reduce_cap`` k(P-1)/P entries (its largest; default the
         fair share itself) and an owner accepts at most Q (it apportions
         quotas, returned by a second alltoall), so a region that draws
         everyone's values (stale boundaries) cannot overload its owner.
         Values not sent stay in the residual.
      4. Global selection: ``|sum| >= global_threshold`` on each owner's
         region.  At refresh calls the threshold is the exact k-th largest
         |sum| over all regions, found by a distributed radix select (8
         allreduces of 16 counts for float32, ~2 KiB, independent of k).
      5. Balance and allgatherv: one allgather of (global count, reduce sent,
         reduce received) per rank fixes the number G <= k of entries kept
         (owners keep their largest, in proportion) so that no rank's total
         exceeds the budget; surplus owners move entries to deficit ranks
         until every rank holds G/P, then allgatherv.  Every rank builds the
         output from the identical gathered arrays (bitwise identical).
      6. Residuals (default ``residuals="contributor"``, the paper's rule):
         an entry leaves a rank's residual only if that rank contributed it
         (selected and actually sent, or in its own region) and it is in the
         global result; everything else stays.  With ``residuals="owner"``
         everything a rank sent leaves its residual and each owner keeps the
         reduced sums of its region that the global result did not take (as
         gTopk's merging ranks do); boundaries then balance what is sent.
         Either way sum(outputs) + sum(residuals) == sum(inputs).

    Cost (paper Table 1): (2P + 2 log P) alpha +
    [2k(P-1)/P, 6k(P-1)/P] beta.  Reduce ~2k(P-1)/P words when boundaries
    fit the data, balance 0 to 2k(P-1)/P, allgatherv 2k(P-1)/P.  Measured
    bytes per rank and direction never exceed ``traffic_bound``:
    B (value + index) entries with B = max(floor(3k(P-1)/P), Q + P), plus
    control: 74(P-1) bytes of counts and the radix search's
    8 x ceil(256 (P-1)/P) bytes (16 rounds for float64).  The Q + P floor
    only matters when k is below about P (see ``_budgets``).

    Tuning:
      * ``tau_prime`` trades selection work (an exact threshold is an O(n)
        partition per refresh plus 8 small allreduces) against selection
        quality; 32 is the paper's default and loses little (docs/BENCHMARKS.md,
        "Ok-Topk traffic and selection quality"); drop to 1-8 when gradients
        change fast.
      * ``tau`` (boundaries) can be large: boundaries only need to follow
        where large gradients cluster, and ``rebalance`` (default 1.05: some
        owner or sender 5% above the mean load) refreshes them early when
        that drifts.  Each refresh costs one allreduce of P int64.
      * ``bands`` / ``scale`` / ``gain``: how far a reused threshold may
        drift before it is rescaled, and how hard; with ``local_cap`` = 1
        an overshoot only costs selection time, an undershoot sends fewer
        than k values, so the band may sit above k.
      * ``local_cap``: above 1 sends more than the local top-k when the
        threshold lets it through (more of each sum reaches its owner); the
        traffic bound holds either way, the reduce step then runs at its
        quota Q (see ``reduce_cap``).
      * ``window``: messages in flight in the reduce step (4 as the reference);
        raise on networks with many independent links.
      * ``reduce_cap`` (1 to 5/4, default 1): the reduce step's quota Q in
        units of the fair share k(P-1)/P.  1 holds every rank's reduce
        traffic to the fair share even when boundaries are stale (the
        overflow, ~2% of the values, waits in the residuals for a later
        call); measured on the traffic/quality studies it cut the steady
        traffic by 0.02-0.03x the lower bound at P = 4..16 and changed the
        captured top-k norm by 0.001 (docs/BENCHMARKS.md).  5/4 is the
        previous behaviour.
      * ``budget`` (None, or in (reduce_cap, 3]): a hard cap on the whole
        call's bytes per rank and direction, control messages included, in
        units of the lower bound 2k(P-1)/P words (for k well above P).
        None keeps Table 1's 6k(P-1)/P words for the data plus control on
        top.  A budget is met by keeping fewer global entries (G < k) on the
        calls where the global top-k falls unevenly over the regions (the
        balance step would have to move the difference); the entries not
        kept stay in the residuals.  It cannot go below Q + P entries (a
        full reduce step and one allgathered entry), which only binds when
        k is small next to P or the control messages.

      * ``adaptive_step`` (default False): damp the reused thresholds'
        rescaling (``_nudge``) when corrections alternate.  In training at
        density 0.1% (k ~ 50-100) error feedback piles values up at the
        threshold; the count then swung between ~0 and 6-14k on alternate
        calls and Ok-Topk delivered 0.71-0.74k entries per call on average.
        With the option the LSTM example's counts stay in the band (0.95k
        delivered); the digits CNN's do not (its sums alternate at a fixed
        threshold).  Measured over 12 seeds (docs/BENCHMARKS.md, "Twelve
        seeds at density 0.1%"): LSTM loss -0.0007 +- 0.0003 nats (+1.98%
        vs +2.02% to dense), digits -0.28 / +0.09 accuracy points at
        P = 4 / 8; traffic on the synthetic stream +0.01-0.02x at P = 2, 4,
        unchanged at 8, 16.  Not the default for that reason.

      * ``code_indices`` (default True): host index arrays travel
        delta-coded (``kernels.encode_indices``: per message the shortest of
        1-byte gaps, 2-byte gaps and raw, escapes to wider words), the reduce
        step's per-partner indices and the allgathered block (sorted first);
        the coded lengths cost one more count alltoall and allgather.
        Lossless: the same outputs, bitwise.  Measured on the traffic
        study's stream (docs/BENCHMARKS.md, "Delta-coded indices"): the
        busiest rank moves 1.25-1.34x the lower bound at P = 2..16 instead
        of 1.94-2.02x; on the 1 Gbit/s namespace (P = 4, n = 2^24, 1%)
        communication halves and a call takes 9% less.
        Device (cupy) arrays keep raw indices for now.

      * ``residuals`` ("contributor", the paper's rule and the default, or
        "owner"): where a value that was sent but not globally selected
        waits.  Under the paper's rule each contributor keeps its part,
        selects it again next call and sends it again (2/3 to 3/4 of a rank's
        local top-k repeats from call to call on the quality study's data);
        under "owner" the region's owner keeps the partial sum and
        re-selects it inside its own region, where it costs no traffic, at
        the price of local top-k slots its other regions no longer get.
        Measured (docs/BENCHMARKS.md, "Where unselected sums wait"): "owner"
        moves 1.44-1.77x the lower bound on the busiest rank at P = 2..16
        (1.94-2.02x), captures more of the exact global top-k's norm (0.42
        vs 0.41 at P = 4, 0.50 vs 0.35 at P = 16) and brings the LSTM
        example's loss 0.16-0.32 points (of %) closer to dense, but leaves
        the digits CNN at density 0.1% (k = 53) 0.5-1.1 accuracy points
        further from it in three of four cells (at P = 8, -1.08 points to
        dense over 12 seeds, "Twelve seeds at density 0.1%").  Not the
        default for that reason: which rule wins depends on the model.

    Example::

        algo = OkTopk(MPICommunicator(), tau=64, tau_prime=32)
        out = algo(grad, name="fc1.weight", density=0.01)   # identical on all ranks
    """

    name = "oktopk"

    def __init__(self, comm, *, tau: int = 64, tau_prime: int = 32,
                 bands: tuple[float, float] = (2 / 3, 5 / 4), scale: float = 1.012,
                 gain: float = 0.1, local_cap: float = 1.0, rebalance: float = 1.05,
                 window: int = 4, reduce_cap: float = 1.0, budget: float | None = None,
                 residuals: str = "contributor", adaptive_step: bool = False,
                 code_indices: bool = True, **kw):
        lo, hi = bands
        if not (0 < lo <= 1 <= hi):
            raise ValueError(f"bands must satisfy 0 < lo <= 1 <= hi, got {bands!r}")
        if scale <= 1.0:
            raise ValueError(f"scale must be > 1, got {scale!r}")
        if not (0.0 <= gain < 1.0):
            raise ValueError(f"gain must be in [0, 1), got {gain!r}")
        if local_cap < 1.0:
            raise ValueError(f"local_cap must be >= 1 (a multiple of k), got {local_cap!r}")
        if rebalance <= 1.0:
            raise ValueError(f"rebalance must be > 1 (use math.inf to disable), got {rebalance!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if not (1.0 <= reduce_cap <= _REDUCE_CAP):
            raise ValueError(f"reduce_cap must be in [1, {_REDUCE_CAP}], got {reduce_cap!r}")
        if residuals not in _RESIDUAL_RULES:
            raise ValueError(f"residuals must be one of {_RESIDUAL_RULES}, got {residuals!r}")
        if budget is not None and not (reduce_cap < budget <= 3.0):
            raise ValueError(f"budget must be in (reduce_cap, 3] = ({reduce_cap}, 3] units of "
                             f"the lower bound 2k(P-1)/P words, got {budget!r}")
        super().__init__(comm, tau=tau, tau_prime=tau_prime, **kw)
        self.budget = None if budget is None else float(budget)
        self.residuals = residuals
        self.adaptive_step = bool(adaptive_step)
        self.code_indices = bool(code_indices)
        self.bands = (float(lo), float(hi))
        self.scale = float(scale)
        self.gain = float(gain)
        self.local_cap = float(local_cap)
        self.rebalance = float(rebalance)
        self._stale: dict[int, bool] = {}   # id(state) -> boundaries out of balance
        self.window = int(window)
        self.reduce_cap = float(reduce_cap)
        self.last_stats: dict = {}

    # -- the exchange --------------------------------------------------------
    def _exchange(self, acc, st):
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        xp = kernels.array_module(acc)
        n, k = acc.size, st.k
        Q, B = _budgets(P, k, self.reduce_cap)
        start = comm.traffic.copy() if self.budget is not None else None
        refresh = st.iteration % st.tau_prime == 0 or st.local_threshold is None
        stats = {"iteration": st.iteration, "refresh": refresh, "Q": Q, "B": B}

        # 1. local selection
        with comm.phase("select"):
            if refresh:
                st.local_threshold = kernels.kth_magnitude(acc, k, work=self.kernel_work(acc))
            thr = st.local_threshold
            idx, vals = _magnitude_select(acc, thr, self.kernel_work(acc))
            m = int(idx.size)
            st.local_threshold, st.local_control = self._nudge(thr, m, k, st.local_control)
            idx, vals = kernels.cap_selection(idx, vals, max(1, int(self.local_cap * k)))
        st.selected_local = m
        stats["local_threshold"] = thr

        # 2. region boundaries
        stale = self._stale.pop(id(st), False)
        if st.boundaries is None or st.iteration % st.tau == 0 or stale:
            with comm.phase("control:boundaries"):
                # under "owner" a rank's own region holds the sums it kept, which it
                # re-selects without sending: the regions balance what is sent
                if self.residuals == "owner" and st.boundaries is not None and P > 1:
                    o = kernels.split_by_bounds(idx, st.boundaries)
                    st.boundaries = self._boundaries(_without(xp, idx, o[rank], o[rank + 1]), n)
                else:
                    st.boundaries = self._boundaries(idx, n)
            stats["boundaries_refreshed"] = True
        bounds = st.boundaries
        stats["boundaries"] = list(bounds)

        # 3. split and reduce
        with comm.phase("select"):
            offs = kernels.split_by_bounds(idx, bounds)
            a, b = offs[rank], offs[rank + 1]
            own_i, own_v = idx[a:b], vals[a:b]
            out_i, out_v = _without(xp, idx, a, b), _without(xp, vals, a, b)
            if out_i.size > Q:  # sender's cap
                out_i, out_v = kernels.cap_selection(out_i, out_v, Q)
                offs = kernels.split_by_bounds(out_i, bounds)
            else:  # the same entries less the own region: offsets past it shift down
                offs = offs[:rank + 1] + [o - (b - a) for o in offs[rank + 1:]]
            want = np.array([offs[j + 1] - offs[j] for j in range(P)], dtype=np.int64)
        with comm.phase("control:counts"):
            incoming = comm.alltoall_ints(want)
            accept = _apportion(incoming, Q)                          # owner's cap
            quota = comm.alltoall_ints(accept)
        send_i, send_v = [], []
        with comm.phase("select"):
            for j in range(P):
                si, sv = out_i[offs[j]:offs[j + 1]], out_v[offs[j]:offs[j + 1]]
                if quota[j] < si.size:
                    si, sv = kernels.cap_selection(si, sv, int(quota[j]))
                send_i.append(si)
                send_v.append(sv)
        code = self.code_indices and xp is np and P > 1   # host indices go delta-coded
        if code:
            out_b = [kernels.encode_indices(si) for si in send_i]   # own: empty
            with comm.phase("control:counts"):
                lens = comm.alltoall_ints([b.size for b in out_b])
            recv_i = [np.empty(int(lens[s]), dtype=np.uint8) for s in range(P)]
        else:
            out_b = send_i
            recv_i = [xp.empty(int(accept[s]), dtype=idx.dtype) for s in range(P)]
        recv_v = [xp.empty(int(accept[s]), dtype=acc.dtype) for s in range(P)]
        steps = []
        for step in range(1, P):
            dst, src = (rank + step) % P, (rank - step) % P
            group = []
            if send_i[dst].size:
                group += [("send", dst, out_b[dst], _TAG_REDUCE),
                          ("send", dst, send_v[dst], _TAG_REDUCE + 1)]
            if accept[src]:
                group += [("recv", src, recv_i[src], _TAG_REDUCE),
                          ("recv", src, recv_v[src], _TAG_REDUCE + 1)]
            steps.append(group)
        with comm.phase("comm:reduce"):
            _windowed(comm, steps, self.window)
        if code:
            recv_i = [kernels.decode_indices(b, int(accept[s]), idx.dtype)
                      for s, b in enumerate(recv_i)]
        with comm.phase("reduce"):
            parts_i = [own_i if s == rank else recv_i[s] for s in range(P)]
            parts_v = [own_v if s == rank else recv_v[s] for s in range(P)]
            red_i, red_v = kernels.coo_sum(parts_i, parts_v, n)
        stats.update(own=int(own_i.size), wanted=int(want.sum()))
        S_me = int(sum(int(q) for j, q in enumerate(quota) if j != rank))
        R_me = int(accept.sum() - accept[rank])

        # 4. global threshold and selection
        grefresh = refresh or st.global_threshold is None
        if grefresh:
            with comm.phase("control:global-threshold"):
                nz = red_v[red_v != 0]
                st.global_threshold = _global_kth(comm, xp.abs(nz), k)
        gthr = st.global_threshold
        with comm.phase("select"):
            gi, gv = _magnitude_select(red_v, gthr)
            gi = red_i[gi]
        stats["global_threshold"] = gthr

        # 5. balance and allgatherv
        with comm.phase("control:global-counts"):
            table = comm.allgather_ints([gi.size, S_me, R_me]).reshape(P, 3)
        g, S, R = table[:, 0], table[:, 1], table[:, 2]
        total = int(g.sum())
        st.global_threshold, st.global_control = self._nudge(
            gthr, total, k, st.global_control)
        # every rank sees the same R: all agree whether boundaries went stale
        if P > 1 and max(R.max(), S.max()) > self.rebalance * max(R.mean(), 1.0):
            self._stale[id(st)] = True
        if self.budget is not None:
            B = self._call_budget(comm.traffic.since(start), P, k, Q, acc.itemsize, idx.itemsize)
            stats["B"] = B
        G = _fit_global(g, S, R, B, k, P)
        sent, recv, q, blk = _phase2_volume(G, g, S, R, P)
        with comm.phase("select"):
            if q[rank] < gi.size:
                gi, gv = kernels.cap_selection(gi, gv, int(q[rank]))
        keep = int(min(q[rank], blk[rank]))
        hold_i, hold_v = [gi[:keep]], [gv[:keep]]
        moves, off = [], keep
        for src, dst, cnt in _balance_plan(q, blk):
            if src == rank:
                moves.append([("send", dst, gi[off:off + cnt], _TAG_BALANCE),
                              ("send", dst, gv[off:off + cnt], _TAG_BALANCE + 1)])
                off += cnt
            elif dst == rank:
                bi = xp.empty(cnt, dtype=gi.dtype)
                bv = xp.empty(cnt, dtype=gv.dtype)
                hold_i.append(bi)
                hold_v.append(bv)
                moves.append([("recv", src, bi, _TAG_BALANCE),
                              ("recv", src, bv, _TAG_BALANCE + 1)])
        with comm.phase("comm:balance"):
            _windowed(comm, moves, self.window)
        bi = xp.concatenate(hold_i) if len(hold_i) > 1 else hold_i[0]
        bv = xp.concatenate(hold_v) if len(hold_v) > 1 else hold_v[0]
        if code:   # sorted (the receivers scatter the block), so its gaps are small
            order = np.argsort(bi, kind="stable")
            bi, bv = bi[order], bv[order]
            enc = kernels.encode_indices(bi)
            with comm.phase("control:counts"):
                lens = comm.allgather_ints([enc.size])[:, 0]
        with comm.phase("comm:allgather"):
            if code:
                allb, _ = comm.allgatherv(enc, lens)
                ends = np.cumsum(lens)
                all_i = np.concatenate([
                    kernels.decode_indices(allb[e - c:e], int(blk[r]), bi.dtype)
                    for r, (e, c) in enumerate(zip(ends, lens))])
            else:
                all_i, _ = comm.allgatherv(bi, blk)
            all_v, _ = comm.allgatherv(bv, blk)
        with comm.phase("reduce"):
            out = xp.zeros(n, dtype=acc.dtype)
            out[all_i] = all_v
            # 6. residuals: zero only what this rank contributed to the result.  The
            # result's values are never 0 (selections skip zeros), so out != 0 marks
            # its indices: no index mask, no data-dependent compaction (a host sync).
            mine = xp.concatenate([own_i] + [send_i[j] for j in range(P) if j != rank])
            if self.residuals == "contributor":
                acc[mine] = xp.where(out[mine] != 0, acc.dtype.type(0), acc[mine])
            else:  # "owner": what was sent left; the owner keeps the sums not in the result
                acc[mine] = 0
                acc[red_i] += xp.where(out[red_i] != 0, acc.dtype.type(0), red_v)
        st.selected_global = G
        stats.update(global_candidates=total, G=G, g=g.tolist(), q=q.tolist(),
                     blocks=blk.tolist(), reduce_sent=S.tolist(), reduce_recv=R.tolist(),
                     planned_sent=sent.tolist(), planned_recv=recv.tolist())
        self.last_stats = stats
        return out

    # -- pieces ------------------------------------------------------------------
    def _nudge(self, thr: float, count: int, k: int, ctl):
        """Threshold reuse: rescale a threshold whose count left [lo k, hi k].

        Returns ``(threshold, ctl)``; ``ctl`` = (damping f in (0, 1],
        direction of the last correction: +1 raised, -1 lowered), kept per
        threshold in the tensor's state (None at first).

        The reference multiplies by a fixed 1.012; with error feedback the
        accumulated values grow by far more than 1.2% per call early on, so
        the count runs away (x30 within 30 calls on heavy-tailed data).  The
        step here is (count/k)^gain, at least ``scale``: for a tail with
        count(|x| >= t) ~ t^-a it removes a fraction gain*a of the log error
        per call, which converges for a tail exponent a < 2/gain (a ~ 2 for
        Student-t gradients, ~8 for Gaussian ones at 1% density).  Error
        feedback at small k builds far steeper walls: values wait just below
        (and, sent but not taken, above) the threshold, and in training a
        fixed gain of 0.1 swung the count between 0.1k and 14k on alternate
        calls.  With ``adaptive_step`` the step adapts as in Rprop: it is
        raised to a power f in (0, 1] that halves when a correction reverses
        the previous one and grows by half (up to 1) when it repeats it.
        Without it f stays 1.
        """
        lo, hi = self.bands
        f, last = (1.0, 0) if ctl is None else ctl
        if lo * k <= count <= hi * k:
            return thr, (f, last)
        d = 1 if count > hi * k else -1
        if self.adaptive_step and d == -last:
            f *= 0.5
        elif self.adaptive_step and d == last:
            f = min(1.5 * f, 1.0)
        r = count / k if d > 0 else k / max(count, 0.5)
        step = max(self.scale, r ** self.gain) ** f
        return (thr * step if d > 0 else thr / step), (f, d)

    def _boundaries(self, idx, n: int) -> list[int]:
        """Region boundaries agreed by all ranks from their selected indices.

        Each rank's P-1 quantiles of its (sorted) selected indices, weighted
        by its selection count, summed by one allreduce of P int64: the
        count-weighted mean quantiles.  Ranks that selected nothing have no
        say; when nobody selected anything the regions are equal.
        """
        comm, P = self.comm, self.comm.size
        if P == 1:
            return [0, n]
        m = int(idx.size)
        w = min(m, (2**62 // max(n, 1)) // P)   # keep the int64 sums in range
        row = np.zeros(P, dtype=np.int64)
        if m and w:
            pos = np.array([(j * m) // P for j in range(1, P)], dtype=np.int64)
            q = idx[kernels.array_module(idx).asarray(pos)]
            q = q.get() if hasattr(q, "get") else q
            row[:P - 1] = np.asarray(q, dtype=np.int64) * w
            row[P - 1] = w
        tot = comm.allreduce(row, "sum")
        if tot[P - 1] == 0:
            return kernels.region_bounds(n, P)
        inner = tot[:P - 1] // tot[P - 1]
        inner = np.maximum.accumulate(np.clip(inner, 0, n))
        return [0] + [int(v) for v in inner] + [n]

    def _call_budget(self, so_far, P: int, k: int, Q: int, itemsize: int, idx_bytes: int) -> int:
        """Entries the reduce, balance and allgatherv steps may move per rank and
        direction so that the whole call, the control messages already sent
        included, stays within ``budget`` x the lower bound (k(P-1)/P entries).
        The control accounting is rank-independent, so every rank agrees."""
        ctl = [c for ph, c in so_far.phases.items() if ph.startswith("control:")]
        ctl = max(sum(c.bytes_sent for c in ctl), sum(c.bytes_recv for c in ctl))
        # still to come with coded indices: the allgatherv's lengths, and a format
        # byte per index message (a raw message grows by it)
        ctl += (_CTRL + 2) * (P - 1)
        entry = itemsize + idx_bytes
        B = int(self.budget * k * (P - 1) // P) - -(-ctl // entry)
        return max(B, Q + P)

    @staticmethod
    def traffic_bound(n, P, k, itemsize=4):
        """Bytes one rank sends (and, separately, receives) per call, at most.

        B entries of (value, index) with B = max(floor(3k(P-1)/P), Q + P),
        Q = max(1, floor(5/4 k(P-1)/P)) (the largest reduce quota), i.e.
        6k(P-1)/P words whenever k is at least about P, plus control:
        boundaries (16(P-1)), two count alltoalls (16(P-1)), the counts
        allgather (24(P-1)), the coded index lengths (16(P-1): one alltoall,
        one allgather), a format byte per coded index message (2(P-1)) and
        the radix search for the global threshold.
        """
        if P == 1:
            return 0
        _, B = _budgets(P, k)
        idx_bytes = 4 if n < 2**31 else 8
        radix = _radix_rounds(itemsize) * -(-2 * _CTRL * (1 << _RADIX_BITS) * (P - 1) // P)
        # + the coded index lengths and each coded message's format byte (host data)
        control = (56 + 16 + 2) * (P - 1) + radix
        return B * (itemsize + idx_bytes) + control

"""Ok-Topk: near-optimal sparse allreduce (Li & Hoefler, PPoPP'22, Algorithm 1).

The module holds the algorithm (``OkTopk``), its per-tensor state
(``OkTopkState``) and the records its steps hand each other; the host-side
planning and wire helpers live in ``_oktopk_plan``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

import kernels

from ._base import ITEM, Prices, SparseAllreduce, SparseState, register
from ._oktopk_plan import (_CTRL, _QUOTA, _QUOTA_BOUND, _RADIX_BITS, _apportion, _balance_plan,
                           _budgets, _fit_global, _global_kth, _magnitude_select, _phase2_volume,
                           _radix_rounds, _windowed, _without)

__all__ = ["OkTopk", "OkTopkState"]

_TAG_REDUCE = 40
_TAG_BALANCE = 50
_RESIDUAL_RULES = ("contributor", "owner")
_WINDOW = 4            # groups of transfers in flight (the reference's)
_REBALANCE = 1.05      # a reduce load this far over the mean refreshes the boundaries
_BANDS = (2 / 3, 5 / 4)  # a reused threshold's count may drift within [lo k, hi k]
_SCALE = 1.012         # the least rescaling step of a threshold out of its band
_GAIN = 0.1            # the step's exponent on the count error (see OkTopk._nudge)


class OkTopkState(SparseState):
    """Ok-Topk's per-tensor state: ``SparseState`` plus reused thresholds and regions.

    Fields, grouped as in PyTorch's PowerSGDState (``SparseState``'s first):
      internal:   local_threshold, global_threshold (reused between exact
                  refreshes every tau_prime calls), local_control,
                  global_control (how each reused threshold is being
                  rescaled: (damping, direction of the last correction), see
                  ``OkTopk._nudge``), boundaries (the P regions' cuts,
                  refreshed every tau calls), stale (the last call's reduce
                  load was out of balance: refresh the boundaries next call)
    """

    __slots__ = ("local_threshold", "global_threshold", "local_control", "global_control",
                 "boundaries", "stale")

    def __init__(self, n: int, dtype, xp=np, **kw):
        super().__init__(n, dtype, xp, **kw)
        self.local_threshold: float | None = None
        self.global_threshold: float | None = None
        self.local_control: tuple[float, int] | None = None
        self.global_control: tuple[float, int] | None = None
        self.boundaries: list[int] | None = None
        self.stale = False


class _Split(NamedTuple):
    """Step 3's plan: this rank's own-region entries, what it sends to each
    owner, what each sender will send it (``accept``), the entries it wanted
    to send, and the totals it sends / receives (own region excluded)."""
    own_i: object
    own_v: object
    send_i: list
    send_v: list
    accept: np.ndarray
    wanted: int
    sent: int
    recv: int


class _Plan(NamedTuple):
    """Step 5's plan, identical on every rank: per rank the global candidates
    ``g``, reduce entries sent ``S`` / received ``R``, kept ``q``, block
    ``blocks`` and planned totals; ``G`` entries kept within ``B`` per rank."""
    G: int
    B: int
    g: np.ndarray
    S: np.ndarray
    R: np.ndarray
    q: np.ndarray
    blocks: np.ndarray
    sent: np.ndarray
    recv: np.ndarray


@register
class OkTopk(SparseAllreduce):
    """Ok-Topk (Li & Hoefler, PPoPP'22): O(k) sparse allreduce with error feedback.

    Every rank selects its local top-k by a threshold; the index space is cut
    into P regions holding about the same number of selected values; the
    owner of each region sums what falls into it; the global top-k of the
    sums (by a global threshold) is repacked into equal blocks and
    allgathered, so every rank builds the identical output.  Thresholds are
    computed exactly every ``tau_prime`` calls and reused in between, region
    boundaries every ``tau`` calls.

    Steps of one call (P ranks, n entries, k = round(density n)):
      1. ``_select_local``: ``|acc| >= local_threshold``, the exact k-th
         magnitude at refresh calls, else the previous threshold rescaled
         when its count left [2k/3, 5k/4] (``_nudge``); capped at the k
         largest, so a threshold that lets too much through still sends the
         local top-k.
      2. ``_refresh_boundaries`` (first call, every ``tau`` calls, and after a
         call whose reduce load was more than 5% over the mean): one
         allreduce of P int64 averages the ranks' selected-index quantiles,
         weighted by their counts, so each region holds ~1/P of the
         selections wherever they cluster.
      3. ``_split`` and ``_reduce``: region j's values go to rank j, partners
         rotating (step i: send to rank+i, receive from rank-i), 4 steps in
         flight.  A rank sends, and an owner accepts, at most the fair share
         Q = k(P-1)/P entries, the largest (counts and quotas in two
         alltoalls); what is held back waits in the residual.
      4. ``_select_global``: ``|sum| >= global_threshold`` on each owner's
         region; at refresh calls the exact k-th largest |sum| over all
         regions, by a distributed radix select on integer counts (8
         allreduces of 16 int64 for float32, independent of k and n).
      5. ``_plan``, ``_balance``, ``_allgather``: one allgather of (global
         count, reduce sent, reduce received) per rank fixes the G <= k
         entries kept (owners keep their largest, in proportion) so that no
         rank exceeds the budget; surplus owners move entries to deficit
         ranks until each holds G/P; allgatherv.
      6. ``_settle``: the output, and the residuals.  ``residuals=
         "contributor"``: an entry leaves a rank's residual only if that rank
         contributed it and it is in the result.  ``"owner"``: everything a
         rank sent leaves its residual, and each owner keeps the reduced sums
         of its region the result did not take.  Either way sum(outputs) +
         sum(residuals) == sum(inputs).

    Cost (paper Table 1): (2P + 2 log P) alpha + [2k(P-1)/P, 6k(P-1)/P] beta:
    reduce ~2k(P-1)/P words when boundaries fit the data, balance 0 to
    2k(P-1)/P, allgatherv 2k(P-1)/P; plus an O(n) partition per refresh and a
    threshold scan per call.  ``traffic_bound`` is the per-call ceiling,
    control messages included.  Figures: docs/BENCHMARKS.md, "Traffic".

    Args:
        comm: the Communicator.
        tau: calls between boundary refreshes.  Can be large: boundaries only
            follow where large values cluster, and a drifting load refreshes
            them early.  Each refresh costs one allreduce of P int64.
        tau_prime: calls between exact thresholds; 32 (the paper's) loses
            little, 1-8 when gradients change fast (docs/BENCHMARKS.md,
            "Selection quality and tau'").
        residuals: ``"contributor"`` (the paper's rule, default) or
            ``"owner"``: where a value sent but not globally selected waits.
            Under "owner" it costs no traffic to send again, so fewer bytes
            move; which rule trains better depends on the model: try both on
            a new model's first epochs ("Where unselected sums wait",
            "Convergence parity on 12 seeds").
        adaptive_step: damp a reused threshold's rescaling Rprop-style when
            corrections alternate, the steep count walls error feedback
            builds at small k (density ~0.1%).  Helped one example model and
            hurt the other ("Twelve seeds at density 0.1%"); off by default.
        budget: None, or in (1, 3]: a hard cap on each call's bytes per rank
            and direction, control included, in units of the lower bound
            2k(P-1)/P words.  Met by keeping fewer global entries (G < k) on
            calls whose result falls unevenly over the regions; the rest waits
            in the residuals ("Traffic").  None: Table 1's 6k(P-1)/P words.
        code_indices: delta-code host index arrays (lossless, bitwise the same
            outputs, about 2/3 of the bytes; device arrays stay raw).  False
            only to compare ("Delta-coded indices").
        **kw: ``Algorithm``'s (``check_finite``).

    Raises:
        ValueError: ``residuals`` or ``budget`` out of range.

    Example::

        algo = OkTopk(MPICommunicator(), residuals="owner")
        out = algo(grad, name="fc1.weight", density=0.01)   # identical on all ranks
        algo.last_stats["G"]                                 # entries delivered
    """

    name = "oktopk"
    state_class = OkTopkState

    @staticmethod
    def cost(prices: Prices, n, P, k, *, tau_prime=32, tau=64):
        tp = max(1, int(tau_prime))
        select = (prices.topk(n) + (tp - 1) * prices.threshold(n)) / tp
        split_reduce = (P - 1) * prices.t_p2p(2 * k / P * ITEM) + prices.reduce(k)
        balance = prices.t_p2p(2 * k / P * ITEM)  # repacking into equal blocks
        gather = prices.t_allgather(2 * k / P * ITEM, P) + prices.reduce(k)
        # control messages of every call: the reduce counts and quotas (two alltoalls of
        # one int64 per peer) and the global counts (an allgather of three int64)
        control = 2 * prices.t_alltoall(8, P) + prices.t_allgather(24, P)
        # exact global threshold every tau': radix select, 8 allreduces of 16 int64
        refresh = 8 * prices.t_allreduce(128, P) / tp
        bounds = prices.t_allreduce(8 * P, P) / max(1, int(tau))  # region boundaries every tau
        return (prices.dense_passes(n) + select + split_reduce + balance + gather + control
                + refresh + bounds)

    def __init__(self, comm, *, tau: int = 64, tau_prime: int = 32,
                 residuals: str = "contributor", adaptive_step: bool = False,
                 budget: float | None = None, code_indices: bool = True, **kw):
        if residuals not in _RESIDUAL_RULES:
            raise ValueError(f"residuals must be one of {_RESIDUAL_RULES}, got {residuals!r}")
        if budget is not None and not (1.0 < budget <= 3.0):
            raise ValueError(f"budget must be in (1, 3] units of the lower bound 2k(P-1)/P "
                             f"words, got {budget!r}")
        super().__init__(comm, tau=tau, tau_prime=tau_prime, **kw)
        self.residuals = residuals
        self.adaptive_step = bool(adaptive_step)
        self.budget = None if budget is None else float(budget)
        self.code_indices = bool(code_indices)
        self.last_stats: dict = {}

    # -- the exchange --------------------------------------------------------------
    def _exchange(self, acc, st, x):
        comm, P, k = self.comm, self.comm.size, st.k
        kernels.add_into(acc, x)
        Q, B = _budgets(P, k, _QUOTA)
        start = comm.traffic.copy() if self.budget is not None else None
        refresh = st.iteration % st.tau_prime == 0 or st.local_threshold is None
        code = self.code_indices and kernels.array_module(acc) is np and P > 1
        idx, vals, thr = self._select_local(acc, st, refresh)
        refreshed = self._refresh_boundaries(idx, st, acc.size)
        split = self._split(idx, vals, st.boundaries, Q)
        red_i, red_v = self._reduce(split, acc, code)
        gi, gv, gthr = self._select_global(red_i, red_v, st, refresh)
        plan = self._plan(gi.size, split, st, Q, B, start, acc.itemsize, idx.itemsize)
        bi, bv = self._balance(gi, gv, plan)
        all_i, all_v = self._allgather(bi, bv, plan.blocks, code)
        out = self._settle(acc, all_i, all_v, split, red_i, red_v)
        st.selected_global = plan.G
        self.last_stats = self._stats(st, refresh, refreshed, Q, thr, gthr, split, plan)
        return out

    def _stats(self, st, refresh, refreshed, Q, thr, gthr, split, plan) -> dict:
        """What the call did, for tests and tools (``benchmarks/oktopk_trace.py`` reads it
        through ``collectives.observe``): per-rank lists are in rank order and identical
        on every rank."""
        stats = {"iteration": st.iteration, "refresh": refresh, "Q": Q, "B": plan.B,
                 "local_threshold": thr}
        if refreshed:
            stats["boundaries_refreshed"] = True
        stats.update(boundaries=list(st.boundaries), own=int(split.own_i.size),
                     wanted=split.wanted, global_threshold=gthr,
                     global_candidates=int(plan.g.sum()), G=plan.G, g=plan.g.tolist(),
                     q=plan.q.tolist(), blocks=plan.blocks.tolist(),
                     reduce_sent=plan.S.tolist(), reduce_recv=plan.R.tolist(),
                     planned_sent=plan.sent.tolist(), planned_recv=plan.recv.tolist())
        return stats

    # -- the steps ---------------------------------------------------------------
    def _select_local(self, acc, st, refresh: bool):
        """Step 1: this rank's candidates by the local threshold, at most k of them.
        Returns (indices, values, the threshold used)."""
        k = st.k
        with self.comm.phase("select"):
            if refresh:
                st.local_threshold = kernels.kth_magnitude(acc, k, work=self.kernel_work(acc))
            thr = st.local_threshold
            idx, vals = _magnitude_select(acc, thr, self.kernel_work(acc))
            st.selected_local = int(idx.size)
            st.local_threshold, st.local_control = self._nudge(
                thr, st.selected_local, k, st.local_control)
            idx, vals = kernels.cap_selection(idx, vals, max(1, k))
        return idx, vals, thr

    def _refresh_boundaries(self, idx, st, n: int) -> bool:
        """Step 2: new region boundaries when due (first call, every tau calls,
        or the last call's load went stale).  Returns whether they were refreshed."""
        stale, st.stale = st.stale, False
        if not (st.boundaries is None or st.iteration % st.tau == 0 or stale):
            return False
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        with comm.phase("control:boundaries"):
            # under "owner" a rank's own region holds the sums it kept, which it
            # re-selects without sending: the regions balance what is sent
            if self.residuals == "owner" and st.boundaries is not None and P > 1:
                o = kernels.split_by_bounds(idx, st.boundaries)
                xp = kernels.array_module(idx)
                st.boundaries = self._boundaries(_without(xp, idx, o[rank], o[rank + 1]), n)
            else:
                st.boundaries = self._boundaries(idx, n)
        return True

    def _split(self, idx, vals, bounds, Q: int) -> _Split:
        """Step 3a: cut the candidates by region and agree who sends what: a
        sender caps what it sends at Q (its largest), an owner apportions Q
        among its senders (two count alltoalls)."""
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        xp = kernels.array_module(idx)
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
        sent = int(sum(int(q) for j, q in enumerate(quota) if j != rank))
        return _Split(own_i, own_v, send_i, send_v, accept, int(want.sum()), sent,
                      int(accept.sum() - accept[rank]))

    def _reduce(self, split: _Split, acc, code: bool):
        """Step 3b: send each owner its entries (rotating partners, a window in
        flight; indices delta-coded when ``code``) and sum this rank's region.
        Returns the sums' (indices, values)."""
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        xp = kernels.array_module(acc)
        send_i, accept, itype = split.send_i, split.accept, split.own_i.dtype
        if code:
            out_b = [kernels.encode_indices(si) for si in send_i]   # own: empty
            with comm.phase("control:counts"):
                lens = comm.alltoall_ints([b.size for b in out_b])
            recv_i = [np.empty(int(lens[s]), dtype=np.uint8) for s in range(P)]
        else:
            out_b = send_i
            recv_i = [xp.empty(int(accept[s]), dtype=itype) for s in range(P)]
        recv_v = [xp.empty(int(accept[s]), dtype=acc.dtype) for s in range(P)]
        steps = []
        for step in range(1, P):
            dst, src = (rank + step) % P, (rank - step) % P
            group = []
            if send_i[dst].size:
                group += [("send", dst, out_b[dst], _TAG_REDUCE),
                          ("send", dst, split.send_v[dst], _TAG_REDUCE + 1)]
            if accept[src]:
                group += [("recv", src, recv_i[src], _TAG_REDUCE),
                          ("recv", src, recv_v[src], _TAG_REDUCE + 1)]
            steps.append(group)
        with comm.phase("comm:reduce"):
            _windowed(comm, steps, _WINDOW)
        if code:
            recv_i = [kernels.decode_indices(b, int(accept[s]), itype)
                      for s, b in enumerate(recv_i)]
        with comm.phase("reduce"):
            parts_i = [split.own_i if s == rank else recv_i[s] for s in range(P)]
            parts_v = [split.own_v if s == rank else recv_v[s] for s in range(P)]
            return kernels.coo_sum(parts_i, parts_v, acc.size)

    def _select_global(self, red_i, red_v, st, refresh: bool):
        """Step 4: the global candidates of this rank's region by the global
        threshold (searched exactly at refresh calls).  Returns (indices,
        values, the threshold used)."""
        comm = self.comm
        if refresh or st.global_threshold is None:
            with comm.phase("control:global-threshold"):
                nz = red_v[red_v != 0]
                st.global_threshold = _global_kth(comm, kernels.array_module(nz).abs(nz), st.k)
        gthr = st.global_threshold
        with comm.phase("select"):
            gi, gv = _magnitude_select(red_v, gthr)
            gi = red_i[gi]
        return gi, gv, gthr

    def _plan(self, g_me: int, split: _Split, st, Q: int, B: int, start, itemsize: int,
              idx_bytes: int) -> _Plan:
        """Step 5a: one allgather of every rank's counts; from them, identically
        on every rank, the global threshold's rescaling, whether the boundaries
        went stale, the budget (``B``, or with ``budget`` from the traffic since
        ``start``) and the G entries kept, with each rank's share and block."""
        comm, P, k = self.comm, self.comm.size, st.k
        with comm.phase("control:global-counts"):
            table = comm.allgather_ints([g_me, split.sent, split.recv]).reshape(P, 3)
        g, S, R = table[:, 0], table[:, 1], table[:, 2]
        st.global_threshold, st.global_control = self._nudge(
            st.global_threshold, int(g.sum()), k, st.global_control)
        if P > 1 and max(R.max(), S.max()) > _REBALANCE * max(R.mean(), 1.0):
            st.stale = True
        if start is not None:
            B = self._call_budget(comm.traffic.since(start), P, k, Q, itemsize, idx_bytes)
        G = _fit_global(g, S, R, B, k, P)
        sent, recv, q, blocks = _phase2_volume(G, g, S, R, P)
        return _Plan(G, B, g, S, R, q, blocks, sent, recv)

    def _balance(self, gi, gv, plan: _Plan):
        """Step 5b: keep this rank's share of the G entries (its largest), then
        surplus ranks move entries to deficit ranks until each holds its block."""
        comm, rank = self.comm, self.comm.rank
        xp = kernels.array_module(gv)
        with comm.phase("select"):
            if plan.q[rank] < gi.size:
                gi, gv = kernels.cap_selection(gi, gv, int(plan.q[rank]))
        keep = int(min(plan.q[rank], plan.blocks[rank]))
        hold_i, hold_v = [gi[:keep]], [gv[:keep]]
        moves, off = [], keep
        for src, dst, cnt in _balance_plan(plan.q, plan.blocks):
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
            _windowed(comm, moves, _WINDOW)
        bi = xp.concatenate(hold_i) if len(hold_i) > 1 else hold_i[0]
        bv = xp.concatenate(hold_v) if len(hold_v) > 1 else hold_v[0]
        return bi, bv

    def _allgather(self, bi, bv, blocks, code: bool):
        """Step 5c: allgatherv of every rank's block (indices delta-coded, sorted
        first, when ``code``).  Returns the result's indices and values."""
        comm = self.comm
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
                    kernels.decode_indices(allb[e - c:e], int(blocks[r]), bi.dtype)
                    for r, (e, c) in enumerate(zip(ends, lens))])
            else:
                all_i, _ = comm.allgatherv(bi, blocks)
            all_v, _ = comm.allgatherv(bv, blocks)
        return all_i, all_v

    def _settle(self, acc, all_i, all_v, split: _Split, red_i, red_v):
        """Step 6: the dense output, and what stays in this rank's residual ``acc``."""
        comm, P, rank = self.comm, self.comm.size, self.comm.rank
        xp = kernels.array_module(acc)
        with comm.phase("reduce"):
            out = xp.zeros(acc.size, dtype=acc.dtype)
            out[all_i] = all_v
            # zero only what this rank contributed to the result.  The result's
            # values are never 0 (selections skip zeros), so out != 0 marks its
            # indices: no index mask, no data-dependent compaction (a host sync).
            mine = xp.concatenate([split.own_i] + [split.send_i[j] for j in range(P) if j != rank])
            if self.residuals == "contributor":
                acc[mine] = xp.where(out[mine] != 0, acc.dtype.type(0), acc[mine])
            else:  # "owner": what was sent left; the owner keeps the sums not in the result
                acc[mine] = 0
                acc[red_i] += xp.where(out[red_i] != 0, acc.dtype.type(0), red_v)
        return out

    # -- pieces ------------------------------------------------------------------
    def _nudge(self, thr: float, count: int, k: int, ctl):
        """Threshold reuse: rescale a threshold whose count left [lo k, hi k].

        Returns ``(threshold, ctl)``; ``ctl`` = (damping f in (0, 1],
        direction of the last correction: +1 raised, -1 lowered), kept per
        threshold in the tensor's state (None at first).

        The step is (count/k)^gain, at least 1.012 (the reference's fixed
        step, too slow once error feedback makes the values grow): for a tail
        with count(|x| >= t) ~ t^-a it removes a fraction gain*a of the log
        error per call, which converges for a < 2/gain (Student-t gradients
        a ~ 2, Gaussian ones ~8 at 1% density).  Error feedback at small k
        builds far steeper walls, where that step overshoots on alternate
        calls.  With ``adaptive_step`` the step is raised to a power f that
        halves when a correction reverses the previous one and grows by half
        (up to 1) when it repeats it (as in Rprop); without it f stays 1.
        """
        lo, hi = _BANDS
        f, last = (1.0, 0) if ctl is None else ctl
        if lo * k <= count <= hi * k:
            return thr, (f, last)
        d = 1 if count > hi * k else -1
        if self.adaptive_step and d == -last:
            f *= 0.5
        elif self.adaptive_step and d == last:
            f = min(1.5 * f, 1.0)
        r = count / k if d > 0 else k / max(count, 0.5)
        step = max(_SCALE, r ** _GAIN) ** f
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
        Q = max(1, floor(5/4 k(P-1)/P)) (room for a quota above the fair share
        the algorithm plans with), i.e.
        6k(P-1)/P words whenever k is at least about P, plus control:
        boundaries (16(P-1)), two count alltoalls (16(P-1)), the counts
        allgather (24(P-1)), the coded index lengths (16(P-1): one alltoall,
        one allgather), a format byte per coded index message (2(P-1)) and
        the radix search for the global threshold.
        """
        if P == 1:
            return 0
        _, B = _budgets(P, k, _QUOTA_BOUND)
        idx_bytes = 4 if n < 2**31 else 8
        radix = _radix_rounds(itemsize) * -(-2 * _CTRL * (1 << _RADIX_BITS) * (P - 1) // P)
        # + the coded index lengths and each coded message's format byte (host data)
        control = (56 + 16 + 2) * (P - 1) + radix
        return B * (itemsize + idx_bytes) + control

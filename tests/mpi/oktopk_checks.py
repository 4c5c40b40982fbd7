"""Ok-Topk specific checks, run under ``mpiexec -n P`` (launched by tests/test_oktopk.py).

Cases (all by default; ``--cases a,b`` to pick):
  global-kth     the distributed radix select equals the k-th largest of the
                 gathered values (ties, fewer than k values, empty ranks).
  boundaries     boundaries identical on every rank, and the regions carry
                 about the same number of selected values on skewed data
                 where equal-length regions would not.
  exact          with tau' = 1 every call where no reduce quota binds is
                 exact: the output is the top-k of the sums of the ranks'
                 local top-k values, on its support and in its values
                 (checked against a brute-force reference).
  refresh        exact thresholds exactly at calls t with t % tau' == 0: the
                 local threshold then equals the k-th |acc|, the global one is
                 searched (its phase appears) only then.
  hot            all ranks' values in one region: payload per rank within
                 6k(P-1)/P words every call; conservation; identical outputs.
  residuals      residuals="owner": bounds and conservation; what a sender
                 keeps under either rule.
  adaptive       adaptive_step=True: bounds, identical outputs, conservation,
                 identical global threshold state on every rank.
  stale          the hot region jumps after the boundaries were fixed (tau
                 large): on that call the reduce quotas hold the owner to Q,
                 the payload stays within 6k(P-1)/P words, nothing lost.
Exits non-zero (aborting the job) on the first failure.
"""
from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np
from mpi4py import MPI

import kernels
from collectives import MPICommunicator, OkTopk
from tests.mpi import abort_job, identical
from collectives._oktopk_plan import _budgets, _global_kth

WORLD = MPI.COMM_WORLD
RANK, P = WORLD.Get_rank(), WORLD.Get_size()


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def payload(traffic):
    """Bytes sent / received in comm:* phases (values and indices, no counts)."""
    s = sum(c.bytes_sent for p, c in traffic.phases.items() if p.startswith("comm"))
    r = sum(c.bytes_recv for p, c in traffic.phases.items() if p.startswith("comm"))
    return s, r


def sum64(x):
    out = np.empty(x.size, np.float64)
    WORLD.Allreduce(np.ascontiguousarray(x, np.float64), out, op=MPI.SUM)
    return out


def case_global_kth(rng):
    comm = MPICommunicator(WORLD)
    for trial in range(12):
        m = int(rng.integers(0, 50)) if trial % 3 else (0 if RANK % 2 else 40)
        if trial % 4 == 1:          # many ties
            v = rng.integers(1, 4, m).astype(np.float32)
        else:
            v = np.abs(rng.standard_t(2, m)).astype(np.float32) + np.float32(1e-6)
        dtype = np.float64 if trial % 5 == 4 else np.float32
        v = v.astype(dtype)
        allv = np.concatenate(WORLD.allgather(v))
        for k in (1, 3, max(1, allv.size // 2), allv.size, allv.size + 5):
            got = _global_kth(comm, v, k)
            if allv.size == 0:
                want = 0.0
            else:
                want = float(np.sort(allv)[::-1][min(k, allv.size) - 1])
            check(got == want, f"global k-th: k={k} m={allv.size} got {got} want {want}")


def case_boundaries(rng):
    comm = MPICommunicator(WORLD)
    n, density = 1 << 16, 0.01
    # large values, hence the selections, cluster at the end of the index space
    ramp = (1.0 + 30.0 * (np.arange(n) / n) ** 6).astype(np.float32)
    for rule, it in itertools.product(("contributor", "owner"), range(12)):
        if it == 0:
            algo = OkTopk(comm, tau=4, tau_prime=4, residuals=rule)
        x = (rng.standard_normal(n).astype(np.float32) * ramp)
        out = algo(x, name="t", density=density)
        check(identical(WORLD, out), "outputs differ across ranks")
        st = algo.state("t")
        b = st.boundaries
        check(len(set(WORLD.allgather(tuple(b)))) == 1, f"boundaries differ across ranks: {b}")
        check(b[0] == 0 and b[-1] == n and all(u <= v for u, v in zip(b, b[1:])),
              f"boundaries not a partition of [0, n): {b}")
        if P > 1 and algo.last_stats.get("boundaries_refreshed"):
            # region load = what its owner reduces: received + its own selections.
            # Under "owner" its own selections are mostly sums it kept, never sent:
            # the load is what it receives, balanced less tightly (up to 1.33x the
            # mean measured at P = 8, a mean 2/3 of the paper rule's), hence its band
            recv = algo.last_stats["reduce_recv"]
            if rule == "owner":
                load, (hi, lo) = np.array(recv, dtype=float), (1.5, 0.5)
            else:
                load = np.array(WORLD.allgather(recv[RANK] + algo.last_stats["own"]), dtype=float)
                hi, lo = 1.25, 0.75
            mean = load.mean()
            check(load.max() <= hi * mean + 20 and load.min() >= lo * mean - 20,
                  f"{rule}: regions unbalanced at refresh (it {it}): loads {load.tolist()}")
            # equal-length regions would put most of the selections in the last one
            sel = np.flatnonzero(np.abs(x) >= kernels.kth_magnitude(x, st.k))
            eq = np.bincount(np.searchsorted(kernels.region_bounds(n, P)[1:-1], sel, "right"),
                             minlength=P)
            if RANK == 0 and P >= 3:
                check(eq.max() > 1.5 * eq.mean(), "test data not skewed enough to mean anything")


def case_exact(rng):
    """Exact wherever no reduce quota binds.  The data are planted so that none
    does, whatever the ranks' supports: every rank's k = P c largest values
    fall c to each of P equal regions and include each region's first index,
    so the boundaries (tau = 1) are the regions' starts, every rank sends
    c(P-1) = Q entries and every owner receives Q.  Each call's planted values
    are 1000x the last's, so what waits in the residuals is never selected."""
    comm = MPICommunicator(WORLD)
    for n, k0 in ((1 << 15, 328), (5000, 250)):
        c = max(1, k0 // P)
        k = c * P
        density = k / n
        check(kernels.k_from_density(n, density) == k, "test setup: k")
        starts = [j * n // P for j in range(P)] + [n]
        algo = OkTopk(comm, tau=1, tau_prime=1)
        for it in range(6):
            x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
            for j in range(P):
                lo, hi = starts[j], starts[j + 1]
                planted = np.concatenate([[lo], lo + 1 + rng.choice(hi - lo - 1, c - 1,
                                                                    replace=False)])
                x[planted] = (rng.uniform(1, 2, c) * rng.choice([-1, 1], c)
                              * 10.0 ** (3 * it)).astype(np.float32)
            st = algo.states.get("t")
            acc = x + (st.residual if st is not None else 0)
            local = kernels.topk_indices(acc, k)
            contrib = np.zeros(n)
            contrib[local] = acc[local]
            U = sum64(contrib)
            want = kernels.topk_indices(U, k)
            out = algo(x, name="t", density=density)
            stats = algo.last_stats
            check(algo.state("t").boundaries == starts,
                  f"exact n={n} it {it}: test setup: boundaries {algo.state('t').boundaries}")
            check(stats["own"] + stats["reduce_sent"][RANK] == k and stats["G"] == k,
                  f"exact n={n} it {it}: test setup: a quota or the budget bound")
            got = np.flatnonzero(out)
            check(np.array_equal(got, np.sort(want)),
                  f"exact n={n} it {it}: support differs from the top-k of the summed "
                  f"local top-k ({np.setdiff1d(want, got).size} missing)")
            check(np.allclose(out[want], U[want], rtol=1e-5, atol=1e-6),
                  f"exact n={n} it {it}: values are not the sums of the local top-k values")


def case_reduce_cap(rng):
    """Default quota: no rank sends or receives more than the fair share
    floor(k(P-1)/P) entries in the reduce step, on skewed data too, and what
    the quota holds back stays in the residuals (conservation)."""
    comm = MPICommunicator(WORLD)
    n, density = 20000, 0.02
    algo = OkTopk(comm, tau=64, tau_prime=4)
    k = kernels.k_from_density(n, density)
    share = max(1, (k * (P - 1)) // P)
    total_in = np.zeros(n)
    total_out = np.zeros(n)
    for it in range(10):
        x = rng.standard_t(2, n).astype(np.float32)
        x[: n // 8] *= 1 + it      # drifting hot region: boundaries go stale
        total_in += sum64(x.astype(np.float64))
        out = algo(x, name="t", density=density)
        total_out += out
        stats = algo.last_stats
        check(max(stats["reduce_sent"]) <= share and max(stats["reduce_recv"]) <= share,
              f"call {it}: reduce step above the fair share {share}: "
              f"sent {stats['reduce_sent']} recv {stats['reduce_recv']}")
    res = sum64(algo.states["t"].residual.astype(np.float64))
    check(np.allclose(total_out + res, total_in, rtol=1e-4, atol=1e-3),
          "outputs + residuals != inputs with the default reduce quota")


def case_refresh(rng):
    comm = MPICommunicator(WORLD)
    n, density, tp = 20000, 0.01, 4
    algo = OkTopk(comm, tau=64, tau_prime=tp)
    k = kernels.k_from_density(n, density)
    for it in range(13):
        x = rng.standard_t(2, n).astype(np.float32)
        st = algo.states.get("t")
        acc = x + (st.residual if st is not None else 0)
        exact = kernels.kth_magnitude(acc, k)
        algo(x, name="t", density=density)
        stats = algo.last_stats
        searched = "control:global-threshold" in algo.last_traffic.phases or P == 1
        if it % tp == 0:
            check(stats["refresh"], f"no refresh at call {it}")
            check(stats["local_threshold"] == exact,
                  f"call {it}: local threshold {stats['local_threshold']} != exact {exact}")
            if P > 1:
                check(searched, f"call {it}: global threshold not searched at a refresh")
        else:
            check(not stats["refresh"], f"refresh at call {it}, tau'={tp}")
            if P > 1:
                check("control:global-threshold" not in algo.last_traffic.phases,
                      f"call {it}: global threshold searched between refreshes")


def _run_bounded(algo, xs_fn, iters, density, n, label, budget=None):
    """Run ``iters`` calls; check identical outputs, the payload and total
    bounds, the reduce quota, conservation, and (``budget``) that every call's
    total bytes stay within budget x 2k(P-1)/P words.  Returns the largest
    owner load per call and the global entries kept per call."""
    k = kernels.k_from_density(n, density)
    words = 6 * k * (P - 1) / P
    Q, _ = _budgets(P, k)
    cum_in = np.zeros(n)
    cum_out = np.zeros(n)
    cum_abs = np.zeros(n)
    owner_max, kept = [], []
    for it in range(iters):
        x = xs_fn(it)
        out = algo(x, name="t", density=density)
        check(identical(WORLD, out), f"{label}: outputs differ across ranks (it {it})")
        s, r = payload(algo.last_traffic)
        if k >= P:
            check(s <= 4 * words and r <= 4 * words,
                  f"{label} it {it}: payload sent {s} recv {r} B > "
                  f"6k(P-1)/P words = {4 * words:.0f} B")
        tot = algo.last_traffic.total()
        bound = OkTopk.traffic_bound(n, P, k, 4)
        check(tot.bytes_sent <= bound and tot.bytes_recv <= bound,
              f"{label} it {it}: total {tot.bytes_sent}/{tot.bytes_recv} > traffic_bound {bound}")
        if budget is not None:
            cap = budget * 2 * k * (P - 1) / P * 4
            check(tot.bytes_sent <= cap and tot.bytes_recv <= cap,
                  f"{label} it {it}: total {tot.bytes_sent}/{tot.bytes_recv} B > "
                  f"budget {budget} x lower bound = {cap:.0f} B")
        kept.append(int(np.count_nonzero(out)))
        owner_max.append(max(algo.last_stats["reduce_recv"]))
        check(owner_max[-1] <= Q, f"{label} it {it}: an owner received {owner_max[-1]} > Q={Q}")
        cum_in += x
        cum_out += out
        cum_abs += np.abs(x)
    lhs = cum_out + sum64(algo.state("t").residual)
    rhs = sum64(cum_in)
    tol = 16 * iters * P * np.finfo(np.float32).eps * sum64(cum_abs) + 1e-30
    check(bool((np.abs(lhs - rhs) <= tol).all()), f"{label}: conservation broken")
    return owner_max, kept


def case_hot(rng):
    comm = MPICommunicator(WORLD)
    for n, density in ((1 << 16, 0.01), (1 << 14, 0.05), (4103, 0.001)):
        algo = OkTopk(comm)
        lo, hi = n // 3, n // 3 + max(1, n // 10)

        def xs(it):
            x = rng.standard_normal(n).astype(np.float32) * 1e-3
            x[lo:hi] = rng.standard_normal(hi - lo) * 10
            return x

        _run_bounded(algo, xs, 10, density, n, f"hot n={n}")


def case_stale(rng):
    comm = MPICommunicator(WORLD)
    n, density = 1 << 16, 0.01
    algo = OkTopk(comm, tau=10**6, tau_prime=3)
    width = n // 20

    def xs(it):
        x = rng.standard_normal(n).astype(np.float32) * 1e-3
        lo = 0 if it == 0 else n - width      # boundaries fitted to [0, width), then it moves
        x[lo:lo + width] = rng.standard_normal(width) * 10
        return x

    owner_max, _ = _run_bounded(algo, xs, 8, density, n, "stale")
    if P > 1:
        # the jump sends everyone's values to the last region's owner: the quota must
        # bite on that call (the imbalance then refreshes the boundaries)
        Q = _budgets(P, kernels.k_from_density(n, density))[0]
        check(max(owner_max[1:]) == Q, f"quota never reached (Q={Q}): {owner_max}")


def case_budget(rng):
    """budget = 2.0: no call moves more than twice the lower bound, control
    included, on heavy-tailed drifting data and on a hot region; on the hot
    region the budget must cut the global entries below k (so it binds)."""
    comm = MPICommunicator(WORLD)
    n, density = 1 << 16, 0.01
    k = kernels.k_from_density(n, density)
    shared = np.random.default_rng(12345)          # the drifting signal, same on every rank
    signal = shared.standard_t(2, n) * np.exp(shared.normal(0, 1, 16)).repeat(n // 16)

    def drifting(it):
        signal[:] = 0.97 * signal + 0.24 * shared.standard_t(2, n)
        return (0.7 * signal + rng.standard_t(2, n)).astype(np.float32)

    lo, hi = n // 3, n // 3 + n // 10

    def hot(it):
        x = rng.standard_normal(n).astype(np.float32) * 1e-3
        x[lo:hi] = rng.standard_normal(hi - lo) * 10
        return x

    for label, xs in (("drifting", drifting), ("hot", hot)):
        algo = OkTopk(comm, budget=2.0)
        _, kept = _run_bounded(algo, xs, 24, density, n, f"budget {label}", budget=2.0)
        if P > 1 and label == "hot":
            check(min(kept[1:]) < k, f"budget never bound on the hot region: kept {kept}")


def case_residuals(rng):
    """Both residual rules.  "owner" (not the default, which the other cases
    run): bounds, identical outputs and conservation on heavy-tailed and hot
    data.  Then, on a first call, a value a rank sent to another region's
    owner but the global result did not take has left the sender's residual
    under "owner" (the owner keeps the sum) and not under "contributor"."""
    comm = MPICommunicator(WORLD)
    n, density = 1 << 16, 0.01
    lo, hi = n // 3, n // 3 + n // 10

    def hot(it):
        x = rng.standard_t(2, n).astype(np.float32) * 1e-3
        x[lo:hi] = rng.standard_normal(hi - lo) * 10
        return x

    for label, xs in (("heavy", lambda it: rng.standard_t(2, n).astype(np.float32)),
                      ("hot", hot)):
        _run_bounded(OkTopk(comm, residuals="owner"), xs, 12, density, n, f"owner {label}")
    if P > 1:
        for rule in ("owner", "contributor"):
            algo = OkTopk(comm, residuals=rule, tau_prime=1)
            x = rng.standard_t(2, n).astype(np.float32)
            out = algo(x.copy(), name="u", density=density)
            st = algo.state("u")
            elsewhere = np.ones(n, bool)
            elsewhere[st.boundaries[RANK]:st.boundaries[RANK + 1]] = False
            gone = int((elsewhere & (st.residual == 0) & (x != 0) & (out == 0)).sum())
            gone = WORLD.allreduce(gone)
            check((gone > 0) == (rule == "owner"),
                  f"residuals={rule}: {gone} values sent but not in the result left the senders")


def case_adaptive(rng):
    """adaptive_step=True: bounds, identical outputs and conservation over
    many reused-threshold calls (tau' large) on a small k, where error
    feedback builds the steep walls the option is for; the global
    threshold's control state stays identical on every rank."""
    comm = MPICommunicator(WORLD)
    n, density = 1 << 14, 0.002
    algo = OkTopk(comm, adaptive_step=True, tau_prime=1000)
    _run_bounded(algo, lambda it: rng.standard_t(3, n).astype(np.float32), 40, density, n,
                 "adaptive")
    st = algo.state("t")
    check(identical(WORLD, np.array([st.global_threshold, *(st.global_control or (0.0, 0))])),
          "adaptive: global threshold or its control state differ across ranks")


def case_coded(rng):
    """code_indices (delta-coded host indices) changes bytes only: outputs and
    residuals bitwise equal to raw indices' on the same data, under both
    residual rules, with fewer payload bytes from every rank; clustered data
    (small gaps) and widely spread data (escapes, raw fallback) alike."""
    comm = MPICommunicator(WORLD)
    n = 1 << 15
    for rule in ("contributor", "owner"):
        coded = OkTopk(comm, residuals=rule, tau=4, tau_prime=3)
        raw = OkTopk(comm, residuals=rule, tau=4, tau_prime=3, code_indices=False)
        fewer = True
        for it in range(24):
            x = rng.standard_t(2, n).astype(np.float32)
            if it % 3 == 0:                      # spread: few entries far apart
                x *= 1e-3
                x[rng.choice(n, 8, replace=False)] = 100.0
            density = 0.01 if it % 2 else 0.002
            a = coded(x, name="t", density=density)
            b = raw(x, name="t", density=density)
            check(np.array_equal(a.view(np.uint32), b.view(np.uint32)),
                  f"coded ({rule}): output differs from raw indices' at call {it}")
            fewer &= all(c <= r for c, r in zip(payload(coded.last_traffic),
                                                payload(raw.last_traffic)))
        check(np.array_equal(coded.state("t").residual, raw.state("t").residual),
              f"coded ({rule}): residual differs from raw indices'")
        check(fewer, f"coded ({rule}): a call moved more payload than with raw indices")


CASES = {"global-kth": case_global_kth, "boundaries": case_boundaries, "exact": case_exact, "reduce-cap": case_reduce_cap,
         "refresh": case_refresh,
         "hot": case_hot, "stale": case_stale, "budget": case_budget,
         "residuals": case_residuals, "adaptive": case_adaptive, "coded": case_coded}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = int(np.random.SeedSequence().entropy % 2**32)
    seed = WORLD.bcast(args.seed, 0)
    current = ""
    try:
        for name in args.cases.split(","):
            current = name
            CASES[name](np.random.default_rng([seed, RANK]))
            if RANK == 0:
                print(f"  {name} ok", flush=True)
    except Exception:
        return abort_job(WORLD, current, seed)
    if RANK == 0:
        print(f"oktopk checks P={P}: all passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

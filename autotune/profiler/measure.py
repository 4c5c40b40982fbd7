"""The measurement campaigns: alpha/beta of the primitives, the registered
algorithms' runs, the local compute kernels.  Every timing goes through
``collectives.timeit`` / ``timeit_interleaved`` (warm-up, barrier, slowest rank)."""
from __future__ import annotations

import time

import numpy as np

import kernels
from collectives import ALGORITHMS, pause, timeit, timeit_interleaved

from ..profile import PRIMITIVES, concurrency, model_time, segment_at
from .common import _agree_max, _control
from .fits import fit_compute, fit_primitive, heldout_mask

_KINDS = ("select", "comm", "reduce", "control", "other")
_GPU_COMPUTE_EXTRA = (24, 26)  # extra log2 sizes of the compute sweep on a GPU
# The sparse merges price k or k * P entries (a few million at most): not timed above this.
_MERGE_MAX_LOG2N = 22
_GPU_ALGO_EXTRA = (22, 24)     # extra log2 sizes of the algorithm runs on a GPU
_BATCH_TARGET_S = 5e-3  # small messages are timed in batches of about this long



def gradient_like(n: int, rng: np.random.Generator, base: np.ndarray | None = None) -> np.ndarray:
    """Heavy-tailed, layer-structured values like a gradient (float32).

    Student-t (2.5 dof) values whose scale changes per block of about n/8
    entries ("layers" of different gradient magnitude); ``base`` (shared by
    all ranks) makes ranks' large entries partly coincide, as they do in
    data-parallel training.
    """
    blocks = 8
    scale = np.repeat(10.0 ** np.linspace(-1.5, 0.0, blocks), -(-n // blocks))[:n]
    x = rng.standard_t(2.5, n) * scale
    if base is not None:
        x = 0.5 * x + base
    return x.astype(np.float32)



# -- 1. primitives -----------------------------------------------------------------
def _primitive_call(comm, name: str, m: int, xp):
    """A zero-argument callable doing one ``name`` with m bytes (model's m)."""
    P, r = comm.size, comm.rank
    if name == "p2p":
        peer = r ^ 1
        s, d = xp.zeros(m, dtype=np.uint8), xp.empty(m, dtype=np.uint8)
        if peer >= P:
            return lambda: None
        return lambda: comm.sendrecv(s, peer, d, peer)
    if name == "allgather":
        s = xp.zeros(m, dtype=np.uint8)
        return lambda: comm.allgather(s)
    if name == "allgatherv":
        # counts vary around m (mean m): ranks select different numbers of values
        counts = [max(1, round(m * (0.5 + j / (P - 1)))) for j in range(P)] if P > 1 else [m]
        s = xp.zeros(counts[r], dtype=np.uint8)
        return lambda: comm.allgatherv(s, counts)
    if name == "alltoallv":
        s = xp.zeros(m * P, dtype=np.uint8)
        parts = [s[j * m:(j + 1) * m] for j in range(P)]
        counts = [m] * P
        return lambda: comm.alltoallv(parts, counts)
    if name == "allreduce":
        s = xp.zeros(max(1, m // 4), dtype=np.float32)
        return lambda: comm.allreduce(s)
    if name == "bcast":
        s = xp.zeros(m, dtype=np.uint8)
        return lambda: comm.bcast(s, 0)
    raise ValueError(name)


def _calibrate(comm, fn, *, warmup: int, repeat: int, budget_s: float, sync=None):
    """Warm ``fn`` up and decide, identically on every rank, how many calls one
    repeat batches (so a repeat lasts about 5 ms and the barrier's exit skew
    stays small against it) and how many repeats fit ``budget_s`` (>= 3)."""
    # the warm-up calls, timed (each rank its own); the fastest decides
    one = timeit(fn, comm=comm, warmup=0, repeat=max(1, warmup), sync=sync, slowest=False)
    t1 = _agree_max(comm, float(np.min(one)))
    batch = int(min(1000, max(1, _BATCH_TARGET_S // max(t1, 1e-7))))
    reps = int(max(3, min(repeat, budget_s // max(t1 * batch, 1e-9))))
    return batch, reps


def time_interleaved(comm, fns, *, warmup: int, repeat: int, budget_s: float, sync=None):
    """Time several callables (one per message size) with their repeats
    interleaved: round r times repeat r of every size in turn.

    On a shared, busy host the load changes during a sweep; timing all sizes
    of a repeat close together makes every size see the same mixture of
    load, so the medians form a curve the model can describe instead of a
    curve with steps where a neighbour's job started.  Each size's batch and
    repeats come from :func:`_calibrate`.  Returns one array of seconds per
    call per size.
    """
    plans = [_calibrate(comm, fn, warmup=warmup, repeat=repeat, budget_s=budget_s, sync=sync)
             for fn in fns]
    reps = [r for _, r in plans]
    times = timeit_interleaved(fns, comm=comm, warmup=0, repeat=reps,
                               batch=[b for b, _ in plans], rotate=False, sync=sync)
    return [row[:r] for row, r in zip(times, reps)]


def primitive_sizes(plan, max_bytes: int) -> list[int]:
    """Message sizes of the alpha/beta sweep: the plan's powers of two up to
    ``max_bytes`` and, with ``half_octaves``, sizes near 2^(e + 1/2) between them
    from 16 bytes up (multiples of 4: whole float32 values).  Collectives
    switch protocol or algorithm at sizes in between powers of two; sampling
    twice per octave places those steps twice as precisely."""
    exps = [e for e in plan["log2_bytes"] if (1 << e) <= max_bytes]
    sizes = {1 << e for e in exps}
    if plan.get("half_octaves"):
        sizes |= {4 * round(2 ** (e + 0.5) / 4) for e in exps[:-1] if e >= 4}
    return sorted(sizes)


def measure_primitives(comm, plan, *, max_bytes: int, xp, sync, progress, shared_medium: bool):
    sizes = primitive_sizes(plan, max_bytes)
    held = heldout_mask(len(sizes))
    out = {}
    for name in PRIMITIVES:
        fns = [_primitive_call(comm, name, m, xp) for m in sizes]
        times = time_interleaved(comm, fns, warmup=plan["prim_warmup"],
                                 repeat=plan["prim_repeat"], budget_s=plan["prim_budget_s"],
                                 sync=sync)
        samples = [{"bytes": m, "P": comm.size, "times_s": [float(v) for v in t],
                    "heldout": bool(h)} for m, h, t in zip(sizes, held, times)]
        progress.step(f"{name}", len(sizes))
        out[name] = fit_primitive(name, samples, shared_medium)
    return out


# -- 1b. a shaped link's burst ---------------------------------------------------------
def measure_burst(comm, *, xp, p2p: dict | None = None, attempts: int = 3,
                  retry_wait_s: float = 1.0, **kw) -> dict:
    """The token bucket of a shaped link (:func:`_burst_once`), measured again,
    up to ``attempts`` times ``retry_wait_s`` apart, while the measurement was
    disturbed (its ``disturbed`` key): a busy host makes the exchange CPU-bound,
    fresh or drained, and hides the bucket.  The last measurement stands (with
    ``disturbed`` if it was)."""
    for attempt in range(attempts):
        burst = _burst_once(comm, xp=xp, p2p=p2p, **kw)
        if not burst.get("disturbed") or attempt == attempts - 1:
            return burst
        time.sleep(retry_wait_s)


def burst_disturbed(burst: dict, p2p: dict, P: int) -> bool:
    """Whether the burst's drained exchange took over 1.5x, and over 1 ms more
    than, what the ``p2p`` primitive's record predicts for it (the same
    exchange: every rank pair at once): then the host, not the medium, set the
    pace (on the 2-core VM beside one busy-loop process: 16 ms for 1 MiB at
    1 Gbit/s where the link takes 8.4).  Shared memory's sub-millisecond
    differences do not count."""
    if not burst or not burst.get("link_bytes"):
        return False
    m = burst["link_bytes"] / max(concurrency("p2p", P), 1.0)
    expected = model_time("p2p", *segment_at(p2p, m), m, 2)
    return burst["drained_s"] > 1.5 * expected and burst["drained_s"] - expected > 1e-3


def _burst_once(comm, *, xp, p2p: dict | None = None, link_bytes: int = 1 << 20,
                max_link_bytes: int = 64 << 20, pause_s: float = 0.05, repeat: int = 5) -> dict:
    """The token bucket of a shaped link (e.g. ``tc tbf ... burst 1mb``): how
    many bytes a call passes at the medium's own speed when it starts after an
    idle pause, where back to back calls find the bucket empty.

    All rank pairs exchange m bytes at once (the ``p2p`` primitive), putting
    ``link_bytes`` on the host's one medium, ``repeat`` times each way,
    alternated: right after the same exchange (drained, ``t_d``) and after
    ``pause_s`` asleep (fresh, ``t_f``).  Then the link's s/byte is t_d /
    link_bytes and the bucket holds link_bytes (1 - t_f / t_d) bytes; none
    unless the pause saves at least 15% (shared memory: a pause saves nothing).
    A bucket that passes most of the exchange may be bigger: the exchange and
    the pause double until it no longer does, up to ``max_link_bytes``.
    Returns {bytes, link_s_per_byte, drained_s, fresh_s, pause_s, link_bytes},
    with ``disturbed: True`` where a busy host showed: a bucket that passed most
    of an exchange passing less than half as much of one twice as big (then the
    smaller exchange's figures stand), or a drained exchange far slower than the
    ``p2p`` record says (:func:`burst_disturbed`).
    """
    pairs = concurrency("p2p", comm.size)  # link bytes per byte each rank sends
    if pairs <= 0:
        return {}
    out = None
    while True:
        m = max(1, int(link_bytes // pairs))
        fn = _primitive_call(comm, "p2p", m, xp)
        fn()
        drained, fresh = [], []
        for _ in range(repeat):
            drained.append(float(timeit(fn, comm=comm, warmup=1, repeat=1)[0]))
            fresh.append(float(timeit(fn, comm=comm, warmup=0, repeat=1,
                                      between=pause(pause_s))[0]))
        t_d, t_f = float(np.median(drained)), float(np.median(fresh))
        total = m * pairs
        credit = total * (1.0 - t_f / t_d) if t_f < 0.85 * t_d else 0.0
        if out is not None and credit < 0.5 * out["bytes"]:  # a bucket does not shrink
            return dict(out, disturbed=True)
        out = {"bytes": int(credit), "link_s_per_byte": t_d / total, "drained_s": t_d,
               "fresh_s": t_f, "pause_s": pause_s, "link_bytes": int(total)}
        if credit < 0.7 * total or 2 * total > max_link_bytes:
            break
        link_bytes, pause_s = 2 * total, max(pause_s, 2 * t_d)
    if p2p is not None and burst_disturbed(out, p2p, comm.size):
        out["disturbed"] = True
    return out


def idle_gap(burst: dict | None) -> float:
    """Seconds of pause that refill ``burst``'s bucket (:func:`measure_burst`) with
    a margin: what the algorithm runs wait before each timed call, so every call
    starts with the link idle, as a training step's first allreduce does; 0
    without a bucket."""
    if not burst or not burst.get("bytes"):
        return 0.0
    return 1.25 * burst["bytes"] * burst["link_s_per_byte"] + 1e-3


# -- 2. algorithm runs ---------------------------------------------------------------
def process_counts(P: int, odd: bool = False) -> list[int]:
    """2, 4, 8, ... below P, then P itself; with ``odd`` also 3, 6, 12, ... below P.

    Non-powers of two take other code paths (Rabenseifner's and gTopk's extra
    steps for the ranks beyond the largest power of two, the native
    allreduce's algorithm switches), which the powers of two say nothing about.
    """
    ps, p = set(), 2
    while p < P:
        ps.add(p)
        if odd and 3 * p // 2 < P:
            ps.add(3 * p // 2)
        p *= 2
    return sorted(ps) + [P]


def algorithm_sizes(plan, name: str) -> list[int]:
    """log2 n of the runs of algorithm ``name``: the plan's ``algo_log2n``, and for a
    lossless one (dense, the native allreduce) also ``lossless_log2n``: they are
    cheap at any size, and where the vector leaves the caches the native
    allreduce and Rabenseifner part ways (up to 2x on the 2-core CPU machine,
    BENCHMARKS)."""
    extra = [] if ALGORITHMS[name].lossy else plan.get("lossless_log2n", [])
    return sorted(set(plan["algo_log2n"]) | set(extra))


def _time_algorithm(comm, cls, n: int, density, pool, plan, sync, gap_s: float = 0.0):
    algo = cls(comm, check_finite=False)
    traffics = []
    i = [0]

    def call():
        x = pool[i[0] % len(pool)]
        i[0] += 1
        algo(x, name="profile", density=density)
        traffics.append(algo.last_traffic)

    warm = plan["algo_warmup"]
    for _ in range(warm):  # error feedback and thresholds reach steady state
        call()
    between = pause(gap_s)
    t1 = float(timeit(call, comm=comm, warmup=0, repeat=1, sync=sync, between=between)[0])
    reps = int(max(2, min(plan["algo_repeat"], plan["algo_budget_s"] // max(t1, 1e-9))))
    traffics.clear()
    times = timeit(call, comm=comm, warmup=0, repeat=reps, sync=sync, between=between)
    sent = max(t.bytes_sent() for t in traffics)
    sent = int(_agree_max(comm, float(sent)))
    mean = np.zeros(len(_KINDS))
    for t in traffics:
        kinds = t.by_kind()
        for j, k in enumerate(_KINDS):
            mean[j] += kinds.get(k, 0.0) / len(traffics)
    if comm.size > 1:
        mean = comm.control_allreduce(mean, "max")
    return {
        "algorithm": cls.name, "n": n, "P": comm.size, "density": density,
        "times_s": [float(v) for v in times], "median_s": float(np.median(times)),
        "bytes_sent_max": sent,
        "split_s": {k: float(v) for k, v in zip(_KINDS, mean) if v > 0},
    }


def measure_algorithms(world, plan, *, names, xp, sync, progress, seed: int = 0,
                       gap_s: float = 0.0):
    rows, skipped = [], []
    sizes = sorted({e for name in names for e in algorithm_sizes(plan, name)})
    for p in process_counts(world.size, plan.get("odd_process_counts", False)):
        sub = world if p == world.size else world.split(0 if world.rank < p else 1, world.rank)
        if world.rank < p:
            for e in sizes:
                n = 1 << e
                shared = np.random.default_rng([seed, n])
                base = gradient_like(n, shared)
                rng = np.random.default_rng([seed, n, sub.rank])
                pool = [xp.asarray(gradient_like(n, rng, base)) for _ in range(3)]
                for name in (a for a in names if e in algorithm_sizes(plan, a)):
                    cls = ALGORITHMS[name]
                    for d in (plan["densities"] if cls.lossy else [None]):
                        try:
                            rows.append(_time_algorithm(sub, cls, n, d, pool, plan, sync,
                                                        gap_s))
                        except Exception as exc:  # a new algorithm may refuse a case
                            skipped.append({"algorithm": name, "n": n, "P": p, "density": d,
                                            "reason": f"{type(exc).__name__}: {exc}"[:300]})
                        progress.step(f"P={p} {name} n=2^{e}")
        _control(world).idle_barrier()
    return rows, skipped


def count_algorithm_steps(P: int, plan, names) -> int:
    per_p = sum((len(plan["densities"]) if ALGORITHMS[a].lossy else 1)
                * len(algorithm_sizes(plan, a)) for a in names)
    return len(process_counts(P, plan.get("odd_process_counts", False))) * per_p


# -- 3. local compute ----------------------------------------------------------------
def compute_sizes(plan, device: str) -> list[float]:
    """The log2 sizes the kernels are timed at (:func:`compute_elems` gives the elements)."""
    sizes = list(plan["compute_log2n"])
    if device == "gpu":
        # per-element costs on a GPU only show above a few million elements (below,
        # launch and synchronisation dominate): extend the sweep so the slope is
        # measured where the collectives run, not extrapolated from 2^20
        sizes += [e for e in _GPU_COMPUTE_EXTRA if e > max(sizes)]
    return sizes


def compute_elems(e: float) -> int:
    """The elements a kernel is timed on at log2 size ``e`` (a multiple of 64, which
    the merge's four COO sets divide; 2^e itself from 2^6 up)."""
    return int(64 * round(2 ** e / 64))


def _merges_at(e: float, device: str) -> bool:
    return device == "gpu" or e <= _MERGE_MAX_LOG2N


def count_compute_steps(plan, device: str) -> int:
    return sum(3 + 2 * _merges_at(e, device) for e in compute_sizes(plan, device))


def measure_compute(comm, plan, *, device: str, xp, sync, progress, density: float = 0.01):
    """Rank 0 times the kernels alone; returns the ``compute`` record (rank 0)."""
    samples = []
    if comm.rank == 0:
        rng = np.random.default_rng(1)
        rep = plan["compute_repeat"]
        for e in compute_sizes(plan, device):
            n = compute_elems(e)
            x = xp.asarray(gradient_like(n, rng))
            k = kernels.k_from_density(n, density)
            thr = kernels.kth_magnitude(x, k)
            y, acc = xp.asarray(gradient_like(n, rng)), xp.empty_like(x)
            cases = {
                "topk": (lambda: kernels.topk_select(x, k), n),
                "threshold": (lambda: kernels.threshold_select(x, thr), n),
                "stream": (lambda: xp.add(x, y, out=acc), n),
            }
            if _merges_at(e, device):
                parts = 4  # a reduction merges several ranks' COO sets
                m = n // parts
                # sorted, distinct indices over [0, 4n): one random slot per stride of 4*parts
                idx = [xp.asarray((np.arange(m, dtype=np.int64) * (4 * parts)
                                   + rng.integers(0, 4 * parts, m)).astype(np.int32))
                       for _ in range(parts)]
                val = [xp.asarray(rng.standard_normal(n // parts).astype(np.float32))
                       for _ in range(parts)]
                dense = xp.zeros(4 * n, dtype=np.float32)
                cat_i, cat_v = xp.concatenate(idx), xp.concatenate(val)
                cases["reduce"] = (lambda: kernels.coo_sum(idx, val, 4 * n), n)
                cases["scatter_add"] = (lambda: kernels.scatter_add(dense, cat_i, cat_v), n)
            for kernel, (fn, count) in cases.items():
                times = timeit(fn, warmup=1, repeat=rep, sync=sync)
                samples.append({"kernel": kernel, "n": count, "density": density
                                if kernel in ("topk", "threshold") else None,
                                "times_s": [float(v) for v in times]})
                progress.step(f"{kernel} n=2^{e}")
    _control(comm).idle_barrier()
    rec = {"device": device, "samples": samples,
           "units": {"topk": "per element of the dense input (density "
                             f"{density})", "threshold": "per element of the dense input",
                     "reduce": "per COO entry merged (coo_sum of 4 sets)",
                     "scatter_add": "per COO entry added into a dense vector",
                     "stream": "per element of acc = r + x (2 reads, 1 write: the "
                               "error-feedback and output passes' rate)"}}
    rec.update(fit_compute(samples))
    return rec

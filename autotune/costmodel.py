"""Alpha-beta cost model of every algorithm (the paper's Table 1, plus local compute).

A ``Machine`` holds, per primitive, a latency ``alpha`` (s) and an inverse
bandwidth ``beta`` (s/byte) fitted by the profiler with these shapes:

    p2p        t = a + b m
    allgather  t = a ceil(log2 P) + b m (P-1)           (m bytes per rank)
    alltoall   t = a (P-1) + b m (P-1)                  (m bytes to each peer)
    allreduce  t = 2a ceil(log2 P) + 2 b m (P-1)/P
    bcast      t = a ceil(log2 P) + b m ceil(log2 P)

where a profile with regime segments gives each message size the (a, b) of
the segment covering it, and local compute costs t = c0 + c1 * elements for exact top-k selection,
threshold selection and sparse reduction, with the (c0, c1) of the kernel's size regime
covering the call's elements (the caches, then DRAM: ``profile.Linear``).
``predict(algorithm, n, P, density)`` composes them into the algorithm's time per
call: every algorithm registered in ``collectives.ALGORITHMS`` states its own terms (its ``cost``,
written against ``collectives.Prices``, which ``Machine`` implements).

On a CPU profiled on one host, ranks share the host's cores: with P ranks on
C cores each rank's local compute (timed by the profiler on one rank alone)
runs max(1, P/C) times slower, and the shared-memory primitives (copies made
by the same cores, measured at the profile's P) scale by the ratio of that
factor at P and at the profile's P (``Machine.at``).  Without the core count
(profiles made before it was recorded), on GPUs and across hosts: no scaling.

One more term comes from the profile's algorithm runs: each implementation's
fixed cost per call, ``o0 + o1 (P-1)`` seconds (:func:`fit_terms`) -- the
Python, kernel-launch, host-synchronisation and small-message cost that Table 1's
alpha-beta terms leave out, fitted with the terms' weights over all the runs
(the smallest sizes, where the data terms vanish, pin it down); on a GPU it
dominates the sparse algorithms at small and medium n (docs/BENCHMARKS.md,
"Fixed cost per call").  Part of the model, it carries over to sizes and process
counts beyond the profile's runs, where the learned correction fades out.

How the terms grow with P is fitted too (:func:`fit_terms`), from the runs
a profile takes at several P (sub-communicators of the ranks it was launched
with: 2, 4, ... up to its P).  An algorithm's cost splits into its latency
(alpha), bandwidth (beta) and compute parts (:func:`components`); the time
is ``w_lat lat + w_bw bw + w_cmp cmp + o0 + o1 (P-1)`` with non-negative
weights per algorithm, pulled toward 1 (Table 1 as it stands) where the runs
say little.  With runs at three or more P an algorithm keeps its free weights
only if they predict a left-out P better than Table 1's weights with a fitted
fixed cost (``_fit_table``; where ``dense`` and ``mpi`` are near, that contest
keeps a shared host's ranks from the wrong one beyond the profile), except a
sparse (lossy) one whose dense passes are priced at the threshold scan's rate
(CPU profiles: ``Machine.stream`` is None): its compute weight corrects that
price, with which Table 1's weights put its calls at 2^22-2^24 up to 1.8x high
(docs/BENCHMARKS.md, "Cost-model error"), so it always keeps them.  Where ranks share one host, the bandwidth part
follows one of two laws, whichever predicts the profile's held-out process
counts better (:data:`LAWS`): ``cores`` (copies made by the cores the ranks
share: the contention factor above; for a message while only some ranks
send, such as the fold of Rabenseifner's extra ranks, that of the senders,
and likewise for elementwise work only some ranks do) or
``link`` (one shared link: beta x the bytes all ranks put on it,
:func:`autotune.profile.concurrency`).  Under the ``link`` law the runs also fit
one shape of the fixed cost for all algorithms, o1 = s o0 (:func:`_host_shape`:
the s whose fits predict a left-out P best, where that beats each algorithm's
own o0 and o1): every call's small messages queue on the one link with the other
ranks', whichever algorithm sends them, and each algorithm fits one fixed-cost
number instead of two (in shared memory it lost held-out sets: BENCHMARKS).

Runs at one P only (a profile launched with P = 2) cannot show how anything
grows with P, so the growth comes from the model's structure alone: the
bandwidth law from the profile's network label (shared memory, ``shm``:
``cores``; a network the host's ranks share, such as a shaped loopback:
``link``; the choice every CPU profile with runs at several P made), and, on
a host whose ranks share cores, the fixed cost per call is priced per peer,
``o1 (P-1)`` with o0 = 0 (the form every such profile's runs at several P
fitted: there a rank's fixed work competes with that of the other P-1 ranks),
where it would otherwise be a constant o0 that no process count changes.
Behind a link shaped by a token bucket (the profile's ``link_burst``), a call
that starts on an idle link passes the bucket's bytes at the medium's speed:
every call's bandwidth part loses bucket x the link's s/byte (``burst_s``;
the profile's runs start on an idle link too, so the fit sees the same calls),
and a primitive's size regimes, measured at the profile's P, are looked up by
the bytes a call puts on the link (``Machine._regime``).
:func:`heldout_errors` gives each algorithm's held-out error: in range (one
size left out) and per octave of P beyond the runs (one process count left
out, and the host's shape chosen again without it), the selector's error bars.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import partial

import math

import numpy as np

from collectives import ALGORITHMS

from .profile import Linear, Link, Profile, concurrency, model_time, wire_bytes

# Every sparse algorithm also streams the dense vector: the error-feedback sum
# acc = residual + x (2 reads, 1 write) and the dense output it returns (1 write).
_EF_STREAMS = 4


def _per_core(ranks: float, cores: int) -> float:
    """How many of ``ranks`` busy ranks share each of ``cores`` cores (at least 1):
    the slowdown of work they all do at once on one host."""
    return max(1.0, ranks / cores)


@dataclass(frozen=True)
class Machine:
    """Fitted machine parameters (see module docstring); a ``collectives.Prices``,
    on which each registered algorithm's ``cost`` prices its terms."""

    p2p: Link
    allgather: Link
    alltoall: Link
    allreduce: Link
    bcast: Link
    topk: Linear
    threshold: Linear
    reduce: Linear
    stream: Linear | None = None
    label: str = ""
    extras: dict = field(default_factory=dict, compare=False)
    overhead: dict = field(default_factory=dict)  # algorithm -> (o0, o1), see fit_terms
    # ranks sharing one host's cores (single-host CPU profiles): (cores, profile's P)
    contention: tuple[int, int] | None = None
    law: str = "cores"  # how a shared host's bandwidth term grows with P (LAWS)
    # behind a shared link, the fixed cost per call o1 = fixed_shape x o0 for every algorithm
    # (fit_terms, where runs at several P choose one), else None: each its own (o0, o1)
    fixed_shape: float | None = None
    ranks: int | None = None  # the P this machine is priced at (Machine.at), on a shared host
    cores: int | None = None  # and the cores those ranks share (Machine.at, the cores law)
    weights: dict = field(default_factory=dict)  # algorithm -> (w_lat, w_bw, w_cmp), fit_terms
    table1: frozenset = frozenset()  # algorithms whose weights fit_terms left at Table 1's
    # seconds of the drained link's time a call starting on an idle link passes in its
    # burst (a shaped link's token bucket: profile's link_burst bytes x its s/byte)
    burst_s: float = 0.0
    # on a shared host, the P the primitives were measured at (set by Machine.at): behind
    # a measured bucket a message's regime is looked up at the link bytes of that P (_regime)
    link_P0: int | None = None
    _at: dict = field(default_factory=dict, compare=False, repr=False)

    def at(self, P: int) -> "Machine":
        """This machine's terms for P ranks: compute scaled by max(1, P/cores),
        primitives by that factor over its value at the profile's P (see the
        module docstring); itself without ``contention``."""
        if self.contention is None:
            return self
        P = int(P)
        if P not in self._at:
            cores, P0 = self.contention
            f = _per_core(P, cores)
            g = f / _per_core(P0, cores)

            def beta(name: str) -> float:
                return g if self.law == "cores" else (max(concurrency(name, P), 1.0)
                                                      / max(concurrency(name, P0), 1.0))
            self._at[P] = self._scaled(lambda name: g, beta, f, ranks=P, cores=cores,
                                       link_P0=P0)
        return self._at[P]

    def _scaled(self, alpha, beta, compute: float, **fields) -> "Machine":
        """A copy with each primitive's alphas times ``alpha(name)``, betas times
        ``beta(name)`` (name as in :func:`autotune.profile.concurrency`), and the
        local kernels times ``compute``; without ``contention``."""
        def link(lk: Link, name: str) -> Link:
            a, b = alpha(name), beta(name)
            return Link(lk.alpha * a, lk.beta * b,
                        tuple((m, x * a, y * b) for m, x, y in lk.segments))

        def lin(c: Linear | None) -> Linear | None:
            return None if c is None else c.scaled(compute)

        return replace(
            self, p2p=link(self.p2p, "p2p"), allgather=link(self.allgather, "allgather"),
            alltoall=link(self.alltoall, "alltoallv"), allreduce=link(self.allreduce, "allreduce"),
            bcast=link(self.bcast, "bcast"), topk=lin(self.topk), threshold=lin(self.threshold),
            reduce=lin(self.reduce), stream=lin(self.stream), contention=None, _at={}, **fields)

    @classmethod
    def from_profile(cls, prof) -> "Machine":
        """Build from a profile's primitives and compute kernels (a
        :class:`autotune.profile.Profile`, or its JSON document as a dict).

        Missing primitives fall back to the point-to-point link (documented
        default: a collective no faster than its p2p decomposition).
        """
        prof = Profile.of(prof)

        def link(name, fallback=None):
            p = prof.primitive(name, None)
            if p is None:
                if fallback is None:
                    raise KeyError(f"profile has no {name!r} primitive")
                return fallback
            return Link(p.alpha, p.beta, p.segments)

        def lin(name):
            c = prof.compute(name)
            if c is None:
                raise KeyError(name)
            return c

        p2p = link("p2p")
        single_cpu_host = prof.device == "cpu" and len(prof.hosts) == 1
        lb = prof.link_burst
        cores = prof.cores
        bare = cls(
            p2p=p2p,
            allgather=link("allgather", link("allgatherv", p2p)),
            alltoall=link("alltoallv", link("alltoall", p2p)),
            allreduce=link("allreduce", p2p),
            bcast=link("bcast", p2p),
            topk=lin("topk"),
            threshold=lin("threshold"),
            reduce=lin("reduce"),
            # the measured stream rate prices the dense passes on GPUs only: on a CPU
            # it is timed on one rank, mostly in cache, and understates a pass when
            # ranks share cores (a 2-core shm profile with it picked Ok-Topk over
            # dense at P = 3, 6: worst regret 2.86 against 2.04 without; BENCHMARKS)
            stream=prof.compute("stream") if prof.compute_device == "gpu" else None,
            label=f"{prof.device}/{prof.network}",
            contention=((int(cores), prof.P) if single_cpu_host and cores else None),
            # the law until runs at several P choose one (fit_terms): shared memory's
            # copies are made by the cores; any other network of one host is a link
            law=("link" if single_cpu_host and cores and prof.network not in ("shm", "?")
                 else "cores"),
            burst_s=float(lb.get("bytes", 0) * lb.get("link_s_per_byte", 0.0)),
        )
        runs = prof.runs
        return fit_terms(bare, runs) if runs else bare

    def part(self, which: str) -> "Machine":
        """This machine with only one kind of term priced (``latency``: the alphas,
        ``bandwidth``: the betas, ``compute``: the local kernels; the rest cost 0):
        an algorithm's ``cost`` on it is that part of its time (:func:`components`)."""
        key = ("part", which)
        if key not in self._at:
            lat, bw, cmp = (float(which == w) for w in PARTS)
            self._at[key] = self._scaled(lambda name: lat, lambda name: bw, cmp)
        return self._at[key]

    # primitive times (each with the regime covering its message size), in the
    # shapes of autotune.profile's one table ----------------------------------------
    def _regime(self, link: Link, m: float, wire: float, wire0: float) -> tuple[float, float]:
        """(alpha, beta) of the regime covering a message of m bytes.  Behind a
        measured token bucket (``link`` law, ``burst_s`` > 0) a regime is a share
        of the bytes a call puts on the link (the bucket passes up to its burst
        at the medium's speed), so the message is looked up at the size that puts
        as many bytes on the link at the profile's P (``link_P0``); ``wire``,
        ``wire0``: the link's bytes per byte of m at this P and at that one.  (A
        1 Gbit/s profile at P = 4 priced Ok-Topk's 30 KB messages to each of 7
        peers at P = 8 in its regime below 32 KB, though 1.7 MB a call passes a
        1 MB bucket: 92 ms predicted, 150 measured; BENCHMARKS, "Selector regret".)"""
        if self.law == "link" and self.burst_s > 0 and self.link_P0 and wire0 > 0:
            m = m * wire / wire0
        return link.at(m)

    def _collective(self, name: str, link: Link, m: float, P: int) -> float:
        wire0 = wire_bytes(name, self.link_P0 or P)
        return model_time(name, *self._regime(link, m, wire_bytes(name, P), wire0), m, P)

    def t_p2p(self, m: float, active: int | None = None) -> float:
        """Beta was fitted with every rank sending at once; with ``active``
        senders it is scaled to their share of the link (``link`` law) or of
        the cores they share (``cores`` law, at ``Machine.at``'s P)."""
        senders = active if active is not None else wire_bytes("p2p", self.ranks or 2)
        a, b = self._regime(self.p2p, m, senders, wire_bytes("p2p", self.link_P0 or 2))
        if active is not None and self.law == "link" and self.ranks:
            b *= active / max(concurrency("p2p", self.ranks), 1.0)
        elif active is not None and self.law == "cores" and self.ranks and self.cores:
            b *= _per_core(active, self.cores) / _per_core(self.ranks, self.cores)
        return model_time("p2p", a, b, m, 2)

    def t_allgather(self, m: float, P: int) -> float:
        return self._collective("allgather", self.allgather, m, P)

    def t_alltoall(self, m: float, P: int) -> float:
        return self._collective("alltoallv", self.alltoall, m, P)

    def t_allreduce(self, m: float, P: int) -> float:
        return self._collective("allreduce", self.allreduce, m, P)

    def t_bcast(self, m: float, P: int) -> float:
        return self._collective("bcast", self.bcast, m, P)

    def dense_passes(self, n: float, streams: int = _EF_STREAMS,
                     active: int | None = None) -> float:
        """Elementwise work over n elements: ``streams`` full reads or writes,
        each costed at a third of a GPU profile's measured ``stream`` kernel
        (acc = r + x: two reads and a write).  CPU profiles, and GPU profiles
        made before that kernel was measured, cost each stream at the
        threshold scan's per-element rate (one read and a compare), which
        overstates it on a GPU, where the scan also compacts.  With ``active``
        ranks doing the work while the others wait (Rabenseifner's fold), on a
        host whose cores the ranks share, it runs at those ranks' share of the
        cores, as ``t_p2p`` prices their messages."""
        share = 1.0
        if active is not None and self.ranks and self.cores:
            share = _per_core(active, self.cores) / _per_core(self.ranks, self.cores)
        if self.stream is not None:  # measured: acc = r + x, 3 streams per element
            return share * streams / 3 * self.stream.rate(n) * max(n, 0.0)
        return share * streams * self.threshold.rate(n) * max(n, 0.0)


def _k(n: int, density: float) -> int:
    return min(n, max(1, int(round(density * n))))


def _cls(algorithm: str):
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(f"no cost model for algorithm {algorithm!r}; known: "
                         f"{sorted(ALGORITHMS)}") from None


def _terms(machine: Machine, algorithm: str, n: int, P: int, density: float,
           tau_prime: int = 32, tau: int = 64) -> float:
    """The registered algorithm's own ``cost`` terms, priced on ``machine`` at P
    (Table 1 as it stands: no fitted weights)."""
    n, P = int(n), int(P)
    return float(_cls(algorithm).cost(machine.at(P), n, P, _k(n, float(density)),
                                      tau_prime=tau_prime, tau=tau))


# The parts of an algorithm's cost the fit weighs separately (Machine.part).
PARTS = ("latency", "bandwidth", "compute")
# How a single host's bandwidth term grows with P (Machine.at): the cores' copies, or one link.
LAWS = ("cores", "link")
# Pull of each weight toward 1, against runs weighted by their relative error: where the
# runs cannot tell a part's weight (a part too small to show), Table 1 stands.
_PRIOR = 0.3


def components(machine: Machine, algorithm: str, n: int, P: int, density: float = 0.01,
               tau_prime: int = 32, tau: int = 64) -> np.ndarray:
    """Seconds of the algorithm's latency, bandwidth and compute parts at (n, P)
    (``PARTS``; they sum to its Table 1 terms), the bandwidth part less the
    link's burst (``Machine.burst_s``): a call starting on an idle shaped link
    passes that much of its drained time at the medium's own speed."""
    n, P = int(n), int(P)
    key = ("components", algorithm, n, P, float(density), tau_prime, tau)
    c = machine._at.get(key)
    if c is None:
        c = machine._at[key] = _parts(machine, algorithm, n, P, density, tau_prime, tau).copy()
        if machine.burst_s and P > 1:
            c[1] = max(0.0, c[1] - machine.burst_s)
    return c


def _parts(machine: Machine, algorithm: str, n: int, P: int, density: float,
           tau_prime: int = 32, tau: int = 64) -> np.ndarray:
    """:func:`components` before the burst's credit (cached)."""
    key = ("parts", algorithm, n, P, float(density), tau_prime, tau)
    c = machine._at.get(key)
    if c is None:
        cls, M, k = _cls(algorithm), machine.at(P), _k(n, float(density))
        c = machine._at[key] = np.array([float(cls.cost(M.part(w), n, P, k, tau_prime=tau_prime,
                                                        tau=tau)) for w in PARTS])
    return c


def burst_share(machine: Machine, algorithm: str, n: int, P: int, density: float = 0.01) -> float:
    """The share of a call's drained bandwidth time that the link's burst covers
    (``Machine.burst_s``): 1 for a call within it, less beyond; 0 without a burst."""
    if not machine.burst_s or P <= 1:
        return 0.0
    bw = float(_parts(machine, algorithm, int(n), int(P), density)[1])
    return 1.0 if bw <= machine.burst_s else machine.burst_s / bw


def _design(machine: Machine, runs) -> dict:
    """{algorithm: (X, t, P, n)}: per run its parts, 1 and P-1 (the fixed cost's
    columns), the measured median, the run's P and n."""
    by = defaultdict(list)
    for r in runs:
        if r["algorithm"] in ALGORITHMS and r.get("median_s", 0) > 0 and int(r["P"]) > 1:
            by[r["algorithm"]].append(r)
    out = {}
    for algo, rs in sorted(by.items()):
        X = np.array([[*components(machine, algo, r["n"], r["P"], r["density"] or 0.01),
                       1.0, int(r["P"]) - 1.0] for r in rs])
        out[algo] = (X, np.array([float(r["median_s"]) for r in rs]),
                     np.array([int(r["P"]) for r in rs]), np.array([int(r["n"]) for r in rs]))
    return out


def _fixed(X: np.ndarray, Ps, per_peer: bool, shape: float | None):
    """The fixed cost's design columns and the map from their coefficients to (o0, o1):
    with a shared host's ``shape`` one, 1 + shape (P-1); else o0 and o1 with runs at
    several P; with runs at one P, which cannot tell them apart, o1 where the fixed
    cost is priced per peer (``per_peer``, a shared host), else o0."""
    if shape is not None:
        return X[:, 3:4] + shape * X[:, 4:5], np.array([[1.0, shape]])
    cols = [3, 4] if len(set(Ps)) > 1 else [4 if per_peer else 3]
    return X[:, cols], np.eye(2)[[c - 3 for c in cols]]


def _fit(X: np.ndarray, t: np.ndarray, Ps, *, per_peer: bool = False,
         shape: float | None = None) -> np.ndarray:
    """Non-negative (w_lat, w_bw, w_cmp, o0, o1) minimising the runs' relative
    errors plus ``_PRIOR`` (w - 1) per weight; the fixed cost as :func:`_fixed` shapes it."""
    from scipy.optimize import nnls  # what sklearn's positive LinearRegression runs, minus its checks

    F, to_o = _fixed(X, Ps, per_peer, shape)
    D = np.hstack([X[:, :3], F])
    A = np.vstack([D / t[:, None], _PRIOR * np.eye(3, D.shape[1])])
    y = np.concatenate([np.ones(len(t)), np.full(3, _PRIOR)])
    c = nnls(A, y)[0]
    return np.concatenate([c[:3], c[3:] @ to_o])


def _fit_table(X: np.ndarray, t: np.ndarray, Ps, *, per_peer: bool = False,
               shape: float | None = None) -> np.ndarray:
    """Table 1's weights as they stand (1, 1, 1) and the non-negative fixed cost
    (o0, o1; :func:`_fixed`) that best fits the rest, by relative error."""
    from scipy.optimize import nnls

    F, to_o = _fixed(X, Ps, per_peer, shape)
    rest = t - X[:, :3].sum(axis=1)
    return np.concatenate([np.ones(3), nnls(F / t[:, None], rest / t)[0] @ to_o])


def _fits(machine: Machine) -> tuple:
    """(free fit, Table 1 fit) as ``machine`` prices the fixed cost: per peer where
    ranks share one host's cores (``contention``; see the module docstring), in the
    host's shape where it has one (``fixed_shape``)."""
    return _host_fits(machine.fixed_shape) if machine.contention is not None else (_fit, _fit_table)


def _host_fits(shape: float | None) -> tuple:
    """(free fit, Table 1 fit) on a shared host with fixed-cost ``shape`` (None: none)."""
    return (partial(_fit, per_peer=True, shape=shape),
            partial(_fit_table, per_peer=True, shape=shape))


def _log_err(coef, X, t) -> np.ndarray:
    return np.abs(np.log(np.maximum(X @ coef, 1e-12) / t))


def _size_folds(X, t, Ps, ns, fit=_fit) -> list:
    """Held-out |log(predicted / measured)| with each size left out in turn (in range;
    ``fit``: the model's fit)."""
    inside = []
    for n in sorted(set(ns)):
        keep = ns != n
        if keep.sum() >= 2:
            inside += list(_log_err(fit(X[keep], t[keep], Ps[keep]), X[~keep], t[~keep]))
    return inside


def _p_folds(X, t, Ps, fit=_fit, fold_fit=None) -> list:
    """(held-out |log(predicted / measured)|, octaves from the nearest P kept) with
    each P left out in turn (``fit``: the model's fit; ``fold_fit(P)``, where given:
    the fit chosen without the runs at P)."""
    out = []
    for P in sorted(set(Ps)):
        keep = Ps != P
        if keep.any():
            f = fit if fold_fit is None else fold_fit(P)
            dist = float(np.min(np.abs(np.log2(Ps[keep]) - np.log2(P))))
            out += [(e, dist) for e in _log_err(f(X[keep], t[keep], Ps[keep]), X[~keep],
                                                t[~keep])]
    return out


# the host's fixed-cost shapes tried (o1 / o0; _host_shape)
_SHAPES = tuple(round(0.05 * i, 2) for i in range(61))


def _host_shape(design: dict) -> float | None:
    """A shared host's fixed-cost shape s, o1 = s o0 for every algorithm (``fit_terms``
    asks under the ``link`` law): the one of ``_SHAPES`` whose free fits predict a
    left-out P best (median over all runs), if that beats each one's own (o0, o1)."""
    def score(shape):
        fit = _host_fits(shape)[0]
        errs = [e for X, t, Ps, _ in design.values() for e, _ in _p_folds(X, t, Ps, fit)]
        return float(np.median(errs)) if errs else math.inf
    scores = {s: score(s) for s in _SHAPES}
    best = min(_SHAPES, key=lambda s: (scores[s], s))
    return float(best) if scores[best] < score(None) else None


def _per_octave(inside, out) -> float:
    """The held-out error's growth per octave of P: the median of (error with a P
    left out - the in-range error) / its octaves (nan without such folds)."""
    if not out:
        return math.nan
    base = float(np.median(inside)) if inside else 0.0
    return float(np.median([max(e - base, 0.0) / max(d, 1e-9) for e, d in out]))


def fit_terms(machine: Machine, runs) -> Machine:
    """``machine`` with each algorithm's weights and fixed cost fitted from the
    profile's runs (module docstring), and, on a single host with runs at several
    P, the bandwidth law (``LAWS``) that predicts a left-out P best and the fixed
    cost's shape under the ``link`` law (:func:`_host_shape`)."""
    machine = replace(machine, _at={}, fixed_shape=None)
    free, table = _fits(machine)  # the law below leaves ``contention``, hence these, as is
    several_P = machine.contention is not None and len({int(r["P"]) for r in runs} - {1}) > 1
    if several_P:
        # the law is judged on the runs whose bandwidth part is at least half the
        # modelled time: elsewhere it changes little (small messages, or within a
        # token bucket's burst, pass at the speed of the loopback)
        def bandwidth_bound(r) -> bool:
            c = components(machine, r["algorithm"], r["n"], r["P"], r["density"] or 0.01)
            return c[1] >= 0.5 * c.sum()
        heavy = [r for r in runs if r["algorithm"] in ALGORITHMS and int(r["P"]) > 1
                 and bandwidth_bound(r)]
        if len({int(r["P"]) for r in heavy}) > 1:
            by_law = {law: replace(machine, law=law, _at={}) for law in LAWS}

            def score(law):
                errs = [e for X, t, Ps, _ in _design(by_law[law], heavy).values()
                        for e, _ in _p_folds(X, t, Ps, free)]
                return float(np.median(errs)) if errs else math.inf
            machine = by_law[min(LAWS, key=lambda law: (score(law), law))]  # with its cache
    design = _design(machine, runs)
    if several_P and machine.law == "link":
        machine = replace(machine, fixed_shape=_host_shape(design))  # prices and cache as is
        free, table = _fits(machine)
    weights, over, table1 = {}, {}, set()
    for algo, (X, t, Ps, ns) in design.items():
        fit = free
        # free weights only where they predict a left-out P better (module docstring), but
        # always for a sparse algorithm whose dense passes are priced at the scan's rate
        passes_at_scan_rate = ALGORITHMS[algo].lossy and machine.stream is None
        if len(set(Ps)) > 2 and not passes_at_scan_rate:
            err = {f: np.median([e for e, _ in _p_folds(X, t, Ps, f)]) for f in (free, table)}
            fit = min((free, table), key=lambda f: err[f])
        if fit is table:
            table1.add(algo)
        c = fit(X, t, Ps)
        weights[algo] = tuple(float(v) for v in c[:3])
        over[algo] = (float(c[3]), float(c[4]))
    # the terms' prices (``at``, ``part``, ``components``) do not depend on the weights: the
    # fitted machine keeps their cache, and the held-out errors reuse its design
    return replace(machine, weights=weights, overhead=over, table1=frozenset(table1))


def heldout_errors(machine: Machine, runs) -> dict[str, tuple[float, float, int]]:
    """Each algorithm's held-out error from the profile's runs: (in range: the
    median |log(predicted / measured)| with one size left out; per octave of P:
    how much more it is with one P left out, per octave from the nearest P kept
    (nan with runs at one P); runs).  exp(e) - 1 is the relative error.  A fitted
    fixed-cost shape is chosen again without each P left out, as fit_terms would."""
    out = {}
    design = _design(machine, runs)
    shapes = {}

    def shape_without(P):
        if P not in shapes:
            shapes[P] = _host_shape({a: (X[Ps != P], t[Ps != P], Ps[Ps != P], ns[Ps != P])
                                     for a, (X, t, Ps, ns) in design.items() if (Ps != P).any()})
        return shapes[P]
    for algo, (X, t, Ps, ns) in design.items():
        kind = 1 if algo in machine.table1 else 0  # the fit fit_terms chose
        fit = _fits(machine)[kind]
        fold_fit = (None if machine.fixed_shape is None
                    else lambda P, kind=kind: _host_fits(shape_without(P))[kind])
        inside, beyond = _size_folds(X, t, Ps, ns, fit), _p_folds(X, t, Ps, fit, fold_fit)
        out[algo] = (float(np.median(inside)) if inside else math.nan,
                     _per_octave(inside, beyond), len(t))
    return out


def expected_error(errors: tuple, octaves_n: float = 0.0, octaves_P: float = 0.0) -> float:
    """A prediction's expected |log(predicted / measured)| from an algorithm's
    ``heldout_errors`` entry, ``octaves_n`` / ``octaves_P`` beyond its runs: the
    in-range error, grown per four octaves of n (the one-size-out folds' end sizes
    lie about that far out) and per octave of P (the one-P-out error; the in-range
    one where the runs span one P)."""
    return errors[0] * (1 + octaves_n / 4) + error_growth_in_P(errors, octaves_P)


def error_growth_in_P(errors: tuple, octaves_P: float) -> float:
    """The part of :func:`expected_error` that ``octaves_P`` beyond the runs add: the
    error per octave of P (the in-range one where the runs span one P) x the octaves."""
    return (errors[1] if math.isfinite(errors[1]) else errors[0]) * octaves_P


def overhead(machine: Machine, algorithm: str, P: int) -> float:
    """The fitted fixed cost per call (0 without runs in the profile)."""
    o0, o1 = machine.overhead.get(algorithm, (0.0, 0.0))
    return o0 + o1 * max(int(P) - 1, 0)


def predict(machine: Machine, algorithm: str, n: int, P: int, density: float = 0.01,
            tau_prime: int = 32, tau: int = 64) -> float:
    """Predicted seconds per call of ``algorithm`` on ``machine``: Table 1's
    latency, bandwidth and compute parts with their fitted weights, plus the
    implementation's fixed cost per call."""
    if P <= 1:
        return _terms(machine, algorithm, n, P, density, tau_prime, tau)
    w = machine.weights.get(algorithm, (1.0, 1.0, 1.0))  # Table 1 as it stands without runs
    t = float(np.dot(w, components(machine, algorithm, n, P, density, tau_prime, tau)))
    return t + overhead(machine, algorithm, P)

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
threshold selection and sparse reduction.  ``predict(algorithm, n, P,
density)`` composes them into the algorithm's time per call: every algorithm
registered in ``collectives.ALGORITHMS`` states its own terms (its ``cost``,
written against ``collectives.Prices``, which ``Machine`` implements).

On a CPU profiled on one host, ranks share the host's cores: with P ranks on
C cores each rank's local compute (timed by the profiler on one rank alone)
runs max(1, P/C) times slower, and the shared-memory primitives (copies made
by the same cores, measured at the profile's P) scale by the ratio of that
factor at P and at the profile's P (``Machine.at``).  Without the core count
(profiles made before it was recorded), on GPUs and across hosts: no scaling.

One more term comes from the profile's algorithm runs: each implementation's
fixed cost per call, ``o0 + o1 (P-1)`` seconds (:func:`fit_overheads`) -- the
Python, kernel-launch, host-synchronisation and small-message cost that Table 1's
alpha-beta terms leave out.  It is what remains of the measured time at the
smallest sizes the profile ran, where the data terms vanish; on a GPU it
dominates the sparse algorithms at small and medium n (docs/BENCHMARKS.md,
"Fixed cost per call").  Because it is
part of the model, it carries over to sizes and process counts beyond the
profile's runs, where the learned correction fades out.  The terms are
deliberately simple; the learned selector corrects them with measurements.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from collectives import ALGORITHMS

from .profile import Linear, Link, Profile, model_time

# Every sparse algorithm also streams the dense vector: the error-feedback sum
# acc = residual + x (2 reads, 1 write) and the dense output it returns (1 write).
_EF_STREAMS = 4


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
    overhead: dict = field(default_factory=dict)  # algorithm -> (o0, o1), see fit_overheads
    # ranks sharing one host's cores (single-host CPU profiles): (cores, profile's P)
    contention: tuple[int, int] | None = None
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
            f = max(1.0, P / cores)
            g = f / max(1.0, P0 / cores)

            def link(lk: Link) -> Link:
                return Link(lk.alpha * g, lk.beta * g,
                            tuple((s, a * g, b * g) for s, a, b in lk.segments))

            def lin(c: Linear | None) -> Linear | None:
                return None if c is None else Linear(c.c0 * f, c.c1 * f)

            self._at[P] = replace(
                self, p2p=link(self.p2p), allgather=link(self.allgather),
                alltoall=link(self.alltoall), allreduce=link(self.allreduce),
                bcast=link(self.bcast), topk=lin(self.topk), threshold=lin(self.threshold),
                reduce=lin(self.reduce), stream=lin(self.stream), contention=None, _at={})
        return self._at[P]

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
        )
        runs = prof.runs
        return replace(bare, overhead=fit_overheads(bare, runs), _at={}) if runs else bare

    # primitive times (each with the regime covering its message size), in the
    # shapes of autotune.profile's one table ----------------------------------------
    def t_p2p(self, m: float) -> float:
        return model_time("p2p", *self.p2p.at(m), m, 2)

    def t_allgather(self, m: float, P: int) -> float:
        return model_time("allgather", *self.allgather.at(m), m, P)

    def t_alltoall(self, m: float, P: int) -> float:
        return model_time("alltoallv", *self.alltoall.at(m), m, P)

    def t_allreduce(self, m: float, P: int) -> float:
        return model_time("allreduce", *self.allreduce.at(m), m, P)

    def t_bcast(self, m: float, P: int) -> float:
        return model_time("bcast", *self.bcast.at(m), m, P)

    def dense_passes(self, n: float, streams: int = _EF_STREAMS) -> float:
        """Elementwise work over n elements: ``streams`` full reads or writes,
        each costed at a third of a GPU profile's measured ``stream`` kernel
        (acc = r + x: two reads and a write).  CPU profiles, and GPU profiles
        made before that kernel was measured, cost each stream at the
        threshold scan's per-element rate (one read and a compare), which
        overstates it on a GPU, where the scan also compacts."""
        if self.stream is not None:  # measured: acc = r + x, 3 streams per element
            return streams / 3 * self.stream.c1 * max(n, 0.0)
        return streams * self.threshold.c1 * max(n, 0.0)


def _k(n: int, density: float) -> int:
    return min(n, max(1, int(round(density * n))))


# Sizes within this factor of an algorithm's smallest run (per P) estimate its overhead.
_OVERHEAD_SPAN = 4


def _terms(machine: Machine, algorithm: str, n: int, P: int, density: float,
           tau_prime: int = 32, tau: int = 64) -> float:
    """The registered algorithm's own ``cost`` terms, priced on ``machine`` at P."""
    try:
        cls = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(f"no cost model for algorithm {algorithm!r}; known: "
                         f"{sorted(ALGORITHMS)}") from None
    n, P = int(n), int(P)
    return float(cls.cost(machine.at(P), n, P, _k(n, float(density)), tau_prime=tau_prime,
                          tau=tau))


def fit_overheads(machine: Machine, runs) -> dict[str, tuple[float, float]]:
    """Each algorithm's fixed cost per call, ``o0 + o1 (P-1)`` seconds, from measured runs.

    For every (algorithm, P) the runs at the smallest sizes (within a factor
    ``_OVERHEAD_SPAN`` of the smallest n run there) give the median of
    measured minus modelled time; ``(o0, o1)`` is the non-negative least-squares
    line through those medians over P - 1 (o1 = 0 with a single P).  Runs are
    profile ``runs`` records (algorithm, n, P, density, median_s).
    """
    from scipy.optimize import nnls

    by = defaultdict(list)
    for r in runs:
        if r["algorithm"] in ALGORITHMS and r.get("median_s", 0) > 0 and int(r["P"]) > 1:
            by[r["algorithm"], int(r["P"])].append(r)
    points = defaultdict(list)  # algorithm -> [(P - 1, median residual)]
    for (algo, P), rs in sorted(by.items()):
        n0 = min(int(r["n"]) for r in rs)
        res = [float(r["median_s"]) - _terms(machine, algo, int(r["n"]), P, r["density"] or 0.01)
               for r in rs if int(r["n"]) <= _OVERHEAD_SPAN * n0]
        points[algo].append((P - 1, float(np.median(res))))
    out = {}
    for algo, pts in points.items():
        A = np.array([[1.0, q] for q, _ in pts]) if len(pts) > 1 else np.array([[1.0]])
        coef, _ = nnls(A, np.array([o for _, o in pts]))
        out[algo] = (float(coef[0]), float(coef[1]) if len(coef) > 1 else 0.0)
    return out


def overhead(machine: Machine, algorithm: str, P: int) -> float:
    """The fitted fixed cost per call (0 without runs in the profile)."""
    o0, o1 = machine.overhead.get(algorithm, (0.0, 0.0))
    return o0 + o1 * max(int(P) - 1, 0)


def predict(machine: Machine, algorithm: str, n: int, P: int, density: float = 0.01,
            tau_prime: int = 32, tau: int = 64) -> float:
    """Predicted seconds per call of ``algorithm`` on ``machine``: Table 1's terms
    plus local compute, plus the implementation's fixed cost per call."""
    return (_terms(machine, algorithm, n, P, density, tau_prime, tau)
            + (overhead(machine, algorithm, P) if P > 1 else 0.0))

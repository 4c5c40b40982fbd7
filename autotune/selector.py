"""The learned selector: which algorithm is fastest for (n, P, density) on a profiled machine.

The cost model (autotune.costmodel) predicts every algorithm's time from the
profile's fitted alpha/beta and compute costs.  A scikit-learn gradient-boosted
model, trained on the profile's measured runs, learns the *correction*
log(measured / predicted) per algorithm, so the prediction extrapolates in n
and P through the model's terms rather than through the trees.  Behind a
shaped link it also sees how much of a call's bandwidth time the link's burst
covers, so a residual of calls past the bucket is not carried to calls within
it.  Beyond the process counts (and densities) of an algorithm's runs its
correction fades out and the cost model decides; beyond their sizes it goes on
as the trees give it at the nearest size run: the model's terms carry the
growth in n, and what they miss at the largest runs (Ok-Topk at P = 3 on a
2-core host, BENCHMARKS "Selector regret") they miss beyond them too.
Decisions outside the runs say so.  Same profile in, same decisions out.

Between two sizes of a lossless algorithm's runs its correction is the one at
the lower size (``Selector.anchor``), not the trees' split halfway: an MPI
library switches its allreduce algorithm at message-size thresholds (``size
< T``, T a power of two in bytes), which the profile's sizes (powers of two)
land on, so the run at T already shows the new regime and every size below it
belongs to the old one (host MPI at P = 3 behind the 1 Gbit/s link: fastest
up to 48K, 1.2-2x slower from 65536; BENCHMARKS "Selector regret").  A sparse
algorithm's messages are k-sized: its thresholds fall between the runs' sizes,
and the trees' split stands.

Every prediction carries an error estimate from cross-validation on the
profile's runs (``costmodel.heldout_errors``): each algorithm's held-out error
in range, grown with the distance beyond its runs (per octave of P from the
process counts left out, per four octaves of n from the sizes left out).
With runs at one P no process count can be left out: nothing tells one
algorithm's growth in P apart from another's, and every algorithm's error per
octave of P is one pooled value, the median of their in-range errors (an
algorithm's own in-range error measures its fit across sizes, not in P).
Far outside the runs of the predicted-fastest algorithm (more than
``FAR_OCTAVES`` of n above them or of P beyond them) the selector takes the robust choice:
a reference exact algorithm unless another clearly wins (its upper bound,
predicted x exp(error), below the reference's lower one).  Where only P lies
far (n within the runs), a win is judged on the error's growth in P alone
(per octave of P times the octaves): the in-range error measures a fit across
sizes, and with it added a sparse algorithm predicted 9x faster than dense
over a slow link could not win (regret 13-16, BENCHMARKS "Selector regret").
The reference is the exact one with the lowest upper bound, except on a CPU profile far above
the sampled sizes, where it is dense (Rabenseifner): there host MPI's
allreduce switches to algorithms its model does not know, so its prediction
has no bound and it cannot clearly win either (BENCHMARKS "Selector
regret").  Only P far beyond the runs, at sampled sizes, gives MPI no such
reason.  n far below the runs is not far: there the prediction stands (its
latency terms rest on primitives the profile measures down to 4 bytes, and the
learned correction keeps its value at the smallest run); with dense as the
reference, or the lowest upper bound, `dense` was picked over MPI's one call
in C at 557-2021 elements, 1.2-2.0x slower (BENCHMARKS "Selector regret").
Beyond the largest P of the runs, where host MPI's allreduce is the fastest
exact algorithm at that P and another exact one is predicted faster but not
clearly (their error bands overlap), MPI's allreduce stays: there the learned
correction fades and the difference comes from the model's terms alone, while
Rabenseifner runs 2 log2 P steps from Python where MPI runs one call in C, a
growth with P on shared cores that the terms understate (`dense` picked over
`mpi` at 2-3K elements, P = 6 and 8: 1.3-1.7x slower, BENCHMARKS "Selector
regret").
Elsewhere a lossy algorithm predicted faster than the fastest exact one by
less than ``EXACT_TIE`` (5%) does not win, a tie far inside the predictions'
errors: the exact one is chosen (where gaussiank, TopkA and MPI's allreduce
were predicted within 1.5% of each other, numerics alone picked gaussiank, 3.5x
slower than MPI: BENCHMARKS "Selector regret").
``Decision.explain`` shows the errors and bounds and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from collectives import ALGORITHMS, BACKENDS

from . import costmodel
from .profile import Profile


def _lossy(algo: str) -> bool:
    cls = ALGORITHMS.get(algo)
    return cls is not None and cls.lossy


@dataclass
class Decision:
    algorithm: str
    n: int
    P: int
    density: float
    predicted_s: dict[str, float]
    model_s: dict[str, float]
    in_domain: bool
    note: str = ""
    candidates: list[str] = field(default_factory=list)
    error: dict[str, float] = field(default_factory=dict)  # log-space error per prediction
    robust: bool = False  # chosen by the upper end of the error band, not the prediction

    def upper_s(self, algo: str) -> float:
        """The upper end of the prediction's error band (the prediction without one)."""
        return self.predicted_s[algo] * math.exp(self.error.get(algo, 0.0))

    def explain(self) -> str:
        lines = [f"n={self.n} P={self.P} density={self.density:g}"
                 + ("" if self.in_domain else "  (outside the measured range: the learned "
                                                "correction fades beyond its process counts)"),
                 f"{'algorithm':12s} {'cost model':>12s} {'learned':>12s} {'error':>7s}"
                 f" {'upper':>12s}"]
        for a in sorted(self.predicted_s, key=self.predicted_s.get):
            mark = "  <- chosen" if a == self.algorithm else ""
            err = (f"{100 * math.expm1(self.error[a]):6.0f}%" if a in self.error else
                   f"{'-':>7s}")
            lines.append(f"{a:12s} {1e3 * self.model_s[a]:10.3f}ms {1e3 * self.predicted_s[a]:10.3f}ms"
                         f" {err} {1e3 * self.upper_s(a):10.3f}ms{mark}")
        if self.robust:
            fastest = min(self.predicted_s, key=lambda a: (self.predicted_s[a], a))
            lines.append(f"robust choice: far beyond the runs of {fastest} (predicted fastest), "
                         f"the reference exact algorithm unless another's upper bound is "
                         f"below its lower one (where only P is far: bounds from the error's "
                         f"growth in P; where n is far above them on a CPU, dense is the "
                         f"reference and host MPI's allreduce has no bound)")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def _dens(algo: str, density) -> float:
    """Lossless algorithms ignore the density: one constant feature value for them."""
    return 0.01 if not _lossy(algo) or density is None else float(density)


def _point(algo: str, n: int, P: int, density) -> list[float]:
    """Where a call lies: log2 n, log2 P, log10 density (the runs' domains and the
    correction's first features)."""
    return [math.log2(max(n, 1)), math.log2(max(P, 1)), math.log10(_dens(algo, density))]


def _gap(lo, hi, q) -> np.ndarray:
    """How far ``q`` lies outside [lo, hi], per axis (0 inside)."""
    return np.maximum(lo - q, 0) + np.maximum(q - hi, 0)


def _features(algorithms, algo: str, n: int, P: int, density: float, model_s: float,
              burst: float | None = None):
    """The correction's features: where the call lies (``_point``), the model's log
    time, the algorithm, and behind a shaped link (``burst``: the share of the call's
    bandwidth time the link's burst covers, ``costmodel.burst_share``) the regime, so
    that a residual past the bucket is not carried to calls within it."""
    onehot = [1.0 if a == algo else 0.0 for a in algorithms]
    return ([*_point(algo, n, P, density), math.log(max(model_s, 1e-9)), *onehot]
            + ([] if burst is None else [burst]))


def default_algorithms(profile) -> list[str]:
    """The registered algorithms that run on the profile's backend, sorted (all
    of them when the profile does not say which backend it measured)."""
    backend = Profile.of(profile).backend
    return sorted(a for a, cls in ALGORITHMS.items() if backend is None or backend in cls.backends)


# Far outside the runs of the predicted-fastest algorithm (Selector._robust_choice): "exact"
# (the default) or "none" (the prediction).
ROBUST = ("exact", "none")
# "Far": more octaves of n or P beyond its runs than the held-out folds reach (a P left out
# of runs at 2, 3, 4 lies at most one octave from the others); within them the errors hold.
FAR_OCTAVES = 1.0
# A lossy algorithm predicted faster than the fastest exact one by less than this share
# is no win: the predictions' errors are several times wider, and the exact one adds no
# compression error (Selector.choose).
EXACT_TIE = 0.05


class Selector:
    """Choose an algorithm per (n, P, density) from a profile.

    Args:
        profile: an :class:`autotune.profile.Profile` (or its JSON document as a dict).
        algorithms: candidates (default: every registered algorithm that runs
            on the profile's backend, all of them if the profile names none;
            those without runs in the profile are priced by the cost model).
        learn: train the correction (False: bare cost model, for comparison).
        runs: override the training runs (e.g. to hold some out).
        robust: the choice outside the runs of the predicted-fastest algorithm
            (``ROBUST``; see ``_robust_choice``).
    """

    def __init__(self, profile: dict, *, algorithms=None, learn: bool = True, runs=None,
                 random_state: int = 0, robust: str = "exact"):
        if robust not in ROBUST:
            raise ValueError(f"robust must be one of {ROBUST}, got {robust!r}")
        self.robust = robust
        profile = Profile.of(profile)
        # host MPI: beyond the sampled sizes the native allreduce switches algorithms its
        # model does not know (BENCHMARKS, "Fresh large buffers"); Rabenseifner is the reference
        self.host = profile.device == "cpu"
        self.native = BACKENDS[profile.backend or "mpi"].native if self.host else None
        self.machine = costmodel.Machine.from_profile(profile)
        runs = list(profile.runs if runs is None else runs)
        self.algorithms = [a for a in (algorithms or default_algorithms(profile)) if a in ALGORITHMS]
        self.model = None
        # (low, high) of _point over all runs, set with the learned correction (it fades
        # out beyond them)
        self.domain = None
        runs = [r for r in runs if r["algorithm"] in self.algorithms and r.get("median_s", 0) > 0]
        # per algorithm: held-out errors (costmodel.heldout_errors) and the runs' domain
        self.errors = costmodel.heldout_errors(self.machine, runs) if runs else {}
        if self.errors and not any(math.isfinite(e[1]) for e in self.errors.values()):
            # runs at one P: one pooled error per octave of P for every algorithm
            inside = [e[0] for e in self.errors.values() if math.isfinite(e[0])]
            pooled = float(np.median(inside)) if inside else math.nan
            self.errors = {a: (e[0], pooled, e[2]) for a, e in self.errors.items()}
        # the largest P of the runs: beyond it the native allreduce may stay (_native_stays)
        self.top_P = max((int(r["P"]) for r in runs), default=None)
        self.domains: dict = {}
        self.sizes: dict = {}  # algorithm -> its runs' sizes, ascending (``anchor``)
        for a in {r["algorithm"] for r in runs}:
            mine = [r for r in runs if r["algorithm"] == a]
            q = np.array([_point(a, r["n"], r["P"], r["density"]) for r in mine])
            self.domains[a] = (q.min(axis=0), q.max(axis=0))
            self.sizes[a] = sorted({int(r["n"]) for r in mine})
        if learn and len(runs) >= 8:
            from sklearn.ensemble import GradientBoostingRegressor

            X, y = [], []
            for r in runs:
                m = self._model(r["algorithm"], r["n"], r["P"], _dens(r["algorithm"], r["density"]))
                X.append(_features(self.algorithms, r["algorithm"], r["n"], r["P"], r["density"], m,
                                   self._burst(r["algorithm"], r["n"], r["P"], r["density"])))
                y.append(math.log(r["median_s"] / m))
            X = np.asarray(X)
            self.model = GradientBoostingRegressor(
                n_estimators=300, max_depth=3, learning_rate=0.05, subsample=1.0,
                random_state=random_state).fit(X, np.asarray(y))
            self.domain = (X[:, :3].min(axis=0), X[:, :3].max(axis=0))

    def _burst(self, algo, n, P, density) -> float | None:
        """The correction's burst feature (``_features``); None without a burst."""
        return (costmodel.burst_share(self.machine, algo, n, P, _dens(algo, density))
                if self.machine.burst_s else None)

    def _model(self, algo, n, P, density):
        return max(costmodel.predict(self.machine, algo, n, P, _dens(algo, density)), 1e-9)

    def _outside(self, n, P, density, algo: str | None = None, *, sizes: bool = True) -> float:
        """How far (in log2 units of n and P, decades of density) the point lies
        outside the runs (of ``algo``, if given and run; else of all algorithms);
        ``sizes=False``: in P and density only."""
        if self.domain is None:
            return math.inf
        lo, hi = self.domains.get(algo, self.domain)
        gap = _gap(lo, hi, np.array(_point(algo, n, P, density)))
        return float(np.sum(gap if sizes else gap[1:]))

    def anchor(self, algo: str, n: int) -> int:
        """The size whose learned correction applies at n: for a lossless algorithm
        within its runs' sizes, the largest run size <= n (see the module
        docstring); else n itself."""
        sizes = self.sizes.get(algo)
        if not sizes or _lossy(algo) or not sizes[0] <= n <= sizes[-1]:
            return n
        return sizes[int(np.searchsorted(sizes, n, side="right")) - 1]

    def predict(self, algo: str, n: int, P: int, density: float) -> tuple[float, float]:
        """(learned prediction, bare cost-model prediction) in seconds: the model's
        time at n with the correction learned at ``anchor(algo, n)``."""
        m = self._model(algo, n, P, density)
        if self.model is None:
            return m, m
        q = self.anchor(algo, n)
        x = _features(self.algorithms, algo, q, P, density,
                      m if q == n else self._model(algo, q, P, density),
                      self._burst(algo, q, P, density))
        corr = float(self.model.predict(np.asarray([x]))[0])
        # 1 at the process counts of the algorithm's runs, -> 0 far outside them
        fade = math.exp(-self._outside(n, P, _dens(algo, density), algo, sizes=False))
        return m * math.exp(corr * fade), m

    def _beyond(self, algo: str, n: int, P: int) -> tuple[float, float]:
        """Octaves of n and of P beyond the algorithm's runs (inf without runs)."""
        if algo not in self.domains:
            return math.inf, math.inf
        lo, hi = self.domains[algo]
        d = _gap(lo[:2], hi[:2], np.array(_point(algo, n, P, None)[:2]))
        return float(d[0]), float(d[1])

    def _above(self, algo: str, n: int, P: int) -> tuple[float, float]:
        """Octaves of n above the algorithm's runs (0 within or below them) and of
        P beyond them (either way); inf without runs."""
        if algo not in self.domains:
            return math.inf, math.inf
        hi_n = self.domains[algo][1][0]
        return max(0.0, math.log2(max(n, 1)) - float(hi_n)), self._beyond(algo, n, P)[1]

    def error(self, algo: str, n: int, P: int) -> float | None:
        """The prediction's expected |log(predicted / measured)|: the held-out error
        in range, plus its growth per octave of P beyond the runs (the one-P-out
        error) and per four octaves of n (the one-size-out error, whose end sizes
        lie about that far out); None without runs of the algorithm."""
        e = self.errors.get(algo)
        if e is None or not math.isfinite(e[0]):
            return None
        return costmodel.expected_error(e, *self._beyond(algo, n, P))

    def _robust_choice(self, cands, pred, err, *, above: bool, band=None) -> str:
        """Far outside the runs: a reference exact algorithm (exact ``dense``,
        Rabenseifner, on a CPU profile when n is far above the runs, ``above``; else
        the exact one with the lowest upper end of its error band) unless another
        algorithm clearly wins: its prediction x exp(``band``) lies below the
        reference's prediction x exp(-``band``); the lowest such of those that do (of
        all, by upper end, without an exact candidate).  Host MPI's own allreduce
        never clearly wins where n is far above (its prediction has no bound there: see
        the module docstring).  ``band``: per algorithm, the log error a win is
        judged with (default ``err``; ``choose`` passes the error's growth in P
        where only P is far)."""
        upper = {a: pred[a] * math.exp(err[a]) for a in cands}
        exact = [a for a in cands if not _lossy(a)]
        if not exact:
            return min(cands, key=lambda a: (upper[a], a))
        far_host = self.host and above and "dense" in exact
        ref = "dense" if far_host else min(exact, key=lambda a: (upper[a], a))
        band = err if band is None else band
        high = {a: pred[a] * math.exp(band[a]) for a in cands}
        if far_host and self.native in high:
            high[self.native] = math.inf
        wins = [a for a in cands if high[a] < pred[ref] * math.exp(-band[ref])]
        return min(wins, key=lambda a: (high[a], a)) if wins else ref

    def _growth(self, algo: str, n: int, P: int) -> float:
        """The part of the prediction's error that comes from P beyond the runs
        (``costmodel.error_growth_in_P``)."""
        return costmodel.error_growth_in_P(self.errors[algo], self._beyond(algo, n, P)[1])

    def _native_stays(self, n: int, P: int, density, best: str, pred, err) -> bool:
        """Beyond the largest P of the runs, host MPI's allreduce stays over the
        predicted-fastest exact algorithm ``best`` where it is the fastest exact one
        at that P (the learned prediction, where the runs are) and ``best`` does not
        clearly beat it: their error bands overlap (see the module docstring)."""
        nat = self.native
        if (nat not in pred or best == nat or _lossy(best) or self.top_P is None
                or P <= self.top_P or nat not in err or best not in err):
            return False
        exact = [a for a in pred if not _lossy(a) and a in err]
        at_top = {a: self.predict(a, n, self.top_P, density)[0] for a in exact}
        if min(exact, key=lambda a: (at_top[a], a)) != nat:
            return False
        return pred[nat] * math.exp(-err[nat]) <= pred[best] * math.exp(err[best])

    def choose(self, n: int, P: int, density: float = 0.01, *, lossy_ok: bool = True,
               candidates=None) -> Decision:
        cands = [a for a in (candidates or self.algorithms) if lossy_ok or not _lossy(a)]
        if not cands:
            raise ValueError("no candidate algorithm left to choose from")
        pred, model, err = {}, {}, {}
        for a in cands:
            pred[a], model[a] = self.predict(a, n, P, density)
            e = self.error(a, n, P)
            if e is not None:
                err[a] = e
        best = min(cands, key=lambda a: (pred[a], a))
        # octaves of n above the runs of the predicted-fastest algorithm (below them is
        # not far: see the module docstring), of P beyond them
        above_n, beyond_P = self._above(best, n, P)
        robust = (self.robust != "none" and len(err) == len(cands)
                  and max(above_n, beyond_P) > FAR_OCTAVES)
        if robust:
            far_n = above_n > FAR_OCTAVES
            band = None if far_n else {a: self._growth(a, n, P) for a in cands}
            best = self._robust_choice(cands, pred, err, above=far_n, band=band)
        notes = [] if self.model is not None else ["no learned correction: bare cost model"]
        exact = [a for a in cands if not _lossy(a)]
        if not robust and _lossy(best) and exact:
            tie = min(exact, key=lambda a: (pred[a], a))
            if pred[tie] <= pred[best] * (1 + EXACT_TIE):
                notes.append(f"{tie} over {best}: exact, predicted within {EXACT_TIE:.0%} of it")
                best = tie
        if not robust and self._native_stays(n, P, density, best, pred, err):
            notes.append(f"{self.native} stays: the fastest exact algorithm at P={self.top_P}, "
                         f"the largest P run, and {best}'s band overlaps its own")
            best = self.native
        outside = self._outside(n, P, _dens(best, density), best)
        return Decision(best, n, P, density, pred, model, outside == 0.0, "\n".join(notes),
                        cands, err, robust)

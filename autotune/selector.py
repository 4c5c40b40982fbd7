"""The learned selector: which algorithm is fastest for (n, P, density) on a profiled machine.

The cost model (autotune.costmodel) predicts every algorithm's time from the
profile's fitted alpha/beta and compute costs.  A scikit-learn gradient-boosted
model, trained on the profile's measured runs, learns the *correction*
log(measured / predicted) per algorithm, so the prediction extrapolates in n
and P through the model's terms rather than through the trees.  Outside the
range of the training data the correction fades out (the decision says so)
and the cost model decides.  Same profile in, same decisions out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from collectives import ALGORITHMS

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

    def explain(self) -> str:
        lines = [f"n={self.n} P={self.P} density={self.density:g}"
                 + ("" if self.in_domain else "  (outside the measured range: cost model leads)"),
                 f"{'algorithm':12s} {'cost model':>12s} {'learned':>12s}"]
        for a in sorted(self.predicted_s, key=self.predicted_s.get):
            mark = "  <- chosen" if a == self.algorithm else ""
            lines.append(f"{a:12s} {1e3 * self.model_s[a]:10.3f}ms {1e3 * self.predicted_s[a]:10.3f}ms{mark}")
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def _dens(algo: str, density) -> float:
    """Lossless algorithms ignore the density: one constant feature value for them."""
    return 0.01 if not _lossy(algo) or density is None else float(density)


def _features(algorithms, algo: str, n: int, P: int, density: float, model_s: float):
    density = _dens(algo, density)
    onehot = [1.0 if a == algo else 0.0 for a in algorithms]
    return [math.log2(max(n, 1)), math.log2(max(P, 1)), math.log10(density),
            math.log(max(model_s, 1e-9)), *onehot]


def default_algorithms(profile) -> list[str]:
    """The registered algorithms that run on the profile's backend, sorted (all
    of them when the profile does not say which backend it measured)."""
    backend = Profile.of(profile).backend
    return sorted(a for a, cls in ALGORITHMS.items() if backend is None or backend in cls.backends)


class Selector:
    """Choose an algorithm per (n, P, density) from a profile.

    Args:
        profile: an :class:`autotune.profile.Profile` (or its JSON document as a dict).
        algorithms: candidates (default: every registered algorithm that runs
            on the profile's backend, all of them if the profile names none;
            those without runs in the profile are priced by the cost model).
        learn: train the correction (False: bare cost model, for comparison).
        runs: override the training runs (e.g. to hold some out).
    """

    def __init__(self, profile: dict, *, algorithms=None, learn: bool = True, runs=None,
                 random_state: int = 0):
        profile = Profile.of(profile)
        self.machine = costmodel.Machine.from_profile(profile)
        runs = list(profile.runs if runs is None else runs)
        self.algorithms = [a for a in (algorithms or default_algorithms(profile)) if a in ALGORITHMS]
        self.model = None
        self.domain = None  # (low, high) of (log2 n, log2 P, log10 density) over all runs
        self.domains: dict = {}  # the same per algorithm
        runs = [r for r in runs if r["algorithm"] in self.algorithms and r.get("median_s", 0) > 0]
        if learn and len(runs) >= 8:
            from sklearn.ensemble import GradientBoostingRegressor

            X, y = [], []
            for r in runs:
                m = self._model(r["algorithm"], r["n"], r["P"], _dens(r["algorithm"], r["density"]))
                X.append(_features(self.algorithms, r["algorithm"], r["n"], r["P"], r["density"], m))
                y.append(math.log(r["median_s"] / m))
            X = np.asarray(X)
            self.model = GradientBoostingRegressor(
                n_estimators=300, max_depth=3, learning_rate=0.05, subsample=1.0,
                random_state=random_state).fit(X, np.asarray(y))
            self.domain = (X[:, :3].min(axis=0), X[:, :3].max(axis=0))
            # each algorithm's own range: the lossless ones are run to larger n
            algos = np.array([r["algorithm"] for r in runs])
            self.domains = {a: (X[algos == a, :3].min(axis=0), X[algos == a, :3].max(axis=0))
                            for a in set(algos)}

    def _model(self, algo, n, P, density):
        return max(costmodel.predict(self.machine, algo, n, P, _dens(algo, density)), 1e-9)

    def _outside(self, n, P, density, algo: str | None = None) -> float:
        """How far (in log2 units of n and P, decades of density) the point lies
        outside the runs (of ``algo``, if given and run; else of all algorithms)."""
        if self.domain is None:
            return math.inf
        q = np.array([math.log2(max(n, 1)), math.log2(max(P, 1)), math.log10(density)])
        lo, hi = self.domains.get(algo, self.domain)
        return float(np.sum(np.maximum(lo - q, 0) + np.maximum(q - hi, 0)))

    def predict(self, algo: str, n: int, P: int, density: float) -> tuple[float, float]:
        """(learned prediction, bare cost-model prediction) in seconds."""
        m = self._model(algo, n, P, density)
        if self.model is None:
            return m, m
        corr = float(self.model.predict(np.asarray([_features(self.algorithms, algo, n, P, density, m)]))[0])
        # 1 inside the algorithm's runs, -> 0 far outside
        fade = math.exp(-self._outside(n, P, _dens(algo, density), algo))
        return m * math.exp(corr * fade), m

    def choose(self, n: int, P: int, density: float = 0.01, *, lossy_ok: bool = True,
               candidates=None) -> Decision:
        cands = [a for a in (candidates or self.algorithms) if lossy_ok or not _lossy(a)]
        if not cands:
            raise ValueError("no candidate algorithm left to choose from")
        pred, model = {}, {}
        for a in cands:
            pred[a], model[a] = self.predict(a, n, P, density)
        best = min(cands, key=lambda a: (pred[a], a))
        outside = self._outside(n, P, _dens(best, density), best)
        note = "" if self.model is not None else "no learned correction: bare cost model"
        return Decision(best, n, P, density, pred, model, outside == 0.0, note, cands)

"""Tuning density, tau' and tau with optuna, under an accuracy guard.

Objective: the time per iteration of a sparse algorithm (Ok-Topk by
default), predicted by the selector (cost model + learned correction) or
measured by running it (``measure=callable``).  The accuracy guard:

* the density is searched from ``density_min`` up; the default floor,
  ``REFERENCE_DENSITY`` = 1%, is the density at which the convergence tables
  (docs/BENCHMARKS.md, "Training") train at parity with dense without a
  special recipe (0.1% needed long dense and density warm-ups and sits on the
  goal's line).  Lower it to let the tuner trade accuracy for time;
* optionally (``xi_max``), the observed xi — the paper's Assumption 1 gap,
  measured by the profiler on real gradients — at or below ``xi_max``.  It is
  not on by default: measured xi is not monotone in the density (on the
  1 Gbit/s CPU profile 15.9 at 0.1%, 17.1 at 1%, 6.4 at 5%), so "xi no worse
  than at 1%" admitted 0.01% densities;
* optionally (``capture_min``), the share of the gradient's norm that the
  top-k entries carry, measured by the profiler on the same gradients
  (``xi.captured_norm``): at least ``capture_min``.  It rises with the
  density, so it sets a floor fitted to the model's gradients (a profile made
  with ``--gradients`` from the user's own model);
* tau' at or below ``tau_prime_max`` (stale thresholds select worse: see
  docs/BENCHMARKS.md, selection quality versus tau').

The study lives in a file-backed optuna storage (JournalStorage), so an
interrupted ``autotune tune`` resumes where it stopped.

Beyond the paper, ``OnlineDensityGuard`` re-tunes the density during
training from xi observed on the training's own gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .profile import Profile
from .selector import Selector


def xi_curve(profile, field: str | None = None):
    """(log10 densities, values) measured by the profiler, sorted; may be empty.
    The values are xi's, or with ``field`` those of the profile's ``xi[field]``
    (e.g. ``"captured_norm"``).  ``profile``: a Profile or its JSON dict."""
    by = Profile.of(profile).xi_by_density(field)
    pts = sorted((math.log10(float(d)), float(v)) for d, v in by.items() if v is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def xi_at(profile, density: float, field: str | None = None) -> float | None:
    """xi (or ``field``, see :func:`xi_curve`) at ``density``, interpolated in
    log density (clamped at the ends)."""
    xs, ys = xi_curve(profile, field)
    if not xs:
        return None
    q = math.log10(density)
    if q <= xs[0]:
        return ys[0]
    if q >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= q <= x1:
            return y0 + (y1 - y0) * (q - x0) / (x1 - x0)
    return ys[-1]


@dataclass
class TuneResult:
    density: float
    tau_prime: int
    tau: int
    time_s: float
    xi: float | None
    trials: int
    feasible: bool
    # the fastest lossless algorithm at (n, P) and its predicted time (the
    # selector's, as for the tuned algorithm unless ``measure`` was given)
    exact_algorithm: str | None = None
    exact_time_s: float | None = None

    @property
    def sparse_pays(self) -> bool | None:
        """True when the tuned setting is faster than the best exact algorithm;
        None when the profile has no exact algorithm to compare with."""
        return None if self.exact_time_s is None else self.time_s < self.exact_time_s


REFERENCE_DENSITY = 0.01  # the default density floor: parity with dense in the convergence tables
MAX_DENSITY = 0.1


def xi_at_reference(profile) -> float:
    """The profile's xi at 1% density, or inf when the profile has no xi: a
    calibration point for ``xi_max`` (xi is measured relative to one step's
    gradient and error-feedback residuals make it exceed 1, docs/PROFILES.md,
    so a fixed absolute limit would be unreachable on some machines and void
    on others).  With a density floor at 1% too it only bites above it."""
    xi = xi_at(profile, REFERENCE_DENSITY)
    return float("inf") if xi is None else xi


def tune(profile, n: int, P: int, *, algorithm: str = "oktopk",
         density_min: float = REFERENCE_DENSITY, xi_max: float | None = None,
         capture_min: float | None = None,
         tau_prime_max: int = 64, density_max: float = MAX_DENSITY, trials: int = 60,
         storage: str | None = None, study_name: str | None = None, seed: int = 0,
         measure=None, selector: Selector | None = None) -> TuneResult:
    """Find density, tau' and tau minimizing time per iteration under the guard.

    The result also carries the fastest lossless algorithm at (n, P) and its
    predicted time (``exact_algorithm``, ``exact_time_s``): where that is
    faster (``sparse_pays`` False), sparsifying costs accuracy for nothing.

    Args:
        profile: a Profile (or its JSON document as a dict).
        n, P: tensor size and process count.
        density_min, density_max: the densities searched (log-uniform); the
            floor is the accuracy guard (default 1%, see the module docstring).
        xi_max: largest tolerated xi (Assumption 1 gap relative to the gradient
            norm), or None for no xi guard (default); see :func:`xi_at_reference`.
        capture_min: least share of the averaged gradient's norm in its top-k
            entries (profile field ``xi.captured_norm``), or None (default).
        tau_prime_max: largest tolerated threshold-refresh interval.
        storage: a file path for optuna's JournalStorage (resumable); None = in memory.
        measure: optional ``measure(density, tau_prime, tau) -> seconds`` to
            optimize measured instead of predicted time.
    """
    import optuna

    profile = Profile.of(profile)
    if not 0 < density_min <= density_max <= 1:
        raise ValueError(f"need 0 < density_min <= density_max <= 1, got "
                         f"{density_min!r}, {density_max!r}")
    if capture_min is not None:
        if not 0 < capture_min <= 1:
            raise ValueError(f"capture_min must be in (0, 1], got {capture_min!r}")
        if not xi_curve(profile, "captured_norm")[0]:
            raise ValueError("capture_min needs the profile's xi.captured_norm, which profiles "
                             "made before 2026-11-27 lack: re-run `autotune profile`")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if xi_max is None:
        xi_max = float("inf")
    sel = selector or Selector(profile)
    has_xi = bool(xi_curve(profile)[0])

    def violation(d, tp):
        xi = xi_at(profile, d) if has_xi and math.isfinite(xi_max) else None
        cap = xi_at(profile, d, "captured_norm") if capture_min is not None else None
        return [0.0 if xi is None else xi - xi_max, float(tp - tau_prime_max),
                0.0 if cap is None else capture_min - cap]

    def objective(trial):
        d = trial.suggest_float("density", density_min, density_max, log=True)
        tp = trial.suggest_int("tau_prime", 1, 128, log=True)
        tau = trial.suggest_int("tau", 1, 256, log=True)
        cons = violation(d, tp)
        trial.set_user_attr("constraint", cons)
        if hasattr(trial, "set_constraint"):  # optuna >= 5
            trial.set_constraint("xi", cons[0])
            trial.set_constraint("tau_prime", cons[1])
            trial.set_constraint("captured_norm", cons[2])
        if measure is not None:
            return float(measure(d, tp, tau))
        from . import costmodel

        learned, model = sel.predict(algorithm, n, P, d)
        # the learned correction applies to the default tau'; the tau'/tau
        # dependence comes from the cost model's refresh terms
        base = costmodel.predict(sel.machine, algorithm, n, P, d, tau_prime=32, tau=64)
        this = costmodel.predict(sel.machine, algorithm, n, P, d, tau_prime=tp, tau=tau)
        return learned * this / base

    if hasattr(optuna.trial.Trial, "set_constraint"):
        sampler = optuna.samplers.TPESampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(
            seed=seed, constraints_func=lambda t: t.user_attrs["constraint"])
    if storage:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        store = JournalStorage(JournalFileBackend(storage))
    else:
        store = None
    name = study_name or (f"{algorithm}-n{n}-P{P}-d{density_min:g}-{density_max:g}-xi{xi_max:g}"
                          + ("" if capture_min is None else f"-cap{capture_min:g}"))
    study = optuna.create_study(study_name=name, storage=store, sampler=sampler,
                                direction="minimize", load_if_exists=True)
    done = len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE])
    if trials > done:
        study.optimize(objective, n_trials=trials - done)
    feasible = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                and all(c <= 0 for c in t.user_attrs["constraint"])]
    pool = feasible or [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(pool, key=lambda t: t.value)
    d = best.params["density"]
    try:
        exact = sel.choose(n, P, d, lossy_ok=False)
        exact_algo, exact_s = exact.algorithm, exact.predicted_s[exact.algorithm]
    except ValueError:  # the profile knows no lossless algorithm
        exact_algo, exact_s = None, None
    return TuneResult(d, best.params["tau_prime"], best.params["tau"], best.value,
                      xi_at(profile, d) if has_xi else None, len(study.trials), bool(feasible),
                      exact_algo, exact_s)


class OnlineDensityGuard:
    """Adjust the density during training from xi observed on real gradients.

    Every ``every`` steps the caller passes the step's exact averaged gradient
    and the sparse result (e.g. one extra dense allreduce every few hundred
    steps); the guard computes xi = ||dense_topk - sparse|| / ||dense|| and
    multiplies the density by ``up`` when xi exceeds ``xi_max``, by ``down``
    when it is below ``xi_max / 2``, within [lo, hi].
    """

    def __init__(self, density: float, *, xi_max: float = 0.5, every: int = 200,
                 up: float = 1.5, down: float = 0.8, lo: float = 1e-4, hi: float = 0.1):
        if not 0 < density <= 1 or xi_max <= 0 or every < 1:
            raise ValueError("density in (0, 1], xi_max > 0 and every >= 1 are required")
        self.density, self.xi_max, self.every = density, xi_max, every
        self.up, self.down, self.lo, self.hi = up, down, lo, hi
        self.history: list[tuple[int, float, float]] = []

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def observe(self, step: int, exact_mean, sparse_mean) -> float:
        import numpy as np

        from kernels import topk_indices, k_from_density

        exact = np.asarray(exact_mean, dtype=np.float64).ravel()
        k = k_from_density(exact.size, self.density)
        ref = np.zeros_like(exact)
        idx = topk_indices(exact, k)
        ref[idx] = exact[idx]
        norm = float(np.linalg.norm(exact)) or 1.0
        xi = float(np.linalg.norm(ref - np.asarray(sparse_mean, dtype=np.float64).ravel())) / norm
        if xi > self.xi_max:
            self.density = min(self.hi, self.density * self.up)
        elif xi < self.xi_max / 2:
            self.density = max(self.lo, self.density * self.down)
        self.history.append((step, xi, self.density))
        return self.density

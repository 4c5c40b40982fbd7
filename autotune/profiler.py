"""``autotune profile``: measure this machine and write its profile.

Run under MPI (``mpiexec -n 4 autotune profile --quick`` or
``autotune profile --np 4 --quick``); every rank measures, rank 0 shows the
progress and writes the file.  Four parts, in this order:

1. **alpha/beta** of point-to-point (sendrecv, all rank pairs at once) and of
   the native collectives the algorithms use (allgather, allgatherv,
   alltoallv, allreduce, bcast), OSU-style over powers of two (the full plan
   also samples between them, :func:`primitive_sizes`): a warm-up call, then timed
   repeats each started after a barrier; small messages are timed in batches
   so the barrier's exit skew does not dominate; the repeats of all sizes
   are interleaved so a busy host's changing load hits every size alike.
   Each primitive is fitted to its model shape (autotune.profile: e.g.
   allreduce ``2a*ceil(log2 P) + 2b*m*(P-1)/P``) on the medians of repeats,
   minimising relative errors so the microsecond-scale small sizes count as
   much as the large ones (:func:`fit_linear`: plain, bisquare-reweighted or
   least-median, whichever predicts left-out sizes best).  Every third size
   is held out of the fit and the median relative error of the prediction
   on those sizes is recorded.
2. **algorithm runs**: every registered algorithm (``collectives.ALGORITHMS``,
   iterated, so new ones are picked up) on heavy-tailed gradient-like data,
   on a grid of n and density, at P and at smaller process counts
   (sub-communicators of 2, 4, ... ranks; the ranks left out sleep).  Warm-up
   calls first so error feedback and reused thresholds are in steady state.
   Raw times per repeat, bytes sent (max over ranks) and the per-phase split
   are kept: the training data of the learned selector.
3. **local compute** on rank 0 alone (the others sleep): exact top-k,
   threshold selection, COO reduction and scatter-add, fitted as
   ``t = c0 + c1*n``.
4. **xi** (Li & Hoefler, PPoPP'22, Assumption 1), see :func:`assumption1_gap`,
   on real gradients: from a short data-parallel training run of a small MLP
   on scikit-learn's ``load_digits`` (each rank its shard), or from gradient
   snapshots given with ``--gradients DIR``.
"""
from __future__ import annotations

import copy
import datetime as _dt
import itertools
import math
import os
import re
import socket
import sys
import time
from pathlib import Path

import numpy as np

import kernels
from collectives import ALGORITHMS, MPICommunicator, timeit

from .profile import (
    COMPUTE_KERNELS,
    PRIMITIVES,
    Profile,
    concurrency,
    cpu_model,
    gpu_model,
    model_string,
    model_terms,
    nccl_version,
)

__all__ = ["PLANS", "ProfilerError", "assumption1_gap", "choose_segments", "fit_linear",
           "fit_primitive", "main", "refit_profile", "run_profile"]


class ProfilerError(RuntimeError):
    """A problem every rank agrees on (bad option, missing device, bad input files)."""


# What each --sizes plan measures.  "tiny" exists for the test-suite.
PLANS = {
    "tiny": dict(
        log2_bytes=list(range(2, 17, 2)), prim_warmup=1, prim_repeat=3, prim_budget_s=0.05,
        algo_log2n=[10], densities=[0.01], algo_warmup=2, algo_repeat=2, algo_budget_s=0.1,
        compute_log2n=[10, 12, 14], compute_repeat=3, xi_steps=6, xi_every=2,
        xi_densities=[0.01, 0.1]),
    "quick": dict(
        log2_bytes=list(range(2, 23)), prim_warmup=2, prim_repeat=15, prim_budget_s=0.3,
        algo_log2n=[12, 16, 20], densities=[0.01], algo_warmup=3, algo_repeat=5,
        algo_budget_s=0.3, compute_log2n=[12, 14, 16, 18, 20], compute_repeat=5, xi_steps=40,
        xi_every=4, xi_densities=[0.001, 0.01, 0.05, 0.1]),
    "full": dict(
        log2_bytes=list(range(2, 27)), half_octaves=True, prim_warmup=3, prim_repeat=11,
        prim_budget_s=4.0,
        algo_log2n=[12, 14, 16, 18, 20], densities=[0.001, 0.01, 0.05], algo_warmup=5,
        algo_repeat=7, algo_budget_s=3.0, lossless_log2n=[22, 23, 24], odd_process_counts=True,
        compute_log2n=[12, 14, 16, 18, 20, 22],
        compute_repeat=7, xi_steps=300, xi_every=10, xi_densities=[0.001, 0.01, 0.05, 0.1]),
}

_KINDS = ("select", "comm", "reduce", "control", "other")
_GPU_COMPUTE_EXTRA = (24, 26)  # extra log2 sizes of the compute sweep on a GPU
_GPU_ALGO_EXTRA = (22, 24)     # extra log2 sizes of the algorithm runs on a GPU
_BATCH_TARGET_S = 5e-3  # small messages are timed in batches of about this long


# -- fitting --------------------------------------------------------------------------
def _wls(X, t, w, cols):
    """Least squares of relative residuals (t - X c)/t with extra weights w,
    on the columns ``cols``; a coefficient coming out negative is dropped
    (fixed at 0) and the rest refitted.  Returns (coef of len 2, cols)."""
    cols = list(cols)
    while True:
        sw = np.sqrt(w) / t
        c, *_ = np.linalg.lstsq(X[:, cols] * sw[:, None], t * sw, rcond=None)
        neg = [j for j, v in zip(cols, c) if v < 0]
        if not neg or len(cols) == 1:
            break
        cols = [j for j in cols if j != neg[0]]
    coef = np.zeros(X.shape[1])
    coef[cols] = np.maximum(c, 0.0)
    return coef, cols


def _fit_bisquare(X, t):
    """Iteratively reweighted relative least squares, Tukey's bisquare weights."""
    w = np.ones_like(t)
    coef, cols = _wls(X, t, w, [0, 1])
    for _ in range(50):
        r = (t - X @ coef) / t
        scale = max(1.4826 * float(np.median(np.abs(r))), 0.01)
        u = r / (4.685 * scale)
        w_new = np.where(np.abs(u) < 1, (1 - u ** 2) ** 2, 0.0)
        if np.count_nonzero(w_new) < 3:
            break
        new, cols = _wls(X, t, w_new, [0, 1])
        converged = np.allclose(new, coef, rtol=1e-6, atol=0)
        coef, w = new, w_new
        if converged:
            break
    return coef, cols, w


def _fit_lms(X, t):
    """Least median of relative errors (Rousseeuw's LMS): the line through two
    points (or one, with one coefficient at 0) that minimises the median
    relative error, then relative least squares on its inliers."""
    n = len(t)
    best = (np.inf, None)
    for i in range(n):
        for col in (0, 1):  # one-coefficient candidates
            if X[i, col] > 0:
                c = np.zeros(2)
                c[col] = t[i] / X[i, col]
                med = float(np.median(np.abs(X @ c - t) / t))
                best = min(best, (med, c), key=lambda b: b[0])
        for j in range(i + 1, n):
            try:
                c = np.linalg.solve(X[[i, j]], t[[i, j]])
            except np.linalg.LinAlgError:
                continue
            if (c < 0).any():
                continue
            med = float(np.median(np.abs(X @ c - t) / t))
            if med < best[0]:
                best = (med, c)
    r = (t - X @ best[1]) / t
    scale = max(1.4826 * (1 + 5 / max(n - 2, 1)) * float(np.sqrt(np.median(r ** 2))), 0.01)
    w = (np.abs(r) <= 2.5 * scale).astype(float)
    coef, cols = _wls(X, t, w, [0, 1])
    return coef, cols, w


def _fit_plain(X, t):
    w = np.ones_like(t)
    coef, cols = _wls(X, t, w, [0, 1])
    return coef, cols, w


_FITS = {"ls": _fit_plain, "bisquare": _fit_bisquare, "lms": _fit_lms}


def _loo_error(fit, X, t) -> float:
    """Median relative error of leave-one-out predictions."""
    errs = []
    for i in range(len(t)):
        keep = np.arange(len(t)) != i
        coef, _, _ = fit(X[keep], t[keep])
        errs.append(abs(float(X[i] @ coef) - t[i]) / t[i])
    return float(np.median(errs))


def fit_linear(X, t, *, method: str = "auto", return_info: bool = False):
    """Fit ``t ~ X @ c`` (two coefficients, both >= 0) minimising relative errors.

    Every method weighs a point by its relative error ((t_i - X_i c) / t_i),
    so latency-dominated small sizes count as much as the large ones:
      ls:       relative least squares (weighted least squares, weights 1/t^2);
      bisquare: the same, iteratively reweighted with Tukey's bisquare, so a
                few sizes outside the model's regime (an MPI protocol switch,
                a cache level, a token-bucket burst) do not bend the fit for
                all the others;
      lms:      least median of relative errors, then least squares on its
                inliers (robust to up to half the points);
      auto:     the one of the three with the smallest leave-one-out median
                relative error on these points (``ls`` below 6 points).
    A coefficient that would come out negative is fixed at 0.

    Returns:
        (coefficients, standard errors) or, with ``return_info``, also the
        final weights and a dict {"method", "loo_median_rel_err"}.  Standard
        errors come from the final weighted fit (sigma^2 (X^T W X)^-1); None
        for a coefficient fixed at 0 or without a degree of freedom.
    """
    X = np.asarray(X, dtype=np.float64)
    t = np.maximum(np.asarray(t, dtype=np.float64), 1e-12)
    cv = None
    if method == "auto":
        if len(t) >= 6:
            scores = {k: _loo_error(f, X, t) for k, f in _FITS.items()}
            method = min(scores, key=scores.get)
            cv = scores[method]
        else:
            method = "ls"
    coef, cols, w = _FITS[method](X, t)
    err: list = [None, None]
    dof = float(np.sum(w > 0)) - len(cols)
    if dof > 0:
        sw = np.sqrt(w) / t
        Xw = X[:, cols] * sw[:, None]
        r = (t - X @ coef) * sw
        s2 = float(r @ r) / dof
        try:
            cov = s2 * np.linalg.inv(Xw.T @ Xw)
            for i, j in enumerate(cols):
                err[j] = float(math.sqrt(max(cov[i, i], 0.0)))
        except np.linalg.LinAlgError:
            pass
    out = ([float(coef[0]), float(coef[1])], err)
    if return_info:
        return out + (w, {"method": method, "loo_median_rel_err": cv})
    return out


def heldout_mask(count: int) -> list[bool]:
    """Every third size (the 2nd, 5th, ...) is held out; never the largest,
    so the held-out error measures interpolation, not extrapolation."""
    return [i % 3 == 1 and i != count - 1 for i in range(count)]


# Regime-aware fits: at most this many size segments, each fitted on at least
# this many sizes (two coefficients and two degrees of freedom).
MAX_SEGMENTS = 4
MIN_SIZES_PER_SEGMENT = 4
# More segments must lower the leave-one-out error by more than this (relative,
# plus 0.2 percentage points) to be preferred: the simplest adequate model wins.
_PARSIMONY = 0.10


def _segment_of(m: float, starts) -> int:
    """Index of the segment covering m: the last whose start is <= m (else 0)."""
    return max(0, int(np.searchsorted(np.asarray(starts, dtype=np.float64), m, side="right")) - 1)


def _starts(firsts, lasts) -> list[int]:
    """Where each segment starts, from its first and last measured sizes.

    A size between two segments' measured ranges belongs to the nearer one in
    log size: the boundary is the geometric mean of the neighbours (rounded
    up, so an exact tie -- a held-out power of two midway -- goes to the
    upper segment).  The first segment starts at its first size (and covers
    everything below it too).
    """
    out = [int(firsts[0])]
    for last, first in zip(lasts, firsts[1:]):
        out.append(int(math.ceil(math.sqrt(float(last) * float(first)) - 1e-9)))
    return out


def _ls(X, t):
    return _wls(X, t, np.ones_like(t), [0, 1])[0]


def _segment_fitter(X, t):
    """``fit(lo, hi, skip)``: relative least squares of sizes [lo, hi) less
    ``skip`` (None: all), each distinct segment fitted once."""
    cache: dict = {}

    def fit(lo, hi, skip):
        key = (lo, hi, skip)
        if key not in cache:
            idx = [j for j in range(lo, hi) if j != skip]
            cache[key] = _ls(X[idx], t[idx])
        return cache[key]

    return fit


def _segmentation_loo(X, t, m, bounds, fit=None) -> float:
    """Mean relative error of leave-one-out predictions of a segmentation.

    The mean, not the median: a split that fits most sizes but misses the
    largest few by 2x (cache giving way to DRAM above a few MiB, the regime
    every prediction beyond the profile's sizes extrapolates from) must score
    worse than one that fits them all a little less tightly.

    ``bounds`` are index boundaries into the (sorted) sizes.  Each size is
    left out in turn, its segment refitted without it, the segment starts
    recomputed from the remaining sizes (:func:`_starts`), and the size
    predicted by the segment that then covers it -- exactly how
    a held-out size between two segments is predicted.  ``fit`` is a
    :func:`_segment_fitter` (shared by callers that score many splits).
    """
    fit = fit or _segment_fitter(X, t)
    errs = []
    for i in range(len(t)):
        coefs, firsts, lasts = [], [], []
        for lo, hi in zip(bounds, bounds[1:]):
            inside = lo <= i < hi
            coefs.append(fit(lo, hi, i if inside else None))
            firsts.append(m[lo + 1] if inside and i == lo else m[lo])
            lasts.append(m[hi - 2] if inside and i == hi - 1 else m[hi - 1])
        c = coefs[_segment_of(m[i], _starts(firsts, lasts))]
        errs.append(abs(float(X[i] @ c) - t[i]) / t[i])
    return float(np.mean(errs))


def choose_segments(X, t, m, *, max_segments: int = MAX_SEGMENTS,
                    min_sizes: int = MIN_SIZES_PER_SEGMENT):
    """Split sizes (sorted ascending) into 1..max_segments contiguous segments.

    Every split with at least ``min_sizes`` sizes per segment is scored by
    :func:`_segmentation_loo` (relative least squares per segment); per
    number of segments the best split is kept, and the fewest segments whose
    score is within ``_PARSIMONY`` of the best score win.  Only the sizes
    given (the training sizes) are used.

    Returns:
        (index bounds, e.g. (0, 7, 16); {segments: best leave-one-out mean error})
    """
    n = len(t)
    fit = _segment_fitter(X, t)  # shared by every split: a segment is fitted once
    best: dict[int, tuple[float, tuple]] = {}
    for r in range(1, max_segments + 1):
        if r * min_sizes > n:
            break
        for cuts in itertools.combinations(range(min_sizes, n - min_sizes + 1), r - 1):
            b = (0, *cuts, n)
            if any(hi - lo < min_sizes for lo, hi in zip(b, b[1:])):
                continue
            score = _segmentation_loo(X, t, m, b, fit)
            if r not in best or score < best[r][0]:
                best[r] = (score, b)
    if not best:  # fewer sizes than one segment needs: one line
        return (0, n), {}
    top = min(v[0] for v in best.values())
    r = min(k for k, v in best.items() if v[0] <= top * (1 + _PARSIMONY) + 0.002)
    return best[r][1], {k: v[0] for k, v in best.items()}


def fit_primitive(name: str, samples: list[dict], shared_medium: bool) -> dict:
    """Fit one primitive on its non-held-out samples: one alpha-beta line over
    every size (``alpha_s``, ``beta_s_per_byte``) and the regime-aware
    piecewise model (``segments``) that predictions use.

    The held-out sizes (``heldout`` in each sample) are predicted by the
    segment covering them; ``heldout_median_rel_err`` is the piecewise
    model's, ``line_heldout_median_rel_err`` the single line's.
    """
    samples = sorted(samples, key=lambda s: s["bytes"])
    P = samples[0]["P"]
    A, B = model_terms(name, P)
    m = np.array([float(s["bytes"]) for s in samples])
    X = np.array([[model_terms(name, s["P"])[0], s["bytes"] * model_terms(name, s["P"])[1]]
                  for s in samples])
    t = np.maximum(np.array([float(np.median(s["times_s"])) for s in samples]), 1e-12)
    held = np.array([bool(s.get("heldout", False)) for s in samples])
    fit = ~held
    (a, b), (ea, eb), _, info = fit_linear(X[fit], t[fit], return_info=True)
    line_rel = np.abs(X @ np.array([a, b]) - t) / t

    Xf, tf, mf = X[fit], t[fit], m[fit]
    bounds, scores = choose_segments(Xf, tf, mf)
    segments, weights = [], np.ones(len(tf))
    starts = _starts([mf[lo] for lo in bounds[:-1]], [mf[hi - 1] for hi in bounds[1:]])
    for lo, hi, start in zip(bounds, bounds[1:], starts):
        (sa, sb), (sea, seb), w, sinfo = fit_linear(Xf[lo:hi], tf[lo:hi], return_info=True)
        weights[lo:hi] = w
        segments.append({"from_bytes": start, "measured_bytes": [int(mf[lo]), int(mf[hi - 1])],
                         "alpha_s": sa, "beta_s_per_byte": sb, "alpha_stderr": sea,
                         "beta_stderr": seb, "sizes": hi - lo, "fit_method": sinfo["method"]})
    coef = [np.array([sg["alpha_s"], sg["beta_s_per_byte"]]) for sg in segments]
    pred = np.array([X[i] @ coef[_segment_of(m[i], starts)] for i in range(len(t))])
    rel = np.abs(pred - t) / t
    for s, wi in zip((s for s, f in zip(samples, fit) if f), weights):
        s["fit_weight"] = round(float(wi), 3)
    return {
        "alpha_s": a, "beta_s_per_byte": b, "alpha_stderr": ea, "beta_stderr": eb,
        "model": model_string(name),
        "heldout_median_rel_err": float(np.median(rel[held])) if held.any() else None,
        "fit_median_rel_err": float(np.median(rel[fit])),
        "line_heldout_median_rel_err": float(np.median(line_rel[held])) if held.any() else None,
        "line_fit_median_rel_err": float(np.median(line_rel[fit])),
        "fit_method": info["method"],
        "fit_loo_median_rel_err": info["loo_median_rel_err"],
        "segments": segments,
        "segments_loo_mean_rel_err": {str(k): v for k, v in scores.items()},
        "shared_medium": shared_medium,
        "beta_link_s_per_byte": b / concurrency(name, P) if shared_medium else b,
        "samples": samples,
    }


def refit_profile(prof: Profile) -> Profile:
    """Refit every measured primitive, and the compute kernels, from the raw
    samples stored in ``prof`` (no measurement); the held-out flags stored
    with the samples are kept.
    Published profiles have no samples to refit and are refused."""
    if prof.data["source"] != "measured":
        raise ProfilerError(f"{prof.path}: a {prof.data['source']} profile has no measured "
                            "samples to refit")
    data = copy.deepcopy(prof.data)
    for name, rec in data["primitives"].items():
        samples = rec.get("samples") or []
        if len(samples) < 3:
            raise ProfilerError(f"{prof.path}: primitive {name} has {len(samples)} samples; "
                                "nothing to refit")
        keep = {k: v for k, v in rec.items() if k not in _FIT_KEYS}
        data["primitives"][name] = {**keep, **fit_primitive(name, samples,
                                                          bool(rec.get("shared_medium")))}
    if data["compute"].get("samples"):
        data["compute"].update(fit_compute(data["compute"]["samples"]))
    data.setdefault("settings", {})["refit"] = {
        "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "how": "autotune profile --refit: regime-aware fits (and compute fits) from the "
               "stored raw samples"}
    return Profile(data, prof.path)


# Keys fit_primitive writes (a refit replaces them; anything else is kept).
_FIT_KEYS = ("alpha_s", "beta_s_per_byte", "alpha_stderr", "beta_stderr", "heldout_median_rel_err",
             "fit_median_rel_err", "line_heldout_median_rel_err", "line_fit_median_rel_err",
             "fit_method", "fit_loo_median_rel_err", "segments", "segments_loo_mean_rel_err",
             "segments_loo_median_rel_err",  # the key of profiles fitted before 2026-11-26 15:30
             "beta_link_s_per_byte", "samples")


# -- helpers ------------------------------------------------------------------------
def _agree_max(comm, value: float) -> float:
    """The max over ranks (uncounted control traffic)."""
    if comm.size == 1:
        return float(value)
    return float(comm._allreduce(np.array([value], dtype=np.float64), "max")[0])


def _agree_error(comm, msg: str | None) -> None:
    """Raise the same ProfilerError on every rank if any rank has a message."""
    bad = _agree_max(comm, 1.0 if msg else 0.0)
    if bad:
        first = comm.bcast_obj(msg if comm.rank == 0 else None, 0)
        # the message of the lowest failing rank would need a gather; rank 0's,
        # or a generic one, is enough to say what to fix
        raise ProfilerError(first or msg or "a rank failed its checks (see its output)")


def _control(comm):
    """The MPI communicator under ``comm`` (itself on the MPI backend): NCCL has
    no sleeping barrier and no library string, and control data is host data."""
    return getattr(comm, "mpi", comm)


def _loadavg() -> list | None:
    """The host's 1/5/15-minute load averages (other work skews timings)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _xp(device: str):
    if device == "gpu":
        import cupy

        return cupy, cupy.cuda.get_current_stream().synchronize
    return np, None


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


class _Progress:
    """Progress of the profiler on rank 0's stderr (nothing elsewhere or with ``quiet``).

    On a terminal, one bar redrawn in place (at most every 0.1 s).  Anywhere
    else -- under mpiexec, whose ranks write to pipes, or into a log file -- a
    redrawn bar would show nothing until the end, so it writes whole flushed
    lines: one at the start, then at most one every ``interval_s`` (2 s), and
    the last step's (at ``close`` if the count fell short of the total), each
    with done/total, percent, elapsed seconds and the step.
    """

    LINE_INTERVAL_S = 2.0
    BAR_INTERVAL_S = 0.1

    def __init__(self, comm, total: int, quiet: bool = False, *, stream=None,
                 interval_s: float | None = None, clock=time.monotonic):
        self.on = comm.rank == 0 and not quiet
        self.stream = sys.stderr if stream is None else stream
        try:
            self.tty = bool(self.on and self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.interval_s = (interval_s if interval_s is not None else
                           self.BAR_INTERVAL_S if self.tty else self.LINE_INTERVAL_S)
        self.clock = clock
        self.t0 = clock()
        self.total = max(int(total), 1)
        self.done = 0
        self.what = "starting"
        self._shown = 0        # self.done when last written
        self._last = None      # clock() when last written
        self._width = 0        # length of the bar drawn last (tty)
        if self.on:
            self._write()      # at once: the first step can take a while

    def _text(self) -> str:
        pct = min(100, 100 * self.done // self.total)
        return f"[{self.done}/{self.total}] {pct:3d}% {self.clock() - self.t0:6.1f} s  {self.what}"

    def _write(self) -> None:
        if self.tty:
            import shutil

            cols = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
            fill = min(self.done, self.total) * 20 // self.total
            text = f"profile |{'#' * fill}{'.' * (20 - fill)}| {self._text()}"[:cols]
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(f"autotune profile: {self._text()}\n")
        self.stream.flush()
        self._shown, self._last = self.done, self.clock()

    def step(self, what: str, k: int = 1) -> None:
        if not self.on:
            return
        self.done += k
        self.what = what
        if (self._last is None or self._shown < self.total <= self.done
                or self.clock() - self._last >= self.interval_s):
            self._write()

    def close(self) -> None:
        if not self.on:
            return
        if self.done and self._shown != self.done:
            self._write()  # the last step, where the rate limit held it back
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self.on = False


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
    one = []
    for _ in range(max(1, warmup)):  # the warm-up calls, timed; the fastest decides
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        one.append(time.perf_counter() - t0)
    t1 = _agree_max(comm, min(one))
    batch = int(min(1000, max(1, _BATCH_TARGET_S // max(t1, 1e-7))))
    reps = int(max(3, min(repeat, budget_s // max(t1 * batch, 1e-9))))
    return batch, reps


def time_adaptive(comm, fn, *, warmup: int, repeat: int, budget_s: float, sync=None):
    """Time ``fn`` like OSU: warm-up, then repeats after a barrier each
    (:func:`_calibrate` picks batch and repeats).  Returns seconds per call,
    one value per repeat (slowest rank)."""
    batch, reps = _calibrate(comm, fn, warmup=warmup, repeat=repeat, budget_s=budget_s, sync=sync)

    def call():
        for _ in range(batch):
            fn()

    times = timeit(call, comm=comm, warmup=0, repeat=reps, sync=sync)
    return np.asarray(times) / batch


def time_interleaved(comm, fns, *, warmup: int, repeat: int, budget_s: float, sync=None):
    """Time several callables (one per message size) with their repeats
    interleaved: round r times repeat r of every size in turn.

    On a shared, busy host the load changes during a sweep; timing all sizes
    of a repeat close together makes every size see the same mixture of
    load, so the medians form a curve the model can describe instead of a
    curve with steps where a neighbour's job started.  Returns one array of
    seconds per call per size.
    """
    plans = [_calibrate(comm, fn, warmup=warmup, repeat=repeat, budget_s=budget_s, sync=sync)
             for fn in fns]
    out = [[] for _ in fns]
    for r in range(max(reps for _, reps in plans)):
        for i, (fn, (batch, reps)) in enumerate(zip(fns, plans)):
            if r >= reps:
                continue

            def call(fn=fn, batch=batch):
                for _ in range(batch):
                    fn()

            out[i].append(float(timeit(call, comm=comm, warmup=0, repeat=1, sync=sync)[0]) / batch)
    return [np.asarray(t) for t in out]


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


def _time_algorithm(comm, cls, n: int, density, pool, plan, sync):
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
    comm.barrier()
    t0 = time.perf_counter()
    call()
    if sync:
        sync()
    t1 = _agree_max(comm, time.perf_counter() - t0)
    reps = int(max(2, min(plan["algo_repeat"], plan["algo_budget_s"] // max(t1, 1e-9))))
    traffics.clear()
    times = timeit(call, comm=comm, warmup=0, repeat=reps, sync=sync)
    sent = max(t.total().bytes_sent for t in traffics)
    sent = int(_agree_max(comm, float(sent)))
    mean = np.zeros(len(_KINDS))
    for t in traffics:
        kinds = t.by_kind()
        for j, k in enumerate(_KINDS):
            mean[j] += kinds.get(k, 0.0) / len(traffics)
    if comm.size > 1:
        mean = comm._allreduce(mean, "max")
    return {
        "algorithm": cls.name, "n": n, "P": comm.size, "density": density,
        "times_s": [float(v) for v in times], "median_s": float(np.median(times)),
        "bytes_sent_max": sent,
        "split_s": {k: float(v) for k, v in zip(_KINDS, mean) if v > 0},
    }


def measure_algorithms(world, plan, *, names, xp, sync, progress, seed: int = 0):
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
                            rows.append(_time_algorithm(sub, cls, n, d, pool, plan, sync))
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
def measure_compute(comm, plan, *, device: str, xp, sync, progress, density: float = 0.01):
    """Rank 0 times the kernels alone; returns the ``compute`` record (rank 0)."""
    samples = []
    if comm.rank == 0:
        rng = np.random.default_rng(1)
        rep = plan["compute_repeat"]
        sizes = list(plan["compute_log2n"])
        if device == "gpu":
            # per-element costs on a GPU only show above a few million elements (below,
            # launch and synchronisation dominate): extend the sweep so the slope is
            # measured where the collectives run, not extrapolated from 2^20
            sizes += [e for e in _GPU_COMPUTE_EXTRA if e > max(sizes)]
        for e in sizes:
            n = 1 << e
            x = xp.asarray(gradient_like(n, rng))
            k = kernels.k_from_density(n, density)
            thr = kernels.kth_magnitude(x, k)
            parts = 4  # a reduction merges several ranks' COO sets
            m = n // parts
            # sorted, distinct indices spread over [0, 4n): one random slot per stride of 4*parts
            idx = [xp.asarray((np.arange(m, dtype=np.int64) * (4 * parts)
                               + rng.integers(0, 4 * parts, m)).astype(np.int32))
                   for _ in range(parts)]
            val = [xp.asarray(rng.standard_normal(n // parts).astype(np.float32))
                   for _ in range(parts)]
            dense = xp.zeros(4 * n, dtype=np.float32)
            cat_i, cat_v = xp.concatenate(idx), xp.concatenate(val)
            y, acc = xp.asarray(gradient_like(n, rng)), xp.empty_like(x)
            cases = {
                "topk": (lambda: kernels.topk_select(x, k), n),
                "threshold": (lambda: kernels.threshold_select(x, thr), n),
                "reduce": (lambda: kernels.coo_sum(idx, val, 4 * n), n),
                "scatter_add": (lambda: kernels.scatter_add(dense, cat_i, cat_v), n),
                "stream": (lambda: xp.add(x, y, out=acc), n),
            }
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


# The stream kernel is fitted on its largest sizes only: the dense passes it prices
# matter on large tensors, which do not fit in a CPU's caches (smaller sizes run
# several times faster from cache and would set the slope).
_STREAM_FIT_SIZES = 3


def fit_compute(samples: list[dict]) -> dict:
    """Each compute kernel's t = c0 + c1*n fit from its raw samples."""
    rec = {}
    for kernel in COMPUTE_KERNELS:
        ss = sorted((s for s in samples if s["kernel"] == kernel), key=lambda s: s["n"])
        if kernel == "stream":
            if not ss:
                continue  # profiles made before the stream kernel was measured
            ss = ss[-_STREAM_FIT_SIZES:]
        if ss:
            X = np.array([[1.0, s["n"]] for s in ss])
            t = np.array([np.median(s["times_s"]) for s in ss])
            (c0, c1), (e0, e1) = fit_linear(X, t)
            rel = np.abs(X @ np.array([c0, c1]) - t) / t
            rec[kernel] = {"c0_s": c0, "c1_s_per_elem": c1, "c0_stderr": e0, "c1_stderr": e1,
                           "fit_median_rel_err": float(np.median(rel))}
        else:
            rec[kernel] = {"c0_s": 0.0, "c1_s_per_elem": 0.0}
    return rec


# -- 4. xi ---------------------------------------------------------------------------
def _topk_dense(v: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros_like(v)
    idx = kernels.topk_indices(v, k)
    out[idx] = v[idx]
    return out


def assumption1_gap(accs: np.ndarray, k: int):
    """The gap of Li & Hoefler's Assumption 1 for one step.

    With acc_i = alpha*G_i + eps_i the accumulator of rank i (gradient times
    learning rate, plus error-feedback residual), Assumption 1 bounds

        || Topk( (1/P) sum_i acc_i ) - Topk( (1/P) sum_i Topk(acc_i) ) ||
            <= xi * || alpha * G ||,      G = (1/P) sum_i G_i,

    i.e. how far the top-k of the averaged accumulators (what an exact
    global top-k would send) is from the top-k of the averaged local top-k's
    (what Ok-Topk computes).  Returns (the left-hand norm, the index set
    Ok-Topk selects); the caller divides by ||alpha*G|| to get xi.
    """
    P = accs.shape[0]
    exact = _topk_dense(accs.mean(axis=0, dtype=np.float64).astype(accs.dtype), k)
    local = np.stack([_topk_dense(accs[i], k) for i in range(P)])
    approx = _topk_dense(local.mean(axis=0, dtype=np.float64).astype(accs.dtype), k)
    gap = float(np.linalg.norm((exact - approx).astype(np.float64)))
    return gap, np.flatnonzero(approx), local


class _XiTracker:
    """Error-feedback residuals per density, and the xi of every measured step.

    ``values`` is xi as the paper defines it (Assumption 1's right-hand side
    is xi * ||lr * G_t||, G_t the step's averaged stochastic gradient, no
    residuals); ``values_acc`` divides the same gap by ||mean_i acc_i||, the
    averaged accumulators (gradient plus residuals) an exact allreduce would
    select from: a relative selection error, at most about 1 in practice,
    comparable to what :class:`autotune.tuner.OnlineDensityGuard` observes.
    ``captured`` is the share of the step's averaged gradient's L2 norm in its
    own top-k entries: it rises with the density on every step (so do its
    medians), unlike xi, which is why the tuner can use it as a guard.
    """

    def __init__(self, densities):
        self.densities = list(densities)
        self.res: dict = {}
        self.values: dict = {d: [] for d in self.densities}
        self.values_acc: dict = {d: [] for d in self.densities}
        self.captured: dict = {d: [] for d in self.densities}

    def step(self, grads: np.ndarray, lr: float, measure: bool) -> None:
        """``grads``: (P, n) per-rank gradients of one step."""
        P, n = grads.shape
        mean = grads.mean(axis=0, dtype=np.float64)
        mean_norm = float(np.linalg.norm(mean))
        denom = abs(lr) * mean_norm
        for d in self.densities:
            k = kernels.k_from_density(n, d)
            if measure and denom > 0:
                self.captured[d].append(float(np.linalg.norm(_topk_dense(mean, k))) / mean_norm)
            res = self.res.get(d)
            if res is None or res.shape != grads.shape:
                res = np.zeros_like(grads)
            acc = lr * grads + res
            gap, selected, local = assumption1_gap(acc, k)
            # Ok-Topk's residual: a value leaves the accumulator only if this
            # rank selected it locally and it made the global selection
            sent = np.zeros_like(acc, dtype=bool)
            sent[:, selected] = True
            sent &= local != 0
            self.res[d] = np.where(sent, 0, acc)
            if measure and denom > 0:
                self.values[d].append(gap / denom)
                acc_norm = float(np.linalg.norm(acc.mean(axis=0, dtype=np.float64)))
                if acc_norm > 0:
                    self.values_acc[d].append(gap / acc_norm)

    @staticmethod
    def _summary(values: dict) -> tuple[dict, float | None]:
        by = {str(d): (float(np.median(v)) if v else None) for d, v in values.items()}
        allv = [x for v in values.values() for x in v]
        return by, (float(np.median(allv)) if allv else None)

    def record(self, source: str, **extra) -> dict:
        by, med = self._summary(self.values)
        by_acc, med_acc = self._summary(self.values_acc)
        by_cap, _ = self._summary(self.captured)
        return {"source": source, "by_density": by, "median": med,
                "samples": {str(d): [float(x) for x in v] for d, v in self.values.items()},
                "definition": "||Topk(mean_i acc_i) - Topk(mean_i Topk(acc_i))||"
                              " / ||lr*mean_i G_i||, acc_i = lr*G_i + residual_i"
                              " (Li & Hoefler PPoPP'22, Assumption 1: the right-hand side is"
                              " xi*||alpha*G_t(w_t)||, the step's learning-rate-scaled"
                              " averaged stochastic gradient, without residuals)",
                "relative_to_accumulator": {
                    "by_density": by_acc, "median": med_acc,
                    "definition": "the same gap / ||mean_i acc_i|| (averaged accumulators,"
                                  " residuals included): a relative selection error, not the"
                                  " paper's xi"},
                "captured_norm": {
                    "by_density": by_cap,
                    "definition": "||Topk(mean_i G_i)|| / ||mean_i G_i||: the share of the step's"
                                  " averaged gradient's L2 norm in its own top-k entries (median"
                                  " over the measured steps); rises with the density"},
                **extra}


def xi_from_training(comm, plan, *, seed: int = 0, lr: float = 0.1, batch: int = 32,
                     hidden: int = 64, progress=None) -> dict:
    """Train a small MLP on load_digits, data-parallel over the ranks, and
    measure xi on its real per-rank gradients every few steps."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    mine = np.arange(comm.rank, len(y), comm.size)  # this rank's shard
    Xs, ys = X[mine], y[mine]
    rng = np.random.default_rng([seed, 7])  # same initial weights on every rank
    d_in, d_out = X.shape[1], 10
    shapes = [(d_in, hidden), (hidden,), (hidden, d_out), (d_out,)]
    sizes = [int(np.prod(s)) for s in shapes]
    w = np.concatenate([rng.standard_normal(sizes[0]) * math.sqrt(2 / d_in), np.zeros(hidden),
                        rng.standard_normal(sizes[2]) * math.sqrt(2 / hidden), np.zeros(d_out)]
                       ).astype(np.float32)
    bounds = np.cumsum([0] + sizes)

    def unpack(v):
        return [v[bounds[i]:bounds[i + 1]].reshape(shapes[i]) for i in range(4)]

    def grad(v, xb, yb):
        W1, b1, W2, b2 = unpack(v)
        h = np.maximum(xb @ W1 + b1, 0)
        z = h @ W2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        p /= len(yb)
        gW2, gb2 = h.T @ p, p.sum(0)
        dh = (p @ W2.T) * (h > 0)
        gW1, gb1 = xb.T @ dh, dh.sum(0)
        return np.concatenate([gW1.ravel(), gb1, gW2.ravel(), gb2]).astype(np.float32)

    track = _XiTracker(plan["xi_densities"])
    brng = np.random.default_rng([seed, comm.rank])
    for step in range(plan["xi_steps"]):
        pick = brng.choice(len(ys), size=min(batch, len(ys)), replace=False)
        g = grad(w, Xs[pick], ys[pick])
        grads = comm.allgather(g)  # (P, n): every rank sees every gradient
        track.step(grads, lr, measure=(step + 1) % plan["xi_every"] == 0)
        w -= lr * grads.mean(axis=0)
        if progress:
            progress.step(f"xi training step {step + 1}")
    W1, b1, W2, b2 = unpack(w)
    acc = float(np.mean(np.argmax(np.maximum(X @ W1 + b1, 0) @ W2 + b2, axis=1) == y))
    return track.record(
        "training", model=f"MLP {d_in}-{hidden}-{d_out} (ReLU, softmax) on scikit-learn "
                          f"load_digits, {comm.size} shards, batch {batch}/rank, SGD lr {lr}",
        n_params=int(w.size), steps=plan["xi_steps"], measured_every=plan["xi_every"],
        train_accuracy=acc)


def load_gradient_dir(path) -> list[tuple[str, np.ndarray]]:
    """Gradient snapshots: every ``*.npy`` in DIR (sorted by name) is one step,
    a 2-D float array (workers, n) of the workers' gradients at that step.
    Loaded with ``allow_pickle=False``: a file holding objects is refused."""
    d = Path(path)
    if not d.is_dir():
        raise ProfilerError(f"--gradients {path}: not a directory")
    files = sorted(d.glob("*.npy"))
    if not files:
        raise ProfilerError(f"--gradients {path}: no .npy files in it")
    out = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except ValueError as e:
            raise ProfilerError(f"{f}: cannot load without pickle ({e})") from None
        except OSError as e:
            raise ProfilerError(f"{f}: not a readable .npy file ({e})") from None
        if a.ndim != 2 or a.shape[0] < 2 or not np.issubdtype(a.dtype, np.floating):
            raise ProfilerError(f"{f}: expected a 2-D float array (workers >= 2, n), got "
                                f"shape {a.shape} dtype {a.dtype}")
        if not np.isfinite(a).all():
            raise ProfilerError(f"{f}: holds NaN or Inf")
        out.append((f.name, a.astype(np.float32, copy=False)))
    return out


def xi_from_files(snapshots, densities) -> dict:
    track = _XiTracker(densities)
    for _, a in snapshots:
        track.step(a, 1.0, measure=True)  # files hold lr-scaled gradients or raw: xi is scale-free
    return track.record("gradients", files=[name for name, _ in snapshots])


# -- fingerprint ---------------------------------------------------------------------
def fingerprint(comm, *, device: str, network: str | None) -> dict:
    ctl = _control(comm)
    name = socket.gethostname().encode()[:255]
    buf = np.zeros(256, dtype=np.uint8)
    buf[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    table = ctl.allgather(buf) if comm.size > 1 else buf[None]
    hosts = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in np.asarray(table)]
    uniq = sorted(set(hosts))
    return {
        "hosts": uniq,
        "ranks_per_host": max(hosts.count(h) for h in uniq),
        "cores_per_host": os.cpu_count(),  # rank 0's host (the cost model's contention)
        "cpu_model": cpu_model(),
        "gpu_model": gpu_model(device),
        "mpi_library": ctl.library_version(),
        "nccl_version": nccl_version(device),
        "P": comm.size,
        "device": device,
        "backend": comm.backend,
        "network": network or ("shm" if len(uniq) == 1 else "unknown"),
    }


# -- driver --------------------------------------------------------------------------
def run_profile(comm, *, plan_name: str = "quick", device: str = "cpu", network: str | None = None,
                gradients: str | None = None, max_bytes: int | None = None,
                algorithms: list[str] | None = None, quiet: bool = False,
                seed: int = 0, backend: str = "mpi") -> Profile | None:
    """Measure and return the Profile on rank 0 (None on the other ranks).

    Args:
        comm: an MPICommunicator over the ranks to profile.
        backend: ``mpi`` (payloads through ``comm``) or ``nccl``: payloads,
            the alpha/beta primitives and the algorithm runs go GPU to GPU
            through a :class:`collectives.NCCLCommunicator` bootstrapped over
            ``comm`` (needs ``device="gpu"``); barriers, timing reductions and
            the xi run's host gradients stay on MPI.

    Raises:
        ProfilerError: on every rank alike.
    """
    t_start = time.perf_counter()
    load_start = _loadavg()
    if backend not in ("mpi", "nccl"):
        raise ProfilerError(f"unknown backend {backend!r} (mpi or nccl)")
    if backend == "nccl" and device != "gpu":
        raise ProfilerError("--backend nccl moves device buffers: use it with --device gpu")
    if comm.size < 2:
        raise ProfilerError("a profile needs at least 2 ranks (mpiexec -n P, or --np P)")
    plan = PLANS[plan_name]
    msg = None
    if device == "gpu":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                msg = "--device gpu: no CUDA device visible"
            else:
                cupy.cuda.Device(comm.rank % cupy.cuda.runtime.getDeviceCount()).use()
        except Exception as e:  # cupy missing or broken driver
            msg = f"--device gpu needs cupy and a CUDA GPU ({type(e).__name__}: {e})"
    _agree_error(comm, msg)
    if backend == "nccl":
        msg = None
        try:
            from collectives import NCCLCommunicator

            comm = NCCLCommunicator(comm)
        except Exception as e:  # NCCL missing or failing to initialise on some rank
            msg = f"--backend nccl: cannot start NCCL ({type(e).__name__}: {e})"
            comm = _control(comm)
        _agree_error(_control(comm), msg)
    xp, sync = _xp(device)
    if device == "gpu":
        comm.sync_phases = True  # the per-phase split includes the GPU work (as in bench)
        # up to 2^20 a GPU collective is launch-bound: run the algorithms where the
        # kernels' cost shows too, so the learned correction covers that regime
        plan = dict(plan, algo_log2n=list(plan["algo_log2n"])
                    + [e for e in _GPU_ALGO_EXTRA if e > max(plan["algo_log2n"])])

    names = list(ALGORITHMS) if not algorithms else algorithms
    unknown = [a for a in names if a not in ALGORITHMS]
    _agree_error(comm, f"unknown algorithm(s) {unknown}; registered: {sorted(ALGORITHMS)}"
                 if unknown else None)

    snapshots, msg = None, None
    if gradients and comm.rank == 0:
        try:
            snapshots = load_gradient_dir(gradients)
        except ProfilerError as e:
            msg = str(e)
    _agree_error(comm, msg)

    fp = fingerprint(comm, device=device, network=network)
    shared_medium = len(fp["hosts"]) == 1
    max_bytes = max_bytes or (1 << max(plan["log2_bytes"]))
    # the lossless runs beyond algo_log2n stop where the primitives do
    plan = dict(plan, lossless_log2n=[e for e in plan.get("lossless_log2n", [])
                                      if e > max(plan["algo_log2n"]) and (4 << e) <= max_bytes])
    n_sizes = len(primitive_sizes(plan, max_bytes))
    total = (len(PRIMITIVES) * n_sizes + count_algorithm_steps(comm.size, plan, names)
             + len(COMPUTE_KERNELS) * (len(plan["compute_log2n"])
                                       + (len(_GPU_COMPUTE_EXTRA) if device == "gpu" else 0))
             + (0 if gradients else plan["xi_steps"]))
    progress = _Progress(comm, total, quiet)
    try:
        t0 = time.perf_counter()
        prims = measure_primitives(comm, plan, max_bytes=max_bytes, xp=xp, sync=sync,
                                   progress=progress, shared_medium=shared_medium)
        t1 = time.perf_counter()
        runs, skipped = measure_algorithms(comm, plan, names=names, xp=xp, sync=sync,
                                           progress=progress, seed=seed)
        t2 = time.perf_counter()
        compute = measure_compute(comm, plan, device=device, xp=xp, sync=sync, progress=progress)
        t3 = time.perf_counter()
        if gradients:
            xi = xi_from_files(snapshots, plan["xi_densities"]) if comm.rank == 0 else None
        else:
            xi = xi_from_training(comm, plan, seed=seed, progress=progress)
        t4 = time.perf_counter()
    finally:
        progress.close()
    if comm.rank != 0:
        return None
    settings = {
        "plan": plan_name, "max_bytes": max_bytes, "seed": seed,
        "algorithms": names, "densities": plan["densities"],
        "algo_log2n": plan["algo_log2n"], "lossless_log2n": plan["lossless_log2n"],
        "process_counts": process_counts(comm.size, plan.get("odd_process_counts", False)),
        "elapsed_s": {"primitives": t1 - t0, "algorithms": t2 - t1, "compute": t3 - t2,
                      "xi": t4 - t3, "total": time.perf_counter() - t_start},
        "loadavg_start": load_start, "loadavg_end": _loadavg(),
        "backend": comm.backend,
        "timing": "median of repeats; each repeat after a barrier, slowest rank's time; "
                  "small messages timed in batches of ~5 ms"
                  + ("; each repeat ends with a CUDA stream synchronize" if sync else ""),
    }
    return Profile.new(source="measured", fingerprint=fp, primitives=prims, compute=compute,
                       runs=runs, xi=xi, skipped=skipped, settings=settings)


def _parse_bytes(s: str | None) -> int | None:
    """'4M', '64KiB', '65536' -> bytes."""
    if not s:
        return None
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(?:i?b)?\s*", s.lower())
    if not m:
        raise ProfilerError(f"--max-bytes {s!r}: expected a size such as 4M, 64K or 65536")
    return int(float(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2]])


def refit_main(args) -> int:
    """``autotune profile --refit FILE``: refit from the stored samples, no MPI."""
    from .profile import ProfileError
    from .report import primitive_lines

    try:
        prof = refit_profile(Profile.load(args.refit))
    except (ProfileError, ProfilerError) as e:
        print(f"autotune profile: error: {e}", file=sys.stderr)
        return 2
    path = prof.save(args.out or args.refit)
    if not args.quiet:
        print("\n".join(primitive_lines(prof)))
    print(f"refitted {args.refit} -> {path}")
    return 0


def main(args) -> int:
    if getattr(args, "refit", None):
        return refit_main(args)
    comm = MPICommunicator()
    plan = args.sizes or ("quick" if args.quick else "full")
    out = args.out or f"profile-{args.network or 'shm'}-P{comm.size}.json"
    try:
        max_bytes = _parse_bytes(args.max_bytes)
        prof = run_profile(comm, plan_name=plan, device=args.device, network=args.network,
                           gradients=args.gradients, max_bytes=max_bytes,
                           algorithms=args.algorithms.split(",") if args.algorithms else None,
                           quiet=args.quiet, seed=args.seed,
                           backend=getattr(args, "backend", "mpi"))
    except ProfilerError as e:
        if comm.rank == 0:
            print(f"autotune profile: error: {e}", file=sys.stderr)
        return 2
    if comm.rank == 0:
        path = prof.save(out)
        from .report import summary_lines

        if not args.quiet:
            print("\n".join(summary_lines(prof)))
        el = prof.data["settings"]["elapsed_s"]["total"]
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB) in {el:.1f} s")
    return 0

"""Robust regression for the profile: relative least squares (plain, bisquare,
least median), the alpha-beta line and the regime segments of a primitive, the
compute kernels' lines, and ``refit_profile`` (the fits again from a file's
stored samples, no measurement)."""
from __future__ import annotations

import copy
import datetime as _dt
import itertools
import math

import numpy as np

from ..profile import COMPUTE_KERNELS, Profile, concurrency, model_string, model_terms
from .common import ProfilerError


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
    relative error, then relative least squares on its inliers.  Candidates
    in order (per point i: its one-coefficient lines, then its pairs (i, j >
    i)); the first with the smallest median wins."""
    n = len(t)
    cands = []  # (candidate coefficients, in order)
    for i in range(n):
        for col in (0, 1):  # one-coefficient candidates
            if X[i, col] > 0:
                c = np.zeros(2)
                c[col] = t[i] / X[i, col]
                cands.append(c)
        if i + 1 < n:
            cands.append(_lines_through(X, t, i))
    C = np.vstack(cands) if cands else np.zeros((0, 2))
    C = C[~np.isnan(C).any(axis=1) & ~(C < 0).any(axis=1)]
    meds = np.median(np.abs(X @ C.T - t[:, None]) / t[:, None], axis=0)
    best = (float(meds.min()), C[int(np.argmin(meds))]) if C.size else (np.inf, None)
    r = (t - X @ best[1]) / t
    scale = max(1.4826 * (1 + 5 / max(n - 2, 1)) * float(np.sqrt(np.median(r ** 2))), 0.01)
    w = (np.abs(r) <= 2.5 * scale).astype(float)
    coef, cols = _wls(X, t, w, [0, 1])
    return coef, cols, w


def _lines_through(X, t, i):
    """The lines through point i and each later point j (rows, j = i+1..n-1);
    NaN rows where the two points do not fix one."""
    j = np.arange(i + 1, len(t))
    A = np.stack([np.broadcast_to(X[i], (j.size, 2)), X[j]], axis=1)
    b = np.stack([np.full(j.size, t[i]), t[j]], axis=1)[..., None]
    try:
        return np.linalg.solve(A, b)[..., 0]
    except np.linalg.LinAlgError:  # one pair is singular: each on its own
        out = np.full((j.size, 2), np.nan)
        for r in range(j.size):
            try:
                out[r] = np.linalg.solve(A[r], b[r, :, 0])
            except np.linalg.LinAlgError:
                pass
        return out


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


class _SegmentFits:
    """Relative least squares of the sizes [lo, hi), each distinct segment
    fitted once and shared by every split scored: ``full(lo, hi)``, the
    coefficients on all of them, and ``loo(lo, hi)``, the prediction of
    each size i in [lo, hi) by the segment refitted without it."""

    def __init__(self, X, t):
        self.X, self.t = X, t
        self._full: dict = {}
        self._loo: dict = {}

    def full(self, lo, hi):
        key = (lo, hi)
        if key not in self._full:
            self._full[key] = _ls(self.X[lo:hi], self.t[lo:hi])
        return self._full[key]

    def loo(self, lo, hi):
        key = (lo, hi)
        if key not in self._loo:
            idx = np.arange(lo, hi)
            preds = []
            for i in idx:
                rest = idx[idx != i]
                preds.append(float(self.X[i] @ _ls(self.X[rest], self.t[rest])))
            self._loo[key] = np.array(preds)
        return self._loo[key]


def _segmentation_loo(X, t, m, bounds, fits=None) -> float:
    """Mean relative error of leave-one-out predictions of a segmentation.

    The mean, not the median: a split that fits most sizes but misses the
    largest few by 2x (cache giving way to DRAM above a few MiB, the regime
    every prediction beyond the profile's sizes extrapolates from) must score
    worse than one that fits them all a little less tightly.

    ``bounds`` are index boundaries into the (sorted) sizes.  Each size is
    left out in turn, its segment refitted without it, the segment starts
    recomputed from the remaining sizes (:func:`_starts`), and the size
    predicted by the segment that then covers it -- exactly how
    a held-out size between two segments is predicted.  ``fits`` is a
    :class:`_SegmentFits` (shared by callers that score many splits).
    """
    fits = fits or _SegmentFits(X, t)
    segs = list(zip(bounds, bounds[1:]))
    firsts = [m[lo] for lo, _ in segs]
    lasts = [m[hi - 1] for _, hi in segs]
    base = np.asarray(_starts(firsts, lasts), dtype=np.float64)
    own = np.repeat(np.arange(len(segs)), np.diff(bounds))
    # the segment covering each size; only a segment's first or last size, left
    # out, moves a start (the segment's own or the next one's)
    cover = np.maximum(np.searchsorted(base, m, side="right") - 1, 0)
    for s, (lo, hi) in enumerate(segs):
        for i, f, last in ((lo, m[lo + 1], lasts[s]), (hi - 1, firsts[s], m[hi - 2])):
            moved = firsts[:s] + [f] + firsts[s + 1:], lasts[:s] + [last] + lasts[s + 1:]
            cover[i] = _segment_of(m[i], _starts(*moved))
    pred = np.empty(len(t))
    for s, (lo, hi) in enumerate(segs):
        pred[lo:hi] = fits.loo(lo, hi)
    for i in np.flatnonzero(cover != own):  # covered by a neighbour, fitted on all its sizes
        pred[i] = float(X[i] @ fits.full(*segs[cover[i]]))
    return float(np.mean(np.abs(pred - t) / t))


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
    fits = _SegmentFits(X, t)  # shared by every split: a segment is fitted once
    best: dict[int, tuple[float, tuple]] = {}
    for r in range(1, max_segments + 1):
        if r * min_sizes > n:
            break
        for cuts in itertools.combinations(range(min_sizes, n - min_sizes + 1), r - 1):
            b = (0, *cuts, n)
            if any(hi - lo < min_sizes for lo, hi in zip(b, b[1:])):
                continue
            score = _segmentation_loo(X, t, m, b, fits)
            if r not in best or score < best[r][0]:
                best[r] = (score, b)
    if not best:  # fewer sizes than one segment needs: one line
        return (0, n), {}
    top = min(v[0] for v in best.values())
    r = min(k for k, v in best.items() if v[0] <= top * (1 + _PARSIMONY) + 0.002)
    return best[r][1], {k: v[0] for k, v in best.items()}


def _design(name: str, samples: list[dict]):
    """Sorted samples, their sizes m, the model's design matrix X, median times t
    and the held-out mask."""
    samples = sorted(samples, key=lambda s: s["bytes"])
    m = np.array([float(s["bytes"]) for s in samples])
    X = np.array([[model_terms(name, s["P"])[0], s["bytes"] * model_terms(name, s["P"])[1]]
                  for s in samples])
    t = np.maximum(np.array([float(np.median(s["times_s"])) for s in samples]), 1e-12)
    held = np.array([bool(s.get("heldout", False)) for s in samples])
    return samples, m, X, t, held


def _regimes(X, t, m):
    """Size regimes of ``t ~ X c`` over the ascending sizes ``m``: the split
    :func:`choose_segments` picks, each segment fitted by :func:`fit_linear`.
    Returns ([{"start", "lo", "hi", "coef", "stderr", "weights", "method"}], scores)."""
    bounds, scores = choose_segments(X, t, m)
    starts = _starts([m[lo] for lo in bounds[:-1]], [m[hi - 1] for hi in bounds[1:]])
    out = []
    for lo, hi, start in zip(bounds, bounds[1:], starts):
        coef, err, w, info = fit_linear(X[lo:hi], t[lo:hi], return_info=True)
        out.append({"start": start, "lo": lo, "hi": hi, "coef": coef, "stderr": err,
                    "weights": w, "method": info["method"]})
    return out, scores


def _regime_predict(regimes, X, m) -> np.ndarray:
    """Each size's prediction by the regime covering it."""
    starts = [r["start"] for r in regimes]
    return np.array([X[i] @ np.asarray(regimes[_segment_of(m[i], starts)]["coef"])
                     for i in range(len(m))])


def fit_segments(name: str, samples: list[dict]) -> dict:
    """The regime-aware piecewise model of one primitive, fitted on its
    non-held-out samples: ``segments``, ``segments_loo_mean_rel_err``, the
    held-out and fit errors of the piecewise model, and each training
    sample's final weight (``weights``, in the order of the sorted samples).
    :func:`fit_primitive` adds the single line."""
    samples, m, X, t, held = _design(name, samples)
    fit = ~held
    mf = m[fit]
    regimes, scores = _regimes(X[fit], t[fit], mf)
    segments = [{"from_bytes": r["start"],
                 "measured_bytes": [int(mf[r["lo"]]), int(mf[r["hi"] - 1])], "alpha_s": r["coef"][0], "beta_s_per_byte": r["coef"][1],
                 "alpha_stderr": r["stderr"][0], "beta_stderr": r["stderr"][1],
                 "sizes": r["hi"] - r["lo"], "fit_method": r["method"]} for r in regimes]
    rel = np.abs(_regime_predict(regimes, X, m) - t) / t
    return {
        "segments": segments,
        "segments_loo_mean_rel_err": {str(k): v for k, v in scores.items()},
        "heldout_median_rel_err": float(np.median(rel[held])) if held.any() else None,
        "fit_median_rel_err": float(np.median(rel[fit])),
        "weights": np.concatenate([r["weights"] for r in regimes]),
    }


def fit_primitive(name: str, samples: list[dict], shared_medium: bool) -> dict:
    """Fit one primitive on its non-held-out samples: one alpha-beta line over
    every size (``alpha_s``, ``beta_s_per_byte``) and the regime-aware
    piecewise model (``segments``, :func:`fit_segments`) that predictions use.

    The held-out sizes (``heldout`` in each sample) are predicted by the
    segment covering them; ``heldout_median_rel_err`` is the piecewise
    model's, ``line_heldout_median_rel_err`` the single line's.
    """
    samples, m, X, t, held = _design(name, samples)
    P = samples[0]["P"]
    fit = ~held
    (a, b), (ea, eb), _, info = fit_linear(X[fit], t[fit], return_info=True)
    line_rel = np.abs(X @ np.array([a, b]) - t) / t
    seg = fit_segments(name, samples)
    for s, wi in zip((s for s, f in zip(samples, fit) if f), seg["weights"]):
        s["fit_weight"] = round(float(wi), 3)
    return {
        "alpha_s": a, "beta_s_per_byte": b, "alpha_stderr": ea, "beta_stderr": eb,
        "model": model_string(name),
        "heldout_median_rel_err": seg["heldout_median_rel_err"],
        "fit_median_rel_err": seg["fit_median_rel_err"],
        "line_heldout_median_rel_err": float(np.median(line_rel[held])) if held.any() else None,
        "line_fit_median_rel_err": float(np.median(line_rel[fit])),
        "fit_method": info["method"],
        "fit_loo_median_rel_err": info["loo_median_rel_err"],
        "segments": seg["segments"],
        "segments_loo_mean_rel_err": seg["segments_loo_mean_rel_err"],
        "shared_medium": shared_medium,
        "beta_link_s_per_byte": b / concurrency(name, P) if shared_medium else b,
        "samples": samples,
    }


def refit_profile(prof: Profile) -> Profile:
    """Refit every measured primitive, and the compute kernels, from the raw
    samples stored in ``prof`` (no measurement); the held-out flags stored
    with the samples are kept.
    Published profiles have no samples to refit and are refused."""
    if not prof.measured:
        raise ProfilerError(f"{prof.path}: a {prof.source} profile has no measured "
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
            rec[kernel] = {"c0_s": c0, "c1_s_per_elem": c1, "c0_stderr": e0, "c1_stderr": e1}
            m = X[:, 1]
            if kernel == "stream":  # one line on its largest sizes
                pred = X @ np.array([c0, c1])
            else:  # size regimes, chosen as a primitive's are (the caches, then DRAM)
                regimes, _ = _regimes(X, np.maximum(t, 1e-12), m)
                rec[kernel]["segments"] = [
                    {"from_elems": int(r["start"]), "measured_elems": [int(m[r["lo"]]),
                                                                       int(m[r["hi"] - 1])],
                     "c0_s": r["coef"][0], "c1_s_per_elem": r["coef"][1]} for r in regimes]
                pred = _regime_predict(regimes, X, m)
            rec[kernel]["fit_median_rel_err"] = float(np.median(np.abs(pred - t) / t))
        else:
            rec[kernel] = {"c0_s": 0.0, "c1_s_per_elem": 0.0}
    return rec

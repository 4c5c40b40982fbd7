"""Selection kernels: exact top-k, threshold selection, threshold estimates.

All functions take and return arrays of the input's array module.
Indices are returned sorted ascending, as int32 (int64 when n >= 2**31), so
that every consumer sees a canonical, deterministic COO layout.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from ._xp import array_module, index_dtype


def k_from_density(n: int, density: float) -> int:
    """Number of values a density selects: at least 1, at most n.

    Raises:
        ValueError: density outside (0, 1].
    """
    if not (0.0 < density <= 1.0) or math.isnan(density):
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return min(n, max(1, int(round(density * n))))


def topk_indices(x, k: int):
    """Indices (sorted, int32) of the ``k`` largest-magnitude entries of flat ``x``.

    Ties at the k-th magnitude are broken by position (lowest index wins) so
    the result is a pure function of ``x``.
    """
    xp = array_module(x)
    n = x.size
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    itype = index_dtype(n)
    if k == 0:
        return xp.empty(0, dtype=itype)
    if k == n:
        return xp.arange(n, dtype=itype)
    mag = xp.abs(x)
    thr = xp.partition(mag, n - k)[n - k]  # exact k-th largest magnitude
    above = xp.flatnonzero(mag > thr)
    need = k - above.size
    ties = xp.flatnonzero(mag == thr)[:need]
    idx = xp.concatenate([above, ties])
    idx.sort()
    return idx.astype(itype, copy=False)


def kth_magnitude(x, k: int) -> float:
    """The exact k-th largest |x| (the top-k threshold); 1 <= k <= n."""
    xp = array_module(x)
    n = x.size
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    return float(xp.partition(xp.abs(x), n - k)[n - k])


def threshold_select(x, threshold: float):
    """COO of entries with ``|x| >= threshold``: (int32 indices sorted, values)."""
    xp = array_module(x)
    idx = xp.flatnonzero(xp.abs(x) >= threshold).astype(index_dtype(x.size), copy=False)
    return idx, x[idx]


def topk_select(x, k: int):
    """COO of the exact top-k by magnitude: (indices sorted, values)."""
    idx = topk_indices(x, k)
    return idx, x[idx]


def cap_selection(idx, vals, k: int):
    """Keep at most ``k`` entries of a COO set, the largest magnitudes first.

    Used after a threshold selection that may overshoot ``k`` (ties, a stale
    threshold): keeps traffic within its bound.  Output stays index-sorted.
    """
    if idx.size <= k:
        return idx, vals
    keep = topk_indices(vals, k)
    return idx[keep], vals[keep]


_STD_NORMAL = statistics.NormalDist()


def gaussian_threshold(x, density: float) -> float:
    """Gaussiank's threshold: |x| >= mean + std * z selects ``density`` of a normal x.

    Two-sided: P(|x - mu| > z sigma) = density  =>  z = isf(density / 2).
    """
    xp = array_module(x)
    mu = float(xp.mean(x, dtype=np.float64))
    sigma = float(xp.std(x, dtype=np.float64))
    q = min(max(density, 1e-12), 1.0 - 1e-12)
    return abs(mu) + sigma * _STD_NORMAL.inv_cdf(1.0 - q / 2.0)


def gaussian_select(x, k: int, density: float, *, rounds: int = 3):
    """Gaussiank selection: Gaussian threshold, corrected toward ``k``, capped at ``k``.

    Following Shi et al.'s reference: up to ``rounds`` corrections halving or
    scaling the threshold by 1.5 while the count is outside [2k/3, 4k/3]; the
    result is finally capped at k so Table 1's 2k(P-1) volume holds.

    Returns:
        (indices, values, threshold)
    """
    xp = array_module(x)
    thr = gaussian_threshold(x, density)
    mag = xp.abs(x)
    best, best_err = 0.0, math.inf  # threshold 0 (select all, then cap) if nothing better
    for _ in range(rounds + 1):
        count = int(xp.count_nonzero(mag >= thr))
        if count:
            err = abs(math.log(count / k))
            if err < best_err:
                best, best_err = thr, err
        if count < 2 * k / 3:
            thr *= 0.5
        elif count > 4 * k / 3:
            thr *= 1.5
        else:
            break
    idx, vals = threshold_select(x, best)
    idx, vals = cap_selection(idx, vals, k)
    return idx, vals, best

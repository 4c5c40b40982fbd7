"""Selection kernels: exact top-k, threshold selection, threshold estimates.

All functions take and return arrays of the input's array module.
Indices are returned sorted ascending, as int32 (int64 when n >= 2**31), so
that every consumer sees a canonical, deterministic COO layout.

On cupy float32 input the work goes to hand-written CUDA (``_cuda``): a
threshold selection with ordered compaction, an exact top-k by radix select
and Gaussiank's statistics; every other input runs the generic array-module
code below, which is also the reference the CUDA kernels are tested against
(same indices, equal values).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from ._sparse import add_into, fused_add
from ._xp import array_module, fast_float32, index_dtype, weak_threshold


def k_from_density(n: int, density: float) -> int:
    """Number of values a density selects: at least 1, at most n.

    Raises:
        ValueError: density outside (0, 1].
    """
    if not (0.0 < density <= 1.0) or math.isnan(density):
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return min(n, max(1, int(round(density * n))))


def _check_k(k: int, n: int, lo: int = 0):
    if not lo <= k <= n:
        raise ValueError(f"k must be in [{lo}, {n}], got {k}")


def _workspace(x, work):
    """The allocator of the generic path's temporaries: ``work`` for numpy input
    when given, else fresh arrays of x's module.

    ``work(tag, size, dtype)`` hands out a reusable 1-D scratch array (contents
    undefined; the caller's, e.g. ``Algorithm.scratch``): on a CPU a fresh
    temporary of a large vector costs a page-zeroing pass of its own
    (docs/BENCHMARKS.md, "The selection kernels' temporaries reused too").
    cupy has its memory pool.
    """
    if work is not None and isinstance(x, np.ndarray):
        return work
    xp = array_module(x)
    return lambda tag, size, dtype: xp.empty(size, dtype=dtype)


def _magnitudes(x, work):
    """|x| (flat) into a ``work`` buffer."""
    return array_module(x).abs(x.reshape(-1), out=work("mag", x.size, x.dtype))


def topk_indices(x, k: int):
    """Indices (sorted, int32) of the ``k`` largest-magnitude entries of flat ``x``.

    Ties at the k-th magnitude are broken by position (lowest index wins) so
    the result is a pure function of ``x``.
    """
    n = x.size
    _check_k(k, n)
    if 0 < k < n:
        cu = fast_float32(x)
        if cu is not None:
            return cu.topk_select(cu.prepare(x), k)[0]
    return _topk_indices_xp(x, k)


def _topk_indices_xp(x, k: int, work=None):
    """Generic (numpy or cupy) exact top-k: partition, then ties by position.
    ``work``: scratch for the temporaries (numpy; see :func:`_workspace`)."""
    xp = array_module(x)
    n = x.size
    itype = index_dtype(n)
    if k == 0:
        return xp.empty(0, dtype=itype)
    if k == n:
        return xp.arange(n, dtype=itype)
    work = _workspace(x, work)
    mag = _magnitudes(x, work)
    if isinstance(mag, np.ndarray):
        idx = _topk_from_candidates(mag, k, work)
        if idx is not None:
            return idx.astype(itype, copy=False)
    thr = _kth_largest(mag, k, work, inplace=False)  # exact k-th largest magnitude
    mask = work("mask", n, np.bool_)
    above = xp.flatnonzero(xp.greater(mag, thr, out=mask))
    need = k - above.size
    ties = xp.flatnonzero(xp.equal(mag, thr, out=mask))[:need]
    idx = xp.concatenate([above, ties])
    idx.sort()
    return idx.astype(itype, copy=False)


def kth_magnitude(x, k: int, *, work=None) -> float:
    """The exact k-th largest |x| (the top-k threshold); 1 <= k <= n.
    ``work``: scratch for |x| (numpy; see :func:`_workspace`)."""
    n = x.size
    _check_k(k, n, lo=1)
    cu = fast_float32(x)
    if cu is not None:
        return cu.kth_magnitude(cu.prepare(x), k)
    work = _workspace(x, work)
    return float(_kth_largest(_magnitudes(x, work), k, work, inplace=True))


# a full partition costs several passes (and numpy's AVX-512 one is slow on AMD Zen 4:
# 7x its AVX2 path, docs/BENCHMARKS.md); below this share, partition candidates only
_CANDIDATES_BELOW = 1 / 16
_SAMPLE = 1 << 12


def _sample_bound(mag, k: int):
    """A lower bound t on the k-th largest entry of the flat non-negative numpy
    ``mag`` from a strided sample: most likely a little over k entries are >= t
    (the sample's expected count above the k-th largest plus 4 standard
    deviations); None where the sample would not pay (small n, or k above
    n / 16: there a full partition is as cheap)."""
    n = mag.size
    if n < 8 * _SAMPLE or k > n * _CANDIDATES_BELOW:
        return None
    sample = mag[::n // _SAMPLE].copy()
    m = sample.size
    want = k * m / n
    rank = min(m, int(want + 4.0 * math.sqrt(want) + 8))
    sample.partition(m - rank)
    return sample[m - rank]


def _candidates(mag, k: int, work):
    """(positions, values) of the entries of the flat numpy ``mag`` that reach
    a sampled lower bound on its k-th largest (:func:`_sample_bound`), in one
    pass (positions, then values: a boolean index is about 2x slower); None
    where there is no bound or fewer than k entries reach it."""
    t = _sample_bound(mag, k)
    if t is None:
        return None
    cand = np.flatnonzero(np.greater_equal(mag, t, out=work("mask", mag.size, np.bool_)))
    return (cand, mag[cand]) if cand.size >= k else None


def _topk_from_candidates(mag, k: int, work):
    """The exact top-k's indices (sorted; ties by position) of the flat numpy
    ``mag``, worked out among its :func:`_candidates`; None without them."""
    found = _candidates(mag, k, work)
    if found is None:
        return None
    cand, vals = found
    thr = np.partition(vals, vals.size - k)[vals.size - k]  # the k-th largest
    # every entry above thr, then the first (k - those) equal to it, in position order
    keep = vals > thr
    need = k - int(np.count_nonzero(keep))
    if need:
        keep[np.flatnonzero(vals == thr)[:need]] = True
    return cand[keep]


def _kth_largest(mag, k: int, work, *, inplace: bool):
    """The exact k-th largest entry of the flat non-negative ``mag`` (numpy or
    cupy), 1 <= k <= n.  For k <= n / 16 on numpy: a strided sample gives a
    lower bound t with, most likely, a little over k entries >= t; the k-th
    largest of those entries is the answer (exact: it is checked that at least
    k are >= t, else the whole array is partitioned).  ``inplace``: ``mag``
    may be reordered."""
    n = mag.size
    found = _candidates(mag, k, work) if isinstance(mag, np.ndarray) else None
    if found is not None:
        cand = found[1]
        cand.partition(cand.size - k)
        return cand[cand.size - k]
    if inplace:
        mag.partition(n - k)
        return mag[n - k]
    part = work("part", n, mag.dtype)
    part[...] = mag
    part.partition(n - k)
    return part[n - k]


def threshold_select(x, threshold: float, *, work=None):
    """COO of entries with ``|x| >= threshold``: (int32 indices sorted, values).

    The comparison is NumPy's: a Python float threshold is rounded to x's
    dtype, a float64 scalar compares in float64.  ``work``: scratch for the
    temporaries (numpy; see :func:`_workspace`).
    """
    cu = fast_float32(x)
    if cu is not None:
        return cu.threshold_select(cu.prepare(x), threshold)
    return _threshold_select_xp(x, threshold, work)


def _threshold_select_xp(x, threshold, work=None):
    """Generic (numpy or cupy) threshold selection: a mask, then its nonzeros.
    ``work``: scratch for the temporaries (numpy; see :func:`_workspace`)."""
    work = _workspace(x, work)
    return _masked_select(x, _magnitudes(x, work), threshold, work("mask", x.size, np.bool_))


def _masked_select(x, mag, threshold, mask):
    """The entries of x whose magnitude ``mag`` (|x|, flat) is >= ``threshold``,
    the comparison written into ``mask``: (int32 indices sorted, values)."""
    xp = array_module(x)
    xp.greater_equal(mag, weak_threshold(x, threshold), out=mask)
    idx = xp.flatnonzero(mask).astype(index_dtype(x.size), copy=False)
    return idx, x.reshape(-1)[idx]


def topk_select(x, k: int, *, work=None, add=None):
    """COO of the exact top-k by magnitude: (indices sorted, values).
    ``work``: scratch for the temporaries (numpy; see :func:`_workspace`).
    ``add``: first ``x += add`` in place (error feedback's sum); on the GPU
    in the selection's first pass over x (one read of x less)."""
    n = x.size
    _check_k(k, n)
    cu = fast_float32(x) if 0 < k < n else None
    if add is not None:
        if cu is not None and fused_add(x, add) is not None:  # both in place: one pass
            return cu.topk_select(x.reshape(-1), k, add=add.reshape(-1))
        add_into(x, add)
    if cu is not None:
        return cu.topk_select(cu.prepare(x), k)
    idx = _topk_indices_xp(x, k, work)
    return idx, x.reshape(-1)[idx]


def key_histogram(x, prefix: int, shift: int, nbits: int) -> np.ndarray:
    """One round of a radix select on float32 magnitudes: the histogram (host
    int64, 2**nbits bins) of the digit ``(key >> shift) & (2**nbits - 1)``
    over the entries of ``x`` whose 31-bit magnitude key (the float's bits,
    sign cleared) equals ``prefix`` above bit ``shift + nbits``.  On the GPU
    one kernel over x and one read of the bins (nbits <= 4), no compaction."""
    if x.dtype != np.float32:
        raise TypeError(f"key_histogram takes float32, got {x.dtype}")
    if not (0 < nbits and shift >= 0 and shift + nbits <= 31):
        raise ValueError(f"bad digit: shift {shift}, nbits {nbits}")
    cu = fast_float32(x)
    if cu is not None and nbits <= 4:
        return cu.key_histogram(cu.prepare(x), int(prefix), int(shift), int(nbits))
    xp = array_module(x)
    keys = x.reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    hs = shift + nbits
    if hs < 31:
        keys = keys[(keys >> np.uint32(hs)) == np.uint32(int(prefix) >> hs)]
    digit = (keys >> np.uint32(shift)) & np.uint32((1 << nbits) - 1)
    counts = xp.bincount(digit.astype(np.int64), minlength=1 << nbits)
    return np.asarray(counts.get() if hasattr(counts, "get") else counts, dtype=np.int64)


def cap_selection(idx, vals, k: int):
    """Keep at most ``k`` entries of a COO set, the largest magnitudes first.

    Used after a threshold selection that may overshoot ``k`` (ties, a stale
    threshold): keeps traffic within its bound.  Output stays index-sorted.
    """
    if idx.size <= k:
        return idx, vals
    if k > 0 and idx.dtype == np.int32 and idx.flags.c_contiguous:
        cu = fast_float32(vals)
        if cu is not None:
            return cu.cap_select(idx, cu.prepare(vals), k)
    keep = topk_indices(vals, k)
    return idx[keep], vals[keep]


_STD_NORMAL = statistics.NormalDist()


def gaussian_threshold(x, density: float, *, work=None) -> float:
    """Gaussiank's threshold: |x| >= mean + std * z selects ``density`` of a normal x.

    Two-sided: P(|x - mu| > z sigma) = density  =>  z = isf(density / 2).
    mean and std are float64 statistics of x (on the GPU: two reads, see
    ``_cuda.mean_std``; on the CPU: one read, :func:`_mean_std_blocked`).
    ``work``: scratch for the CPU's block (see :func:`_workspace`).
    """
    cu = fast_float32(x)
    if cu is not None:
        mu, sigma = cu.mean_std(cu.prepare(x))
    elif isinstance(x, np.ndarray):
        mu, sigma = _mean_std_blocked(x.reshape(-1), _workspace(x, work))
    else:
        xp = array_module(x)
        mu = float(xp.mean(x, dtype=np.float64))
        sigma = float(xp.std(x, dtype=np.float64))
    q = min(max(density, 1e-12), 1.0 - 1e-12)
    return abs(mu) + sigma * _STD_NORMAL.inv_cdf(1.0 - q / 2.0)


_STATS_BLOCK = 1 << 16  # float64 elements per block: 512 KiB, within a core's L2


def _mean_std_blocked(x: np.ndarray, work) -> tuple[float, float]:
    """float64 mean and (population) std of a flat numpy vector in one read:
    per block of ``_STATS_BLOCK`` values, copied to float64 in a cache-sized
    buffer, its mean and centred sum of squares, merged by Chan et al.'s
    pairwise update.  Agrees with ``np.mean`` / ``np.std`` (dtype float64) to
    a few ulps without np.std's fresh 8n-byte temporary (x - mean): about 3x
    faster at 2^22-2^24 on the CPU VM (docs/BENCHMARKS.md, "Fresh large
    buffers cost a page-zeroing pass").  No BLAS call (np.dot): where unbound
    ranks outnumber the cores, every rank's OpenBLAS threads spin against them."""
    n = x.size
    if n == 0:
        return math.nan, math.nan
    buf = work("stats", min(n, _STATS_BLOCK), np.float64)
    count, mean, m2 = 0, 0.0, 0.0
    for s in range(0, n, _STATS_BLOCK):
        b = buf[:min(_STATS_BLOCK, n - s)]
        b[...] = x[s:s + b.size]
        bmean = float(b.sum()) / b.size
        b -= bmean
        bm2 = float(np.square(b, out=b).sum())  # not np.dot: BLAS threads (see docstring)
        total, d = count + b.size, bmean - mean
        mean += d * b.size / total
        m2 += bm2 + d * d * count * b.size / total
        count = total
    return mean, math.sqrt(m2 / n)


def _correction_thresholds(thr: float, rounds: int) -> list[float]:
    """Every threshold gaussian_select's correction loop can count, computed
    in the loop's own order (so the floats are the loop's bits)."""
    out, level = [thr], [thr]
    for _ in range(rounds):
        level = [t * f for t in level for f in (0.5, 1.5)]
        out += level
    return out


def gaussian_select(x, k: int, density: float, *, rounds: int = 3, work=None):
    """Gaussiank selection: Gaussian threshold, corrected toward ``k``, capped at ``k``.

    Following Shi et al.'s reference: up to ``rounds`` corrections halving or
    scaling the threshold by 1.5 while the count is outside [2k/3, 4k/3]; the
    result is finally capped at k so Table 1's 2k(P-1) volume holds.  On the
    GPU the counts at every threshold the loop can reach (2^(rounds+1) - 1
    paths, at most 10 distinct values for rounds = 3) are taken in one read
    before the loop, which then looks them up: the same decisions as counting
    each on demand, one pass instead of up to rounds + 1.  Elsewhere |x| is
    taken once and each count and the final selection read it; ``work``:
    scratch for the temporaries (numpy; see :func:`_workspace`).

    Returns:
        (indices, values, threshold)
    """
    xp = array_module(x)
    thr = gaussian_threshold(x, density, work=work)
    cu = fast_float32(x)
    if cu is not None:
        xf = cu.prepare(x)
        keys = sorted({cu.threshold_key(t) for t in _correction_thresholds(thr, rounds)})
        table = dict(zip(keys, cu.count_at_least_many(xf, keys)))

        def count(t):
            return table[cu.threshold_key(t)]

        def select(t):
            return threshold_select(x, t)
    else:
        work = _workspace(x, work)
        mag = _magnitudes(x, work)
        mask = work("mask", x.size, np.bool_)

        def count(t):
            return int(xp.count_nonzero(xp.greater_equal(mag, weak_threshold(x, t), out=mask)))

        def select(t):
            return _masked_select(x, mag, t, mask)
    best = correct_threshold(count, thr, k, rounds)
    idx, vals = cap_selection(*select(best), k)
    return idx, vals, best


def correct_threshold(count, thr: float, k: int, rounds: int) -> float:
    """Gaussiank's correction: up to ``rounds`` steps halving the threshold (count
    below 2k/3) or scaling it by 1.5 (above 4k/3); returns the threshold whose
    count was closest to k in log ratio (0.0 -- select all, then cap -- if every
    count was 0).  ``count(t)`` is the number of |x| >= t."""
    best, best_err = 0.0, math.inf
    for _ in range(rounds + 1):
        c = count(thr)
        if c:
            err = abs(math.log(c / k))
            if err < best_err:
                best, best_err = thr, err
        if c < 2 * k / 3:
            thr *= 0.5
        elif c > 4 * k / 3:
            thr *= 1.5
        else:
            break
    return best

"""Kernels against brute-force references, on fresh random data (numpy path)."""
import statistics

import numpy as np
import pytest

import kernels

RNG = np.random.default_rng()


def data(dist, n):
    if dist == "gaussian":
        return RNG.standard_normal(n).astype(np.float32)
    if dist == "heavy":
        return RNG.standard_t(1.5, n).astype(np.float32)
    if dist == "ties":
        return RNG.integers(-3, 4, n).astype(np.float32)
    if dist == "equal":
        return np.full(n, RNG.uniform(-1, 1), np.float32)
    raise ValueError(dist)


DISTS = ["gaussian", "heavy", "ties", "equal"]


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("n", [1, 2, 17, 1000, 65537])
def test_topk_matches_sort(dist, n):
    x = data(dist, n)
    for k in sorted({1, max(1, n // 100), n // 2 or 1, n}):
        idx = kernels.topk_indices(x, k)
        assert idx.dtype == np.int32 and idx.size == k
        assert np.all(np.diff(idx) > 0), "indices sorted and unique"
        # the k-th largest magnitude from a full sort; the selected set must
        # hold every strictly larger magnitude and be filled from the ties
        kth = np.sort(np.abs(x))[::-1][k - 1]
        sel = np.abs(x[idx])
        assert sel.min() >= kth
        assert np.count_nonzero(np.abs(x) > kth) <= k
        assert kernels.kth_magnitude(x, k) == kth
        # ties by position: the first k of a stable sort by descending magnitude
        assert np.array_equal(idx, np.sort(np.argsort(-np.abs(x), kind="stable")[:k]))


@pytest.mark.parametrize("k", [1000, 3000, 4096])
def test_kth_from_a_misleading_sample(k):
    """The numpy k-th largest partitions only the entries above a bound taken
    from a strided sample; data whose sample overstates the large values (every
    16th entry large in the first half only: the bound leaves fewer than k
    candidates) must still give the exact answer (the whole array partitioned).
    The candidates' own path: test_topk_matches_sort at n = 65537, k = n // 100."""
    n = 1 << 16
    x = RNG.uniform(-1, 1, n).astype(np.float32)
    x[: n // 2 : 16] = RNG.uniform(10, 11, n // 32)
    mag = np.abs(x)
    kth = np.sort(mag)[::-1][k - 1]
    assert kernels.kth_magnitude(x, k) == kth
    above = np.flatnonzero(mag > kth)
    want = np.sort(np.concatenate([above, np.flatnonzero(mag == kth)[: k - above.size]]))
    assert np.array_equal(kernels.topk_indices(x, k), want)


def test_scatter_add_runs_add_in_order_and_zero_at():
    """numpy: runs change nothing (np.add.at's input order is the runs' order)."""
    rng = np.random.default_rng(RNG.integers(2**32))
    idx = np.concatenate([np.sort(rng.choice(50, 20, replace=False)) for _ in range(3)])
    vals = rng.standard_normal(60).astype(np.float32)
    a, b = np.zeros(50, np.float32), np.zeros(50, np.float32)
    kernels.scatter_add(a, idx, vals, runs=[0, 20, 40, 60])
    np.add.at(b, idx, vals)
    assert np.array_equal(a, b)
    acc, x = rng.standard_normal(50), rng.standard_normal(50)
    want = acc + x
    assert kernels.add_into(acc, x) is acc and np.array_equal(acc, want)
    kernels.zero_at(acc, idx[:20])
    want[idx[:20]] = 0
    assert np.array_equal(acc, want)


def test_topk_is_deterministic_and_prefers_low_indices_on_ties():
    x = np.ones(10, np.float32)
    assert kernels.topk_indices(x, 3).tolist() == [0, 1, 2]


def test_threshold_select():
    x = data("heavy", 10001)
    t = float(np.quantile(np.abs(x), 0.99))
    idx, vals = kernels.threshold_select(x, t)
    ref = np.flatnonzero(np.abs(x) >= t)
    assert idx.dtype == np.int32 and np.array_equal(idx, ref) and np.array_equal(vals, x[ref])


@pytest.mark.parametrize("dist", DISTS)
def test_gaussian_select_caps_at_k(dist):
    x = data(dist, 50000)
    k = 500
    idx, vals, thr = kernels.gaussian_select(x, k, k / x.size)
    assert 0 < idx.size <= k
    assert np.array_equal(vals, x[idx])


@pytest.mark.parametrize("n", [1, 2, 3, 65535, 65536, 65537, 300_001])
def test_gaussian_threshold_statistics_match_numpy(n):
    """The CPU's blocked one-read mean and std are numpy's float64 mean and std
    to a few ulps, across block boundaries, off-centre and heavy-tailed."""
    seed = int(RNG.integers(1 << 31))
    x = (np.random.default_rng(seed).standard_t(2.5, n) * 3 + 0.7).astype(np.float32)
    mu, sigma = np.mean(x, dtype=np.float64), np.std(x, dtype=np.float64)
    ref = abs(mu) + sigma * statistics.NormalDist().inv_cdf(1 - 0.01 / 2)
    assert kernels.gaussian_threshold(x, 0.01) == pytest.approx(ref, rel=1e-12), seed


def test_gaussian_threshold_on_normal_data_selects_about_density():
    x = RNG.standard_normal(1 << 20).astype(np.float32)
    thr = kernels.gaussian_threshold(x, 0.01)
    frac = np.mean(np.abs(x) >= thr)
    assert 0.008 < frac < 0.012


def test_coo_sum_matches_dense_sum():
    n = 1000
    sets = []
    dense = np.zeros(n, np.float64)
    for _ in range(5):
        i = np.sort(RNG.choice(n, 100, replace=False)).astype(np.int32)
        v = RNG.standard_normal(100).astype(np.float32)
        sets.append((i, v))
        np.add.at(dense, i, v)
    ui, uv = kernels.coo_sum([s[0] for s in sets], [s[1] for s in sets])
    assert np.all(np.diff(ui) > 0)
    got = np.zeros(n, np.float64)
    got[ui] = uv
    np.testing.assert_allclose(got, dense, rtol=1e-5, atol=1e-5)


def test_scatter_add_repeats_and_to_dense():
    d = np.zeros(5, np.float32)
    kernels.scatter_add(d, np.array([1, 1, 4], np.int32), np.array([1, 2, 3], np.float32))
    assert d.tolist() == [0, 3, 0, 0, 3]
    assert kernels.to_dense(np.array([0, 2], np.int32), np.array([5, 6], np.float32), 4).tolist() == [5, 0, 6, 0]


def test_topk_select_with_add_equals_add_then_select():
    acc, x = RNG.standard_normal(1000).astype(np.float32), RNG.standard_normal(1000).astype(np.float32)
    ref_acc = acc + x
    ri, rv = kernels.topk_select(ref_acc, 17)
    gi, gv = kernels.topk_select(acc, 17, add=x)
    assert np.array_equal(acc, ref_acc) and np.array_equal(gi, ri) and np.array_equal(gv, rv)


@pytest.mark.parametrize("n,parts", [(10, 3), (2, 5), (1, 1), (1 << 20, 7)])
def test_region_bounds_and_split(n, parts):
    b = kernels.region_bounds(n, parts)
    assert b[0] == 0 and b[-1] == n and len(b) == parts + 1
    assert max(np.diff(b)) - min(np.diff(b)) <= 1
    idx = np.sort(RNG.choice(n, min(n, 50), replace=False)).astype(np.int32)
    offs = kernels.split_by_bounds(idx, b)
    for j in range(parts):
        part = idx[offs[j]:offs[j + 1]]
        assert np.all((part >= b[j]) & (part < b[j + 1]))
    assert offs[-1] == idx.size


@pytest.mark.parametrize("d", [0.0, -0.1, 1.5, float("nan")])
def test_bad_density(d):
    with pytest.raises(ValueError):
        kernels.k_from_density(100, d)


def test_kernels_do_not_import_cupy_on_cpu():
    import subprocess
    import sys

    code = "import sys, kernels, collectives, autotune; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dist", DISTS)
def test_scratch_work_gives_the_same_selection(dist):
    """With reusable scratch (``work``) the selection kernels return exactly
    what they return without it, on fresh data each call, buffers reused."""
    pool = {}

    def work(tag, size, dtype):
        key = (tag, np.dtype(dtype).str)
        if key not in pool or pool[key].size < size:
            pool[key] = np.empty(size, dtype=dtype)
        return pool[key][:size]

    for n in (1000, 37, 4096):  # a smaller call reuses the larger buffers
        x = data(dist, n)
        for k in (1, n // 10 + 1, n - 1):
            a, b = kernels.topk_select(x, k), kernels.topk_select(x, k, work=work)
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
            assert kernels.kth_magnitude(x, k) == kernels.kth_magnitude(x, k, work=work)
        thr = float(np.quantile(np.abs(x), 0.9)) or 1.0
        a, b = kernels.threshold_select(x, thr), kernels.threshold_select(x, thr, work=work)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        k = n // 50 + 1
        a, b = kernels.gaussian_select(x, k, k / n), kernels.gaussian_select(x, k, k / n, work=work)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    assert {t for t, _ in pool} == {"mag", "part", "mask", "stats"}


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_index_coding_round_trips_and_never_grows(dtype):
    rng = np.random.default_rng()
    for _ in range(300):
        n = int(rng.choice([2, 100, 1 << 16, 1 << 20, (1 << 31) - 1]))
        m = int(rng.integers(0, min(n, 5000) + 1))
        idx = np.unique(rng.integers(0, n, m)).astype(dtype)
        if rng.random() < 0.3:          # clustered: small gaps, with a few huge ones
            idx = np.unique(np.concatenate([idx[:3], rng.integers(0, 50, m) + n // 2]))
            idx = idx[idx < n].astype(dtype)
        enc = kernels.encode_indices(idx)
        assert enc.dtype == np.uint8 and enc.size <= idx.nbytes + 1     # + the format byte
        got = kernels.decode_indices(enc.copy(), idx.size, dtype)
        assert got.dtype == dtype and np.array_equal(got, idx)
    close = np.arange(1000, 5000, 3, dtype=dtype)       # gaps of 3: one byte each
    assert kernels.encode_indices(close).size <= close.size + 1 + close.itemsize
    apart = np.arange(1000, 1 << 20, 1000, dtype=dtype)  # gaps of 1000: two bytes each
    assert kernels.encode_indices(apart).size <= 2 * apart.size + 1 + apart.itemsize
    far = np.array([5, 1 << 30], dtype=dtype)           # one huge gap: raw
    assert kernels.encode_indices(far).size == far.nbytes + 1


def test_key_histogram_counts_digits_under_a_prefix():
    x = (RNG.standard_normal(5000) * 10.0 ** RNG.uniform(-3, 3, 5000)).astype(np.float32)
    x[:7] = -0.0
    keys = x.view(np.uint32) & 0x7FFFFFFF
    prefix = int(keys[100]) & ~((1 << 22) - 1)          # bits 30..22 of one entry's key
    got = kernels.key_histogram(x, prefix, 18, 4)
    under = keys[(keys >> 22) == (prefix >> 22)]
    assert got.dtype == np.int64 and got.sum() == under.size > 0
    assert got.tolist() == np.bincount((under >> 18) & 15, minlength=16).tolist()
    assert kernels.key_histogram(x, 0, 27, 4).sum() == x.size   # the top digit: every key
    with pytest.raises(ValueError):
        kernels.key_histogram(x, 0, 28, 4)

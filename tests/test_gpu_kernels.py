"""GPU kernels (cupy + hand-written CUDA) against the numpy path on the same data.

Every case draws fresh random data (the seed is printed, and set with
KERNELS_TEST_SEED to replay a failure), runs the kernel on the GPU and the
numpy reference on the host copy, and requires the same indices (int32,
sorted) and bitwise-equal values.  Every device allocation is filled with
0xff bytes first (NaN as float32, -1 as int32), so an entry a kernel forgot
to write cannot pass by accident.  Each case loops over many sizes, so a
failure message names the size.  Skipped, with a reason, where there is no
GPU or no cupy.
"""
import os
import time
import zlib

import numpy as np
import pytest

import kernels
from support import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

SEED = int(os.environ.get("KERNELS_TEST_SEED", time.time_ns() % 2**32))
print(f"\ntest_gpu_kernels: seed {SEED} (replay with KERNELS_TEST_SEED={SEED})")

DISTS = ["gaussian", "heavy", "ties", "equal", "hot", "zeros"]
#: warp spans of 1024 entries and tiles of 8192 (every select kernel), their
#: neighbours, several tiles, many tiles
SIZES = [1, 2, 3, 5, 31, 32, 33, 127, 128, 129, 1000, 4095, 4096, 4097, 8191, 8192, 8193,
         12289, 3 * 8192 + 5, 65537, 300_007, 1 << 20, (1 << 22) + 3]


def _poisoning_allocator(cupy):
    """cupy's pool, every allocation filled with 0xff bytes on the current stream."""
    pool = cupy.get_default_memory_pool()

    def alloc(size):
        mem = pool.malloc(size)
        if size:
            cupy.cuda.runtime.memsetAsync(mem.ptr, 0xFF, size,
                                          cupy.cuda.get_current_stream().ptr)
        return mem
    return alloc


@pytest.fixture(scope="module")
def cp(request):
    cupy = pytest.importorskip("cupy")

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    line = (f"test_gpu_kernels: seed {SEED} (KERNELS_TEST_SEED={SEED} replays), "
            f"device {name.decode() if isinstance(name, bytes) else name}")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # past pytest's output capture, as capsys.disabled() does
        with capman.global_and_fixture_disabled():
            print("\n" + line)
    else:
        print(line)
    with cupy.cuda.using_allocator(_poisoning_allocator(cupy)):   # this thread only
        yield cupy


def rng_for(*key):
    return np.random.default_rng([SEED, *[zlib.crc32(str(k).encode()) for k in key]])


def data(dist, n, rng):
    if dist == "gaussian":
        return rng.standard_normal(n, dtype=np.float32)
    if dist == "heavy":
        return rng.standard_t(1.5, n).astype(np.float32)
    if dist == "ties":  # small integers, zeros of both signs
        x = rng.integers(-3, 4, n).astype(np.float32)
        x[(x == 0) & (rng.random(n) < 0.5)] = -0.0
        return x
    if dist == "equal":
        return np.full(n, rng.uniform(-1, 1), np.float32)
    if dist == "hot":  # small noise, one contiguous region of large values
        x = (1e-3 * rng.standard_normal(n)).astype(np.float32)
        w = max(1, n // 50)
        s = int(rng.integers(0, n - w + 1))
        x[s:s + w] = 10 * rng.standard_normal(w).astype(np.float32)
        return x
    if dist == "zeros":  # mostly +-0.0, a few values
        x = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
        hit = rng.random(n) < 0.01
        x[hit] = rng.standard_normal(int(hit.sum())).astype(np.float32)
        return x
    raise ValueError(dist)


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def assert_same(got, ref, what):
    gi, gv = host(got[0]), host(got[1])
    ri, rv = ref
    msg = f"{what} (seed {SEED})"
    assert gi.dtype == np.int32, msg
    assert gi.shape == ri.shape, f"{msg}: {gi.size} entries, numpy {ri.size}"
    np.testing.assert_array_equal(gi, ri, err_msg=msg)
    assert gv.dtype == rv.dtype, msg
    # bitwise: -0.0 and 0.0 differ, unwritten (poisoned) entries show
    assert np.array_equal(gv.view(np.uint32), rv.view(np.uint32)), msg


def ks_for(n):
    return sorted({k for k in (1, 2, n // 1000, n // 100, n // 2, n - 1, n) if 1 <= k <= n})


def thresholds_for(x, rng):
    mag = np.abs(x)
    k = max(1, x.size // 100)
    kth = float(np.partition(mag, x.size - k)[x.size - k])  # present in x: ties at t
    lo, hi = float(mag.min()), float(mag.max())
    # a float64 strictly between two float32 values compares in float64 (strong type)
    between = np.float64(np.nextafter(np.float32(kth), np.float32(0))) + np.float64(1e-12)
    return [0.0, -1.0, kth, between,
            float(rng.uniform(lo, hi) if hi > lo else lo), hi, float("inf"), float("nan"), 3]


# ---- selection --------------------------------------------------------------

@pytest.mark.parametrize("path", ["default", "local"])
@pytest.mark.parametrize("dist", DISTS)
def test_threshold_select_matches_numpy(cp, dist, path):
    """default: the public call (below 2^24, the one-pass look-back kernel);
    local: the two-launch path forced at every size and count (a dense
    selection overflows every tile's scratch slot, which the stitch selects again)."""
    from kernels import _cuda

    for n in SIZES:
        rng = rng_for("thr", dist, n)
        x = data(dist, n, rng)
        xg = cp.asarray(x)
        for t in thresholds_for(x, rng):
            if path == "default":
                got = kernels.threshold_select(xg, t)
            else:
                got = _cuda.threshold_select(xg, t, path="local")
            assert isinstance(got[0], cp.ndarray) and isinstance(got[1], cp.ndarray)
            assert got[0].device == xg.device
            assert_same(got, kernels.threshold_select(x, t),
                        f"threshold_select {path} {dist} n={n} t={t!r}")


@pytest.mark.parametrize("dist", DISTS)
def test_topk_matches_numpy(cp, dist):
    for n in SIZES:
        rng = rng_for("topk", dist, n)
        x = data(dist, n, rng)
        xg = cp.asarray(x)
        for k in ks_for(n):
            ref = kernels.topk_select(x, k)
            assert_same(kernels.topk_select(xg, k), ref, f"topk_select {dist} n={n} k={k}")
            np.testing.assert_array_equal(host(kernels.topk_indices(xg, k)), ref[0])
            assert kernels.kth_magnitude(xg, k) == kernels.kth_magnitude(x, k), (dist, n, k, SEED)


#: (small_max, noread_max): small_max 0 sends every size through the radix
#: select; 2^14 (the default) and 2^17 use the one-block kernel up to there,
#: also for top-k of a COO set (cap_selection, whose gather it fuses).  Up to
#: noread_max the radix select reads x thrice instead of reading its candidate
#: count back (0: never).
TOPK_PATHS = [(0, 0), (0, 1 << 18), (1 << 14, 1 << 18), (1 << 17, 0)]


@pytest.mark.parametrize("dist", DISTS)
def test_topk_one_block_and_radix_paths_match_numpy(cp, dist):
    from kernels import _cuda

    for n in (1, 2, 33, 1000, 4097, 12289, 1 << 14, (1 << 14) + 1, 65537, 1 << 17,
              (1 << 18) + 1):
        rng = rng_for("tks", dist, n)
        x = data(dist, n, rng)
        xg = cp.asarray(x)
        idx = np.sort(rng.choice(1 << 30, size=n, replace=False)).astype(np.int32)
        ig = cp.asarray(idx)
        for small_max, noread_max in TOPK_PATHS:
            for k in [k for k in ks_for(n) if k < n]:
                what = f"{dist} n={n} k={k} small_max={small_max} noread_max={noread_max}"
                assert_same(_cuda.topk_select(xg, k, small_max=small_max, noread_max=noread_max),
                            kernels.topk_select(x, k), "topk " + what)
                assert_same(_cuda.cap_select(ig, xg, k, small_max=small_max,
                                             noread_max=noread_max),
                            kernels.cap_selection(idx, x, k), "cap " + what)


@pytest.mark.parametrize("dist", DISTS)
def test_topk_stream_ordered_reads_nothing_back(cp, dist, monkeypatch):
    """Inside kernels.stream_ordered() exact top-k of a large array (above
    RADIX_NOREAD_MAX) and of a large COO set never reads back (a read-back
    raises here), with numpy's results."""
    from kernels import _cuda_topk

    def no_read_back(*args):
        raise AssertionError("read back inside stream_ordered()")

    n = (1 << 19) + 3
    x = data(dist, n, rng_for("ordered", dist, n))
    xg = cp.asarray(x)
    idx = cp.arange(n, dtype=cp.int32)
    monkeypatch.setattr(_cuda_topk, "read_back", no_read_back)
    for k in (1, 5243, n // 3):
        with kernels.stream_ordered():
            got = kernels.topk_select(xg, k)
            capped = kernels.cap_selection(idx, xg, k)
        assert_same(got, kernels.topk_select(x, k), f"stream_ordered topk {dist} n={n} k={k}")
        assert_same(capped, kernels.topk_select(x, k), f"stream_ordered cap {dist} k={k}")
    with pytest.raises(AssertionError, match="read back"):
        kernels.topk_select(xg, 5243)  # outside the block it does read back: the spy works


@pytest.mark.parametrize("dist", ["gaussian", "ties", "hot"])
def test_output_overflow_paths(cp, dist):
    """A capacity too small for the selection: the entries are written again
    into a buffer of the exact size (the local path re-runs its stitch)."""
    from kernels import _cuda

    n = 100_003
    x = data(dist, n, rng_for("ovf", dist))
    t = float(np.quantile(np.abs(x), 0.9))
    ref = kernels.threshold_select(x, t)
    for path in ("lookback", "local"):
        for cap in (1, 7, 4096):
            assert_same(_cuda.threshold_select(cp.asarray(x), t, cap=cap, path=path), ref,
                        f"threshold {path} cap={cap}")


def test_large_selection_2_28(cp):
    """n = 2^28 (1 GiB of float32): exact top-k and threshold selection at 1%,
    the threshold by the one-pass kernel and by the two-launch default there."""
    from kernels import _cuda, _cuda_select

    n = 1 << 28
    xg = cp.random.default_rng(SEED).standard_normal(n, dtype=cp.float32)
    x = xg.get()
    k = n // 100
    ref = kernels.topk_select(x, k)
    t = float(np.abs(x[ref[0]]).min())
    assert_same(kernels.topk_select(xg, k), ref, "topk 2^28")
    del ref
    ref = kernels.threshold_select(x, t)
    assert_same(_cuda.threshold_select(xg, t, path="lookback"), ref, "threshold 2^28 look-back")
    _cuda_select._CAP_HINT.clear()
    for _ in range(2):              # first without, then with the count of the last call
        assert_same(kernels.threshold_select(xg, t), ref, "threshold 2^28 two launches")


def test_fallbacks_misaligned_other_dtypes_and_shapes(cp):
    rng = rng_for("fallback")
    x = data("heavy", 50_001, rng)
    xg = cp.asarray(x)
    # misaligned float32 view (the CUDA path copies it), float64 (generic path), 2-D
    cases = [(x[1:], xg[1:]), (x.astype(np.float64), xg.astype(cp.float64))]
    for xh, xd in cases:
        t = float(np.quantile(np.abs(xh), 0.99))
        assert_same(kernels.threshold_select(xd, t), kernels.threshold_select(xh, t), str(xh.dtype))
        for k in (1, 500, 25_000):
            ri, rv = kernels.topk_select(xh, k)
            gi, gv = kernels.topk_select(xd, k)
            np.testing.assert_array_equal(host(gi), ri)
            np.testing.assert_array_equal(host(gv), rv)
    # 2-D contiguous input: flat indices
    x2 = x[:50_000].reshape(100, 500)
    g2 = cp.asarray(x2)
    assert_same(kernels.topk_select(g2, 77), (lambda i: (i, x2.reshape(-1)[i]))(
        kernels.topk_indices(x2.reshape(-1), 77)), "2-D")


def test_generic_cupy_path_matches_numpy(cp):
    """The generic array-module code, which cupy input takes where the CUDA
    kernels do not apply (other dtypes), agrees with numpy on cupy arrays too."""
    from kernels import _select

    x = data("ties", 20_011, rng_for("generic"))
    xg = cp.asarray(x)
    for k in (1, 200, 10_000):
        np.testing.assert_array_equal(host(_select._topk_indices_xp(xg, k)),
                                      kernels.topk_indices(x, k), f"generic topk {k}")
    assert_same(_select._threshold_select_xp(xg, 2.0), kernels.threshold_select(x, 2.0),
                "generic thr")
    # integer values: stable sort + cupy's add.reduceat (exact for integers)
    sets = [np.sort(rng_for("g", j).choice(1000, 300, replace=False)).astype(np.int32)
            for j in range(4)]
    vals = [rng_for("gv", j).integers(-1000, 1000, 300).astype(np.int32) for j in range(4)]
    ri, rv = kernels.coo_sum(sets, vals)
    gi, gv = kernels.coo_sum([cp.asarray(s) for s in sets], [cp.asarray(v) for v in vals])
    np.testing.assert_array_equal(host(gi), ri)
    np.testing.assert_array_equal(host(gv), rv)


def test_gaussian_select_and_cap(cp):
    for dist in DISTS:
        x = data(dist, 200_003, rng_for("gs", dist))
        xg = cp.asarray(x)
        k = 2000
        gi, gv, thr = kernels.gaussian_select(xg, k, k / x.size)
        # the GPU's threshold may differ from numpy's in the last bits (float64
        # mean/std summed in another order); the selection given it must agree
        ri, rv = kernels.cap_selection(*kernels.threshold_select(x, thr), k)
        assert_same((gi, gv), (ri, rv), f"gaussian_select {dist}")
        assert 0 < gi.size <= k
        _, _, thr_np = kernels.gaussian_select(x, k, k / x.size)
        assert thr == pytest.approx(thr_np, rel=1e-12, abs=0.0), (dist, thr, thr_np, SEED)
        ci, cv = kernels.threshold_select(x, 0.0)
        assert_same(kernels.cap_selection(cp.asarray(ci), cp.asarray(cv), k),
                    kernels.cap_selection(ci, cv, k), f"cap_selection {dist}")


@pytest.mark.parametrize("dist", DISTS)
def test_gaussian_corrections_match_numpy(cp, dist, monkeypatch):
    """From the same starting threshold, the GPU's one-pass table of counts
    takes the numpy loop's decisions: the same final threshold and selection,
    over starting points that need 0 to 3 corrections either way."""
    from kernels import _select

    n = 100_003
    x = data(dist, n, rng_for("gcorr", dist))
    xg = cp.asarray(x)
    mag = np.sort(np.abs(x))
    for k in (1, 100, 5000):
        for q in (0.5, 0.9, 0.99, 0.9999, 1.0):
            t0 = float(mag[min(n - 1, int(q * n))]) * 1.37 + 1e-30
            monkeypatch.setattr(_select, "gaussian_threshold", lambda x, d, t0=t0, **kw: t0)
            ri, rv, rt = kernels.gaussian_select(x, k, k / n)
            gi, gv, gt = kernels.gaussian_select(xg, k, k / n)
            assert gt == rt, (dist, k, q, gt, rt, SEED)
            assert_same((gi, gv), (ri, rv), f"gaussian corrections {dist} k={k} q={q}")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 4097, 1_000_003])
def test_mean_std_float64(cp, n):
    from kernels import _cuda

    rng = rng_for("moments", n)
    for x in (data("heavy", n, rng), (1000.0 + rng.standard_normal(n)).astype(np.float32),
              data("zeros", n, rng)):
        mu, sd = _cuda.mean_std(cp.asarray(x))
        # float64 sums in another order: errors of a few ulps of sum |x|
        scale = float(np.mean(np.abs(x), dtype=np.float64))
        assert abs(mu - float(np.mean(x, dtype=np.float64))) <= 1e-12 * scale, (n, mu, SEED)
        assert sd == pytest.approx(float(np.std(x, dtype=np.float64)), rel=1e-9, abs=1e-300)
        assert _cuda.mean_std(cp.asarray(x)) == (mu, sd)      # fixed order: same bits


@pytest.mark.parametrize("n", [1, 7, 4096, 300_001])
def test_count_at_least_many(cp, n):
    from kernels import _cuda

    rng = rng_for("counts", n)
    x = data("ties", n, rng) * data("heavy", n, rng)
    keys = sorted({_cuda.threshold_key(float(t)) for t in np.quantile(np.abs(x), rng.random(20))})
    keys += [0, 1, _cuda.threshold_key(3.0), 0x7F800000, 0x7FFFFFFF]     # all, inf, above inf
    got = _cuda.count_at_least_many(cp.asarray(x), keys)
    mag = np.abs(x)
    want = [int(np.count_nonzero(mag >= _cuda.key_to_float(k))) for k in keys]
    assert got == want, (n, SEED)
    assert _cuda.count_at_least(cp.asarray(x), keys[0]) == want[0]


def test_repeatable_and_compiled_once(cp):
    from kernels import _cuda_build

    x = cp.asarray(data("ties", 1 << 20, rng_for("rep")))
    a = kernels.topk_select(x, 10_000)
    mods = dict(_cuda_build._MODULES)
    b = kernels.topk_select(x, 10_000)
    assert cp.array_equal(a[0], b[0]) and cp.array_equal(a[1], b[1])
    c = kernels.threshold_select(x, 2.0)
    d = kernels.threshold_select(x, 2.0)
    assert cp.array_equal(c[0], d[0]) and cp.array_equal(c[1], d[1])
    assert _cuda_build._MODULES == mods and len(mods) >= 1  # no recompilation per call


# ---- sparse arithmetic -----------------------------------------------------

def _coo_sets(rng, n, P, m, *, dup_within):
    idx, val = [], []
    for _ in range(P):
        if dup_within:
            i = rng.integers(0, n, m)
        else:
            i = np.sort(rng.choice(n, min(n, m), replace=False))
        idx.append(i.astype(np.int32))
        v = rng.standard_normal(i.size) * 10.0 ** rng.uniform(-4, 4, i.size)
        val.append(v.astype(np.float32))
    return idx, val


@pytest.mark.parametrize("n,P,m,dup", [
    (10, 1, 5, False), (1000, 2, 100, False), (1000, 8, 300, False),
    (1 << 20, 5, 10_000, False), (1 << 22, 16, 40_000, False),
    (7, 3, 2000, True),          # runs of ~850 equal indices: pairwise recursion
    (300, 4, 5000, True),        # runs of ~70: the 8-accumulator block
    (50_000, 3, 20_000, True),
])
def test_coo_sum_matches_numpy_bitwise(cp, n, P, m, dup):
    idx, val = _coo_sets(rng_for("coo", n, P, m, dup), n, P, m, dup_within=dup)
    ri, rv = kernels.coo_sum(idx, val, n)
    gi, gv = kernels.coo_sum([cp.asarray(i) for i in idx], [cp.asarray(v) for v in val], n)
    assert_same((gi, gv), (ri, rv), f"coo_sum n={n} P={P} m={m} dup={dup}")
    # one concatenated set with repeats, too
    ci, cv = np.concatenate(idx), np.concatenate(val)
    assert_same(kernels.coo_sum(cp.asarray(ci), cp.asarray(cv)), kernels.coo_sum(ci, cv), "coo one set")


def test_coo_sum_float64_bitwise(cp):
    idx, val = _coo_sets(rng_for("coo64"), 500, 6, 3000, dup_within=True)
    val = [v.astype(np.float64) * np.pi for v in val]
    ri, rv = kernels.coo_sum(idx, val)
    gi, gv = kernels.coo_sum([cp.asarray(i) for i in idx], [cp.asarray(v) for v in val])
    np.testing.assert_array_equal(host(gi), ri)
    assert np.array_equal(host(gv).view(np.uint64), rv.view(np.uint64))


@pytest.mark.parametrize("order", ["sorted_unique", "sorted_repeats", "unsorted_repeats"])
@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_scatter_add_matches_numpy_bitwise(cp, order, itype):
    rng = rng_for("scatter", order, itype)
    n, m = 100_000, 60_000
    if order == "sorted_unique":
        idx = np.sort(rng.choice(n, m, replace=False))
    elif order == "sorted_repeats":
        idx = np.sort(rng.integers(0, n // 50, m))
    else:
        idx = rng.integers(0, n // 50, m)
    idx = idx.astype(itype)
    vals = (rng.standard_normal(m) * 10.0 ** rng.uniform(-3, 3, m)).astype(np.float32)
    dense = rng.standard_normal(n).astype(np.float32)
    dg = cp.asarray(dense)
    out = kernels.scatter_add(dg, cp.asarray(idx), cp.asarray(vals))
    assert out is dg
    kernels.scatter_add(dense, idx, vals)
    assert np.array_equal(host(dg).view(np.uint32), dense.view(np.uint32)), (order, itype, SEED)


@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_scatter_add_runs_matches_numpy_bitwise(cp, itype):
    """Gathered selections (P sorted runs, repeats across runs): one launch per run,
    no sort, the same additions in the same order as np.add.at."""
    rng = rng_for("scatter_runs", itype)
    n, k, P = 100_000, 7_000, 5
    runs = [np.sort(rng.choice(n // 4, k, replace=False)) for _ in range(P)]
    idx = np.concatenate(runs).astype(itype)
    vals = (rng.standard_normal(P * k) * 10.0 ** rng.uniform(-3, 3, P * k)).astype(np.float32)
    dense = rng.standard_normal(n).astype(np.float32)
    dg = cp.asarray(dense)
    kernels.scatter_add(dg, cp.asarray(idx), cp.asarray(vals), runs=[r * k for r in range(P + 1)])
    np.add.at(dense, idx, vals)
    assert np.array_equal(host(dg).view(np.uint32), dense.view(np.uint32)), (itype, SEED)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1000, 4097, (1 << 20) + 3])
def test_add_into_and_zero_at_match_numpy_bitwise(cp, n):
    rng = rng_for("add_into", n)
    acc = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    ag = cp.asarray(acc)
    assert kernels.add_into(ag, cp.asarray(x)) is ag
    acc += x
    assert np.array_equal(host(ag).view(np.uint32), acc.view(np.uint32)), (n, SEED)
    xo = cp.asarray(np.concatenate([[0.0], x]).astype(np.float32))[1:]  # 4-byte offset: unaligned
    kernels.add_into(ag, xo)
    acc += x
    assert np.array_equal(host(ag).view(np.uint32), acc.view(np.uint32)), (n, SEED)
    idx = np.sort(rng.choice(n, max(1, n // 7), replace=False)).astype(np.int32)
    assert kernels.zero_at(ag, cp.asarray(idx)) is ag
    acc[idx] = 0
    assert np.array_equal(host(ag).view(np.uint32), acc.view(np.uint32)), (n, SEED)


@pytest.mark.parametrize("n", [1, 4097, 8193, 100_003, 300_007, (1 << 20) + 3])
@pytest.mark.parametrize("dist", ["gaussian", "ties", "zeros"])
def test_topk_with_add_matches_add_then_topk(cp, dist, n):
    """Error feedback's sum fused into the selection's first pass (``add=``):
    the sum left in x and the selection equal add_into then topk_select,
    bitwise, on every path (radix with and without the host read, one block,
    stream-ordered); an unaligned ``add`` takes the unfused path, same result."""
    rng = rng_for("topk_add", dist, n)
    acc, x = data(dist, n, rng), data("gaussian", n, rng)
    for k in ks_for(n):
        if not 0 < k < n:
            continue
        ref_acc = acc + x
        ref = kernels.topk_select(ref_acc, k)
        for xg in (cp.asarray(x), cp.asarray(np.concatenate([[0], x]).astype(np.float32))[1:]):
            for ordered in (False, True):
                ag = cp.asarray(acc)
                if ordered:
                    with kernels.stream_ordered():
                        got = kernels.topk_select(ag, k, add=xg)
                else:
                    got = kernels.topk_select(ag, k, add=xg)
                what = f"topk_select add= ordered={ordered} {dist} n={n} k={k}"
                assert_same(got, ref, what)
                assert np.array_equal(host(ag).view(np.uint32), ref_acc.view(np.uint32)), \
                    (what, SEED)


@pytest.mark.parametrize("dist", DISTS)
def test_key_histogram_and_global_kth_match_numpy(cp, dist):
    """One radix round on the device (``key_histogram``: counts under a prefix, no
    compaction) equals numpy's; Ok-Topk's exact global threshold built on it
    gives numpy's value (one rank; the counts are what ranks would sum)."""
    from collectives._oktopk_plan import _global_kth

    class One:
        size = 1

    for n in (1, 33, 4097, 300_007):
        rng = rng_for("keyhist", dist, n)
        x = data(dist, n, rng)
        xg = cp.asarray(x)
        keys = x.view(np.uint32) & 0x7FFFFFFF
        for shift, nbits in ((27, 4), (19, 4), (0, 3)):
            prefix = int(keys[n // 2]) & ~((1 << (shift + nbits)) - 1)
            np.testing.assert_array_equal(kernels.key_histogram(xg, prefix, shift, nbits),
                                          kernels.key_histogram(x, prefix, shift, nbits),
                                          err_msg=f"{dist} n={n} shift={shift} ({SEED})")
        mags = np.abs(x[x != 0])
        for k in {1, max(1, mags.size // 100), mags.size, mags.size + 5}:
            assert _global_kth(One(), cp.asarray(mags), k) == _global_kth(One(), mags, k), \
                (dist, n, k, SEED)


def test_to_dense_and_split_on_gpu(cp):
    rng = rng_for("dense")
    i = np.sort(rng.choice(1000, 100, replace=False)).astype(np.int32)
    v = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_array_equal(host(kernels.to_dense(cp.asarray(i), cp.asarray(v), 1000)),
                                  kernels.to_dense(i, v, 1000))
    b = kernels.region_bounds(1000, 7)
    assert kernels.split_by_bounds(cp.asarray(i), b) == kernels.split_by_bounds(i, b)

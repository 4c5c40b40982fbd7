"""GPU kernels (cupy + hand-written CUDA) against the numpy path on the same data.

Every case draws fresh random data (the seed is printed, and set with
KERNELS_TEST_SEED to replay a failure), runs the kernel on the GPU and the
numpy reference on the host copy, and requires the same indices (int32,
sorted) and bitwise-equal values.  Outputs are poisoned before the kernels
write them, so an entry a kernel forgot to write cannot pass by accident.
Skipped, with a reason, where there is no GPU or no cupy.
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
SIZES = [1, 2, 3, 5, 31, 32, 33, 127, 128, 129, 1000, 4095, 4096, 4097, 12289,
         65537, 1 << 20, (1 << 22) + 3]


@pytest.fixture(scope="module")
def cp(request):
    cupy = pytest.importorskip("cupy")
    from kernels import _cuda

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    line = (f"test_gpu_kernels: seed {SEED} (KERNELS_TEST_SEED={SEED} replays), "
            f"device {name.decode() if isinstance(name, bytes) else name}")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # past pytest's output capture, as capsys.disabled() does
        with capman.global_and_fixture_disabled():
            print("\n" + line)
    else:
        print(line)
    _cuda.POISON = True
    yield cupy
    _cuda.POISON = False


#: (plain / top-k variant, EF kernel, threshold path): the direct writes, the staged
#: ones, the later variants (tiles of 16384, values kept in registers), all with the
#: single-launch threshold selection, and the two-launch threshold selection
#: (tile-local compaction + stitch) forced at every size
WRITE_PATHS = {"direct": ("8", "sel_efr4", "lookback"), "staged": ("s8", "sel_efs8", "lookback"),
               "j16": ("16", "sel_efr4", "lookback"), "kept": ("v8", "sel_efr4", "lookback"),
               "local": ("8", "sel_efs4", "local")}
#: the later variants run on fewer sizes (test_select_tile_variants covers
#: their tile boundaries)
LATER_SIZES = [1, 4097, 16385, 65537, (1 << 20) + 3]
PATH_SIZES = [(p, n) for p in ("direct", "staged", "local") for n in SIZES] + \
    [(p, n) for p in ("j16", "kept") for n in LATER_SIZES]


@pytest.fixture(params=sorted(WRITE_PATHS))
def write_path(request, cp, monkeypatch):
    """Run the test once over each write path (WRITE_PATHS)."""
    use_path(request.param, monkeypatch)
    return request.param


def use_path(path, monkeypatch):
    from kernels import _cuda

    variant, ef, threshold_path = WRITE_PATHS[path]
    monkeypatch.setattr(_cuda, "SELECT_VARIANT", variant)
    monkeypatch.setattr(_cuda, "EF_KERNEL", ef)
    monkeypatch.setattr(_cuda, "THRESHOLD_PATH", threshold_path)
    if threshold_path == "local":                   # at every n and every count
        monkeypatch.setattr(_cuda, "LOCAL_MIN_N", 0)
        monkeypatch.setattr(_cuda, "LOCAL_MAX_SHARE", 1.0)


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

@pytest.mark.parametrize("path,n", PATH_SIZES)
@pytest.mark.parametrize("dist", DISTS)
def test_threshold_select_matches_numpy(cp, path, dist, n, monkeypatch):
    use_path(path, monkeypatch)
    rng = rng_for("thr", dist, n)
    x = data(dist, n, rng)
    xg = cp.asarray(x)
    for t in thresholds_for(x, rng):
        got = kernels.threshold_select(xg, t)
        assert isinstance(got[0], cp.ndarray) and isinstance(got[1], cp.ndarray)
        assert got[0].device == xg.device
        assert_same(got, kernels.threshold_select(x, t), f"threshold_select {dist} n={n} t={t!r}")


@pytest.mark.parametrize("path,n", PATH_SIZES)
@pytest.mark.parametrize("dist", DISTS)
def test_topk_matches_numpy(cp, path, dist, n, monkeypatch):
    use_path(path, monkeypatch)
    rng = rng_for("topk", dist, n)
    x = data(dist, n, rng)
    xg = cp.asarray(x)
    for k in ks_for(n):
        ref = kernels.topk_select(x, k)
        got = kernels.topk_select(xg, k)
        assert_same(got, ref, f"topk_select {dist} n={n} k={k}")
        np.testing.assert_array_equal(host(kernels.topk_indices(xg, k)), ref[0])
        assert kernels.kth_magnitude(xg, k) == kernels.kth_magnitude(x, k), (dist, n, k, SEED)


@pytest.mark.parametrize("small_max,noread_max", [(0, 0), (0, 1 << 18), (1 << 14, 1 << 18),
                                                 (1 << 17, 0)])
@pytest.mark.parametrize("dist", DISTS)
def test_topk_one_block_and_radix_paths_match_numpy(cp, dist, small_max, noread_max,
                                                    monkeypatch):
    """small_max 0: every size through the radix select; 2^14 (the default) and
    2^17: the one-block kernel up to there, also for top-k of a COO set
    (cap_selection, whose gather it fuses).  noread_max: up to there the radix
    select reads x thrice instead of reading its candidate count back (0: never)."""
    from kernels import _cuda

    monkeypatch.setattr(_cuda, "TOPK_SMALL_MAX", small_max)
    monkeypatch.setattr(_cuda, "RADIX_NOREAD_MAX", noread_max)
    for n in (1, 2, 33, 1000, 4097, 12289, 1 << 14, (1 << 14) + 1, 65537, 1 << 17,
              (1 << 18) + 1):
        rng = rng_for("tks", dist, n)
        x = data(dist, n, rng)
        xg = cp.asarray(x)
        idx = np.sort(rng.choice(1 << 30, size=n, replace=False)).astype(np.int32)
        for k in ks_for(n):
            what = f"{dist} n={n} k={k} small_max={small_max} noread_max={noread_max}"
            assert_same(kernels.topk_select(xg, k), kernels.topk_select(x, k), "topk " + what)
            assert_same(kernels.cap_selection(cp.asarray(idx), xg, k),
                        kernels.cap_selection(idx, x, k), "cap " + what)


#: the EF kernels of the same tile shape (16 and v8 have none of their own)
EF_OF_VARIANT = {"4": ("sel_ef4", "sel_efr4"), "8": ("sel_ef8", "sel_efr8"),
                 "s4": ("sel_efs4",), "s8": ("sel_efs8",), "16": (), "v8": ()}


@pytest.mark.parametrize("variant", list(EF_OF_VARIANT))
@pytest.mark.parametrize("dist", DISTS)
def test_select_tile_variants(cp, dist, variant, monkeypatch):
    """Every select variant: tiles of 4, 8 or 16 float4 per lane, direct or staged
    writes, values re-loaded or kept; sizes at the variant's tile boundaries."""
    from kernels import _cuda

    assert set(EF_OF_VARIANT) == set(_cuda.VARIANTS)
    monkeypatch.setattr(_cuda, "SELECT_VARIANT", variant)
    j = variant
    tile = _cuda._sel_tile(f"sel_thr{variant}")
    assert tile == 1024 * int(variant.lstrip("sv"))
    for n in sorted({1, 8191, 8192, 8193, tile - 1, tile, tile + 1, 3 * tile + 5, 300_007}):
        rng = rng_for("tiles", dist, j, n)
        x, r = data(dist, n, rng), data(dist, n, rng)
        xg = cp.asarray(x)
        for k in sorted({1, max(1, n // 100), max(1, n // 2), n}):
            assert_same(kernels.topk_select(xg, k), kernels.topk_select(x, k),
                        f"topk J={j} {dist} n={n} k={k}")
        for t in thresholds_for(x, rng)[:5]:
            assert_same(kernels.threshold_select(xg, t), kernels.threshold_select(x, t),
                        f"threshold J={j} {dist} n={n} t={t!r}")
            for ef in EF_OF_VARIANT[variant]:
                monkeypatch.setattr(_cuda, "EF_KERNEL", ef)
                rh, rg = r.copy(), cp.asarray(r)
                ref = kernels.threshold_select_ef(rh, x, t)
                assert_same(kernels.threshold_select_ef(rg, xg, t), ref, f"{ef} {dist} n={n}")
                assert np.array_equal(host(rg).view(np.uint32), rh.view(np.uint32))


@pytest.mark.parametrize("path,n", PATH_SIZES)
@pytest.mark.parametrize("dist", DISTS)
def test_threshold_select_ef_matches_numpy(cp, path, dist, n, monkeypatch):
    use_path(path, monkeypatch)
    rng = rng_for("ef", dist, n)
    r = data(dist, n, rng)
    x = data(dist, n, rng)
    acc = r + x
    for t in thresholds_for(acc, rng):
        rh, rg = r.copy(), cp.asarray(r)
        ref = kernels.threshold_select_ef(rh, x, t)
        got = kernels.threshold_select_ef(rg, cp.asarray(x), t)
        assert_same(got, ref, f"threshold_select_ef {dist} n={n} t={t!r}")
        assert np.array_equal(host(rg).view(np.uint32), rh.view(np.uint32)), \
            f"residual after EF differs: {dist} n={n} t={t!r} seed {SEED}"
        # conservation: residual + selection == old residual + x, exactly
        back = rh.copy()
        back[ref[0]] += ref[1]
        assert np.array_equal(back, acc)


@pytest.mark.parametrize("dist", ["gaussian", "ties", "hot"])
def test_output_overflow_paths(cp, write_path, dist):
    """A capacity too small for the selection: rerun (plain) / continuation (EF)."""
    from kernels import _cuda

    n = 100_003
    rng = rng_for("ovf", dist)
    r, x = data(dist, n, rng), data(dist, n, rng)
    t = float(np.quantile(np.abs(r + x), 0.9))
    for cap in (1, 7, 4096):
        assert_same(_cuda.threshold_select(cp.asarray(x), t, cap=cap),
                    kernels.threshold_select(x, t), f"threshold cap={cap}")
        rh, rg = r.copy(), cp.asarray(r)
        ref = kernels.threshold_select_ef(rh, x, t)
        got = _cuda.threshold_select_ef(rg, cp.asarray(x), t, cap=cap)
        assert_same(got, ref, f"EF cap={cap}")
        assert np.array_equal(host(rg).view(np.uint32), rh.view(np.uint32))


@pytest.mark.parametrize("n", [1, 1000, 65537, 1 << 20, (1 << 22) + 3])
@pytest.mark.parametrize("dist", DISTS)
def test_sampled_threshold_matches_numpy(cp, dist, n):
    x = data(dist, n, rng_for("samp", dist, n))
    xg = cp.asarray(x)
    for k in ks_for(n):
        for s in (1, 100, 1 << 16, n):
            a = kernels.sampled_threshold(xg, k, sample=s)
            b = kernels.sampled_threshold(x, k, sample=s)
            assert a == b, (dist, n, k, s, a, b, SEED)


def test_sampled_threshold_estimates_density(cp):
    x = cp.random.default_rng(SEED).standard_normal(1 << 22, dtype=cp.float32)
    k = x.size // 100
    t = kernels.sampled_threshold(x, k)
    c = int((cp.abs(x) >= t).sum())
    assert 0.9 * k < c < 1.1 * k


def test_large_selection_2_28(cp, monkeypatch):
    """n = 2^28 (1 GiB of float32): threshold and exact top-k at 1%, with the
    default variant and the tile-16 and values-kept ones, and the two-launch
    threshold path."""
    from kernels import _cuda

    n = 1 << 28
    xg = cp.random.default_rng(SEED).standard_normal(n, dtype=cp.float32)
    x = xg.get()
    k = n // 100
    ref = kernels.topk_select(x, k)
    t = float(np.abs(x[ref[0]]).min())
    variants = list(dict.fromkeys([_cuda.SELECT_VARIANT, "16", "v8"]))
    for v in variants:
        monkeypatch.setattr(_cuda, "SELECT_VARIANT", v)
        assert_same(kernels.topk_select(xg, k), ref, f"topk 2^28 variant {v}")
    del ref
    ref = kernels.threshold_select(x, t)
    monkeypatch.setattr(_cuda, "THRESHOLD_PATH", "lookback")
    for v in variants:
        monkeypatch.setattr(_cuda, "SELECT_VARIANT", v)
        assert_same(kernels.threshold_select(xg, t), ref, f"threshold 2^28 variant {v}")
    monkeypatch.setattr(_cuda, "THRESHOLD_PATH", "local")
    _cuda._CAP_HINT.clear()
    for _ in range(2):              # first without, then with the count of the last call
        assert_same(kernels.threshold_select(xg, t), ref, "threshold 2^28 local path")


def test_ef_2_26(cp):
    n = 1 << 26
    g = cp.random.default_rng(SEED + 1)
    rg, xg = g.standard_normal(n, dtype=cp.float32), g.standard_normal(n, dtype=cp.float32)
    rh, x = rg.get(), xg.get()
    t = 2.9
    ref = kernels.threshold_select_ef(rh, x, t)
    assert_same(kernels.threshold_select_ef(rg, xg, t), ref, "EF 2^26")
    assert np.array_equal(host(rg).view(np.uint32), rh.view(np.uint32))


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
    # EF with a misaligned residual runs the generic cupy path
    r = data("gaussian", 50_001, rng)
    rh, rg = r[1:].copy(), cp.asarray(r)[1:]
    ref = kernels.threshold_select_ef(rh, x[1:], 1.5)
    assert_same(kernels.threshold_select_ef(rg, xg[1:], 1.5), ref, "EF misaligned")
    assert np.array_equal(host(rg), rh)
    # 2-D contiguous input: flat indices
    x2 = x[:50_000].reshape(100, 500)
    g2 = cp.asarray(x2)
    assert_same(kernels.topk_select(g2, 77), (lambda i: (i, x2.reshape(-1)[i]))(
        kernels.topk_indices(x2.reshape(-1), 77)), "2-D")


def test_generic_cupy_path_matches_numpy(cp, monkeypatch):
    """With the CUDA kernels off, the generic array-module code on cupy also agrees."""
    monkeypatch.setenv("AUTOTUNE_KERNELS_CUDA", "0")
    x = data("ties", 20_011, rng_for("generic"))
    xg = cp.asarray(x)
    for k in (1, 200, 10_000):
        assert_same(kernels.topk_select(xg, k), kernels.topk_select(x, k), f"generic topk {k}")
    assert_same(kernels.threshold_select(xg, 2.0), kernels.threshold_select(x, 2.0), "generic thr")
    sets = [np.sort(rng_for("g", j).choice(1000, 300, replace=False)).astype(np.int32) for j in range(4)]
    vals = [rng_for("gv", j).standard_normal(300).astype(np.float32) for j in range(4)]
    ri, rv = kernels.coo_sum(sets, vals)
    gi, gv = kernels.coo_sum([cp.asarray(s) for s in sets], [cp.asarray(v) for v in vals])
    np.testing.assert_array_equal(host(gi), ri)
    # cupy's add.reduceat differences a running sum (seen: absolute errors of
    # ~1e-5 on sums of N(0,1) values): close, not numpy's bits -- which is why
    # the CUDA path has its own segmented sum
    np.testing.assert_allclose(host(gv), rv, rtol=1e-3, atol=1e-4)


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
            monkeypatch.setattr(_select, "gaussian_threshold", lambda x, d, t0=t0: t0)
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
    from kernels import _cuda

    x = cp.asarray(data("ties", 1 << 20, rng_for("rep")))
    a = kernels.topk_select(x, 10_000)
    mods = dict(_cuda._MODULES)
    b = kernels.topk_select(x, 10_000)
    assert cp.array_equal(a[0], b[0]) and cp.array_equal(a[1], b[1])
    c = kernels.threshold_select(x, 2.0)
    d = kernels.threshold_select(x, 2.0)
    assert cp.array_equal(c[0], d[0]) and cp.array_equal(c[1], d[1])
    assert _cuda._MODULES == mods and len(mods) >= 1  # no recompilation per call


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


def test_to_dense_and_split_on_gpu(cp):
    rng = rng_for("dense")
    i = np.sort(rng.choice(1000, 100, replace=False)).astype(np.int32)
    v = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_array_equal(host(kernels.to_dense(cp.asarray(i), cp.asarray(v), 1000)),
                                  kernels.to_dense(i, v, 1000))
    b = kernels.region_bounds(1000, 7)
    assert kernels.split_by_bounds(cp.asarray(i), b) == kernels.split_by_bounds(i, b)

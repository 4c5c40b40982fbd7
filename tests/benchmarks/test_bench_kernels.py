"""Kernel benchmarks: selection and sparse arithmetic on numpy, and on cupy where a GPU is.

Timed at n = 2^22 (numpy) / 2^26 (cupy), density 1%, on fixed seeded
standard-normal float32 data; smoke runs use n = 4103.  Every benchmark then
checks the kernel's result against a brute-force numpy reference, so the
smoke run in CI is a correctness test of the exact code path that is timed.

The regression gate judges each kernel relative to a memory pass of the same
size timed before each of its rounds (one read of x, ``x.sum()``; for
``to_dense``, allocating the zeroed n-vector it fills), on numpy in CPU time of
the process (``time.process_time``: what other processes on the cores take
does not count), on cupy in wall time.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import kernels

DENSITY = 0.01
SMOKE_N = 4103
TIMED_N = {"numpy": 1 << 22, "cupy": 1 << 26}
SEED = 20261126


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


@pytest.fixture(scope="module")
def data(xp, smoke):
    """(x on the device, x on the host, k) — the same values on both."""
    n = SMOKE_N if smoke else TIMED_N[xp.__name__]
    h = np.random.default_rng(SEED).standard_normal(n, dtype=np.float32)
    return xp.array(h), h, kernels.k_from_density(n, DENSITY)  # a copy: h stays the reference


def _timed(xp, fn):
    """fn with a device synchronize, so asynchronous GPU work is in the time."""

    def run(*args):
        out = fn(*args)
        _sync(xp)
        return out

    return run


@pytest.fixture
def measure(measure, xp, data):
    """conftest's ``measure``, every kernel judged against one read pass over
    its input's n float32 (``x.sum()``) on the same device, timed before each
    of its rounds (conftest's ``measure`` has how)."""
    x = data[0]
    return functools.partial(measure, reference=("read pass x.sum()", _timed(xp, x.sum)))


@pytest.fixture(scope="module")
def ref(data):
    """Brute force, once per module: (sorted top-k indices with ties to the lowest
    index, from a full stable sort; the k-th largest magnitude)."""
    _, h, k = data
    idx = np.sort(np.argsort(-np.abs(h), kind="stable")[:k])
    return idx, float(np.abs(h[idx]).min())


def test_topk_indices(measure, xp, data, ref):
    x, h, k = data
    idx = measure("kernel", _timed(xp, lambda: kernels.topk_indices(x, k)))
    assert np.array_equal(_host(idx), ref[0])


def test_topk_select(measure, xp, data, ref):
    x, h, k = data
    idx, vals = measure("kernel", _timed(xp, lambda: kernels.topk_select(x, k)))
    assert np.array_equal(_host(idx), ref[0]) and np.array_equal(_host(vals), h[ref[0]])


def test_kth_magnitude(measure, xp, data, ref):
    x, h, k = data
    t = measure("kernel", _timed(xp, lambda: kernels.kth_magnitude(x, k)))
    assert t == ref[1]


def test_threshold_select(measure, xp, data, ref):
    x, h, k = data
    t = ref[1]
    idx, vals = measure("kernel", _timed(xp, lambda: kernels.threshold_select(x, t)))
    ref = np.flatnonzero(np.abs(h) >= np.float32(t))
    assert np.array_equal(_host(idx), ref) and np.array_equal(_host(vals), h[ref])


def test_gaussian_select(measure, xp, data):
    x, h, k = data
    idx, vals, thr = measure("kernel", _timed(xp, lambda: kernels.gaussian_select(x, k, DENSITY)))
    idx, vals = _host(idx), _host(vals)
    assert 0 < idx.size <= k and np.all(np.diff(idx) > 0)
    assert np.array_equal(vals, h[idx])
    # standard-normal data: the Gaussian threshold lands within a third of k
    assert idx.size >= 2 * k // 3


@pytest.fixture(scope="module")
def coo_sets(xp, data):
    """Four ranks' selections: the COO sets a sparse allreduce merges (k sorted
    indices each, drawn so that about half of them are shared and coo_sum sums)."""
    _, h, k = data
    rng = np.random.default_rng(SEED + 2)
    common = rng.choice(h.size, k // 2, replace=False)
    sets = []
    for _ in range(4):
        own = rng.choice(h.size, k - common.size, replace=False)
        i = np.unique(np.concatenate([common, own])).astype(np.int32)  # sorted, unique
        sets.append((i, rng.standard_normal(i.size, dtype=np.float32)))
    return sets, [(xp.asarray(i), xp.asarray(v)) for i, v in sets]


def test_coo_sum(measure, xp, data, coo_sets):
    hsets, dsets = coo_sets
    n = data[1].size
    idxs, vals = [s[0] for s in dsets], [s[1] for s in dsets]
    uidx, uval = measure("kernel", _timed(xp, lambda: kernels.coo_sum(idxs, vals, n)))
    exact = np.zeros(n, np.float64)
    scale = np.zeros(n, np.float64)
    for i, v in hsets:
        np.add.at(exact, i, v.astype(np.float64))
        np.add.at(scale, i, np.abs(v).astype(np.float64))
    ref = np.unique(np.concatenate([i for i, _ in hsets]))
    assert np.array_equal(_host(uidx), ref)
    err = np.abs(_host(uval) - exact[ref])
    assert np.all(err <= 4 * np.finfo(np.float32).eps * scale[ref])


def test_scatter_add(measure, xp, data, coo_sets):
    hsets, dsets = coo_sets
    n = data[1].size
    idx = xp.concatenate([s[0] for s in dsets])
    val = xp.concatenate([s[1] for s in dsets])
    out = xp.zeros(n, dtype=xp.float32)

    def setup():
        out[...] = 0
        _sync(xp)
        return (out,), {}

    # 0.5 ms of scattered writes: its fastest round is a lucky one, its median is steadier
    measure("kernel", _timed(xp, lambda o: kernels.scatter_add(o, idx, val)), setup=setup,
            gate="median")
    ref = np.zeros(n, np.float32)
    np.add.at(ref, np.concatenate([i for i, _ in hsets]), np.concatenate([v for _, v in hsets]))
    assert np.array_equal(_host(out), ref)


def test_to_dense(measure, xp, data, coo_sets):
    hsets, dsets = coo_sets
    n = data[1].size
    idx, val = dsets[0]
    # mostly a fresh zeroed n-vector: judged against allocating one, on its median (its
    # fastest round, 0.6 ms, is a lucky one)
    out = measure("kernel", _timed(xp, lambda: kernels.to_dense(idx, val, n)),
                  reference=("zeros(n)", _timed(xp, lambda: xp.zeros(n, xp.float32))),
                  gate="median")
    ref = np.zeros(n, np.float32)
    ref[hsets[0][0]] = hsets[0][1]
    assert np.array_equal(_host(out), ref)

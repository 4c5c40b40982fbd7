#!/usr/bin/env python3
"""GPU selection kernels against the memory floor, torch.topk and cupy's own routes.

Run from the repository root on a GPU machine:

    python3 tests/benchmarks/gpu_kernels.py [--log2n 20,22,24,25,26,27,28]
        [--density 0.001,0.01] [--reps 20] [--md FILE] [--json FILE] [--smoke]
        [--parts select,topk,routes,sparse,gaussian] [--gaussian-log2n 24,27]

``--parts`` picks what runs: select = threshold selection by both launch
paths (kernel and call figures; each path's kernel timed in two passes, one
after the other, to show the spread); topk = exact top-k and the radix
select; routes = torch and cupy's routes; sparse = coo_sum / scatter_add;
gaussian = Gaussiank's selection (new path and the replaced one) on normal
and Student-t(2) data.  ``--smoke``: small sizes, every kernel once against
numpy (for compute-sanitizer).

For every n and density, on standard-normal float32 data, each operation is
timed with CUDA events on the null stream (3 warm-up calls, then the median of
``--reps`` calls, each between its own pair of events and synchronised, so a
call's figure includes its launch gaps).  Inputs rotate among enough copies
(>= 256 MiB in all) that every call reads HBM, not the 50-60 MB L2.

  copy       cupy.copyto(dst, x): 4n read + 4n written
  read       a read-only kernel over x: 4n bytes, one read of the input (the floor)
  thr        threshold selection of |x| >= t, t = the exact k-th magnitude, by each
             path of kernels._cuda.threshold_select: "lookback" (one pass, sel_thr8)
             and "local" (sel_local8 + sel_stitch8; the default from n = 2^24)
  topk       kernels.topk_select(x, k): exact, sorted indices + values
  kth        the radix select alone (kernels._cuda_topk.radix)
  torch      torch.topk(x.abs(), k, sorted=False) on a zero-copy DLPack view
  torch_thr  torch.nonzero(x.abs() >= t) and the gather of the values
  cupy_topk  the generic array-module route of kernels (partition + flatnonzero + sort)
  cupy_argp  cupy.argpartition(abs(x), n-k)[n-k:] and the gather
  cupy_thr   cupy.flatnonzero(abs(x) >= t) and the gather

"Per call" figures are what a caller sees: events around the Python call,
launch gaps and the count read-back included.  "Kernel" figures replay a CUDA
graph of 20 captured launches (each with its workspace memset) and divide:
the GPU time alone.  copy/read are kernel figures.

Achieved bandwidth = the fewest bytes the operation must move / its time:
thr 4n + 8c, topk 4n + 8k (c = selected count).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

import kernels  # noqa: E402
from kernels import _cuda, _cuda_select, _cuda_topk, _select, _sparse  # noqa: E402

_READ_SRC = r"""
extern "C" __global__ void read_floor(const float4* __restrict__ x, long long n4,
                                      float never, unsigned* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        if (m > never) atomicAdd(out, 1u);   // never true (never = +inf): keeps the load
    }
}
"""
_READ = None


def read_floor(x, sink):
    global _READ
    if _READ is None:
        _READ = cp.RawKernel(_READ_SRC, "read_floor")
    n4 = x.size // 4
    _READ(((n4 + 255) // 256,), (256,), (x, np.int64(n4), np.float32(np.inf), sink))


def bench(fn, reps, nbuf, setup=None, warmup=3):
    """Median milliseconds of fn(buffer) between CUDA events, one call per pair."""
    for r in range(warmup):
        if setup:
            setup(r % nbuf)
        fn(r % nbuf)
    cp.cuda.runtime.deviceSynchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for r in range(reps):
        b = (r + warmup) % nbuf
        if setup:
            setup(b)
        start.record()
        fn(b)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times), times


def env_info():
    info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = q.stdout.strip()
    except Exception as e:  # noqa: BLE001
        info["nvidia_smi"] = f"unavailable: {e}"
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    info["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    info["sms"] = dev.attributes["MultiProcessorCount"]
    info["cupy"] = cp.__version__
    info["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    info["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    info["numpy"] = np.__version__
    info["python"] = platform.python_version()
    try:
        import torch

        info["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
    except Exception as e:  # noqa: BLE001
        info["torch"] = f"unavailable: {e}"
    info["command"] = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    return info


def graph_time(body, nbuf, reps=20, trials=5):
    """GPU milliseconds per body(b) from replays of a captured CUDA graph."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for b in range(min(nbuf, 3)):
            body(b)                      # allocations and caches outside the capture
        stream.synchronize()
        stream.begin_capture()
        for r in range(reps):
            body(r % nbuf)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(trials):
            e0.record(stream)
            graph.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) / reps)
    return statistics.median(times)


PATHS = ("lookback", "local")       # the threshold selection's two launch paths


def run_size(log2n, densities, reps, parts, results, checks):
    n = 1 << log2n
    nbuf = max(1, min(64, math.ceil((256 << 20) / (4 * n))))
    g = cp.random.default_rng(log2n)
    xs = [g.standard_normal(n, dtype=cp.float32) for _ in range(nbuf)]
    dst = cp.empty_like(xs[0])
    sink = cp.zeros(1, cp.uint32)
    want_torch = "routes" in parts
    torch = None
    if want_torch:
        import torch

        xts = [torch.from_dlpack(x) for x in xs]
        assert torch.cuda.current_stream().cuda_stream == 0, "torch not on the legacy default stream"

    row0 = {"n": n, "log2n": log2n, "nbuf": nbuf}
    row0["copy"] = graph_time(lambda b: cp.copyto(dst, xs[b]), nbuf)
    row0["read"] = graph_time(lambda b: read_floor(xs[b], sink), nbuf)
    row0["copy_call"] = bench(lambda b: cp.copyto(dst, xs[b]), reps, nbuf)[0]
    row0["read_call"] = bench(lambda b: read_floor(xs[b], sink), reps, nbuf)[0]

    if "topk" in parts:         # pass-1 histogram alone
        hws = cp.zeros(2048 + 16, cp.uint32)

        def hist1(b):
            cp.cuda.runtime.memsetAsync(hws.data.ptr, 0, hws.nbytes, cp.cuda.get_current_stream().ptr)
            _cuda_topk.hist(xs[b], n, hws.data.ptr + 4 * 2048, hws.data.ptr, 20, 11, 4)
        row0["hist1"] = graph_time(hist1, nbuf)

    default_path = "local" if n >= _cuda_select.LOCAL_MIN_N else "lookback"
    for d in densities:
        k = kernels.k_from_density(n, d)
        t = kernels.kth_magnitude(xs[0], k)
        key = _cuda.threshold_key(t)
        c = int(kernels.threshold_select(xs[0], t)[0].size)
        row = dict(row0, density=d, k=k, count=c, default_path=default_path)
        cap = min(n, 2 * c + 1024)
        oi, ov = cp.empty(cap, cp.int32), cp.empty(cap, cp.float32)
        ntiles = -(-n // _cuda_select.SEL_TILE)
        lcap = _cuda_select.local_cap(ntiles, c)
        scratch = (cp.empty(ntiles, cp.uint32), cp.empty(ntiles * lcap, cp.int32),
                   cp.empty(ntiles * lcap, cp.float32))

        def thr_kernel(path):
            if path == "local":
                return graph_time(lambda b: _cuda_select.local_select(
                    xs[b], n, key, cap, oi, ov, lcap, scratch, read_total=False), nbuf)
            return graph_time(lambda b: _cuda_select.lookback_select(
                "sel_thr8", xs[b], None, n, key, _cuda_select.NOKEY, 0, None, cap, oi, ov,
                read_total=False), nbuf)

        if "select" in parts:
            for p in PATHS:
                row[f"thr_k_{p}"] = thr_kernel(p)
            for p in PATHS:                                 # a second pass: the spread
                row[f"thr_k2_{p}"] = thr_kernel(p)
            for p in PATHS:
                row[f"thr_call_{p}"] = bench(
                    lambda b, p=p: _cuda.threshold_select(xs[b], t, path=p), reps, nbuf)[0]
            row["thr_call"] = bench(lambda b: kernels.threshold_select(xs[b], t), reps, nbuf)[0]
        if "topk" in parts:
            row["topk"] = bench(lambda b: kernels.topk_select(xs[b], k), reps, nbuf)[0]
            row["kth"] = bench(lambda b: _cuda_topk.radix(xs[b], k), reps, nbuf)[0]
        if want_torch:
            row["torch"] = bench(lambda b: torch.topk(xts[b].abs(), k, sorted=False), reps, nbuf)[0]

            def torch_thr(b):
                i = torch.nonzero(xts[b].abs() >= t).squeeze(1)
                return i, xts[b][i]
            row["torch_thr"] = bench(torch_thr, reps, nbuf)[0]

        def cupy_topk(b):
            i = _select._topk_indices_xp(xs[b], k)
            return i, xs[b][i]

        def cupy_argp(b):
            i = cp.argpartition(cp.abs(xs[b]), n - k)[n - k:]
            return i, xs[b][i]

        def cupy_thr(b):
            i = cp.flatnonzero(cp.abs(xs[b]) >= np.float32(t))
            return i, xs[b][i]
        if "routes" in parts:
            row["cupy_topk"] = bench(cupy_topk, reps, nbuf)[0]
            row["cupy_argp"] = bench(cupy_argp, reps, nbuf)[0]
            row["cupy_thr"] = bench(cupy_thr, reps, nbuf)[0]

        # same answers as the other routes, on this data, by both threshold paths
        gi, _ = cupy_topk(0)
        ci, cv = cupy_thr(0)
        ok = bool(cp.array_equal(kernels.topk_select(xs[0], k)[0], gi.astype(cp.int32)))
        for p in PATHS:
            ti, tv = _cuda.threshold_select(xs[0], t, path=p)
            ok &= bool(cp.array_equal(ti, ci.astype(cp.int32))) and bool(cp.array_equal(tv, cv))
        if want_torch and n <= 1 << 26:
            ti = torch.topk(xts[0].abs(), k, sorted=False).indices
            ok &= bool(cp.array_equal(gi.astype(cp.int32), cp.sort(cp.from_dlpack(ti)).astype(cp.int32)))
        checks.append((n, d, ok))
        results.append(row)
        print(fmt_row_short(row), flush=True)


def _gaussian_select_replaced(x, k, density, rounds=3):
    """gaussian_select as it was before the fix, for the before/after figure:
    cupy's mean / std and a cupy ReductionKernel count per correction (each a
    reduction to one scalar, which cupy runs on ONE block)."""
    global _COUNT_GE_OLD
    if _COUNT_GE_OLD is None:
        _COUNT_GE_OLD = cp.ReductionKernel(
            "float32 x, uint32 kmin", "int64 y",
            "((__float_as_uint(x) & 0x7fffffffu) >= kmin) ? 1 : 0",
            "a + b", "y = a", "0", "tk_count_ge_old")
    mu = float(cp.mean(x, dtype=np.float64))
    sigma = float(cp.std(x, dtype=np.float64))
    q = min(max(density, 1e-12), 1.0 - 1e-12)
    thr = abs(mu) + sigma * statistics.NormalDist().inv_cdf(1.0 - q / 2.0)
    best = _select.correct_threshold(
        lambda t: int(_COUNT_GE_OLD(x, np.uint32(_cuda.threshold_key(t)))), thr, k, rounds)
    idx, vals = kernels.threshold_select(x, best)
    idx, vals = kernels.cap_selection(idx, vals, k)
    return idx, vals, best


_COUNT_GE_OLD = None


def run_gaussian(log2n, densities, reps, results):
    """Gaussiank's selection per call: the new path, its parts, and the replaced one."""
    n = 1 << log2n
    g = cp.random.default_rng(1000 + log2n)
    z = g.standard_normal(n, dtype=cp.float32)
    data = {"normal": z,
            # Student-t(2) = Z / sqrt(E), E ~ Exp(1) = -log(U), U in [0, 1): the
            # collectives' benchmark data (U = 0 gives E = inf, x = 0: finite)
            "t2": z / cp.sqrt(-cp.log(g.random(n, dtype=cp.float32)))}
    assert all(bool(cp.isfinite(x).all()) for x in data.values())
    for dist, x in data.items():
        for d in densities:
            k = kernels.k_from_density(n, d)
            row = {"n": n, "log2n": log2n, "dist": dist, "density": d, "k": k}
            new = kernels.gaussian_select(x, k, d)
            old = _gaussian_select_replaced(x, k, d)
            # the thresholds may differ in the last bits (float64 sums in another order)
            row["same_result"] = bool(cp.array_equal(new[0], old[0])) and \
                bool(cp.array_equal(new[1], old[1]))
            row["thr_rel_diff"] = abs(new[2] - old[2]) / max(abs(old[2]), 1e-300)
            row["selected"] = int(new[0].size)
            row["new"] = bench(lambda b: kernels.gaussian_select(x, k, d), reps, 1)[0]
            row["new_mean_std"] = bench(lambda b: _cuda.mean_std(x), reps, 1)[0]
            keys = list(range(0x3F000000, 0x3F000000 + 10 * 0x100000, 0x100000))
            row["new_count10"] = bench(lambda b: _cuda.count_at_least_many(x, keys), reps, 1)[0]
            row["new_thr_select"] = bench(lambda b: kernels.threshold_select(x, new[2]), reps, 1)[0]
            r_old = max(2, min(reps, 3))
            row["old"] = bench(lambda b: _gaussian_select_replaced(x, k, d), r_old, 1, warmup=1)[0]
            row["old_mean_std"] = bench(
                lambda b: (float(cp.mean(x, dtype=np.float64)), float(cp.std(x, dtype=np.float64))),
                r_old, 1, warmup=1)[0]
            row["old_count1"] = bench(lambda b: int(_COUNT_GE_OLD(x, np.uint32(keys[0]))),
                                      r_old, 1, warmup=1)[0]
            results.append(row)
            print(row, flush=True)


def run_sparse(log2n, reps, results):
    """coo_sum of P=8 index-sorted sets of k = n/100 entries; scatter_add of the sum."""
    n = 1 << log2n
    k = n // 100
    P = 8
    g = cp.random.default_rng(100 + log2n)
    cp.random.seed(100 + log2n)
    sets = [cp.sort(cp.random.permutation(n)[:k]).astype(cp.int32) for _ in range(P)]
    vals = [g.standard_normal(k, dtype=cp.float32) for _ in range(P)]
    dense = cp.zeros(n, cp.float32)
    row = {"n": n, "P": P, "k": k}
    row["coo_sum"] = bench(lambda b: kernels.coo_sum(sets, vals, n), reps, 1)[0]
    ui, uv = kernels.coo_sum(sets, vals, n)
    gi, gv = cp.concatenate(sets), cp.concatenate(vals)
    row["scatter_add_merged"] = bench(lambda b: kernels.scatter_add(dense, ui, uv), reps, 1)[0]
    row["scatter_add_raw"] = bench(lambda b: kernels.scatter_add(dense, gi, gv), reps, 1)[0]

    def coo_sum_generic(b):     # the array-module route: stable sort, cupy's add.reduceat
        uidx, sval, starts = _sparse._runs(cp, cp.concatenate(sets), cp.concatenate(vals))
        return uidx, cp.add.reduceat(sval, starts)
    row["coo_sum_generic"] = bench(coo_sum_generic, reps, 1)[0]
    row["scatter_add_generic"] = bench(lambda b: cp.add.at(dense, gi, gv), reps, 1)[0]
    import cupyx

    row["cupyx_scatter_add"] = bench(lambda b: cupyx.scatter_add(dense, gi, gv), reps, 1)[0]
    results.append(row)
    print(row, flush=True)


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def _f(r, key, fmt="{:.4f}"):
    return fmt.format(r[key]) if key in r else "-"


def fmt_row_short(r):
    thr = " / ".join(f"{p} {_f(r, f'thr_k_{p}')} (2nd {_f(r, f'thr_k2_{p}')})" for p in PATHS)
    return (f"n=2^{r['log2n']} d={r['density']}: read {r['read']:.4f} copy {r['copy']:.4f} "
            f"| thr kernel {thr} | call {_f(r, 'thr_call')} | topk {_f(r, 'topk')} ms")


def markdown(info, results, sparse, checks, gauss):
    L = []
    L.append(f"Date (UTC): {info['date_utc']}; card: {info['device']} ({info['sms']} SMs); "
             f"nvidia-smi: {info['nvidia_smi']}")
    L.append(f"cupy {info['cupy']} (CUDA runtime {info['cuda_runtime']}, driver API "
             f"{info['cuda_driver']}), torch {info['torch']}, numpy {info['numpy']}, "
             f"Python {info['python']}")
    L.append(f"Command: `{info['command']}`")
    L.append("")
    sel = [r for r in results if any(k.startswith("thr_k_") for k in r)]
    if sel:
        L.append("Threshold selection against the memory floor, both launch paths in one run. "
                 "ms are medians of CUDA-graph replays (GPU time per launch); x read = time / "
                 "one read of the input (the read-only kernel); lookback: one pass, a "
                 "decoupled look-back per tile of 8192; local: two launches, tile-local "
                 "compaction into scratch then a stitch (offsets by one look-back per group "
                 "of tiles, copy out), the default from n = 2^"
                 f"{_cuda_select.LOCAL_MIN_N.bit_length() - 1}; '2nd' = the same kernel "
                 "timed again in a second pass (the spread); call = the Python call with the "
                 "count read-back; GB/s = (4n + 8c) / time.")
        L.append("")
        L.append("| n | density | selected c | read ms | " + " | ".join(
            f"{p} kernel ms (x read) | 2nd | {p} GB/s" for p in PATHS) + " | " + " | ".join(
            f"call {p} ms" for p in PATHS) + " | call default ms |")
        L.append("|---" * (4 + 3 * len(PATHS) + len(PATHS) + 1) + "|")
        for r in sel:
            fewest = 4 * r["n"] + 8 * r["count"]
            L.append(
                f"| 2^{r['log2n']} | {r['density']:g} | {r['count']} | {r['read']:.4f} | "
                + " | ".join(f"{r[f'thr_k_{p}']:.4f} ({r[f'thr_k_{p}'] / r['read']:.2f}) | "
                             f"{r[f'thr_k2_{p}']:.4f} | {gbps(fewest, r[f'thr_k_{p}']):.0f}"
                             for p in PATHS)
                + " | " + " | ".join(f"{r[f'thr_call_{p}']:.4f}" for p in PATHS)
                + f" | {r['thr_call']:.4f} |")
    tk = [r for r in results if "topk" in r]
    if tk:
        L.append("")
        L.append("Exact top-k (ms per call, median); with routes: torch.topk and cupy's routes.")
        L.append("")
        L.append("| n | density | k | topk ms | topk x read | pass-1 hist kernel ms | radix only ms "
                 "| torch.topk ms | cupy generic ms | cupy argpartition ms "
                 "| torch thr+nonzero ms | cupy thr+flatnonzero ms |")
        L.append("|---" * 12 + "|")
        for r in tk:
            L.append(f"| 2^{r['log2n']} | {r['density']:g} | {r['k']} | {r['topk']:.4f} "
                     f"| {r['topk'] / r['read']:.2f} | {_f(r, 'hist1')} | {_f(r, 'kth')} "
                     f"| {_f(r, 'torch')} | {_f(r, 'cupy_topk', '{:.3f}')} "
                     f"| {_f(r, 'cupy_argp', '{:.3f}')} | {_f(r, 'torch_thr')} "
                     f"| {_f(r, 'cupy_thr')} |")
    if gauss:
        L.append("")
        L.append("Gaussiank's selection, `kernels.gaussian_select` per call (ms, median): new = "
                 "float64 mean/std by `gs_partial` (2 reads) + one `gs_count16` pass for every "
                 "threshold the corrections can reach + threshold_select + cap; old = the "
                 "replaced code (cupy mean/std, one cupy ReductionKernel count per correction). "
                 "same = identical indices, values and threshold.")
        L.append("")
        L.append("| n | data | density | selected | new ms | mean+std ms | count x10 ms "
                 "| threshold_select ms | old ms | old mean+std ms | old one count ms | old / new "
                 "| same |")
        L.append("|---" * 13 + "|")
        for r in gauss:
            L.append(f"| 2^{r['log2n']} | {r['dist']} | {r['density']:g} | {r['selected']} "
                     f"| {r['new']:.3f} | {r['new_mean_std']:.3f} | {r['new_count10']:.3f} "
                     f"| {r['new_thr_select']:.3f} | {r['old']:.1f} | {r['old_mean_std']:.1f} "
                     f"| {r['old_count1']:.1f} | {r['old'] / r['new']:.0f} | {r['same_result']} |")
    if sparse:
        L.append("")
        L.append("Sparse arithmetic (ms per call, median): coo_sum of P = 8 sorted sets of "
                 "k = n/100; scatter_add of the merged set (unique, sorted) and of the raw "
                 "concatenation (repeats, unsorted: stable sort + one thread per run); "
                 "generic = the array-module code on cupy (reduceat / add.at with float atomics):")
        L.append("")
        L.append("| n | k | coo_sum ms | coo_sum generic ms | scatter_add merged ms | "
                 "scatter_add raw ms | scatter_add generic ms | cupyx.scatter_add ms |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in sparse:
            L.append(f"| 2^{int(math.log2(r['n']))} | {r['k']} | {r['coo_sum']:.3f} "
                     f"| {r['coo_sum_generic']:.3f} | {r['scatter_add_merged']:.3f} "
                     f"| {r['scatter_add_raw']:.3f} | {r['scatter_add_generic']:.3f} "
                     f"| {r['cupyx_scatter_add']:.3f} |")
    bad = [c for c in checks if not c[2]]
    L.append("")
    L.append(f"Cross-checks (top-k and both threshold paths == cupy's generic routes; "
             f"torch.topk indices where n <= 2^26 with routes): "
             f"{len(checks) - len(bad)}/{len(checks)} agree"
             + (f"; DISAGREE: {bad}" if bad else ""))
    return "\n".join(L)


def smoke():
    """Small sizes, every kernel once, checked against numpy (for compute-sanitizer)."""
    rng = np.random.default_rng(int(time.time()))
    for n in (1, 5, 4097, 70_001):
        x = rng.standard_normal(n).astype(np.float32)
        x[::7] = 1.0
        xg = cp.asarray(x)
        for k in sorted({1, max(1, n // 100), n}):
            a, b = kernels.topk_select(xg, k), kernels.topk_select(x, k)
            assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
            if k < n:       # the radix select, below the one-block kernel's sizes too
                a = _cuda.topk_select(xg, k, small_max=0)
                assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
        t = float(np.quantile(np.abs(x), 0.9))
        b = kernels.threshold_select(x, t)
        for path in PATHS:
            _cuda_select._CAP_HINT.clear()
            for cap in (None, 3):       # 3: the output overflows, written again
                a = _cuda.threshold_select(xg, t, cap=cap, path=path)
                assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
        i = rng.integers(0, max(1, n // 3), 3 * n).astype(np.int32)
        v = rng.standard_normal(3 * n).astype(np.float32)
        a, b = kernels.coo_sum(cp.asarray(i), cp.asarray(v)), kernels.coo_sum(i, v)
        assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
        d = np.zeros(n, np.float32)
        dg = cp.asarray(d)
        kernels.scatter_add(dg, cp.asarray(i), cp.asarray(v))
        kernels.scatter_add(d, i, v)
        assert np.array_equal(dg.get(), d)
        mu, sd = _cuda.mean_std(xg)
        assert abs(sd - float(np.std(x, dtype=np.float64))) <= 1e-9 * sd
        k = max(1, n // 100)
        a, b = kernels.gaussian_select(xg, k, 0.01), kernels.gaussian_select(x, k, 0.01)
        assert np.array_equal(a[0].get(), b[0]) and math.isclose(a[2], b[2], rel_tol=1e-12)
    cp.cuda.runtime.deviceSynchronize()
    print("smoke: all kernels (both threshold paths, radix and one-block top-k) agree with numpy")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2n", default="20,22,24,25,26,27,28")
    ap.add_argument("--density", default="0.001,0.01")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--parts", default="select,topk,routes,sparse,gaussian",
                    help="comma list of select, topk, routes, sparse, gaussian")
    ap.add_argument("--sparse-log2n", default="24,26")
    ap.add_argument("--gaussian-log2n", default="24,27")
    ap.add_argument("--no-torch", action="store_true", help="same as leaving 'routes' out")
    ap.add_argument("--md", help="write the markdown tables here")
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("--smoke", action="store_true", help="small correctness run only")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    unknown = parts - {"select", "topk", "routes", "sparse", "gaussian"}
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}")
    if args.no_torch:
        parts.discard("routes")
    _cuda.warm_up()
    if args.smoke:
        smoke()
        return 0
    info = env_info()
    print(json.dumps(info, indent=1), flush=True)
    densities = [float(d) for d in args.density.split(",")]
    results, sparse, checks, gauss = [], [], [], []
    if parts & {"select", "topk", "routes"}:
        for log2n in [int(v) for v in args.log2n.split(",")]:
            run_size(log2n, densities, args.reps, parts, results, checks)
            cp.get_default_memory_pool().free_all_blocks()
    if "gaussian" in parts:
        for log2n in [int(v) for v in args.gaussian_log2n.split(",") if v]:
            run_gaussian(log2n, densities, args.reps, gauss)
            cp.get_default_memory_pool().free_all_blocks()
    if "sparse" in parts:
        for log2n in [int(v) for v in args.sparse_log2n.split(",") if v]:
            run_sparse(log2n, args.reps, sparse)
    md = markdown(info, results, sparse, checks, gauss)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "selection": results,
                                               "sparse": sparse, "gaussian": gauss,
                                               "checks": checks}, indent=1))
    ok = all(c[2] for c in checks) and all(g["same_result"] for g in gauss)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

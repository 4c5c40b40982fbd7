#!/usr/bin/env python3
"""GPU selection kernels against the memory floor, torch.topk and cupy's own routes.

Run from the repository root on a GPU machine:

    python3 tests/benchmarks/gpu_kernels.py [--log2n 20,22,24,25,26,27,28]
        [--density 0.001,0.01] [--reps 20] [--md FILE] [--json FILE] [--smoke]

For every n and density, on standard-normal float32 data, each operation is
timed with CUDA events on the null stream (3 warm-up calls, then the median of
``--reps`` calls, each between its own pair of events and synchronised, so a
call's figure includes its launch gaps).  Inputs rotate among enough copies
(>= 256 MiB in all) that every call reads HBM, not the 50-60 MB L2.

  copy       cupy.copyto(dst, x): 4n read + 4n written
  read       a read-only kernel over x: 4n bytes, one read of the input (the floor)
  thr        kernels.threshold_select(x, t), t = the exact k-th magnitude
  thr_ef     kernels.threshold_select_ef(r, x, t), r zeroed before the call (untimed)
  topk       kernels.topk_select(x, k): exact, sorted indices + values
  kth        the radix select alone (kernels._cuda._radix)
  torch      torch.topk(x.abs(), k, sorted=False) on a zero-copy DLPack view
  torch_thr  torch.nonzero(x.abs() >= t) and the gather of the values
  cupy_topk  the generic array-module route of kernels (partition + flatnonzero + sort)
  cupy_argp  cupy.argpartition(abs(x), n-k)[n-k:] and the gather
  cupy_thr   cupy.flatnonzero(abs(x) >= t) and the gather

"Per call" figures are what a caller sees: events around the Python call,
launch gaps and the count read-back included.  "Kernel" figures replay a CUDA
graph of 20 captured launches (each with its workspace memset) and divide:
the GPU time alone.  copy/read are kernel figures.  The EF kernel figure is
graph(memset r + EF) - graph(memset r).

Achieved bandwidth = the fewest bytes the operation must move / its time:
thr 4n + 8c, thr_ef 12n + 8c, topk 4n + 8k (c = selected count).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
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
from kernels import _cuda, _select  # noqa: E402

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


def run_size(log2n, densities, reps, want_torch, results, checks):
    n = 1 << log2n
    nbuf = max(1, min(64, math.ceil((256 << 20) / (4 * n))))
    g = cp.random.default_rng(log2n)
    xs = [g.standard_normal(n, dtype=cp.float32) for _ in range(nbuf)]
    dst = cp.empty_like(xs[0])
    res = [cp.zeros_like(xs[0]) for _ in range(nbuf)]
    sink = cp.zeros(1, cp.uint32)
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

    def zero_res(b):
        cp.cuda.runtime.memsetAsync(res[b].data.ptr, 0, 4 * n, cp.cuda.get_current_stream().ptr)
    row0["memset_r"] = graph_time(zero_res, nbuf)

    # pass-1 histogram alone
    hws = cp.zeros(2048 + 16, cp.uint32)

    def hist1(b):
        cp.cuda.runtime.memsetAsync(hws.data.ptr, 0, hws.nbytes, cp.cuda.get_current_stream().ptr)
        _cuda._hist(xs[b], n, hws.data.ptr + 4 * 2048, hws.data.ptr, 20, 11, 4)
    row0["hist1"] = graph_time(hist1, nbuf)

    for d in densities:
        k = kernels.k_from_density(n, d)
        t = kernels.kth_magnitude(xs[0], k)
        key = _cuda.threshold_key(t)
        c = int(kernels.threshold_select(xs[0], t)[0].size)
        row = dict(row0, density=d, k=k, count=c)
        cap = min(n, 2 * c + 1024)
        oi, ov = cp.empty(cap, cp.int32), cp.empty(cap, cp.float32)
        for j in (4, 8):
            row[f"thr_k{j}"] = graph_time(lambda b: _cuda._select(
                f"sel_thr{j}", xs[b], None, None, n, key, _cuda._NOKEY, 0, None, cap, oi, ov,
                read_total=False), nbuf)

        for name in ("sel_ef4", "sel_ef8", "sel_efr4", "sel_efr8"):
            def ef(b, name=name):
                zero_res(b)
                _cuda._select(name, res[b], xs[b], None, n, key, _cuda._NOKEY, 0, None,
                              cap, oi, ov, read_total=False)
            row[f"ef_k_{name}"] = graph_time(ef, nbuf) - row0["memset_r"]
        default_j = _cuda.SELECT_J
        for j in (4, 8):
            _cuda.SELECT_J = j
            row[f"thr_call{j}"] = bench(lambda b: kernels.threshold_select(xs[b], t), reps, nbuf)[0]
            row[f"topk{j}"] = bench(lambda b: kernels.topk_select(xs[b], k), reps, nbuf)[0]
        _cuda.SELECT_J = default_j
        row["select_j"] = default_j
        row["ef_kernel"] = _cuda.EF_KERNEL
        row["ef_call"] = bench(lambda b: kernels.threshold_select_ef(res[b], xs[b], t), reps,
                               nbuf, setup=lambda b: res[b].fill(0))[0]
        row["kth"] = bench(lambda b: _cuda._radix(xs[b], k), reps, nbuf)[0]
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
        row["cupy_topk"] = bench(cupy_topk, reps, nbuf)[0]
        row["cupy_argp"] = bench(cupy_argp, reps, nbuf)[0]
        row["cupy_thr"] = bench(cupy_thr, reps, nbuf)[0]

        # same answers as the other routes, on this data
        oi2, ov2 = kernels.topk_select(xs[0], k)
        gi, _ = cupy_topk(0)
        ok = bool(cp.array_equal(oi2, gi.astype(cp.int32)))
        if want_torch and n <= 1 << 26:
            ti = torch.topk(xts[0].abs(), k, sorted=False).indices
            ok &= bool(cp.array_equal(oi2, cp.sort(cp.from_dlpack(ti)).astype(cp.int32)))
        ti2, tv2 = kernels.threshold_select(xs[0], t)
        ci, cv = cupy_thr(0)
        ok &= bool(cp.array_equal(ti2, ci.astype(cp.int32))) and bool(cp.array_equal(tv2, cv))
        checks.append((n, d, ok))
        results.append(row)
        print(fmt_row_short(row), flush=True)


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
    os.environ["AUTOTUNE_KERNELS_CUDA"] = "0"
    try:
        row["coo_sum_generic"] = bench(lambda b: kernels.coo_sum(sets, vals, n), reps, 1)[0]
        row["scatter_add_generic"] = bench(lambda b: kernels.scatter_add(dense, gi, gv), reps, 1)[0]
    finally:
        del os.environ["AUTOTUNE_KERNELS_CUDA"]
    import cupyx

    row["cupyx_scatter_add"] = bench(lambda b: cupyx.scatter_add(dense, gi, gv), reps, 1)[0]
    results.append(row)
    print(row, flush=True)


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def fmt_row_short(r):
    efk = "/".join(f"{r['ef_k_' + nm]:.4f}" for nm in ("sel_ef4", "sel_ef8", "sel_efr4", "sel_efr8"))
    return (f"n=2^{r['log2n']} d={r['density']}: read {r['read']:.4f} copy {r['copy']:.4f} "
            f"hist1 {r['hist1']:.4f} | thr kernel {r['thr_k4']:.4f}/{r['thr_k8']:.4f} "
            f"call {r['thr_call4']:.4f}/{r['thr_call8']:.4f} | ef kernel ef4/ef8/efr4/efr8 {efk} "
            f"call {r['ef_call']:.4f} | topk {r['topk4']:.4f}/{r['topk8']:.4f} "
            f"kth {r['kth']:.4f} torch {r.get('torch', float('nan')):.4f} "
            f"cupy {r['cupy_topk']:.3f}/{r['cupy_argp']:.3f} | thr torch {r.get('torch_thr', float('nan')):.4f} "
            f"cupy {r['cupy_thr']:.4f} ms")


def dflt(r, name):
    """The figure of the default tile shape (SELECT_J) and the other one's."""
    j = r["select_j"]
    return r[f"{name}{j}"], r[f"{name}{12 - j}"]


def markdown(info, results, sparse, checks):
    L = []
    L.append(f"Date (UTC): {info['date_utc']}; card: {info['device']} ({info['sms']} SMs); "
             f"nvidia-smi: {info['nvidia_smi']}")
    L.append(f"cupy {info['cupy']} (CUDA runtime {info['cuda_runtime']}, driver API "
             f"{info['cuda_driver']}), torch {info['torch']}, numpy {info['numpy']}, "
             f"Python {info['python']}")
    L.append(f"Command: `{info['command']}`")
    L.append("")
    r0 = results[0] if results else {"select_j": "?", "ef_kernel": "?"}
    L.append("Threshold selection against the memory floor. ms are medians; 'kernel' = GPU "
             "time from CUDA-graph replays, 'call' = the Python call as a caller sees it "
             "(launch gaps and the count read-back included); x read = time / one read of "
             "the input (the read-only kernel); GB/s = fewest bytes / kernel time "
             f"(thr 4n + 8c, EF 12n + 8c). Defaults: J = {r0['select_j']} float4 per lane "
             f"(tiles of {1024 * r0['select_j']}), EF kernel {r0['ef_kernel']}; "
             "the other variants' kernel times follow.")
    L.append("")
    L.append("| n | density | selected c | read ms (GB/s) | copy ms (GB/s) | thr kernel ms "
             "| thr kernel x read | thr GB/s | thr call ms | thr call x read | other J kernel ms "
             "| EF kernel ms | EF GB/s | EF call ms | EF ef4/ef8/efr4/efr8 kernel ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        n = r["n"]
        tk, tk_other = dflt(r, "thr_k")
        tc, _ = dflt(r, "thr_call")
        ek = r["ef_k_" + r["ef_kernel"]]
        efs = " / ".join(f"{r['ef_k_' + nm]:.4f}" for nm in ("sel_ef4", "sel_ef8", "sel_efr4", "sel_efr8"))
        L.append(
            f"| 2^{r['log2n']} | {r['density']:g} | {r['count']} "
            f"| {r['read']:.4f} ({gbps(4 * n, r['read']):.0f}) | {r['copy']:.4f} ({gbps(8 * n, r['copy']):.0f}) "
            f"| {tk:.4f} | {tk / r['read']:.2f} | {gbps(4 * n + 8 * r['count'], tk):.0f} "
            f"| {tc:.4f} | {tc / r['read']:.2f} | {tk_other:.4f} "
            f"| {ek:.4f} | {gbps(12 * n + 8 * r['count'], ek):.0f} | {r['ef_call']:.4f} | {efs} |")
    L.append("")
    L.append("Exact top-k (ms per call, median) against torch.topk and cupy's routes "
             "(threshold routes per call for reference). topk = 2 full reads (pass-1 "
             "histogram; ordered compaction of the candidate bins) + small passes.")
    L.append("")
    L.append("| n | density | k | topk ms | topk x read | other J ms | pass-1 hist kernel ms "
             "| radix only ms | torch.topk ms | torch / ours | cupy generic ms "
             "| cupy argpartition ms | thr call ms | torch thr+nonzero ms | cupy thr+flatnonzero ms |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        tk, tk_other = dflt(r, "topk")
        t = r.get("torch", float("nan"))
        tc, _ = dflt(r, "thr_call")
        L.append(
            f"| 2^{r['log2n']} | {r['density']:g} | {r['k']} | {tk:.4f} "
            f"| {tk / r['read']:.2f} | {tk_other:.4f} | {r['hist1']:.4f} | {r['kth']:.4f} "
            f"| {t:.4f} | {t / tk:.1f} | {r['cupy_topk']:.3f} | {r['cupy_argp']:.3f} "
            f"| {tc:.4f} | {r.get('torch_thr', float('nan')):.4f} | {r['cupy_thr']:.4f} |")
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
    L.append(f"Cross-checks (ours == cupy generic route == sorted torch.topk indices where "
             f"n <= 2^26; threshold == cupy): {len(checks) - len(bad)}/{len(checks)} agree"
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
        t = float(np.quantile(np.abs(x), 0.9))
        a, b = kernels.threshold_select(xg, t), kernels.threshold_select(x, t)
        assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
        r = rng.standard_normal(n).astype(np.float32)
        rg = cp.asarray(r)
        a, b = _cuda.threshold_select_ef(rg, xg, t, cap=3), kernels.threshold_select_ef(r, x, t)
        assert np.array_equal(a[0].get(), b[0]) and np.array_equal(rg.get(), r)
        i = rng.integers(0, max(1, n // 3), 3 * n).astype(np.int32)
        v = rng.standard_normal(3 * n).astype(np.float32)
        a, b = kernels.coo_sum(cp.asarray(i), cp.asarray(v)), kernels.coo_sum(i, v)
        assert np.array_equal(a[0].get(), b[0]) and np.array_equal(a[1].get(), b[1])
        d = np.zeros(n, np.float32)
        dg = cp.asarray(d)
        kernels.scatter_add(dg, cp.asarray(i), cp.asarray(v))
        kernels.scatter_add(d, i, v)
        assert np.array_equal(dg.get(), d)
    cp.cuda.runtime.deviceSynchronize()
    print("smoke: all kernels agree with numpy")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2n", default="20,22,24,25,26,27,28")
    ap.add_argument("--density", default="0.001,0.01")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sparse-log2n", default="24,26")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--md", help="write the markdown tables here")
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("--smoke", action="store_true", help="small correctness run only")
    args = ap.parse_args(argv)
    _cuda.warm_up()
    if args.smoke:
        smoke()
        return 0
    info = env_info()
    print(json.dumps(info, indent=1), flush=True)
    densities = [float(d) for d in args.density.split(",")]
    results, sparse, checks = [], [], []
    for log2n in [int(v) for v in args.log2n.split(",")]:
        run_size(log2n, densities, args.reps, not args.no_torch, results, checks)
        cp.get_default_memory_pool().free_all_blocks()
    for log2n in [int(v) for v in args.sparse_log2n.split(",") if v]:
        run_sparse(log2n, args.reps, sparse)
    md = markdown(info, results, sparse, checks)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "selection": results,
                                               "sparse": sparse, "checks": checks}, indent=1))
    return 0 if all(c[2] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Hand-written CUDA for the hot selection and sparse kernels (cupy only).

Imported lazily, the first time a cupy array reaches a kernel: importing this
module imports cupy.  Every public function here takes cupy arrays on one
device and returns cupy arrays on that device; the numpy-facing API in
``_select`` / ``_sparse`` decides when to call in here (float32, contiguous,
16-byte aligned, fewer than 2**31 elements) and falls back to the generic
array-module code otherwise.

The kernels, and why they look the way they do:

``sel_*`` -- threshold selection in ONE pass over the data.
    A single-pass stream compaction with a *decoupled look-back* scan (Merrill
    & Garland, 2016; what CUB's DeviceSelect does): block b loads tile b
    (4096, 8192 or 16384 entries, coalesced float4 loads), ranks its selected entries
    with one warp scan of byte-packed per-chunk counts, publishes its count,
    sums its predecessors' published counts (an inclusive prefix ends the
    walk), publishes its own inclusive prefix and writes its entries at
    ``prefix + rank``.  Tiles are ranked by index and entries inside a tile
    in index order, so the output is sorted ascending with no sort: nothing
    hands out output slots by atomics.  Bytes: read 4n once, write 8 per
    selected entry.  One 64-bit status word per tile carries two counts
    (2 flag bits + 2 x 31 bits): entries strictly above a key and ties equal
    to it, which gives the exact top-k tie rule (the first ``need`` ties by
    index) in the same single pass.  Variants: plain; error feedback (acc =
    residual + x on the fly, written back with the emitted entries zeroed:
    read 8n, write 4n); the continuation of error feedback after an output
    overflow; top-k over a compacted candidate list (indices gathered).
    Staged variants (``sel_*s4`` / ``sel_*s8``): each warp puts its selected
    entries in shared memory, in rank order, before the look-back, and
    copies them out to consecutive slots after it: no second load of the
    tile, no scattered stores (a warp with more than a quarter of its span
    selected writes directly instead).  ``sel_*16``: tiles of 16384 (half the
    look-backs); ``sel_*v8``: direct writes with the values held in registers
    through the look-back (no re-load; 3 blocks per SM instead of 4).  Both
    measured slower than ``sel_*8`` (docs/BENCHMARKS.md), as were persistent
    grid variants (commit 8493caf; removed: see BENCHMARKS for why).

``sel_local8`` + ``sel_stitch8`` -- threshold selection in two launches.
    The default for n >= 2^24 (``THRESHOLD_PATH``).  The one-pass kernels
    wait: a tile is written only after its predecessors' counts arrive, and
    that chain, not the bytes, set their speed (1.9-2.4x one read).  Here the
    pass over the data waits for nothing: each block compacts its tile's
    selected entries, in order, into its own slot of a scratch area (sized
    from the previous call's count) and stores the tile's count; the stitch
    then finds each group of up to 32 tiles' output offset with one
    look-back per group and copies the entries out.  A tile whose entries do
    not fit its slot is selected again from the input by the stitch, so the
    result is exact for any data.  1.2-1.9x one read at 2^24..2^28 on an
    H200 (docs/BENCHMARKS.md, "Two launches").

``gs_partial`` / ``gs_finish`` / ``gs_count*`` -- Gaussiank's statistics.
    Mean and variance in float64 as NumPy computes them (sum x / n, then
    sum (x - mean)^2 / n: two reads), over a fixed grid and reduced in a
    fixed order, so the same bits every run.  ``gs_count*`` counts
    |x| >= t for up to 16 thresholds in one read, so Gaussiank's threshold
    corrections cost one pass, not one pass each.  (cupy's own reductions
    to a scalar -- ``ReductionKernel``, ``std`` -- run on ONE block: one SM
    of the GPU, about 5 GB/s; that made Gaussiank 200-500 ms at n = 2^27.)

``tk_hist`` / ``tk_find`` -- radix select of the k-th largest |x|.
    |x| of a float32 is its bit pattern with the sign cleared, and for
    non-negative floats the unsigned-integer order is the float order, so the
    k-th largest magnitude is found digit by digit on the 31-bit key:
    bits 30..20 (2048 bins), 19..10 (1024), 9..0 (1024).  Pass 1 histograms
    all of x (block-private shared-memory histograms, 4 copies against
    same-bin serialisation); ``tk_find`` (one warp) scans from the top for the
    bin holding the k-th key and keeps the state on the device.  The entries
    in that bin and above (k plus one bin: a few percent of n) are then
    compacted in index order by the select kernel, and passes 2 and 3 and
    the final select run on those candidates only.  Two full reads of x.

``tk_small`` -- exact top-k of a small array (up to ``TOPK_SMALL_MAX``
    entries) in one launch of one block and no host read: the same 31-bit
    key radix select in four 8-bit digits over shared-memory histograms,
    then an ordered write of the keys above the k-th and the first ties
    (two block scans place each thread's contiguous run).  The radix path
    above costs ~110-190 us whatever the size (ten launches and a host read);
    this one 24-57 us of GPU time up to 2^14 entries, which is what Ok-Topk's
    caps (the local, sender, quota and global ones) mostly see at small k
    (docs/BENCHMARKS.md, "Exact top-k of a small array in one launch").

``seg_sum_*`` -- segmented sums in NumPy's exact order.
    ``np.add.reduceat`` computes a0 + pairwise(a1..am) (NumPy's pairwise
    summation: plain loop under 8 terms, 8 accumulators up to 128, halving
    above).  Reproducing that order makes the GPU ``coo_sum`` bitwise equal
    to the CPU one, which keeps replicas on mixed hosts identical.

``seg_scatter_add_*`` -- deterministic scatter-add.
    On index-sorted input each run of equal indices is added by one thread in
    input order, starting from the dense value: exactly ``np.add.at``'s order,
    with no float atomics (whose order, and so rounding, varies run to run).

Kernels are compiled once per process and device (module-level cache).
"""
from __future__ import annotations

import functools
import math
import os
import re

import cupy as cp
import numpy as np

# --------------------------------------------------------------------------
# CUDA source
# --------------------------------------------------------------------------

_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FULL 0xffffffffu
#define KEY_MASK 0x7fffffffu

// ---- select: one pass, decoupled look-back, ordered output -----------------
#define SEL_THREADS 256
#define SEL_WARPS 8
#ifndef MINB_THR4
#define MINB_THR4 6
#define MINB_THR8 4
#define MINB_EF4 4
#define MINB_EF8 2
#define MINB_EFR4 6
#define MINB_EFR8 4
#define MINB_TOPK4 4
#define MINB_TOPK8 2
#define MINB_THR16 2
#define MINB_TOPK16 2
#define MINB_THRV8 3
#define MINB_TOPKV8 2
#endif
#define ST_FLAG_SHIFT 62
#define ST_AGG (1ull << 62)
#define ST_INC (2ull << 62)
#define CNT31 0x7fffffffull

__device__ __forceinline__ void st_publish(u64* p, u64 v) { *((volatile u64*)p) = v; }
__device__ __forceinline__ u64 st_read(const u64* p) { return *((volatile const u64*)p); }

__device__ __forceinline__ u32 warp_incl_scan(u32 v, const int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 t = __shfl_up_sync(FULL, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

__device__ __forceinline__ u32 byte_of(const u32 w, const int q) { return (w >> (8 * q)) & 0xffu; }

// One warp over a histogram of nb bins (a multiple of 32): the bin holding the
// k-th largest key, scanning from the top.  On the lane that finds it: returns
// the bin, with *krem = k less the keys in higher bins and *cnt = the bin's
// count.  Other lanes return -1; every lane returns -2 if fewer than k keys.
__device__ __forceinline__ int warp_kth_bin(const u32* hist, const int nb, const u32 k,
                                            const int lane, u32* krem, u32* cnt) {
    u32 run = 0u;
    for (int top = nb - 1; top >= 0; top -= 32) {
        const int bin = top - lane;
        const u32 h = hist[bin];
        const u32 incl = run + warp_incl_scan(h, lane);
        const u32 hit = __ballot_sync(FULL, incl >= k);
        if (hit) {
            if (lane != __ffs(hit) - 1) return -1;
            *krem = k - (incl - h);
            *cnt = h;
            return bin;
        }
        run = __shfl_sync(FULL, incl, 31);
    }
    return -2;
}
__device__ __forceinline__ u32 byte_sum(const u32 w) {
    return (w & 0xffu) + ((w >> 8) & 0xffu) + ((w >> 16) & 0xffu) + (w >> 24);
}

// Block b handles tile b: SEL_WARPS * 32 * 4 * J entries.  (Using blockIdx.x
// as the tile id, as CUB's single-pass scans do, relies on blocks being
// dispatched in index order, so every tile a block waits on belongs to a block
// already running.)  Lane l of warp w loads float4 number j*32 + l of the warp's
// span, so every load is coalesced, and the span's index order is
// (j, lane, element).  Per lane and chunk j the selected count (0..4) goes into
// one byte of a packed word; one warp scan of the packed word ranks all chunks
// at once (a chunk's warp total is at most 128, so bytes never carry; a warp's
// totals are at most 32*4*J = 2048 at J = 16 and a block's 8 * 2048 = 2^14, so
// the 16-bit halves of the block scan never carry either).  Ties at
// tie_key are counted the same way when TIES: entry i is selected when
// key >= above_key, or key == tie_key and fewer than `need` ties precede it;
// its output slot is  #(above before i) + min(#(ties before i), need).
// (above_key > tie_key wherever TIES is used, so no entry is both.)
// MODE 0: select from a.  MODE 1: acc = a + b, written back to a with the
// emitted entries zeroed (error feedback).  MODE 2: like 1 without b (the
// continuation after an output overflow; it only zeroes what it emits).
// GATHER: a is a compacted candidate list and in_idx its original indices.
//
// Two ways to write a tile's entries once its prefix is known:
// select_tile (direct): after the look-back each thread loads its selected
//   chunks again (L1/L2 hits: the tile was just read) unless KEEP holds them
//   in registers (without KEEP a thread needs few registers and more blocks
//   stay resident, i.e. more loads in flight), and writes each entry at
//   prefix + rank: scattered 4-byte stores.
// select_tile_staged: before the look-back every warp puts its candidates
//   (tile offset, #ties before it, value) into shared memory at their rank in
//   the tile, so the look-back overlaps that work and the values need no
//   second load; afterwards the block copies ranks 0..count-1 out to
//   prefix + rank: consecutive threads, consecutive slots.  MODE 1 writes the
//   residual back before the look-back too, with the candidates zeroed; one
//   that lands past `cap` is put back from the stage.  A tile with more
//   candidates than the stage holds (TILE / 4) takes the direct path.

// A lane's candidate masks: bit 4j+c for entry c of chunk j (4J bits).
template <int J> struct SelMask { typedef u32 T; };
template <> struct SelMask<16> { typedef u64 T; };

// Load the tile (this warp's span).
template <int J, int MODE>
__device__ __forceinline__ void tile_load(
    const float* aw, const float* bw, const int lim, const int lane, float (&v)[J][4])
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int o = (j * 32 + lane) * 4;
        if (o + 3 < lim) {
            float4 q;
            if (MODE == 0) q = __ldg(reinterpret_cast<const float4*>(aw + o));
            else q = *reinterpret_cast<const float4*>(aw + o);
            if (MODE == 1) {
                const float4 r = __ldg(reinterpret_cast<const float4*>(bw + o));
                q.x += r.x; q.y += r.y; q.z += r.z; q.w += r.w;
            }
            v[j][0] = q.x; v[j][1] = q.y; v[j][2] = q.z; v[j][3] = q.w;
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float t = 0.0f;
                if (o + c < lim) { t = aw[o + c]; if (MODE == 1) t += bw[o + c]; }
                v[j][c] = t;
            }
        }
    }
}

// Mark the loaded tile's candidates and rank them inside the warp.
template <int J, bool TIES>
__device__ __forceinline__ void tile_rank(
    const float (&v)[J][4], const int lim, const int lane,
    const u32 above_key, const u32 tie_key,
    typename SelMask<J>::T& ma, typename SelMask<J>::T& mt, u32 (&ea)[J / 4], u32 (&ta)[J / 4],
    u32 (&et)[J / 4], u32 (&tt)[J / 4], u32& wa, u32& wt)
{
    static_assert(J == 4 || J == 8 || J == 16, "4, 8 or 16 float4 per lane");
    typedef typename SelMask<J>::T mask_t;
    constexpr int NP = J / 4;
    ma = 0; mt = 0;                 // bit 4j+c: entry (j, c) above / tie
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int o = (j * 32 + lane) * 4;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 key = __float_as_uint(v[j][c]) & KEY_MASK;
            const bool ok = o + c < lim;
            if (ok && key >= above_key) ma |= (mask_t)1 << (4 * j + c);
            if (TIES && ok && key == tie_key) mt |= (mask_t)1 << (4 * j + c);
        }
    }
    wa = 0; wt = 0;                 // packed: lane-exclusive prefix, warp total
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        u32 pa = 0, pt = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            pa |= (u32)__popc((u32)((ma >> (4 * (4 * p + q))) & 0xfu)) << (8 * q);
            if (TIES) pt |= (u32)__popc((u32)((mt >> (4 * (4 * p + q))) & 0xfu)) << (8 * q);
        }
        const u32 sa = warp_incl_scan(pa, lane);
        ea[p] = sa - pa;
        ta[p] = __shfl_sync(FULL, sa, 31);
        wa += byte_sum(ta[p]);
        if (TIES) {
            const u32 st_ = warp_incl_scan(pt, lane);
            et[p] = st_ - pt;
            tt[p] = __shfl_sync(FULL, st_, 31);
            wt += byte_sum(tt[p]);
        } else {
            et[p] = 0; tt[p] = 0;
        }
    }
}

// The span of one warp in tile `tile`: its first index (64-bit only here: offsets
// inside the span are 32-bit, n < 2^31), its number of valid entries, and the
// input pointers at its start (b is read only by error feedback, MODE 1).
template <int J, int MODE>
struct WarpSpan {
    i64 base;
    int lim;
    float* a;
    const float* b;
    __device__ __forceinline__ WarpSpan(float* a0, const float* b0, const i64 n, const u32 tile,
                                        const int warp) {
        constexpr int WARP_ELEMS = 32 * 4 * J;
        base = (i64)tile * (SEL_WARPS * WARP_ELEMS) + (i64)warp * WARP_ELEMS;
        lim = (int)max((i64)0, min((i64)WARP_ELEMS, n - base));
        a = a0 + base;
        b = (MODE == 1) ? b0 + base : b0;
    }
};

// Load the tile, mark the candidates and rank them inside the warp.
template <int J, int MODE, bool TIES>
__device__ __forceinline__ void tile_load_rank(
    const float* aw, const float* bw, const int lim, const int lane,
    const u32 above_key, const u32 tie_key,
    float (&v)[J][4], typename SelMask<J>::T& ma, typename SelMask<J>::T& mt,
    u32 (&ea)[J / 4], u32 (&ta)[J / 4], u32 (&et)[J / 4], u32 (&tt)[J / 4], u32& wa, u32& wt)
{
    tile_load<J, MODE>(aw, bw, lim, lane, v);
    tile_rank<J, TIES>(v, lim, lane, above_key, tie_key, ma, mt, ea, ta, et, tt, wa, wt);
}

// Warp 0, tile > 0: sum the predecessors' published counts back to the
// nearest inclusive prefix (32 tiles per step).  Returns (above, ties) before
// this tile in every lane.
__device__ __forceinline__ void tile_lookback(const u64* status, const u32 tile, const int lane,
                                              u32& pa, u32& pt)
{
    pa = 0; pt = 0;
    i64 pred = (i64)tile - 1;
    while (true) {
        const i64 t = pred - lane;
        u64 s = ST_INC;                          // before tile 0: inclusive zero
        if (t >= 0) {
            s = st_read(&status[t]);
            while ((s >> ST_FLAG_SHIFT) == 0) { __nanosleep(32); s = st_read(&status[t]); }
        }
        const u32 inc = __ballot_sync(FULL, (s >> ST_FLAG_SHIFT) == 2);
        const int stop = inc ? (__ffs(inc) - 1) : 31;    // nearest inclusive
        u32 ca = (lane <= stop) ? (u32)((s >> 31) & CNT31) : 0u;
        u32 ct = (lane <= stop) ? (u32)(s & CNT31) : 0u;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ca += __shfl_xor_sync(FULL, ca, o);
            ct += __shfl_xor_sync(FULL, ct, o);
        }
        pa += ca; pt += ct;
        if (inc) break;
        pred -= 32;
    }
}

// Write this lane's selected entries at their global slots; ga / gt: above /
// ties before this warp's span.  Reloads the values unless KEEP.
template <int J, int MODE, bool TIES, bool GATHER, bool KEEP>
__device__ __forceinline__ void tile_write_direct(
    float* aw, const float* bw, const int* in_idx, const i64 wbase, const int lim,
    const int lane, const u32 ga, const u32 gt, const u32 need, const u32 cap,
    const float (&v)[J][4], const typename SelMask<J>::T ma, const typename SelMask<J>::T mt,
    const u32 (&ea)[J / 4],
    const u32 (&ta)[J / 4], const u32 (&et)[J / 4], const u32 (&tt)[J / 4],
    int* __restrict__ out_idx, float* __restrict__ out_val)
{
    const int ibase = (int)wbase;               // used only for valid entries (< n < 2^31)
    u32 ba = 0, bt = 0;                         // totals of this warp's earlier chunks
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int p = j >> 2, q = j & 3;
        const int o = (j * 32 + lane) * 4;
        const u32 mj = (u32)((ma >> (4 * j)) & 0xfu);
        const u32 tj = TIES ? (u32)((mt >> (4 * j)) & 0xfu) : 0u;
        if ((mj | tj) || MODE == 1) {
            float w[4];
            if (KEEP) {
                w[0] = v[j][0]; w[1] = v[j][1]; w[2] = v[j][2]; w[3] = v[j][3];
            } else if (o + 3 < lim) {   // reload (.cg: from L2, not merged with the first read)
                float4 q4 = __ldcg(reinterpret_cast<const float4*>(aw + o));
                if (MODE == 1) {
                    const float4 r = __ldcg(reinterpret_cast<const float4*>(bw + o));
                    q4.x += r.x; q4.y += r.y; q4.z += r.z; q4.w += r.w;
                }
                w[0] = q4.x; w[1] = q4.y; w[2] = q4.z; w[3] = q4.w;
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float t = 0.0f;
                    if (o + c < lim) { t = __ldcg(aw + o + c); if (MODE == 1) t += __ldcg(bw + o + c); }
                    w[c] = t;
                }
            }
            u32 ra = ga + ba + byte_of(ea[p], q);
            u32 rt = gt + bt + byte_of(et[p], q);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u32 pa_ = (mj >> c) & 1u, pt_ = (tj >> c) & 1u;
                const bool sel = pa_ || (pt_ && rt < need);
                const u32 pos = ra + min(rt, need);
                if (sel && pos < cap) {
                    out_idx[pos] = GATHER ? in_idx[wbase + o + c] : ibase + o + c;
                    out_val[pos] = w[c];
                    w[c] = 0.0f;
                    if (MODE == 2) aw[o + c] = 0.0f;
                }
                ra += pa_; rt += pt_;
            }
            if (MODE == 1) {
                if (o + 3 < lim) {
                    *reinterpret_cast<float4*>(aw + o) = make_float4(w[0], w[1], w[2], w[3]);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c) if (o + c < lim) aw[o + c] = w[c];
                }
            }
        }
        ba += byte_of(ta[p], q);
        bt += byte_of(tt[p], q);
    }
}


// Warp 0 of a tile: scan the warps' packed counts (s_w becomes each warp's exclusive
// prefix inside the tile), publish the tile's aggregate, walk the look-back, publish the
// inclusive prefix and leave the counts before the tile in s_pa (above) / s_pt (ties).
__device__ __forceinline__ void tile_prefix(u64* status, const u32 tile, const int lane,
                                            u32* s_w, u32& s_pa, u32& s_pt) {
    const u32 x = (lane < SEL_WARPS) ? s_w[lane] : 0u;
    const u32 incl = warp_incl_scan(x, lane);       // halves stay < 2^16
    const u32 agg = __shfl_sync(FULL, incl, SEL_WARPS - 1);
    const u32 agg_a = agg & 0xffffu, agg_t = agg >> 16;
    if (lane < SEL_WARPS) s_w[lane] = incl - x;     // each lane rewrites its own slot
    u32 pa = 0, pt = 0;
    if (tile == 0) {
        if (lane == 0) st_publish(&status[0], ST_INC | ((u64)agg_a << 31) | (u64)agg_t);
    } else {
        if (lane == 0) st_publish(&status[tile], ST_AGG | ((u64)agg_a << 31) | (u64)agg_t);
        tile_lookback(status, tile, lane, pa, pt);
        if (lane == 0)
            st_publish(&status[tile], ST_INC | ((u64)(pa + agg_a) << 31) | (u64)(pt + agg_t));
    }
    if (lane == 0) { s_pa = pa; s_pt = pt; }
}

template <int J, int MODE, bool TIES, bool GATHER, bool KEEP>
__device__ __forceinline__ void select_tile(
    float* a, const float* b, const int* in_idx, const i64 n,
    const u32 above_key, const u32 tie_key, const u32 need, const u32 cap,
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status)
{
    constexpr int NP = J / 4;
    __shared__ u32 s_w[SEL_WARPS];
    __shared__ u32 s_pa, s_pt;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const u32 tile = blockIdx.x;
    const WarpSpan<J, MODE> sp(a, b, n, tile, warp);
    const i64 wbase = sp.base;
    const int lim = sp.lim;
    float* aw = sp.a;
    const float* bw = sp.b;

    float v[J][4];
    typename SelMask<J>::T ma, mt;
    u32 wa, wt, ea[NP], ta[NP], et[NP], tt[NP];
    tile_load_rank<J, MODE, TIES>(aw, bw, lim, lane, above_key, tie_key, v, ma, mt,
                                  ea, ta, et, tt, wa, wt);
    if (lane == 0) s_w[warp] = wa | (wt << 16);      // each <= 32*4*J <= 2048 (J <= 16)
    __syncthreads();

    if (warp == 0) tile_prefix(status, tile, lane, s_w, s_pa, s_pt);
    __syncthreads();

    const u32 wx = s_w[warp];
    tile_write_direct<J, MODE, TIES, GATHER, KEEP>(
        aw, bw, in_idx, wbase, lim, lane, s_pa + (wx & 0xffffu), s_pt + (wx >> 16), need, cap,
        v, ma, mt, ea, ta, et, tt, out_idx, out_val);
}

template <int J, int MODE, bool TIES, bool GATHER>
__device__ __forceinline__ void select_tile_staged(
    float* a, const float* b, const int* in_idx, const i64 n,
    const u32 above_key, const u32 tie_key, const u32 need, const u32 cap,
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status)
{
    static_assert(MODE == 0 || MODE == 1, "staged: plain or error-feedback select");
    static_assert(!(MODE == 1 && TIES), "staged EF has no tie rule");
    constexpr int WARP_ELEMS = 32 * 4 * J;
    constexpr int NP = J / 4;
    constexpr u32 STAGE = WARP_ELEMS / 4;      // candidates a warp can stage
    constexpr u32 OFF_MASK = 0x3fffu;          // bits 0-13: offset in the warp's span,
    constexpr u32 TIE_BIT = 0x80000000u;       // 14-27: #ties before it there, 31: a tie
    static_assert(WARP_ELEMS <= 8192, "stage words hold 14-bit offsets and tie ranks");
    __shared__ u32 s_w[SEL_WARPS];
    __shared__ u32 s_pa, s_pt;
    __shared__ u32 s_meta[SEL_WARPS][STAGE];
    __shared__ float s_val[SEL_WARPS][STAGE];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const u32 tile = blockIdx.x;
    const WarpSpan<J, MODE> sp(a, b, n, tile, warp);
    const i64 wbase = sp.base;
    const int lim = sp.lim;
    float* aw = sp.a;
    const float* bw = sp.b;

    float v[J][4];
    typename SelMask<J>::T ma, mt;
    u32 wa, wt, ea[NP], ta[NP], et[NP], tt[NP];
    tile_load_rank<J, MODE, TIES>(aw, bw, lim, lane, above_key, tie_key, v, ma, mt,
                                  ea, ta, et, tt, wa, wt);
    const u32 cnt = wa + wt;
    const bool staged = cnt <= STAGE;          // warp-uniform; else the direct path
    if (staged) {                              // the values die here, before the look-back
        u32* sm = s_meta[warp];
        float* sv = s_val[warp];
        u32 ba = 0, bt = 0;
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int p = j >> 2, q = j & 3;
            const int o = (j * 32 + lane) * 4;
            const u32 mj = (u32)((ma >> (4 * j)) & 0xfu);
            const u32 tj = TIES ? (u32)((mt >> (4 * j)) & 0xfu) : 0u;
            if (mj | tj) {
                u32 ra = ba + byte_of(ea[p], q);           // ranks in the warp's span
                u32 rt = bt + byte_of(et[p], q);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const u32 pa_ = (mj >> c) & 1u, pt_ = (tj >> c) & 1u;
                    if (pa_ | pt_) {
                        sm[ra + rt] = (u32)(o + c) | (rt << 14) | (pa_ ? 0u : TIE_BIT);
                        sv[ra + rt] = v[j][c];
                    }
                    ra += pa_; rt += pt_;
                }
            }
            if (MODE == 1) {        // the residual goes back now, candidates zeroed
                float w[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) w[c] = ((mj >> c) & 1u) ? 0.0f : v[j][c];
                if (o + 3 < lim) {
                    *reinterpret_cast<float4*>(aw + o) = make_float4(w[0], w[1], w[2], w[3]);
                } else {
#pragma unroll
                    for (int c = 0; c < 4; ++c) if (o + c < lim) aw[o + c] = w[c];
                }
            }
            ba += byte_of(ta[p], q);
            bt += byte_of(tt[p], q);
        }
    }
    if (lane == 0) s_w[warp] = wa | (wt << 16);      // each <= 32*4*J <= 1024
    __syncthreads();

    if (warp == 0) tile_prefix(status, tile, lane, s_w, s_pa, s_pt);
    __syncthreads();

    const u32 wx = s_w[warp];
    const u32 ga = s_pa + (wx & 0xffffu);       // above before this warp's span
    const u32 gt = s_pt + (wx >> 16);           // ties before it
    if (!staged) {
        tile_write_direct<J, MODE, TIES, GATHER, false>(
            aw, bw, in_idx, wbase, lim, lane, ga, gt, need, cap,
            v, ma, mt, ea, ta, et, tt, out_idx, out_val);
        return;
    }
    // lanes copy consecutive ranks to consecutive slots
    for (u32 r = lane; r < cnt; r += 32) {
        const u32 m = s_meta[warp][r];
        const u32 off = m & OFF_MASK;
        const u32 tr = TIES ? ((m >> 14) & OFF_MASK) : 0u;
        if (TIES && (m & TIE_BIT) && gt + tr >= need) continue;   // past the first `need` ties
        const u32 pos = ga + (r - tr) + (TIES ? min(gt + tr, need) : 0u);
        const float val = s_val[warp][r];
        if (pos < cap) {
            out_idx[pos] = GATHER ? in_idx[wbase + off] : (int)wbase + (int)off;
            out_val[pos] = val;
        } else if (MODE == 1) {
            aw[off] = val;          // no room in the output: it stays in the residual
        }
    }
}

#define SEL_ARGS float* a, const float* b, const int* in_idx, const i64 n,          \
    const u32 above_key, const u32 tie_key, const u32 need, const u32* dparams,       \
    const u32 cap, int* __restrict__ out_idx, float* __restrict__ out_val, u64* status
#define SEL_PASS(AK, TK, ND) a, b, in_idx, n, AK, TK, ND, cap, out_idx, out_val, status
// MINB: resident blocks of 256 per SM asked of the register allocator (spill-free)
#define DEFINE_SELECT(NAME, J, MODE, KEEP, MINB)                                     \
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB) NAME(SEL_ARGS) {    \
    select_tile<J, MODE, false, false, KEEP>(SEL_PASS(above_key, tie_key, need));    \
}
#define DEFINE_TOPK(NAME, J, GATHER, MINB)                                           \
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB) NAME(SEL_ARGS) {    \
    select_tile<J, 0, true, GATHER, false>(SEL_PASS(dparams[0], dparams[1], dparams[2])); \
}
#define DEFINE_TOPK_KEEP(NAME, J, GATHER, MINB)                                      \
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB) NAME(SEL_ARGS) {    \
    select_tile<J, 0, true, GATHER, true>(SEL_PASS(dparams[0], dparams[1], dparams[2])); \
}
#define DEFINE_SELECT_STAGED(NAME, J, MODE, MINB)                                    \
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB) NAME(SEL_ARGS) {    \
    select_tile_staged<J, MODE, false, false>(SEL_PASS(above_key, tie_key, need));   \
}
#define DEFINE_TOPK_STAGED(NAME, J, GATHER, MINB)                                    \
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB) NAME(SEL_ARGS) {    \
    select_tile_staged<J, 0, true, GATHER>(SEL_PASS(dparams[0], dparams[1], dparams[2])); \
}
// ---- threshold select in two launches: tile-local compaction, then stitch -----
// sel_local: block t ranks tile t's selected entries as select_tile does, puts
//   them in shared memory in index order and, if they fit (at most lcap <=
//   LOCAL_STAGE), copies them to its own slot scratch[t * lcap ..] with
//   consecutive threads on consecutive slots; it stores the tile's count.  No
//   block waits on another, so the launch streams the input like a plain read
//   (and the stores are whole lines: scattered 4-byte stores of a few entries
//   per warp cost more than the entries' bytes suggest).
// sel_stitch: block g takes gsize (<= STITCH_GROUP) consecutive tiles: one warp
//   scan of their counts, one decoupled look-back per group (the groups' sums
//   are all known when the launch starts, so walks are short; a look-back per
//   tile made this launch latency-bound), then the block copies the group's
//   entries from scratch to consecutive output slots, several loads in flight
//   per thread.  A tile with more than lcap entries is selected again from the
//   input by the whole block, its offset now known.  sel_local zeroes the
//   status words this launch uses.
// Bytes: read 4n once; the selected entries are written twice and read once.
#define LOCAL_STAGE 1024
#define STITCH_GROUP 32
template <int J>
__device__ __forceinline__ void local_tile(
    const float* a, const i64 n, const u32 above_key, const u32 lcap,
    u32* __restrict__ counts, int* __restrict__ scr_idx, float* __restrict__ scr_val,
    u64* __restrict__ status, const u32 nstatus)
{
    if (threadIdx.x == 0 && blockIdx.x < nstatus) status[blockIdx.x] = 0ull;  // for sel_stitch
    constexpr int NP = J / 4;
    __shared__ u32 s_w[SEL_WARPS];
    __shared__ int s_idx[LOCAL_STAGE];
    __shared__ float s_val[LOCAL_STAGE];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const u32 tile = blockIdx.x;
    const WarpSpan<J, 0> sp(const_cast<float*>(a), nullptr, n, tile, warp);
    float v[J][4];
    typename SelMask<J>::T ma, mt;
    u32 wa, wt, ea[NP], ta[NP], et[NP], tt[NP];
    tile_load_rank<J, 0, false>(sp.a, sp.b, sp.lim, lane, above_key, 0xffffffffu, v, ma, mt,
                                ea, ta, et, tt, wa, wt);
    if (lane == 0) s_w[warp] = wa;
    __syncthreads();
    u32 before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < SEL_WARPS; ++w) {
        const u32 c = s_w[w];
        before += (w < warp) ? c : 0u;
        total += c;
    }
    if (threadIdx.x == 0) counts[tile] = total;
    if (total > lcap) return;                       // uniform: re-selected by sel_stitch
    tile_write_direct<J, 0, false, false, true>(    // values kept: nothing re-loaded
        sp.a, sp.b, nullptr, sp.base, sp.lim, lane, before, 0u, 0u, lcap,
        v, ma, mt, ea, ta, et, tt, s_idx, s_val);
    __syncthreads();
    const i64 dst = (i64)tile * lcap;
    for (u32 i = threadIdx.x; i < total; i += SEL_THREADS) {
        scr_idx[dst + i] = s_idx[i];
        scr_val[dst + i] = s_val[i];
    }
}

template <int J, bool KEEP>
__device__ __forceinline__ void stitch_group(
    const float* a, const i64 n, const u32 above_key, const u32 lcap, const u32 cap,
    const u32 ntiles, const u32 gsize, const u32* __restrict__ counts,
    const int* __restrict__ scr_idx, const float* __restrict__ scr_val,
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status)
{
    constexpr int NP = J / 4;
    __shared__ u32 s_cnt[STITCH_GROUP];
    __shared__ u32 s_rel[STITCH_GROUP];             // first entry of each tile in the group
    __shared__ u32 s_v[SEL_WARPS];
    __shared__ u32 s_gp, s_tot;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const u32 group = blockIdx.x;
    const u32 t0 = group * gsize;
    const u32 tend = min(ntiles, t0 + gsize);
    if (warp == 0) {
        const u32 c = (t0 + lane < tend) ? counts[t0 + lane] : 0u;
        const u32 incl = warp_incl_scan(c, lane);      // <= 32 * 8192 = 2^18
        const u32 agg = __shfl_sync(FULL, incl, 31);
        u32 pa = 0, pt = 0;
        if (group == 0) {
            if (lane == 0) st_publish(&status[0], ST_INC | ((u64)agg << 31));
        } else {
            if (lane == 0) st_publish(&status[group], ST_AGG | ((u64)agg << 31));
            tile_lookback(status, group, lane, pa, pt);
            if (lane == 0) st_publish(&status[group], ST_INC | ((u64)(pa + agg) << 31));
        }
        s_cnt[lane] = c;
        s_rel[lane] = incl - c;
        if (lane == 0) { s_gp = pa; s_tot = agg; }
    }
    __syncthreads();
    // The group's entries e = 0 .. total-1 go to out[gp + e] (tile g holds
    // e in [s_rel[g], s_rel[g] + s_cnt[g])): consecutive threads write
    // consecutive slots; each thread loads 4 entries before storing them.
    const u32 gp = s_gp, total = s_tot;
    for (u32 e0 = threadIdx.x; e0 < total; e0 += 4 * SEL_THREADS) {
        int vi[4];
        float vv[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const u32 e = e0 + u * SEL_THREADS;
            ok[u] = false;
            vi[u] = 0;
            vv[u] = 0.0f;
            if (e < total) {
                u32 g = 0;                          // the last tile starting at or before e
#pragma unroll
                for (u32 step = 16; step > 0; step >>= 1)
                    if (g + step < gsize && s_rel[g + step] <= e) g += step;
                if (s_cnt[g] <= lcap && gp + e < cap) {
                    const i64 src = (i64)(t0 + g) * lcap + (e - s_rel[g]);
                    vi[u] = scr_idx[src];
                    vv[u] = scr_val[src];
                    ok[u] = true;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (ok[u]) { out_idx[gp + e0 + u * SEL_THREADS] = vi[u];
                         out_val[gp + e0 + u * SEL_THREADS] = vv[u]; }
    }
    for (u32 g = 0; t0 + g < tend; ++g) {           // tiles over lcap (uniform branches)
        if (s_cnt[g] <= lcap) continue;
        const WarpSpan<J, 0> sp(const_cast<float*>(a), nullptr, n, t0 + g, warp);
        float v[J][4];
        typename SelMask<J>::T ma, mt;
        u32 wa, wt, ea[NP], ta[NP], et[NP], tt[NP];
        tile_load_rank<J, 0, false>(sp.a, sp.b, sp.lim, lane, above_key, 0xffffffffu, v, ma,
                                    mt, ea, ta, et, tt, wa, wt);
        __syncthreads();                            // s_v of the previous tile is read
        if (lane == 0) s_v[warp] = wa;
        __syncthreads();
        u32 before = 0;
#pragma unroll
        for (int w = 0; w < SEL_WARPS; ++w) before += (w < warp) ? s_v[w] : 0u;
        tile_write_direct<J, 0, false, false, KEEP>(
            sp.a, sp.b, nullptr, sp.base, sp.lim, lane, gp + s_rel[g] + before, 0u, 0u, cap,
            v, ma, mt, ea, ta, et, tt, out_idx, out_val);
    }
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_THRV8)
sel_local8(const float* a, const i64 n, const u32 above_key, const u32 lcap,
           u32* __restrict__ counts, int* __restrict__ scr_idx, float* __restrict__ scr_val,
           u64* __restrict__ status, const u32 nstatus) {
    local_tile<8>(a, n, above_key, lcap, counts, scr_idx, scr_val, status, nstatus);
}
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_THR8)
sel_stitch8(const float* a, const i64 n, const u32 above_key, const u32 lcap, const u32 cap,
            const u32 ntiles, const u32 gsize, const u32* __restrict__ counts,
            const int* __restrict__ scr_idx, const float* __restrict__ scr_val,
            int* __restrict__ out_idx, float* __restrict__ out_val, u64* status) {
    stitch_group<8, false>(a, n, above_key, lcap, cap, ntiles, gsize, counts, scr_idx,
                           scr_val, out_idx, out_val, status);
}

DEFINE_SELECT(sel_thr4, 4, 0, false, MINB_THR4)
DEFINE_SELECT(sel_thr8, 8, 0, false, MINB_THR8)
DEFINE_SELECT(sel_thr16, 16, 0, false, MINB_THR16)
DEFINE_SELECT(sel_ef4, 4, 1, true, MINB_EF4)
DEFINE_SELECT(sel_ef8, 8, 1, true, MINB_EF8)
DEFINE_SELECT(sel_efr4, 4, 1, false, MINB_EFR4)
DEFINE_SELECT(sel_efr8, 8, 1, false, MINB_EFR8)
DEFINE_SELECT(sel_efc4, 4, 2, false, MINB_THR4)
DEFINE_TOPK(sel_topk4, 4, true, MINB_TOPK4)
DEFINE_TOPK(sel_topk8, 8, true, MINB_TOPK8)
DEFINE_TOPK(sel_topkx4, 4, false, MINB_TOPK4)
DEFINE_TOPK(sel_topkx8, 8, false, MINB_TOPK8)
DEFINE_TOPK(sel_topk16, 16, true, MINB_TOPK16)
DEFINE_TOPK(sel_topkx16, 16, false, MINB_TOPK16)
DEFINE_SELECT_STAGED(sel_thrs4, 4, 0, MINB_THR4)
DEFINE_SELECT_STAGED(sel_thrs8, 8, 0, MINB_THR8)
DEFINE_SELECT_STAGED(sel_efs4, 4, 1, MINB_EFR4)
DEFINE_SELECT_STAGED(sel_efs8, 8, 1, MINB_EFR8)
DEFINE_TOPK_STAGED(sel_topks4, 4, true, MINB_TOPK4)
DEFINE_TOPK_STAGED(sel_topks8, 8, true, MINB_TOPK8)
DEFINE_TOPK_STAGED(sel_topkxs4, 4, false, MINB_TOPK4)
DEFINE_TOPK_STAGED(sel_topkxs8, 8, false, MINB_TOPK8)
DEFINE_SELECT(sel_thrv8, 8, 0, true, MINB_THRV8)
DEFINE_TOPK_KEEP(sel_topkv8, 8, true, MINB_TOPKV8)
DEFINE_TOPK_KEEP(sel_topkxv8, 8, false, MINB_TOPKV8)

// ---- radix select ------------------------------------------------------------
#define S_PREFIX 0
#define S_KREM 1
#define S_BINCNT 2
#define S_P_ABOVE 4
#define S_P_TIE 5
#define S_P_NEED 6
#define S_ERR 7

// Histogram of the digit (key >> shift) & (2^nbits - 1) over the keys whose bits
// above shift + nbits equal the prefix found so far.  `copies` (1 or 4) private
// histograms per block, picked by lane & (copies - 1), cut the serialisation of
// lanes that hit the same bin in one instruction.
extern "C" __global__ void __launch_bounds__(512)
tk_hist(const u32* __restrict__ src, const i64 m, const u32* __restrict__ st,
        u32* __restrict__ hist, const int shift, const int nbits, const int copies)
{
    extern __shared__ u32 sh[];
    const int nb = 1 << nbits;
    for (int i = threadIdx.x; i < (copies << nbits); i += blockDim.x) sh[i] = 0u;
    __syncthreads();
    const int hs = shift + nbits;                 // <= 31
    const u32 want = st[S_PREFIX] >> hs;
    const u32 bmask = (u32)nb - 1u;
    u32* myh = sh + ((threadIdx.x & (copies - 1)) << nbits);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    const i64 m4 = m >> 2;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x; q < m4; q += 2 * stride) {
        const uint4 u0 = __ldg(s4 + q);
        const bool ok1 = q + stride < m4;
        uint4 u1 = make_uint4(0u, 0u, 0u, 0u);
        if (ok1) u1 = __ldg(s4 + q + stride);
        const u32 k0[4] = {u0.x & KEY_MASK, u0.y & KEY_MASK, u0.z & KEY_MASK, u0.w & KEY_MASK};
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if ((k0[c] >> hs) == want) atomicAdd(&myh[(k0[c] >> shift) & bmask], 1u);
        if (ok1) {
            const u32 k1[4] = {u1.x & KEY_MASK, u1.y & KEY_MASK, u1.z & KEY_MASK, u1.w & KEY_MASK};
#pragma unroll
            for (int c = 0; c < 4; ++c)
                if ((k1[c] >> hs) == want) atomicAdd(&myh[(k1[c] >> shift) & bmask], 1u);
        }
    }
    if (blockIdx.x == 0 && (i64)threadIdx.x < (m & 3)) {     // the last m % 4 keys
        const u32 kk = src[m4 * 4 + threadIdx.x] & KEY_MASK;
        if ((kk >> hs) == want) atomicAdd(&myh[(kk >> shift) & bmask], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        u32 c = 0;
        for (int r = 0; r < copies; ++r) c += sh[(r << nbits) + i];
        if (c) atomicAdd(&hist[i], c);
    }
}

// One warp: find the bin holding the k-th largest key, scanning from the top,
// and update the device-side state.  Pass 1 takes k from k_init; pass 3 writes
// the select parameters (above_key, tie_key, need) for sel_topk*.
extern "C" __global__ void __launch_bounds__(32)
tk_find(const u32* __restrict__ hist, const int nbits, const int shift,
        u32* st, const u32 k_init, const int pass)
{
    const int lane = threadIdx.x;
    const u32 k = (pass == 1) ? k_init : st[S_KREM];
    u32 krem, h;
    const int bin = warp_kth_bin(hist, 1 << nbits, k, lane, &krem, &h);
    if (bin == -2 && lane == 0) st[S_ERR] = 1u;    // fewer than k keys: a bug
    if (bin < 0) return;
    const u32 prefix = st[S_PREFIX] | ((u32)bin << shift);
    st[S_PREFIX] = prefix;
    st[S_KREM] = krem;
    st[S_BINCNT] = h;
    if (pass == 3) {
        st[S_P_ABOVE] = prefix + 1u;               // strictly above the k-th key
        st[S_P_TIE] = prefix;                      // ties at the k-th key
        st[S_P_NEED] = krem;                       // how many ties to take
    }
}

// ---- exact top-k of a small array, one block ---------------------------------
// One launch and no host read: the radix select of the k-th largest 31-bit key
// (four 8-bit digits, shared-memory histograms over the whole array each pass),
// then an ordered write of every key above it and the first `need` keys equal to
// it.  Each thread owns a contiguous run of positions for the write, so two
// block scans (ties before the run, entries kept before the run) place every
// entry; output positions ascend.  out_idx[j] = idx[p] (idx may be null: p).
#define TKS_THREADS 1024

__device__ __forceinline__ u32 tks_block_excl_scan(const u32 v, u32* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 incl = warp_incl_scan(v, lane);
    if (lane == 31) sh[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const u32 w = (lane < (int)(blockDim.x >> 5)) ? sh[lane] : 0u;
        sh[lane] = warp_incl_scan(w, lane);
    }
    __syncthreads();
    const u32 out = incl - v + (warp ? sh[warp - 1] : 0u);
    __syncthreads();                               // sh is reused by the next scan
    return out;
}

extern "C" __global__ void __launch_bounds__(TKS_THREADS)
tk_small(const float* __restrict__ val, const int* __restrict__ idx, const int m,
         const int k, int* __restrict__ out_idx, float* __restrict__ out_val)
{
    __shared__ u32 hist[256];
    __shared__ u32 sh[32];
    __shared__ u32 s_prefix, s_krem;
    const int tid = threadIdx.x;
    const u32* key = reinterpret_cast<const u32*>(val);
    if (tid == 0) { s_prefix = 0u; s_krem = (u32)k; }
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = 24 - 8 * pass;
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
        __syncthreads();
        const u32 prefix = s_prefix;
        for (int i = tid; i < m; i += blockDim.x) {
            const u32 kk = __ldg(key + i) & KEY_MASK;
            if (pass == 0 || (kk >> (shift + 8)) == (prefix >> (shift + 8)))
                atomicAdd(&hist[(kk >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) {                            // one warp: the bin of the k-th key
            u32 krem, h;
            const int bin = warp_kth_bin(hist, 256, s_krem, tid, &krem, &h);
            if (bin >= 0) {
                s_prefix = prefix | ((u32)bin << shift);
                s_krem = krem;
            }
        }
        __syncthreads();
    }
    const u32 T = s_prefix, need = s_krem;         // the k-th key; ties to take
    const int per = (m + (int)blockDim.x - 1) / (int)blockDim.x;
    const int lo = min(m, tid * per), hi = min(m, lo + per);
    u32 above = 0u, ties = 0u;
    for (int i = lo; i < hi; ++i) {
        const u32 kk = __ldg(key + i) & KEY_MASK;
        above += kk > T;
        ties += kk == T;
    }
    const u32 tie0 = tks_block_excl_scan(ties, sh);
    const u32 take = need > tie0 ? min(ties, need - tie0) : 0u;
    u32 pos = tks_block_excl_scan(above + take, sh);
    u32 t = tie0;
    for (int i = lo; i < hi; ++i) {
        const u32 kk = __ldg(key + i) & KEY_MASK;
        const bool keep = kk > T || (kk == T && t++ < need);
        if (keep) {
            out_idx[pos] = idx ? idx[i] : i;
            out_val[pos] = val[i];
            ++pos;
        }
    }
}

// ---- Gaussiank: moments and counts at several thresholds ---------------------
#define GS_THREADS 256

__device__ __forceinline__ double gs_term(const float v, const double m, const bool centred) {
    if (!centred) return (double)v;
    const double d = (double)v - m;
    return d * d;
}

__device__ __forceinline__ double gs_term4(const float4 q, const double m, const bool centred) {
    return (gs_term(q.x, m, centred) + gs_term(q.y, m, centred))
         + (gs_term(q.z, m, centred) + gs_term(q.w, m, centred));
}

// part[block] = sum of x (mu == null) or of (x - *mu)^2 over the block's share
// of the float4 chunks (grid stride, two loads in flight), in float64.
extern "C" __global__ void __launch_bounds__(GS_THREADS)
gs_partial(const float* __restrict__ x, const i64 n, const double* __restrict__ mu,
           double* __restrict__ part)
{
    __shared__ double s_part[GS_THREADS / 32];
    const bool centred = mu != nullptr;
    const double m = centred ? *mu : 0.0;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const i64 n4 = n >> 2;
    const i64 stride = (i64)gridDim.x * GS_THREADS;
    double s = 0.0;
    for (i64 q = (i64)blockIdx.x * GS_THREADS + threadIdx.x; q < n4; q += 2 * stride) {
        const float4 u0 = __ldg(x4 + q);
        const bool ok1 = q + stride < n4;
        float4 u1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok1) u1 = __ldg(x4 + q + stride);
        s += gs_term4(u0, m, centred);
        if (ok1) s += gs_term4(u1, m, centred);
    }
    if (blockIdx.x == 0 && (i64)threadIdx.x < (n & 3))      // the last n % 4 entries
        s += gs_term(x[n4 * 4 + threadIdx.x], m, centred);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if ((threadIdx.x & 31) == 0) s_part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < GS_THREADS / 32; ++w) t += s_part[w];
        part[blockIdx.x] = t;
    }
}

// One warp: *out = sum(part[0..np)) / n, always in the same order.
extern "C" __global__ void __launch_bounds__(32)
gs_finish(const double* __restrict__ part, const int np, const i64 n, double* __restrict__ out)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < np; i += 32) s += part[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (threadIdx.x == 0) *out = s / (double)n;
}

// counts[j] += #{i : key(x_i) >= keys[j]} for j < K (unused keys: 0xffffffff,
// which no key reaches).  Integer atomics: the totals are exact.
template <int K>
__device__ __forceinline__ void gs_count(const u32* __restrict__ x, const i64 n,
                                         const u32* __restrict__ keys, u32* __restrict__ counts)
{
    __shared__ u32 s_c[GS_THREADS / 32][K];
    u32 k[K], c[K];
#pragma unroll
    for (int j = 0; j < K; ++j) { k[j] = keys[j]; c[j] = 0u; }
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    const i64 n4 = n >> 2;
    const i64 stride = (i64)gridDim.x * GS_THREADS;
    for (i64 q = (i64)blockIdx.x * GS_THREADS + threadIdx.x; q < n4; q += 2 * stride) {
        const uint4 u0 = __ldg(x4 + q);
        const bool ok1 = q + stride < n4;
        uint4 u1 = make_uint4(0u, 0u, 0u, 0u);
        if (ok1) u1 = __ldg(x4 + q + stride);
        const u32 e[8] = {u0.x & KEY_MASK, u0.y & KEY_MASK, u0.z & KEY_MASK, u0.w & KEY_MASK,
                          u1.x & KEY_MASK, u1.y & KEY_MASK, u1.z & KEY_MASK, u1.w & KEY_MASK};
#pragma unroll
        for (int j = 0; j < K; ++j) {
            u32 t = (e[0] >= k[j]) + (e[1] >= k[j]) + (e[2] >= k[j]) + (e[3] >= k[j]);
            if (ok1) t += (e[4] >= k[j]) + (e[5] >= k[j]) + (e[6] >= k[j]) + (e[7] >= k[j]);
            c[j] += t;
        }
    }
    if (blockIdx.x == 0 && (i64)threadIdx.x < (n & 3)) {   // the last n % 4 entries
        const u32 e = x[n4 * 4 + threadIdx.x] & KEY_MASK;
#pragma unroll
        for (int j = 0; j < K; ++j) c[j] += (e >= k[j]);
    }
#pragma unroll
    for (int j = 0; j < K; ++j) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c[j] += __shfl_xor_sync(FULL, c[j], o);
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < K; ++j) s_c[threadIdx.x >> 5][j] = c[j];
    }
    __syncthreads();
    if (threadIdx.x < K) {
        u32 t = 0;
        for (int w = 0; w < GS_THREADS / 32; ++w) t += s_c[w][threadIdx.x];
        if (t) atomicAdd(&counts[threadIdx.x], t);
    }
}
#define DEFINE_GS_COUNT(NAME, K)                                                      \
extern "C" __global__ void __launch_bounds__(GS_THREADS)                             \
NAME(const u32* x, const i64 n, const u32* keys, u32* counts) { gs_count<K>(x, n, keys, counts); }
DEFINE_GS_COUNT(gs_count1, 1)
DEFINE_GS_COUNT(gs_count4, 4)
DEFINE_GS_COUNT(gs_count16, 16)

// ---- segmented sums in NumPy's order ---------------------------------------
template <typename T>
__device__ T np_pairwise_block(const T* a, const i64 n)
{
    if (n < 8) {
        T r = (T)-0.0;
        for (i64 i = 0; i < n; ++i) r += a[i];
        return r;
    }
    T r0 = a[0], r1 = a[1], r2 = a[2], r3 = a[3];
    T r4 = a[4], r5 = a[5], r6 = a[6], r7 = a[7];
    i64 i;
    for (i = 8; i < n - (n % 8); i += 8) {
        r0 += a[i + 0]; r1 += a[i + 1]; r2 += a[i + 2]; r3 += a[i + 3];
        r4 += a[i + 4]; r5 += a[i + 5]; r6 += a[i + 6]; r7 += a[i + 7];
    }
    T res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7));
    for (; i < n; ++i) res += a[i];
    return res;
}

template <typename T>
__device__ T np_pairwise(const T* a, const i64 n)
{
    if (n <= 128) return np_pairwise_block<T>(a, n);
    i64 n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise<T>(a, n2) + np_pairwise<T>(a + n2, n - n2);
}

template <typename T>
__device__ void seg_sum(const T* __restrict__ v, const i64* __restrict__ starts,
                        const i64 nseg, const i64 m, T* __restrict__ out)
{
    for (i64 s = (i64)blockIdx.x * blockDim.x + threadIdx.x; s < nseg;
         s += (i64)gridDim.x * blockDim.x) {
        const i64 b = starts[s];
        const i64 e = (s + 1 < nseg) ? starts[s + 1] : m;
        T r = v[b];
        if (e - b > 1) r = r + np_pairwise<T>(v + b + 1, e - b - 1);
        out[s] = r;
    }
}
extern "C" __global__ void seg_sum_f32(const float* v, const i64* starts, const i64 nseg,
                                       const i64 m, float* out) { seg_sum<float>(v, starts, nseg, m, out); }
extern "C" __global__ void seg_sum_f64(const double* v, const i64* starts, const i64 nseg,
                                       const i64 m, double* out) { seg_sum<double>(v, starts, nseg, m, out); }

// ---- deterministic scatter-add over index-sorted input -----------------------
#define DEFINE_SCATTER(NAME, T)                                                   \
extern "C" __global__ void                                                        \
NAME(float* dense, const i64 nd, const T* __restrict__ idx,                        \
     const float* __restrict__ val, const i64 m)                                  \
{                                                                                 \
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < m;               \
         j += (i64)gridDim.x * blockDim.x) {                                      \
        const T i = idx[j];                                                       \
        if (j > 0 && idx[j - 1] == i) continue;      /* not the head of its run */ \
        if (i < 0 || (i64)i >= nd) continue;                                      \
        float acc = dense[i];                                                     \
        for (i64 t = j; t < m && idx[t] == i; ++t) acc += val[t];                 \
        dense[i] = acc;                                                           \
    }                                                                             \
}
DEFINE_SCATTER(seg_scatter_add_i32, int)
DEFINE_SCATTER(seg_scatter_add_i64, long long)
"""

#: select-kernel variants: tile shape (4, 8 or 16 float4 per lane), "s" = staged
#: writes, "v" = values kept in registers through the look-back (no re-load)
VARIANTS = ("4", "8", "s4", "s8", "16", "v8")
_NAMES = ("sel_ef4", "sel_ef8", "sel_efr4", "sel_efr8", "sel_efs4", "sel_efs8", "sel_efc4",
          *(f"{kind}{v}" for kind in ("sel_thr", "sel_topk", "sel_topkx") for v in VARIANTS),
          "tk_hist", "tk_find", "tk_small", "gs_partial", "gs_finish", "gs_count1", "gs_count4",
          "gs_count16", "seg_sum_f32", "seg_sum_f64",
          "seg_scatter_add_i32", "seg_scatter_add_i64",
          "sel_local8", "sel_stitch8")

# --------------------------------------------------------------------------
# Compile once per process and device
# --------------------------------------------------------------------------

_MODULES: dict[int, dict[str, object]] = {}
_SM_COUNT: dict[int, int] = {}

#: Fill fresh outputs with a poison value before the kernels write them
#: (tests set this: an entry a kernel forgot to write then shows).
POISON = False
#: The plain and top-k select kernels' variant (one of VARIANTS): "4" / "8" /
#: "16" float4 chunks per lane (tiles of 4096 / 8192 / 16384 entries) writing
#: each entry directly after the look-back (re-loaded from L2); "v8" the same
#: holding the values in registers instead; "s4" / "s8" the selected entries
#: staged in shared memory before the look-back and copied out in order after
#: it.  "8" measured fastest (docs/BENCHMARKS.md).  Env: AUTOTUNE_SELECT_VARIANT.
SELECT_VARIANT = os.environ.get("AUTOTUNE_SELECT_VARIANT", "8")
#: The error-feedback kernel: sel_ef{4,8} keep the tile in registers between
#: the count and the write phase, sel_efr{4,8} reload it from L2 (fewer
#: registers, more resident blocks), sel_efs{4,8} write the residual back and
#: stage the selected entries before the look-back (measured fastest, by
#: 0.2-2% over sel_efr4 on an H200: docs/BENCHMARKS.md).  Env: AUTOTUNE_EF_KERNEL.
EF_KERNEL = os.environ.get("AUTOTUNE_EF_KERNEL", "sel_efs4")

SEL_THREADS = 256
HIST_THREADS = 512
_NOKEY = 0xFFFFFFFF      # a key no float32 magnitude has (keys are < 2**31)
_NULL = np.uint64(0)     # a null pointer argument


def _funcs():
    dev = cp.cuda.runtime.getDevice()
    fns = _MODULES.get(dev)
    if fns is None:
        mod = cp.RawModule(code=_SOURCE, options=("--std=c++14",))
        fns = {name: mod.get_function(name) for name in _NAMES}
        _MODULES[dev] = fns
        _SM_COUNT[dev] = cp.cuda.Device(dev).attributes["MultiProcessorCount"]
    return fns


def _sm_count():
    _funcs()
    return _SM_COUNT[cp.cuda.runtime.getDevice()]


def warm_up():
    """Compile (or load from cupy's disk cache) every kernel on the current device."""
    _funcs()


def _on_input_device(fn):
    """Run ``fn`` with its first argument's device current (launches go there)."""
    @functools.wraps(fn)
    def wrapper(a, *args, **kw):
        with a.device:
            return fn(a, *args, **kw)
    return wrapper


def _empty(n, dtype):
    if POISON:
        if np.dtype(dtype).kind == "f":
            return cp.full(n, np.nan, dtype=dtype)
        return cp.full(n, -7, dtype=dtype)
    return cp.empty(n, dtype=dtype)


# --------------------------------------------------------------------------
# Eligibility and threshold keys
# --------------------------------------------------------------------------

def aligned(a) -> bool:
    return a.data.ptr % 16 == 0


@_on_input_device
def prepare(x):
    """A flat float32 array the kernels can read, copying only when needed."""
    x = x.reshape(-1) if x.flags.c_contiguous else cp.ascontiguousarray(x).reshape(-1)
    if not aligned(x):
        x = x.copy()
    return x


def threshold_key(threshold) -> int:
    """The 31-bit key k with ``|x| >= threshold  <=>  key(x) >= k`` for float32 x.

    Matches NumPy's comparison of a float32 array with the threshold: a
    Python float / int (weak scalar, NEP 50) is rounded to float32 first; a
    float64 NumPy scalar or 0-d array compares in float64, which for float32
    x is the same as comparing with the smallest float32 >= threshold.
    NaN selects nothing; a threshold <= 0 selects everything.
    """
    strong64 = (isinstance(threshold, (np.floating, np.ndarray, cp.ndarray))
                and np.dtype(threshold.dtype).itemsize > 4)
    t = float(threshold)
    if math.isnan(t):
        return _NOKEY
    if abs(t) < 3e38:
        f = np.float32(t)
    else:
        with np.errstate(over="ignore"):  # rounds to +-inf (or to +-max) as numpy does
            f = np.float32(t)
    if strong64 and float(f) < t:
        f = np.nextafter(f, np.float32(np.inf))
    if f <= 0:
        return 0
    return int(f.view(np.uint32))


def key_to_float(key: int) -> float:
    return float(np.array(key, dtype=np.uint32).view(np.float32))


# --------------------------------------------------------------------------
# The select launch: cached per-stream workspace, pinned count read-back
# --------------------------------------------------------------------------

class _Workspace:
    """Device scratch zeroed per launch with one memset, and a pinned host
    buffer for read-backs, cached per (device, stream, purpose)."""

    __slots__ = ("buf", "words", "host")

    def __init__(self, words):
        self.words = words
        self.buf = cp.empty(words, dtype=cp.uint64)
        self.host = np.frombuffer(cp.cuda.alloc_pinned_memory(64), dtype=np.uint64, count=8)


_WS: dict[tuple[int, int, str], _Workspace] = {}


def _workspace(words: int, stream, purpose: str) -> _Workspace:
    key = (cp.cuda.runtime.getDevice(), stream.ptr, purpose)
    ws = _WS.get(key)
    if ws is None or ws.words < words:
        ws = _WS[key] = _Workspace(max(words, 2 * (ws.words if ws else 0), 1024))
    return ws


def _read_back(ws: _Workspace, dev_ptr: int, nbytes: int, stream):
    """Copy nbytes (<= 64) from the device to ws.host and wait for them."""
    cp.cuda.runtime.memcpyAsync(ws.host.ctypes.data, dev_ptr, nbytes,
                                cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return ws.host


def _select(name, a, b, in_idx, n, above_key, tie_key, need, dparams, cap,
            out_idx, out_val, *, read_total=True):
    """One launch of a sel_* kernel over n entries of ``a``.

    Returns (#above, #ties) over all n entries when ``read_total`` (this
    synchronises the stream), else None.  ``dparams``: a device pointer (int)
    to (above_key, tie_key, need) for the sel_topk* kernels, or None.
    """
    fns = _funcs()
    tile = _sel_tile(name)
    ntiles = (n + tile - 1) // tile
    stream = cp.cuda.get_current_stream()
    ws = _workspace(ntiles, stream, "select")
    base = ws.buf.data.ptr
    cp.cuda.runtime.memsetAsync(base, 0, ntiles * 8, stream.ptr)
    fns[name](
        (ntiles,), (SEL_THREADS,),
        (a, _NULL if b is None else b, _NULL if in_idx is None else in_idx,
         np.int64(n), np.uint32(above_key), np.uint32(tie_key), np.uint32(need),
         _NULL if dparams is None else np.uint64(dparams), np.uint32(cap), out_idx, out_val,
         np.uint64(base)))
    if not read_total:
        return None
    s = int(_read_back(ws, base + (ntiles - 1) * 8, 8, stream)[0])
    if s >> 62 != 2:
        raise RuntimeError("select kernel left its last tile unfinished (kernel bug)")
    return (s >> 31) & 0x7FFFFFFF, s & 0x7FFFFFFF


#: Threshold selection (no ties, no error feedback) for n >= LOCAL_MIN_N:
#: "local" = sel_local8 (tile-local compaction into scratch, no block waits)
#: then sel_stitch8 (offsets by one look-back per group of tiles, copy out);
#: "lookback" = one sel_thr* launch (single pass, a look-back per tile), which
#: smaller inputs always take (one launch instead of two).  "local" measured
#: faster from n = 2^24 on H100 and H200 (docs/BENCHMARKS.md).
#: Env: AUTOTUNE_THRESHOLD_PATH.
THRESHOLD_PATH = os.environ.get("AUTOTUNE_THRESHOLD_PATH", "local")
THRESHOLD_PATHS = ("lookback", "local")
LOCAL_MIN_N = 1 << 24
#: ... and when the expected count (the previous call's, else the output
#: capacity) is at most this share of n: the scratch would not pay beyond it
LOCAL_MAX_SHARE = 1 / 16
LOCAL_TILE = SEL_THREADS * 4 * 8
LOCAL_STAGE = 1024       # the most scratch entries per tile (shared-memory stage)
STITCH_GROUP = 32        # the most tiles per sel_stitch block


def stitch_group(ntiles: int) -> int:
    """Tiles per sel_stitch block: the fewest (a power of two, at most 32)
    that fit the launch in one wave of four blocks per SM."""
    g = 1
    while g < STITCH_GROUP and -(-ntiles // g) > 4 * _sm_count():
        g *= 2
    return g


def local_cap(ntiles: int, expected: int) -> int:
    """Scratch entries per tile for sel_local: twice the expected count per
    tile plus 64, a multiple of 32, at most LOCAL_STAGE; tiles over it are
    selected again from the input by sel_stitch."""
    per = -(-2 * int(expected) // max(1, ntiles)) + 64
    return min(LOCAL_STAGE, -(-per // 32) * 32)


def _select_local(a, n, above_key, cap, out_idx, out_val, lcap, scratch=None, *,
                  read_total=True, stitch_only=False):
    """sel_local8 then sel_stitch8 over n entries of ``a``.

    ``scratch``: (counts uint32[ntiles], idx int32[ntiles * lcap],
    val float32[ntiles * lcap]) or None (taken from cupy's pool).  With
    ``stitch_only`` the local pass is skipped (its scratch is reused: a
    second stitch into a larger output).  Returns (scratch, #selected) when
    ``read_total`` (this synchronises the stream), else (scratch, None).
    """
    fns = _funcs()
    ntiles = (n + LOCAL_TILE - 1) // LOCAL_TILE
    stream = cp.cuda.get_current_stream()
    if scratch is None:
        scratch = (cp.empty(ntiles, cp.uint32), cp.empty(ntiles * lcap, cp.int32),
                   cp.empty(ntiles * lcap, cp.float32))
    counts, s_idx, s_val = scratch
    gsize = stitch_group(ntiles)
    ngroups = (ntiles + gsize - 1) // gsize
    ws = _workspace(ngroups, stream, "select")
    base = ws.buf.data.ptr
    if stitch_only:
        cp.cuda.runtime.memsetAsync(base, 0, ngroups * 8, stream.ptr)
    else:                                   # sel_local8 zeroes the status words
        fns["sel_local8"](
            (ntiles,), (SEL_THREADS,),
            (a, np.int64(n), np.uint32(above_key), np.uint32(lcap), counts, s_idx, s_val,
             np.uint64(base), np.uint32(ngroups)))
    fns["sel_stitch8"](
        (ngroups,), (SEL_THREADS,),
        (a, np.int64(n), np.uint32(above_key), np.uint32(lcap), np.uint32(cap),
         np.uint32(ntiles), np.uint32(gsize), counts, s_idx, s_val, out_idx, out_val,
         np.uint64(base)))
    if not read_total:
        return scratch, None
    s = int(_read_back(ws, base + (ngroups - 1) * 8, 8, stream)[0])
    if s >> 62 != 2:
        raise RuntimeError("stitch kernel left its last tile unfinished (kernel bug)")
    return scratch, (s >> 31) & 0x7FFFFFFF


def _threshold_select_local(x, key, c, expected):
    n = x.size
    lcap = local_cap((n + LOCAL_TILE - 1) // LOCAL_TILE, expected)
    out_idx, out_val = _empty(c, np.int32), _empty(c, np.float32)
    scratch, total = _select_local(x, n, key, c, out_idx, out_val, lcap)
    _CAP_HINT[n] = total
    if total > c:
        out_idx, out_val = _empty(total, np.int32), _empty(total, np.float32)
        _, again = _select_local(x, n, key, total, out_idx, out_val, lcap, scratch,
                                 stitch_only=True)
        assert again == total
        return out_idx, out_val
    return out_idx[:total], out_val[:total]


@functools.lru_cache(maxsize=None)
def _sel_tile(name: str) -> int:
    """Entries per tile of a sel_* kernel: 1024 x its 4 / 8 / 16 float4 per lane."""
    m = re.fullmatch(r"sel_(?:thr|topkx|topk|ef[rsc]?)[a-z]*?(4|8|16)", name)
    if m is None:
        raise ValueError(f"not a select kernel: {name!r}")
    return SEL_THREADS * 4 * int(m.group(1))


def _sel_name(kind: str) -> str:
    if SELECT_VARIANT not in VARIANTS:
        raise ValueError(f"select variant {SELECT_VARIANT!r} not in {VARIANTS} "
                         "(AUTOTUNE_SELECT_VARIANT)")
    return f"{kind}{SELECT_VARIANT}"


# --------------------------------------------------------------------------
# Threshold selection
# --------------------------------------------------------------------------

_CAP_HINT: dict[int, int] = {}


def _default_cap(n: int) -> int:
    last = _CAP_HINT.get(n)
    if last is None:
        return min(n, max(1 << 16, n >> 4))
    return min(n, max(1 << 12, 2 * last + 1024))


@_on_input_device
def threshold_select(x, threshold, *, cap: int | None = None):
    """COO of |x| >= threshold: (int32 indices sorted ascending, values).

    One pass over x (``THRESHOLD_PATH``: two launches for n >= LOCAL_MIN_N
    when the expected count is at most LOCAL_MAX_SHARE of n, the second over
    the selected entries only, except tiles whose entries overflow their
    scratch slot, which it selects again from x).  The output buffer holds
    ``cap`` entries (default: twice the last count for this size, else n/16);
    if more are selected, the entries are written again (the local path
    re-runs only its stitch) into a buffer of the exact size.  Returns views
    of that buffer.
    """
    n = x.size
    key = threshold_key(threshold)
    c = n if key == 0 else min(n, cap if cap is not None else _default_cap(n))
    if THRESHOLD_PATH not in THRESHOLD_PATHS:
        raise ValueError(f"threshold path {THRESHOLD_PATH!r} not in {THRESHOLD_PATHS} "
                         "(AUTOTUNE_THRESHOLD_PATH)")
    if THRESHOLD_PATH == "local" and n >= LOCAL_MIN_N:
        expected = _CAP_HINT.get(n, c)
        if expected <= LOCAL_MAX_SHARE * n:
            return _threshold_select_local(x, key, c, expected)
    out_idx, out_val = _empty(c, np.int32), _empty(c, np.float32)
    total, _ = _select(_sel_name("sel_thr"), x, None, None, n, key, _NOKEY, 0, None, c,
                       out_idx, out_val)
    _CAP_HINT[n] = total
    if total > c:
        out_idx, out_val = _empty(total, np.int32), _empty(total, np.float32)
        again, _ = _select(_sel_name("sel_thr"), x, None, None, n, key, _NOKEY, 0, None, total,
                           out_idx, out_val)
        assert again == total
        return out_idx, out_val
    return out_idx[:total], out_val[:total]


@_on_input_device
def threshold_select_ef(residual, x, threshold, *, cap: int | None = None):
    """Error-feedback selection in one pass: acc = residual + x; emit |acc| >= t.

    ``residual`` (float32, updated in place) ends holding acc with the
    emitted entries zeroed.  Reads 8 bytes and writes 4 per element.  If the
    output buffer overflows, the entries past it stay in the residual and a
    continuation pass (threshold > 0 there, so emitted zeros are not picked
    again) selects them from the residual.
    """
    n = residual.size
    key = threshold_key(threshold)
    c = n if key == 0 else min(n, cap if cap is not None else _default_cap(n))
    out_idx, out_val = _empty(c, np.int32), _empty(c, np.float32)
    total, _ = _select(EF_KERNEL, residual, x, None, n, key, _NOKEY, 0, None, c,
                       out_idx, out_val)
    _CAP_HINT[n] = total
    if total <= c:
        return out_idx[:total], out_val[:total]
    rest = total - c
    r_idx, r_val = _empty(rest, np.int32), _empty(rest, np.float32)
    again, _ = _select("sel_efc4", residual, None, None, n, key, _NOKEY, 0, None, rest,
                       r_idx, r_val)
    assert again == rest, (again, rest)
    return cp.concatenate([out_idx, r_idx]), cp.concatenate([out_val, r_val])


# --------------------------------------------------------------------------
# Exact top-k: radix select on the magnitude bits
# --------------------------------------------------------------------------

#: up to this many entries the radix select reads x three times instead of
#: reading the candidate count back to the host (no synchronisation)
RADIX_NOREAD_MAX = int(os.environ.get("AUTOTUNE_RADIX_NOREAD_MAX", 1 << 18))
#: up to this many entries, exact top-k runs in one launch of one block
#: (``tk_small``) instead of the radix select's histogram passes and host read
TOPK_SMALL_MAX = int(os.environ.get("AUTOTUNE_TOPK_SMALL_MAX", 1 << 14))


def _hist(src, m, st, hist, shift, nbits, copies):
    """Launch tk_hist over m keys of src; st and hist are device pointers (int)."""
    grid = max(1, min((m // 4 + 2 * HIST_THREADS - 1) // (2 * HIST_THREADS), 4 * _sm_count()))
    _funcs()["tk_hist"](
        (grid,), (HIST_THREADS,),
        (src, np.int64(m), np.uint64(st), np.uint64(hist), np.int32(shift), np.int32(nbits),
         np.int32(copies)),
        shared_mem=(copies << nbits) * 4)


def _find(hist, nbits, shift, st, k, pass_):
    _funcs()["tk_find"]((1,), (32,), (np.uint64(hist), np.int32(nbits), np.int32(shift),
                                      np.uint64(st), np.uint32(k), np.int32(pass_)))


# radix workspace, in uint32 words: histograms of 2048 + 1024 + 1024 bins, then
# the state (S_* in the source: prefix, remaining rank, bin count, _, above_key,
# tie_key, need, error flag)
_H1, _H2, _H3, _ST, _RADIX_WORDS = 0, 2048, 3072, 4096, 4112


def _radix(x, k):
    """The k-th largest magnitude key of float32 x, found on the device.

    1. Histogram of key bits 30..20 over x (full read), find the bin b1 of
       the k-th key.  The host reads 3 words: how many keys lie in bins >= b1
       (m = k - remaining rank + count of b1).
    2. Ordered compaction of those m entries (index, value) with the select
       kernel (full read; m is about k plus one bin: a few percent of n).
    3. Histograms of bits 19..10 and 9..0 over the m candidates only.
    When the candidates are most of x (heavy ties), step 2 is skipped and
    step 3 reads x; so it is for x of up to ``RADIX_NOREAD_MAX`` entries,
    without the host read (three reads of a small x cost less than the wait).  Returns (ws, st, src, m, gather): the workspace, the
    device address of the state (its words 4..6 are the select parameters),
    the array the final select reads, its length and its original indices
    (None when src is x).
    """
    n = x.size
    stream = cp.cuda.get_current_stream()
    ws = _workspace(_RADIX_WORDS // 2, stream, "radix")
    base = ws.buf.data.ptr
    st = base + 4 * _ST
    cp.cuda.runtime.memsetAsync(base, 0, 4 * _RADIX_WORDS, stream.ptr)
    _hist(x, n, st, base + 4 * _H1, 20, 11, 4)
    _find(base + 4 * _H1, 11, 20, st, k, 1)
    if n <= RADIX_NOREAD_MAX:   # small: read x again rather than wait for the host
        _hist(x, n, st, base + 4 * _H2, 10, 10, 1)
        _find(base + 4 * _H2, 10, 10, st, 0, 2)
        _hist(x, n, st, base + 4 * _H3, 0, 10, 1)
        _find(base + 4 * _H3, 10, 0, st, 0, 3)
        return ws, st, x, n, None
    w = _read_back(ws, st, 16, stream).view(np.uint32)
    prefix1, krem, h = int(w[0]), int(w[1]), int(w[2])
    m = (k - krem) + h
    if m <= n // 2:
        ci, cv = _empty(m, np.int32), _empty(m, np.float32)
        _select(_sel_name("sel_thr"), x, None, None, n, prefix1, _NOKEY, 0, None, m, ci, cv,
                read_total=False)
        src, gather = cv, ci
    else:
        src, gather, m = x, None, n
    _hist(src, m, st, base + 4 * _H2, 10, 10, 1)
    _find(base + 4 * _H2, 10, 10, st, 0, 2)
    _hist(src, m, st, base + 4 * _H3, 0, 10, 1)
    _find(base + 4 * _H3, 10, 0, st, 0, 3)
    return ws, st, src, m, gather


@_on_input_device
def kth_key(x, k: int) -> int:
    """The k-th largest 31-bit magnitude key of float32 x (1 <= k <= n)."""
    ws, st, *_ = _radix(x, k)
    w = _read_back(ws, st, 32, cp.cuda.get_current_stream()).view(np.uint32)
    if w[7]:
        raise RuntimeError("radix select lost count of the keys (kernel bug)")
    return int(w[5])


@_on_input_device
def kth_magnitude(x, k: int) -> float:
    return key_to_float(kth_key(x, k))


def _topk_small(x, k: int, idx=None):
    out_idx, out_val = _empty(k, np.int32), _empty(k, np.float32)
    _funcs()["tk_small"]((1,), (1024,), (x, idx if idx is not None else _NULL, np.int32(x.size),
                                         np.int32(k), out_idx, out_val))
    return out_idx, out_val


@_on_input_device
def topk_select(x, k: int):
    """Exact top-k by magnitude, ties to the lowest indices: (idx sorted, values).

    Radix select of the k-th key (two full reads of x, one host read of
    three words), then one ordered select over the candidates that takes
    every key above it and the first ``need`` equal to it.  Output size k.
    Up to ``TOPK_SMALL_MAX`` entries: one launch of ``tk_small`` instead.
    """
    if x.size <= TOPK_SMALL_MAX:
        return _topk_small(x, k)
    _, st, src, m, gather = _radix(x, k)
    out_idx, out_val = _empty(k, np.int32), _empty(k, np.float32)
    _select(_sel_name("sel_topk" if gather is not None else "sel_topkx"), src, None, gather, m,
            0, 0, 0, st + 16, k, out_idx, out_val, read_total=False)
    return out_idx, out_val


@_on_input_device
def cap_select(idx, vals, k: int):
    """The ``k`` largest-magnitude entries of the COO set (int32 ``idx``,
    float32 ``vals``, k < size), ties to the lowest positions, order kept:
    ``(idx[keep], vals[keep])`` with ``keep = topk_select(vals, k)[0]``, the
    gather fused into the select when the set is small."""
    if vals.size <= TOPK_SMALL_MAX:
        return _topk_small(vals, k, idx)
    keep = topk_select(vals, k)[0]
    return idx[keep], vals[keep]


# --------------------------------------------------------------------------
# Sparse arithmetic
# --------------------------------------------------------------------------

@_on_input_device
def segment_sums(sval, starts):
    """out[s] = np.add.reduceat(sval, starts)[s], bitwise (float32 / float64)."""
    fns = _funcs()
    nseg, m = starts.size, sval.size
    out = _empty(nseg, sval.dtype)
    starts = starts.astype(cp.int64, copy=False)
    threads = 256
    grid = max(1, min((nseg + threads - 1) // threads, 32 * _sm_count()))
    name = "seg_sum_f32" if sval.dtype == np.float32 else "seg_sum_f64"
    fns[name]((grid,), (threads,), (sval, starts, np.int64(nseg), np.int64(m), out))
    return out


@_on_input_device
def scatter_add_sorted(dense, idx, vals):
    """dense[idx] += vals for non-decreasing idx, each run in input order."""
    fns = _funcs()
    m = idx.size
    threads = 256
    grid = max(1, min((m + threads - 1) // threads, 32 * _sm_count()))
    name = "seg_scatter_add_i32" if idx.dtype == np.int32 else "seg_scatter_add_i64"
    fns[name]((grid,), (threads,), (dense, np.int64(dense.size), idx, vals, np.int64(m)))
    return dense


# --------------------------------------------------------------------------
# Gaussiank: mean / std and counts at several thresholds
# --------------------------------------------------------------------------

GS_THREADS = 256
#: thresholds one count_at_least_many launch handles
COUNT_KEYS = 16
_GS_COUNT = ((1, "gs_count1"), (4, "gs_count4"), (16, "gs_count16"))
# "gauss" workspace, in uint64 words: mean, var, keys (16 uint32), counts
# (16 uint32), then the per-block partial sums
_GS_MEAN, _GS_VAR, _GS_KEYS, _GS_COUNTS, _GS_PART = 0, 1, 2, 10, 32


def _gs_grid(n: int) -> int:
    # 8 blocks of 256 per SM (full occupancy), 2 float4 per thread per step
    return max(1, min((n // 4 + 2 * GS_THREADS - 1) // (2 * GS_THREADS), 8 * _sm_count()))


@_on_input_device
def mean_std(x):
    """(mean, std) of float32 x in float64, as ``numpy.mean`` / ``numpy.std`` with
    ``dtype=float64`` define them: sum(x) / n, then sqrt(sum((x - mean)^2) / n).

    Two reads over a fixed grid, reduced in a fixed order (the same bits on
    every run; they may differ from NumPy's pairwise sums in the last bits),
    one host read-back.
    """
    fns = _funcs()
    n = x.size
    grid = _gs_grid(n)
    stream = cp.cuda.get_current_stream()
    ws = _workspace(_GS_PART + grid, stream, "gauss")
    base = ws.buf.data.ptr
    part = np.uint64(base + 8 * _GS_PART)
    mean = base + 8 * _GS_MEAN
    fns["gs_partial"]((grid,), (GS_THREADS,), (x, np.int64(n), _NULL, part))
    fns["gs_finish"]((1,), (32,), (part, np.int32(grid), np.int64(n), np.uint64(mean)))
    fns["gs_partial"]((grid,), (GS_THREADS,), (x, np.int64(n), np.uint64(mean), part))
    fns["gs_finish"]((1,), (32,), (part, np.int32(grid), np.int64(n),
                                   np.uint64(base + 8 * _GS_VAR)))
    h = _read_back(ws, mean, 16, stream).view(np.float64)
    return float(h[0]), math.sqrt(float(h[1]))


@_on_input_device
def count_at_least_many(x, keys) -> list[int]:
    """[#{i : key(x_i) >= key} for key in keys] (float32 x): one read of x per
    COUNT_KEYS keys, one host read-back each."""
    keys = [int(k) for k in keys]
    out: list[int] = []
    for lo in range(0, len(keys), COUNT_KEYS):
        out += _count_block(x, keys[lo:lo + COUNT_KEYS])
    return out


def _count_block(x, keys):
    fns = _funcs()
    n = x.size
    width, name = next((w, nm) for w, nm in _GS_COUNT if w >= len(keys))
    stream = cp.cuda.get_current_stream()
    ws = _workspace(_GS_PART, stream, "gauss")
    base = ws.buf.data.ptr
    host = ws.host.view(np.uint32)      # free: the last read-back was waited for
    host[:] = _NOKEY
    host[:len(keys)] = keys
    cp.cuda.runtime.memcpyAsync(base + 8 * _GS_KEYS, host.ctypes.data, 4 * COUNT_KEYS,
                                cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
    cp.cuda.runtime.memsetAsync(base + 8 * _GS_COUNTS, 0, 4 * COUNT_KEYS, stream.ptr)
    grid = _gs_grid(n)
    fns[name]((grid,), (GS_THREADS,), (x, np.int64(n), np.uint64(base + 8 * _GS_KEYS),
                                       np.uint64(base + 8 * _GS_COUNTS)))
    h = _read_back(ws, base + 8 * _GS_COUNTS, 4 * width, stream).view(np.uint32)
    return [int(c) for c in h[:len(keys)]]


@_on_input_device
def count_at_least(x, key: int) -> int:
    """#{i : key(x_i) >= key}: one read, no temporary (float32 x)."""
    return count_at_least_many(x, [key])[0]

// Threshold selection with index-ordered output, and the tie-aware select of
// the exact top-k.  Launched from kernels/_cuda_select.py and _cuda_topk.py;
// the design and its measurements: docs/BENCHMARKS.md, "GPU kernels" and
// "Two launches: tile-local compaction, then a stitch".
#include "common.cuh"

#define SEL_THREADS 256
#define SEL_WARPS 8
#define SEL_J 8                     // float4 per lane: tiles of 8192 entries
// resident blocks of 256 per SM asked of the register allocator (spill-free)
#define MINB_THR 4
#define MINB_TOPK 2
#define MINB_LOCAL 3
#define ST_FLAG_SHIFT 62
#define ST_AGG (1ull << 62)
#define ST_INC (2ull << 62)
#define CNT31 0x7fffffffull
#define NOKEY 0xffffffffu           // a key no float32 magnitude has

__device__ __forceinline__ void st_publish(u64* p, u64 v) { *((volatile u64*)p) = v; }
__device__ __forceinline__ u64 st_read(const u64* p) { return *((volatile const u64*)p); }

__device__ __forceinline__ u32 byte_of(const u32 w, const int q) { return (w >> (8 * q)) & 0xffu; }

__device__ __forceinline__ u32 byte_sum(const u32 w) {
    return (w & 0xffu) + ((w >> 8) & 0xffu) + ((w >> 16) & 0xffu) + (w >> 24);
}

// ---- one pass, decoupled look-back, ordered output ---------------------------
// Block b handles tile b: SEL_WARPS * 32 * 4 * J entries.  (Using blockIdx.x
// as the tile id, as CUB's single-pass scans do, relies on blocks being
// dispatched in index order, so every tile a block waits on belongs to a block
// already running.)  Lane l of warp w loads float4 number j*32 + l of the warp's
// span, so every load is coalesced, and the span's index order is
// (j, lane, element).  Per lane and chunk j the selected count (0..4) goes into
// one byte of a packed word; one warp scan of the packed word ranks all chunks
// at once (a chunk's warp total is at most 128, so bytes never carry; a warp's
// totals are at most 32*4*J = 1024 and a block's 8 * 1024 = 2^13, so the 16-bit
// halves of the block scan never carry either).  Ties at tie_key are counted
// the same way when TIES: entry i is selected when key >= above_key, or
// key == tie_key and fewer than `need` ties precede it; its output slot is
// #(above before i) + min(#(ties before i), need).  (above_key > tie_key
// wherever TIES is used, so no entry is both.)
// GATHER: a is a compacted candidate list and in_idx its original indices.
// After the look-back each thread loads its selected chunks again (L1/L2 hits:
// the tile was just read; a thread that keeps no values needs few registers, so
// more blocks stay resident, i.e. more loads in flight) and writes each entry at
// prefix + rank.
// One 64-bit status word per tile carries two counts (2 flag bits + 2 x 31
// bits): entries above and ties.

// Load the tile (this warp's span).
template <int J>
__device__ __forceinline__ void tile_load(const float* aw, const int lim, const int lane,
                                          float (&v)[J][4])
{
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int o = (j * 32 + lane) * 4;
        if (o + 3 < lim) {
            const float4 q = __ldg(reinterpret_cast<const float4*>(aw + o));
            v[j][0] = q.x; v[j][1] = q.y; v[j][2] = q.z; v[j][3] = q.w;
        } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) v[j][c] = (o + c < lim) ? aw[o + c] : 0.0f;
        }
    }
}

// Mark the loaded tile's candidates and rank them inside the warp.
template <int J, bool TIES>
__device__ __forceinline__ void tile_rank(
    const float (&v)[J][4], const int lim, const int lane,
    const u32 above_key, const u32 tie_key,
    u32& ma, u32& mt, u32 (&ea)[J / 4], u32 (&ta)[J / 4],
    u32 (&et)[J / 4], u32 (&tt)[J / 4], u32& wa, u32& wt)
{
    static_assert(J == 4 || J == 8, "4 or 8 float4 per lane: 4J mask bits in a u32");
    constexpr int NP = J / 4;
    ma = 0; mt = 0;                 // bit 4j+c: entry (j, c) above / tie
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int o = (j * 32 + lane) * 4;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 key = __float_as_uint(v[j][c]) & KEY_MASK;
            const bool ok = o + c < lim;
            if (ok && key >= above_key) ma |= 1u << (4 * j + c);
            if (TIES && ok && key == tie_key) mt |= 1u << (4 * j + c);
        }
    }
    wa = 0; wt = 0;                 // packed: lane-exclusive prefix, warp total
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        u32 pa = 0, pt = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            pa |= (u32)__popc((ma >> (4 * (4 * p + q))) & 0xfu) << (8 * q);
            if (TIES) pt |= (u32)__popc((mt >> (4 * (4 * p + q))) & 0xfu) << (8 * q);
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
// input pointer at its start.
template <int J>
struct WarpSpan {
    i64 base;
    int lim;
    const float* a;
    __device__ __forceinline__ WarpSpan(const float* a0, const i64 n, const u32 tile,
                                        const int warp) {
        constexpr int WARP_ELEMS = 32 * 4 * J;
        base = (i64)tile * (SEL_WARPS * WARP_ELEMS) + (i64)warp * WARP_ELEMS;
        lim = (int)max((i64)0, min((i64)WARP_ELEMS, n - base));
        a = a0 + base;
    }
};

// One lane's share of its warp's span once tile_load_rank ran, as locals: the
// values, the candidate masks (bit 4j+c: entry (j, c) above / tie) and the
// in-warp ranks and totals (tile_rank's outputs); LANE_TILE_RANKS names them in
// tile_write_direct's argument order.  (Locals, not a struct: grouped in a struct
// the kernels compile to other code, whose speed was never measured.)
#define LANE_TILE(J) float v[J][4]; u32 ma, mt, wa, wt, ea[J / 4], ta[J / 4], et[J / 4], tt[J / 4]
#define LANE_TILE_RANKS v, ma, mt, ea, ta, et, tt

// Load the span, mark the candidates and rank them inside the warp.
template <int J, bool TIES>
__device__ __forceinline__ void tile_load_rank(
    const WarpSpan<J>& sp, const int lane, const u32 above_key, const u32 tie_key,
    float (&v)[J][4], u32& ma, u32& mt,
    u32 (&ea)[J / 4], u32 (&ta)[J / 4], u32 (&et)[J / 4], u32 (&tt)[J / 4], u32& wa, u32& wt)
{
    tile_load<J>(sp.a, sp.lim, lane, v);
    tile_rank<J, TIES>(v, sp.lim, lane, above_key, tie_key, ma, mt, ea, ta, et, tt, wa, wt);
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
template <int J, bool TIES, bool GATHER, bool KEEP>
__device__ __forceinline__ void tile_write_direct(
    const float* aw, const int* in_idx, const i64 wbase, const int lim,
    const int lane, const u32 ga, const u32 gt, const u32 need, const u32 cap,
    const float (&v)[J][4], const u32 ma, const u32 mt, const u32 (&ea)[J / 4],
    const u32 (&ta)[J / 4], const u32 (&et)[J / 4], const u32 (&tt)[J / 4],
    int* __restrict__ out_idx, float* __restrict__ out_val)
{
    const int ibase = (int)wbase;               // used only for valid entries (< n < 2^31)
    u32 ba = 0, bt = 0;                         // totals of this warp's earlier chunks
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int p = j >> 2, q = j & 3;
        const int o = (j * 32 + lane) * 4;
        const u32 mj = (ma >> (4 * j)) & 0xfu;
        const u32 tj = TIES ? ((mt >> (4 * j)) & 0xfu) : 0u;
        if (mj | tj) {
            float w[4];
            if (KEEP) {
                w[0] = v[j][0]; w[1] = v[j][1]; w[2] = v[j][2]; w[3] = v[j][3];
            } else if (o + 3 < lim) {   // reload (.cg: from L2, not merged with the first read)
                const float4 q4 = __ldcg(reinterpret_cast<const float4*>(aw + o));
                w[0] = q4.x; w[1] = q4.y; w[2] = q4.z; w[3] = q4.w;
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) w[c] = (o + c < lim) ? __ldcg(aw + o + c) : 0.0f;
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
                }
                ra += pa_; rt += pt_;
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

template <int J, bool TIES, bool GATHER>
__device__ __forceinline__ void select_tile(
    const float* a, const int* in_idx, const i64 n,
    const u32 above_key, const u32 tie_key, const u32 need, const u32 cap,
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status)
{
    __shared__ u32 s_w[SEL_WARPS];
    __shared__ u32 s_pa, s_pt;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const u32 tile = blockIdx.x;
    const WarpSpan<J> sp(a, n, tile, warp);

    LANE_TILE(J);
    tile_load_rank<J, TIES>(sp, lane, above_key, tie_key, v, ma, mt, ea, ta, et, tt, wa, wt);
    if (lane == 0) s_w[warp] = wa | (wt << 16);      // each <= 32*4*J = 1024
    __syncthreads();

    if (warp == 0) tile_prefix(status, tile, lane, s_w, s_pa, s_pt);
    __syncthreads();

    const u32 wx = s_w[warp];
    tile_write_direct<J, TIES, GATHER, false>(
        sp.a, in_idx, sp.base, sp.lim, lane, s_pa + (wx & 0xffffu), s_pt + (wx >> 16), need, cap,
        LANE_TILE_RANKS, out_idx, out_val);
}

// The one-pass kernels' common arguments: sel_thr8 selects key >= above_key
// (the caller passes tie_key = NOKEY, need = 0; in_idx, dparams unused);
// sel_topk8 / sel_topkx8 read (above_key, tie_key, need) from the device
// (dparams: the radix select's state) and take the first `need` ties too,
// sel_topk8 over a candidate list whose original indices are in_idx.
#define SEL_ARGS const float* a, const int* in_idx, const i64 n, const u32 above_key,    \
    const u32 tie_key, const u32 need, const u32* dparams, const u32 cap,                 \
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status

extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_THR) sel_thr8(SEL_ARGS) {
    select_tile<SEL_J, false, false>(a, in_idx, n, above_key, tie_key, need, cap,
                                     out_idx, out_val, status);
}
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_TOPK) sel_topk8(SEL_ARGS) {
    select_tile<SEL_J, true, true>(a, in_idx, n, dparams[0], dparams[1], dparams[2], cap,
                                   out_idx, out_val, status);
}
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_TOPK) sel_topkx8(SEL_ARGS) {
    select_tile<SEL_J, true, false>(a, in_idx, n, dparams[0], dparams[1], dparams[2], cap,
                                    out_idx, out_val, status);
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
    __shared__ u32 s_w[SEL_WARPS];
    __shared__ int s_idx[LOCAL_STAGE];
    __shared__ float s_val[LOCAL_STAGE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 tile = blockIdx.x;
    const WarpSpan<J> sp(a, n, tile, warp);
    LANE_TILE(J);
    tile_load_rank<J, false>(sp, lane, above_key, NOKEY, v, ma, mt, ea, ta, et, tt, wa, wt);
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
    tile_write_direct<J, false, false, true>(       // values kept: nothing re-loaded
        sp.a, nullptr, sp.base, sp.lim, lane, before, 0u, 0u, lcap, LANE_TILE_RANKS, s_idx, s_val);
    __syncthreads();
    const i64 dst = (i64)tile * lcap;
    for (u32 i = threadIdx.x; i < total; i += SEL_THREADS) {
        scr_idx[dst + i] = s_idx[i];
        scr_val[dst + i] = s_val[i];
    }
}

template <int J>
__device__ __forceinline__ void stitch_group(
    const float* a, const i64 n, const u32 above_key, const u32 lcap, const u32 cap,
    const u32 ntiles, const u32 gsize, const u32* __restrict__ counts,
    const int* __restrict__ scr_idx, const float* __restrict__ scr_val,
    int* __restrict__ out_idx, float* __restrict__ out_val, u64* status)
{
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
        const WarpSpan<J> sp(a, n, t0 + g, warp);
        LANE_TILE(J);
        tile_load_rank<J, false>(sp, lane, above_key, NOKEY, v, ma, mt, ea, ta, et, tt, wa, wt);
        __syncthreads();                            // s_v of the previous tile is read
        if (lane == 0) s_v[warp] = wa;
        __syncthreads();
        u32 before = 0;
#pragma unroll
        for (int w = 0; w < SEL_WARPS; ++w) before += (w < warp) ? s_v[w] : 0u;
        tile_write_direct<J, false, false, false>(
            sp.a, nullptr, sp.base, sp.lim, lane, gp + s_rel[g] + before, 0u, 0u, cap,
            LANE_TILE_RANKS, out_idx, out_val);
    }
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_LOCAL)
sel_local8(const float* a, const i64 n, const u32 above_key, const u32 lcap,
           u32* __restrict__ counts, int* __restrict__ scr_idx, float* __restrict__ scr_val,
           u64* __restrict__ status, const u32 nstatus) {
    local_tile<SEL_J>(a, n, above_key, lcap, counts, scr_idx, scr_val, status, nstatus);
}
extern "C" __global__ void __launch_bounds__(SEL_THREADS, MINB_THR)
sel_stitch8(const float* a, const i64 n, const u32 above_key, const u32 lcap, const u32 cap,
            const u32 ntiles, const u32 gsize, const u32* __restrict__ counts,
            const int* __restrict__ scr_idx, const float* __restrict__ scr_val,
            int* __restrict__ out_idx, float* __restrict__ out_val, u64* status) {
    stitch_group<SEL_J>(a, n, above_key, lcap, cap, ntiles, gsize, counts, scr_idx,
                        scr_val, out_idx, out_val, status);
}

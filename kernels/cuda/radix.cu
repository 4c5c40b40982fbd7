// The k-th largest magnitude of float32 data by radix select on its 31-bit
// key (tk_hist, tk_find: the state stays on the device for sel_topk8 /
// sel_topkx8 in select.cu), and the exact top-k of a small array in one block
// (tk_small).  Launched from kernels/_cuda_topk.py; measurements:
// docs/BENCHMARKS.md, "GPU kernels" and "Exact top-k of a small array in one launch".
#include "common.cuh"

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
// lanes that hit the same bin in one instruction.  ADD (tk_hist_add, pass 1
// only): the keys are those of src + add, and the sums are stored back into src
// (error feedback's acc += x fused into the first pass: one read of src less).
template <bool ADD>
__device__ __forceinline__ void hist_body(u32* __restrict__ src, const u32* __restrict__ add,
                                          const i64 m, const u32* __restrict__ st,
                                          u32* __restrict__ hist, const int shift,
                                          const int nbits, const int copies)
{
    extern __shared__ u32 sh[];
    const int nb = 1 << nbits;
    for (int i = threadIdx.x; i < (copies << nbits); i += blockDim.x) sh[i] = 0u;
    __syncthreads();
    const int hs = shift + nbits;                 // <= 31
    const u32 want = st[S_PREFIX] >> hs;
    const u32 bmask = (u32)nb - 1u;
    u32* myh = sh + ((threadIdx.x & (copies - 1)) << nbits);
    uint4* s4 = reinterpret_cast<uint4*>(src);
    const uint4* a4 = reinterpret_cast<const uint4*>(add);
    const i64 m4 = m >> 2;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x; q < m4; q += 2 * stride) {
        const bool ok1 = q + stride < m4;
        uint4 u0, u1 = make_uint4(0u, 0u, 0u, 0u);
        if (ADD) {
            float4 f0 = *reinterpret_cast<const float4*>(s4 + q);
            const float4 g0 = __ldg(reinterpret_cast<const float4*>(a4 + q));
            f0.x += g0.x; f0.y += g0.y; f0.z += g0.z; f0.w += g0.w;
            *reinterpret_cast<float4*>(s4 + q) = f0;
            u0 = *reinterpret_cast<const uint4*>(&f0);
            if (ok1) {
                float4 f1 = *reinterpret_cast<const float4*>(s4 + q + stride);
                const float4 g1 = __ldg(reinterpret_cast<const float4*>(a4 + q + stride));
                f1.x += g1.x; f1.y += g1.y; f1.z += g1.z; f1.w += g1.w;
                *reinterpret_cast<float4*>(s4 + q + stride) = f1;
                u1 = *reinterpret_cast<const uint4*>(&f1);
            }
        } else {
            u0 = __ldg(s4 + q);
            if (ok1) u1 = __ldg(s4 + q + stride);
        }
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
        const i64 i = m4 * 4 + threadIdx.x;
        u32 w = src[i];
        if (ADD) {
            const float f = __uint_as_float(w) + __uint_as_float(add[i]);
            src[i] = w = __float_as_uint(f);
        }
        const u32 kk = w & KEY_MASK;
        if ((kk >> hs) == want) atomicAdd(&myh[(kk >> shift) & bmask], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        u32 c = 0;
        for (int r = 0; r < copies; ++r) c += sh[(r << nbits) + i];
        if (c) atomicAdd(&hist[i], c);
    }
}

extern "C" __global__ void __launch_bounds__(512)
tk_hist(const u32* __restrict__ src, const i64 m, const u32* __restrict__ st,
        u32* __restrict__ hist, const int shift, const int nbits, const int copies)
{
    hist_body<false>(const_cast<u32*>(src), nullptr, m, st, hist, shift, nbits, copies);
}

extern "C" __global__ void __launch_bounds__(512)
tk_hist_add(u32* __restrict__ src, const u32* __restrict__ add, const i64 m,
            const u32* __restrict__ st, u32* __restrict__ hist, const int shift,
            const int nbits, const int copies)
{
    hist_body<true>(src, add, m, st, hist, shift, nbits, copies);
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


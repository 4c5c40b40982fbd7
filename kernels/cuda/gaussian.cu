// Gaussiank's statistics in a fixed summation order: float64 mean and variance
// (gs_partial, gs_finish) and the counts of |x| >= t at up to 16 thresholds in
// one read (gs_count*).  Launched from kernels/_cuda_gauss.py; why full-grid
// kernels: docs/BENCHMARKS.md, "Staged writes, and Gaussiank's selection".
#include "common.cuh"

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


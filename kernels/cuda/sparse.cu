// Deterministic sparse arithmetic: segmented sums in NumPy's add.reduceat order
// (bitwise equal to the CPU's coo_sum) and scatter-add over index-sorted input
// without float atomics.  Launched from kernels/_cuda_sparse.py.
#include "common.cuh"

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

// ---- zero the entries at given indices (the values a selection sent) --------
#define DEFINE_ZERO(NAME, T)                                                      \
extern "C" __global__ void                                                        \
NAME(float* dense, const i64 nd, const T* __restrict__ idx, const i64 m)          \
{                                                                                 \
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < m;               \
         j += (i64)gridDim.x * blockDim.x) {                                      \
        const T i = idx[j];                                                       \
        if (i >= 0 && (i64)i < nd) dense[i] = 0.0f;                               \
    }                                                                             \
}
DEFINE_ZERO(zero_at_i32, int)
DEFINE_ZERO(zero_at_i64, long long)

// ---- error feedback: acc += x, four values per thread where aligned ---------
extern "C" __global__ void add_into_f32(float* __restrict__ acc, const float* __restrict__ x,
                                        const i64 n)
{
    const i64 n4 = n / 4;
    float4* a4 = reinterpret_cast<float4*>(acc);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < n4; j += stride) {
        float4 a = a4[j];
        const float4 b = x4[j];
        a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
        a4[j] = a;
    }
    for (i64 j = 4 * n4 + (i64)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride)
        acc[j] += x[j];
}

// Input checks that leave their verdict on the device: no read-back per call.
// Launched from kernels/_cuda_checks.py.
#include "common.cuh"

// Sets `bit` in mask[0] if any of x[0..n) is NaN or Inf: one grid-stride read,
// one atomic per block that saw such a value.
template <typename T>
__device__ void flag_nonfinite(const T* __restrict__ x, const i64 n, const u64 bit,
                               u64* __restrict__ mask)
{
    int bad = 0;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x)
        bad |= !isfinite(x[i]);
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(mask, bit);
}

extern "C" __global__ void flag_nonfinite_f32(const float* x, const i64 n, const u64 bit,
                                              u64* mask)
{
    flag_nonfinite<float>(x, n, bit, mask);
}

extern "C" __global__ void flag_nonfinite_f64(const double* x, const i64 n, const u64 bit,
                                              u64* mask)
{
    flag_nonfinite<double>(x, n, bit, mask);
}

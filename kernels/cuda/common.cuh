// Shared by the kernels/cuda/*.cu sources: types, masks, one warp scan.
// Self-contained (no standard headers): compiled by NVRTC through cupy.RawModule
// with -I<this folder>, or by nvcc -I kernels/cuda.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FULL 0xffffffffu
#define KEY_MASK 0x7fffffffu        // |x| of a float32 as an unsigned key: sign cleared

// Inclusive warp scan of v (lane = threadIdx.x & 31, whole warp active).
__device__ __forceinline__ u32 warp_incl_scan(u32 v, const int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 t = __shfl_up_sync(FULL, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

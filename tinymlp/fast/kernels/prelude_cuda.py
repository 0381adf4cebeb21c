"""The device functions every CUDA source of the fast tier starts with (``cuda.source`` puts the
typedef of T, then these, in front of a topic's kernels): the math functions for either T
(``sqrt_t``, ``exp_t``, ...; no reliance on C++ overloads), and the block-wide reductions the
row kernels (one thread block per row) are built on: ``block_sum`` and ``block_max``, warp
shuffles and one exchange through shared memory.
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

PRELUDE = r"""
// sqrt for either T, without relying on C++ overloads of the math functions.
__device__ __forceinline__ float sqrt_t(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_t(double v) { return sqrt(v); }

__device__ __forceinline__ float abs_t(float v) { return fabsf(v); }
__device__ __forceinline__ double abs_t(double v) { return fabs(v); }
__device__ __forceinline__ float hypot_t(float a, float b) { return hypotf(a, b); }
__device__ __forceinline__ double hypot_t(double a, double b) { return hypot(a, b); }
__device__ __forceinline__ float exp_t(float v) { return expf(v); }
__device__ __forceinline__ double exp_t(double v) { return exp(v); }
__device__ __forceinline__ float log_t(float v) { return logf(v); }
__device__ __forceinline__ double log_t(double v) { return log(v); }
__device__ __forceinline__ float lowest_t(float) { return -3.402823466e+38f; }
__device__ __forceinline__ double lowest_t(double) { return -1.7976931348623157e+308; }

// The sum of v over the thread block, returned to every thread. blockDim.x must be a multiple
// of 32 (every lane of every warp takes part in the shuffles) and at most 1024.
// shared[0..31] holds one partial sum per warp, shared[32] the total. Two barriers make the
// function safe to call again at once: a later call writes shared[] only after all threads
// have passed its first barrier, hence after they have read shared[32] here.
__device__ __forceinline__ T block_sum(T v, T* shared) {
    const unsigned int full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(full, v, offset);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < (int)(blockDim.x >> 5)) ? shared[lane] : T(0);
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(full, v, offset);
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    return shared[32];
}

// The largest v over the thread block, returned to every thread (as block_sum does with the
// sum); ``lowest`` is what a lane without a value contributes (0 for absolute values,
// lowest_t(T(0)) in general).
__device__ __forceinline__ T block_max(T v, T* shared, const T lowest) {
    const unsigned int full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) {
        const T o = __shfl_down_sync(full, v, offset);
        v = o > v ? o : v;
    }
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < (int)(blockDim.x >> 5)) ? shared[lane] : lowest;
        for (int offset = 16; offset > 0; offset >>= 1) {
            const T o = __shfl_down_sync(full, v, offset);
            v = o > v ? o : v;
        }
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    return shared[32];
}

"""

"""Fused CUDA kernels (CuPy) for the ops whose array-at-a-time code launches many small kernels.

On the GPU every NumPy-style line (``t = x * x``, ``t += 1``, ``tanh(t, out=t)``, ...) is one
kernel launch and one trip of the whole array through GPU memory. The ops below are memory
bound, so a kernel that reads each input once and writes each output once is several times
faster than the same formula written with arrays. Each function here is an *optimisation* of
the reference ops in ``tinymlp/ops/*.py``, which stay the readable reference: the math,
its derivation live there; the fast-tier ops of this package call these kernels on CUDA, and ``tests/test_cuda.py`` checks every kernel
against that reference (float32 and float64, odd widths, one row, one token).

    op (file)                          function here                   CuPy mechanism
    ---------------------------------  ------------------------------  ---------------------------
    GELU, tanh form (activation.py)    gelu_tanh_forward(x)            ElementwiseKernel: y and
                                         -> (y, dydx)                    dy/dx from one tanh
    GELU backward                      gelu_backward(g, dydx)          none needed: g * dydx is one
                                                                         CuPy multiply (one kernel)
    LayerNorm forward (norm.py,        layer_norm_forward(x, w, b, eps) RawKernel, one thread block
      also for the SGU in gating.py)     -> (y, xhat, rstd)              per row: mean, variance and
                                       layer_norm_normalize(x, eps)      the output in one launch
                                         -> (xhat, rstd)
    LayerNorm backward                 layer_norm_backward(g, xhat,     RawKernel per row (dx) +
                                         rstd, w) -> (dx, dw, db)        two RawKernels for dw, db
                                                                         (chunks of rows, then
                                                                         the chunks' sum)
    softmax backward (attention.py:    softmax_backward(p, g)           RawKernel, one block per row:
      Softmax and Attention)             -> p * (g - rowsum(g * p))      the dot and the update
    SGU gate, split variant            sgu_gate_forward(f, gamma,       ElementwiseKernel: F and the
      (gating.py)                        shift, z1, a) -> out            gated output in one pass
                                       sgu_gate_backward(g, f, z1)      ElementwiseKernel: dz1 and
                                         -> (dz1, gF)                    gF in one pass

Matrix products are not here: they go to cuBLAS through ``xp.matmul`` in the ops themselves.

Conventions. Every function takes and returns CuPy arrays of one dtype, float32 or float64
(``supported(x)`` says whether an array qualifies; ``applies(*arrays)``, whether an op should
call the kernels at all); nothing is cast. Rows are the last axis:
"row-wise" kernels treat an array (..., D) as rows of width D. CuPy is imported on first use
(``_cupy()``), never when this module is imported, and every kernel is compiled once per dtype
and cached (CuPy also keeps the binaries in ``~/.cupy/kernel_cache``).

A kernel that does not compile or run (a CuPy without the CUDA headers, an unusual GPU) costs
speed, never the run: the first time ``applies`` meets a dtype, every kernel here is compiled
and run once on a tiny input; if one fails, a single RuntimeWarning says which and why, and
the fast ops take their array code (the reference formulas) on CUDA for that dtype from then
on. ``get_cupy`` runs the float32 LayerNorm kernel against NumPy before it says CUDA is ready.

The row kernels (one thread block per row) use a block of 32..256 threads, a multiple of the
warp size: each thread strides over the row, then ``block_sum`` adds the per-thread partial
sums with warp shuffles and one shared-memory exchange. A row narrower than the block simply
leaves threads idle (width 1 is one active thread), so any width is correct.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np

from ..backend import add_cuda_check, array_module
from .layout import inverse, memory_order

__all__ = [
    "adam_step", "applies", "clip_by_norm", "gelu_backward", "gelu_tanh_forward",
    "layer_norm_backward", "layer_norm_forward", "layer_norm_normalize", "layer_norm_param_grads",
    "multi_tensor_ok", "pointer_table", "scale_all", "sgu_gate_backward", "sgu_gate_forward",
    "softmax_backward", "supported",
]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_C0 = math.sqrt(2.0 / math.pi)
_C1 = 0.044715
_MAX_BLOCK = 256


@functools.cache
def _cupy():
    import cupy  # deliberately lazy: this module must import without CuPy

    return cupy


def applies(*arrays) -> bool:
    """Whether an op should call the kernels here: the first array is a CuPy array, all of them
    are ``supported`` (later None entries are skipped) and the kernels compiled and ran for
    their dtype (``kernels_work``). NumPy arrays give False."""
    return (array_module(arrays[0]).__name__ == "cupy" and supported(*arrays)
            and kernels_work(arrays[0].dtype))


_kernel_state = {}   # np.dtype -> True (the kernels work) or the one-line reason they do not


def kernels_work(dtype) -> bool:
    """Compile and run every kernel of this module once for ``dtype`` (the first time only);
    False, after one RuntimeWarning, when one of them fails: the fast ops then use their array
    code on CUDA (correct, slower). Nothing is read back to the host."""
    dtype = np.dtype(dtype)
    if dtype not in _kernel_state:
        try:
            _try_every_kernel(dtype)
            _kernel_state[dtype] = True
        except Exception as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            reason = f"{type(exc).__name__}{': ' + detail if detail else ''}"
            _kernel_state[dtype] = reason
            warnings.warn(
                f"tinymlp's CUDA kernels for {dtype} failed to compile or run ({reason}); the fast tier "
                f"uses its array code on CUDA instead (same results, slower); check the CUDA install "
                f"with: python -m tinymlp doctor", RuntimeWarning, stacklevel=2)
    return _kernel_state[dtype] is True


def kernel_failure(dtype):
    """Why the kernels for ``dtype`` do not run (None when they do or were not tried yet)."""
    state = _kernel_state.get(np.dtype(dtype))
    return None if state is None or state is True else state


def _try_every_kernel(dtype):
    """Compile and launch each kernel on a few elements of ``dtype`` (no result is read)."""
    cp = _cupy()
    x = cp.ones((2, 3), dtype=dtype)
    w = cp.ones(3, dtype=dtype)
    gelu_tanh_forward(x, want_derivative=True)
    gelu_tanh_forward(x, want_derivative=False)
    _, xhat, rstd = layer_norm_forward(x, w, w, 1e-5)
    layer_norm_backward(x, xhat, rstd, w)
    softmax_backward(x, x)
    f = cp.ones((1, 2, 3), dtype=dtype)
    sgu_gate_forward(f, w, x, f)
    sgu_gate_forward(f, w, x, f, gate_residual=f)
    sgu_gate_backward(f, f, f)
    arrays = [cp.zeros(2, dtype=dtype), cp.zeros((2, 2), dtype=dtype)]
    flat = cp.zeros(6, dtype=dtype)
    adam_step(arrays, flat, flat, flat, b1=0.9, b2=0.999, eps_c=1e-8, step_size=1e-3, decay=1.0)
    scale_all(arrays, clip_by_norm(arrays, 1.0)[1])


def _layer_norm_check(cupy):
    """The float32 LayerNorm kernel against NumPy, for ``get_cupy``'s readiness check (None,
    nothing to compare, when the kernels fell back: the array code computes instead)."""
    if not kernels_work(np.float32):
        return None
    x = (np.arange(3 * 40, dtype=np.float32).reshape(3, 40) % 7) - 3
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    y, _, _ = layer_norm_forward(cupy.asarray(x), None, None, 1e-5)
    return y, expected


add_cuda_check("the fast tier's LayerNorm kernel", _layer_norm_check)


def supported(*arrays) -> bool:
    """True when every array is float32 or float64 and all share one dtype (what the kernels take)."""
    dtypes = {np.dtype(a.dtype) for a in arrays if a is not None}
    return len(dtypes) == 1 and dtypes.pop() in _FLOATS


def _check(name, *arrays):
    if not supported(*arrays):
        raise TypeError(f"{name}: the CUDA kernel takes float32 or float64 arrays of one dtype, got "
                        + ", ".join(str(a.dtype) for a in arrays if a is not None))


# ============================================================================ GELU
# y = x h, h = (1 + t)/2, t = tanh(c0 (x + c1 x^3));  dy/dx = h + y (1 - t) c0 (1 + 3 c1 x^2)
# (the derivation is in activation.py). Constants are cast to T, so float32 stays float32.
_GELU_BODY = f"""
    const T x2 = x * x;
    const T t = tanh(T({_C0!r}) * (x + T({_C1!r}) * x2 * x));
    const T h = T(0.5) * (T(1) + t);
    y = x * h;
"""
_GELU_DERIVATIVE = f"""
    dydx = h + y * (T(1) - t) * (T({_C0!r}) + T({3 * _C0 * _C1!r}) * x2);
"""


@functools.cache
def _gelu_kernel(with_derivative):
    cp = _cupy()
    if with_derivative:
        return cp.ElementwiseKernel("T x", "T y, T dydx", _GELU_BODY + _GELU_DERIVATIVE, "tinymlp_gelu_tanh_grad")
    return cp.ElementwiseKernel("T x", "T y", _GELU_BODY, "tinymlp_gelu_tanh")


def gelu_tanh_forward(x, want_derivative=True):
    """GELU (tanh form) of ``x`` and its derivative, both from one tanh: ``(y, dydx)``.

    With ``want_derivative=False`` (no gradient needed) only y is computed: ``(y, None)``.
    """
    _check("gelu_tanh_forward", x)
    if want_derivative:
        y, dydx = _gelu_kernel(True)(x)
        return y, dydx
    return _gelu_kernel(False)(x), None


def gelu_backward(g, dydx):
    """dL/dx = g * dy/dx: a single elementwise multiply, already one kernel; no custom code needed."""
    return g * dydx


# ============================================================================ row kernels
# One CUDA source, compiled once per dtype (``row_source`` puts the typedef of T in front).
_ROW_SOURCE = r"""
// sqrt for either T, without relying on C++ overloads of the math functions.
__device__ __forceinline__ float sqrt_t(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_t(double v) { return sqrt(v); }

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

// LayerNorm forward of one row per block. x rows start every x_stride elements (a strided
// view such as z[..., e:] is read in place); xhat, y are contiguous (rows, width).
// xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps); y = xhat * weight + bias if affine.
extern "C" __global__ void layer_norm_forward(
        const T* x, const long long x_stride, const T* weight, const T* bias,
        T* y, T* xhat, T* rstd, const int width, const T eps, const int affine) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* xr = x + row * x_stride;
    T s = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) s += xr[j];
    const T mean = block_sum(s, shared) / T(width);
    T ss = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T c = xr[j] - mean;
        ss += c * c;
    }
    const T r = T(1) / sqrt_t(block_sum(ss, shared) / T(width) + eps);
    T* hr = xhat + row * width;
    T* yr = y + row * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T h = (xr[j] - mean) * r;
        hr[j] = h;
        if (affine) yr[j] = h * weight[j] + bias[j];
    }
    if (threadIdx.x == 0) rstd[row] = r;
}

// LayerNorm backward (dx only) of one row per block; g, xhat contiguous (rows, width), dx rows
// every dx_stride elements. With gw = g * weight:
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)).
// Each thread reads g[j], xhat[j] before writing dx[j] of the same j, so dx may alias g.
extern "C" __global__ void layer_norm_backward(
        const T* g, const T* xhat, const T* rstd, const T* weight,
        T* dx, const long long dx_stride, const int width) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* gr = g + row * width;
    const T* hr = xhat + row * width;
    T a = 0, b = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        const T gw = gr[j] * weight[j];
        a += gw;
        b += gw * hr[j];
    }
    const T mean_g = block_sum(a, shared) / T(width);
    const T mean_gx = block_sum(b, shared) / T(width);
    const T r = rstd[row];
    T* dr = dx + row * dx_stride;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        dr[j] = r * (gr[j] * weight[j] - mean_g - hr[j] * mean_gx);
    }
}

// LayerNorm's parameter gradients, first pass: column sums of g * xhat (dweight) and of g
// (dbias) over one chunk of rows. g, xhat contiguous (rows, width). A block of 32 x 8 threads
// covers 32 columns (blockIdx.x) of the chunk blockIdx.y: the 32 threads of a warp read 32
// neighbouring columns of a row (coalesced), the 8 warps take every 8th row, and shared
// memory adds the 8 partial sums. partial is (2, chunks, width): [0] dweight's, [1] dbias's.
extern "C" __global__ void layer_norm_param_partials(
        const T* g, const T* xhat, T* partial, const long long rows, const int width,
        const long long rows_per_chunk) {
    __shared__ T sa[8][33];
    __shared__ T sb[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const long long chunk = blockIdx.y;
    const long long start = chunk * rows_per_chunk;
    const long long end = start + rows_per_chunk < rows ? start + rows_per_chunk : rows;
    T a = 0, b = 0;
    if (col < width) {
        for (long long r = start + threadIdx.y; r < end; r += blockDim.y) {
            const T gv = g[r * width + col];
            a += gv * xhat[r * width + col];
            b += gv;
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < width) {
        for (int k = 1; k < blockDim.y; ++k) {
            a += sa[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        partial[chunk * width + col] = a;
        partial[(gridDim.y + chunk) * width + col] = b;
    }
}

// Second pass: out[p, c] = sum over k of partial[p, k, c] for the planes p (one thread each
// (p, c), reading the chunks in order: the same sum on every run).
extern "C" __global__ void sum_chunks(
        const T* partial, T* out, const int planes, const int chunks, const int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= planes * width) return;
    const int plane = i / width, col = i % width;
    const T* src = partial + (long long)plane * chunks * width + col;
    T s = 0;
    for (int k = 0; k < chunks; ++k) s += src[(long long)k * width];
    out[i] = s;
}

// ---- Multi-tensor kernels: one launch over many parameters (or gradients). ptrs[k] is the
// device address of array k (C-contiguous), starts[k] its offset in the flat numbering of all
// elements, starts[count] the total; element i belongs to the k with starts[k] <= i < starts[k+1].
__device__ __forceinline__ int owner(const long long* starts, const int count, const long long i) {
    int lo = 0, hi = count;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (starts[mid] <= i) lo = mid; else hi = mid;
    }
    return lo;
}

// Adam(W) over a whole group: with g, m, v the flat gradient and moments,
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,
//   p <- p * decay - step_size * m / (sqrt(v) + eps_c)      (p: the parameter element i is)
// in the operation order of fast/optim.py's array code (see adam_direction there).
extern "C" __global__ void adam_step(
        const T* g, T* m, T* v, const long long* ptrs, const long long* starts, const int count,
        const T b1, const T one_minus_b1, const T b2, const T one_minus_b2, const T eps_c,
        const T step_size, const T decay) {
    const long long n = starts[count];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const T gi = g[i];
        const T mi = m[i] * b1 + gi * one_minus_b1;
        const T vi = v[i] * b2 + (gi * gi) * one_minus_b2;
        m[i] = mi;
        v[i] = vi;
        const T u = (mi / (sqrt_t(vi) + eps_c)) * step_size;
        const int k = owner(starts, count, i);
        T* p = reinterpret_cast<T*>(ptrs[k]);
        const long long j = i - starts[k];
        p[j] = p[j] * decay - u;
    }
}

// Sum of squares of all the arrays, first pass: one partial sum per block (a fixed grid, so
// the same partition and order on every run).
extern "C" __global__ void sum_squares_partials(
        const long long* ptrs, const long long* starts, const int count, T* partial) {
    __shared__ T shared[33];
    const long long n = starts[count];
    T s = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int k = owner(starts, count, i);
        const T x = reinterpret_cast<const T*>(ptrs[k])[i - starts[k]];
        s += x * x;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Second pass (one block): total = sqrt(sum of the partials) and the clipping factor
// scale = min(1, max_norm / (total + 1e-6)), or 1 when total is not finite.
extern "C" __global__ void clip_factor(
        const T* partial, const int parts, const T max_norm, T* total, T* scale) {
    __shared__ T shared[33];
    T s = 0;
    for (int j = threadIdx.x; j < parts; j += blockDim.x) s += partial[j];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
        const T t = sqrt_t(s);
        total[0] = t;
        const T f = max_norm / (t + T(1e-6));
        const bool finite = (t - t) == T(0);          // false for inf and nan
        scale[0] = finite ? (f < T(1) ? f : T(1)) : T(1);
    }
}

// Every element of every array times scale[0] (a device scalar: no host read).
extern "C" __global__ void scale_all(
        const long long* ptrs, const long long* starts, const int count, const T* scale) {
    const long long n = starts[count];
    const T f = scale[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int k = owner(starts, count, i);
        T* p = reinterpret_cast<T*>(ptrs[k]);
        p[i - starts[k]] *= f;
    }
}

// Softmax backward of one row per block, all contiguous (rows, width):
//   dx = p * (g - sum_j g_j p_j).   dx may alias g (same-index read before write).
extern "C" __global__ void softmax_backward(
        const T* p, const T* g, T* dx, const int width) {
    __shared__ T shared[33];
    const long long row = blockIdx.x;
    const T* pr = p + row * width;
    const T* gr = g + row * width;
    T s = 0;
    for (int j = threadIdx.x; j < width; j += blockDim.x) s += gr[j] * pr[j];
    const T dot = block_sum(s, shared);
    T* dr = dx + row * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) dr[j] = pr[j] * (gr[j] - dot);
}
"""

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


@functools.cache
def _row_module(dtype):
    """The row kernels compiled for ``dtype`` (np.dtype of float32 or float64).

    Compiled without fused multiply-adds (``--fmad=false``) so that each kernel rounds as the
    NumPy reference does: with contraction, ``g * w - mean(g * w)`` on a row of width 1 becomes
    fma(g, w, -mean), the product's rounding error, which rstd = 1/sqrt(eps) then scales to
    6e-5 where the reference gives exactly 0. The kernels are memory-bound; the cost is nil.
    """
    return _cupy().RawModule(code=row_source(dtype), options=("--fmad=false",))


def row_source(dtype):
    """The CUDA source of the row and multi-tensor kernels for ``dtype`` (T is its C type)."""
    return f"typedef {_CTYPES[np.dtype(dtype)]} T;\n" + _ROW_SOURCE


@functools.cache
def _row_kernel_cached(name, dtype):
    return _row_module(dtype).get_function(name)


def _row_kernel(name, dtype):
    """The compiled row kernel ``name`` for ``dtype``."""
    return _row_kernel_cached(name, np.dtype(dtype))


def _block(width):
    """Threads per block for rows of ``width``: a multiple of 32, from 32 to _MAX_BLOCK."""
    return min(_MAX_BLOCK, 32 * max(1, -(-width // 32)))


def _rows(x):
    """(number of rows, elements between row starts) of ``x`` (..., D) read as rows of its last
    axis, or None when the rows are not evenly spaced with unit stride inside a row."""
    item = x.itemsize
    d = x.shape[-1]
    n = x.size // d if d else 0
    if d > 1 and x.strides[-1] != item:
        return None
    if n <= 1:
        return n, d
    lead = [(s, st) for s, st in zip(x.shape[:-1], x.strides[:-1]) if s != 1]
    step = lead[-1][1]
    for (s_outer, st_outer), (s_inner, st_inner) in itertools.pairwise(lead):
        if st_outer != st_inner * s_inner:
            return None
    if step % item or step < d * item:
        return None
    return n, step // item


def _contiguous_rows(x):
    """x itself if its rows are C-contiguous, else a C-contiguous copy."""
    return x if x.flags.c_contiguous else _cupy().ascontiguousarray(x)


def _dense_order(x):
    """The axis order in which ``x`` is C-contiguous with its rows (last axis) innermost, when it
    is not C order already (a token-major (B, S, C) array: (1, 0, 2)); None otherwise. The row
    kernels then run on ``x.transpose(order)``, and their outputs are laid out like ``x``."""
    if x.ndim < 3 or x.flags.c_contiguous:
        return None
    order = memory_order(x)
    if order[-1] != x.ndim - 1 or not x.transpose(order).flags.c_contiguous:
        return None
    return order


def layer_norm_forward(x, weight, bias, eps):
    """LayerNorm over the last axis of ``x`` (..., D): ``(y, xhat, rstd)``.

    y = xhat * weight + bias with xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps), as in
    norm.py. ``weight`` / ``bias`` (D,) may be None (1 and 0). y and xhat have x's shape,
    rstd has shape x.shape[:-1]. x may be a view with evenly spaced rows (e.g. ``z[..., e:]``),
    read in place into C-order outputs, or contiguous in another order of its leading axes
    (token-major (B, S, C)), read in place into outputs laid out like x.
    """
    return _layer_norm_forward(x, weight, bias, eps, affine=True)


def layer_norm_normalize(x, eps):
    """The LayerNorm statistics alone: ``(xhat, rstd)`` (what the SGU saves; it never needs y)."""
    _, xhat, rstd = _layer_norm_forward(x, None, None, eps, affine=False)
    return xhat, rstd


def _layer_norm_forward(x, weight, bias, eps, affine):
    cp = _cupy()
    order = _dense_order(x)
    if order is not None:                         # rows in another order (token-major): read in place
        inv = inverse(order)
        y, xhat, rstd = _layer_norm_forward(x.transpose(order), weight, bias, eps, affine)
        return (None if y is None else y.transpose(inv)), xhat.transpose(inv), rstd.transpose(inv[:-1])
    _check("layer_norm_forward", x, weight, bias)
    d = x.shape[-1]
    layout = _rows(x)
    if layout is None:
        x = _contiguous_rows(x)
        layout = _rows(x)
    n, stride = layout
    xhat = cp.empty(x.shape, dtype=x.dtype)
    rstd = cp.empty(x.shape[:-1], dtype=x.dtype)
    y = cp.empty(x.shape, dtype=x.dtype) if affine else xhat  # not written when affine is off
    if affine:
        weight = cp.ones(d, dtype=x.dtype) if weight is None else _contiguous_rows(weight)
        bias = cp.zeros(d, dtype=x.dtype) if bias is None else _contiguous_rows(bias)
    else:
        weight = bias = xhat  # never read
    if n and d:
        _row_kernel("layer_norm_forward", x.dtype)(
            (n,), (_block(d),),
            (x, np.int64(stride), weight, bias, y, xhat, rstd, np.int32(d), x.dtype.type(eps),
             np.int32(1 if affine else 0)),
        )
    return (y if affine else None), xhat, rstd


_CHUNK_BLOCKS = 1024
"""About this many thread blocks share the first pass of ``layer_norm_param_grads`` (several per
SM on any current GPU), each over a chunk of at least 32 rows."""


def layer_norm_param_grads(g, xhat):
    """``(dweight, dbias)`` = column sums of ``g * xhat`` and of ``g``, both (rows, D) C-contiguous.

    Two launches whatever the size: partial sums over chunks of rows, then the sum of the chunks
    (see the kernels). A column reduction over axis 0 through CuPy's ``sum`` or a
    ReductionKernel gives each column to one thread block, leaving most of the GPU idle for
    D = 256 columns of 8192+ rows; here every SM has blocks.
    """
    cp = _cupy()
    rows, d = g.shape
    out = cp.empty((2, d), dtype=g.dtype)
    if rows == 0 or d == 0:
        out[...] = 0
        return out[0], out[1]
    col_blocks = -(-d // 32)
    rows_per_chunk = max(32, -(-rows * col_blocks // _CHUNK_BLOCKS))
    chunks = -(-rows // rows_per_chunk)
    partial = cp.empty((2, chunks, d), dtype=g.dtype)
    _row_kernel("layer_norm_param_partials", g.dtype)(
        (col_blocks, chunks), (32, 8),
        (g, xhat, partial, np.int64(rows), np.int32(d), np.int64(rows_per_chunk)))
    _row_kernel("sum_chunks", g.dtype)(
        (-(-2 * d // 256),), (256,), (partial, out, np.int32(2), np.int32(chunks), np.int32(d)))
    return out[0], out[1]


def layer_norm_backward(g, xhat, rstd, weight, out=None, need_dx=True, need_dweight=True, need_dbias=True):
    """LayerNorm backward: ``(dx, dweight, dbias)`` from g = dL/dy, the saved xhat and rstd.

    dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) with gw = g * weight (weight None
    means 1), dweight = sum over rows of g * xhat, dbias = sum over rows of g (see norm.py).
    ``out``: where to write dx (any array of x's shape with evenly spaced rows, e.g. a slice
    ``dz[..., e:]`` of a larger gradient); a new array otherwise, laid out like xhat (a
    token-major xhat is read, and dx written, in its memory order). A gradient that is not asked
    for (``need_*`` False) is returned as None and not computed.
    """
    cp = _cupy()
    _check("layer_norm_backward", g, xhat, rstd, weight)
    order = _dense_order(xhat)
    if order is not None:                         # xhat token-major: work in its memory order
        inv = inverse(order)
        dx, dweight, dbias = layer_norm_backward(
            g.transpose(order), xhat.transpose(order), rstd.transpose(order[:-1]), weight,
            out=None if out is None else out.transpose(order), need_dx=need_dx,
            need_dweight=need_dweight, need_dbias=need_dbias)
        if dx is not None:
            dx = out if out is not None else dx.transpose(inv)
        return dx, dweight, dbias
    d = xhat.shape[-1]
    g, xhat = _contiguous_rows(g), _contiguous_rows(xhat)
    dweight = dbias = None
    if need_dweight or need_dbias:
        dweight, dbias = layer_norm_param_grads(g.reshape(-1, d), xhat.reshape(-1, d))
        dweight, dbias = (dweight if need_dweight else None), (dbias if need_dbias else None)
    dx = None
    if need_dx:
        dx = cp.empty(xhat.shape, dtype=xhat.dtype) if out is None else out
        layout = _rows(dx)
        target = dx if layout is not None else cp.empty(xhat.shape, dtype=xhat.dtype)
        n, stride = _rows(target)
        w = cp.ones(d, dtype=xhat.dtype) if weight is None else _contiguous_rows(weight)
        if n and d:
            _row_kernel("layer_norm_backward", xhat.dtype)(
                (n,), (_block(d),),
                (g, xhat, _contiguous_rows(rstd), w, target, np.int64(stride), np.int32(d)),
            )
        if target is not dx:  # an out= whose rows are not evenly spaced: copy in
            dx[...] = target
    return dx, dweight, dbias


def softmax_backward(p, g, out=None):
    """Softmax backward along the last axis: ``p * (g - rowsum(g * p))`` (p is softmax's output).

    ``out`` may be ``g`` itself (the attention backward updates dL/dP in place).
    """
    cp = _cupy()
    _check("softmax_backward", p, g)
    d = p.shape[-1]
    p, g = _contiguous_rows(p), _contiguous_rows(g)
    if out is None or not out.flags.c_contiguous:
        dx = cp.empty(p.shape, dtype=p.dtype)
    else:
        dx = out
    n = p.size // d if d else 0
    if n and d:
        _row_kernel("softmax_backward", p.dtype)((n,), (_block(d),), (p, g, dx, np.int32(d)))
    if out is not None and dx is not out:
        out[...] = dx
        return out
    return dx


# ============================================================================ multi-tensor
# The optimizer and gradient clipping touch every parameter; written per parameter, that is a
# few launches each (~100 parameters in a CIFAR Mixer). These functions do it in one launch over
# all of them, through a table of the arrays' device addresses (see the kernels).
_GRID = 1024          # blocks of the grid-stride kernels (several per SM on any current GPU)
_tables = {}          # (addresses, sizes) -> (device table of addresses, device offsets)
_MAX_TABLES = 8


def multi_tensor_ok(arrays) -> bool:
    """Whether the multi-tensor kernels take ``arrays``: CuPy arrays of one float dtype, each
    C-contiguous, with working kernels (else the caller keeps its per-array code)."""
    return (bool(arrays) and all(a.flags.c_contiguous for a in arrays) and applies(*arrays))


def pointer_table(arrays):
    """(addresses, offsets) of ``arrays`` on the device, int64: the kernels' table. Uploaded
    when the set of addresses is new; a training loop meets the same few sets again and again
    (the parameters; gradients reusing the memory pool's blocks), so they are cached."""
    cp = _cupy()
    key = tuple((a.data.ptr, a.size) for a in arrays)
    table = _tables.get(key)
    if table is None:
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=offsets[1:])
        table = (cp.asarray(np.array([p for p, _ in key], dtype=np.int64)), cp.asarray(offsets))
        if len(_tables) >= _MAX_TABLES:
            _tables.pop(next(iter(_tables)))
        _tables[key] = table
    return table


def _launch(name, dtype, total, args):
    blocks = max(1, min(_GRID, -(-total // 256)))
    _row_kernel(name, dtype)((blocks,), (256,), args)


def adam_step(params, g, m, v, *, b1, b2, eps_c, step_size, decay):
    """One Adam(W) step over a whole group in one launch (``fast/optim.py`` gives the scalars).

    params: the parameters' arrays; g, m, v: flat (sum of sizes,) gradient and moments, in
    the parameters' order. m and v are updated in place, each parameter p becomes
    ``p * decay - step_size * m / (sqrt(v) + eps_c)`` (decay 1 for Adam).
    """
    ptrs, starts = pointer_table(params)
    dt = g.dtype.type
    _launch("adam_step", g.dtype, g.size,
            (g, m, v, ptrs, starts, np.int32(len(params)), dt(b1), dt(1.0 - b1), dt(b2), dt(1.0 - b2),
             dt(eps_c), dt(step_size), dt(decay)))


def clip_by_norm(grads, max_norm):
    """The joint L2 norm of ``grads`` and its clipping factor, as 0-d device arrays ``(total,
    scale)`` with scale = min(1, max_norm / (total + 1e-6)) (1 when total is not finite); the
    gradients are not changed (``scale_all`` does that). Two launches, nothing read back."""
    cp = _cupy()
    ptrs, starts = pointer_table(grads)
    dtype = grads[0].dtype
    total_size = sum(a.size for a in grads)
    parts = max(1, min(_GRID, -(-total_size // 256)))
    partial = cp.empty(parts, dtype=dtype)
    _row_kernel("sum_squares_partials", dtype)((parts,), (256,), (ptrs, starts, np.int32(len(grads)), partial))
    out = cp.empty(2, dtype=dtype)
    _row_kernel("clip_factor", dtype)((1,), (256,), (partial, np.int32(parts), dtype.type(max_norm), out, out[1:]))
    return out[0], out[1]


def scale_all(arrays, scale):
    """Every array times the 0-d device array ``scale``, in place, in one launch."""
    ptrs, starts = pointer_table(arrays)
    _launch("scale_all", arrays[0].dtype, sum(a.size for a in arrays),
            (ptrs, starts, np.int32(len(arrays)), scale))


# ============================================================================ SGU gate
# Split variant of gating.py: F = (W_eff @ xhat) * gamma + shift (+ A),  out = z1 * F, where
# shift = rowsum(W_eff)[:, None] * beta + bias[:, None] is an (S, e) matrix. Backward:
# dL/dz1 = G * F and G_F = G * z1. ``f`` is an output parameter that the kernel also reads
# (CuPy binds output parameters by reference), so F overwrites W_eff @ xhat in place.
@functools.cache
def _sgu_forward_kernel(with_residual):
    cp = _cupy()
    if with_residual:
        return cp.ElementwiseKernel("T gamma, T shift, T a, T z1", "T f, T out",
                                    "f = f * gamma + shift + a; out = z1 * f;", "tinymlp_sgu_gate_residual")
    return cp.ElementwiseKernel("T gamma, T shift, T z1", "T f, T out",
                                "f = f * gamma + shift; out = z1 * f;", "tinymlp_sgu_gate")


@functools.cache
def _sgu_backward_kernel():
    return _cupy().ElementwiseKernel("T g, T f, T z1", "T dz1, T gf", "dz1 = g * f; gf = g * z1;",
                                     "tinymlp_sgu_gate_backward")


def sgu_gate_forward(f, gamma, shift, z1, gate_residual=None, out=None):
    """In one pass: ``f <- f * gamma + shift (+ gate_residual)`` (in place) and ``out = z1 * f``.

    f: (B, S, e) holding W_eff @ xhat on entry and F on return; gamma (e,); shift (S, e);
    z1 (B, S, e), may be a view (the first half of z); gate_residual (B, S, e) or None.
    Returns ``out`` (B, S, e): the array given (any layout: the kernel writes through its
    strides), or a new one.
    """
    cp = _cupy()
    _check("sgu_gate_forward", f, gamma, shift, z1, gate_residual, out)
    if out is None:
        out = cp.empty(f.shape, dtype=f.dtype)
    if gate_residual is None:
        _sgu_forward_kernel(False)(gamma, shift, z1, f, out)
    else:
        _sgu_forward_kernel(True)(gamma, shift, gate_residual, z1, f, out)
    return out


def sgu_gate_backward(g, f, z1, dz1=None):
    """In one pass: ``dz1 = g * f`` and ``gF = g * z1``; returns ``(dz1, gF)``.

    ``dz1``: where to write dL/dz1 (e.g. the view ``dz[..., :e]`` of the whole gradient); a new
    array when None.
    """
    cp = _cupy()
    _check("sgu_gate_backward", g, f, z1, dz1)
    if dz1 is None:
        dz1 = cp.empty(f.shape, dtype=f.dtype)
    gf = cp.empty(f.shape, dtype=f.dtype)
    _sgu_backward_kernel()(g, f, z1, dz1, gf)
    return dz1, gf

"""The optimizer and gradient clipping on CUDA: one launch over every parameter.

Written per parameter, an Adam step or a clip is a few launches each (~100 parameters in a
CIFAR Mixer). These kernels do it in one launch over all of them, through a table of the
arrays' device addresses (see the kernels): Adam(W) in one kernel, in the operation order of
the flat array code in ``fast/optim.py`` (so that both give the same numbers), and clipping in
three launches (the sum of squares in two passes, then every gradient scaled by the factor,
which stays on the device: nothing is read back).
"""

from __future__ import annotations

import math

import numpy as np

from .. import cuda, scalars

__all__ = ["ADAM_SCALARS", "SOURCE", "adam_scalars", "adam_step", "adam_values", "advance_adam", "clip_by_norm",
           "gather", "multi_tensor_ok", "pointer_table", "scale_all"]

SOURCE = r"""// ---- Multi-tensor kernels: one launch over many parameters (or gradients). ptrs[k] is the
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
// in the operation order of fast/optim.py's array code (see adam_direction there). The step's
// scalars are read from device memory, s = (b1, 1 - b1, b2, 1 - b2, eps_c, step_size, decay),
// uploaded before each step (fast/scalars.py): a replayed CUDA graph reads that step's values.
extern "C" __global__ void adam_step(
        const T* g, T* m, T* v, const long long* ptrs, const long long* starts, const int count,
        const T* s) {
    const T b1 = s[0], one_minus_b1 = s[1], b2 = s[2], one_minus_b2 = s[3], eps_c = s[4];
    const T step_size = s[5], decay = s[6];
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

// Every array copied into its slice of the flat out (what a concatenate does, without the
// table of addresses CuPy uploads for one: this table is cached).
extern "C" __global__ void gather(
        const long long* ptrs, const long long* starts, const int count, T* out) {
    const long long n = starts[count];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int k = owner(starts, count, i);
        out[i] = reinterpret_cast<const T*>(ptrs[k])[i - starts[k]];
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

"""

_tables = {}          # (addresses, sizes) -> (device table of addresses, device offsets)
_MAX_TABLES = 8


def multi_tensor_ok(arrays) -> bool:
    """Whether the multi-tensor kernels take ``arrays``: CuPy arrays of one float dtype, each
    C-contiguous, with working kernels (else the caller keeps its per-array code)."""
    return (bool(arrays) and all(a.flags.c_contiguous for a in arrays) and cuda.applies(*arrays))


def pointer_table(arrays):
    """(addresses, offsets) of ``arrays`` on the device, int64: the kernels' table. Uploaded
    when the set of addresses is new; a training loop meets the same few sets again and again
    (the parameters; gradients reusing the memory pool's blocks), so they are cached. During
    capture a cached table is held for the graph, and a new one (the addresses of arrays the
    capture made) is uploaded before the graph's first launch (``fast/scalars.py``), not cached."""
    cp = cuda.cupy()
    key = tuple((a.data.ptr, a.size) for a in arrays)
    table = _tables.get(key)
    if table is not None:
        scalars.hold(*table)
        return table
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    addresses = np.array([p for p, _ in key], dtype=np.int64)
    if cuda.capturing():
        table = (cp.empty(len(arrays), dtype=np.int64), cp.empty(len(arrays) + 1, dtype=np.int64))
        scalars.current().at_first_launch(lambda: (table[0].set(addresses), table[1].set(offsets)))
        return table
    table = (cp.asarray(addresses), cp.asarray(offsets))
    if len(_tables) >= _MAX_TABLES:
        _tables.pop(next(iter(_tables)))
    _tables[key] = table
    return table


ADAM_SCALARS = ("b1", "1 - b1", "b2", "1 - b2", "eps_c", "step_size", "decay")
"""What ``adam_step`` reads from its scalars buffer, in order."""


def adam_scalars(*, b1, b2, eps_c, step_size, decay):
    """The values of ``ADAM_SCALARS`` for one step (Python floats, rounded to the dtype on upload)."""
    return (b1, 1.0 - b1, b2, 1.0 - b2, eps_c, step_size, decay)


def adam_values(group, t, decay):
    """Adam(W)'s scalars at step ``t`` for a param group, computed as the flat array code computes
    them (``fast/optim.py``, ``adam_direction``)."""
    b1, b2 = (float(b) for b in group["betas"])
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    return adam_scalars(b1=b1, b2=b2, eps_c=float(group["eps"]) * root_c2,
                        step_size=float(group["lr"]) * root_c2 / c1, decay=decay)


def advance_adam(optimizer, gi, step_scalars):
    """The host half of a captured Adam(W) group step, before each replay: the step's scalars
    from the group's hyperparameters now (a schedule's lr) uploaded into ``step_scalars``
    (``scalars.StepScalars``), the group's step counts advanced."""
    group, states = optimizer.param_groups[gi], optimizer.state[gi]
    lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
    decay = 1.0 - lr * wd if wd and optimizer.decoupled_weight_decay else 1.0
    step_scalars.upload(adam_values(group, states[0]["step"] + 1, decay))
    for state in states:
        state["step"] += 1


def adam_step(params, g, m, v, scalars):
    """One Adam(W) step over a whole group in one launch.

    params: the parameters' arrays; g, m, v: flat (sum of sizes,) gradient and moments, in
    the parameters' order; scalars: a device array of the step's ``ADAM_SCALARS`` values
    (``adam_scalars``, uploaded by ``fast/scalars.py``). m and v are updated in place, each
    parameter p becomes ``p * decay - step_size * m / (sqrt(v) + eps_c)`` (decay 1 for Adam).
    """
    ptrs, starts = pointer_table(params)
    cuda.launch(SOURCE, "adam_step", g.dtype, g.size, (g, m, v, ptrs, starts, np.int32(len(params)), scalars))


def gather(arrays, out):
    """``out[...] = concatenate([a.ravel() for a in arrays])`` in one launch (C-contiguous arrays)."""
    ptrs, starts = pointer_table(arrays)
    cuda.launch(SOURCE, "gather", out.dtype, out.size, (ptrs, starts, np.int32(len(arrays)), out))


def clip_by_norm(grads, max_norm):
    """The joint L2 norm of ``grads`` and its clipping factor, as 0-d device arrays ``(total,
    scale)`` with scale = min(1, max_norm / (total + 1e-6)) (1 when total is not finite); the
    gradients are not changed (``scale_all`` does that). Two launches, nothing read back."""
    cp = cuda.cupy()
    ptrs, starts = pointer_table(grads)
    dtype = grads[0].dtype
    total_size = sum(a.size for a in grads)
    parts = max(1, min(cuda.GRID, -(-total_size // 256)))
    partial = cp.empty(parts, dtype=dtype)
    cuda.kernel(SOURCE, "sum_squares_partials", dtype)(
        (parts,), (256,), (ptrs, starts, np.int32(len(grads)), partial))
    out = cp.empty(2, dtype=dtype)
    cuda.kernel(SOURCE, "clip_factor", dtype)(
        (1,), (256,), (partial, np.int32(parts), dtype.type(max_norm), out, out[1:]))
    return out[0], out[1]


def scale_all(arrays, scale):
    """Every array times the 0-d device array ``scale``, in place, in one launch."""
    ptrs, starts = pointer_table(arrays)
    cuda.launch(SOURCE, "scale_all", arrays[0].dtype, sum(a.size for a in arrays),
                (ptrs, starts, np.int32(len(arrays)), scale))


@cuda.self_test
def _self_test(dtype):
    """One AdamW step over two parameters, and clipping them, against NumPy."""
    cp = cuda.cupy()
    rng = np.random.default_rng(0)
    shapes = [(3,), (5, 7)]
    p0 = [rng.standard_normal(s) for s in shapes]
    g, m, v = (rng.standard_normal(38) for _ in range(3))
    v = np.abs(v)
    params = [cp.asarray(a, dtype=dtype) for a in p0]
    m_dev, v_dev = cp.asarray(m, dtype=dtype), cp.asarray(v, dtype=dtype)
    scalars = cp.asarray(adam_scalars(b1=0.9, b2=0.999, eps_c=1e-8, step_size=1e-2, decay=0.99), dtype=dtype)
    adam_step(params, cp.asarray(g, dtype=dtype), m_dev, v_dev, scalars)
    gathered = cp.empty(38, dtype=dtype)
    gather(params, gathered)
    m1, v1 = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    flat = np.concatenate([a.ravel() for a in p0]) * 0.99 - 1e-2 * m1 / (np.sqrt(v1) + 1e-8)
    grads = [cp.asarray(a, dtype=dtype) for a in p0]
    total, scale = clip_by_norm(grads, 1.0)
    scale_all(grads, scale)
    norm = np.sqrt(sum((a * a).sum() for a in p0))
    return [("AdamW's first moment", m_dev, m1), ("AdamW's second moment", v_dev, v1),
            ("AdamW's update", gathered, flat),
            ("the gradients' norm", total, np.array(norm)),
            ("the clipped gradients", cp.concatenate([a.ravel() for a in grads]),
             np.concatenate([a.ravel() for a in p0]) * min(1.0, 1.0 / (norm + 1e-6)))]

"""On a GPU: the capturable products of ``tinymlp/fast/cublas.py`` against ``cupy.matmul``.

    PYTHONPATH=. python benchmarks/gpu_cublas_check.py

What the CuPy stand-in cannot show, for each layout the training step meets (2-D, transposed
operands, batched, a weight broadcast over the batch, token-major views) in float32 and float64:

1. the binding loads CuPy's libcublas and agrees with ``cupy.matmul`` (max |difference|, and
   whether the two are bit-equal: with the same compute type cuBLAS usually picks the same kernel);
2. TF32 is off: a float32 product agrees with float64 to float32's rounding, not TF32's (1e-3);
3. a product captured into a CUDA graph (a private memory pool, a stream of its own) replays on
   new inputs and equals the eager product, where ``cupy.matmul`` is refused during capture;
4. the host time per call, eager, beside ``cupy.matmul``'s (what the binding saves without graphs).
Exits 1 if a check fails.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def main():
    import cupy as cp

    from tinymlp.fast import cublas

    rng = np.random.default_rng(0)
    failures = []
    layouts = {
        "2-D (128, 256) @ (256, 512)": lambda r: (r((128, 256)), r((256, 512))),
        "x @ W.T (a Linear)": lambda r: (r((4096, 256)), r((1024, 256)).T),
        "a transposed (a weight gradient)": lambda r: (r((4096, 256)).T, r((4096, 512))),
        "batched (64, 64, 32) @ (64, 32, 64)": lambda r: (r((64, 64, 32)), r((64, 32, 64))),
        "weight over a batch (128, 64, 256) @ (256, 512)": lambda r: (r((128, 64, 256)), r((256, 512))),
        "token-major view (64, 128, 256).swapaxes(0, 1) @ (256, 256)":
            lambda r: (r((64, 128, 256)).swapaxes(0, 1), r((256, 256))),
    }
    print(f"libcublas: {cublas.library()._name}")
    for dtype in (np.float32, np.float64):
        for name, make in layouts.items():
            a, b = make(lambda s, dtype=dtype: cp.asarray(rng.standard_normal(s).astype(dtype)))
            ours, theirs = cublas.matmul(a, b), cp.matmul(a, b)
            diff = float(cp.abs(ours - theirs).max())
            equal = bool((ours == theirs).all())
            exact = cp.matmul(a.astype(np.float64), b.astype(np.float64))
            error = float((cp.abs(ours - exact) / (cp.abs(exact) + 1)).max())
            tol = 1e-4 if dtype == np.float32 else 1e-12     # TF32 would give ~5e-4
            ok = error < tol
            print(f"{np.dtype(dtype).name:8} {name:58} max|ours - cupy| {diff:.2e} bit-equal {equal!s:5} "
                  f"rel. error vs float64 {error:.1e} {'ok' if ok else 'FAILED (TF32?)'}")
            if not ok:
                failures.append(f"{name} {np.dtype(dtype).name}")
    # capture
    a = cp.asarray(rng.standard_normal((128, 64, 256)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((512, 256)).astype(np.float32))
    cublas.matmul(a, w.T)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        try:
            try:
                cp.matmul(a, w.T)
                refused = "NOT refused"
            except NotImplementedError:
                refused = "refused"
            y = cublas.matmul(a, w.T)
        finally:
            graph = stream.end_capture()
    print(f"capture: cupy.matmul {refused} during capture (as expected: refused)")
    for k in range(3):
        a[...] = cp.asarray(rng.standard_normal(a.shape).astype(np.float32))
        cp.cuda.Device().synchronize()
        with stream:
            graph.launch()
        stream.synchronize()
        diff = float(cp.abs(y - cublas.matmul(a, w.T)).max())
        print(f"capture: replay {k}: max|replayed - eager| {diff:.2e}")
        if diff != 0:
            failures.append(f"replay {k}")
    # host time per call
    x = cp.asarray(rng.standard_normal((128, 256), np.float32))
    wt = cp.asarray(rng.standard_normal((256, 256), np.float32))
    for label, fn in (("cupy.matmul", cp.matmul), ("cublas.matmul", cublas.matmul)):
        for _ in range(50):
            fn(x, wt)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn(x, wt)
        host = (time.perf_counter() - t0) / 2000 * 1e6
        cp.cuda.Device().synchronize()
        print(f"host time per call, (128, 256) @ (256, 256) float32: {label:14} {host:6.1f} us")
    print("cublas check:", "ok" if not failures else f"FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

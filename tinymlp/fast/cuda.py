"""CuPy for the fast tier's CUDA kernels: loaded on first use, which arrays they take, a
self-test per dtype, and the one place where they are compiled and launched.

The kernels themselves, with their Python launchers, are in ``fast/kernels/<topic>_cuda.py``
(one file per topic: activation, norm, attention, gating, optim); the fast ops of
``fast/<topic>.py`` call them on CUDA. This module holds what they share:

- ``cupy()``: CuPy, imported on first use, never when the package is imported;
- ``supported(*arrays)``: float32 or float64 arrays of one dtype, what every kernel takes
  (nothing is cast); ``applies(*arrays)``: whether an op should call the kernels at all;
- the self-test: a kernel that does not compile or run (a CuPy without the CUDA headers, an
  unusual GPU), or computes wrong numbers, costs speed, never the run or the result. The first
  time ``applies`` meets a dtype (for float32: when CUDA is first made ready), every kernel
  registered with ``self_test`` is compiled and run on small inputs and its numbers compared
  with NumPy's; if one fails, a single RuntimeWarning says which and why, and the fast ops take
  their array code on CUDA for that dtype from then on;
- ``kernel(source, name, dtype)`` and ``elementwise(...)``: every raw kernel and every
  elementwise kernel of the fast tier is compiled through these two functions, once per dtype,
  and cached (CuPy also keeps the binaries in ``~/.cupy/kernel_cache``);
- the device functions every kernel source starts with are in ``kernels/prelude_cuda.py``;
  helpers for
  reading an array as rows (``rows``, ``dense_order``, ``block``).

The row kernels (one thread block per row) use a block of 32..256 threads, a multiple of the
warp size: each thread strides over the row, then ``block_sum`` adds the per-thread partial
sums with warp shuffles and one shared-memory exchange. A row narrower than the block simply
leaves threads idle (width 1 is one active thread), so any width is correct.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings

import numpy as np

from ..backend import add_cuda_check, array_module
from .kernels.prelude_cuda import PRELUDE
from .launcher import Launcher, parameters
from .layout import memory_order

__all__ = ["applies", "block", "capturing", "check", "compile_kernel", "contiguous_rows", "cupy", "dense_order",
           "elementwise", "kernel", "kernel_failure", "kernels_work", "launch", "rows", "self_test", "source",
           "supported"]

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
MAX_BLOCK = 256
GRID = 1024
"""Blocks of the grid-stride kernels (several per SM on any current GPU)."""


@functools.cache
def cupy():
    import cupy  # deliberately lazy: the fast tier must import without CuPy

    return cupy


def supported(*arrays) -> bool:
    """True when every array is float32 or float64 and all share one dtype (what the kernels take;
    None entries are skipped)."""
    dtypes = {np.dtype(a.dtype) for a in arrays if a is not None}
    return len(dtypes) == 1 and dtypes.pop() in FLOATS


def check(name, *arrays):
    """A TypeError naming the launcher ``name`` unless ``supported(*arrays)``."""
    if not supported(*arrays):
        raise TypeError(f"{name}: the CUDA kernel takes float32 or float64 arrays of one dtype, got "
                        + ", ".join(str(a.dtype) for a in arrays if a is not None))


def applies(*arrays) -> bool:
    """Whether an op should call the kernels: the first array is a CuPy array, all of them are
    ``supported`` (None entries are skipped) and the kernels compiled and ran for their dtype
    (``kernels_work``). NumPy arrays give False."""
    return (array_module(arrays[0]).__name__ == "cupy" and supported(*arrays)
            and kernels_work(arrays[0].dtype))


# --------------------------------------------------------------------------- the self-test
_kernel_state = {}   # np.dtype -> True (the kernels work) or the one-line reason they do not
_self_tests = []


def self_test(test):
    """Register ``test(dtype)``: it launches a topic's kernels on small inputs of ``dtype`` and
    returns what they computed beside what they should have, ``[(what, device array, NumPy
    expectation), ...]``, for ``kernels_work`` to compare; returns ``test``."""
    _self_tests.append(test)
    _kernel_state.clear()
    return test


def kernels_work(dtype) -> bool:
    """Compile and run every registered kernel once for ``dtype`` on small inputs and compare
    its numbers with NumPy's (the first time only); False, after one RuntimeWarning, when one of
    them fails to compile or run or computes something else: the fast ops then use their array
    code on CUDA (correct, slower). The comparison reads a few numbers back, once per dtype."""
    dtype = np.dtype(dtype)
    if dtype not in _kernel_state:
        try:
            checks = [check for test in _self_tests for check in (test(dtype) or ())]
            with _reads_allowed():
                wrong = [what for what, got, want in checks if not _agrees(got.get(), want, dtype)]
            if wrong:
                raise ArithmeticError(f"{', '.join(wrong)} computed other numbers than NumPy")
            _kernel_state[dtype] = True
        except Exception as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            reason = f"{type(exc).__name__}{': ' + detail if detail else ''}"
            _kernel_state[dtype] = reason
            warnings.warn(
                f"tinymlp's CUDA kernels for {dtype} failed to compile or run, or computed wrong numbers "
                f"({reason}); the fast tier uses its array "
                f"code on CUDA instead (same results, slower); check the CUDA install with: "
                f"python -m tinymlp doctor", RuntimeWarning, stacklevel=2)
    return _kernel_state[dtype] is True


def _agrees(got, want, dtype):
    """Within the rounding of ``dtype`` of the float64 expectation ``want``."""
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=rtol * scale))


def _reads_allowed():
    """The self-test's reads, allowed inside ``cupyx.allow_synchronize(False)`` (a training loop
    may start in one; this runs once per process and dtype). CuPy has deprecated that detector
    since version 10 (it warns at every use): it is used only where this CuPy still has it."""
    try:
        import cupyx
    except ImportError:
        return contextlib.nullcontext()
    allow = getattr(cupyx, "allow_synchronize", None)
    if allow is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")                 # CuPy warns that allow_synchronize is deprecated
    stack.enter_context(allow(True))
    return stack


def capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph (``Stream.begin_capture``):
    then nothing may be uploaded or read back, and values the host computes each step must reach
    the kernels through device memory (``fast/scalars.py``)."""
    stream = cupy().cuda.get_current_stream()
    return stream.ptr not in (0, 1) and stream.is_capturing()


def _ready(cp):
    """``get_cupy``'s readiness check: the float32 kernels compiled, run and compared before
    the first step (nothing to report when they fail: the array code computes instead)."""
    kernels_work(np.float32)


add_cuda_check("the fast tier's CUDA kernels", _ready)


def kernel_failure(dtype):
    """Why the kernels for ``dtype`` do not run (None when they do or were not tried yet)."""
    state = _kernel_state.get(np.dtype(dtype))
    return None if state is None or state is True else state


# --------------------------------------------------------------------------- compiling
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def source(topic_source, dtype):
    """The CUDA source of a topic's raw kernels for ``dtype`` (T is its C type)."""
    return f"typedef {_CTYPES[np.dtype(dtype)]} T;\n" + PRELUDE + topic_source


@functools.cache
def _module(topic_source, dtype):
    """A topic's raw kernels compiled for ``dtype`` (np.dtype of float32 or float64).

    Compiled without fused multiply-adds (``--fmad=false``) so that each kernel rounds as the
    NumPy reference does: with contraction, ``g * w - mean(g * w)`` on a row of width 1 becomes
    fma(g, w, -mean), the product's rounding error, which rstd = 1/sqrt(eps) then scales to
    6e-5 where the reference gives exactly 0. The kernels are memory-bound; the cost is nil.
    """
    return cupy().RawModule(code=source(topic_source, dtype), options=("--fmad=false",))


def kernel(topic_source, name, dtype):
    """The raw kernel ``name`` of ``topic_source``, compiled for ``dtype``: call it as
    ``kernel(...)(grid, block, args)``. Each launch checks its arguments against the kernel's C
    parameters (``Launcher``)."""
    return _launcher(topic_source, name, np.dtype(dtype))


@functools.cache
def _launcher(topic_source, name, dtype):
    return Launcher(name, parameters(topic_source, name, dtype), compile_kernel(topic_source, name, dtype),
                    cupy().ndarray)


def compile_kernel(topic_source, name, dtype):
    """The compiled kernel ``name`` (a CuPy function taking ``(grid, block, args)``)."""
    return _function(topic_source, name, np.dtype(dtype))


@functools.cache
def _function(topic_source, name, dtype):
    return _module(topic_source, dtype).get_function(name)


@functools.cache
def elementwise(in_params, out_params, body, name):
    """A CuPy ``ElementwiseKernel`` (compiled per dtype on first call, by CuPy)."""
    return cupy().ElementwiseKernel(in_params, out_params, body, name)


def launch(topic_source, name, dtype, total, args):
    """Launch a grid-stride kernel over ``total`` elements: 256 threads a block, at most GRID blocks."""
    blocks = max(1, min(GRID, -(-total // 256)))
    kernel(topic_source, name, dtype)((blocks,), (256,), args)


# --------------------------------------------------------------------------- rows
def block(width):
    """Threads per block for rows of ``width``: a multiple of 32, from 32 to MAX_BLOCK."""
    return min(MAX_BLOCK, 32 * max(1, -(-width // 32)))


def rows(x):
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
    for (_, st_outer), (s_inner, st_inner) in itertools.pairwise(lead):
        if st_outer != st_inner * s_inner:
            return None
    if step % item or step < d * item:
        return None
    return n, step // item


def contiguous_rows(x):
    """x itself if its rows are C-contiguous, else a C-contiguous copy."""
    return x if x.flags.c_contiguous else cupy().ascontiguousarray(x)


def dense_order(x):
    """The axis order in which ``x`` is C-contiguous with its rows (last axis) innermost, when it
    is not C order already (a token-major (B, S, C) array: (1, 0, 2)); None otherwise. The row
    kernels then run on ``x.transpose(order)``, and their outputs are laid out like ``x``."""
    if x.ndim < 3 or x.flags.c_contiguous:
        return None
    order = memory_order(x)
    if order[-1] != x.ndim - 1 or not x.transpose(order).flags.c_contiguous:
        return None
    return order

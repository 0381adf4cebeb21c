"""Compiled CPU kernels (numba), optional: ``pip install -e ".[fast]"``.

NumPy runs one ufunc at a time, each a pass over memory on one core. The elementwise hot spots
of a training step are chains of such passes: GELU with its derivative (about 15 passes when
written as formulas, 9 in the chunked fast path), LayerNorm forward and backward (row sums, the
centred copy, the scaled copy, ...), the optimizer's update (about ten). numba compiles each
into ONE loop, run over all cores (``parallel=True``) for large arrays and on one core below
``PARALLEL_MIN`` elements, in float32 when the arrays are float32. The loops are in
``fast/kernels/<topic>_numba.py`` (activation, attention, elementwise, norm, gating, optim) and
the classes that call them beside the NumPy and CUDA ones in ``fast/<topic>.py`` (``CompiledGELU``,
``CompiledAdd``, ``CompiledSoftmax``, ``CompiledAttention``, ``CompiledLayerNorm``,
``CompiledSpatialGating``, ``CompiledFlatStep``). This module holds what
they share: numba's settings, ``jit`` and ``kernel`` (compiling and launching), and the switch.

Each compiled class subclasses the NumPy fast implementation, so ``tests/test_fast_contract.py``
checks it against the reference like any other; where a kernel does not apply (the switch off,
an integer or float16 array, rows that are not contiguous, the erf form of GELU, an ndarray
subclass: ``applies`` says) the class runs its parent's NumPy code. A kernel that fails to
compile, load from the cache or run switches the kernels off for the process, with one warning
(``fail``), and raises ``KernelFailed`` to its wrapper in fast/kernels/, which returns what it
returns where no kernel takes the arrays: the op's NumPy code computes, in forward or in the
middle of a backward (tests/test_kernel_failure.py).

Switches: ``TINYMLP_NUMBA=0`` in the environment (read at import), or ``set_enabled(False)``.
Without numba installed the fast tier registers the NumPy classes only.

Settings it needs (measured): numba's ``workqueue`` threading layer (its OpenMP layer spins
after a kernel and starves OpenBLAS; set unless ``NUMBA_THREADING_LAYER`` is set),
``error_model="numpy"`` (else division compiles to scalar code), and the compile cache: the
first use compiles for about 5 s, later processes load the cache in a fraction of that. The
cache goes to ``TINYMLP_CACHE_DIR``, else ``~/.cache/tinymlp/numba``, else the temporary
folder; if none is writable the kernels compile in every process (``describe()`` says so).
numba's cache knows a function by its name, line and signature, not by ``parallel=`` or any other
option, so ``jit`` compiles two copies of each loop, named ``<name>.serial_<digest>`` and
``<name>.parallel_<digest>`` (the digest: the other options): else a later process would load
whichever was compiled first for both, or code built with options since changed.
"""

from __future__ import annotations

import os
import tempfile
import threading
import types
import warnings
import zlib

import numpy as np

__all__ = ["PARALLEL_MIN", "KernelFailed", "applies", "available", "describe", "fail", "float32_from_bits", "inline",
           "is_enabled", "jit", "kernel", "prange", "set_enabled", "set_threads", "threads"]

PARALLEL_MIN = 1 << 18
"""Arrays with fewer elements run the serial kernel: waking the threads costs more than it gains."""

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_state = {"enabled": False, "error": None, "cache": None, "numba": None}

prange = range
"""``numba.prange`` once numba is imported: the loop that ``parallel=True`` splits over the cores."""


def float32_from_bits(bits):
    """The float32 whose bit pattern is the int32 ``bits`` (``(e + 127) << 23`` is 2^e); inside
    the kernels a numba intrinsic (one ``bitcast``, which vectorises)."""
    return np.int32(bits).view(np.float32)


def _off_by_environment():
    return os.environ.get("TINYMLP_NUMBA", "1").strip().lower() in ("0", "false", "no", "off")


def _cache_dir():
    """A writable folder for numba's compile cache, or None."""
    candidates = [os.environ.get("TINYMLP_CACHE_DIR"),
                  os.path.join(os.path.expanduser("~"), ".cache", "tinymlp", "numba"),
                  os.path.join(tempfile.gettempdir(), f"tinymlp-numba-{os.getuid() if hasattr(os, 'getuid') else 0}")]
    for path in candidates:
        if not path:
            continue
        try:
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, f".probe-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
            return path
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- compiling, launching
def _options(reduce):
    """numba's options: no fused multiply-adds contracted away from the formulas' rounding
    (``contract``), or, for the loops that sum rows, reassociation (the sums may vectorise; no
    fma: exact zeros stay zero)."""
    cache = _state["cache"] is not None
    return dict(cache=cache, error_model="numpy", nogil=True, fastmath={"reassoc"} if reduce else {"contract"})


def _twin(fn, tag):
    """A copy of ``fn`` named ``<its name>.<tag>``: numba's cache files and index keys name the
    function and the signature, not the compile options (see the module docstring)."""
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__qualname__ = f"{fn.__qualname__}.{tag}"
    twin.__module__ = fn.__module__
    return twin


def _tag(parallel, options):
    """``serial`` or ``parallel`` and a digest of the other options (the cache's own flag left out)."""
    settings = sorted((k, sorted(v) if isinstance(v, set) else v) for k, v in options.items() if k != "cache")
    return f"{'parallel' if parallel else 'serial'}_{zlib.crc32(repr(settings).encode()):08x}"


def jit(fn, reduce=False):
    """``(serial, parallel)``: ``fn`` compiled on its first call, for one core and for all of them
    (``reduce``: with the options of a loop that sums), each under its own name in the cache;
    None without numba."""
    numba = _state["numba"]
    if numba is None:
        return None
    options = _options(reduce)
    return (numba.njit(**options)(_twin(fn, _tag(False, options))),
            numba.njit(parallel=True, **options)(_twin(fn, _tag(True, options))))


def inline(fn):
    """``fn`` compiled to be inlined into the kernels that call it (``fn`` itself without numba)."""
    numba = _state["numba"]
    return fn if numba is None else numba.njit(inline="always", **_options(False))(fn)


_PARALLEL = threading.Lock()
"""numba's workqueue layer runs one parallel kernel at a time: a second one launched from another
Python thread meanwhile would abort the process, so parallel launches take this lock."""


class KernelFailed(RuntimeError):
    """A kernel did not compile, load from the cache or run: ``fail`` has switched the kernels
    off for the process and warned. The kernels' wrappers catch it and return None (or False),
    their "no kernel for these arrays", so the caller's NumPy code computes the result."""


def kernel(pair, size):
    """The kernel of ``pair`` (from ``jit``) for an array of ``size`` elements: the serial one below
    ``PARALLEL_MIN``, else the parallel one (behind the lock). Whatever it raises (numba compiles
    and types on the first call, and loads from the cache then) goes through ``fail`` and comes
    out as ``KernelFailed``: numba checks no bounds and the error model is NumPy's, so a kernel
    raises before it writes anything."""
    serial, parallel = pair

    def run(*args):
        try:
            if size < PARALLEL_MIN:
                return serial(*args)
            with _PARALLEL:
                return parallel(*args)
        except Exception as exc:  # noqa: BLE001 - numba's typing, lowering and cache errors alike
            fail(exc)
            raise KernelFailed(_state["error"]) from exc

    return run


def applies(*arrays) -> bool:
    """Whether the kernels take these arrays: the switch is on and they are plain NumPy arrays
    (no subclass) of one dtype, float32 or float64."""
    dtype = arrays[0].dtype
    return _state["enabled"] and all(type(a) is np.ndarray and a.dtype == dtype for a in arrays) and dtype in FLOATS


def fail(exc):
    """A kernel that does not compile or run: switch the kernels off, say so once per process,
    fall back to the NumPy fast path."""
    first = _state["error"] is None
    _state["error"] = f"{type(exc).__name__}: {exc}"
    if first:
        warnings.warn(f"tinymlp: the numba kernels failed ({_state['error']}); using the NumPy fast path",
                      RuntimeWarning, stacklevel=3)
    set_enabled(False)


def threads():
    """The number of threads the parallel kernels use."""
    numba = _state["numba"]
    return numba.get_num_threads() if numba is not None else 1


# --------------------------------------------------------------------------- switching
def available():
    """Whether numba could be imported and set up (then the compiled classes are registered)."""
    return _state["numba"] is not None


def is_enabled():
    return _state["enabled"]


def set_enabled(on):
    """Run the compiled kernels (True) or the NumPy fast path (False) from now on. Switching them
    on forgets an earlier failure (``fail`` warns again if one fails again)."""
    if on:
        _state["error"] = None
    _state["enabled"] = bool(on) and available()


def set_threads(n):
    """Threads of the parallel kernels (numba's ``set_num_threads``)."""
    if _state["numba"] is not None:
        _state["numba"].set_num_threads(int(n))


def describe():
    """One line: what the compiled tier does in this process."""
    numba = _state["numba"]
    if numba is None:
        if _state["error"]:
            return f"numba failed to set up ({_state['error']}): NumPy fast path"
        return "numba not installed: NumPy fast path (pip install -e \".[fast]\" for the compiled kernels)"
    if _state["error"]:
        return f"numba {numba.__version__} failed ({_state['error']}): NumPy fast path"
    if not _state["enabled"]:
        why = "TINYMLP_NUMBA=0" if _off_by_environment() else "switched off"
        return f"numba {numba.__version__} installed, {why}: NumPy fast path"
    cache = f"cache {_state['cache']}" if _state["cache"] else "no writable cache folder: compiled in every process"
    layer = numba.config.THREADING_LAYER
    return (f"numba {numba.__version__}, {numba.get_num_threads()} thread(s), threading layer {layer}, "
            f"serial below {PARALLEL_MIN} elements; {cache}")


def _bitcast_intrinsic(numba):
    from llvmlite import ir
    from numba.extending import intrinsic

    @intrinsic
    def float32_from_bits(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())
        return numba.types.float32(numba.types.int32), codegen

    return float32_from_bits


def _setup():
    global prange, float32_from_bits
    try:
        import numba
    except ImportError:
        return
    try:
        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER = "workqueue"   # OpenMP's spinning threads starve OpenBLAS
        _state["cache"] = _cache_dir()
        if _state["cache"] is not None and "NUMBA_CACHE_DIR" not in os.environ:
            numba.config.CACHE_DIR = _state["cache"]
        prange = numba.prange
        float32_from_bits = _bitcast_intrinsic(numba)
    except Exception as exc:  # noqa: BLE001 - an unusual numba: the NumPy fast path
        _state["error"] = f"{type(exc).__name__}: {exc}"
        return
    _state["numba"] = numba
    set_enabled(not _off_by_environment())


_setup()

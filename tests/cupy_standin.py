"""A stand-in for CuPy (NumPy underneath) that follows the rules of CuPy that matter to
tinymlp, for checking the CUDA path's device logic on a machine without a GPU.

Registered as the ``cupy`` module (``install``), it makes ``device="cuda"`` give tensors whose
arrays behave as CuPy's do where it matters:

- no implicit conversion to NumPy: ``np.asarray(x)`` (``__array__``) raises CuPy's TypeError;
- NumPy arrays are refused as operands of device ops (``x + numpy_array``, ``xp.matmul(x, a)``);
  ``xp.asarray``/``xp.array`` (an upload) and NumPy index arrays are accepted, as on CuPy;
- reductions give 0-d device arrays, never host scalars;
- every host read (``get``, ``item``, ``float``, ``bool``, ``int``, ``tolist``, ...) is counted:
  on a GPU each one waits for every queued kernel, so none may happen inside a training step;
  so is every upload (``xp.asarray`` of host data), to find constants sent again at each step;
- a few CuPy-internal reads are modelled and counted too: ``nonzero``/``flatnonzero``/``argwhere``
  and indexing with a boolean device mask (CuPy reads the number of True values back to size
  the result), ``lib.stride_tricks.sliding_window_view`` (it validates the window shape on the
  device and reads the verdict back);
- it has no kernels: ``ElementwiseKernel``, ``RawModule`` and ``ReductionKernel`` fail when
  compiled, like a CuPy without the CUDA headers, so the fast tier's kernels fall back to its
  array code (with one warning);
- for the fast tier's own kernels, NumPy emulations (``emulate``) stand in for the two places
  where ``fast/cuda.py`` compiles them (``cuda.compile_kernel``, ``cuda.elementwise``), behind
  the fast tier's own launchers (whose argument checks run): a raw kernel's arguments are read
  as a GPU reads them (``standin_memory.py``: a pointer at unit stride from the array's first
  element, a host array refused or taken as an address, a scalar read as the type the kernel
  declares, an address in a pointer table resolved to its allocation), so that every launch
  path of the fast tier (the layouts, strides, dtypes and buffers the Python side hands the
  kernels) runs without a GPU and a wrong one computes what the GPU would;
- stream capture and CUDA graphs (``standin_capture.py``): ``cuda.Stream.begin_capture`` /
  ``end_capture``, ``Graph.launch``, private memory pools, and CuPy 14's refusals during
  capture; during capture an operation's result is allocated and NaN-filled (indices not yet
  computed are read as zeros for its shape), and a replay fills it; the libcublas that
  ``fast/cublas.py`` binds (``standin_cublas.py``), which ``emulate`` installs with the kernels.

What it cannot see: timings; the maths of the CUDA kernels and of cuBLAS (``tests/test_cuda.py``
and ``benchmarks/gpu_cublas_check.py`` check them on a GPU); CuPy-internal synchronisations
other than those modelled above (allocator pressure, ``cupy.unique``, cuRAND setup, ...);
asynchronous errors (an illegal address is raised at the launch here); memory use; concurrency
between streams.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
import weakref
from collections import Counter

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

import standin_capture as _capture
from standin_cublas import emulate_cublas
from standin_memory import CUDARuntimeError, kernel_arguments, memory_at, register, signature, take  # noqa: F401
from tinymlp import backend
from tinymlp.fast import cublas, cuda
from tinymlp.fast.kernels import activation_cuda, dropout_cuda, optim_cuda


# ============================================================================ the stand-in
class HostReads:
    """Counts reads of device values by the host (each is a synchronisation on a GPU)."""

    def __init__(self):
        self.count, self.where = 0, []

    def record(self, what):
        import traceback

        if _capture.active() is not None:
            raise RuntimeError(_capture.D2H if self is READS else _capture.H2D)
        if self is READS and not _SYNC_ALLOWED[-1]:
            raise DeviceSynchronized(f"synchronization detected: {what} inside cupyx.allow_synchronize(False)")
        self.count += 1
        frame = [f for f in traceback.extract_stack() if "/tinymlp/" in f.filename.replace("\\", "/")]
        self.where.append(f"{what} at {frame[-1].filename}:{frame[-1].lineno}" if frame else what)


READS = HostReads()
UPLOADS = HostReads()       # host-to-device copies (xp.asarray / xp.array of host data)


class DeviceOps:
    """Counts the device operations the stand-in is asked for: each would be a kernel launch, a
    library call (cuBLAS, a CUB reduction) or a copy on a GPU. Views (a transpose, a reshape
    that copies nothing, basic indexing) and allocations without a fill (``empty``) are free.
    ``kinds`` counts by operation, ``sites`` by (operation, the line of tinymlp that asked)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.count, self.kinds, self.sites = 0, Counter(), Counter()

    def record(self, kind):
        self.count += 1
        self.kinds[kind] += 1
        self.sites[(kind, _site())] += 1


def _site():
    """'path/in/tinymlp.py:line' of the innermost frame in tinymlp's code (else the caller's)."""
    frame, fallback = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/tinymlp/" in name:
            return f"{name.rsplit('/tinymlp/', 1)[1]}:{frame.f_lineno}"
        if fallback is None and not name.endswith("cupy_standin.py"):
            fallback = f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"


OPS = DeviceOps()
VIEWS = {"transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze", "broadcast_to", "atleast_1d",
         "atleast_2d", "atleast_3d", "may_share_memory", "shares_memory", "result_type", "ndim", "shape",
         "isscalar", "iscomplexobj", "empty", "empty_like", "view", "reshape", "ravel", "ascontiguousarray",
         "asfortranarray", "diagonal", "real", "imag", "split", "array_split"}
"""Functions and methods that give a view where they can; a result that owns new memory counts
as one copy."""


def _c_order(result):
    """CuPy allocates the output of an elementwise operation in C order, whatever the inputs'
    layout (NumPy keeps the inputs' order): a token-major input gives a C-ordered output."""
    if isinstance(result, np.ndarray) and result.ndim > 1 and not result.flags.c_contiguous:
        return np.ascontiguousarray(result)
    if isinstance(result, tuple):
        return tuple(_c_order(r) for r in result)
    return result


def _in_c_order(fn):
    """``fn`` whose result is laid out as CuPy lays out an elementwise operation's (``_c_order``):
    the array a captured operation allocates is then the one the caller gets."""
    return lambda *args, **kwargs: _c_order(fn(*args, **kwargs))


def _count_result(name, result, sources):
    """One operation for ``name``, unless it is a view function whose result shares memory with
    one of ``sources`` (then nothing), or a view function that had to copy (then a copy)."""
    if name in VIEWS:
        arrays = result if isinstance(result, (tuple, list)) else (result,)
        shared = all(not isinstance(r, np.ndarray) or r.size == 0
                     or any(isinstance(s, np.ndarray) and np.shares_memory(r, s) for s in sources)
                     for r in arrays)
        if not shared and name not in ("empty", "empty_like"):
            OPS.record("copy")
        return
    OPS.record(name)


NOT_IN_CUPY = {"vecdot"}
"""NumPy functions CuPy 14 does not have: code that looks for them takes its other way there."""

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")


def _refuse_host(value, where):
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)} in {where}: a NumPy array cannot be an "
                        f"operand of a device op (upload it with cupy.asarray first)")


def _unwrap(value, where, allow_host=False):
    """DeviceArray -> its NumPy storage (recursively through tuples, lists, dicts); NumPy arrays
    are refused unless ``allow_host``."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, where, allow_host) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, where, allow_host) for k, v in value.items()}
    if not allow_host:
        _refuse_host(value, where)
    return value


_wrappers = weakref.WeakValueDictionary()   # id(NumPy array) -> its DeviceArray, while one lives


def _wrap(value):
    if isinstance(value, np.ndarray):
        known = _wrappers.get(id(value))         # one wrapper per array: ``x.base is y`` holds as on CuPy
        if known is not None and known._a is value:
            return known
        return DeviceArray(value)
    if isinstance(value, np.generic):                 # CuPy gives 0-d arrays, never host scalars
        return DeviceArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _count_mask_read(key):
    """CuPy sizes the result of boolean-mask indexing by reading the mask's count back."""
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, DeviceArray) and k.dtype == bool:
            READS.record("boolean mask indexing")


def _device_op(name, fn, args, kwargs, sources=(), inplace=False):
    """Run ``fn(*args, **kwargs)`` (NumPy arrays) as a device operation: now, or, while a stream
    captures, recorded for the graph (``standin_capture``): an in-place write is left undone, a
    new result is allocated from the graph's pool and filled with NaN, a view is just a view."""
    graph = _capture.active()
    if graph is None:
        return fn(*args, **kwargs)
    if name in _capture.CUBLAS_FUNCTIONS:
        raise NotImplementedError(_capture.CUBLAS)
    if inplace:
        graph.record(fn, *args, **kwargs)
        return kwargs["out"] if "out" in kwargs else args[0] if args else None
    with np.errstate(all="ignore"):
        try:
            result = fn(*args, **kwargs)
        except IndexError:          # indices the graph computes at replay (not yet: NaN-filled): any valid
            result = fn(*_zero_indices(args), **kwargs)        # index gives the result's shape and dtype
    if isinstance(result, np.generic):                     # a reduction's scalar: CuPy's 0-d array
        result = np.asarray(result)
    arrays = [r for r in (result if isinstance(result, tuple) else (result,)) if isinstance(r, np.ndarray)]
    new = [r for r in arrays if not any(isinstance(s, np.ndarray) and np.shares_memory(r, s) for s in sources)]
    if new:
        _capture.allocated(new)
        if name not in ("empty", "empty_like"):            # an allocation without a fill runs nothing
            graph.record(_refill, result, fn, args, kwargs)
    return result


def _zero_indices(value):
    """``value`` with its integer arrays (indices) replaced by zeros."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return np.zeros_like(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_zero_indices(v) for v in value)
    return value


def _refill(result, fn, args, kwargs):
    values = fn(*args, **kwargs)
    pairs = zip(*((x if isinstance(x, tuple) else (x,)) for x in (result, values)))
    for r, v in pairs:
        if isinstance(r, np.ndarray) and not np.shares_memory(r, v):
            r[...] = v


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: ``ptr`` is the address of the array's first element (its
    allocation noted, so that a kernel reading the address from device memory finds it)."""

    def __init__(self, a):
        self.ptr = register(a)
        self.device_id = 0


class _Device:
    id = 0

    def __init__(self, index=0):
        self.id = int(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        _capture.refuse_sync()


class DeviceArray(NDArrayOperatorsMixin):
    """A "GPU" array: NumPy storage behind CuPy's rules (see the module docstring)."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 100

    def __init__(self, a):
        self._a = a
        _wrappers[id(a)] = self

    # -- no implicit conversion; explicit host reads are counted
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    def get(self, *args, **kwargs):
        READS.record("get()")
        return self._a.copy()

    @property
    def data(self):
        return MemoryPointer(self._a)

    def set(self, arr, stream=None):
        """An upload into this array's memory (``cupy.ndarray.set``: a NumPy array of its dtype and shape)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        UPLOADS.record("set()")
        OPS.record("upload")
        self._a[...] = arr

    def item(self, *args):
        READS.record("item()")
        return self._a.item(*args)

    def tolist(self):
        READS.record("tolist()")
        return self._a.tolist()

    def __float__(self):
        READS.record("float()")
        return float(self._a)

    def __int__(self):
        READS.record("int()")
        return int(self._a)

    def __bool__(self):
        READS.record("bool()")
        return bool(self._a)

    def __repr__(self):
        return f"DeviceArray(shape={self._a.shape}, dtype={self._a.dtype})"

    # -- the array protocol of device ops
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        args = _unwrap(inputs, ufunc.__name__)
        kwargs = _unwrap(kwargs, ufunc.__name__)
        run = getattr(ufunc, method)
        result = _device_op(ufunc.__name__, run if out is not None else _in_c_order(run), args, kwargs, args,
                            inplace=out is not None)
        OPS.record(ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}")
        if out is not None:                                 # in place: the same device arrays back
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        args, kwargs = _unwrap(args, func.__name__), _unwrap(kwargs, func.__name__)
        sources = [a for a in args if isinstance(a, np.ndarray)] + [self._a]
        result = _device_op(func.__name__, func, args, kwargs, sources, inplace="out" in kwargs)
        _count_result(func.__name__, result, sources)
        return _wrap(result)

    # -- the ndarray surface
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    device = property(lambda self: _Device(0))

    @property
    def mT(self):
        return DeviceArray(self._a.mT)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (DeviceArray(np.asarray(v)) for v in self._a)

    def __getitem__(self, key):
        _count_mask_read(key)
        key = _unwrap(key, "indexing", allow_host=True)
        result = _device_op("getitem", _getitem, (self._a, key), {}, (self._a,))
        if isinstance(result, np.ndarray) and result.size and not np.shares_memory(result, self._a):
            OPS.record("gather")                             # advanced indexing copies
        return _wrap(result)

    def __setitem__(self, key, value):
        _count_mask_read(key)
        OPS.record("setitem")
        _device_op("setitem", _setitem, (self._a, _unwrap(key, "indexing", allow_host=True),
                                         _unwrap(value, "assignment", allow_host=True)), {}, inplace=True)

    def __getattr__(self, name):
        if name.startswith("__"):              # no __array_interface__ and friends: no silent host view
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        if name == "nonzero":
            READS.record("nonzero()")

        def method(*args, **kwargs):
            result = _device_op(name, attr, _unwrap(args, name), _unwrap(kwargs, name), (self._a,),
                                inplace="out" in kwargs or name in IN_PLACE_METHODS)
            if not (name == "astype" and result is self._a):      # astype(same dtype, copy=False): nothing
                _count_result(name, result, [self._a])
            return _wrap(result)

        return method

    def __setattr__(self, name, value):
        if name == "_a":
            object.__setattr__(self, name, value)
        elif name == "shape":
            self._a.shape = value
        else:
            raise AttributeError(f"cannot set {name} on a device array")

    def __reduce__(self):
        raise TypeError("a device array cannot be pickled without a host read")


def _getitem(a, key):
    """``a[key]``; an element is a 0-d view, as CuPy gives (NumPy would give a host scalar)."""
    result = a[key]
    if isinstance(result, np.generic):
        result = a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
    return result


def _setitem(a, key, value):
    a[key] = value


IN_PLACE_METHODS = {"fill", "sort", "put", "partition", "setfield", "resize"}

DeviceArray.__module__ = "cupy._standin"   # the engine recognises CuPy arrays by their type's module


class CompileException(Exception):
    """What CuPy raises when NVRTC cannot compile a kernel."""


def _no_kernel(*args, **kwargs):
    class Kernel:
        def __call__(self, *a, **k):
            raise CompileException("catastrophic error: cannot open source file \"cuda_fp16.h\" (stand-in)")

        def get_function(self, name):
            return self

    return Kernel()


class _UFunc:
    """cupy.add, cupy.exp, ...: device operands only, with their methods (``add.at``, ``reduce``)."""

    def __init__(self, ufunc):
        self._u = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        OPS.record(self.__name__)
        args, kw = _unwrap(args, self.__name__), _unwrap(kwargs, self.__name__)
        inplace = kw.get("out") is not None
        result = _device_op(self.__name__, self._u if inplace else _in_c_order(self._u), args, kw, args,
                            inplace=inplace)
        return _wrap(result)

    def __getattr__(self, name):
        attr = getattr(self._u, name)
        if not callable(attr):
            return attr

        def method(*a, **k):
            OPS.record(f"{self.__name__}.{name}")
            a, k = _unwrap(a, self.__name__), _unwrap(k, self.__name__)
            return _wrap(_device_op(name, attr, a, k, a, inplace=name == "at" or "out" in k))

        return method


class _Generator:
    """cupy.random.Generator: draws on the device."""

    def __init__(self, seed=None):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        attr = getattr(self._g, name)

        def draw(*args, **kwargs):
            if _capture.active() is not None:
                raise NotImplementedError(_capture.CURAND)
            OPS.record(f"random.{name}")
            return _wrap(np.asarray(attr(*args, **kwargs)))

        return draw


_SYNC_ALLOWED = [True]


@contextlib.contextmanager
def _allow_synchronize(allow):
    """``cupyx.allow_synchronize``: inside ``allow_synchronize(False)`` a host read raises, as
    CuPy's DeviceSynchronized does."""
    _SYNC_ALLOWED.append(bool(allow))
    try:
        yield
    finally:
        _SYNC_ALLOWED.pop()


class DeviceSynchronized(RuntimeError):
    """What ``cupyx.allow_synchronize(False)`` raises at a host read."""


def _uploads_a_table(arrays):
    """Whether CuPy 14's ``concatenate`` of ``arrays`` uploads a table of their addresses (more
    than 8 arrays of one dtype, under 2 MiB each on average: ``_concatenate_single_kernel``)."""
    arrays = list(arrays) if isinstance(arrays, (tuple, list)) else []
    return (len(arrays) > 8 and len({a.dtype for a in arrays}) == 1
            and sum(a.nbytes for a in arrays) < 2 * 1024 * 1024 * len(arrays))


def _sliding_window_view(x, window_shape, axis=None, **kwargs):
    window = np.atleast_1d(window_shape)
    if bool(standin.any(standin.array(window) < 0)):    # as CuPy does: a device check read back
        raise ValueError("window_shape cannot contain negative values")
    return _wrap(np.lib.stride_tricks.sliding_window_view(x._a, tuple(window), axis=axis, **kwargs))


def _make_module():
    """The stand-in ``cupy`` module (and ``cupyx``)."""
    m = types.ModuleType("cupy")
    m.__version__ = "stand-in"
    m.ndarray = DeviceArray
    m.cuda = types.SimpleNamespace(
        Device=_Device, Stream=_capture.Stream, get_current_stream=_capture.get_current_stream,
        Graph=_capture.Graph, MemoryPool=_capture.MemoryPool, MemoryPointer=MemoryPointer,
        using_allocator=_capture.using_allocator, set_allocator=_capture.set_allocator,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 12080,
                                      driverGetVersion=lambda: 12080,
                                      getDeviceProperties=lambda i: {"name": b"stand-in", "totalGlobalMem": 2**33,
                                                                     "major": 9, "minor": 0}),
        compiler=types.SimpleNamespace(CompileException=CompileException),
    )
    m.get_default_memory_pool = lambda: _capture.DEFAULT_POOL
    m.random = types.SimpleNamespace(default_rng=_Generator, Generator=_Generator)
    m.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
        as_strided=lambda x, shape=None, strides=None: DeviceArray(
            np.lib.stride_tricks.as_strided(x._a, shape=shape, strides=strides)),
        sliding_window_view=_sliding_window_view))
    m.ElementwiseKernel = m.RawModule = m.ReductionKernel = m.RawKernel = _no_kernel

    uploads = {"asarray", "array", "asanyarray"}
    host_arguments = {"split", "array_split"}
    sizes_on_host = {"nonzero", "flatnonzero", "argwhere"}        # CuPy reads the count back

    def module_getattr(name):
        if name.startswith("__") or name in NOT_IN_CUPY:
            raise AttributeError(f"module 'cupy' has no attribute '{name}'")
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr                                    # dtypes (cupy.float32 is numpy.float32), constants
        if isinstance(attr, np.ufunc):
            return _UFunc(attr)

        def function(*args, **kwargs):
            if name in uploads:
                if not isinstance(args[0], DeviceArray):
                    UPLOADS.record(f"{name}()")
                    OPS.record("upload")
                elif name == "array" and kwargs.get("copy", True):
                    OPS.record("copy")
                host = not isinstance(args[0], DeviceArray)
                args = tuple(a._a if isinstance(a, DeviceArray) else a for a in args)
                if host:                                  # an upload: device memory of its own
                    return DeviceArray(np.array(args[0], *args[1:], **{**kwargs, "copy": True}))
                return DeviceArray(np.array(args[0], *args[1:], **kwargs) if name == "array"
                                   else np.asarray(*args, **kwargs))
            if name in host_arguments:                      # e.g. split's indices: read on the host by CuPy too
                args = (_unwrap(args[0], name), *_unwrap(args[1:], name, allow_host=True))
            else:
                args = _unwrap(args, name)
            if name in sizes_on_host:
                READS.record(f"{name}()")
            if name == "concatenate" and _uploads_a_table(args[0]):
                UPLOADS.record("concatenate()'s table of addresses")
            kwargs = _unwrap(kwargs, name, allow_host=name in host_arguments)
            sources = [a for a in args if isinstance(a, np.ndarray)]
            sources += [a for a in (args[0] if args and isinstance(args[0], (tuple, list)) else ())
                        if isinstance(a, np.ndarray)]
            result = _device_op(name, attr, args, kwargs, sources, inplace="out" in kwargs or name == "copyto")
            _count_result(name, result, sources)
            return result if name in ("may_share_memory", "shares_memory") else _wrap(result)

        function.__name__ = name
        return function

    m.__getattr__ = module_getattr
    cupyx = types.ModuleType("cupyx")
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = lambda x: DeviceArray(np.vectorize(math.erf, otypes=[x.dtype])(x._a))
    special.erfc = lambda x: DeviceArray(np.vectorize(math.erfc, otypes=[x.dtype])(x._a))
    cupyx.scipy = types.SimpleNamespace(special=special)
    cupyx.allow_synchronize = _allow_synchronize
    return m, cupyx, special


standin, standin_x, standin_special = _make_module()


def install(monkeypatch):
    """Register the stand-in as CuPy (and the "cuda" device) through ``monkeypatch``; host reads,
    uploads and device operations counted from zero. Returns the stand-in module; undo with
    ``monkeypatch.undo()`` (then call ``clear_kernel_caches()``)."""
    monkeypatch.setitem(sys.modules, "cupy", standin)
    monkeypatch.setitem(sys.modules, "cupyx", standin_x)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", standin_x.scipy)
    monkeypatch.setitem(sys.modules, "cupyx.scipy.special", standin_special)
    monkeypatch.setattr(backend, "_cupy", standin)
    monkeypatch.setattr(backend, "_cupy_error", None)
    monkeypatch.setattr(backend, "_cuda_checked", {})
    monkeypatch.setattr(cuda, "_kernel_state", {np.dtype(np.float32): "CompileException: stand-in",
                                                np.dtype(np.float64): "CompileException: stand-in"})
    monkeypatch.setattr(backend, "_device_constants", {})
    monkeypatch.setattr(optim_cuda, "_tables", {})
    clear_kernel_caches()
    READS.count, READS.where = 0, []
    UPLOADS.count, UPLOADS.where = 0, []
    return standin


_KERNEL_CACHES = (cuda.cupy, cuda._module, cuda._function, cuda._launcher, cuda.elementwise,   # (tests replace some)
                  cublas._handle, cublas._loaded)


def clear_kernel_caches():
    for cached in _KERNEL_CACHES:
        cached.cache_clear()


@contextlib.contextmanager
def no_host_reads(allowed=0):
    """Fail when the block reads the device more than ``allowed`` times; list where it did."""
    before = READS.count
    start = len(READS.where)
    yield
    reads = READS.where[start:]
    assert READS.count - before <= allowed, f"{READS.count - before} host read(s) in a step: {reads}"


# ============================================================================ the kernels, emulated
def _rows(flat, n, d, what, stride=None):
    """Rows of ``d`` elements, ``n`` of them every ``stride`` (default d) from the start of ``flat``."""
    stride = d if stride is None else int(stride)
    if n == 0:
        return flat[:0].reshape(0, d)
    take(flat, (n - 1) * stride + d, what)
    return np.lib.stride_tricks.as_strided(flat, (n, d), (stride * flat.itemsize, flat.itemsize))


def emulated_row_kernel(source, name, dtype):
    """The raw kernels of ``fast/kernels/*_cuda.py`` in NumPy, reading and writing memory as the
    CUDA code does: each argument unpacked as the GPU reads it (``standin_memory``: a pointer is
    flat memory from the array's first element, read at unit stride; a scalar is read as the type
    the kernel declares), rows every ``stride`` elements where the kernel takes a stride. So the
    layouts, dtypes and devices the Python side hands the kernels are checked without a GPU: a
    non-contiguous array gives the wrong numbers, a host array the GPU's error.
    A kernel launched from a source that does not define it fails, as it would on a GPU."""
    signature(source, name)

    def run(grid, block, args):
        LAUNCHED.add(name)
        OPS.record(f"kernel {name}")
        _device_op(name, lambda *a: _run_row_kernel(name, grid, kernel_arguments(source, name, dtype, a)),
                   tuple(args), {}, inplace=True)
    return run


def _run_row_kernel(name, grid, a):
    n = grid[0]
    if name == "layer_norm_forward":
        x, stride, w, b, y, xhat, rstd, width, eps, affine = a
        d = int(width)
        X = _rows(x, n, d, "x", stride)
        mean = X.mean(axis=1, keepdims=True)
        with np.errstate(over="ignore"):
            var = ((X - mean) ** 2).mean(axis=1, keepdims=True)
        r = 1 / np.sqrt(var + eps)
        big = ~np.isfinite(var[:, 0])                # the kernel's branch for squares that overflow
        if big.any():
            c = X[big] - mean[big]
            scale = np.abs(c).max(axis=1, keepdims=True)
            r[big] = 1 / np.hypot(scale * np.sqrt(((c / scale) ** 2).mean(axis=1, keepdims=True)), np.sqrt(eps))
        H = (X - mean) * r
        if affine:
            _rows(y, n, d, "y")[...] = H * take(w, d) + take(b, d)
        _rows(xhat, n, d, "xhat")[...] = H
        take(rstd, n, "rstd")[...] = r[:, 0]
    elif name == "layer_norm_backward":
        g, xhat, rstd, w, dx, stride, width = a
        d = int(width)
        G, H = _rows(g, n, d, "g"), _rows(xhat, n, d, "xhat")
        gw = G * take(w, d)
        _rows(dx, n, d, "dx", stride)[...] = take(rstd, n).reshape(n, 1) * (
            gw - gw.mean(axis=1, keepdims=True) - H * (gw * H).mean(axis=1, keepdims=True))
    elif name == "layer_norm_param_partials":
        g, xhat, partial, rows, width, per_chunk = a
        d, chunks, rows = int(width), grid[1], int(rows)
        G, H = _rows(g, rows, d, "g"), _rows(xhat, rows, d, "xhat")
        assert chunks * per_chunk >= rows > (chunks - 1) * per_chunk
        P = take(partial, 2 * chunks * d).reshape(2, chunks, d)
        for k in range(chunks):
            rows_k = slice(k * int(per_chunk), (k + 1) * int(per_chunk))
            P[0, k] = (G[rows_k] * H[rows_k]).sum(axis=0)
            P[1, k] = G[rows_k].sum(axis=0)
    elif name == "sum_chunks":
        partial, dweight, dbias, chunks, width = a
        sums = take(partial, 2 * int(chunks) * int(width)).reshape(2, int(chunks), int(width)).sum(axis=1)
        take(dweight, int(width))[...], take(dbias, int(width))[...] = sums[0], sums[1]
    elif name == "cross_entropy_forward":
        x, y, p, rows, width, alpha, inv_batch = a
        K = int(width)
        X, Y = _rows(x, n, K, "x"), take(y, n, "y")
        s = X - X.max(axis=1, keepdims=True)
        z = np.exp(s).sum(axis=1)
        lse = np.log(z)
        _rows(p, n, K, "p")[...] = np.exp(s) / z[:, None]
        valid = (Y >= 0) & (Y < K)                 # a class id out of range makes the row NaN
        picked = np.where(valid, s[np.arange(n), np.where(valid, Y, 0)], np.nan)
        term = (1 - alpha) * (picked - lse)
        if alpha != 0:
            term = term + (alpha / K) * (s.sum(axis=1) - K * lse)
        take(rows, n, "loss_rows")[...] = -term * inv_batch
    elif name == "cross_entropy_backward":
        p, y, g, dx, width, alpha, inv_batch = a
        K = int(width)
        d = _rows(p, n, K, "p") - alpha / K
        Y = take(y, n, "y")
        hit = np.arange(K)[None, :] == Y[:, None]
        d = np.where(hit, d - (1 - alpha), d)
        _rows(dx, n, K, "dx")[...] = d * (take(g, 1, "g")[0] * inv_batch)
    elif name == "softmax_forward":
        s, width, scale = a
        S = _rows(s, n, int(width), "s")
        E = np.exp(S * scale - (S * scale).max(axis=1, keepdims=True))
        S[...] = E / E.sum(axis=1, keepdims=True)
    elif name == "softmax_backward":
        p, g, dx, width = a
        d = int(width)
        P, G = _rows(p, n, d, "p"), _rows(g, n, d, "g")
        _rows(dx, n, d, "dx")[...] = P * (G - (G * P).sum(axis=1, keepdims=True))
    else:
        raise CompileException(name)


def emulated_elementwise(in_params, out_params, body, name):
    """The elementwise kernels of ``fast/kernels/*_cuda.py`` in NumPy, with CuPy's calling
    convention: inputs, then outputs (allocated when not given, bound by reference when given).
    (An ElementwiseKernel indexes every array by its strides and casts each scalar to the type
    its parameter declares, as here; a NumPy array among the arguments is refused.)"""
    c0, c1 = activation_cuda.C0, activation_cuda.C1

    def gelu(x):
        t = np.tanh(c0 * (x + c1 * x * x * x))
        h = 0.5 * (1 + t)
        return x * h, h + x * h * (1 - t) * (c0 + 3 * c0 * c1 * x * x)

    def compute(*a):
        if name == "tinymlp_gelu_tanh_grad":
            y, d = gelu(a[0])
            return y.astype(a[0].dtype), d.astype(a[0].dtype)
        if name == "tinymlp_gelu_tanh":
            return gelu(a[0])[0].astype(a[0].dtype)
        if name in ("tinymlp_sgu_gate", "tinymlp_sgu_gate_residual"):
            gamma, shift, *rest = a
            residual = rest.pop(0) if name.endswith("residual") else 0
            z1, f, out = rest
            f[...] = f * gamma + shift + residual
            out[...] = z1 * f
            return None
        if name == "tinymlp_dropout":
            x, seed, p, scale = a
            seed = int(seed.reshape(-1)[0]) if isinstance(seed, np.ndarray) else int(seed)
            u = dropout_cuda.hash_uniform(seed, x.size).reshape(x.shape)   # i: the C-order index
            return np.where(u >= p, x * scale, x.dtype.type(0)).astype(x.dtype)
        if name == "tinymlp_sgu_gate_backward":
            g, f, z1, dz1, gf = a
            dz1[...] = g * f
            gf[...] = g * z1
            return None
        raise CompileException(name)

    def run(*args):
        LAUNCHED.add(name)
        OPS.record(f"kernel {name}")
        for v in args:
            _refuse_host(v, name)
        a = tuple(v._a if isinstance(v, DeviceArray) else v for v in args)
        writes = name in ("tinymlp_sgu_gate", "tinymlp_sgu_gate_residual", "tinymlp_sgu_gate_backward")
        result = _device_op(name, compute, a, {}, [v for v in a if isinstance(v, np.ndarray)], inplace=writes)
        if writes:
            return args[-2], args[-1]
        return _wrap(result)
    return run


LAUNCHED = set()      # the names of the kernels the emulations ran

MULTI_TENSOR = ("adam_step", "gather", "sum_squares_partials", "clip_factor", "scale_all")


def emulated_kernel(source, name, dtype):
    """Every raw kernel of the fast tier in NumPy: the multi-tensor kernels of ``optim_cuda`` in
    the kernels' operation order, over the pointer table of device addresses they are given
    (each address resolved to the allocation it points into, as on the GPU), and the row
    kernels (``emulated_row_kernel``)."""
    if name not in MULTI_TENSOR:
        return emulated_row_kernel(source, name, dtype)
    signature(source, name)
    dtype = np.dtype(dtype)

    def run(grid, block, args):
        LAUNCHED.add(name)
        OPS.record(f"kernel {name}")
        _device_op(name, lambda *a: _run_multi_tensor(name, dtype, kernel_arguments(source, name, dtype, a)),
                   tuple(args), {}, inplace=True)
    return run


def _table(ptrs, starts, count, dtype):
    """The arrays of a pointer table: flat memory of each address, its size from the offsets."""
    count = int(count)
    offsets = take(starts, count + 1, "starts")
    return [take(memory_at(addr, dtype), offsets[k + 1] - offsets[k], f"array {k} of the table")
            for k, addr in enumerate(take(ptrs, count, "ptrs"))], offsets


def _run_multi_tensor(name, dtype, a):
    if name == "adam_step":
        g, m, v, ptrs, starts, count, scalars = a
        b1, omb1, b2, omb2, eps_c, step_size, decay = take(scalars, 7, "scalars")
        arrays, offsets = _table(ptrs, starts, count, dtype)
        n = offsets[-1]
        G, M, V = take(g, n, "g"), take(m, n, "m"), take(v, n, "v")
        M[...] = M * b1 + G * omb1
        V[...] = V * b2 + (G * G) * omb2
        U = (M / (np.sqrt(V) + eps_c)) * step_size
        for k, p in enumerate(arrays):
            p[...] = p * decay - U[offsets[k]:offsets[k + 1]]
    elif name == "gather":
        ptrs, starts, count, out = a
        arrays, offsets = _table(ptrs, starts, count, dtype)
        take(out, offsets[-1], "out")[...] = np.concatenate(arrays) if arrays else []
    elif name == "sum_squares_partials":
        ptrs, starts, count, partial = a
        arrays, _ = _table(ptrs, starts, count, dtype)
        partial[...] = 0
        partial[0] = sum((p.astype(dtype) ** 2).sum() for p in arrays)
    elif name == "clip_factor":
        partial, parts, max_norm, total, scale = a
        t = np.sqrt(take(partial, int(parts)).sum())
        take(total, 1)[0] = t
        take(scale, 1)[0] = min(1, max_norm / (t + dtype.type(1e-6))) if np.isfinite(t) else 1
    elif name == "scale_all":
        ptrs, starts, count, scale = a
        for p in _table(ptrs, starts, count, dtype)[0]:
            p *= take(scale, 1)[0]


def emulate(monkeypatch, check=True):
    """Every fast-tier CUDA kernel "working" on an installed stand-in (both dtypes), emulated in
    NumPy behind the fast tier's own launchers (whose checks run), and the libcublas that
    ``fast/cublas.py`` binds (``standin_cublas.py``); the self-tests run (launching every kernel
    once and comparing its numbers with NumPy's) unless ``check`` is False, then ``LAUNCHED`` is
    emptied."""
    emulate_cublas(monkeypatch)
    monkeypatch.setattr(cuda, "compile_kernel", emulated_kernel)
    monkeypatch.setattr(cuda, "elementwise", emulated_elementwise)
    monkeypatch.setattr(cuda, "_kernel_state", {})
    clear_kernel_caches()
    for dtype in (np.float32, np.float64) if check else ():
        assert cuda.kernels_work(dtype)                   # the self-tests launch every kernel once
    LAUNCHED.clear()

"""CUDA graphs on the CuPy stand-in: stream capture, replay, private memory pools, and what CuPy
refuses during capture.

The API is CuPy's (``cupy/cuda/stream.pyx``, ``cupy/cuda/graph.pyx``)::

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, cupy.cuda.using_allocator(pool.malloc):   # pool = cupy.cuda.MemoryPool()
        stream.begin_capture()
        ...                                     # device operations: recorded, not run
        graph = stream.end_capture()
    graph.launch()                              # runs them, reading the buffers' contents now

As on a GPU, nothing runs during capture: an operation is recorded (its output allocated, and
filled with NaN, its in-place writes left undone), and ``launch`` runs the recorded operations
in order on the memory they were recorded with. What CuPy 14 refuses while the current stream
captures, the stand-in refuses with CuPy's error:

- a host read (``get``, ``item``, ``float``, ``bool``, ...): ``cupy/cuda/memory.pyx``,
  ``copy_to_host_async``: "the current stream is capturing, so D2H transfers are disallowed";
- an upload (``cupy.asarray`` of host data, ``ndarray.set``, a ``concatenate`` of more than 8
  small arrays, which uploads a table of their addresses: ``_routines_manipulation.pyx``):
  ``copy_from_host_async``: "... so H2D transfers are disallowed";
- cuBLAS (``matmul``, ``dot``, ``vdot``, ``tensordot``, ``einsum``, ``inner``, ``@``): every
  cuBLAS call of CuPy sets its handle's stream first, and ``cupy_backends/cuda/libs/cublas.pyx``
  ``setStream`` raises NotImplementedError during capture (cupy/cupy#6290, open);
- cuRAND (``cupy.random``): ``curand.pyx`` ``setStream`` raises likewise;
- a synchronisation (``Stream.synchronize``, ``Device.synchronize``): CUDA refuses it;
- capturing on the legacy default stream: "cannot capture on the default (legacy) stream";
- work issued on another stream than the capturing one.

One rule is the stand-in's own, stricter than CuPy (which allows it and corrupts later): an
allocation during capture must come from a private pool (``using_allocator(pool.malloc)`` with
a ``MemoryPool`` other than the default one). Memory of the shared pool that the graph uses
would be handed to other arrays once freed, while the graph still writes it at each replay.
The private pool keeps every block it gave during capture for the graph. An array allocated
before capture (a parameter, a static input, a pointer table) is held weakly by the graph: a
replay that reads one freed since raises the GPU's illegal-address error.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref

import numpy as np

from standin_memory import CUDARuntimeError, ILLEGAL, Pointer, root_of

__all__ = ["Graph", "MemoryPool", "Stream", "active", "get_current_stream", "using_allocator"]

D2H = "the current stream is capturing, so D2H transfers are disallowed"
H2D = "the current stream is capturing, so H2D transfers are disallowed"
CUBLAS = "calling cuBLAS API during stream capture is currently unsupported"
CURAND = "calling cuRAND API during stream capture is currently unsupported"
SYNC = "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"
CUBLAS_FUNCTIONS = {"matmul", "dot", "vdot", "tensordot", "einsum", "inner"}

_ids = itertools.count(2)


class Stream:
    """``cupy.cuda.Stream``: a context manager making it the current stream; capture."""

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.ptr = 0 if null else next(_ids)
        self._capture = None

    def __enter__(self):
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _STREAMS.pop()
        return False

    def use(self):
        _STREAMS[0] = self
        return self

    def begin_capture(self, mode=None):
        if self.ptr in (0, 1):
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if _CAPTURE[0] is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: a capture is already under way")
        _CAPTURE[0] = self._capture = Graph(self)

    def end_capture(self):
        graph, self._capture = self._capture, None
        if graph is None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        _CAPTURE[0] = None
        return graph

    def is_capturing(self):
        return self._capture is not None

    def synchronize(self):
        refuse_sync()


_STREAMS = [Stream(null=True)]


def get_current_stream():
    return _STREAMS[-1]


_CAPTURE = [None]      # the graph being captured, or None


def active():
    """The graph being captured (work must then be issued on its stream), or None."""
    graph = _CAPTURE[0]
    if graph is not None and get_current_stream() is not graph.stream:
        raise CUDARuntimeError("cudaErrorStreamCaptureImplicit: work issued on another stream than the "
                               "one being captured")
    return graph


def refuse_sync():
    if _CAPTURE[0] is not None:
        raise CUDARuntimeError(SYNC)


# ---------------------------------------------------------------------------- memory pools
class MemoryPool:
    """``cupy.cuda.MemoryPool``: during capture, the blocks it hands out are kept for the graph."""

    def __init__(self, allocator=None):
        self.blocks = []

    def malloc(self, size):
        raise NotImplementedError("the stand-in's arrays are NumPy's: the pool is a marker")

    def used_bytes(self):
        return sum(b.nbytes for b in self.blocks)

    def free_all_blocks(self):
        if _CAPTURE[0] is None:
            self.blocks.clear()


DEFAULT_POOL = MemoryPool()
_ALLOCATOR = [DEFAULT_POOL.malloc]


@contextlib.contextmanager
def using_allocator(allocator=None):
    _ALLOCATOR.append(allocator or DEFAULT_POOL.malloc)
    try:
        yield
    finally:
        _ALLOCATOR.pop()


def set_allocator(allocator=None):
    _ALLOCATOR[0] = allocator or DEFAULT_POOL.malloc


def allocated(result):
    """Note arrays a device operation allocated during capture: from a private pool only (kept
    by it for the graph), filled with NaN (a captured operation has not run)."""
    pool = getattr(_ALLOCATOR[-1], "__self__", None)
    if pool is None or pool is DEFAULT_POOL:
        raise RuntimeError("an allocation during capture from the shared memory pool: the graph would keep "
                           "writing that memory after it is handed to other arrays; capture under "
                           "cupy.cuda.using_allocator(pool.malloc) with a MemoryPool of the graph's own")
    for r in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(r, np.ndarray):
            pool.blocks.append(r)
            _poison(r)


def _poison(a):
    if a.dtype.kind in "fc":
        a[...] = np.nan
    elif a.dtype.kind in "iu":
        a[...] = np.iinfo(a.dtype).max
    return a


# ---------------------------------------------------------------------------- graphs
class _Weak:
    """An array allocated before capture, held as the graph holds it: by address."""

    __slots__ = ("ref", "offset", "shape", "strides", "dtype")

    def __init__(self, a):
        root = root_of(a)
        self.ref = weakref.ref(root)
        self.offset = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        self.shape, self.strides, self.dtype = a.shape, a.strides, a.dtype

    def get(self):
        root = self.ref()
        if root is None:
            raise CUDARuntimeError(f"{ILLEGAL} (the graph reads an array of {self.dtype} {self.shape} freed since "
                                   "its capture)")
        return np.lib.stride_tricks.as_strided(Pointer(root, self.offset).view(self.dtype), self.shape, self.strides)


class _Device:
    """A device array among a recorded operation's arguments (held as its memory is)."""

    __slots__ = ("held",)

    def __init__(self, held):
        self.held = held


class Graph:
    """``cupy.cuda.Graph``: the recorded operations, run in order by ``launch``."""

    def __init__(self, stream):
        self.stream, self.ops, self.kept = stream, [], set()
        self.launches = 0

    def _hold(self, value):
        if isinstance(value, np.ndarray):
            if any(b is root_of(value) for b in _pool_blocks()):
                return value
            return _Weak(value)
        if hasattr(value, "_a") and type(value).__name__ == "DeviceArray":
            return _Device(self._hold(value._a))
        if isinstance(value, (tuple, list)):
            return type(value)(self._hold(v) for v in value)
        if isinstance(value, dict):
            return {k: self._hold(v) for k, v in value.items()}
        return value

    def record(self, run, *args, **kwargs):
        """Record ``run(*args, **kwargs)`` to be called at each launch, on the arrays the
        arguments are then (held as the GPU holds memory: see the module docstring); the line of
        tinymlp that issued it is kept for error messages."""
        from cupy_standin import _site
        self.ops.append((run, self._hold(args), self._hold(kwargs), _site()))

    def launch(self, stream=None):
        if _CAPTURE[0] is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureUnsupported: a graph launched during capture")
        from cupy_standin import OPS, DeviceArray
        OPS.record("graph launch")
        for run, args, kwargs, site in self.ops:
            try:
                args, kwargs = _release(args, DeviceArray), _release(kwargs, DeviceArray)
            except CUDARuntimeError as err:
                raise CUDARuntimeError(f"{err}, in the operation captured at {site}") from None
            run(*args, **kwargs)
        self.launches += 1

    def upload(self, stream=None):
        pass


def _pool_blocks():
    pool = getattr(_ALLOCATOR[-1], "__self__", None)
    return pool.blocks if pool is not None else ()


def _release(value, device_array):
    if isinstance(value, _Weak):
        return value.get()
    if isinstance(value, _Device):
        return device_array(_release(value.held, device_array))
    if isinstance(value, (tuple, list)):
        return type(value)(_release(v, device_array) for v in value)
    if isinstance(value, dict):
        return {k: _release(v, device_array) for k, v in value.items()}
    return value

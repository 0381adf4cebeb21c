"""Device memory as a kernel sees it, for the CuPy stand-in (``tests/cupy_standin.py``).

A kernel on a GPU receives bytes, not arrays. CuPy packs each argument of a ``RawKernel`` launch
(``cupy/cuda/function.pyx``, ``_pointer``; ``cupy/_core/_scalar.pyx``, ``CScalar``):

- a ``cupy.ndarray`` becomes the address of its first element, whatever its strides: the kernel
  reads from there at the unit stride its C code uses, so a non-contiguous view (``y[::2]``,
  ``labels[:, 0]``) is read as if it were contiguous, i.e. the wrong elements;
- a NumPy array of size one is passed *by value* (its bytes), a larger one is refused with a
  TypeError; so a host array of one class id given for a ``long long*`` becomes the address
  ``y[0]``, an illegal access on the GPU;
- a Python scalar is packed as float64 (float), int64 (int), bool; a NumPy scalar as its own
  dtype; nothing is cast to the parameter's type: the kernel reads ``sizeof(param)`` bytes of
  whatever was packed (a Python float given for a ``float`` parameter reads half a double).

``kernel_arguments`` unpacks the arguments of a launch exactly so, from the parameter list of
the kernel's C source: a pointer parameter becomes a flat NumPy view of the parameter's type
over the memory from that address to the end of its allocation (a bad address raises the
``CUDARuntimeError`` a GPU would give, at the launch instead of at the next synchronisation), a
scalar parameter the NumPy scalar its bytes read as. Addresses stored in device memory (the
optimizer's pointer tables) resolve through the allocations whose ``.data.ptr`` was taken.
"""

from __future__ import annotations

import functools
import re
import weakref

import numpy as np

__all__ = ["CUDARuntimeError", "ILLEGAL", "Pointer", "address", "kernel_arguments", "memory_at",
           "register", "signature", "take"]

ILLEGAL = "cudaErrorIllegalAddress: an illegal memory access was encountered"
SIZE_ONE = ("You are trying to pass a numpy.ndarray of shape {} as a kernel parameter. Only numpy.ndarrays "
            "of size one can be passed by value. If you meant to pass a pointer to __global__ memory, you "
            "need to pass a cupy.ndarray instead.")


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""


def root_of(a):
    """The array that owns ``a``'s memory (through views and ``as_strided``'s wrapper)."""
    while True:
        base = a.base
        if isinstance(base, np.ndarray):
            a = base
        elif base is not None and isinstance(getattr(base, "base", None), np.ndarray):
            a = base.base
        else:
            return a


def address(a) -> int:
    """The address of the first element of the NumPy array ``a`` (CuPy's ``a.data.ptr``)."""
    return a.__array_interface__["data"][0]


_ALLOCATIONS = {}   # start address -> (weak reference to the owning array, its size in bytes)


def register(a):
    """Note the allocation behind ``a`` (its ``.data.ptr`` was taken: the address may be stored
    on the device and read back by a kernel). Returns ``address(a)``."""
    root = root_of(a)
    _ALLOCATIONS[address(root)] = (weakref.ref(root), root.nbytes)
    if len(_ALLOCATIONS) > 4096:
        for start in [s for s, (ref, _) in _ALLOCATIONS.items() if ref() is None]:
            del _ALLOCATIONS[start]
    return address(a)


def _raw(root):
    """The bytes of ``root``'s allocation, in memory order (a view)."""
    in_memory_order = root.transpose(sorted(range(root.ndim), key=lambda i: -abs(root.strides[i])))
    if not in_memory_order.flags.c_contiguous:
        raise AssertionError("an allocation that is not one block of memory")
    return in_memory_order.reshape(-1).view(np.uint8)


class Pointer:
    """A device address: the allocation ``root`` and a byte offset in it."""

    __slots__ = ("root", "offset")

    def __init__(self, root, offset):
        self.root, self.offset = root, offset

    @classmethod
    def of(cls, a):
        root = root_of(a)
        return cls(root, address(a) - address(root))

    @property
    def address(self):
        return address(self.root) + self.offset

    def view(self, dtype):
        """Flat memory of ``dtype`` from the address to the end of the allocation (writable)."""
        raw = _raw(self.root)[self.offset:]
        dtype = np.dtype(dtype)
        return raw[:len(raw) - len(raw) % dtype.itemsize].view(dtype)


def memory_at(addr, dtype):
    """Flat memory of ``dtype`` at the device address ``addr`` (an int), or the GPU's error."""
    addr = int(addr)
    for start, (ref, nbytes) in list(_ALLOCATIONS.items()):
        root = ref()
        if start <= addr < start + max(nbytes, 1) and root is not None and address(root) == start:
            return Pointer(root, addr - start).view(dtype)       # (a dead entry: freed memory)
    raise CUDARuntimeError(f"{ILLEGAL} (address {addr:#x} is in no live allocation)")


def take(flat, count, what="memory"):
    """The first ``count`` elements of ``flat``; reading past the allocation is the GPU's error."""
    count = int(count)
    if count > len(flat):
        raise CUDARuntimeError(f"{ILLEGAL} ({what}: {count} elements read, {len(flat)} in the allocation)")
    return flat[:count]


# ---------------------------------------------------------------------------- the kernel's parameters
C_TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned int": np.uint32,
           "long long": np.int64, "unsigned long long": np.uint64, "long": np.int64, "bool": np.bool_,
           "char": np.int8, "unsigned char": np.uint8, "short": np.int16, "size_t": np.uint64}


@functools.cache
def signature(source, name):
    """``[(parameter name, C type, is a pointer), ...]`` of kernel ``name`` in ``source``."""
    match = re.search(r'extern "C" __global__ void ' + re.escape(name) + r"\s*\(([^)]*)\)", source)
    assert match, f"{name} is not defined in the source it is launched from"
    params = []
    for decl in match.group(1).split(","):
        decl = " ".join(decl.replace("const", " ").replace("*", " * ").split())
        pointer = "*" in decl
        words = decl.replace("*", " ").split()
        params.append((words[-1], " ".join(words[:-1]), pointer))
    return tuple(params)


def _packed(value):
    """What CuPy hands the driver for one argument: a ``Pointer`` (a device array) or bytes."""
    if hasattr(value, "_a"):                                    # a stand-in device array
        return Pointer.of(value._a)
    if value is None:
        return bytes(8)
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise TypeError(SIZE_ONE.format(value.shape))
        return value.tobytes()
    if type(value) is bool:
        return np.bool_(value).tobytes()
    if type(value) is float:
        return np.float64(value).tobytes()
    if type(value) is int:
        return (np.uint64(value) if value >= 1 << 63 else np.int64(value)).tobytes()
    if isinstance(value, np.generic):
        return value.tobytes()
    raise TypeError(f"Unsupported type {type(value)}")


def kernel_arguments(source, name, dtype, args):
    """The arguments of a launch of kernel ``name`` as its code reads them (module docstring):
    flat typed memory for each pointer, a NumPy scalar of the declared type for each scalar."""
    params = signature(source, name)
    if len(args) != len(params):
        raise CUDARuntimeError(f"cudaErrorInvalidValue: {name} takes {len(params)} arguments, got {len(args)}")
    read = []
    for (pname, ctype, pointer), value in zip(params, args):
        item = np.dtype(dtype if ctype == "T" else C_TYPES[ctype])
        packed = _packed(value)
        if pointer:
            if isinstance(packed, Pointer):
                read.append(packed.view(item))
            else:                                               # bytes taken as an address
                addr = int.from_bytes(packed[:8].ljust(8, b"\xab"), "little")
                read.append(_Deferred(addr, item, f"{name}: {pname}"))
        else:
            raw = packed.address.to_bytes(8, "little") if isinstance(packed, Pointer) else packed
            read.append(np.frombuffer(raw[:item.itemsize].ljust(item.itemsize, b"\xab"), item)[0])
    return [a.resolve() if isinstance(a, _Deferred) else a for a in read]


class _Deferred:
    """An address that did not come from a device array: resolved (or refused) like any other."""

    def __init__(self, addr, dtype, what):
        self.addr, self.dtype, self.what = addr, dtype, what

    def resolve(self):
        if self.addr == 0:
            return None                                         # a null pointer: fails when read
        try:
            return memory_at(self.addr, self.dtype)
        except CUDARuntimeError as err:
            raise CUDARuntimeError(f"{err} ({self.what})") from None

"""Raw CUDA kernels launched with their arguments checked against the kernel's C parameters.

A raw kernel (``cupy.RawModule``) reads memory, not arrays: CuPy passes a device array as the
address of its first element, and a scalar as the bytes of its own type (a Python float as a
double, an int as a 64-bit integer), whatever the kernel declares (``cupy/cuda/function.pyx``).
So a host array, a strided view (read as if it were contiguous), an array of another dtype or a
scalar of another width would run, and compute garbage or fault. ``fast/cuda.py`` launches every
raw kernel of the fast tier through a ``Launcher``, which reads the kernel's parameter list from
its C source once and refuses such arguments with a sentence at each launch.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["Launcher", "parameters"]

_C_TYPES = {"int": np.int32, "long long": np.int64, "unsigned long long": np.uint64, "float": np.float32,
            "double": np.float64}


def parameters(topic_source, name, dtype):
    """``((name, dtype, kind), ...)`` of the kernel's C parameters, kind "scalar", "contiguous"
    (a pointer read at unit stride from the first element) or "rows" (a pointer ``p`` with a
    ``p_stride`` parameter: rows at that stride, unit stride inside a row)."""
    match = re.search(r'extern "C" __global__ void ' + name + r"\(([^)]*)\)", topic_source)
    if match is None:
        raise ValueError(f"kernel {name} is not defined in the source it is launched from")
    decls = [" ".join(d.replace("const", " ").replace("*", " * ").split()) for d in match.group(1).split(",")]
    names = {d.split()[-1] for d in decls}
    params = []
    for decl in decls:
        words = decl.split()
        ctype = " ".join(w for w in words[:-1] if w != "*")
        kind = "scalar" if "*" not in words else "rows" if f"{words[-1]}_stride" in names else "contiguous"
        params.append((words[-1], np.dtype(dtype if ctype == "T" else _C_TYPES[ctype]), kind))
    return tuple(params)


class Launcher:
    """A compiled raw kernel whose launches check their arguments first.

    A kernel reads raw memory: CuPy passes a device array as the address of its first element
    and a scalar as the bytes of its own type, whatever the kernel declares. So a host array, a
    strided view read as if contiguous, an array of another dtype or a Python float for a
    ``float`` parameter would run and compute garbage (or fault). Each launch refuses them with
    a sentence naming the kernel, the parameter and what it takes."""

    def __init__(self, name, params, function, ndarray):
        self.name, self.params, self.function, self.ndarray = name, params, function, ndarray

    def __call__(self, grid, block, args):
        if len(args) != len(self.params):
            raise TypeError(f"kernel {self.name} takes {len(self.params)} arguments, got {len(args)}")
        ndarray = self.ndarray
        for (pname, dtype, kind), value in zip(self.params, args):
            if kind == "scalar":
                if type(value) is not dtype.type:
                    raise TypeError(f"kernel {self.name}: {pname} must be a numpy.{dtype} scalar (the kernel "
                                    f"reads {dtype.itemsize} bytes), got {_describe(value)}")
                continue
            if not isinstance(value, ndarray):
                raise TypeError(f"kernel {self.name}: {pname} must be a CuPy array on the GPU (the kernel reads "
                                f"device memory), got {_describe(value)}")
            if value.dtype != dtype:
                raise TypeError(f"kernel {self.name}: {pname} must hold {dtype}, got {value.dtype}")
            unit = value.flags.c_contiguous if kind == "contiguous" else (
                value.ndim == 0 or value.shape[-1] <= 1 or value.strides[-1] == value.itemsize)
            if not unit:
                raise ValueError(f"kernel {self.name}: {pname} of shape {tuple(value.shape)} and strides "
                                 f"{tuple(value.strides)} is not contiguous; the kernel reads it at unit stride "
                                 "from its first element (pass cupy.ascontiguousarray of it)")
        self.function(grid, block, args)


def _describe(value):
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"a {type(value).__module__.split('.')[0]} {type(value).__name__} of {value.dtype} {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"

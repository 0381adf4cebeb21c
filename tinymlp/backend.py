"""The array backend: NumPy on the CPU, CuPy on CUDA, one code path through ``xp``.

Every op receives raw arrays and asks ``xp = array_module(x)`` for the module that owns them,
so the same formula runs on either device (Chainer's idea). CuPy is imported lazily, the first
time a CUDA device is asked for, and is never needed on the CPU.

Devices are named ``"cpu"``, ``"cuda"`` (the current GPU, index 0) and ``"cuda:N"``.
The canonical form of a device name is ``"cpu"``, ``"cuda"`` for GPU 0 and ``"cuda:N"`` otherwise.
"""

from __future__ import annotations

import operator
import sys

import numpy as np
from numpy.exceptions import AxisError

__all__ = [
    "DEFAULT_FLOAT",
    "CudaUnavailableError",
    "array_module",
    "check_axes",
    "cuda_available",
    "cuda_status",
    "device_of",
    "get_cupy",
    "is_float_dtype",
    "module_for_device",
    "parse_device",
    "require_float",
    "to_device",
]

DEFAULT_FLOAT = np.float32
"""The dtype floating-point data gets when none is asked for."""

_INSTALL_HINT = (
    'install CuPy for your CUDA version, e.g. pip install "tinymlp[cuda12]" '
    '(or "tinymlp[cuda13]"), and check that a GPU is visible with `python -m tinymlp doctor`'
)


class CudaUnavailableError(RuntimeError):
    """Raised when a CUDA device is asked for but CuPy or a GPU is missing."""


def parse_device(device) -> str:
    """Return the canonical name of ``device`` ("cpu", "cuda" or "cuda:N"); raise on nonsense."""
    if device is None:
        return "cpu"
    name = str(device).strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "cuda" or name == "gpu":
        return "cuda"
    if name.startswith("cuda:"):
        index = name[5:]
        if index.isdigit():
            return "cuda" if int(index) == 0 else f"cuda:{int(index)}"
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def _device_index(device: str) -> int:
    return 0 if device == "cuda" else int(device.split(":")[1])


_cupy = None
_cupy_error: str | None = None


def _import_cupy():
    """Import CuPy once; remember why it failed so the error can say so."""
    global _cupy, _cupy_error
    if _cupy is None and _cupy_error is None:
        try:
            import cupy  # noqa: PLC0415 - deliberately lazy: CuPy is optional

            _cupy = cupy
        except Exception as exc:  # ImportError, or a broken CUDA install raising at import
            _cupy_error = f"{type(exc).__name__}: {exc}"
    return _cupy


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cupy = _import_cupy()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_cupy(device: str = "cuda"):
    """Return the ``cupy`` module for ``device``, or raise a clear CudaUnavailableError."""
    cupy = _import_cupy()
    if cupy is None:
        raise CudaUnavailableError(
            f"device {device!r} needs CuPy, which could not be imported ({_cupy_error}); "
            + _INSTALL_HINT
        )
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise CudaUnavailableError(
            f"device {device!r}: CuPy is installed but no CUDA device is usable ({exc}); "
            + _INSTALL_HINT
        ) from None
    index = _device_index(device)
    if index >= count:
        raise CudaUnavailableError(
            f"device {device!r} does not exist: CuPy sees {count} CUDA device(s)"
        )
    return cupy


def module_for_device(device):
    """numpy for "cpu", cupy for a CUDA device (raising a clear error if unusable)."""
    device = parse_device(device)
    return np if device == "cpu" else get_cupy(device)


def array_module(x):
    """numpy or cupy, whichever owns the array ``x`` (numpy for scalars and lists)."""
    cupy = sys.modules.get("cupy")  # if CuPy was never imported, x cannot be a CuPy array
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return np


def device_of(x) -> str:
    """The canonical device name of array ``x``."""
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        index = x.device.id
        return "cuda" if index == 0 else f"cuda:{index}"
    return "cpu"


def to_device(x, device):
    """Return array ``x`` on ``device`` (the same object when it is already there)."""
    device = parse_device(device)
    if device == "cpu":
        if isinstance(x, np.ndarray):
            return x
        if device_of(x) != "cpu":
            return x.get()
        return np.asarray(x)
    cupy = get_cupy(device)
    if isinstance(x, cupy.ndarray) and device_of(x) == device:
        return x
    with cupy.cuda.Device(_device_index(device)):
        return cupy.asarray(x)


def is_float_dtype(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)


# ---------------------------------------------------------------------- argument checks shared by the ops
def require_float(op: str, x, name: str = "input"):
    """Raise a TypeError naming ``op`` and the dtype when ``x`` (a Tensor or an array) is not
    floating point: exp, log, softmax, layer_norm, cross-entropy logits ... are defined on real
    numbers, and an integer tensor would otherwise meet a raw casting error (or a silent float64)."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind != "f":
        raise TypeError(
            f"{op}: the {name} must be a floating-point tensor, got dtype {np.dtype(dtype)}; "
            f"convert it first, e.g. x.float() (float32) or x.double() (float64)"
        )
    return x


def check_axes(op: str, axis, shape) -> tuple:
    """``axis`` (an int or a sequence of ints) as a tuple of non-negative axes of a tensor of
    ``shape``; as NumPy does, an axis the tensor lacks raises ``AxisError`` (never wraps around)
    and an axis named twice raises ValueError; the message names ``op``, the axis and the shape."""
    ndim = len(shape)
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    out = []
    for a in axes:
        try:
            a = operator.index(a)
        except TypeError:
            raise TypeError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}") from None
        if not -ndim <= a < ndim:
            expected = f"an axis in {-ndim}..{ndim - 1}" if ndim else "axis=None (a 0-d tensor has no axes)"
            raise AxisError(
                f"{op}: axis {a} is out of bounds for a tensor of {ndim} dimension(s) (shape {tuple(shape)}); "
                f"expected {expected}"
            )
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} names the same axis twice (tensor of shape {tuple(shape)})")
    return tuple(out)

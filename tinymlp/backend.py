"""The array backend: NumPy on the CPU, CuPy on CUDA, one code path through ``xp``.

Every op receives raw arrays and asks ``xp = array_module(x)`` for the module that owns them,
so the same formula runs on either device (Chainer's idea). CuPy is imported lazily, the first
time a CUDA device is asked for, and is never needed on the CPU.

Devices are named ``"cpu"`` and ``"cuda"`` (``"cuda:0"`` and ``"gpu"`` mean the same). tinymlp uses
one GPU per process, the first one CuPy sees: to run on another, choose it before the process
starts, ``CUDA_VISIBLE_DEVICES=2 python train.py --device cuda``. (A ``"cuda:N"`` for N > 0 would
need every array, kernel launch, loader batch, optimizer buffer and random generator to make
GPU N current first; refusing it is simpler than getting one of those silently wrong.)

``memory_limit(device)`` says how much memory this process may use there (the GPU's; on the CPU the
smallest of the machine's, its container's and its ``ulimit``), for the checks that refuse a model
too big to train or to load before it is built.
"""

from __future__ import annotations

import operator
import os
import sys
from pathlib import Path

import numpy as np
from numpy.exceptions import AxisError

__all__ = [
    "ACCEPTED",
    "DEFAULT_FLOAT",
    "CudaUnavailableError",
    "array_module",
    "as_array",
    "check_axes",
    "cuda_available",
    "cuda_status",
    "cuda_ready",
    "add_cuda_check",
    "cgroup_memory_limit",
    "INSTALL_CUPY",
    "device_constant",
    "device_constants",
    "device_of",
    "get_cupy",
    "is_float_dtype",
    "memory_limit",
    "module_for_device",
    "parse_device",
    "require_float",
    "to_device",
]

DEFAULT_FLOAT = np.float32
"""The dtype floating-point data gets when none is asked for."""

# The PyPI name "tinymlp" belongs to an unrelated project: never suggest pip install "tinymlp[...]".
INSTALL_CUPY = ('pip install -e ".[cuda12]" from your tinymlp checkout, or pip install "cupy-cuda12x[ctk]" '
                '("cupy-cuda13x[ctk]" for CUDA 13; [ctk] brings the CUDA libraries CuPy compiles its kernels with)')
USE_CPU = "run on the CPU instead: device='cpu' (in the example scripts, leave out --device cuda)"

class CudaUnavailableError(RuntimeError):
    """Raised when a CUDA device is asked for but CuPy or a GPU is missing; ``reason`` is the
    short finding ("CuPy is not installed", "no NVIDIA driver found", ...)."""

    def __init__(self, message, reason=""):
        super().__init__(message)
        self.reason = reason


def parse_device(device) -> str:
    """Return the canonical name of ``device`` ("cpu" or "cuda"); raise on anything else."""
    if device is None:
        return "cpu"
    name = str(device).strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "cuda" or name == "gpu":
        return "cuda"
    if name.startswith("cuda:") and name[5:].isdigit():
        index = int(name[5:])
        if index == 0:
            return "cuda"
        raise ValueError(
            f"device {device!r}: tinymlp runs on one GPU per process, the first one CUDA shows it; "
            f"to use GPU {index}, start the process with CUDA_VISIBLE_DEVICES={index} and pass "
            f"device='cuda' (--device cuda)"
        )
    raise ValueError(f"unknown device {device!r}: expected 'cpu' or 'cuda'")


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


def cupy_module():
    """CuPy, imported on first use, or None where it does not import (``cuda_status`` says why)."""
    return _import_cupy()


def _nvidia_driver_present() -> bool:
    """Whether the NVIDIA driver (its kernel module or its user-space library libcuda) is here."""
    import ctypes  # noqa: PLC0415 - only when diagnosing

    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def cuda_status() -> tuple[int, str, str]:
    """(number of CUDA devices CuPy sees, what was found, what to do about it).

    The finding is short enough for a verdict line: "CuPy is not installed", "no NVIDIA driver
    found", "the NVIDIA driver is too old for CuPy's CUDA", "no CUDA device visible", or
    "1 device(s)"; the advice is empty when a device is there."""
    cupy = _import_cupy()
    if cupy is None:
        if _cupy_error and _cupy_error.startswith(("ModuleNotFoundError", "ImportError: No module")):
            return 0, "CuPy is not installed", f"to use a GPU: {INSTALL_CUPY}"
        return 0, f"CuPy is installed but does not import ({_cupy_error})", (
            f"reinstall CuPy for your CUDA version: {INSTALL_CUPY}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if not _nvidia_driver_present():
            return 0, "no NVIDIA driver found", (
                f"CuPy {cupy.__version__} is installed, but this machine has no NVIDIA driver ({detail}): "
                "a GPU needs the NVIDIA driver installed (not only CuPy)")
        if "insufficient" in str(exc).lower() or getattr(exc, "status", None) == 35:
            return 0, "the NVIDIA driver is too old for CuPy's CUDA", (
                f"({detail}): update the NVIDIA driver, or install the CuPy built for the driver's CUDA "
                "version (cupy-cuda12x for CUDA 12, cupy-cuda13x for CUDA 13)")
        if "no cuda-capable device" in str(exc).lower() or getattr(exc, "status", None) == 100:
            return 0, "no CUDA device visible", (
                f"the NVIDIA driver is present but reports no GPU ({detail}); check nvidia-smi and "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}")
        return 0, "no usable CUDA device", f"CUDA reports: {detail}; check nvidia-smi"
    if count == 0:
        return 0, "no CUDA device visible", "CuPy sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES"
    return count, f"{count} device(s)", ""


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cupy = _import_cupy()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _elementwise_check(cupy):
    x = cupy.arange(8, dtype=cupy.float32)
    y = x * x + 1                  # an elementwise kernel, compiled by CuPy at run time with NVRTC
    return (y, np.arange(8, dtype=np.float32) ** 2 + 1)


def _matmul_check(cupy):
    a = cupy.ones((16, 16), dtype=cupy.float32)
    return (a @ a, np.full((16, 16), 16, dtype=np.float32))      # cuBLAS


_cuda_checks = [("an elementwise float32 kernel", _elementwise_check), ("a float32 matmul", _matmul_check)]
_cuda_checked = {}   # id(cupy module) -> None (ready) or the one-line reason it is not


def add_cuda_check(what, check):
    """Register ``check(cupy)`` to run before CUDA is declared ready (``get_cupy``, ``doctor``).

    ``check`` runs something small on the GPU and returns ``(device result, NumPy expectation)``
    or None (nothing to compare); raising, or a result that differs, makes CUDA unusable with a
    one-line reason naming ``what``. The fast tier registers its kernels here (it lives above
    this module and cannot be imported from it)."""
    _cuda_checks.append((what, check))
    _cuda_checked.clear()


def cuda_ready(cupy) -> str | None:
    """Run the registered checks once per process: None when the GPU computes, else why not.

    The first CUDA work of a process is where a CuPy installed without the CUDA libraries it
    loads at run time (NVRTC, cuBLAS, the CUDA headers) fails; finding it here turns a raw
    traceback in the middle of a training step into one line before any work starts."""
    key = id(cupy)
    if key not in _cuda_checked:
        reason = None
        for what, check in _cuda_checks:
            try:
                result = check(cupy)
                if result is not None:
                    got, expected = result
                    got = got.get()
                    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
                        reason = f"{what} on the GPU gave a wrong result"
                        break
            except Exception as exc:
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                reason = f"{what} failed on the GPU ({type(exc).__name__}{': ' + detail if detail else ''})"
                break
        _cuda_checked[key] = reason
    return _cuda_checked[key]


def get_cupy(device: str = "cuda"):
    """Return the ``cupy`` module for ``device``, or raise a clear CudaUnavailableError.

    The first call also compiles and runs a few tiny kernels (``cuda_ready``): CuPy can see a
    GPU and still be unable to compute on it when the CUDA libraries it loads at run time are
    missing."""
    cupy = _import_cupy()
    count = 0
    if cupy is not None:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception:
            count = 0
    if count == 0:
        _, reason, advice = cuda_status()
        raise CudaUnavailableError(
            f"device {device!r} is not available: {reason}. {USE_CPU[0].upper() + USE_CPU[1:]}. "
            f"{advice[0].upper() + advice[1:]}; then check with: python -m tinymlp doctor",
            reason=reason,
        )
    reason = cuda_ready(cupy)
    if reason is not None:
        raise CudaUnavailableError(
            f"device {device!r} is not usable: CuPy {getattr(cupy, '__version__', '')} sees the GPU but {reason}; "
            f"CuPy is probably missing the CUDA libraries it loads at run time (NVRTC, cuBLAS, headers): "
            f"{INSTALL_CUPY}, or {USE_CPU}; then check with: python -m tinymlp doctor",
            reason=reason,
        )
    return cupy


def module_for_device(device):
    """numpy for "cpu", cupy for a CUDA device (raising a clear error if unusable)."""
    device = parse_device(device)
    return np if device == "cpu" else get_cupy(device)


# ---------------------------------------------------------------------- how much memory there is
def memory_limit(device) -> tuple[int | None, str]:
    """(bytes, where the bound comes from) of the memory this process may use on ``device``: the
    GPU's; on the CPU the smallest of the machine's RAM, the container's limit (cgroup v2
    ``memory.max`` or v1 ``memory.limit_in_bytes``) and the process's own (``ulimit -v``, ``-d``)."""
    if device == "cuda":
        try:
            return int(module_for_device("cuda").cuda.Device().mem_info[1]), "of memory on this cuda"
        except (ValueError, OSError, AttributeError):
            return None, "of memory on this cuda"
    bounds = []
    try:
        bounds.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "of memory on this cpu"))
    except (ValueError, OSError, AttributeError):
        pass
    cgroup = cgroup_memory_limit()
    if cgroup is not None:
        bounds.append((cgroup, "allowed by this container's memory limit (cgroup)"))
    try:
        import resource
    except ImportError:                                        # Windows: no ulimit
        resource = None
    for which, flag_ in ((getattr(resource, "RLIMIT_AS", None), "-v"), (getattr(resource, "RLIMIT_DATA", None), "-d")):
        if which is None:
            continue
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            bounds.append((soft, f"allowed by this process's memory limit (ulimit {flag_})"))
    return min(bounds) if bounds else (None, "of memory here")


def cgroup_memory_limit(root="/sys/fs/cgroup", membership="/proc/self/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), None when there is none or it cannot be read."""
    try:
        lines = Path(membership).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        path = path.lstrip("/")
        if controllers == "":                                  # v2: one unified hierarchy
            candidates = [Path(root) / path / "memory.max", Path(root) / "memory.max"]
        elif "memory" in controllers.split(","):               # v1: the memory controller's own tree
            candidates = [Path(root) / "memory" / path / "memory.limit_in_bytes",
                          Path(root) / "memory" / "memory.limit_in_bytes"]
        else:
            continue
        for candidate in candidates:
            try:
                text = candidate.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 2**60:            # "max", or v1's huge "unlimited"
                return int(text)
            break
    return None


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
        if x.device.id != 0:
            raise ValueError(f"a CuPy array on GPU {x.device.id}: tinymlp uses GPU 0 only; start the "
                             f"process with CUDA_VISIBLE_DEVICES={x.device.id} to run on that GPU")
        return "cuda"
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
    with cupy.cuda.Device(0):
        return cupy.asarray(x)


_device_constants = {}   # (id(array module), key) -> device array, least recently used first
MAX_DEVICE_CONSTANTS = 64


def device_constant(xp, key, make):
    """A small constant array on ``xp``'s device, uploaded once and then reused.

    ``make()`` builds it on the host (NumPy); ``key`` (hashable) names it: everything the array
    depends on, dtype included (e.g. ``("toeplitz_index", 8, 8)``). On the CPU this is just
    ``make()``. On CUDA it saves an upload (a host-to-device copy on the critical path) per use:
    Toeplitz indices, normalisation statistics, interpolation matrices. The array is shared:
    never write into it. The ``MAX_DEVICE_CONSTANTS`` most recently used are kept."""
    if xp is np:
        return make()
    full_key = (id(xp), key)
    value = _device_constants.pop(full_key, None)
    if value is None:
        value = xp.asarray(make())
    _device_constants[full_key] = value
    while len(_device_constants) > MAX_DEVICE_CONSTANTS:
        del _device_constants[next(iter(_device_constants))]
    return value


def device_constants() -> tuple:
    """The device constants kept now. A CUDA graph reads memory by address: one captured with
    some of them holds them all, since this cache may later let one go to the memory pool."""
    return tuple(_device_constants.values())


# ------------------------------------------------------------------------ arrays from user data
ACCEPTED = ("tinymlp tensors hold real numbers: give a number, a (nested, rectangular) list of numbers, "
            "or a NumPy/CuPy array of bool, integer or float dtype")


def as_array(data, dtype, device, what="tensor()"):
    """``data`` (an array, a nested list, a number) as an array of ``dtype`` on ``device``: float
    data becomes ``DEFAULT_FLOAT`` unless ``dtype`` says otherwise, integers and booleans keep
    their type; copied only when it must change device or dtype. Anything that is not real
    numbers is refused with a sentence that starts with ``what``."""
    xp = module_for_device(device)
    probe = _probe(data, what)
    if dtype is not None:
        _check_kind(dtype, "the dtype asked for", what)
    if probe.dtype.kind not in "biuf":
        _check_kind(probe.dtype, "the data", what)
    if probe is not data:
        data = probe  # converted once: no second pass over a long list
    if dtype is None:
        if probe.dtype == np.bool_ or np.issubdtype(probe.dtype, np.integer):
            dtype = probe.dtype
        else:
            dtype = DEFAULT_FLOAT  # float32 unless asked otherwise, whatever the input's float type
    if hasattr(data, "shape"):  # an array (or array scalar): move it if it lives elsewhere
        data = to_device(data, device)
    return xp.asarray(data, dtype=dtype)


def _probe(data, what):
    """``data`` as an array, or a TypeError/ValueError that says what tinymlp accepts."""
    if data is None:
        raise TypeError(f"{what}: cannot make a tensor from None; {ACCEPTED}")
    try:
        probe = data if hasattr(data, "dtype") and hasattr(data, "shape") else np.asarray(data)
    except ValueError:  # NumPy 2 refuses ragged nested lists ("inhomogeneous shape")
        raise ValueError(f"{what}: the nested lists are ragged (rows of different lengths); {ACCEPTED}") from None
    except OverflowError:
        probe = np.asarray(data, dtype=object)
    if probe.dtype == object and _big_int(probe):
        raise OverflowError(f"{what}: the integer {_big_int(probe)} does not fit int64, the widest integer dtype; "
                            "give it as a float (tinymlp.tensor(float(n)) or dtype='float64') if an "
                            "approximation will do")
    return probe


def _big_int(objects):
    """The first Python int in an object array that int64 cannot hold (None when there is none)."""
    for v in objects.ravel():
        if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
            return v
    return None


def _check_kind(dtype, what, caller):
    """Refuse dtypes that are not bool, integer or float (complex, strings, objects, dates)."""
    kind = np.dtype(dtype).kind
    if kind not in "biuf":
        name = {"c": "complex", "U": "string", "S": "bytes",
                "O": "Python objects (dtype object: None, a dict or mixed types inside)",
                "M": "datetime", "m": "timedelta", "V": "structured"}.get(kind, str(np.dtype(dtype)))
        raise TypeError(f"{caller}: {what} is {name} ({np.dtype(dtype)}); {ACCEPTED}")


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

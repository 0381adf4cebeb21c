"""The Function contract, checked: each mistake refused where it is made, naming the op.

``Function.apply`` calls ``check_inputs`` before forward runs; ``backward()`` starts from
``first_gradient`` and passes what each ``Function.backward`` returned through ``gradients``.
They raise errors that say which op, which input and what to do, instead of a NumPy error (or a
silently wrong gradient) later:

- a Tensor passed by keyword (it would get no gradient), inputs on different devices, an input
  that requires grad meeting a wider float (``MixedPrecisionError``);
- a backward that returns the wrong number of gradients, something that is not an array, or a
  gradient whose shape or dtype is not its input's (``GradientMismatchError``).
"""

from __future__ import annotations

import inspect
import sys

import numpy as np

from .backend import array_module, device_of
from .tensor import Tensor

__all__ = ["GradientMismatchError", "MixedPrecisionError", "check_inputs", "first_gradient", "gradients",
           "input_name"]


class GradientMismatchError(RuntimeError):
    """A Function's backward returned a gradient whose shape or dtype is not its input's.

    Attributes (for tools such as gradcheck): ``fn`` (the Function's name), ``index`` (which
    positional input; None for a wrong count), ``kind`` ("shape", "dtype", "count" or "type"),
    ``got`` and ``expected``.
    """

    def __init__(self, fn, index, kind, got, expected):
        self.fn, self.index, self.kind, self.got, self.expected = fn, index, kind, got, expected
        if kind == "shape":
            text = f"{fn}.backward returned a gradient of shape {got} for an input of shape {expected}"
        elif kind == "count":
            text = (f"{fn}.backward returned {got} gradient{'s' if got != 1 else ''} for {expected} "
                    f"input{'s' if expected != 1 else ''}: return one per positional input of forward, "
                    "in order (None for an input that needs none)")
        elif kind == "type":
            text = (f"{fn}.backward returned a {got} as the gradient of input {index}; backward works on "
                    f"raw arrays: return an array of the input's shape {expected} (or None)")
        else:
            text = (f"{fn}.backward returned a {got} gradient for a {expected} input "
                    "(an accidental upcast? keep constants in the input's dtype)")
        super().__init__(text)


class MixedPrecisionError(TypeError):
    """An op's input that requires grad meets a wider float input (float32 and float64), so its
    gradient would come back in the wider dtype. Attributes: ``fn``, ``name`` and ``dtype`` (the
    narrower input), ``other`` and ``widest``."""

    def __init__(self, fn, name, dtype, other, widest):
        self.fn, self.name, self.dtype, self.other, self.widest = fn, name, np.dtype(dtype), other, np.dtype(widest)
        super().__init__(
            f"{fn}: {name} is {dtype} but {other} is {widest}, so the result and the gradient of {name} would "
            f"be {widest}; convert them to one precision first (x.float() for float32, x.double() for float64)"
        )


def input_name(fn, i) -> str:
    """"input 1 'weight'": positional input ``i`` of ``fn.forward``, by number and name (a fast
    implementation is named by its reference)."""
    fn = getattr(fn, "reference", fn)
    try:
        params = list(inspect.signature(fn.forward).parameters)[1:]
    except (TypeError, ValueError):
        params = []
    return f"input {i}" + (f" '{params[i]}'" if i < len(params) and not params[i].startswith("*") else "")


def check_inputs(fn, args, arrays, kwargs, recording) -> None:
    """Refuse, at forward and naming the op, what backward would otherwise trip over later: a
    Tensor among the keyword options (it would get no gradient), an input that requires grad
    meeting a wider float while a graph is ``recording`` (float32 meeting float64: the result
    would be float64, and the float32 input's gradient with it), a CPU array meeting a CUDA array."""
    for key, value in kwargs.items():
        if isinstance(value, Tensor):
            raise TypeError(
                f"{fn.__name__}.apply: the tensor {key!r} was passed by keyword; pass tensors positionally, "
                f"in forward's order (keyword arguments are options: a tensor there would get no gradient)"
            )
    if recording and len({getattr(arr, "dtype", None) for arr in arrays} - {None}) > 1:   # several dtypes
        dtypes = [d if isinstance(d := getattr(arr, "dtype", None), np.dtype) else None for arr in arrays]
        if len(set(dtypes) - {None}) > 1:     # several NumPy dtypes: look closer
            floats = [(i, dtype) for i, dtype in enumerate(dtypes) if dtype is not None and dtype.kind == "f"]
            if len(floats) > 1:
                j, widest = max(floats, key=lambda f: f[1].itemsize)
                for i, dtype in floats:   # the output is `widest`: a narrower input's gradient would be too
                    if dtype.itemsize < widest.itemsize and isinstance(args[i], Tensor) and args[i].requires_grad:
                        raise MixedPrecisionError(fn.__name__, input_name(fn, i), dtype, input_name(fn, j), widest)
    if "cupy" not in sys.modules:  # without CuPy every array is a NumPy array: nothing more to check
        return
    if len({type(arr) for a, arr in zip(args, arrays) if isinstance(a, Tensor)}) < 2:
        return                     # one array type: one device (a Tensor holds no CuPy array off GPU 0)
    devices = [device_of(arr) for a, arr in zip(args, arrays) if isinstance(a, Tensor)]
    if len(set(devices)) > 1:
        raise RuntimeError(
            f"{fn.__name__}: inputs are on different devices ({', '.join(devices)}); "
            "move them to one device first with .to(device)"
        )


def gradients(node, returned) -> tuple:
    """What ``node.fn.backward`` returned, as one gradient per positional input, each checked
    against its input's shape and dtype; or a ``GradientMismatchError`` that says what is wrong.

    Trailing inputs that are not arrays (a shape, an axis) may be left out, as they always get
    None; an array input may not.
    """
    name = getattr(node.fn, "reference", node.fn).__name__   # a fast implementation by its reference
    grads = returned if isinstance(returned, tuple) else (returned,)
    n = len(node.parents)
    if len(grads) != n:              # fewer: only trailing inputs that are not arrays may be left out
        arrays = [i for i, shape in enumerate(node.input_shapes) if shape is not None]
        least = arrays[-1] + 1 if arrays else 0
        if not least <= len(grads) <= n:
            raise GradientMismatchError(name, None, "count", len(grads), n)
    for i, g in enumerate(grads):
        if g is None:
            continue
        if not (hasattr(g, "shape") and hasattr(g, "dtype")) or isinstance(g, Tensor):
            raise GradientMismatchError(name, i, "type", type(g).__name__, node.input_shapes[i])
        if node.parents[i] is None:        # no gradient needed here: not checked, not used
            continue
        if g.shape != node.input_shapes[i]:
            raise GradientMismatchError(name, i, "shape", tuple(g.shape), tuple(node.input_shapes[i]))
        if g.dtype != node.input_dtypes[i]:
            raise GradientMismatchError(name, i, "dtype", str(g.dtype), str(node.input_dtypes[i]))
    return grads + (None,) * (n - len(grads))


def first_gradient(root, grad):
    """dL/d(root), where ``backward()`` starts: ``grad``, checked against root, or 1 for a scalar root."""
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (built under no_grad, or from constants)")
    xp = array_module(root.array)
    if grad is None:
        if root.size != 1:
            raise RuntimeError(f"backward() without a gradient needs a scalar output, got shape {root.shape}; "
                               "pass backward(grad) with an array of that shape")
        return xp.ones_like(root.array)
    grad = xp.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=root.dtype)
    if grad.shape != root.shape:
        raise RuntimeError(f"backward(): gradient of shape {grad.shape} for an output of shape {root.shape}")
    return grad

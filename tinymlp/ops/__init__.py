"""Differentiable operations: one topic per file, each op a ``Function`` subclass.

Primitives: ``elementwise``, ``reduce``, ``shape``, ``matmul``. The functions below are the
public, NumPy-named forms (also available as Tensor methods and as ``tinymlp.add`` etc.).

Constants (Python numbers, NumPy arrays) mix with tensors as in NumPy; an array constant
takes the dtype of the float tensor it meets, so a stray float64 array cannot silently turn a
float32 model into a float64 one.
"""

from __future__ import annotations

import numpy as np

from ..grad_mode import is_grad_enabled
from ..backend import check_axes, is_float_dtype, require_float
from ..tensor import Tensor
from .elementwise import Add, AsType, Div, Exp, Log, Mul, Neg, Pow, ReLU, Sigmoid, Sqrt, Sub, Tanh, Where
from .matmul import MatMul
from .reduce import Max, Mean, Sum
from .shape import Concatenate, GetItem, Reshape, Transpose

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "matmul",
    "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "where", "astype",
    "sum", "mean", "max", "reshape", "transpose", "getitem", "concatenate", "split", "stack",
]


def _constant(value, like: Tensor):
    """A non-Tensor operand as an array on ``like``'s device (and dtype, for float tensors)."""
    if type(value) in (int, float, bool):  # not np.float64, a float subclass that is not weak
        return value  # Python scalars are 'weak' in NumPy 2: they adopt the tensor's dtype
    xp = like.xp
    if is_float_dtype(like.dtype):
        return xp.asarray(value, dtype=like.dtype)
    return xp.asarray(value)


def _binary(fn, a, b):
    if not isinstance(a, Tensor):
        a = _constant(a, b)
    elif not isinstance(b, Tensor):
        b = _constant(b, a)
    try:
        return fn.apply(a, b)
    except ValueError:  # NumPy's gufunc text names neither the op nor both shapes: say them
        shape_error(fn.__name__.lower(), getattr(a, "shape", ()), getattr(b, "shape", ()))
        raise  # the shapes fit: some other problem, NumPy's own message


def shape_error(op: str, sa: tuple, sb: tuple) -> None:
    """Raise a ValueError naming ``op`` and both shapes when they do not fit ``op``
    (``matmul``: a's last axis against b's second-to-last; else NumPy broadcasting)."""
    sa, sb = tuple(sa), tuple(sb)
    if op == "matmul":
        if not sa or not sb:
            raise ValueError(f"matmul: shapes {sa} and {sb}: a @ b needs tensors with at least one axis "
                             "(use * to multiply by a scalar)")
        inner_b = sb[-2] if len(sb) > 1 else sb[0]
        if sa[-1] != inner_b:
            where = "second-to-last" if len(sb) > 1 else "only"
            raise ValueError(f"matmul: shapes {sa} and {sb} do not fit: a @ b needs a's last axis ({sa[-1]}) "
                             f"to equal b's {where} axis ({inner_b})")
        ba, bb, skip, what = sa[:-2], sb[:-2], 2, "batch axis"  # all but the last two axes broadcast
    else:
        ba, bb, skip, what = sa, sb, 0, "axis"
    for i in range(1, min(len(ba), len(bb)) + 1):
        if ba[-i] != bb[-i] and 1 not in (ba[-i], bb[-i]):
            raise ValueError(f"{op}: shapes {sa} and {sb} cannot broadcast: {what} {-i - skip} has sizes "
                             f"{ba[-i]} and {bb[-i]} (expected equal sizes, or 1 in one of them)")


def add(a, b):
    return _binary(Add, a, b)


def sub(a, b):
    return _binary(Sub, a, b)


def mul(a, b):
    return _binary(Mul, a, b)


def div(a, b):
    return _binary(Div, a, b)


def pow(a, b):  # noqa: A001 - NumPy's name
    return _binary(Pow, a, b)


def matmul(a, b):
    return _binary(MatMul, a, b)


def neg(x):
    return Neg.apply(x)


def exp(x):
    return Exp.apply(require_float("exp", x))


def log(x):
    return Log.apply(require_float("log", x))


def sqrt(x):
    return Sqrt.apply(require_float("sqrt", x))


def tanh(x):
    return Tanh.apply(require_float("tanh", x))


def sigmoid(x):
    return Sigmoid.apply(require_float("sigmoid", x))


def relu(x):
    return ReLU.apply(x)


def astype(x, dtype):
    """``x`` cast to ``dtype`` (differentiable between float dtypes)."""
    target = np.dtype(dtype)
    if target.kind != "f" and x.requires_grad and is_grad_enabled():
        raise TypeError(
            f"astype: cannot cast a tensor that requires grad to {target}: a gradient cannot flow "
            f"through {target} values (only float dtypes carry one); for an integer copy outside the "
            f"graph use x.detach().astype({str(target)!r})"
        )
    return AsType.apply(x, dtype)


def where(cond, a, b):
    """Elementwise ``a if cond else b`` (cond is a constant boolean array or tensor)."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("where(cond, a, b) needs a or b to be a Tensor")
    cond = cond.data if isinstance(cond, Tensor) else like.xp.asarray(cond)
    a = a if isinstance(a, Tensor) else _constant(a, like)
    b = b if isinstance(b, Tensor) else _constant(b, like)
    return Where.apply(cond, a, b)


def sum(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001 - NumPy's name
    return Max.apply(x, axis=axis, keepdims=keepdims)


def reshape(x, shape):
    return Reshape.apply(x, tuple(shape) if not isinstance(shape, int) else (shape,))


def transpose(x, axes=None):
    return Transpose.apply(x, axes)


def getitem(x, index):
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return GetItem.apply(x, index)


def concatenate(tensors, axis=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate needs at least one tensor")
    return Concatenate.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    """Join tensors of one shape along a new axis."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    (axis,) = check_axes("stack", axis, (len(tensors),) + tensors[0].shape)
    expanded = [reshape(t, t.shape[:axis] + (1,) + t.shape[axis:]) for t in tensors]
    return concatenate(expanded, axis=axis)


def split(x, indices_or_sections, axis=0):
    """Split ``x`` along ``axis`` as ``numpy.split`` does; each piece is a differentiable slice."""
    (axis,) = check_axes("split", axis, x.shape)
    n = x.shape[axis]
    if isinstance(indices_or_sections, int):
        if n % indices_or_sections:
            raise ValueError(f"split: axis {axis} of size {n} does not divide into {indices_or_sections} equal parts")
        step = n // indices_or_sections
        bounds = list(range(step, n, step))
    else:
        bounds = list(indices_or_sections)
    edges = [0, *bounds, n]
    lead = (slice(None),) * axis
    return [getitem(x, lead + (slice(lo, hi),)) for lo, hi in zip(edges[:-1], edges[1:])]

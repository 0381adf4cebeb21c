"""Step 1 of gradcheck: what to check.

``collect`` sorts fn's inputs and a Module's parameters into the tensors to check (floating
point, ``requires_grad=True``), named after fn's parameters (``MyOp.apply`` is named after
``MyOp.forward``'s) or a Module's dotted parameter names, and the constants. It makes the
float64 working copies: an input gets a fresh leaf; a parameter keeps its identity and has its
``.data`` swapped for the copy during the check (``Plan.swap_in`` / ``swap_out``). Small array
helpers used by every step live at the bottom.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import numpy as np

from ..autograd import Function
from ..backend import is_float_dtype, to_device
from ..tensor import Tensor

@dataclass
class Checked:
    """One tensor under check: ``tensor`` is what the forward sees during the check."""

    name: str
    kind: str  # "input" or "param"
    tensor: Tensor  # a float64 copy (input) or the parameter itself with swapped data
    original: Tensor
    snapshot: np.ndarray  # the user's values, to verify they come back untouched

    @property
    def dtype(self):
        return str(self.snapshot.dtype)

    @property
    def size(self):
        return self.tensor.size


@dataclass
class Swap:
    """A parameter whose ``.data`` is replaced by a check-dtype copy during the check."""

    param: Tensor
    data: object  # the working copy
    requires_grad: bool  # True when the parameter is checked
    saved: tuple = ()


class Plan:
    """The result of sorting fn's inputs and parameters into checked tensors and constants."""

    def __init__(self):
        self.input_names = []
        self.args = []  # what fn receives positionally
        self.checked: list[Checked] = []
        self.swaps: list[Swap] = []
        self.constants: list[tuple[str, object]] = []  # arrays the forward must not modify
        self.check_dtype = None  # the dtype the check runs in
        self.work_dtype = None  # the dtype copies are made in (None: each keeps its own)
        self.promoted_from = ()
        self.xp = np

    def swap_in(self):
        for s in self.swaps:
            s.saved = (s.param.data, s.param.grad, s.param.requires_grad)
            s.param.data, s.param.grad, s.param.requires_grad = s.data, None, s.requires_grad

    def swap_out(self):
        for s in reversed(self.swaps):
            if s.saved:
                s.param.data, s.param.grad, s.param.requires_grad = s.saved
                s.saved = ()

    def originals_unchanged(self) -> bool:
        return all(same_bits(host(c.original.data), c.snapshot) for c in self.checked)


def collect(fn, inputs, params, wrt, exclude, names, dtype) -> Plan:
    """Name every float tensor that requires grad, decide what is checked, make the copies."""
    inputs = as_tuple(inputs)
    input_names = _input_names(fn, len(inputs), names)
    params = _params_of(fn, params)
    candidates = _candidates(input_names, inputs, params)
    selected = _select(candidates, wrt, exclude)

    plan = Plan()
    plan.input_names = input_names
    chosen = [candidates[k][2] for k in selected]
    plan.check_dtype = np.dtype(dtype) if dtype is not None else min(
        (np.dtype(t.dtype) for t in chosen), key=lambda d: d.itemsize)
    plan.work_dtype = None if dtype is None else plan.check_dtype
    plan.promoted_from = tuple(sorted({str(t.dtype) for t in chosen} - {str(plan.check_dtype)}))
    if len({t.device for t in chosen}) > 1:
        where = ", ".join(f"{candidates[k][0]} on {candidates[k][2].device}" for k in selected)
        raise ValueError(f"gradcheck: tensors on different devices ({where}); move them to one device")
    plan.xp = chosen[0].xp

    # Inputs get a fresh float64 leaf; parameters stay the same objects, with swapped data.
    param_ids = {id(p) for p in params.values()}
    working = {}
    for key, (name, kind, t) in candidates.items():
        if key in param_ids:
            working[key] = t
        else:
            working[key] = leaf(working_array(t.data, plan.work_dtype), key in selected, name)
        if key in selected:
            plan.checked.append(Checked(name, kind, working[key], t, host(t.data).copy()))
    constants = []
    for name, p in params.items():
        if isinstance(p, Tensor) and is_float_dtype(p.dtype):
            if all(s.param is not p for s in plan.swaps):  # tied weights: swap once
                plan.swaps.append(Swap(p, working_array(p.data, plan.work_dtype), id(p) in selected))
        elif isinstance(p, Tensor):
            constants.append((name, p.data))

    for name, x in zip(input_names, inputs):
        if id(x) in working:
            plan.args.append(working[id(x)])
        elif isinstance(x, Tensor) and is_float_dtype(x.dtype) and plan.work_dtype is not None:
            plan.args.append(leaf(working_array(x.data, plan.work_dtype), False))  # a float constant
        else:
            plan.args.append(x)
            if isinstance(x, Tensor):
                constants.append((name, x.data))
            elif hasattr(x, "shape") and hasattr(x, "dtype"):
                constants.append((name, x))
    constants += [(name, b.data if isinstance(b, Tensor) else b) for name, b in _buffers_of(fn)]
    plan.constants = [(name, arr, host(arr).copy()) for name, arr in constants]
    return plan


def _candidates(input_names, inputs, params):
    """id -> (name, kind, tensor) for every float tensor that requires grad; inputs first.

    A tensor passed twice (or tied between two parameters) is one candidate, named after its
    first use: its gradient is the sum over all uses, which also tests the accumulation.
    """
    candidates = {}
    for name, x in zip(input_names, inputs):
        if _wants_grad(x) and id(x) not in candidates:
            candidates[id(x)] = (name, "input", x)
    for name, p in params.items():
        if _wants_grad(p) and id(p) not in candidates:
            candidates[id(p)] = (name, "param", p)
    return candidates


def _select(candidates, wrt, exclude):
    """The ids of the candidates that ``wrt`` / ``exclude`` leave to check."""
    known = [name for name, _, _ in candidates.values()]
    for label, chosen in (("wrt", wrt), ("exclude", exclude)):
        unknown = [w for w in (chosen or ()) if w not in known]
        if unknown:
            raise ValueError(f"gradcheck: {label}={unknown} names no checkable tensor; known names: {known}")
    selected = [k for k, (name, _, _) in candidates.items()
                if (wrt is None or name in wrt) and (exclude is None or name not in exclude)]
    if not selected:
        raise ValueError(
            "gradcheck: nothing to check: no input is a floating-point Tensor with requires_grad=True "
            "(arrays, integers and tensors without grad are constants)"
            + (f"; wrt/exclude left none of {known}" if known else "")
        )
    return selected


def as_tuple(inputs):
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def is_module(fn):
    return callable(getattr(fn, "named_parameters", None))


def _wants_grad(x):
    return isinstance(x, Tensor) and x.requires_grad and is_float_dtype(x.dtype)


def _params_of(fn, params) -> dict:
    if params == "auto":
        return dict(fn.named_parameters()) if is_module(fn) else {}
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise TypeError("gradcheck: params must be 'auto', None or a dict {name: Tensor}")
    return dict(params)


def _buffers_of(fn):
    named_buffers = getattr(fn, "named_buffers", None)
    return list(named_buffers()) if callable(named_buffers) else []


def _input_names(fn, n, names):
    """Names of the positional inputs: ``names``, else fn's parameter names (``MyOp.forward``'s
    after ctx for ``MyOp.apply``; a Module's ``forward``'s), else input0, input1, ..."""
    if names is not None:
        names = list(names)
        if len(names) != n:
            raise ValueError(f"gradcheck: {len(names)} names for {n} inputs")
        return names
    target, skip = fn, 0
    if is_module(fn) and hasattr(fn, "forward"):
        target = fn.forward
    elif _function_of(fn) is not None:
        target, skip = _function_of(fn).forward, 1  # forward(ctx, x, w): skip ctx
    try:
        parameters = list(inspect.signature(target).parameters.values())[skip:]
    except (TypeError, ValueError):
        parameters = ()
    positional = []
    for p in parameters:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        positional.append(p.name)
    return [positional[i] if i < len(positional) else f"input{i}" for i in range(n)]


def _function_of(fn):
    """The Function class when fn is ``SomeFunction.apply``, else None."""
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", None) == "apply" and isinstance(owner, type) and issubclass(owner, Function):
        return owner
    return None


_DEFAULT_OPTIONS = dict(params="auto", wrt=None, exclude=None, mode="auto", dtype="float64", eps=None,
                        rtol=None, atol=None, upstream="random", kwargs=None)


class _Code(str):
    """Text shown as it is in the reproduce line (``params={'w': w}``), not as a quoted string."""

    def __repr__(self):
        return str(self)


def describe_call(fn, inputs, input_names, seed=0, **options) -> str:
    """The gradcheck call that repeats this one, with what fn and the inputs are in a comment::

        tinymlp.gradcheck(Swish.apply, (x,), seed=0)   # x: (4,5) float64

    Options that differ from their default are written out; tensors by their names.
    """
    if options.get("dtype") is not None:
        options["dtype"] = np.dtype(options["dtype"]).name
    if isinstance(options.get("params"), dict):
        options["params"] = _Code("{" + ", ".join(f"{k!r}: {k}" for k in options["params"]) + "}")
    if options.get("upstream") is not None and not isinstance(options["upstream"], str):
        options["upstream"] = _Code("g")
    given = "".join(f", {k}={v!r}" for k, v in options.items() if v != _DEFAULT_OPTIONS.get(k))
    notes = []
    if is_module(fn):
        callee = type(fn).__name__.lower()
        notes.append(f"{callee}: a {type(fn).__name__}")
    elif _function_of(fn) is not None or (getattr(fn, "__name__", "<") [0] != "<"
                                          and "<locals>" not in getattr(fn, "__qualname__", "<locals>")):
        callee = describe(fn)
    else:
        callee = "fn"
        code = getattr(fn, "__code__", None)
        if code is not None:
            path = code.co_filename
            try:
                relative = os.path.relpath(path)
                path = path if relative.startswith("..") else relative
            except ValueError:  # another drive (Windows)
                pass
            what = "the lambda" if fn.__name__ == "<lambda>" else f"{fn.__name__}"
            notes.append(f"fn: {what} at {path}:{code.co_firstlineno}")
    inputs = as_tuple(inputs)
    for name, x in zip(input_names, inputs):
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            notes.append(f"{name}: {str(tuple(x.shape)).replace(' ', '')} {x.dtype}")
        else:
            notes.append(f"{name}={x!r}"[:40])
    args = ", ".join(input_names) + ("," if len(input_names) == 1 else "")
    return f"tinymlp.gradcheck({callee}, ({args}){given}, seed={seed})" + ("   # " + "; ".join(notes) if notes else "")


def working_array(data, dtype):
    """A C-contiguous copy in ``dtype`` (or in its own dtype when dtype is None)."""
    return data.astype(dtype if dtype is not None else data.dtype, order="C", copy=True)


def leaf(data, requires_grad, name=None):
    t = Tensor(data, dtype=data.dtype)  # shares ``data``
    t.requires_grad = requires_grad
    t.name = name
    return t


def describe(fn) -> str:
    if is_module(fn):
        return type(fn).__name__
    if inspect.ismethod(fn):
        owner = fn.__self__ if inspect.isclass(fn.__self__) else type(fn.__self__)
        return f"{owner.__name__}.{fn.__name__}"
    return getattr(fn, "__qualname__", None) or type(fn).__name__



# ------------------------------------------------------------------------------- array helpers


def host(a):
    """A NumPy view (CPU) or copy (GPU) of an array."""
    return np.asarray(to_device(a, "cpu")) if hasattr(a, "shape") else np.asarray(a)


def same_bits(a, b) -> bool:
    """Equal bit for bit (so -0.0 != 0.0 and NaN == NaN)."""
    a, b = host(a), host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = [np.ascontiguousarray(x).view(np.uint8) for x in (a, b)]
    return bool(np.array_equal(*bits))


def close_bits(a, b) -> bool:
    """Equal up to a few ulps (two runs of a deterministic forward; GPU reductions may reorder)."""
    a, b = host(a), host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not is_float_dtype(a.dtype):
        return bool(np.array_equal(a, b))
    tol = 100 * float(np.finfo(a.dtype).eps)
    scale = float(np.abs(a[np.isfinite(a)]).max(initial=0.0))
    return bool(np.allclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True))


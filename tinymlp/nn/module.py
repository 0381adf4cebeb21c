"""``Parameter`` and ``Module``: how layers hold their weights, in the manner of ``torch.nn``.

A ``Module`` is a Python object whose attributes may be ``Parameter`` s (trainable tensors),
other ``Module`` s (sub-layers) or buffers (tensors that belong to the model but are not
trained). Assigning such an attribute *registers* it, in order::

    class MLP(Module):
        def __init__(self, rng=None):
            super().__init__()               # first: creates the registries
            rng = init.as_rng(rng)
            self.fc1 = Linear(4, 8, rng=rng)  # registered as child "fc1"
            self.fc2 = Linear(8, 2, rng=rng)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    mlp = MLP()
    [name for name, _ in mlp.named_parameters()]   # ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']

Registered attributes stay ordinary attributes (reading ``self.fc1`` is a plain lookup); the
ordered dicts ``_parameters``, ``_modules`` and ``_buffers`` only remember their order and
kind, which is what ``named_parameters()``, ``state_dict()``, ``to()`` and ``repr()`` walk.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, NamedTuple

import numpy as np

from ..backend import DEFAULT_FLOAT, array_module, is_float_dtype, to_device
from ..guard import mark_written
from ..tensor import Tensor

__all__ = ["Module", "Parameter", "StateDictError", "value_problem"]


class Parameter(Tensor):
    """A trainable tensor: a leaf with ``requires_grad=True``, float32 unless ``dtype`` says otherwise.

    Integer or boolean data is converted to float (a parameter must be differentiable).
    The data is shared with the given array when no conversion is needed, as in PyTorch.
    """

    def __init__(self, data, dtype=None):
        if dtype is None:
            probe = data.data if isinstance(data, Tensor) else data
            dtype_in = getattr(probe, "dtype", None)   # (np.asarray would refuse a CuPy array)
            if not is_float_dtype(dtype_in if dtype_in is not None else np.asarray(probe).dtype):
                dtype = DEFAULT_FLOAT
        super().__init__(data, requires_grad=True, dtype=dtype)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class StateDictError(RuntimeError):
    """A state dict that does not fit the module; lists every mismatch at once.

    Attributes: ``missing`` (keys the module has and the state lacks), ``unexpected`` (keys
    the state has and the module lacks), ``mismatched`` (``(key, module_shape, state_shape)``),
    as returned by ``Module.state_mismatches``, and ``invalid`` (``(key, reason)`` for each value
    that has the right shape but cannot be loaded: integers, booleans or complex numbers for a
    float parameter, NaN or infinite values, a value that overflows the parameter's dtype).
    The message names the module's class (``model``) and the state (``source``, e.g. "state
    dict" or "checkpoint"), after ``where``.
    """

    def __init__(self, model: str, missing, unexpected, mismatched, source: str = "state dict", where: str = "",
                 invalid=()):
        self.missing, self.unexpected, self.mismatched = list(missing), list(unexpected), list(mismatched)
        self.invalid = list(invalid)
        n = len(self.missing) + len(self.unexpected) + len(self.mismatched) + len(self.invalid)
        lines = [f"{where}the {source} does not fit this {model} ({n} problem{'s' * (n != 1)}):"]
        if self.missing:
            lines.append(f"  missing keys (in the model, not in the {source}): {len(self.missing)}")
            lines += [f"    {k}" for k in self.missing]
        if self.unexpected:
            lines.append(f"  unexpected keys (in the {source}, not in the model): {len(self.unexpected)}")
            lines += [f"    {k}" for k in self.unexpected]
        if self.mismatched:
            lines.append(f"  wrongly shaped keys: {len(self.mismatched)}")
            lines += [f"    {k}: {source} {s}, model {m}" for k, m, s in self.mismatched]
        if self.invalid:
            lines.append(f"  values that cannot be loaded: {len(self.invalid)}")
            lines += [f"    {k}: {why}" for k, why in self.invalid]
        super().__init__("\n".join(lines))


def value_problem(value, dtype) -> str | None:
    """Why the array ``value`` cannot be loaded into a tensor of ``dtype``, or None if it can.

    A float tensor takes floating-point values only (float16/32/64), every one finite and
    within the range of ``dtype``: integer weights (a quantized int8 checkpoint), booleans and
    complex numbers are refused with the reason, since casting them would load numbers the
    model was never trained with. An integer tensor takes integers (or booleans) that fit it.
    """
    raw = _raw(value)
    got = getattr(raw, "dtype", None)
    if got is None:
        try:
            raw = np.asarray(raw)
        except (TypeError, ValueError) as err:
            return f"not an array ({type(value).__name__}: {err})"
        got = raw.dtype
    got, dtype = np.dtype(got), np.dtype(dtype)
    if got.kind not in "biufc":
        return f"holds {got} values, not numbers"
    if got.kind == "c":
        return f"holds complex numbers ({got}); a real tensor would silently drop their imaginary parts"
    if dtype.kind == "f":
        if got.kind == "b":
            return "holds booleans, not the floating-point values of a weight"
        if got.kind in "iu":
            return (f"holds integers ({got}): a quantized or integer weight; dequantize it to floating point "
                    "(value * scale) before loading it")
        xp = array_module(raw)
        finite = xp.isfinite(raw)
        if not bool(finite.all()):
            bad = int(raw.size - int(xp.count_nonzero(finite)))
            return f"holds {bad} NaN or infinite value{'s' * (bad != 1)} (of {raw.size})"
        if got.itemsize > dtype.itemsize and raw.size:
            biggest = float(xp.abs(raw).max())
            if biggest > float(np.finfo(dtype).max):
                return f"holds {biggest:.3g}, beyond the largest {dtype} ({np.finfo(dtype).max:.3g})"
        return None
    if dtype.kind in "iu":
        if got.kind == "f":
            return f"holds floating-point values ({got}), not the integers of this {dtype} buffer"
        if raw.size and got.kind != "b":
            info = np.iinfo(dtype)
            lo, hi = int(raw.min()), int(raw.max())
            if lo < info.min or hi > info.max:
                return f"holds values in [{lo}, {hi}], outside the range of {dtype}"
        return None
    if dtype.kind == "b" and got.kind != "b":
        return f"holds {got} values, not booleans"
    return None


class LoadResult(NamedTuple):
    """What ``load_state_dict(strict=False)`` skipped."""

    missing_keys: list
    unexpected_keys: list


class Module:
    """Base class of every layer and model. Subclasses call ``super().__init__()`` first and
    define ``forward``; calling the module calls ``forward``."""

    training: bool

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            if isinstance(value, (Parameter, Module)):
                raise AttributeError(
                    f"{type(self).__name__}: call super().__init__() at the top of __init__, "
                    f"before assigning the {type(value).__name__} '{name}'"
                )
            object.__setattr__(self, name, value)
            return
        params, modules, buffers = d["_parameters"], d["_modules"], d["_buffers"]
        if isinstance(value, Parameter):
            modules.pop(name, None)
            buffers.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in params or name in modules:
            kind = "parameter" if name in params else "submodule"
            if value is not None:
                raise TypeError(
                    f"{type(self).__name__}.{name} is a registered {kind}; cannot replace it with a "
                    f"{type(value).__name__}" + (
                        " (wrap it in nn.Parameter, or change the values in place through .data)"
                        if kind == "parameter" else " (assign a Module, or None to remove it)"
                    )
                )
            (params if kind == "parameter" else modules).pop(name)
        elif name in buffers:
            value = _as_buffer(value)
            buffers[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        for registry in (self._parameters, self._modules, self._buffers):
            registry.pop(name, None)
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param):
        """Same as ``setattr(self, name, param)``; ``param=None`` just sets the attribute."""
        setattr(self, name, param)

    def add_module(self, name: str, module):
        """Register ``module`` under ``name`` (a name that need not be an identifier, e.g. "0")."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"add_module('{name}'): expected a Module, got {type(module).__name__}")
        setattr(self, name, module)

    def register_buffer(self, name: str, value, persistent: bool = True):
        """Register a non-trained tensor (e.g. a fixed position embedding).

        Buffers move with ``to(device)``; persistent ones are saved in ``state_dict()``.
        """
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        value = _as_buffer(value)
        self._buffers[name] = value
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "", _memo=None) -> Iterator[tuple[str, "Module"]]:
        """(dotted name, module) for this module ("") and every descendant, each once."""
        memo = set() if _memo is None else _memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        yield from self._modules.items()

    def children(self) -> Iterator["Module"]:
        yield from self._modules.values()

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) in registration order. A parameter shared by two layers
        (tied weights) is yielded once, under the first name that reaches it."""
        seen = set()
        owners = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, module in owners:
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        seen = set()
        for mod_name, module in self.named_modules(prefix):
            for name, b in module._buffers.items():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    yield (f"{mod_name}.{name}" if mod_name else name), b

    def buffers(self) -> Iterator[Tensor]:
        for _, b in self.named_buffers():
            yield b

    def apply(self, fn) -> "Module":
        """Call ``fn(module)`` on every descendant (children first) and on self; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Number of scalars in the (deduplicated) parameters."""
        return sum(p.size for p in self.parameters() if p.requires_grad or not trainable_only)

    # ------------------------------------------------------------------ state
    def train(self, mode: bool = True) -> "Module":
        """Set ``.training`` on this module and every descendant (Dropout reads it)."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, flag: bool = True) -> "Module":
        """Freeze (False) or unfreeze every parameter."""
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (set to None: the next backward allocates fresh)."""
        for p in self.parameters():
            p.grad = None

    def to(self, device=None, dtype=None) -> "Module":
        """Move (and/or cast) every parameter and buffer *in place*; returns self.

        The Parameter objects stay the same, only their ``.data`` (and ``.grad``) change, so
        references held elsewhere stay valid. Build the optimizer after moving the model:
        optimizer state created for the old arrays does not move with them.
        """
        def convert(arr):
            if arr is None:
                return None
            if device is not None:
                arr = to_device(arr, device)
            if dtype is not None and is_float_dtype(arr.dtype) and arr.dtype != np.dtype(dtype):
                arr = arr.astype(dtype)
            return arr

        for t in [*self.parameters(), *self.buffers()]:
            t.data = convert(t.data)
            t.grad = convert(t.grad)
        return self

    def state_tensors(self) -> "OrderedDict[str, Tensor]":
        """Dotted name -> the Tensor itself of each parameter and persistent buffer (not a copy)."""
        state = OrderedDict(self.named_parameters())
        for mod_name, module in self.named_modules():
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    state[f"{mod_name}.{name}" if mod_name else name] = b
        return state

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Dotted name -> NumPy *copy* of each parameter and persistent buffer."""
        return OrderedDict((k, np.array(to_device(t.data, "cpu"), copy=True)) for k, t in self.state_tensors().items())

    def state_mismatches(self, state) -> tuple[list, list, list]:
        """How ``state`` (name -> array or Tensor) differs from this module's state dict, from
        names and shapes alone (nothing is copied): ``(missing, unexpected, mismatched)``, the
        keys only the module has, the keys only ``state`` has, and ``(key, module_shape,
        state_shape)`` for each key whose shapes differ. All three empty: ``state`` fits."""
        own = self.state_tensors()
        shapes = {k: tuple(np.shape(_raw(v))) for k, v in state.items()}
        missing = [k for k in own if k not in shapes]
        unexpected = [k for k in shapes if k not in own]
        mismatched = [(k, tuple(t.shape), shapes[k]) for k, t in own.items()
                      if k in shapes and shapes[k] != tuple(t.shape)]
        return missing, unexpected, mismatched

    def load_state_dict(self, state, strict: bool = True) -> LoadResult:
        """Copy ``state`` (name -> array or Tensor) into the parameters and buffers, in place.

        All or nothing: every value is checked, cast to its tensor's dtype and moved to its
        device before any tensor changes. Any wrongly shaped key, any value that
        ``value_problem`` refuses (integer, boolean or complex values for a float parameter,
        NaN or infinite values, values that overflow the dtype), and with ``strict=True`` any
        missing or unexpected key, raises a ``StateDictError`` that lists all of them.
        """
        prepared, result = self.prepare_state(state, strict)
        self.assign_state(prepared)
        return result

    def prepare_state(self, state, strict=True, error=None):
        """The first half of ``load_state_dict``, which changes nothing (a caller loading several
        objects all or nothing checks each first): ``({key: value ready to copy}, LoadResult)``, or
        the StateDictError (built by ``error``, e.g. a checkpoint's subclass, from ``(missing,
        unexpected, mismatched, invalid)``)."""
        missing, unexpected, mismatched = self.state_mismatches(state)
        wrong = {k for k, _, _ in mismatched}
        prepared, invalid = {}, []
        for k, t in self.state_tensors().items():
            if k not in state or k in wrong:
                continue
            why = value_problem(state[k], t.dtype)
            if why is not None:
                invalid.append((k, why))
                continue
            prepared[k] = to_device(_raw(state[k]), t.device).astype(t.dtype, copy=False)
        if mismatched or invalid or (strict and (missing or unexpected)):
            if error is None:
                raise StateDictError(type(self).__name__, missing, unexpected, mismatched, invalid=invalid)
            raise error(missing, unexpected, mismatched, invalid)
        return prepared, LoadResult(missing, unexpected)

    def assign_state(self, prepared):
        """The second half of ``load_state_dict``: copy what ``prepare_state`` returned, in place."""
        own = self.state_tensors()
        for k, value in prepared.items():
            t = own[k]
            t.data[...] = value
            mark_written(t)       # a graph that saved the old values can no longer run backward

    # ------------------------------------------------------------------ printing
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's line in ``repr`` (override it)."""
        return ""

    def __repr__(self):
        return "\n".join(self._repr_lines())

    def _repr_lines(self) -> list[str]:
        n = self.num_parameters()
        inside = ", ".join(s for s in (self.extra_repr(), f"{format_count(n)} params" if n else "") if s)
        lines = [f"{type(self).__name__}({inside})"]
        # consecutive identical children with numeric names print once: "(0-7): 8 x MixerBlock(...)"
        groups: list[list] = []
        for name, child in self._modules.items():
            body = child._repr_lines()
            last = groups[-1] if groups else None
            if last and name.isdigit() and last[0][-1].isdigit() and last[2] == body:
                last[0].append(name)
            else:
                groups.append([[name], child, body])
        for names, _, body in groups:
            label = names[0] if len(names) == 1 else f"{names[0]}-{names[-1]}"
            head = body[0] if len(names) == 1 else f"{len(names)} x {body[0]}"
            lines.append(f"  ({label}): {head}")
            lines += ["  " + line for line in body[1:]]
        return lines


def format_count(n: int) -> str:
    """12 -> '12', 12544 -> '12.5K', 4490000 -> '4.49M' (three significant digits)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= 0.9995 * scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _raw(value):
    return value.data if isinstance(value, Tensor) else value


def _as_buffer(value):
    """A buffer is a Tensor that does not require grad (or None)."""
    if value is None or isinstance(value, Tensor):
        return value
    dtype = getattr(value, "dtype", None)
    return Tensor(value, dtype=dtype)

"""A float32 model stays float32: no float64 array in forward, backward or the optimizer step.

One float64 constant (``np.float64(c) * x``, a ``np.zeros(n)`` without dtype, ``np.sqrt`` of a
Python number) silently upcasts every array it touches and doubles the memory traffic of a
step; written into a float32 buffer with ``out=`` it even leaves no trace in the results. So
this test watches the NumPy calls themselves. Every array of the model (parameters, input,
and the optimizer's flat buffers) is a ``Watched`` array: a view of the same memory whose
``__array_ufunc__`` / ``__array_function__`` see every NumPy call that any watched array takes
part in, and record it when an operand or a result is float64. Results of those calls are
watched in turn, so the whole step is covered: the arithmetic inside each op, the products,
the reductions, the optimizer's in-place updates. In addition every Function's outputs,
saved arrays and gradients are checked by name (a clearer message when an op is at fault).

The tests that plant a float64 constant show that the watch catches what the results alone
would not.
"""

import functools
import math
import sys

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import optim
from tinymlp.autograd import Function
from tinymlp.models import AMLP, GMLP, MLPMixer

F64 = np.dtype(np.float64)
COMMON = dict(image_size=8, patch_size=2, in_channels=3, num_classes=5, seed=0)   # 16 tokens
MODELS = {
    "mixer": lambda: MLPMixer(dim=12, depth=2, token_mlp_dim=6, channel_mlp_dim=20, **COMMON),
    "gmlp": lambda: GMLP(dim=12, depth=2, ffn_dim=24, **COMMON),
    "amlp": lambda: AMLP(dim=12, depth=2, ffn_dim=24, attn_dim=8, **COMMON),
}


# --------------------------------------------------------------------------- the watch
def _caller():
    """file:line of the innermost tinymlp frame on the stack (where the float64 came from)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/tinymlp/" in name and "/tests/" not in name:
            return f"{name.split('/tinymlp/')[-1]}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "outside tinymlp"


def _is_f64(v):
    return isinstance(v, (np.ndarray, np.generic)) and v.dtype == F64


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


class Watched(np.ndarray):
    """An ndarray that records every float64 operand or result of the NumPy calls it joins."""

    log = None  # a list while a watch is on

    def __array_finalize__(self, obj):
        if Watched.log is not None and self.dtype == F64:
            Watched.log.append(f"a float64 array {self.shape} at {_caller()}")

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        _report(name, list(inputs) + list(out or ()), kwargs)
        raw = [x.view(np.ndarray) if isinstance(x, Watched) else x for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Watched) else o for o in out)
        result = getattr(ufunc, method)(*raw, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        _report(name + " (result)", [result], {})
        return _watch(result)

    def __array_function__(self, func, types, args, kwargs):
        name = f"np.{func.__name__}"
        _report(name, list(_flat(args)) + list(_flat(kwargs.values())), kwargs)
        result = super().__array_function__(func, types, args, kwargs)
        _report(name + " (result)", list(_flat([result])), {})
        return result


def _report(name, values, kwargs):
    if Watched.log is None:
        return
    if any(_is_f64(v) for v in values) or (kwargs.get("dtype") is not None and np.dtype(kwargs["dtype"]) == F64):
        Watched.log.append(f"{name} with float64 at {_caller()}")


def _watch(value):
    if isinstance(value, tuple):
        return tuple(_watch(v) for v in value)
    return value.view(Watched) if isinstance(value, np.ndarray) and not isinstance(value, Watched) else value


def _watch_all_arrays(obj):
    """Replace the ndarray attributes of ``obj`` (and ndarrays in its dict attributes) by watched views."""
    for key, value in vars(obj).items():
        if isinstance(value, np.ndarray):
            setattr(obj, key, _watch(value))
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, np.ndarray):
                    value[k] = _watch(v)


@pytest.fixture
def watch(monkeypatch):
    """Turn the watch on; also check every Function's outputs, saved arrays and gradients."""
    return _install_watch(monkeypatch)


def _install_watch(monkeypatch):
    log = []
    monkeypatch.setattr(Watched, "log", log)

    def check(where, arrays):
        for a in arrays:
            if _is_f64(a):
                log.append(f"{where}: a float64 array {a.shape}")

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    def rewrap(raw, checked):
        """The checking wrapper as the same kind of method as ``raw`` (the fast tier's classes
        that look their kernels up through ``cls`` have classmethods)."""
        if isinstance(raw, classmethod):
            return classmethod(lambda cls, *a, **k: checked(functools.partial(raw.__func__, cls), *a, **k))
        return staticmethod(functools.partial(checked, raw.__func__))

    def checked_forward(_forward, ctx, *args, _name="", **kwargs):
        out = _forward(ctx, *args, **kwargs)
        check(f"{_name}.forward output", [out])
        check(f"{_name}.forward saved", ctx.saved_tensors)
        return out

    def checked_backward(_backward, ctx, grad, _name=""):
        grads = _backward(ctx, grad)
        check(f"{_name}.backward gradient", grads if isinstance(grads, tuple) else (grads,))
        return grads

    for fn in set(subclasses(Function)):
        for name, checked in (("forward", checked_forward), ("backward", checked_backward)):
            if name in vars(fn):
                monkeypatch.setattr(fn, name, rewrap(vars(fn)[name], functools.partial(checked, _name=fn.__name__)))
    return log


def _train_two_steps(model, log):
    """Watched parameters and input; step 1 creates the optimizer's buffers, which are then
    watched too; step 2 runs entirely under the watch. Returns the optimizer."""
    for p in model.parameters():
        p.data = _watch(p.data)
    opt = optim.AdamW(optim.param_groups(model, weight_decay=0.05), lr=1e-3)
    rng = np.random.default_rng(0)
    x = tinymlp.tensor(_watch(rng.standard_normal((3, 3, 8, 8)).astype(np.float32)))
    y = np.array([0, 1, 4])
    for step in range(2):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        assert loss.dtype == np.float32
        loss.backward()
        opt.step()
        if step == 0:
            for flat in opt.flat_state or ():      # the fast tier's flat buffers
                _watch_all_arrays(flat)
            for group in opt.state:           # the per-parameter state (views of those buffers)
                for state in group:
                    if state:
                        for k, v in state.items():
                            if k != "step":
                                state[k] = _watch(v)
    return opt


def _assert_float32_state(model, opt):
    for name, p in model.named_parameters():
        assert p.data.dtype == np.float32, name
        assert p.grad.dtype == np.float32, name
    arrays = [a for group in opt.state for s in group if s for k, a in s.items() if k != "step"]
    for flat in opt.flat_state or ():               # the fast tier's buffers
        arrays += [flat.grad, flat.work, *flat.bufs.values()]
    assert arrays and all(a.dtype == np.float32 for a in arrays)


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("kind", list(MODELS))
def test_float32_model_creates_no_float64_array(kind, watch):
    model = MODELS[kind]()
    opt = _train_two_steps(model, watch)
    assert not watch, "float64 in a float32 training step:\n  " + "\n  ".join(dict.fromkeys(watch))
    _assert_float32_state(model, opt)


def test_a_float64_constant_hidden_inside_gelu_is_caught(watch, monkeypatch):
    """c0 as np.float64: x2 * (c0 * c1) becomes float64, but every result GELU writes with
    out= is still float32, so only the watch on the calls sees it."""
    from tinymlp import fast
    from tinymlp.fast import activation

    monkeypatch.setattr(activation, "C0", np.float64(math.sqrt(2.0 / math.pi)))
    model = MODELS["mixer"]()
    with fast.enabled():                # the constant planted is the fast tier's
        _train_two_steps(model, watch)
    assert any("activation.py" in line and "gelu_tanh_into" in line for line in watch), watch[:5]
    for p in model.parameters():       # the results themselves never showed it
        assert p.data.dtype == np.float32


def test_a_float64_constant_in_the_optimizer_is_caught(watch, monkeypatch):
    from tinymlp.fast import optim as fast_optim

    correct = fast_optim.DIRECTIONS["adam"]

    def upcast(group, g, bufs, out, t):
        correct(group, g, bufs, out, t)
        out *= np.float64(1.0)          # harmless in value, float64 arithmetic in fact

    monkeypatch.setitem(fast_optim.DIRECTIONS, "adam", upcast)
    with tinymlp.fast.enabled():        # the update planted is the fast tier's
        _train_two_steps(MODELS["gmlp"](), watch)
    assert any("np.multiply with float64" in line for line in watch), watch[:5]


def test_a_float64_result_of_an_op_is_caught_by_name(monkeypatch):
    from tinymlp import fast
    from tinymlp.ops.norm import LayerNorm

    impl = fast.implementation(LayerNorm)    # the class that runs
    forward = impl.forward

    def upcast(ctx, *args, **kwargs):
        return forward(ctx, *args, **kwargs).astype(np.float64)

    monkeypatch.setattr(impl, "forward", staticmethod(upcast))
    watch = _install_watch(monkeypatch)      # after the plant: it wraps the faulty forward
    model = MODELS["amlp"]()
    with pytest.raises(TypeError):      # the next Linear refuses to mix float64 and float32
        _train_two_steps(model, watch)
    assert any("LayerNorm.forward output" in line for line in watch), watch[:5]

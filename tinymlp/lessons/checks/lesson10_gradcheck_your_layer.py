"""Lesson 10's checks: RMSNorm's backward (10.1), Swish's (10.2), and a layer of the student's own,
written as a Function and gradchecked (10.3)."""

from __future__ import annotations

import inspect

import numpy as np

from ...tensor import Tensor
from ..registry import CostCase, Wrong, exercise
from .common import close, exact, grads, rows, run_gradcheck, shown_as, t64, wrong_term


def rms_norm_reference(x, w, eps=1e-6):
    return w * x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)


def rms_norm_cost(rng):
    return CostCase((rng.normal(size=(32, 1024)), rng.uniform(0.5, 1.5, 1024)), (True, True), rms_norm_reference)


@exercise("10.1", "RMSNorm backward", answer="RMSNormFunction", seed=15, derived=True, cost=rms_norm_cost,
          reference="tinymlp/ops/norm.py (LayerNorm.backward: the same derivation with the mean)",
          forbidden=("tinymlp.ops.norm.normalize_backward",))
def rmsnorm(cls, case):
    rng = case.rng
    shape = case.pick((3, 4, 6), (2, 3, 5))
    x, w = t64(rng.normal(size=shape)), t64(rng.uniform(0.5, 1.5, shape[-1]))

    @shown_as(cls)

    def rms_norm(x, weight):
        return cls.apply(x, weight)

    X, Wn = x.numpy().copy(), w.numpy().copy()
    r = 1 / np.sqrt((X ** 2).mean(axis=-1, keepdims=True) + 1e-6)
    x_hat = X * r
    close("forward", rms_norm(x, w), Wn * x_hat)
    run_gradcheck(rms_norm, (x, w), case, explain=lambda report: rms_norm_terms(report, rms_norm, X, Wn))
    g = rng.normal(size=shape)
    h = g * Wn
    dx, dw = grads(rms_norm, (t64(X), t64(Wn)), g)
    exact("dL/dx", dx, r * (h - x_hat * (h * x_hat).mean(axis=-1, keepdims=True)))
    exact("dL/dweight", dw, rows(g * x_hat).sum(axis=0))


def rms_norm_terms(report, rms_norm, X, Wn):
    """Which term of dL/dx = r H - r x_hat mean(H x_hat) the answer has wrong, if one."""
    g = np.random.default_rng(0).normal(size=X.shape)
    r = 1 / np.sqrt((X ** 2).mean(axis=-1, keepdims=True) + 1e-6)
    x_hat, h = X * r, g * Wn
    terms = [("r H (H = G * weight)", r * h),
             ("- r x_hat mean(H x_hat)", -r * x_hat * (h * x_hat).mean(axis=-1, keepdims=True))]
    dx = grads(rms_norm, (t64(X), t64(Wn)), g)[0]
    wrong_term(report, "x", dx, sum(t for _, t in terms), terms, of="dL/dx")


def swish_reference(x):
    return x / (1 + np.exp(-x))


def swish_cost(rng):
    return CostCase((rng.normal(size=(64, 512)) * 3,), (True,), swish_reference)


@exercise("10.2", "Swish backward", answer="SwishFunction", seed=16, derived=True, cost=swish_cost,
          reference="tinymlp/ops/elementwise.py (Sigmoid.backward)",
          forbidden=("tinymlp.ops.elementwise.Sigmoid",))
def swish_backward(cls, case):
    x = t64(case.rng.normal(size=case.pick((5, 7), (4, 6))) * 3)

    @shown_as(cls)

    def swish(x):
        return cls.apply(x)

    X = x.numpy().copy()
    s = 1 / (1 + np.exp(-X))
    close("forward", swish(x), X * s)
    run_gradcheck(swish, (x,), case, explain=lambda report: swish_terms(report, swish, X))
    g = case.rng.normal(size=x.shape)
    exact("dL/dx", grads(swish, (t64(X),), g)[0], g * (s + X * s * (1 - s)))


def swish_terms(report, swish, X):
    """Which term of dy/dx = s + x s (1 - s) the answer has wrong, if one."""
    g = np.random.default_rng(0).normal(size=X.shape)
    s = 1 / (1 + np.exp(-X))
    terms = [("s = sigmoid(x)", g * s), ("x s (1 - s)", g * X * s * (1 - s))]
    wrong_term(report, "x", grads(swish, (t64(X),), g)[0], g * (s + X * s * (1 - s)), terms, of="dy/dx")


@exercise("10.3", "a layer of your own, gradchecked", answer="(my_layer, layer_inputs)", derived=True,
          reference="tinymlp/gradcheck/method.py (the check itself)")
def own_layer(answer, case):
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise Wrong("pass a pair (fn, inputs): the function (or Module) and the inputs to check it at")
    fn, inputs = answer
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if not any(getattr(t, "requires_grad", False) for t in inputs) and not hasattr(fn, "parameters"):
        raise Wrong("give at least one input with requires_grad=True (or a Module with parameters)")
    named = [("input", name, t) for name, t in _named(fn, inputs)]
    named += [("parameter", name, t) for name, t in _parameters(fn)]
    unchecked = [f"{kind} {name!r} {tuple(t.shape)}" for kind, name, t in named
                 if isinstance(t, Tensor) and np.dtype(t.dtype).kind == "f" and not t.requires_grad]
    if unchecked:
        raise Wrong(f"{', '.join(unchecked)}: a float tensor without requires_grad=True, so gradcheck never checks "
                    "its gradient (a gain, a slope, a temperature: whatever your backward returns a gradient for); "
                    "create it with requires_grad=True, or, if it is a constant of the layer, leave it out of the "
                    "inputs (a closure, or a keyword argument of forward)")
    run_gradcheck(fn, inputs, case)
    if case.backwards is not None and not case.backwards():
        raise Wrong("the layer's gradient comes from tinymlp's own ops, not from a backward you wrote: write the "
                    "layer as a Function (forward and backward on arrays) and call it with .apply")


def _named(fn, inputs):
    """(name, input) pairs, named as fn's parameters are (input0, input1, ... where it has none)."""
    target = getattr(fn, "forward", fn) if hasattr(fn, "parameters") else fn
    try:
        names = [p.name for p in inspect.signature(target).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    return [(names[i] if i < len(names) else f"input{i}", t) for i, t in enumerate(inputs)]


def _parameters(fn):
    """A Module's (name, parameter) pairs; none for a function."""
    named = getattr(fn, "named_parameters", None)
    return list(named()) if callable(named) else []

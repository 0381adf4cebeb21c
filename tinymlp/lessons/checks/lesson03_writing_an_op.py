"""Lesson 3's checks: Linear's backward (03.1) and GELU's (03.2), each written as a Function."""

from __future__ import annotations

import numpy as np

from ..registry import CostCase, exercise
from .common import C0, C1, close, exact, gelu_grad, grads, rows, run_gradcheck, shown_as, t64, wrong_term
from .common import gelu as gelu_reference


def linear_cost(rng):
    x, w, b = rng.normal(size=(64, 256)), rng.normal(size=(256, 256)), rng.normal(size=256)
    return CostCase((x, w, b), (True, True, True), lambda x, w, b: x @ w + b)


@exercise("03.1", "Linear backward", answer="MyLinear", seed=3, derived=True, cost=linear_cost,
          reference="tinymlp/ops/linear.py (Linear.backward)",
          forbidden=("tinymlp.ops.linear.Linear", "tinymlp.ops.matmul.MatMul"))
def linear(cls, case):
    rng = case.rng
    lead = case.pick((2, 5), (3, 2))
    for w_shape in case.pick([(4, 4), (4, 3)], [(5, 5), (5, 2)]):
        x, w = t64(rng.normal(size=lead + w_shape[:1])), t64(rng.normal(size=w_shape))
        b = t64(rng.normal(size=w_shape[1]))

        @shown_as(cls)

        def linear(x, weight, bias):
            return cls.apply(x, weight, bias)

        X, Wn, bn = x.numpy().copy(), w.numpy().copy(), b.numpy().copy()
        close("forward", linear(x, w, b), X @ Wn + bn)
        run_gradcheck(linear, (x, w, b), case)
        g = rng.normal(size=lead + w_shape[1:])
        dx, dw, db = grads(linear, (t64(X), t64(Wn), t64(bn)), g)
        exact("dL/dx", dx, g @ Wn.T)
        exact("dL/dweight", dw, rows(X).T @ rows(g))
        exact("dL/dbias", db, rows(g).sum(axis=0))


def gelu_cost(rng):
    return CostCase((rng.normal(size=(64, 512)) * 2,), (True,), gelu_reference)


@exercise("03.2", "GELU backward", answer="MyGELU", seed=4, derived=True, cost=gelu_cost,
          reference="tinymlp/ops/activation.py (GELU.backward)",
          forbidden=("tinymlp.ops.activation.GELU",))
def gelu_backward(cls, case):
    x = t64(case.rng.normal(size=case.pick((4, 6), (3, 7))) * 2)

    @shown_as(cls)

    def gelu(x):
        return cls.apply(x)

    X = x.numpy().copy()
    close("forward", gelu(x), gelu_reference(X))
    run_gradcheck(gelu, (x,), case, explain=lambda report: gelu_terms(report, gelu, X))
    g = case.rng.normal(size=x.shape)
    exact("dL/dx", grads(gelu, (t64(X),), g)[0], g * gelu_grad(X))


def gelu_terms(report, gelu, X):
    """Which term of dy/dx = h + x (1 - t^2)/2 c0 (1 + 3 c1 x^2) the answer has wrong, if one."""
    g = np.random.default_rng(0).normal(size=X.shape)
    t = np.tanh(C0 * (X + C1 * X**3))
    outer = g * 0.5 * X * (1 - t * t) * C0
    terms = [("h = (1 + t)/2", g * 0.5 * (1 + t)),
             ("x (1 - t^2)/2 c0 (1 + 3 c1 x^2)", outer * (1 + 3 * C1 * X * X)),
             ("x (1 - t^2)/2 c0 (the 1 of 1 + 3 c1 x^2)", outer),
             ("x (1 - t^2)/2 c0 3 c1 x^2", outer * 3 * C1 * X * X)]
    wrong_term(report, "x", grads(gelu, (t64(X),), g)[0], g * gelu_grad(X), terms, of="dy/dx",
               constants={"c0 = sqrt(2/pi)": C0, "3": 3.0})

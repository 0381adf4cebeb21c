"""Lesson 4's checks: LayerNorm's backward as a Function (04.1) and its Jacobian (04.2)."""

from __future__ import annotations

import numpy as np

from ..registry import CostCase, exercise
from .common import close, exact, grads, normalize, normalize_grad, rows, run_gradcheck, shown_as, t64
from .common import layer_norm as layer_norm_reference


def layer_norm_cost(rng):
    x, gamma, beta = rng.normal(size=(32, 1024)) * 2 + 1, rng.normal(size=1024), rng.normal(size=1024)
    return CostCase((x, gamma, beta), (True, True, True), lambda x, g, b: layer_norm_reference(x, g, b, 1e-5))


@exercise("04.1", "LayerNorm backward", answer="MyLayerNorm", seed=5, derived=True, cost=layer_norm_cost,
          reference="tinymlp/ops/norm.py (LayerNorm.backward, normalize_backward)",
          forbidden=("tinymlp.ops.norm.LayerNorm", "tinymlp.ops.norm.normalize_backward"))
def layernorm(cls, case):
    rng = case.rng
    shape = case.pick((2, 3, 8), (3, 2, 5))
    x = t64(rng.normal(size=shape) * 2 + 1)
    gamma, beta = t64(rng.normal(size=shape[-1])), t64(rng.normal(size=shape[-1]))

    @shown_as(cls)

    def layer_norm(x, gamma, beta):
        return cls.apply(x, gamma, beta)

    X, G, Bt = (t.numpy().copy() for t in (x, gamma, beta))
    close("forward", layer_norm(x, gamma, beta), layer_norm_reference(X, G, Bt, 1e-5))
    run_gradcheck(layer_norm, (x, gamma, beta), case)
    g = rng.normal(size=shape)
    x_hat, r = normalize(X, 1e-5)
    dx, dgamma, dbeta = grads(layer_norm, (t64(X), t64(G), t64(Bt)), g)
    exact("dL/dx", dx, normalize_grad(g * G, x_hat, r))
    exact("dL/dgamma", dgamma, rows(g * x_hat).sum(axis=0))
    exact("dL/dbeta", dbeta, rows(g).sum(axis=0))


@exercise("04.2", "LayerNorm Jacobian", answer="layer_norm_jacobian", seed=6, derived=True,
          reference="tinymlp/ops/norm.py (normalize_backward: J g without J)",
          forbidden=("tinymlp.ops.norm.normalize_backward",))
def jacobian(layer_norm_jacobian, case):
    for D in case.pick((5, 8), (6, 3)):
        row = case.rng.normal(loc=1.0, scale=2.0, size=D)
        x_hat, r = normalize(row, 1e-5)
        want = r * (np.eye(D) - 1 / D - np.outer(x_hat, x_hat) / D)
        exact(f"J for a row of {D}", layer_norm_jacobian(row.copy(), 1e-5), want)

"""Lesson 1's checks: a logistic neuron's gradient (01.1) and a central difference (01.2)."""

from __future__ import annotations

import numpy as np

from ..registry import exercise
from ..wire import Named
from .common import array_of, close, exact


@exercise("01.1", "a logistic neuron's gradient", answer="neuron_gradient", seed=1, derived=True,
          reference="tinymlp/ops/elementwise.py (Sigmoid.backward: s (1 - s))")
def neuron(neuron_gradient, case):
    rng = case.rng
    n = case.pick(4, 7)
    for _ in range(3):
        x, w, b, t = rng.normal(size=n), rng.normal(size=n), rng.normal(), rng.normal() * 0.5
        y = 1 / (1 + np.exp(-(w @ x + b)))
        dz = (y - t) * y * (1 - y)
        dw, db = neuron_gradient(w.copy(), b, x.copy(), t)
        exact("dL/dw", dw, dz * x)
        exact("dL/db", np.asarray(array_of(db, "dL/db")).reshape(()), dz)


@exercise("01.2", "central difference", answer="my_central_difference",
          reference="tinymlp/gradcheck/method.py (Evaluator.central_differences)")
def central(central_difference, case):
    # f(x) = x^3: the central difference is exactly 3x^2 + h^2 (the h^2 f'''/6 term), a one-sided
    # difference 3x^2 + 3xh + h^2
    points = case.pick([(0.7, 1e-2), (-1.3, 1e-3), (2.0, 0.1)],
                       [(float(case.rng.uniform(-2, 2)), h) for h in (3e-2, 2e-3, 0.2)])
    for x, h in points:
        got = central_difference(Named("cube"), x, h)
        close(f"central_difference(x**3, {x:.4g}, h={h})", got, 3 * x * x + h * h, rtol=1e-9, atol=1e-12)
    xs = case.pick(np.array([0.0, 1.0, 2.0]), case.rng.uniform(-3, 3, size=5))
    want = np.cos(xs)
    got = central_difference(Named("sin"), xs.copy(), 1e-5)
    close(f"central_difference(sin, {np.round(xs, 3).tolist()})", got, want, rtol=1e-8)

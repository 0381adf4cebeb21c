"""Inputs too special for some bugs to show: the report's warnings about the point of the check.

A check compares gradients at one point. At some points whole classes of wrong backward formulas
give exactly the right numbers, and the check passes however wrong they are:

* a tensor that is all ones: a factor of it applied the wrong number of times (a forgotten gain,
  a temperature divided by tau where tau^2 belongs) multiplies by 1; all zeros: a term that
  carries it as a factor vanishes;
* a batch of one: a sum over the whole batch where forward works on each row is that row's sum;
* whole numbers: kinks (relu, abs, round) sit exactly there, and identities like
  sin(2 pi x) = 0 or x^2 = x (at 0 and 1) hold there.

``degenerate_inputs`` names each such tensor, from the user's own values; the check itself is
unchanged (a warning never fails it, and a passing check also issues it as a GradcheckWarning).
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .plan import host


def degenerate_inputs(plan) -> list:
    """[(kind, message)] for the checked tensors (and float constant inputs) of ``plan``."""
    named = [(c.name, c.kind, c.snapshot) for c in plan.checked]
    checked = {id(c.tensor) for c in plan.checked}
    for name, arg in zip(plan.input_names, plan.args):
        data = arg.data if isinstance(arg, Tensor) else arg
        if id(arg) not in checked and hasattr(data, "dtype") and data.dtype.kind == "f" and data.size:
            named.append((name, "constant", host(data)))
    warnings = []
    for name, kind, values in named:
        if values.size == 0 or not np.isfinite(values).all():
            continue
        where = "" if values.size == 1 else f" in all {values.size} elements"
        if np.all(values == 1):
            warnings.append(("constant_values",
                             f"{name!r} is exactly 1{where}: a backward that multiplies or divides by it the wrong "
                             "number of times (a forgotten gain, tau where tau^2 belongs) gives the same numbers "
                             "there; check again with values away from 1 (rng.uniform(0.5, 1.5, shape))"))
        elif np.all(values == 0):
            warnings.append(("constant_values",
                             f"{name!r} is exactly 0{where}: a term of backward that carries it as a factor vanishes "
                             "there, right or wrong; check again with nonzero values (rng.normal(size=shape))"))
        elif kind != "constant" and values.size >= 2 and np.all(values == np.round(values)):
            warnings.append(("integer_values",
                             f"every value of {name!r} is a whole number: kinks (relu, abs, round) sit exactly there, "
                             "and identities like sin(2 pi x) = 0, x^2 = x (at 0 and 1) or floor(x) = x hold there, so "
                             "whole classes of wrong derivatives give the same numbers; draw values with fractional "
                             "parts (rng.normal(size=shape))"))
    batch = [(name, values.shape) for name, kind, values in named
             if kind == "input" and values.ndim >= 2 and values.shape[0] == 1]
    if batch:
        name, shape = batch[0]
        warnings.append(("batch_of_one",
                         f"{name!r} has a batch of one (shape {str(shape).replace(' ', '')}): a backward that sums or "
                         "averages over the whole batch where forward works on each row (or mixes rows any other way) "
                         "gives the same numbers; check with a batch of at least 2"))
    return warnings

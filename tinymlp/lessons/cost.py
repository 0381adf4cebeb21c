"""Derived, not estimated: what a Function answer's forward and backward cost.

A backward derived by hand costs about one forward: a handful of array operations over the
inputs. A gradient estimated element by element costs a forward per input element (finite
differences, Richardson's refinements of them, complex steps) or carries that many components
through one forward (dual numbers): on an input of 32 x 1024 elements, hundreds to thousands of
forwards. ``judge`` times the answer on such an input (``Exercise.cost``) against a plain NumPy
forward of the same op timed the same way, the yardstick, and fails an answer whose forward or
backward takes longer than ``FLOOR + RATIO`` yardsticks, with that reason. The forward is
bounded too: an answer could compute the whole Jacobian there and make its backward cheap.

The margin is wide on both sides: the course's worked answers take 1 to 5 yardsticks (a loop
over the rows of a batch, 10 to 30); an element-by-element estimate takes over 500 even where
it perturbs one column of every row at once. The yardstick is the grader's own forward,
measured next to the answer, so a slow or loaded machine slows both. A remote answer is timed
from the grading process (the time to send its inputs and read its result), so it cannot
report its own times; a backward still running at four times the limit is stopped.

An elementwise op (GELU, Swish) is the exception that cost cannot settle: its whole derivative
is one vectorised difference of two forwards away. Its exactness (``checks/common.py: EXACT``),
the complex numbers refused and the number types flagged in the answer's code
(``scan.py``) are what speak there.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .. import tensor
from .registry import Wrong

__all__ = ["FLOOR", "RATIO", "judge"]

RATIO = 25
FLOOR = 0.1  # seconds: the interpreter's and the pipes' own costs on a small op
ROUNDS = 3


def _best(fn, rounds=ROUNDS):
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def judge(ex, cls, seed=0, limit=None):
    """Raise ``Wrong`` when answer ``cls`` (a Function, or the grader's stand-in for one) costs
    more than an exercise's derived backward can. ``limit(seconds)`` is a context in which a call
    of the answer taking longer than ``seconds`` raises (the grader's answer process); None: no
    such limit (the answer runs in this process)."""
    rng = np.random.default_rng(seed)
    spec = ex.cost(rng)
    inputs = [np.asarray(a) for a in spec.inputs]
    yardstick = _best(lambda: spec.reference(*inputs))
    allowed = FLOOR + RATIO * yardstick
    out = np.asarray(spec.reference(*inputs))
    g = rng.normal(size=out.shape)
    shape = " and ".join(str(a.shape) for a, need in zip(inputs, spec.needs) if need)
    forward, backward = [], []
    for _ in range(ROUNDS):
        tensors = [tensor(a.copy(), requires_grad=True, dtype=a.dtype) if need else a.copy()
                   for a, need in zip(inputs, spec.needs)]
        stage = "forward"
        try:
            with limit(4 * allowed + 1) if limit is not None else contextlib.nullcontext():
                start = time.perf_counter()
                y = cls.apply(*tensors, **spec.kwargs)
                middle, stage = time.perf_counter(), "backward"
                y.backward(tensor(g, dtype=out.dtype))
                end = time.perf_counter()
        except TimeoutError:
            raise Wrong(_reason(stage, None, yardstick, allowed, shape, stopped=4 * allowed + 1)) from None
        forward.append(middle - start)
        backward.append(end - middle)
        if forward[-1] <= allowed and backward[-1] <= allowed:
            return
    for name, times in (("forward", forward), ("backward", backward)):
        if min(times) > allowed:
            raise Wrong(_reason(name, min(times), yardstick, allowed, shape))


def _reason(name, seconds, yardstick, allowed, shape, stopped=None):
    took = (f"did not finish in {stopped:.1f} s" if stopped is not None else
            f"took {seconds:.2f} s, as long as {seconds / yardstick:.0f} plain forwards of the op "
            f"({yardstick * 1e3:.2f} ms)")
    return (f"{name} on inputs of shape {shape} {took}; a derived backward takes a few forwards (allowed: "
            f"{allowed:.2f} s). A gradient estimated element by element (finite differences, complex steps, dual "
            "numbers) costs a forward per element: derive the formula and compute it on whole arrays (no Python "
            "loop over elements)")

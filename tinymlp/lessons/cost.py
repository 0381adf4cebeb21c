"""A Function answer at scale: its values on a large input, and what its forward and backward cost.

The public and hidden cases are small. ``judge`` also runs the answer once on a large input
(``Exercise.cost``: 32 x 1024 elements or so) and compares what it gives there with the
reference: the forward with the plain NumPy forward, each gradient through exact directional
derivatives of that forward (a complex step along random directions: the reference's own
functions are analytic, so this is exact to rounding). An answer that special-cases large
inputs (zeros there, to pass the timing) fails with that reason.

The time is measured too, against a plain NumPy forward of the same op timed the same way, the
yardstick, and only noted, never failed: a correct answer that is slow passes. A derived
backward on whole arrays takes 1 to 5 yardsticks; one with a Python loop over rows 10 to 30,
over elements a few hundred. Past ``FLOOR + RATIO`` yardsticks the row gets a timing note that
says how long it took and how many forwards that is, and names no method. Past ``CEILING``
yardsticks (at least ``LEAST`` seconds) the call is stopped, and the answer fails with the time
it took: it cannot be checked at scale. A remote answer is timed from the grading process (the
time to send its inputs and read its result), so it cannot report its own times.

An estimate of the gradient element by element (finite differences, complex steps, dual
numbers) is caught by its exactness (``checks/common.py: EXACT``), by the complex numbers refused
and the constructs flagged in the answer's code (``scan.py``), not by its time.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .. import tensor
from .registry import Wrong

__all__ = ["CEILING", "FLOOR", "RATIO", "judge"]

RATIO = 25
FLOOR = 0.1  # seconds: the interpreter's and the pipes' own costs on a small op
CEILING, LEAST = 2000, 3.0  # yardsticks, seconds: a call taking longer is stopped
ROUNDS = 3
STEP = 1e-20  # the complex step of the directional derivatives (exact: no subtraction)
AGREE = 1e-8  # relative: the directional derivatives of a derived backward agree to about 1e-14


def _best(fn, rounds=ROUNDS):
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def judge(ex, cls, seed=0, limit=None) -> str:
    """Check answer ``cls`` (a Function, or the grader's stand-in for one) on the large input of
    exercise ``ex``: raise ``Wrong`` when its values there are wrong or a call does not finish;
    return a timing note ("" when it costs what a derived backward costs). ``limit(seconds)`` is a
    context in which a call of the answer taking longer than ``seconds`` raises ``TimeoutError``
    (the grader's answer process); None: no such limit (the answer runs in this process)."""
    rng = np.random.default_rng(seed)
    spec = ex.cost(rng)
    inputs = [np.asarray(a) for a in spec.inputs]
    yardstick = _best(lambda: spec.reference(*inputs, **spec.kwargs))
    allowed, stop = FLOOR + RATIO * yardstick, max(LEAST, CEILING * yardstick)
    out = np.asarray(spec.reference(*inputs, **spec.kwargs))
    g = rng.normal(size=out.shape)
    shape = " and ".join(str(a.shape) for a, need in zip(inputs, spec.needs) if need)
    forward, backward = [], []
    for k in range(ROUNDS):
        tensors = [tensor(a.copy(), requires_grad=True, dtype=a.dtype) if need else a.copy()
                   for a, need in zip(inputs, spec.needs)]
        stage = "forward"
        try:
            with limit(stop) if limit is not None else contextlib.nullcontext():
                start = time.perf_counter()
                y = cls.apply(*tensors, **spec.kwargs)
                middle, stage = time.perf_counter(), "backward"
                y.backward(tensor(g, dtype=out.dtype))
                end = time.perf_counter()
        except TimeoutError:
            raise Wrong(f"{stage} on inputs of shape {shape} did not finish in {stop:.1f} s, {CEILING} plain "
                        f"forwards of the op ({yardstick * 1e3:.2f} ms each), so it cannot be checked at this size; "
                        "a backward on whole arrays takes a few forwards") from None
        if k == 0:
            _compare(spec, inputs, g, out, y, tensors, shape)
        forward.append(middle - start)
        backward.append(end - middle)
        if forward[-1] <= allowed and backward[-1] <= allowed:
            return ""
    notes = [f"{name} on inputs of shape {shape} took {min(t):.2f} s, {min(t) / yardstick:.0f} plain forwards of the "
             f"op ({yardstick * 1e3:.2f} ms each)" for name, t in (("forward", forward), ("backward", backward))
             if min(t) > allowed]
    return ("timing: " + "; ".join(notes) + "; a backward on whole arrays takes 1 to 5") if notes else ""


def _compare(spec, inputs, g, out, y, tensors, shape):
    """The answer's forward and gradients on the large input against the reference's."""
    from .checks.common import array_of, close

    close(f"forward on the large input {shape}", y, out, rtol=1e-8, atol=1e-10)
    rng = np.random.default_rng(1)
    for i, (a, t, need) in enumerate(zip(inputs, tensors, spec.needs)):
        if not need:
            continue
        grad = array_of(t.grad, f"the gradient of input {i} on the large input {shape}")
        if grad.shape != a.shape:
            raise Wrong(f"the gradient of input {i} on the large input has shape {grad.shape}, expected {a.shape}")
        directions = [rng.normal(size=a.shape) for _ in range(2)]
        exact, got = [], []
        for v in directions:
            shifted = [b + STEP * 1j * v if k == i else b for k, b in enumerate(inputs)]
            exact.append(float(np.imag((g * spec.reference(*shifted, **spec.kwargs)).sum())) / STEP)
            got.append(float((v * grad).sum()))
        err = np.linalg.norm(np.subtract(got, exact)) / max(np.linalg.norm(exact), 1e-300)
        if not err <= AGREE:
            raise Wrong(f"the gradient of input {i} on the large input {shape} is wrong there: along random "
                        f"directions it gives {got[0]:.6g} and {got[1]:.6g} where the exact derivatives are "
                        f"{exact[0]:.6g} and {exact[1]:.6g} (the small cases passed: does the answer treat large "
                        "inputs differently?)")

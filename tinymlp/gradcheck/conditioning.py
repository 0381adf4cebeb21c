"""A tensor whose gradients all sit below the noise floor, checked again where they do not.

A correct softmax on very confident logits (one class ahead by 95) has gradients of about
e^-95 = 1e-41: no finite difference resolves them, so nothing can be certified there and the
check would end INCONCLUSIVE, an error a student cannot act on. Such a tensor is checked again
with its values scaled toward 0 (x 0.1, then 0.01 and 0.001: the same signs, so a domain like
x > 0 is kept), where forward is not saturated; that check gives the tensor's verdict, and the
report says at which input it was made. A tensor that forward does not use stays INCONCLUSIVE
at every scale, and the report says so as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields

import numpy as np

from ..grad_mode import no_grad
from .checks import backward_once
from .report import TensorResult

SCALES = (0.1, 0.01, 0.001)


def _measure(run):
    """L0, the noise floor and the scale of L at the current values (as check_forward measures them)."""
    with no_grad():
        outputs = run.ev.outputs()
        run.L0 = run.ev.loss_host()
    run.scale = sum(float(abs(g * y.data.reshape(-1)).sum()) for g, y in zip(run.ev.upstream, outputs))
    run.settings.noise = 10 * float(np.finfo(run.plan.check_dtype).eps) * run.scale / run.settings.eps


@contextmanager
def at(run, c, result):
    """Inside: c scaled by the factor its check was moved to (if any), with L0 and the noise floor
    measured there; put back bit for bit on exit."""
    if result.rescaled is None:
        yield
        return
    data, kept = c.tensor.data, c.tensor.data.copy()
    before = run.L0, run.settings.noise, run.scale
    try:
        data *= result.rescaled[0]
        _measure(run)
        yield
    finally:
        data[...] = kept
        run.L0, run.settings.noise, run.scale = before


def saturated(result):
    """At least half of the tensor's checks sit in the noise band: INCONCLUSIVE, or a FAIL whose
    failing elements are few against those that no finite difference could resolve."""
    return result.verdict == "INCONCLUSIVE" or (result.verdict == "FAIL" and 2 * result.n_unverified >= result.checked)


def recheck(run, c, result, compare):
    """Check c again at smaller values until its gradients are measurable there; then ``result``
    becomes that check's (and ``result.rescaled`` says where): a FAIL there always, a pass only
    in place of an INCONCLUSIVE. Returns its elements, or None."""
    largest = float(np.abs(result.analytical).max(initial=0.0))
    why = (f"at the given input {result.n_unverified} of the {result.checked} checks of {c.name!r} sit below the noise "
           "floor" + (f" (its largest gradient is {largest:.1e})" if result.verdict == "INCONCLUSIVE" else "")
           + ": forward is saturated there, as a softmax on very confident logits is")
    for scale in SCALES:
        trial = TensorResult(c.name, c.kind, result.shape, result.dtype, rescaled=(scale, why))
        with at(run, c, trial):
            a = backward_once(run, [c], run.ev.upstream)[c.name]
            if a is None:
                return None
            elements = compare(trial, a.astype(np.float64))
        if trial.verdict == "FAIL" or (trial.verdict != "INCONCLUSIVE" and result.verdict == "INCONCLUSIVE"):
            for f in fields(TensorResult):
                setattr(result, f.name, getattr(trial, f.name))
            return elements
        if trial.verdict != "INCONCLUSIVE":
            return None  # measurable there, and right: the failure at the given input stands as it is
    return None


def explain(c, result):
    """Say in the pattern line that the tensor was checked at scaled values, and why."""
    if result.rescaled is None:
        return
    scale, why = result.rescaled
    if result.verdict == "FAIL":
        result.pattern = f"checked at {c.name} * {scale:g}, because {why}; there " + (result.pattern or "")
        return
    worst = f", max rel err {result.max_rel_err:.0e}" if result.checked else ""
    note = (f"{why}; checked instead at {c.name} * {scale:g} (the same signs, scaled toward 0), where its "
            f"{result.checked} checks agree{worst}")
    result.pattern = note + (f"; {result.pattern}" if result.pattern else "")

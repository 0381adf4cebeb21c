"""Precision a float32 layer loses: what a float64 check cannot see, and a float32 check must not
blame on a wrong formula or index.

The check runs in float64 so that finite differences resolve the slope. A layer that is right
in float64 can still lose most of float32's 7 digits in its own arithmetic: a variance computed
as E[x^2] - E[x]^2 on values around 1000 with a spread of 1, an exp of unshifted values that
overflows. So, for float32 inputs, the layer's backward also runs once in float32 on the same
values and with the same upstream gradient, and is compared with its float64 backward
(``float32_backward``: a warning, since the formula itself is right; but a float32 backward that
overflows to inf or NaN where float64 is finite is a FAIL that names the overflow: that layer
cannot train in float32). In a check that runs in
float32 (``dtype=None``), a failing tensor is compared with the float64 backward the same way
(``float32_failure``): when float64 agrees with the numerical gradient, the failure is the
float32 arithmetic, and the report says so instead of guessing at a formula or an index.

``cause`` says where the digits go, from the inputs themselves: rows whose mean is large
against their spread (cancellation), values beyond the dtype's exp range (overflow).
``nan_cause`` does the same for NaN/inf in a float64 check's backward: an overflow named as one
(values beyond exp's range, an inf among the gradients), else the usual 0/0 suspects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..grad_mode import enable_grad
from ..backend import to_device
from .blame import function_name, graph_nodes
from .plan import host
from .report import FAIL, ElementCheck

LOSS = 1e-3  # a float32 gradient further than this from float64's (relative to its largest element)
def exp_max(dtype) -> float:
    """exp(x) overflows ``dtype`` above this x (88.7 for float32, 709.8 for float64)."""
    return float(np.log(np.finfo(dtype).max))
EPS32 = float(np.finfo(np.float32).eps)


@dataclass
class Pass:
    """One forward and backward of fn in some dtype: host arrays in float64."""

    outputs: list
    grads: dict  # checked name -> gradient (None where none reached it)
    sources: dict  # checked name -> the Functions whose backward computes its gradient


def backward_in(run, dtype):
    """fn's forward and backward with every checked tensor in ``dtype`` (None: each in its own),
    on the run's values and with its upstream gradient; None when that forward or backward raises."""
    try:
        plan = run.replan(dtype)
    except Exception:  # noqa: BLE001 - the tensors cannot be copied to that dtype
        return None
    ev = type(run.ev)(run.ev.fn, plan.args, run.ev.kwargs, run.ev.before_forward, plan.xp)
    names = {id(c.tensor): c.name for c in plan.checked}
    plan.swap_in()
    try:
        for c in plan.checked:
            c.tensor.grad = None
        with np.errstate(all="ignore"), enable_grad():
            outputs = ev.outputs()
            sources = {}
            for node in graph_nodes(outputs):
                for parent in getattr(node, "parents", ()):
                    if id(parent) in names:
                        sources.setdefault(names[id(parent)], set()).add(f"{function_name(node)}.backward")
            for y, g in zip(outputs, run.ev.upstream):
                if y.requires_grad:
                    y.backward(to_device(host(g).astype(y.dtype).reshape(y.shape), y.device))
        grads = {c.name: None if c.tensor.grad is None else host(c.tensor.grad).astype(np.float64)
                 for c in plan.checked}
        return Pass([host(y.data).astype(np.float64) for y in outputs], grads, sources)
    except Exception:  # noqa: BLE001 - a layer that cannot run in that dtype: nothing to compare
        return None
    finally:
        plan.swap_out()


def float32_backward(run, results) -> list:
    """[("float32_backward", message)] when the layer's own lower-precision backward loses more
    than LOSS against its float64 backward, for a float64 check of lower-precision inputs."""
    plan = run.plan
    if plan.check_dtype.itemsize < 8 or "float32" not in plan.promoted_from:
        return []
    low = backward_in(run, None)
    if low is None:
        return []
    bad = []
    for name, r in results.items():
        a64, a32 = r.analytical, low.grads.get(name)
        if r.verdict != "ok" or a64 is None or a32 is None or a32.shape != a64.shape or not np.isfinite(a64).all():
            continue
        if not np.isfinite(a32).all():
            _overflow(run, r, a32, low.sources.get(name, ()))
            continue
        scale = float(np.abs(a64).max(initial=0.0))
        if scale == 0:
            continue
        rel = float(np.abs(a32 - a64).max()) / scale
        if rel > LOSS:
            bad.append((rel, name))
    if not bad:
        return []
    rel, name = max(bad)
    high = backward_in(run, plan.check_dtype)
    forward = ""
    if high is not None and len(high.outputs) == len(low.outputs):
        errors = [float(np.abs(lo - hi).max(initial=0.0)) / max(float(np.abs(hi).max(initial=0.0)), 1e-300)
                  for lo, hi in zip(low.outputs, high.outputs)]
        forward = f", while forward agrees to {max(errors):.0e}" if all(map(math.isfinite, errors)) else ""
    others = [n for _, n in sorted(bad, reverse=True) if n != name]
    also = f" (and for {', '.join(map(repr, others))})" if others else ""
    dtype = "/".join(plan.promoted_from)
    where = " and ".join(sorted(low.sources.get(name, ()))) or "backward"
    what = (f"its gradient for {name!r}{also} differs from the float64 backward on the same inputs by up to "
            f"{rel:.1e} of the gradient's largest element (a float32 backward that keeps its digits stays "
            "within about 1e-5)")
    return [("float32_backward",
             f"in {dtype} (the inputs' own dtype) backward loses precision: {what}{forward}; where: {where}; "
             f"{cause(run, rel)}; the float64 check cannot see this, the layer computes so in {dtype}")]


def _overflow(run, result, a32, sources):
    """The layer's own lower-precision backward gives inf/NaN where float64's is finite: a FAIL."""
    dtype = "/".join(run.plan.promoted_from)
    bad = np.argwhere(~np.isfinite(a32))
    n = result.numerical
    result.verdict, result.hint_kind = "FAIL", "overflow"
    result.n_fail, result.max_abs_err, result.max_rel_err = len(bad), math.inf, math.inf
    result.worst = [ElementCheck(tuple(int(i) for i in idx), float(n[tuple(idx)]), float(a32[tuple(idx)]), math.inf,
                                 math.inf, FAIL) for idx in bad[:5]]
    where = ", ".join(ch.where(result.name) for ch in result.worst[:3]) + (" ..." if len(bad) > 3 else "")
    result.pattern = (f"the float64 check agrees, but in {dtype} (the inputs' own dtype) backward gives inf or NaN at "
                      f"{len(bad)} of {a32.size} elements ({where}), where the float64 backward on the same inputs "
                      "is finite (the table shows the float64 numerical gradient beside the float32 backward)")
    result.hint = f"an overflow in the {dtype} backward: {cause(run, math.inf, np.float32)}"
    result.source = " and ".join(sorted(sources)) or None
    result.trust = (f"the float64 backward agrees with the numerical gradient: the formula is right, its {dtype} "
                    "arithmetic overflows")


def float32_failure(run, c, result, elements, classify):
    """In a float32 check: the failing elements of ``c`` are float32 arithmetic in backward when
    the same backward in float64 agrees with the numerical gradient there. Sets the diagnosis."""
    dtype, s = run.plan.check_dtype, run.settings
    if dtype != np.float32:
        return
    if not hasattr(run, "float64_pass"):
        run.float64_pass = backward_in(run, np.dtype(np.float64))
    high = run.float64_pass
    a64 = None if high is None else high.grads.get(c.name)
    fails = [ch for ch in elements if ch.status == FAIL and not isinstance(ch.index, str)
             and math.isfinite(ch.numerical)]
    if a64 is None or a64.shape != tuple(c.tensor.shape) or not fails:
        return
    flat = np.array([np.ravel_multi_index(ch.index, c.tensor.shape) if ch.index else 0 for ch in fails])
    a64_at, n = a64.reshape(-1)[flat], np.array([ch.numerical for ch in fails])
    agree = int(np.sum(classify(a64_at, n, s.rtol, s.atol_eff)[0] != FAIL))
    scale = max(float(np.abs(a64).max(initial=0.0)), 1e-300)
    a32 = np.array([ch.analytical for ch in fails])
    rel = float(np.abs(a32 - a64_at).max()) / scale if np.isfinite(a32).all() else math.inf
    if agree * 2 <= len(fails) or not rel > LOSS or not np.isfinite(a64_at).all():
        return  # float64 fails there too: the formula, not the arithmetic
    if math.isinf(rel):
        result.hint_kind = "overflow"
        result.pattern = (f"the {dtype} backward gives inf or NaN at {int(np.sum(~np.isfinite(a32)))} of the "
                          f"{len(fails)} failing elements, where the same backward in float64 is finite and agrees "
                          f"with the numerical gradient at {agree} of them")
        result.hint = f"an overflow in the {dtype} backward (not 0/0): {cause(run, rel, dtype)}"
    else:
        result.hint_kind = "precision_loss"
        result.pattern = (f"at {agree} of the {len(fails)} failing elements the same backward in float64 agrees with "
                          f"the numerical gradient; the {dtype} backward differs from it by up to {rel:.1e} of the "
                          "gradient's largest element")
        result.hint = (f"{dtype} backward loses precision (its formula and indexing are right): "
                       f"{cause(run, rel, dtype)}; the default dtype='float64' checks the formula itself")
    result.trust = ("the float64 backward on the same inputs agrees with the numerical gradient: the formula is right, "
                    f"its {dtype} arithmetic is not")


def cause(run, rel, dtype=np.float32) -> str:
    """Where the digits go in ``dtype``, judged from the checked tensors' own values."""
    values = [(c.name, host(c.snapshot).astype(np.float64)) for c in run.plan.checked
              if c.snapshot.dtype.kind == "f" and c.snapshot.size and np.isfinite(c.snapshot).all()]
    if not values:
        return "look in backward for differences of nearly equal numbers, exp or log of large values, long sums"
    name, top = max(((n, float(np.abs(v).max())) for n, v in values), key=lambda t: t[1])
    dtype, limit = np.dtype(dtype), exp_max(dtype)
    if math.isinf(rel) and top > 0.9 * limit:
        return (f"exp overflows {dtype} above x = {limit:.1f} and {name!r} reaches {top:.3g}: an exp of unshifted "
                "values (softmax, logsumexp, sigmoid) gives inf, and inf / inf NaN; shift first, as in "
                "exp(x - x.max(axis=-1, keepdims=True))")
    cancel = []
    for n, v in values:
        if v.ndim == 0 or v.shape[-1] < 2:
            continue
        mean, std = v.mean(axis=-1), v.std(axis=-1)
        ratio = np.where(std > 0, np.abs(mean) / np.where(std > 0, std, 1), 0)
        k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        cancel.append((float(ratio[k]), n, float(mean[k]), float(std[k])))
    if cancel:
        ratio, n, mean, std = max(cancel)
        if ratio >= 10 and ratio * ratio * EPS32 >= 0.1 * min(rel, 1.0):
            digits = min(7, round(math.log10(ratio * ratio)))
            return (f"the rows of {n!r} (along its last axis) sit around {mean:.3g} with a spread of {std:.2g} "
                    f"(|mean| / std up to {ratio:.2g}): a difference of large, nearly equal numbers, such as a "
                    f"variance computed as E[x^2] - E[x]^2, loses about {digits} of float32's 7 digits there; "
                    "compute it from centred values, ((x - mean)**2).mean()")
    if math.isinf(rel):
        return f"an overflow (exp, a square of large values) or a division by a value that rounds to 0 in {dtype}"
    return ("no input is large, or far from zero against its spread: look in backward for differences of nearly "
            "equal numbers, exp or log of large values, and long float32 sums")


def nan_cause(run, a) -> str | None:
    """For NaN/inf in a backward of the check's own dtype: the overflow that makes it, when the
    inputs or the gradients show one (values beyond exp's range, an inf), else None."""
    dtype = run.plan.check_dtype or np.dtype(np.float64)
    text = cause(run, math.inf, dtype)
    if text.startswith("exp overflows"):
        return text
    if np.isinf(a).any():
        return (f"an overflow: backward gives inf (and inf - inf or inf / inf gives NaN) in {dtype}: a square, an "
                "exp or a product of large values, or a division by a value that rounds to 0")
    return None

"""State that outlives one call: what a forward keeps, and what a graph's backward reads later.

Central differences call forward hundreds of times and compare the results, so they measure a
function only if every call on the same inputs gives the same output, whatever was called
before. Two calls in a row are not enough to know: a running mean started at the first batch
gives the same output twice on the same batch. So forward also runs once on *other* inputs
(every checked tensor scaled element by element by a seeded factor in [0.5, 1.5]) and then on
the original inputs again (``forward_state``: one call more than the two of ``checks.check_forward``, and one on other
inputs).

A graph keeps what forward saved until its backward runs. A Function that saves a buffer it
reuses (``np.tanh(x, out=self.buf)``) gives right gradients as long as backward follows its own
forward, and wrong ones when the layer is called again in between (used twice in a model, an
evaluation call before backward). ``saved_state`` builds a graph, calls forward on other inputs,
and then runs that graph's backward: what it saved must be unchanged, and so must the gradients.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..grad_mode import enable_grad, no_grad
from ..backend import to_device
from .blame import fresh_graph, function_name
from .plan import close_bits, host, same_bits


@contextmanager
def other_inputs(run):
    """Every checked tensor scaled in place by a seeded factor in [0.5, 1.5] per element (signs
    and zeros kept, so a domain like x > 0 is kept too); put back bit for bit on exit."""
    rng = np.random.default_rng(run.other_seed)
    kept = []
    try:
        for c in run.checked:
            arr = c.tensor.data
            kept.append((arr, arr.copy()))
            factor = rng.uniform(0.5, 1.5, size=arr.shape).astype(arr.dtype)
            arr *= to_device(factor, c.tensor.device) if c.tensor.device != "cpu" else factor
        yield
    finally:
        for arr, copy in kept:
            arr[...] = copy


def forward_state(run):
    """[(kind, message)] when forward on the original inputs gives another output after one call
    on other inputs (two calls in a row have agreed already); else []."""
    with no_grad():
        first = [y.data.copy() for y in run.ev.outputs()]
    try:
        with no_grad(), other_inputs(run):
            run.ev.outputs()
    except Exception:  # noqa: BLE001 - forward cannot run on other values: nothing to learn here
        return []
    with no_grad():
        again = [y.data for y in run.ev.outputs()]
    if len(again) == len(first) and all(map(close_bits, first, again)):
        return []
    run.settings.deterministic = False
    return [("stateful",
            "forward is stateful: two calls on the same inputs agree, but after one call on other inputs the "
            "same inputs give another output: forward keeps something from call to call (a running mean or "
            "other statistic updated in forward, a cache on the layer); every finite difference then measures "
            "that drift, not the function; keep the state out of forward while checking (an eval mode, a flag), "
            "or reset it in before_forward")]


def saved_state(run, grads):
    """Problems of a graph whose saved values change when forward runs again before backward.

    ``grads`` are the gradients of an ordinary backward. One more graph is built, forward runs
    on other inputs (and the inputs are put back), then that graph's backward runs: every array
    its Functions saved must be as it was, and the gradients as ``grads``.
    """
    checked = run.checked
    outputs, _, before = fresh_graph(run)
    try:
        with enable_grad(), other_inputs(run):
            run.ev.outputs()
    except Exception:  # noqa: BLE001 - forward cannot run on other values
        return []
    changed = [f"{function_name(node)}'s {label}" for node, label, arr, copy in before if not same_bits(arr, copy)]
    try:
        for y, g in zip(outputs, run.ev.upstream):
            if y.requires_grad:
                y.backward(g.reshape(y.shape).copy(), retain_graph=True)
    except RuntimeError:  # the engine refused (the in-place guard): the changed arrays say why
        differ = []
    else:
        after = {c.name: None if c.tensor.grad is None else host(c.tensor.grad) for c in checked}
        differ = [name for name in after if grads.get(name) is not None and after[name] is not None
                  and not close_bits(grads[name], after[name])]
    if changed:
        return [("saved_overwritten",
                 f"{', '.join(changed[:3])} (saved by forward for backward) was overwritten by the next call of "
                 "forward on other inputs: forward saves an array that it reuses (a buffer kept on the layer, "
                 "np.tanh(x, out=buf), self.cache[...] = ...), so a graph built before another call (the layer used "
                 "twice, an evaluation call before backward) backpropagates the later call's values"
                 + (f" (the gradients of {', '.join(map(repr, differ))} change)" if differ else "")
                 + "; save a new array in each call (buf.copy(), or no out=)")]
    if differ:
        return [("saved_overwritten",
                 f"a graph's backward gives other gradients for {', '.join(map(repr, differ))} once forward has "
                 "run on other inputs in between: backward reads something that the next forward overwrites (an "
                 "attribute of the layer, a global) besides what ctx saved; keep on ctx what backward needs")]
    return []

"""Which Function: the node of the graph behind a gradient, named after its reference Function.

* ``reference_function``: the Function a class stands for. The fast tier's classes run in place
  of a reference Function (``tinymlp/dispatch.py``); a report names that reference (``Linear``,
  never ``FastLinear``), as a student wrote or read it in ``tinymlp/ops/``;
* ``backward_in_place``: one more graph, whose backward is watched node by node. The gradient
  each node receives is copied before its backward runs and compared after it, so the Function
  that changed its incoming gradient in place is the one named, together with the Functions that
  had handed that same array to other inputs too (whose gradients then changed with it). The
  arrays forward saved are compared too, and a second backward must repeat the first;
* ``name_sources``: the Function(s) whose backward returned a failing tensor's gradient (the
  report's "from" line).
"""

from __future__ import annotations

import inspect
import weakref

from .. import dispatch, graph
from ..backend import array_module
from ..grad_mode import enable_grad
from ..tensor import Tensor
from .plan import close_bits, host, same_bits


def reference_function(fn):
    """The reference Function that ``fn`` stands for: the reference it is registered for in the
    dispatch table; for another class of the fast tier, the first class above it outside the
    fast tier; any other class is its own reference (a student's Function, or a subclass of one)."""
    if not isinstance(fn, type):
        return fn
    for (reference, _device), impl in dispatch.registered().items():
        if impl is fn and isinstance(reference, type):
            return reference
    if fn.__module__.startswith("tinymlp.fast"):
        for cls in fn.__mro__[1:]:
            if not cls.__module__.startswith("tinymlp.fast"):
                return cls
    return fn


def reference_name(name):
    """The reference Function's name for a class name the engine reported (a fast-tier class's
    name becomes its reference's; any other name stays)."""
    for (reference, _device), impl in dispatch.registered().items():
        if isinstance(impl, type) and impl.__name__ == name and isinstance(reference, type):
            return reference.__name__
    return name


def function_name(node):
    """The name of the reference Function behind a graph node (a Context)."""
    fn = getattr(node, "fn", None)
    return getattr(reference_function(fn), "__name__", "a Function")


def graph_nodes(outputs):
    """The Function nodes (Contexts) of the graph behind the outputs that can still run
    backward, outputs first (``graph.ops`` in reverse)."""
    return list(reversed(graph.ops(*[y for y in outputs if isinstance(y, Tensor)])))


def arrays_of(node):
    """(label, array) for each array a node keeps for backward: saved tensors, then ctx attributes."""
    arrays = [(f"ctx.saved_tensors[{i}]", a) for i, a in enumerate(getattr(node, "saved_tensors", ()) or ())
              if hasattr(a, "shape") and hasattr(a, "dtype")]
    known = {id(a) for _, a in arrays}
    for key, value in vars(node).items():
        if (key not in ("saved_tensors", "fingerprints") and hasattr(value, "shape") and hasattr(value, "dtype")
                and not isinstance(value, Tensor) and id(value) not in known):
            arrays.append((f"ctx.{key}", value))
    return arrays


def leaves_behind(node, checked):
    """The names of the checked tensors that a gradient sent to ``node`` reaches (itself included)."""
    names, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if id(n) in checked:
            names.append(checked[id(n)])
        stack.extend(graph.parents(n))
    return names


# ------------------------------------------------------------------------------- watching backward


class Watch:
    """Backward through one graph, node by node: which backward changed the gradient it was given.

    Each node's Function is swapped, on that node only, for a subclass of it whose backward copies
    the incoming gradient, runs the Function's own backward and compares. (The engine calls
    ``node.fn.backward(node, g)`` for every node; a per-node hook in the engine would do the same
    without the subclass.) ``changed`` lists, per Function that changed its gradient in place,
    the (node, input index) of every earlier backward that had returned that same array.
    """

    def __init__(self, nodes):
        self.nodes, self.classes = nodes, {}
        self.handed = []  # (weak reference to an array some backward returned, its node, input index)
        self.changed = []  # (node, [(node, index) that were handed the same array])
        self.originals = [(node, node.fn) for node in nodes]
        for node in nodes:
            node.fn = self._watching(node.fn)

    def restore(self):
        for node, fn in self.originals:
            if node.fn is not None:
                node.fn = fn

    def _watching(self, fn):
        if fn not in self.classes:
            own, watch = fn.backward, self

            def backward(ctx, grad):
                before = grad.copy()
                grads = own(ctx, grad)
                watch.saw(ctx, grad, before, grads)
                return grads

            names = {"__module__": fn.__module__, "__qualname__": fn.__qualname__, "__doc__": fn.__doc__}
            self.classes[fn] = type(fn.__name__, (fn,), {"backward": staticmethod(backward), **names})
        return self.classes[fn]

    def saw(self, node, grad, before, grads):
        if not same_bits(grad, before):
            shared = [(other, i) for ref, other, i in self.handed if _same_memory(ref(), grad)]
            self.changed.append((node, [(other, i) for other, i in shared if other.parents[i] is not node]))
        for i, g in enumerate(grads if isinstance(grads, (tuple, list)) else (grads,)):
            if hasattr(g, "shape"):
                try:
                    self.handed.append((weakref.ref(g), node, i))
                except TypeError:  # an array type without weak references: no sharing found for it
                    pass


def _same_memory(a, b):
    """Whether a (None once freed) and b are one array or views of one memory."""
    if a is None or a is b:
        return a is b
    may_share = getattr(array_module(a), "may_share_memory", None)
    return bool(may_share is not None and type(a) is type(b) and may_share(a, b))


def fresh_graph(run):
    """One more graph of the checked call, with the checked tensors' gradients cleared:
    ``(outputs, its nodes, [(node, label, array, a copy of it)] for every array its Functions saved)``."""
    for c in run.checked:
        c.tensor.grad = None
    with enable_grad():
        outputs = run.ev.outputs()
    nodes = graph_nodes(outputs)
    return outputs, nodes, [(node, label, arr, host(arr).copy()) for node in nodes for label, arr in arrays_of(node)]


def backward_in_place(run):
    """Problems of a backward that changes arrays it does not own, found on one more graph.

    Before backward: copies of every array the graph's Functions saved (``ctx.saved_tensors``
    and array attributes of ctx). During it: each node's incoming gradient (``Watch``). After it:
    anything changed is a problem, named after its Function. Then backward runs a second time
    through the same graph and must give the same gradients (it would not if it changed
    something else it relies on). ``run.changed_in_place`` maps each checked tensor whose
    gradient came through a changed array to the sentence that says so.
    """
    checked = run.checked
    outputs, nodes, before = fresh_graph(run)
    upstream = [g.reshape(y.shape).copy() for y, g in zip(outputs, run.ev.upstream)]
    given = [u.copy() for u in upstream]
    watch = Watch(nodes)
    try:
        for y, g in zip(outputs, given):
            if y.requires_grad:
                y.backward(g, retain_graph=True)
    finally:
        watch.restore()
    first = {c.name: None if c.tensor.grad is None else host(c.tensor.grad).copy() for c in checked}
    problems = _changed_gradients(run, watch, outputs, given, upstream)
    for node, label, arr, copy in before:
        if not same_bits(arr, copy):
            problems.append(("mutated_saved",
                             f"{function_name(node)}.backward changed {label} in place: a second backward "
                             "through this graph (retain_graph=True) would use the changed values; compute "
                             "into a new array (y = y * y, not y *= y)"))
    if not problems:
        for c in checked:
            c.tensor.grad = None
        for y, g in zip(outputs, upstream):
            if y.requires_grad:
                y.backward(g.copy(), retain_graph=True)
        again = {c.name: None if c.tensor.grad is None else host(c.tensor.grad) for c in checked}
        differ = [name for name in first if (first[name] is None) != (again[name] is None)
                  or (first[name] is not None and not close_bits(first[name], again[name]))]
        if differ:
            problems.append(("not_repeatable",
                             f"a second backward through the same graph gave other gradients for "
                             f"{', '.join(map(repr, differ))}: backward changes something it relies on (an "
                             "array kept on ctx, a global) in place; compute into new arrays"))
    return problems


_IN_PLACE = "changed its incoming gradient in place (g *= ..., g[...] = ...)"
_FIX = "compute the result in a new array (g = g * ..., np.where(x < 0, 0.1 * g, g))"


def _changed_gradients(run, watch, outputs, given, upstream):
    """The mutated_upstream problems: one per Function that changed its incoming gradient."""
    checked = {id(c.tensor): c.name for c in run.checked}
    problems, seen = [], set()
    for node, shared in watch.changed:
        name = function_name(node)
        paths = []
        for other, i in shared:
            reached = leaves_behind(other.parents[i], checked)
            to = f" (the path to {', '.join(map(repr, reached))})" if reached else ""
            paths.append(f"its input {i}{to}")
            for leaf_name in reached:
                run.changed_in_place.setdefault(leaf_name, (
                    f"the gradient of {leaf_name!r} went through an array that {name}.backward changed in place "
                    f"after {function_name(other)}.backward had also handed it to its input {i} (PROBLEM "
                    f"(mutated_upstream) above): fix {name}.backward (compute into a new array); the other "
                    f"Functions on the way to {leaf_name!r} may well be right", name))
        key = (name, tuple(paths))
        if key in seen:
            continue
        seen.add(key)
        also = ""
        if shared:
            owners = sorted({function_name(other) for other, _ in shared})
            also = (f": {' and '.join(owners)}.backward had handed that same array to {', '.join(paths)} too, "
                    "so that gradient changed with it")
        problems.append(("mutated_upstream", f"{name}.backward {_IN_PLACE}{also}; {_FIX}"))
    if not watch.changed:  # changed outside any watched backward: blame the output's Function
        for y, g, u in zip(outputs, given, upstream):
            node = graph.node_of(y)
            if y.requires_grad and not same_bits(g, u) and getattr(node, "fn", None) is not None:
                problems.append(("mutated_upstream",
                                 f"{function_name(node)}.backward {_IN_PLACE}: the engine may hand that array to "
                                 f"other Functions too; {_FIX}"))
    return problems


# ------------------------------------------------------------------------------- the "from" line


def name_sources(run, results):
    """For each failing tensor, the Function(s) whose backward computed its gradient.

    The graph of one more forward is walked from the outputs to the checked tensor: the
    Functions that took it as an input are the ones whose backward returned its gradient.
    """
    failing = {id(c.tensor): c for c in run.checked if results[c.name].verdict == "FAIL"}
    if failing:
        try:
            _name_sources(run, results, failing)
        except Exception:  # noqa: BLE001 - a clue, never a reason for the check itself to fail
            pass


def _name_sources(run, results, failing):
    with enable_grad():
        outputs = run.ev.outputs()
    uses = {}
    for node in graph_nodes(outputs):
        for i, parent in enumerate(graph.parents(node)):
            if id(parent) in failing:
                uses.setdefault(id(parent), []).append((node, i))
    for key, c in failing.items():
        result, found = results[c.name], uses.get(key, [])
        names = sorted({f"{function_name(node)}.backward (its input {i}{_forward_name(node.fn, i)})"
                        for node, i in found})
        if names:
            result.source = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        changed = run.changed_in_place.get(c.name)
        if changed is not None:
            result.source = (result.source + "; " if result.source else "") + \
                f"its gradient was changed in place by {changed[1]}.backward"


def _forward_name(fn, i):
    """`` 'w'``: the name of forward's i-th array parameter, or ''."""
    try:
        names = [p.name for p in inspect.signature(reference_function(fn).forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    except (TypeError, ValueError):
        return ""
    return f" {names[i]!r}" if i < len(names) else ""

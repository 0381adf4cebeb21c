"""The graph that the forward pass records, the one walk over it, and freeing a node.

Nodes are of two kinds:

- an *op node*: the ``Context`` of one op applied while grad mode was on (tinymlp/autograd.py).
  ``node.fn`` is the Function that ran (None once ``backward()`` has freed the node),
  ``node.parents`` holds, for each positional input, the node that input came from (None for an
  input that needs no gradient), ``node.input_shapes`` their shapes;
- a *leaf*: a tensor that no recorded op made (a parameter, an input with
  ``requires_grad=True``); it has no parents.

A tensor made by an op points at its op node (``tensor.grad_fn``); ``node_of`` gives the node
behind any tensor.

``nodes(*tensors)`` lists every node behind the tensors once, each one after all of its parents:
a *topological order*, inputs first. It is found by a depth-first search with an explicit
stack (so a chain of 100,000 ops does not hit Python's recursion limit): a node is listed when
the search leaves it, which is after every node above it has been listed. ``backward()`` walks
this list in reverse (outputs first), so that a node runs once, after every node that used its
output has passed it its share of the gradient. ``plot.graph`` draws the same list, gradcheck
searches it.

After its last backward a node is freed (``free``): it drops all it kept and its output tensor
points at ``FREED``, so a second backward through it fails with a clear message.
"""

from __future__ import annotations

__all__ = ["FREED", "check_not_freed", "free", "node_of", "nodes", "ops", "parents"]


def node_of(tensor):
    """The graph node behind ``tensor``: the Context that made it, or the tensor itself for a leaf."""
    return tensor if tensor.grad_fn is None else tensor.grad_fn


def parents(node) -> tuple:
    """The nodes ``node``'s inputs came from, one per positional input (None where an input needs
    no gradient); ``()`` for a leaf."""
    return getattr(node, "parents", ())


def nodes(*tensors) -> list:
    """Every node behind ``tensors`` (op nodes and leaves), once each, in topological order:
    a node comes after all of its parents, so the tensors' own nodes come last."""
    order = []
    visited = set()
    for tensor in tensors:
        stack = [(node_of(tensor), False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:                    # every parent is listed: list the node
                order.append(node)
                continue
            if id(node) in visited:
                continue
            visited.add(id(node))
            stack.append((node, True))      # come back to it after its parents
            for parent in parents(node):
                if parent is not None and id(parent) not in visited:
                    stack.append((parent, False))
    return order


def ops(*tensors) -> list:
    """The op nodes behind ``tensors`` that can still run backward (not leaves, not freed),
    in topological order."""
    return [node for node in nodes(*tensors) if getattr(node, "fn", None) is not None]


class _FreedNode:
    """Placeholder node left behind by a freed graph, so a second backward fails clearly."""

    fn = None
    parents = ()


FREED = _FreedNode()


def free(ctx):
    """Drop all that ``ctx`` kept (saved arrays, attributes forward set) and cut it out of the
    graph; its output tensor now points at ``FREED``."""
    out = ctx.output() if ctx.output is not None else None
    vars(ctx).clear()
    ctx.fn, ctx.parents, ctx.saved_tensors = None, (), ()
    if out is not None:
        out.grad_fn = FREED


def check_not_freed(node):
    """Refuse to run backward through a node an earlier ``backward()`` freed."""
    if node.fn is None:
        raise RuntimeError("the graph behind this tensor was freed by an earlier backward(); "
                           "call backward(retain_graph=True) the first time to backpropagate twice")

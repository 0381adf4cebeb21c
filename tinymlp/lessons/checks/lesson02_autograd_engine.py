"""Lesson 2's checks: a topological order (02.1), backward with accumulation (02.2), unbroadcast (02.3).

The graphs are made of ``wire.Node``\\ s (data, grad, parents, local_grads, name), the shape of
the lesson's ``Value``: an answer handed such a graph in another process gets a copy of it, and
the gradients it sets come back to these nodes.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import Wrong, exercise
from ..wire import Node
from .common import close


def mul(a, b, name=""):
    return Node(a.data * b.data, (a, b), (b.data, a.data), name)


def add(a, b, name=""):
    return Node(a.data + b.data, (a, b), (1.0, 1.0), name)


def tanh(a, name=""):
    t = math.tanh(a.data)
    return Node(t, (a,), (1 - t * t,), name)


def graphs(case):
    """(root, leaves, expected gradients of the leaves) for a few graphs with shared nodes."""
    out = []
    xv, yv = case.pick((0.5, -1.5), tuple(case.rng.uniform(-1.5, 1.5, size=2)))
    x, y = Node(xv, name="x"), Node(yv, name="y")
    u = mul(x, y, "u")
    v = tanh(u, "v")
    w = mul(u, Node(3.0, name="c"), "w")
    root = add(v, w, "root")                          # a diamond: u feeds v and w
    du = (1 - math.tanh(xv * yv) ** 2) + 3
    out.append((root, (x, y), (du * yv, du * xv)))
    av = case.pick(1.2, float(case.rng.uniform(-2, 2)))
    a = Node(av, name="a")
    sq = mul(a, a, "a*a")                             # a used twice by one node
    root = add(sq, a, "a*a+a")
    out.append((root, (a,), (2 * av + 1,)))
    zv = case.pick(0.3, float(case.rng.uniform(-1, 1)))
    z = Node(zv, name="z")                            # a chain of diamonds
    h, n = z, case.pick(12, 9)
    for k in range(n):
        h = add(tanh(h, f"t{k}"), mul(h, Node(0.5), f"m{k}"), f"s{k}")
    g, val = 1.0, zv
    for _ in range(n):
        g *= (1 - math.tanh(val) ** 2) + 0.5
        val = math.tanh(val) + 0.5 * val
    out.append((h, (z,), (g,)))
    return out


@exercise("02.1", "topological order", answer="topological_order",
          reference="tinymlp/graph.py (nodes)")
def topological(topological_order, case):
    for root, _, _ in graphs(case):
        reachable, stack = {}, [root]
        while stack:
            n = stack.pop()
            if id(n) not in reachable:
                reachable[id(n)] = n
                stack.extend(n.parents)
        parents = {k: n.parents for k, n in reachable.items()}
        order = topological_order(root)
        if not isinstance(order, (list, tuple)):
            raise Wrong(f"topological_order returned a {type(order).__name__}; return a list of the nodes")
        order = list(order)
        if any(n.parents is not parents[k] for k, n in reachable.items()):
            raise Wrong("topological_order changed the graph (a node's parents): it must only read it")
        ids = [id(n) for n in order]
        if len(set(ids)) != len(ids):
            raise Wrong(f"a node appears more than once in the order: {order}")
        if set(ids) != set(reachable):
            missing = [n for k, n in reachable.items() if k not in ids]
            raise Wrong(f"the order must hold every node the root depends on, once; missing {missing}")
        where = {k: i for i, k in enumerate(ids)}
        for n in order:
            for p in parents[id(n)]:
                if where[id(p)] > where[id(n)]:
                    raise Wrong(f"{p} comes after {n}, which uses it: every node must come after its inputs")


@exercise("02.2", "backward with gradient accumulation", answer="backward",
          reference="tinymlp/autograd.py (backward)")
def accumulated(backward, case):
    for root, leaves, expected in graphs(case):
        for _ in range(2):                            # twice: backward must reset the old gradients
            backward(root)
            for leaf, want in zip(leaves, expected):
                if not isinstance(leaf.grad, (float, int, np.floating)) or not np.isclose(
                        float(leaf.grad), want, rtol=1e-9, atol=1e-12):
                    raise Wrong(f"d root / d {leaf.name} = {leaf.grad!r}, expected {want:.6g}"
                                + (" (a node used twice must get the sum of both gradients: +=, not =)"
                                   if leaf.name == "a" else ""))
        if root.grad != 1.0:
            raise Wrong(f"the root's own gradient should be 1 (d root / d root), got {root.grad!r}")


@exercise("02.3", "unbroadcast", answer="my_unbroadcast", seed=2,
          reference="tinymlp/autograd.py (unbroadcast)", forbidden=("tinymlp.autograd.unbroadcast",))
def unbroadcast(my_unbroadcast, case):
    shapes = case.pick([((4, 3), (3,)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 1)), ((2, 4, 3), (1, 1, 3)),
                        ((5,), (5,)), ((2, 3), ()), ((3, 1, 2), (3, 1, 2))],
                       [((5, 2), (2,)), ((3, 5), (3, 1)), ((2, 3, 5), (3, 1)), ((4, 2, 3), (1, 2, 1)),
                        ((6,), ()), ((3, 2, 2), (2, 2)), ((1, 4), (1, 4))])
    for gshape, shape in shapes:
        g = case.rng.normal(size=gshape)
        want = g
        while want.ndim > len(shape):
            want = want.sum(axis=0)
        for ax, n in enumerate(shape):
            if n == 1 and want.shape[ax] != 1:
                want = want.sum(axis=ax, keepdims=True)
        got = my_unbroadcast(g.copy(), shape)
        close(f"unbroadcast(grad of shape {gshape}, {shape})", got, want)

"""tinymlp.plot.graph and to_dot: the autograd graph behind a tensor, drawn (lesson 2 uses them)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tinymlp import F, plot, tensor

pytest.importorskip("matplotlib")


def _diamond():
    a = tensor([1.0, 2.0, 3.0], requires_grad=True, dtype="float64")
    a.name = "a"
    b = tensor([0.5, -1.0, 2.0], requires_grad=True, dtype="float64")
    c = tensor([1.0, 1.0, 1.0], dtype="float64")           # a constant: not part of the graph
    return a, b, ((a * b + a) * c).sum()


def _labels(dot):
    return dict(re.findall(r'^\s*(n\d+) \[label="([^"]*)"', dot, flags=re.M))


def test_to_dot_names_ops_shapes_and_leaves():
    a, b, y = _diamond()
    dot = plot.to_dot(y)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    labels = _labels(dot)
    names = {key: lab.replace(" (fast)", "") for key, lab in labels.items()}   # the fast tier's Add is an Add
    ops = [lab for lab in names.values() if lab.split("\\n")[0] in ("Mul", "Add", "Sum")]
    assert sorted(lab.split("\\n")[0] for lab in ops) == ["Add", "Mul", "Mul", "Sum"]
    assert "Sum\\n()" in names.values() and "Add\\n(3,)" in names.values()
    leaves = [lab for lab in labels.values() if lab.startswith("leaf")]
    assert len(leaves) == 2 and any(lab.startswith("leaf a") for lab in leaves)
    assert sum("shape=box" in line for line in dot.splitlines()) == 4
    assert sum("shape=ellipse" in line for line in dot.splitlines()) == 3   # two leaves and the output
    # a feeds two ops (the diamond): one node, two edges out of it
    a_key = next(k for k, lab in labels.items() if lab.startswith("leaf a"))
    assert len(re.findall(rf"^\s*{a_key} -> ", dot, flags=re.M)) == 2
    assert not any("grad" in lab for lab in labels.values())   # no gradients before backward


def test_gradients_are_shown_after_backward():
    a, b, y = _diamond()
    y.backward(retain_graph=True)
    labels = _labels(plot.to_dot(y))
    leaf_a = next(lab for lab in labels.values() if lab.startswith("leaf a"))
    assert "grad [1.5, 0. , 3. ]" in leaf_a                 # b + 1
    fig = plot.graph(y)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("grad" in t for t in texts) and any(t.startswith("Mul") for t in texts)


def test_graph_draws_and_saves(tmp_path):
    x = tensor(np.ones((2, 3)), requires_grad=True)
    w = tensor(np.ones((3, 4)), requires_grad=True)
    out = F.gelu(x @ w).mean()
    path = tmp_path / "sub" / "graph.png"
    fig = plot.graph(out, path)
    assert path.exists() and path.stat().st_size > 1000
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("(2, 4)" in t for t in texts)                # an op box shows its output shape
    assert sum(t.startswith("leaf") for t in texts) == 2


def test_a_leaf_alone_and_a_freed_graph():
    x = tensor([1.0, 2.0], requires_grad=True)
    assert "leaf" in plot.to_dot(x)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(ValueError, match="retain_graph"):
        plot.graph(y)
    with pytest.raises(TypeError):
        plot.to_dot(np.ones(3))


def test_an_op_is_named_after_its_reference_function():
    # with the fast tier on, a node's Function may be a fast stand-in: the box still says GELU
    x = tensor(np.ones((2, 3)), requires_grad=True)
    names = [lab.split("\\n")[0] for lab in _labels(plot.to_dot(F.gelu(x).sum())).values()]
    assert any(n == "GELU" or n == "GELU (fast)" for n in names), names

# Source of lessons/02_autograd_engine.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 2: The autograd engine
#
# In lesson 1 we derived one gradient by hand. A network has millions of weights and
# thousands of operations; reverse-mode automatic differentiation ("autograd") does the same
# chain-rule bookkeeping mechanically: during the forward pass it *records* which operation
# produced which tensor, and `backward()` walks that record from the loss back to the weights.
#
# **Objectives.** In this lesson:
#
# 1. tensors: data, gradient, and whether to track them;
# 2. the graph that the forward pass records, and `backward()` over it;
# 3. watching the engine work: reverse topological order, each node visited once;
# 4. gradient accumulation (`+=`) and `zero_grad`;
# 5. broadcasting and its adjoint, `unbroadcast`;
# 6. a two-layer MLP trained on a toy 2-D set with nothing but tensors and this engine.
#
# **Prerequisites:** lesson 1 (the chain rule, finite differences); NumPy broadcasting.
#
# **Exercises:** 02.1 (topological order) and 02.2 (backward with gradient accumulation) in a
# micrograd-sized engine of your own, 02.3 (unbroadcast). Each is followed by a `check`.
#
# **In tinymlp:** `tinymlp/tensor.py` (the `Tensor` class), `tinymlp/autograd.py` (the
# `Function` contract, `unbroadcast` and the engine: `Engine.apply` and `Engine.backward`, the
# algorithm alone in about 200 lines, worth reading top to bottom after this lesson),
# `tinymlp/graph.py` (the topological order `backward` walks), `tinymlp/grad_mode.py`
# (`no_grad`) and `tinymlp/ops/` (one small `Function` per operation). `tinymlp/fast/engine.py`
# is the same algorithm with fewer passes over memory, the engine that runs by default: read it
# after the reference, as you would read an op's fast version after its formula.

# %%
import sys
import time

import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp import Function, F, no_grad, plot, tensor
from tinymlp.autograd import unbroadcast
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Tensors
#
# A `Tensor` wraps an array (`.data`, a NumPy array on the CPU, CuPy on a GPU) and adds
# what autograd needs: `.requires_grad` (track me), `.grad` (filled in by `backward`), and a
# link to the operation that produced it. Floating-point data becomes float32 unless asked
# otherwise; the lessons use float64 where they compare against exact derivatives.

# %%
a = tensor([1.0, 2.0, 3.0], requires_grad=True)
b = tensor(np.array([0.5, -1.0, 2.0]), dtype="float64")
print(a, a.dtype, a.shape, "leaf:", a.is_leaf)
print(b, "requires_grad:", b.requires_grad)
print("a.data is a", type(a.data).__name__)

# only floating-point tensors can require a gradient: a class label has no slope
try:
    tensor([1, 2, 3], requires_grad=True)
except TypeError as err:
    print("TypeError:", err)

# %% [markdown]
# ## 2. The graph and `backward()`
#
# Every operation on a tensor that requires grad creates a node that remembers the operation
# and its inputs. The result is not a leaf: it knows where it came from. Take
#
# $$y = \sum_i (a_i b_i + a_i), \qquad
#   \frac{\partial y}{\partial a_i} = b_i + 1, \qquad \frac{\partial y}{\partial b_i} = a_i .$$

# %%
a = tensor([1.0, 2.0, 3.0], requires_grad=True, dtype="float64")
b = tensor([0.5, -1.0, 2.0], requires_grad=True, dtype="float64")
a.name, b.name = "a", "b"          # optional names: the drawing below shows them
prod = a * b
y = (prod + a).sum()
print("y =", y.item(), "| prod is a leaf?", prod.is_leaf, "| prod requires grad?", prod.requires_grad)
plot.graph(y)      # the recorded graph: ops as boxes, tensors as ovals (leaves double-outlined)

# %% [markdown]
# Inputs on the left, the result on the right; `a` feeds two ops (a box marked "(fast)" is an op
# that ran tinymlp's faster implementation of it: same values, same gradients). `tinymlp.plot.graph(t)`
# draws the graph behind any tensor (`plot.to_dot(t)` gives Graphviz text for the same
# graph). Now run backward. Normally it frees the graph as it goes (section 4);
# `retain_graph=True` keeps it, so that we can draw it again, now with the gradients the
# leaves received:

# %%
y.backward(retain_graph=True)
plot.graph(y)
print("dy/da =", a.grad, "  expected b + 1 =", b.data + 1)
print("dy/db =", b.grad, "  expected a     =", a.data)
assert np.allclose(a.grad, b.data + 1) and np.allclose(b.grad, a.data)

# %% [markdown]
# What `backward()` did, step by step. Each node holds a `Function` whose `backward` turns the
# gradient of its output into gradients of its inputs (a *vector-Jacobian product*: it never
# forms the Jacobian):
#
# | node | forward | backward: given $g = \partial y/\partial\,\text{out}$ |
# |---|---|---|
# | `Sum` | $y = \sum_i s_i$ | $\partial y/\partial s = g\,\mathbf 1$ |
# | `Add` | $s = p + a$ | $\partial y/\partial p = g$, $\partial y/\partial a \mathrel{+}= g$ |
# | `Mul` | $p = a \odot b$ | $\partial y/\partial a \mathrel{+}= g \odot b$, $\partial y/\partial b = g \odot a$ |
#
# $a$ is used twice (by `Mul` and by `Add`), so its gradient is the *sum* of the gradients
# arriving along both uses: $b + 1$. The seed is $\partial y/\partial y = 1$ (a scalar loss
# needs no argument; a non-scalar output needs `backward(grad)` with a gradient of its shape).
#
# ## 3. Watching the engine: reverse topological order
#
# We cannot see `backward` run, but we can make it tell us. `Trace` is a `Function` (the same
# contract as every op in `tinymlp/ops/`: lesson 3 writes real ones) that passes its input
# through unchanged and, in `backward`, writes its name into a log before passing the gradient on.

# %%
LOG = []


class Trace(Function):
    """Identity in forward; in backward, record the node's name and pass the gradient on."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x

    @staticmethod
    def backward(ctx, grad):
        LOG.append(ctx.name)
        return grad


def mark(t, name):
    return Trace.apply(t, name=name)


# a diamond: u feeds both v and w, which meet again in y
x = tensor(rng.normal(size=4), requires_grad=True, dtype="float64")
u = mark(x * 2, "u")
v = mark(u.tanh(), "v")
w = mark(u * 3, "w")
y = mark(v + w, "y")
LOG.clear()
y.sum().backward()
print("backward visited:", " -> ".join(LOG))

# %% [markdown]
# `u` appears once, and only after *both* of its consumers `v` and `w`: by then its two
# incoming gradients have been added up, so one call to its `backward` passes on the total.
# That is the rule: a node runs only after every node that used its output, i.e. the nodes
# are visited in **reverse topological order**. The engine finds that order with a depth-first
# search from the loss, then calls each node's `backward` exactly once.

# %%
assert LOG[0] == "y" and LOG[-1] == "u" and LOG.count("u") == 1 and set(LOG[1:3]) == {"v", "w"}
expected = 2 * ((1 - np.tanh(2 * x.data) ** 2) + 3)     # dy/du = tanh'(u) + 3, du/dx = 2
assert np.allclose(x.grad, expected)

# %% [markdown]
# Why not simply recurse, "for each input, call backward with its share"? It would be
# correct (the gradients would add up in the end) but it walks every *path*: in a chain of
# $k$ diamonds there are $2^k$ paths from the loss to the input. Topological order walks every
# *node* once. Let us stack 40 diamonds ($2^{40} \approx 10^{12}$ paths):

# %%
z = tensor(rng.normal(size=4) * 0.1, requires_grad=True, dtype="float64")
h = z
for k in range(40):
    h = mark(h, f"u{k}")
    h = mark(h.tanh(), f"v{k}") + mark(h * 0.5, f"w{k}")
LOG.clear()
start = time.perf_counter()
h.sum().backward()
print(f"{len(LOG)} backward calls for 120 traced nodes in {1e3 * (time.perf_counter() - start):.1f} ms")
assert len(LOG) == 120 and len(set(LOG)) == 120

# %% [markdown]
# The depth-first search itself uses an explicit stack rather than Python recursion, so a
# graph deeper than Python's recursion limit is no problem (a recurrent network unrolled
# over a long sequence is such a graph):

# %%
print("Python's recursion limit:", sys.getrecursionlimit())
c = tensor(1.0, requires_grad=True, dtype="float64")
s = c
for _ in range(20_000):
    s = s * 1.0001
s.backward()
print("d(c * 1.0001^20000)/dc =", float(c.grad), " exact:", 1.0001**20_000)
assert np.isclose(c.grad, 1.0001**20_000)

# %% [markdown]
# ### Your own engine, in thirty lines
#
# The engine's core fits on a screen, so write it yourself, the size of micrograd. A `Value`
# is a number that remembers the `parents` it was computed from and the local derivatives
# `local_grads` $= \partial\,\text{self}/\partial\,\text{parent}$, one per parent (the
# ops below are given).

# %%
class Value:
    """A scalar node: data, grad, the parents it was computed from, d(self)/d(parent) for each."""

    def __init__(self, data, parents=(), local_grads=(), name=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.local_grads, self.name = tuple(parents), tuple(local_grads), name

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data + other.data, (self, other), (1.0, 1.0))

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        return Value(self.data * other.data, (self, other), (other.data, self.data))

    def tanh(self):
        t = np.tanh(self.data)
        return Value(t, (self,), (1 - t * t,))

    def __repr__(self):
        return f"Value({self.name or round(self.data, 4)})"

# %% [markdown]
# **Exercise 02.1.** Return every node that `root` depends on (`root` included), each exactly
# once, every node *after* all of its parents: a topological order. A depth-first search that
# appends a node when all its parents are done gives one. (Use an explicit stack, or recursion:
# our graphs are small.)

# %%
def topological_order(root):
    """All nodes root depends on, each once, each after its parents."""
    # BEGIN SOLUTION 02.1
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:                      # all parents are in the order: now the node
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in node.parents)
    return order
    # END SOLUTION


check("02.1", topological_order)

# %% [markdown]
# **Exercise 02.2.** `backward(root)` sets every node's `.grad` to
# $\partial\,\text{root}/\partial\,\text{node}$: reset all gradients to 0, seed
# `root.grad = 1`, then visit the nodes in *reverse* topological order and pass each node's
# gradient to its parents through the chain rule, `parent.grad += local * node.grad`. The `+=`
# is the point: a node used twice (`x * x`) must receive the sum of both contributions.
#
# *Predict, then run:* with `a = Value(3.0)`, what is `a.grad` after `backward(a * a + a)`?
# What would it be with `=` instead of `+=`?

# %%
def backward(root):
    """Fill in .grad of every node root depends on: d root / d node."""
    # BEGIN SOLUTION 02.2
    order = topological_order(root)
    for node in order:
        node.grad = 0.0
    root.grad = 1.0
    for node in reversed(order):          # a node runs after every node that used it
        for parent, local in zip(node.parents, node.local_grads):
            parent.grad += local * node.grad
    # END SOLUTION


if check("02.2", backward):
    a = Value(3.0, name="a")
    backward(a * a + a)
    print("d(a*a + a)/da at a = 3:", a.grad, "(2a + 1 = 7; with '=' one path would overwrite the other)")
    # the same diamond as in tinymlp above: our engine agrees with the library's
    xv = Value(0.5)
    u_v = xv * 2.0
    y_v = u_v.tanh() + u_v * 3.0
    backward(y_v)
    assert np.isclose(xv.grad, 2 * ((1 - np.tanh(1.0) ** 2) + 3))
else:
    skipped("02.2", "d(a*a + a)/da with your backward, and the diamond against the library's")

# %% [markdown]
# ## 4. Gradients accumulate
#
# `backward()` *adds* into `.grad` (`+=`), it does not overwrite. That is what makes a
# weight used in several places get the sum of its gradients, and what lets you accumulate
# the gradients of several small batches before one update. The price: between two training
# steps you must reset them, with `zero_grad()` on the tensors (or on the optimizer). In
# `tinymlp/autograd.py` the sum is one plain line, `leaf.grad = leaf.grad + g`
# (`Engine.accumulate_leaf`, and `Engine.accumulate` for the nodes inside the graph); the fast
# engine writes the same sum into the existing array where nothing else holds it.
#
# *Predict, then run:* `loss = (wgt * inp).sum()` with `inp = [3, 4]`, and `backward()` three
# times (a new graph each time). What is `wgt.grad` at the end?

# %%
wgt = tensor([1.0, -2.0], requires_grad=True, dtype="float64")
inp = np.array([3.0, 4.0])
for step in range(3):
    loss = (wgt * inp).sum()        # d loss / d wgt = inp
    loss.backward()
    print(f"after backward #{step + 1}: wgt.grad = {wgt.grad}")
assert np.allclose(wgt.grad, 3 * inp)
wgt.zero_grad()
print("after zero_grad:", wgt.grad)

# %% [markdown]
# To save memory, `backward()` frees the graph it walked (the nodes drop the arrays they
# saved for it). A second `backward()` through the same graph is an error that says what to
# do; `retain_graph=True` keeps the graph for that rare case.

# %%
loss = (wgt * inp).sum()
loss.backward()
try:
    loss.backward()
except RuntimeError as err:
    print("RuntimeError:", err)

# %% [markdown]
# Under `no_grad()` nothing is recorded at all: use it for evaluation, where no gradient is
# needed, to save the time and the memory of the graph.

# %%
with no_grad():
    pred = wgt * inp
print("recorded under no_grad?", pred.requires_grad)
assert not pred.requires_grad

# %% [markdown]
# ## 5. Broadcasting and its adjoint
#
# Adding a bias $b$ of shape $(3,)$ to a batch $X$ of shape $(4, 3)$ *broadcasts* $b$: NumPy
# acts as if it were copied into each of the 4 rows. Every copy influences the loss, so the
# gradient of $b$ is the **sum** of the gradients of its copies:
#
# $$Y_{nj} = X_{nj} + b_j \quad\Longrightarrow\quad
#   \frac{\partial \mathcal L}{\partial b_j} = \sum_n \frac{\partial \mathcal L}{\partial Y_{nj}} .$$
#
# In general broadcasting (1) prepends axes and (2) stretches axes of size 1; its adjoint
# sums over exactly those axes. `tinymlp.autograd.unbroadcast(grad, shape)` is that one
# rule, shared by every op whose inputs broadcast.

# %%
X = tensor(rng.normal(size=(4, 3)), requires_grad=True, dtype="float64")
bias = tensor([0.5, -1.2, 0.3], requires_grad=True, dtype="float64")
col = tensor([[0.7], [-0.4], [1.1], [-0.9]], requires_grad=True, dtype="float64")
G = rng.normal(size=(4, 3))                   # some upstream gradient dL/dY
(X + bias + col).backward(G)
print("bias.grad =", bias.grad, "= column sums of G")
print("col.grad  =", col.grad.ravel(), "= row sums of G (kept as shape (4, 1))")
assert np.allclose(bias.grad, G.sum(axis=0)) and np.allclose(col.grad, G.sum(axis=1, keepdims=True))
assert np.allclose(X.grad, G)

g = np.ones((2, 4, 3))
print("unbroadcast to (4, 1):", unbroadcast(g, (4, 1)).ravel(), "(each entry summed 2 x 3 = 6 ones)")
assert unbroadcast(g, (4, 1)).shape == (4, 1) and np.all(unbroadcast(g, (4, 1)) == 6)

# %% [markdown]
# **Exercise 02.3.** Write `unbroadcast` yourself: given the gradient of a broadcast result and
# the shape of one input, undo the two steps of broadcasting: sum over the leading axes that
# broadcasting prepended, then over the axes where the input had size 1 (keeping them, with
# `keepdims=True`).

# %%
def my_unbroadcast(grad, shape):
    """Sum grad back to `shape`: the adjoint of broadcasting an array of that shape."""
    # BEGIN SOLUTION 02.3
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad
    # END SOLUTION


check("02.3", my_unbroadcast)

# %% [markdown]
# The numerical gradient checker (lesson 3 shows how it works and how to read its report)
# confirms the whole expression at once, including the broadcast inputs:

# %%
report = tinymlp.gradcheck(lambda x, b, c: (x + b + c).tanh(), (X, bias, col))
print(report.summary())
assert report.passed

# %% [markdown]
# ## 6. A two-layer MLP on a toy set
#
# Two interleaving half-moons cannot be separated by a line (the neuron of lesson 1 would
# fail). One hidden layer of $H$ tanh units can bend the boundary:
#
# $$h = \tanh(X W_1 + b_1), \qquad \text{logits} = h W_2 + b_2, \qquad
#   \mathcal L = \text{cross-entropy}(\text{logits}, y).$$
#
# We write it with bare tensors and update the weights ourselves with gradient descent,
# $\theta \leftarrow \theta - \eta\,\partial\mathcal L/\partial\theta$: every gradient comes
# from `loss.backward()`.

# %%
def two_moons(n, noise, rng):
    label = np.arange(n) % 2
    angle = rng.uniform(0, np.pi, n)
    x = np.where(label == 0, np.cos(angle), 1 - np.cos(angle))
    y = np.where(label == 0, np.sin(angle), 0.5 - np.sin(angle))
    points = np.stack([x, y], axis=1) + rng.normal(scale=noise, size=(n, 2))
    return points - points.mean(axis=0), label


points, labels = two_moons(400, 0.12, rng)

H = 32
W1 = tensor(rng.normal(size=(2, H)) / np.sqrt(2), requires_grad=True)   # float32, like a real model
b1 = tensor(np.zeros(H), requires_grad=True)
W2 = tensor(rng.normal(size=(H, 2)) / np.sqrt(H), requires_grad=True)
b2 = tensor(np.zeros(2), requires_grad=True)
params = [W1, b1, W2, b2]


def mlp(x):
    return (x @ W1 + b1).tanh() @ W2 + b2


Xs = tensor(points)
losses = []
lr = 0.5
for step in range(1500):
    loss = F.cross_entropy(mlp(Xs), labels)
    for p in params:
        p.zero_grad()
    loss.backward()
    with no_grad():                 # an update is not part of the model: nothing to record
        for p in params:
            p -= lr * p.grad        # plain gradient descent, in place, as an optimizer's step does
    losses.append(loss.item())

with no_grad():
    accuracy = (mlp(Xs).argmax(axis=1).numpy() == labels).mean()
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, training accuracy {accuracy:.1%}")
assert accuracy > 0.95

# %%
grid_x, grid_y = np.meshgrid(np.linspace(-2.2, 2.2, 200), np.linspace(-1.6, 1.6, 150))
grid = np.stack([grid_x.ravel(), grid_y.ravel()], axis=1)
with no_grad():
    prob = F.softmax(mlp(tensor(grid)), axis=1).numpy()[:, 1].reshape(grid_x.shape)

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.2))
ax0.plot(losses)
ax0.set_yscale("log")
ax0.set_xlabel("step")
ax0.set_ylabel("cross-entropy")
ax0.set_title("Training loss")
ax1.contourf(grid_x, grid_y, prob, levels=20, cmap="RdBu_r", alpha=0.6)
ax1.contour(grid_x, grid_y, prob, levels=[0.5], colors="k")
ax1.scatter(*points[labels == 0].T, s=8, c="tab:blue", label="class 0")
ax1.scatter(*points[labels == 1].T, s=8, c="tab:red", label="class 1")
ax1.set_title("p(class 1) and the decision boundary")
ax1.legend(loc="upper right")
plt.show()

# %% [markdown]
# ### The same model with `tinymlp.nn` and `tinymlp.optim`
#
# `nn.Linear` holds the weight and bias as `Parameter`s (tensors that require grad),
# `nn.GELU` is the activation of the models in this course (lesson 3 derives it),
# `model.parameters()` finds them all, and an optimizer does the update loop and `zero_grad`.
# Nothing new happens underneath: it is the loop above, packaged.

# %%
from tinymlp import nn, optim

model = nn.Sequential(nn.Linear(2, H, rng=0), nn.GELU(), nn.Linear(H, 2, rng=1))   # GELU: a smooth ReLU (lesson 3)
opt = optim.SGD(model.parameters(), lr=0.5)
for step in range(1500):
    loss = F.cross_entropy(model(Xs), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
with no_grad():
    accuracy = (model(Xs).argmax(axis=1).numpy() == labels).mean()
print(model)
print(f"final loss {loss.item():.3f}, training accuracy {accuracy:.1%}")
assert accuracy > 0.95

# %% [markdown]
# ## What to remember
#
# - The forward pass records a graph; `backward()` visits it in reverse topological order,
#   each node once, and each node's `backward` maps the gradient of its output to the
#   gradients of its inputs.
# - A tensor used several times receives the sum of its gradients; `.grad` accumulates
#   across `backward()` calls too, so reset it (`zero_grad`) between steps.
# - Broadcasting copies; the gradient of a copy is a sum (`unbroadcast`).
#
# **Next:** lesson 3 writes new operations (`Function`s) and checks their backward passes.

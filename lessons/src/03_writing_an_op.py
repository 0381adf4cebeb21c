# Source of lessons/03_writing_an_op.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 3: Writing an op
#
# The engine of lesson 2 knows nothing about linear layers or activations: it only calls
# `backward` on each node. The mathematics lives in the ops, each a `Function` with a
# forward pass and a hand-derived backward pass. Here we write two of them, the two that
# make up an MLP, derive their backward passes, and let the gradient checker judge them.
# Then we break one on purpose and learn to read the checker's report.
#
# **Objectives.** In this lesson:
#
# 1. the `Function` contract;
# 2. `Linear`: $y = xW + b$, backward derived with differentials, gradchecked;
# 3. `GELU` (tanh form): derived, gradchecked, plotted;
# 4. two deliberately wrong backward passes, caught, and the report explained line by line;
# 5. our ops against the library's `F.linear` and `F.gelu`.
#
# **Prerequisites:** lesson 2 (the graph, `backward`, broadcasting); matrix products.
#
# **Exercises:** 03.1 (Linear backward) and 03.2 (GELU backward), each checked by
# `tinymlp.gradcheck`.
#
# **In tinymlp:** `tinymlp/ops/linear.py` and `tinymlp/ops/activation.py` hold the real ops
# (with the same derivations in their docstrings); `tinymlp/gradcheck/method.py` is the checker.

# %%
import math
import time

import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp import F, Function, GradcheckError, array_module, gradcheck, tensor
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The `Function` contract
#
# A `Function` subclass has two static methods that work on **raw arrays** (NumPy or CuPy),
# never on Tensors, as in PyTorch's `torch.autograd.Function`:
#
# - `forward(ctx, *arrays, **options) -> array`: compute the output; keep what backward will
#   need with `ctx.save_for_backward(...)` (and small values as attributes, `ctx.axis = ...`);
# - `backward(ctx, grad) -> one gradient per input`: `grad` is $\partial\mathcal L/\partial y$,
#   of the output's shape; return $\partial\mathcal L/\partial x$ for each input, of exactly
#   that input's shape and dtype (or `None` where `ctx.needs_input_grad` says none is needed).
#
# `MyOp.apply(*tensors)` unwraps the tensors, calls `forward`, and records the node.
# Inside, `xp = array_module(x)` is `numpy` or `cupy`, so one code path serves both devices.
#
# ## 2. Linear
#
# For $x$ of shape $(\dots, D_\text{in})$, $W$ of shape $(D_\text{in}, D_\text{out})$ and
# $b$ of shape $(D_\text{out},)$: $y = xW + b$ over the last axis. Flatten the leading axes so
# that $X$ is $(N, D_\text{in})$ and $Y = XW + \mathbf 1 b^\top$ is one matrix product. Let
# $G = \partial\mathcal L/\partial Y$ $(N, D_\text{out})$. A small change of the inputs changes
# $Y$ by
#
# $$dY = dX\,W + X\,dW + \mathbf 1\,db^\top ,$$
#
# and the loss by $d\mathcal L = \langle G, dY\rangle = \operatorname{tr}(G^\top dY)$, the sum of
# the elementwise products. Move each differential to the right of the inner product with
# $\langle A, BC\rangle = \langle B^\top A, C\rangle = \langle A C^\top, B\rangle$:
#
# $$\langle G, dX\,W\rangle = \langle G W^\top, dX\rangle, \quad
#   \langle G, X\,dW\rangle = \langle X^\top G, dW\rangle, \quad
#   \langle G, \mathbf 1 db^\top\rangle = \langle G^\top \mathbf 1, db\rangle ,$$
#
# and read off the gradients, the factors multiplying each differential:
#
# $$\frac{\partial\mathcal L}{\partial X} = G W^\top, \qquad
#   \frac{\partial\mathcal L}{\partial W} = X^\top G, \qquad
#   \frac{\partial\mathcal L}{\partial b} = \sum_n G_{n,:} .$$
#
# A useful sanity device: $\partial\mathcal L/\partial W$ must have $W$'s shape
# $(D_\text{in}, D_\text{out})$, and $X^\top G$ is the only product of $X$ and $G$ that does.
# Note also that $X^\top G = \sum_n x_n g_n^\top$ sums over every sample *and* every token in
# one matrix product: that is why the op flattens first.
#
# **Exercise 03.1.** Write `MyLinear.backward`: the three gradients above, for the flattened
# `x2` $(N, D_\text{in})$ and `g2` $(N, D_\text{out})$, with `dx` reshaped back to `x`'s shape.
# Once yours passes, compare it with the library's reference in `tinymlp/ops/linear.py`.

# %%
class MyLinear(Function):
    """y = x W + b over the last axis; dL/dx = G W^T, dL/dW = X^T G, dL/db = column sums of G."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, weight.shape[0])          # (N, D_in)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        y = x2 @ weight + bias
        return y.reshape(x.shape[:-1] + (weight.shape[1],))

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, weight.shape[1])       # (N, D_out)
        # BEGIN SOLUTION 03.1
        dx = (g2 @ weight.T).reshape(ctx.x_shape)
        dw = x2.T @ g2
        db = g2.sum(axis=0)
        return dx, dw, db
        # END SOLUTION


def my_linear(x, weight, bias):
    return MyLinear.apply(x, weight, bias)


linear_done = check("03.1", MyLinear)

# %%
x = tensor(rng.normal(size=(2, 5, 4)), requires_grad=True, dtype="float64")   # (batch, tokens, features)
weight = tensor(rng.normal(size=(4, 3)), requires_grad=True, dtype="float64")
bias = tensor(rng.normal(size=3), requires_grad=True, dtype="float64")

y = my_linear(x, weight, bias)
assert np.allclose(y.numpy(), np.einsum("bsi,io->bso", x.numpy(), weight.numpy()) + bias.numpy())
if linear_done:
    report = gradcheck(my_linear, (x, weight, bias))
    print(report)
else:
    skipped("03.1", "the gradcheck report of your Linear")

# %% [markdown]
# `gradcheck` perturbed every element of `x`, `weight` and `bias` by $\pm h$, measured the
# change of a scalar loss, and compared with what our backward put into `.grad` (section 4
# explains the method and the report in detail). Every row says `ok`. (The check of
# exercise 03.1 ran the same gradcheck, on a square and a non-square weight.)
#
# ## 3. GELU
#
# GELU weighs its input by the probability that a standard normal variable is below it:
# $\operatorname{GELU}(x) = x\,\Phi(x)$. The Transformers of the course and MLP-Mixer use the
# tanh approximation of $\Phi$:
#
# $$y = x\,h, \qquad h = \tfrac12\bigl(1 + t\bigr), \qquad t = \tanh u, \qquad
#   u = c_0\,(x + c_1 x^3), \qquad c_0 = \sqrt{2/\pi},\; c_1 = 0.044715 .$$
#
# The product rule, then the chain rule through $t$ and $u$:
#
# $$\frac{dy}{dx} = h + x\,\frac{dh}{dx}
#   = h + x\cdot\tfrac12(1 - t^2)\cdot c_0\,(1 + 3c_1x^2),
# \qquad \frac{\partial\mathcal L}{\partial x} = g \odot \frac{dy}{dx} .$$
#
# What to save for backward? $dy/dx$ needs $x$ and $t$; the forward pass has both in hand.
# (The library goes one step further: it computes $dy/dx$ already in forward, so its backward
# is a single multiplication.)
#
# **Exercise 03.2.** Write `MyGELU.backward` from the formula above (`grad` times $dy/dx$).
# The reference is `tinymlp/ops/activation.py`.

# %%
C0, C1 = math.sqrt(2 / math.pi), 0.044715


class MyGELU(Function):
    """y = x (1 + tanh(c0 (x + c1 x^3))) / 2;  dy/dx = h + x (1 - t^2)/2 c0 (1 + 3 c1 x^2)."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        t = xp.tanh(C0 * (x + C1 * x * x * x))     # x*x*x, not x**3: a general power is much slower
        ctx.save_for_backward(x, t)
        return 0.5 * x * (1 + t)

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.saved_tensors
        # BEGIN SOLUTION 03.2
        dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x)
        return grad * dydx
        # END SOLUTION


def my_gelu(x):
    return MyGELU.apply(x)


gelu_done = check("03.2", MyGELU)

# %%
xs = np.linspace(-4, 4, 401)
xt = tensor(xs, requires_grad=True, dtype="float64")
if gelu_done:
    my_gelu(xt).sum().backward()      # the gradient of sum(f(x)) is f'(x), pointwise
else:
    F.gelu(xt).sum().backward()       # until exercise 03.2 passes, the library's GELU draws the curve
    skipped("03.2", "your GELU's derivative in the plot (the library's stands in)")
exact = F.gelu(tensor(xs, dtype="float64"), approximate=False).numpy()   # x Phi(x), with erf

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8))
ax0.plot(xs, np.maximum(xs, 0), color="0.6", label="ReLU")
ax0.plot(xs, my_gelu(tensor(xs, dtype="float64")).numpy(), lw=2, label="GELU (tanh form)")
ax0.set_title("GELU: a smooth ReLU, slightly negative below 0")
ax0.legend()
ax1.plot(xs, (xs > 0).astype(float), color="0.6", label="ReLU'")
ax1.plot(xs, xt.grad, lw=2, label="GELU' (our backward)")
ax1.set_title("Derivatives")
ax1.legend()
plt.show()
gap = np.abs(exact - my_gelu(tensor(xs, dtype="float64")).numpy()).max()
print(f"largest gap between the tanh form and x*Phi(x) on [-4, 4]: {gap:.1e}")
assert gap < 1e-3

# %% [markdown]
# ## 4. Breaking it on purpose
#
# A backward pass with a bug usually still *runs*: it returns arrays of the right shapes and
# training even seems to make progress, only worse. That is why every op is checked against
# finite differences. Here is the classic bug in Linear: the weight gradient transposed,
# $G^\top X$ instead of $X^\top G$.
#
# With a non-square weight the shapes disagree, and the engine itself stops it:

# %%
class TransposedLinear(MyLinear):
    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, weight.shape[1])
        dx = (g2 @ weight.T).reshape(ctx.x_shape)
        dw = (g2.T @ x2)                     # BUG: (D_out, D_in), the transpose of X^T G
        return dx, dw, g2.sum(axis=0)


def bad_linear(x, weight, bias):
    return TransposedLinear.apply(x, weight, bias)


x = tensor(rng.normal(size=(6, 4)), requires_grad=True, dtype="float64")
w_rect = tensor(rng.normal(size=(4, 3)), requires_grad=True, dtype="float64")
b3 = tensor(rng.normal(size=3), requires_grad=True, dtype="float64")
try:
    bad_linear(x, w_rect, b3).sum().backward()
except RuntimeError as err:
    print("RuntimeError:", err)

# %% [markdown]
# With a square weight, $G^\top X$ has the right shape and nothing complains, except the
# numbers. `gradcheck` raises `GradcheckError`; its message is the full report.

# %%
weight = tensor(rng.normal(size=(4, 4)), requires_grad=True, dtype="float64")    # square this time
bias = tensor(rng.normal(size=4), requires_grad=True, dtype="float64")
try:
    gradcheck(bad_linear, (x, weight, bias))
except GradcheckError as err:
    caught = err
    print(str(err))

# %% [markdown]
# ### Reading the report, line by line
#
# 1. **Title and settings.** `FAILED: bad_linear`, then how it checked: `mode=full` (every
#    element; large tensors are `sampled`), `check dtype=float64` (inputs are copied to
#    float64 first: in float32 the finite differences are too noisy, see lesson 1), the step
#    `eps` $= h$, the tolerances `rtol`/`atol`, and the *noise floor*: differences below it are
#    rounding noise of the finite difference and can neither fail nor certify an element.
# 2. **`upstream gradient: random N(0,1)`.** The function's outputs $y$ are turned into one
#    scalar $\mathcal L = \langle g, y\rangle$ with a fixed random $g$, so the check tests
#    `backward(g)` for a $g$ that is not all ones (section 4b shows why that matters).
#    `forward deterministic: yes` (two runs agreed) and `inputs restored: yes` (the check left
#    the tensors exactly as it found them).
# 3. **The table**, one row per checked tensor: elements checked, how many fail, the largest
#    absolute and relative errors, the verdict. Here `x` and `bias` are `ok` and only
#    `weight` fails: the bug is in the line that computes `dw`.
# 4. **The worst elements**: index, numerical and analytical value. Look at the pairs: the
#    analytical value at `[i, j]` appears as the numerical value at `[j, i]`.
# 5. **`pattern`**: what the failing elements have in common; here the checker noticed that
#    the analytical gradient is the numerical one transposed.
# 6. **`likely`**: the bug that usually produces that pattern (`W` vs `W.T`).
# 7. **`trust`**: the numerical estimate was recomputed with steps 10x larger and smaller and
#    did not move, so it is the *analytical* side (our backward) that is wrong, not the probe.
# 8. **`reproduce`**: everything is seeded; pasted into a cell, this call gives the same
#    report again. It names the tensors as `bad_linear` names its parameters (`x`, `weight`,
#    `bias`), which is why the cell above gave the square weight and its bias those names.
#
# The report is also data, for tests and for your own tools:

# %%
result = caught.report.per_tensor["weight"]
print("verdict:", result.verdict, "| hint kind:", result.hint_kind)
print("likely:", result.hint)
assert result.verdict == "FAIL" and result.hint_kind == "transpose"
assert caught.report.per_tensor["x"].verdict == "ok" and caught.report.per_tensor["bias"].verdict == "ok"

# %% [markdown]
# ### 4b. Forgetting the incoming gradient
#
# The second classic: backward returns the local derivative $dy/dx$ and forgets to multiply
# by `grad`. If the check used $\mathcal L = \sum_i y_i$, the incoming gradient would be all
# ones and the bug would be invisible, which is why the checker draws a random upstream
# gradient by default.

# %%
class ForgetfulGELU(MyGELU):
    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.saved_tensors
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x)   # BUG: no grad *


def forgetful_gelu(x):
    return ForgetfulGELU.apply(x)


x = tensor(rng.normal(size=(3, 4)), requires_grad=True, dtype="float64")
try:
    gradcheck(forgetful_gelu, (x,))
except GradcheckError as err:
    print(str(err))
    assert err.report.per_tensor["x"].hint_kind == "upstream_ignored"

# %% [markdown]
# Every element fails, with no simple ratio between the columns, and the `likely` line
# names the bug: backward does not scale with its incoming gradient.
#
# Even with `upstream="ones"`, where every single value agrees, the checker is not fooled:
# it also calls backward with $2g$ and with $0$, and a correct backward is *linear* in its
# incoming gradient.

# %%
report = gradcheck(forgetful_gelu, (x,), upstream="ones", raise_on_fail=False)
print(report)
assert not report.passed

# %% [markdown]
# ## 5. Our ops and the library's
#
# `F.linear` and `F.gelu` are the library's versions of these two ops. They compute the
# same values and the same gradients; they differ in care for speed and errors: `F.linear`
# refuses mismatched shapes with a message naming them, and `F.gelu` computes in place, in
# chunks that stay in the CPU cache, and saves $dy/dx$ instead of $x$ and $t$.

# %%
x_np = rng.normal(size=(8, 16, 32))
w_np = rng.normal(size=(32, 24)) / np.sqrt(32)
b_np = rng.normal(size=24)
upstream = rng.normal(size=(8, 16, 24))

grads = {}
for name, lin, act in [("ours", my_linear, my_gelu), ("library", F.linear, F.gelu)]:
    if name == "ours" and not (linear_done and gelu_done):
        skipped("03.1 and 03.2", "your Linear and GELU in the comparison with the library's")
        continue
    xs_, ws_, bs_ = (tensor(a, requires_grad=True, dtype="float64") for a in (x_np, w_np, b_np))
    out = act(lin(xs_, ws_, bs_))
    out.backward(upstream)
    grads[name] = [out.numpy(), xs_.grad, ws_.grad, bs_.grad]
if "ours" in grads:
    for label, ours, lib in zip(["output", "dL/dx", "dL/dW", "dL/db"], grads["ours"], grads["library"]):
        print(f"{label:7s} max difference {np.abs(ours - lib).max():.1e}")
        assert np.allclose(ours, lib, rtol=1e-10, atol=1e-12)

try:
    F.linear(tensor(x_np), tensor(w_np.T), tensor(b_np))
except ValueError as err:
    print("ValueError:", err)

# %%
big = tensor(rng.normal(size=(256, 64, 128)), requires_grad=True)    # float32, 2M elements


def timed(fn, repeats=5):
    best = float("inf")
    for _ in range(repeats):
        big.zero_grad()
        start = time.perf_counter()
        fn(big).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


if gelu_done:
    t_ours, t_lib = timed(my_gelu), timed(F.gelu)
    print(f"GELU forward+backward on {big.size:,} float32 values: "
          f"ours {1e3 * t_ours:.0f} ms, F.gelu {1e3 * t_lib:.0f} ms")
else:
    skipped("03.2", "the timing of your GELU against F.gelu")

# %% [markdown]
# ## What to remember
#
# - An op is a forward on arrays plus a backward that maps $\partial\mathcal L/\partial y$ to
#   $\partial\mathcal L/\partial x$ for each input, with exactly the input's shape.
# - Derive with differentials: write $dY$, then $\langle G, dY\rangle$, and move each
#   differential out; shapes are a free check ($X^\top G$ is the only candidate for $dW$).
# - Always gradcheck in float64 with a random upstream gradient, and read the report top down:
#   which tensor fails, which elements, what pattern, whether the probe can be trusted.
#
# **Next:** lesson 4 derives a backward pass where the shortcut matters: LayerNorm.

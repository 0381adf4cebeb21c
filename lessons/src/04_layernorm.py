# Source of lessons/04_layernorm.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 4: LayerNorm and its efficient backward
#
# Every block of MLP-Mixer, gMLP and the Transformer starts with a LayerNorm: each token's
# vector of $D$ channels is shifted to mean 0 and scaled to variance 1, then stretched and
# shifted by learned $\gamma$ and $\beta$. The forward pass is four lines. Its backward pass
# is the first one in this course where deriving by hand pays off: composed from primitive ops
# the engine would record about ten nodes and as many temporary arrays; derived once, it is
# three reductions and a few multiplications.
#
# **Objectives.** In this lesson:
#
# 1. the forward pass;
# 2. the backward pass derived step by step, and its Jacobian checked numerically;
# 3. a `Function` with that backward, gradchecked, against `F.layer_norm` and against the
#    naive composition of primitives;
# 4. what the gradient cannot contain (shift and scale of a row), and the constant-row case.
#
# **Prerequisites:** lesson 3 (writing a `Function`, reading a gradcheck report); the chain rule
# for several variables.
#
# **Exercises:** 04.1 (LayerNorm backward) and 04.2 (its Jacobian), each followed by a `check`.
#
# **In tinymlp:** `tinymlp/ops/norm.py` (`LayerNorm`, `layer_norm`), used by `nn.LayerNorm`
# in `tinymlp/nn/layers.py`.

# %%
import time

import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp import F, Function, array_module, gradcheck, no_grad, tensor
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Forward
#
# For one row $x \in \mathbb R^D$ (the last axis; every other axis is a batch of rows):
#
# $$\mu = \frac1D\sum_j x_j, \qquad \sigma^2 = \frac1D\sum_j (x_j - \mu)^2, \qquad
#   r = \frac{1}{\sqrt{\sigma^2 + \varepsilon}}, \qquad \hat x = (x - \mu)\,r, \qquad
#   y = \gamma \odot \hat x + \beta .$$
#
# $\varepsilon$ (1e-5 by default, 1e-6 in MLP-Mixer) keeps $r$ finite for a constant row.

# %%
def layer_norm_reference(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


D = 8
x_np = rng.normal(loc=3.0, scale=2.0, size=(5, D))
gamma_np, beta_np = rng.normal(size=D), rng.normal(size=D)
y = layer_norm_reference(x_np, np.ones(D), np.zeros(D))
print("row means after LN:", y.mean(axis=1).round(12))
print("row stds  after LN:", y.std(axis=1).round(5))

# %% [markdown]
# ## 2. Backward, step by step
#
# Let $G = \partial\mathcal L/\partial y$, one row $g_\text{out}$ per row of $x$.
#
# **Step 1: $\gamma$ and $\beta$.** They are shared by all rows (broadcast, lesson 2), so
# their gradients are sums over the rows:
#
# $$\frac{\partial\mathcal L}{\partial\beta} = \sum_\text{rows} G, \qquad
#   \frac{\partial\mathcal L}{\partial\gamma} = \sum_\text{rows} G \odot \hat x .$$
#
# **Step 2: through the scale.** $y = \gamma\odot\hat x + \beta$, so
# $g := \partial\mathcal L/\partial\hat x = G \odot \gamma$. From here on, one row.
#
# **Step 3: the local derivatives.** $\hat x_i = (x_i - \mu)\,r$ depends on $x_j$ directly,
# through $\mu$ and through $r$:
#
# $$\frac{\partial\mu}{\partial x_j} = \frac1D, \qquad
#   \frac{\partial\sigma^2}{\partial x_j} = \frac2D\,(x_j - \mu)
#   \quad\Bigl(\text{the path through } \mu \text{ contributes }
#   \frac{\partial\sigma^2}{\partial\mu}\,\frac{\partial\mu}{\partial x_j}
#   = -\tfrac{2}{D}\textstyle\sum_i (x_i - \mu)\cdot\tfrac1D = -\tfrac{2}{D^2}\sum_i (x_i - \mu) = 0\Bigr),$$
#
# $$\frac{\partial r}{\partial x_j} = -\tfrac12(\sigma^2 + \varepsilon)^{-3/2}\,\frac{\partial\sigma^2}{\partial x_j}
#   = -r^3\,\frac{x_j - \mu}{D} = -\frac{r^2}{D}\,\hat x_j .$$
#
# **Step 4: the Jacobian of $\hat x$.** By the product rule, using $x_i - \mu = \hat x_i / r$:
#
# $$\frac{\partial\hat x_i}{\partial x_j}
#   = r\Bigl(\delta_{ij} - \frac1D\Bigr) + (x_i - \mu)\frac{\partial r}{\partial x_j}
#   = r\Bigl(\delta_{ij} - \frac1D - \frac{\hat x_i\,\hat x_j}{D}\Bigr),
# \qquad J = r\Bigl(I - \tfrac1D\mathbf 1\mathbf 1^\top - \tfrac1D\hat x\hat x^\top\Bigr).$$
#
# **Step 5: contract with $g$.** $J$ is symmetric, so $\partial\mathcal L/\partial x = J g$:
#
# $$\boxed{\;\frac{\partial\mathcal L}{\partial x_j}
#   = r\Bigl(g_j - \overline{g} - \hat x_j\,\overline{g\odot\hat x}\Bigr)\;}
#   \qquad \overline{v} = \frac1D\sum_i v_i .$$
#
# Two row means and a few elementwise operations: $O(D)$ per row, never the $D\times D$
# Jacobian. And the only things needed are $\hat x$ and $r$, which forward has anyway: that is
# what it saves (not $x$, $\mu$, $\sigma^2$, which would have to be turned into $\hat x$ again).
#
# Before trusting the boxed formula, check the Jacobian of step 4 against finite
# differences, column by column.
#
# **Exercise 04.2.** Return the $D\times D$ Jacobian $J_{ij} = \partial\hat x_i/\partial x_j$ of
# step 4 for one row (no $\gamma$, $\beta$): compute $r$ and $\hat x$, then the formula.

# %%
def layer_norm_jacobian(row, eps=1e-5):
    """J[i, j] = d x_hat_i / d x_j for one row x of length D."""
    # BEGIN SOLUTION 04.2
    D = row.shape[-1]
    r = 1 / np.sqrt(row.var() + eps)
    xh = (row - row.mean()) * r
    return r * (np.eye(D) - 1 / D - np.outer(xh, xh) / D)
    # END SOLUTION


jacobian_done = check("04.2", layer_norm_jacobian)

# %%
def x_hat_of(row, eps=1e-5):
    return layer_norm_reference(row, 1.0, 0.0, eps)


row = x_np[0]
h = 1e-6
J_numeric = np.stack([(x_hat_of(row + h * e) - x_hat_of(row - h * e)) / (2 * h) for e in np.eye(D)], axis=1)
r = 1 / np.sqrt(row.var() + 1e-5)
J_formula = layer_norm_jacobian(row) if jacobian_done else J_numeric   # the numbers stand in until 04.2 passes
if not jacobian_done:
    skipped("04.2", "your Jacobian in this comparison and the eigenvalues below (the finite differences stand in)")
print("max |J_numeric - J_formula| =", np.abs(J_numeric - J_formula).max())
assert np.allclose(J_numeric, J_formula, atol=1e-8)

# %% [markdown]
# The eigenvalues of $J$ tell what LayerNorm forgets. $\mathbf 1$ (a shift of the whole row)
# and $\hat x$ (a rescaling of the row) are mapped to (almost) zero; every direction
# orthogonal to both passes through multiplied by $r$:

# %%
eig = np.sort(np.linalg.eigvalsh(J_formula))
print("eigenvalues of J:", eig.round(6), "  r =", round(r, 6))
assert np.allclose(eig[:2], 0, atol=1e-5) and np.allclose(eig[2:], r)

# %% [markdown]
# ## 3. A LayerNorm `Function`
#
# **Exercise 04.1.** Write `MyLayerNorm.backward`: $\partial\mathcal L/\partial\gamma$ and
# $\partial\mathcal L/\partial\beta$ summed over every axis but the last (step 1), then
# $g = G\odot\gamma$ and the boxed formula, from the saved $\hat x$ and $r$ only. The reference
# is `tinymlp/ops/norm.py`; read it once yours passes.

# %%
class MyLayerNorm(Function):
    """y = gamma * x_hat + beta over the last axis; dL/dx = r (g - mean g - x_hat mean(g x_hat)), g = G gamma."""

    @staticmethod
    def forward(ctx, x, gamma, beta, eps=1e-5):
        xp = array_module(x)
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        r = 1 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
        x_hat = xc * r
        ctx.save_for_backward(x_hat, r, gamma)
        return gamma * x_hat + beta

    @staticmethod
    def backward(ctx, grad):
        x_hat, r, gamma = ctx.saved_tensors
        # BEGIN SOLUTION 04.1
        rows = tuple(range(grad.ndim - 1))                 # every axis but the last
        dgamma = (grad * x_hat).sum(axis=rows)
        dbeta = grad.sum(axis=rows)
        g = grad * gamma                                   # dL/dx_hat
        dx = r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
        return dx, dgamma, dbeta
        # END SOLUTION


def my_layer_norm(x, gamma, beta):
    return MyLayerNorm.apply(x, gamma, beta)


layer_norm_done = check("04.1", MyLayerNorm)

# %%
x = tensor(rng.normal(size=(2, 3, D)) * 2 + 1, requires_grad=True, dtype="float64")
gamma = tensor(gamma_np, requires_grad=True, dtype="float64")
beta = tensor(beta_np, requires_grad=True, dtype="float64")
if layer_norm_done:
    print(gradcheck(my_layer_norm, (x, gamma, beta)))
else:
    skipped("04.1", "the gradcheck report of your LayerNorm")

# %% [markdown]
# The library's `F.layer_norm` computes the same values and gradients (it does the row sums
# with `einsum` and the arithmetic in place, but the formula is the boxed one):

# %%
upstream = rng.normal(size=x.shape)
results = {}
for name, fn in [("ours", my_layer_norm), ("F.layer_norm", F.layer_norm)][0 if layer_norm_done else 1:]:
    xs_, gs_, bs_ = (tensor(t.numpy(), requires_grad=True, dtype="float64") for t in (x, gamma, beta))
    out = fn(xs_, gs_, bs_)
    out.backward(upstream)
    results[name] = (out.numpy(), xs_.grad, gs_.grad, bs_.grad)
if layer_norm_done:
    for label, a, b in zip(["y", "dx", "dgamma", "dbeta"], *results.values()):
        assert np.allclose(a, b, rtol=1e-10, atol=1e-12), label
    print("ours == F.layer_norm == the NumPy reference")
else:
    skipped("04.1", "your LayerNorm against F.layer_norm")
assert np.allclose(results["F.layer_norm"][0], layer_norm_reference(x.numpy(), gamma_np, beta_np))

# %% [markdown]
# ### Why not let autograd derive it?
#
# We could write LayerNorm with primitive tensor ops and get the same gradient for free. It is
# correct, but the engine then records every intermediate (mean, centred copy, square, variance,
# square root, division, ...) and runs one backward per node. Same numbers, more time and memory:

# %%
def composed_layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return gamma * (xc / (var + eps).sqrt()) + beta


xs_ = tensor(x.numpy(), requires_grad=True, dtype="float64")
composed_layer_norm(xs_, tensor(gamma_np, dtype="float64"), tensor(beta_np, dtype="float64")).backward(upstream)
assert np.allclose(xs_.grad, results["F.layer_norm"][1])

big_x = tensor(rng.normal(size=(64, 256, 256)), requires_grad=True)   # float32: 64 images x 256 tokens x 256 channels
big_g = tensor(np.ones(256), requires_grad=True)
big_b = tensor(np.zeros(256), requires_grad=True)


def timed(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(big_x, big_g, big_b).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


for name, fn in [("composed from primitives", composed_layer_norm), ("our Function", my_layer_norm),
                 ("F.layer_norm", F.layer_norm)]:
    if fn is my_layer_norm and not layer_norm_done:
        skipped("04.1", "the timing of your Function")
        continue
    print(f"{name:25s} forward + backward: {1e3 * timed(fn):6.0f} ms")

# %% [markdown]
# ## 4. What the gradient cannot contain
#
# LayerNorm's output does not change if a row is shifted ($x + c\mathbf 1$) or scaled
# ($s\,x$, up to $\varepsilon$). So the loss cannot change along those directions either, and the
# gradient must be orthogonal to them: for every row,
#
# $$\sum_j \frac{\partial\mathcal L}{\partial x_j} = 0, \qquad
#   \sum_j \frac{\partial\mathcal L}{\partial x_j}\,\hat x_j \approx 0 .$$
#
# (The boxed formula shows it directly: subtracting $\overline g$ removes the component along
# $\mathbf 1$, subtracting $\hat x\,\overline{g\odot\hat x}$ the one along $\hat x$. The second
# sum is not exactly 0 because $\varepsilon$ breaks the scale invariance a little:
# $\|\hat x\|^2 = D\,\sigma^2/(\sigma^2+\varepsilon)$, so what remains is a factor
# $\varepsilon/(\sigma^2+\varepsilon)$ of the untouched component.)

# %%
dx = results["F.layer_norm"][1]
x_hat = layer_norm_reference(x.numpy(), 1.0, 0.0)
print("max |row sum of dL/dx|        :", np.abs(dx.sum(axis=-1)).max())
print("max |row sum of dL/dx * x_hat|:", np.abs((dx * x_hat).sum(axis=-1)).max())
assert np.allclose(dx.sum(axis=-1), 0, atol=1e-12)
# relative to the sizes of the two vectors, the second sum is of the order eps / sigma^2
scale = np.linalg.norm(dx, axis=-1) * np.linalg.norm(x_hat, axis=-1)
assert np.all(np.abs((dx * x_hat).sum(axis=-1)) < 1e-4 * scale)

# %% [markdown]
# ### The constant row
#
# A row with all entries equal (a padding token, a dead channel group, an image patch of flat
# colour) has $\sigma^2 = 0$. Without $\varepsilon$ the forward pass divides $0$ by $0$:

# %%
const = np.full((1, D), 0.7)
with np.errstate(invalid="ignore", divide="ignore"):
    print("without eps:", (const - const.mean()) / np.sqrt(const.var()))

# %% [markdown]
# With $\varepsilon$: $r = 1/\sqrt{\varepsilon}$ ($\approx 316$ for $\varepsilon = 10^{-5}$),
# $\hat x = 0$, the output is $\beta$, $\partial\mathcal L/\partial\gamma$ gets nothing from
# that row, and the input gradient is $r\,(g - \overline g)$: finite, but amplified about
# 316 times. LayerNorm stays smooth there, so the gradient check passes.

# %%
eps = 1e-5
xc_ = tensor(np.concatenate([const, x_np[:1]]), requires_grad=True, dtype="float64")
gc_ = tensor(gamma_np, requires_grad=True, dtype="float64")
bc_ = tensor(beta_np, requires_grad=True, dtype="float64")
out = F.layer_norm(xc_, gc_, bc_, eps=eps)
print("output of the constant row == beta:", np.allclose(out.numpy()[0], beta_np))
up = rng.normal(size=(2, D))
out.backward(up)
g = up[0] * gamma_np
assert np.allclose(xc_.grad[0], (g - g.mean()) / np.sqrt(eps))
print(f"|dL/dx| of the constant row: {np.linalg.norm(xc_.grad[0]):.1f}  vs  "
      f"|dL/dx| of an ordinary row: {np.linalg.norm(xc_.grad[1]):.2f}")
report = gradcheck(lambda x, w, b: F.layer_norm(x, w, b, eps=eps), (xc_, gc_, bc_))
assert report.passed
print(report.summary())

# %% [markdown]
# How the gain of the backward pass depends on the spread of a row: for a row of standard
# deviation $\sigma$, the components of $g$ orthogonal to $\mathbf 1$ and $\hat x$ come back
# multiplied by $r = 1/\sqrt{\sigma^2 + \varepsilon}$: $1/\sigma$ for ordinary rows, capped at
# $1/\sqrt\varepsilon$ as the row becomes constant.

# %%
D_big = 64
sigmas = np.logspace(-5, 1, 40)
direction = rng.normal(size=D_big)
noise = rng.normal(size=D_big)
ones, zeros = tensor(np.ones(D_big), dtype="float64"), tensor(np.zeros(D_big), dtype="float64")
gains = []
for s in sigmas:
    row = (noise - noise.mean()) / noise.std() * s + 5.0        # standard deviation s, mean 5
    xl = tensor(row[None], requires_grad=True, dtype="float64")
    out = F.layer_norm(xl, ones, zeros, eps=eps)
    xh = out.numpy()[0]
    # an upstream gradient orthogonal to 1 and to x_hat: the directions LayerNorm passes on
    g = direction - direction.mean()
    g -= xh * (g @ xh) / (xh @ xh)
    out.backward(g[None])
    gains.append(np.linalg.norm(xl.grad) / np.linalg.norm(g))

fig, ax = plt.subplots(figsize=(6, 3.8))
ax.loglog(sigmas, gains, "o", ms=4, label="measured |dL/dx| / |g|")
ax.loglog(sigmas, 1 / np.sqrt(sigmas**2 + eps), label=r"$1/\sqrt{\sigma^2 + \varepsilon}$")
ax.axhline(1 / np.sqrt(eps), color="0.7", ls="--", label=r"$1/\sqrt{\varepsilon}$")
ax.set_xlabel(r"standard deviation $\sigma$ of the row")
ax.set_ylabel("gain of the backward pass")
ax.set_title(f"LayerNorm's gradient gain (eps = {eps:g})")
ax.legend()
plt.show()
assert np.allclose(gains, 1 / np.sqrt(sigmas**2 + eps), rtol=1e-3)

# %% [markdown]
# ## What to remember
#
# - $\partial\mathcal L/\partial x = r\,(g - \overline g - \hat x\,\overline{g\odot\hat x})$ with
#   $g = G\odot\gamma$; $\partial\mathcal L/\partial\gamma$ and $\partial\mathcal L/\partial\beta$
#   are row sums. Save $\hat x$ and $r$, nothing else.
# - The gradient has no component along a shift or a rescaling of the row: LayerNorm forgets
#   both, and its Jacobian has them in its null space.
# - $\varepsilon$ makes a constant row harmless in the forward pass, but its backward gain is
#   $1/\sqrt\varepsilon$.
#
# **Next:** lesson 5, softmax and attention, and how a Transformer sees positions and patches.

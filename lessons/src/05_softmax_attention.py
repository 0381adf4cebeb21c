# Source of lessons/05_softmax_attention.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 5: Softmax, attention, positions and patches
#
# Self-attention lets every token look at every other token and take a weighted average of
# what it finds there; the weights come from a softmax. This lesson builds the pieces a
# Vision Transformer (ViT) is made of, and that the MLP models of the next lessons replace
# or borrow: softmax and its Jacobian, scaled dot-product attention with masks, sinusoidal
# position encodings, and the cutting of an image into patch tokens.
#
# **Objectives.** In this lesson:
#
# 1. softmax: stability and its Jacobian $\operatorname{diag}(p) - pp^\top$, checked numerically;
# 2. scaled dot-product attention, why $\sqrt d$, masks (causal, padding), attention maps;
# 3. sinusoidal position encodings: the encoding at $t + \phi$ is a rotation of the one at $t$;
# 4. an image as a sequence of patch tokens, as ViT (and Mixer, and gMLP) see it.
#
# **Prerequisites:** lessons 3 and 4 (writing a `Function`, deriving a backward pass with a
# row-wise reduction).
#
# **Exercises:** 05.1 (softmax backward), 05.2 (softmax cross-entropy backward, derived from
# log-sum-exp), 05.3 (attention backward: the gradients of $Q$, $K$ and $V$), 05.4 (the rotation that shifts a
# position encoding).
#
# **In tinymlp:** `tinymlp/ops/attention.py` (`softmax`, `attention`, each with its fused
# backward), `tinymlp/ops/loss.py` (softmax cross-entropy), `tinymlp/models/vit.py`
# (`sinusoidal_embedding`, the ViT), `tinymlp/nn/layers.py` (`PatchEmbedding`),
# `tinymlp/nn/attention.py` (single- and multi-head attention layers).

# %%
import math

import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp import F, Function, array_module, gradcheck, nn, no_grad, tensor
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson
from tinymlp.data import SyntheticImages
from tinymlp.models import sinusoidal_embedding

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Softmax
#
# $$p_i = \operatorname{softmax}(x)_i = \frac{e^{x_i}}{\sum_k e^{x_k}} .$$
#
# Adding a constant $c$ to every $x_i$ multiplies numerator and denominator by $e^c$: the
# result does not change. Implementations use this to subtract $\max_k x_k$ first, so the
# largest exponent is $e^0 = 1$ and nothing overflows:

# %%
logits = np.array([1000.0, 1001.0, 1002.0])
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.exp(logits) / np.exp(logits).sum()
print("naive    :", naive)
print("F.softmax:", F.softmax(tensor(logits, dtype="float64")).numpy())
assert np.allclose(F.softmax(tensor(logits, dtype="float64")).numpy(),
                   F.softmax(tensor(logits - 1000, dtype="float64")).numpy())

# %% [markdown]
# ### The Jacobian
#
# With $Z = \sum_k e^{x_k}$, the quotient rule gives, for $i = j$ and $i \ne j$ at once,
#
# $$\frac{\partial p_i}{\partial x_j} = \frac{\delta_{ij}\,e^{x_i}\,Z - e^{x_i}\,e^{x_j}}{Z^2}
#   = p_i\,(\delta_{ij} - p_j),
# \qquad J = \operatorname{diag}(p) - p\,p^\top .$$
#
# $J$ is symmetric, and $J\mathbf 1 = p - p\,(p^\top\mathbf 1) = 0$: shifting all logits
# together changes nothing (the invariance above). Backward never builds $J$; it needs
# $J^\top g$ for an incoming gradient $g$:
#
# $$\frac{\partial\mathcal L}{\partial x} = J^\top g = p \odot g - p\,(p^\top g)
#   = p \odot \bigl(g - \langle g, p\rangle\bigr),$$
#
# one dot product per row. Check $J$ against finite differences, then the library's backward
# against $J^\top g$:

# %%
x = rng.normal(size=5)


def softmax_np(v):
    e = np.exp(v - v.max())
    return e / e.sum()


p = softmax_np(x)
J = np.diag(p) - np.outer(p, p)
h = 1e-6
J_numeric = np.stack([(softmax_np(x + h * e) - softmax_np(x - h * e)) / (2 * h) for e in np.eye(5)], axis=1)
print("max |J - finite differences| =", np.abs(J - J_numeric).max())
assert np.allclose(J, J_numeric, atol=1e-9)
assert np.allclose(J, J.T) and np.allclose(J @ np.ones(5), 0)

g = rng.normal(size=5)
xt = tensor(x, requires_grad=True, dtype="float64")
F.softmax(xt).backward(g)
assert np.allclose(xt.grad, J.T @ g) and np.allclose(xt.grad, p * (g - g @ p))
print("F.softmax backward == J^T g == p * (g - <g, p>)")
print(gradcheck(F.softmax, (tensor(rng.normal(size=(3, 6)), requires_grad=True, dtype="float64"),)).summary())

# %% [markdown]
# **Exercise 05.1.** Write `MySoftmax.backward` over the last axis: $p\odot(g - \langle g, p\rangle)$,
# one dot product per row, from the saved $p$ alone (the reference: `tinymlp/ops/attention.py`).

# %%
class MySoftmax(Function):
    """p = softmax(x) over the last axis; dL/dx = p * (g - <g, p>) row by row."""

    @staticmethod
    def forward(ctx, x):
        xp = array_module(x)
        e = xp.exp(x - x.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        # BEGIN SOLUTION 05.1
        return p * (grad - (grad * p).sum(axis=-1, keepdims=True))
        # END SOLUTION


check("05.1", MySoftmax)

# %% [markdown]
# ### Softmax cross-entropy, derived from log-sum-exp
#
# A classifier's loss for logits $x \in \mathbb R^K$ and the true class $y$ is the negative
# log-probability of that class, $\ell = -\log p_y$. Write it with the *log-sum-exp*
# $\operatorname{LSE}(x) = \log\sum_k e^{x_k}$:
#
# $$\ell = -\log\frac{e^{x_y}}{\sum_k e^{x_k}} = \operatorname{LSE}(x) - x_y .$$
#
# The derivative of LSE is the softmax: $\dfrac{\partial\operatorname{LSE}}{\partial x_j}
# = \dfrac{e^{x_j}}{\sum_k e^{x_k}} = p_j$. And $\partial x_y/\partial x_j = [j = y]$. So
#
# $$\frac{\partial\ell}{\partial x} = p - e_y ,$$
#
# the probabilities minus the one-hot target: no Jacobian, no division by $p_y$ (which could
# be 0 in floating point). Over a batch of $N$ rows the loss is the mean, so row $n$ gets
# $(p_n - e_{y_n})/N$, times the incoming gradient $g$ of the scalar loss (1 when the loss is
# the root). Forward is computed the same stable way: $\operatorname{LSE}(x) = m + \log\sum_k
# e^{x_k - m}$ with $m = \max_k x_k$, so nothing overflows and $\log$ never sees 0. Each
# row's gradient sums to 0 ($\sum_j p_j = 1$): raising all logits together changes nothing.
#
# **Exercise 05.2.** Write `MyCrossEntropy.backward`: one gradient for the logits (the labels
# are integers and get none: return `None` for them). Now gradcheck yours: the check does.
# The library's version is in `tinymlp/ops/loss.py`.

# %%
class MyCrossEntropy(Function):
    """loss = mean over rows of LSE(x_n) - x_n[y_n];  dL/dx = g (softmax(x) - onehot(y)) / N."""

    @staticmethod
    def forward(ctx, logits, labels):
        xp = array_module(logits)
        m = logits.max(axis=-1, keepdims=True)
        lse = m + xp.log(xp.exp(logits - m).sum(axis=-1, keepdims=True))     # (N, 1)
        rows = xp.arange(logits.shape[0])
        ctx.save_for_backward(xp.exp(logits - lse), labels)                  # p, and the labels
        return (lse[:, 0] - logits[rows, labels]).mean()

    @staticmethod
    def backward(ctx, grad):
        p, labels = ctx.saved_tensors
        # BEGIN SOLUTION 05.2
        d = p.copy()
        d[array_module(p).arange(p.shape[0]), labels] -= 1     # p - onehot(y)
        return grad * d / p.shape[0], None
        # END SOLUTION


if check("05.2", MyCrossEntropy):
    logits_ = tensor(rng.normal(size=(4, 3)), requires_grad=True, dtype="float64")
    labels_ = np.array([0, 2, 1, 2])
    MyCrossEntropy.apply(logits_, labels_).backward()
    print("each row of dL/dx sums to", logits_.grad.sum(axis=1).round(15))
    assert np.isclose(MyCrossEntropy.apply(logits_, labels_).item(), F.cross_entropy(logits_, labels_).item())
else:
    skipped("05.2", "the row sums of your cross-entropy's gradient, and the comparison with F.cross_entropy")

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
axes[0].bar(range(5), p)
axes[0].set_title("p = softmax(x)")
for ax, M, title in [(axes[1], J, "J = diag(p) - p p^T"), (axes[2], J_numeric, "finite differences")]:
    im = ax.imshow(M, cmap="RdBu_r", vmin=-0.25, vmax=0.25)
    ax.set_title(title)
    ax.set_xlabel("j (logit)")
axes[1].set_ylabel("i (probability)")
fig.colorbar(im, ax=axes[1:], shrink=0.8)
plt.show()

# %% [markdown]
# ## 2. Scaled dot-product attention
#
# Queries $Q$ $(n, d)$, keys $K$ $(m, d)$, values $V$ $(m, d_v)$:
#
# $$S = \frac{Q K^\top}{\sqrt d}, \qquad P = \operatorname{softmax}_\text{row}(S), \qquad O = P\,V .$$
#
# Row $i$ of $P$ is a probability distribution over the keys: how much query $i$ takes from
# each value. `F.attention(q, k, v)` computes $O$ over the last two axes (all leading axes are
# batch or head axes) with one fused backward pass.

# %%
n, m, d, dv = 4, 6, 8, 3
Q, K, V = rng.normal(size=(n, d)), rng.normal(size=(m, d)), rng.normal(size=(m, dv))
S = Q @ K.T / math.sqrt(d)
P = np.apply_along_axis(softmax_np, 1, S)
O = P @ V
O_lib = F.attention(*(tensor(a, dtype="float64") for a in (Q, K, V))).numpy()
assert np.allclose(O, O_lib)
print("F.attention == softmax(Q K^T / sqrt(d)) V")

# %% [markdown]
# ### The backward pass of attention
#
# Walk the three lines of forward backwards, given $G = \partial\mathcal L/\partial O$
# $(n, d_v)$. Each step is one we already know. Notation, as in lesson 3: a gradient is a $G$
# subscripted with its variable, $G_P = \partial\mathcal L/\partial P$ (the code's `dp`); a
# $d$ in front of a variable is a differential, a small change of it ($dQ$, $d\mathcal L$); and
# $d$ on its own is the width of a query.
#
# 1. $O = PV$ is a matrix product (lesson 3): $\dfrac{\partial\mathcal L}{\partial V} = P^\top G$
#    $(m, d_v)$ and $G_P := \dfrac{\partial\mathcal L}{\partial P} = G V^\top$ $(n, m)$.
# 2. $P = \operatorname{softmax}_\text{row}(S)$: row by row the softmax backward of section 1,
#    $G_S = P \odot \bigl(G_P - \operatorname{rowsum}(G_P \odot P)\bigr)$.
# 3. $S = QK^\top/\sqrt d$ is a matrix product with a constant factor. With $G_S$ in hand, small
#    changes $dQ$, $dK$ of the inputs change the loss by
#    $d\mathcal L = \langle G_S, dQ\,K^\top\rangle/\sqrt d + \langle G_S, Q\,dK^\top\rangle/\sqrt d$, so
#
# $$\frac{\partial\mathcal L}{\partial Q} = \frac{1}{\sqrt d}\,G_S\,K, \qquad
#   \frac{\partial\mathcal L}{\partial K} = \frac{1}{\sqrt d}\,G_S^\top Q, \qquad
#   \frac{\partial\mathcal L}{\partial V} = P^\top G .$$
#
# The scale $1/\sqrt d$ enters the gradients of $Q$ and $K$, exactly once each, and not that of
# $V$ (V never meets it). Shapes check the rest: $G_S\,K$ is $(n, d)$ like $Q$, $G_S^\top Q$ is
# $(m, d)$ like $K$.
# What to save: $Q$, $K$, $V$ and $P$ (recomputing $P$ would cost a second softmax). A
# masked score has $P_{ij} = 0$, so its $(G_S)_{ij} = 0$ too: masks need no extra code in backward.
#
# **Exercise 05.3.** Write `MyAttention.backward` for batched inputs $(\dots, n, d)$: use
# `swapaxes(-1, -2)` for the transposes so that leading batch axes ride along. Then gradcheck
# yours: the check runs `tinymlp.gradcheck` with $n \ne m$ and $d \ne d_v$. The reference,
# with masks, is `Attention` in `tinymlp/ops/attention.py`.

# %%
class MyAttention(Function):
    """O = softmax(Q K^T / sqrt(d)) V over the last two axes."""

    @staticmethod
    def forward(ctx, q, k, v):
        xp = array_module(q)
        scale = 1 / np.sqrt(q.shape[-1])
        s = (q @ k.swapaxes(-1, -2)) * scale
        e = xp.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return p @ v

    @staticmethod
    def backward(ctx, grad):
        q, k, v, p = ctx.saved_tensors
        # BEGIN SOLUTION 05.3
        dv = p.swapaxes(-1, -2) @ grad                           # P^T G
        dp = grad @ v.swapaxes(-1, -2)                           # G_P = G V^T
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))     # G_S: softmax backward, row by row
        dq = (ds @ k) * ctx.scale                                # G_S K / sqrt(d)
        dk = (ds.swapaxes(-1, -2) @ q) * ctx.scale               # G_S^T Q / sqrt(d)
        return dq, dk, dv
        # END SOLUTION


if check("05.3", MyAttention):
    ours = MyAttention.apply(*(tensor(a, dtype="float64") for a in (Q, K, V))).numpy()
    assert np.allclose(ours, O_lib)
    print("MyAttention == F.attention")
else:
    skipped("05.3", "your attention against F.attention")

# %% [markdown]
# **Why divide by $\sqrt d$?** If the entries of $q$ and $k$ are independent with variance 1,
# $q\cdot k = \sum_{c=1}^d q_c k_c$ is a sum of $d$ terms of variance 1: its standard
# deviation is $\sqrt d$. Unscaled, wider heads produce larger logits, the softmax saturates
# to a one-hot row, and its Jacobian $\operatorname{diag}(p) - pp^\top$ goes to zero: no
# gradient reaches $Q$ and $K$. Dividing by $\sqrt d$ keeps the logits at standard deviation 1
# whatever the width.
#
# *Predict, then run:* 64 keys, random queries and keys of width $d = 1024$. Without the scale,
# how large is the largest weight of a row, on average (uniform would be $1/64 \approx 0.016$)?
# And with it?

# %%
widths = [4, 16, 64, 256, 1024]
stats = {"unscaled": [], "scaled by 1/sqrt(d)": []}
for dd in widths:
    q, k = rng.normal(size=(64, dd)), rng.normal(size=(64, dd))
    for name, scale in [("unscaled", 1.0), ("scaled by 1/sqrt(d)", 1 / math.sqrt(dd))]:
        Pd = np.apply_along_axis(softmax_np, 1, q @ k.T * scale)
        stats[name].append(Pd.max(axis=1).mean())
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, values in stats.items():
    ax.semilogx(widths, values, "o-", label=name)
ax.set_xlabel("head width d")
ax.set_ylabel("mean of the largest weight per row")
ax.set_title("Softmax saturation, 64 keys (uniform would be 1/64)")
ax.legend()
plt.show()
assert stats["unscaled"][-1] > 0.9 and stats["scaled by 1/sqrt(d)"][-1] < 0.5

# %% [markdown]
# ### Masks and attention maps
#
# A mask says which keys each query may see (`True` = allowed); forbidden scores are set to a
# very negative number before the softmax, so their weights are 0. Two common ones:
#
# - **causal**: query $i$ sees keys $j \le i$ (a language model must not read the future);
# - **padding**: in a batch of sequences of different lengths, nobody attends to the padding.
#
# To *see* $P$, a small trick: with $V = I$ (the identity, $m \times m$), the output
# $O = P\,I$ **is** the attention map. Our example: 12 tokens where token $i + 6$ is a copy of
# token $i$; with $q = k = $ the tokens, each query attends to itself and to its twin.

# %%
T = 12
base = rng.normal(size=(T // 2, 16))
tokens = np.concatenate([base, base]) * 1.5         # token i+6 repeats token i
tok = tensor(tokens, dtype="float64")
eye = tensor(np.eye(T), dtype="float64")
lengths_mask = np.arange(T) < 9                      # only the first 9 keys are real, 3 are padding

maps = {
    "no mask": F.attention(tok, tok, eye).numpy(),
    "causal=True": F.attention(tok, tok, eye, causal=True).numpy(),
    "padding mask (keys 9-11 masked)": F.attention(tok, tok, eye, mask=lengths_mask[None, :]).numpy(),
}
fig, axes = plt.subplots(1, 3, figsize=(13, 4))
for ax, (title, Pm) in zip(axes, maps.items()):
    ax.imshow(Pm, cmap="viridis", vmin=0, vmax=1)
    ax.set_title(title)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
plt.show()

for Pm in maps.values():
    assert np.allclose(Pm.sum(axis=1), 1)
assert np.allclose(np.triu(maps["causal=True"], k=1), 0)          # nothing above the diagonal
assert np.allclose(maps["padding mask (keys 9-11 masked)"][:, 9:], 0)

# %% [markdown]
# Causality is a property we can test from the outside: changing the *later* tokens must not
# change the outputs at *earlier* positions.

# %%
x1 = rng.normal(size=(T, 8))
x2 = x1.copy()
x2[7:] = rng.normal(size=(T - 7, 8))                 # rewrite the future from position 7 on
o1 = F.attention(*[tensor(x1, dtype="float64")] * 3, causal=True).numpy()
o2 = F.attention(*[tensor(x2, dtype="float64")] * 3, causal=True).numpy()
assert np.allclose(o1[:7], o2[:7]) and not np.allclose(o1[7:], o2[7:])
print("positions 0-6 unchanged by rewriting positions 7-11")

q, k, v = (tensor(rng.normal(size=(2, 5, 4)), requires_grad=True, dtype="float64") for _ in range(3))
print(gradcheck(F.attention, (q, k, v), kwargs={"causal": True}).summary())

# %% [markdown]
# ## 3. Sinusoidal position encodings
#
# Attention treats its input as a *set*: permute the tokens and the outputs are permuted the
# same way. To tell positions apart, the Transformer adds to token $t$ a vector $p_t$:
#
# $$p_t(2i) = \sin(\omega_i t), \qquad p_t(2i+1) = \cos(\omega_i t), \qquad
#   \omega_i = 10000^{-2i/d}, \quad i = 0, \dots, d/2 - 1 .$$
#
# Each pair of channels is a clock hand turning at its own speed, from one radian per position
# ($i = 0$) down to a full turn every $2\pi\cdot 10^4$ positions. Unlike a raw position number,
# every entry stays in $[-1, 1]$ however long the sequence.

# %%
d_model, positions = 128, 50
PE = sinusoidal_embedding(positions, d_model)        # tinymlp's table, (positions, d)

omega = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
t_idx = np.arange(positions)[:, None]
assert np.allclose(PE[:, 0::2], np.sin(t_idx * omega)) and np.allclose(PE[:, 1::2], np.cos(t_idx * omega))

fig, ax = plt.subplots(figsize=(9, 3.5))
im = ax.imshow(PE, aspect="auto", cmap="RdBu_r")
ax.set_xlabel("channel k")
ax.set_ylabel("position t")
ax.set_title("Sinusoidal position encodings, d = 128, 50 positions")
fig.colorbar(im)
plt.show()

# %% [markdown]
# ### The encoding at $t + \phi$ is a rotation of the encoding at $t$
#
# By the angle-addition formulas, for each frequency $\omega_i$:
#
# $$\begin{bmatrix}\sin\omega_i(t+\phi)\\ \cos\omega_i(t+\phi)\end{bmatrix}
#   = \begin{bmatrix}\cos\omega_i\phi & \sin\omega_i\phi\\ -\sin\omega_i\phi & \cos\omega_i\phi\end{bmatrix}
#     \begin{bmatrix}\sin\omega_i t\\ \cos\omega_i t\end{bmatrix}.$$
#
# Stack the $d/2$ rotations into a block-diagonal matrix $M(\phi)$ $(d \times d)$: then
# $p_{t+\phi} = M(\phi)\,p_t$ **for every $t$**, with $M$ depending only on the offset $\phi$.
# A shift in position is a fixed linear map, one a layer can learn, which is what lets
# attention find "the token three places to the left" wherever it is.

# %% [markdown]
# **Exercise 05.4.** Build $M(\phi)$: a $d\times d$ matrix of zeros with, for each frequency
# $\omega_i$, the $2\times2$ rotation above in rows and columns $2i, 2i+1$.

# %%
def rotation(phi, omega):
    """Block-diagonal M(phi): one 2x2 rotation by omega_i * phi per (sin, cos) channel pair."""
    # BEGIN SOLUTION 05.4
    M = np.zeros((2 * len(omega), 2 * len(omega)))
    for i, w in enumerate(omega):
        c, s = np.cos(w * phi), np.sin(w * phi)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
    return M
    # END SOLUTION


rotation_done = check("05.4", rotation)

# %%
if not rotation_done:
    skipped("05.4", "the shifts of the position encodings by your rotation")
for phi in (1, 5, 17) if rotation_done else ():
    M = rotation(phi, omega)
    shifted = PE[:-phi] @ M.T                       # row t: M(phi) p_t
    err = np.abs(shifted - PE[phi:]).max()
    print(f"phi = {phi:2d}: max |M(phi) p_t - p_(t+phi)| over all t = {err:.1e}")
    assert err < 1e-9
    assert np.allclose(M @ M.T, np.eye(d_model))   # a rotation: lengths and angles are kept

# %% [markdown]
# Two consequences, visible below. Every $p_t$ has the same length $\sqrt{d/2}$ (rotations keep
# lengths), and the dot product of two encodings depends only on their distance:
# $p_t \cdot p_{t+\phi} = \sum_i \cos(\omega_i\phi)$. The similarity matrix $p_s\cdot p_t$ is
# constant along its diagonals: a *Toeplitz* matrix. Keep that picture in mind for lesson 7,
# where gMLP's learned spatial weights turn out to look the same.

# %%
sim = PE @ PE.T
assert np.allclose(np.linalg.norm(PE, axis=1), math.sqrt(d_model / 2))
assert np.allclose(np.diag(sim, 3), np.cos(3 * omega).sum())
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
im = ax0.imshow(sim, cmap="viridis")
ax0.set_title(r"$p_s \cdot p_t$: constant along diagonals")
ax0.set_xlabel("t")
ax0.set_ylabel("s")
fig.colorbar(im, ax=ax0)
phis = np.arange(positions)
ax1.plot(phis, [np.cos(f * omega).sum() for f in phis])
ax1.set_xlabel(r"distance $\phi$")
ax1.set_ylabel(r"$p_t \cdot p_{t+\phi}$")
ax1.set_title("Similarity falls with distance")
plt.show()

# %% [markdown]
# ## 4. An image as a sequence of patch tokens
#
# A Transformer reads a sequence of vectors. ViT makes one from an image by cutting it into
# non-overlapping $P \times P$ patches, flattening each ($C \cdot P^2$ numbers) and projecting it
# with one shared linear map to $D$ channels. A $32 \times 32$ image with $P = 8$ becomes
# $S = 16$ tokens. (MLP-Mixer and gMLP start exactly the same way.)
#
# The synthetic images of `tinymlp.data` are built on a $4\times4$ grid of $8\times8$ cells, so
# with $P = 8$ each patch is one cell. The class of an image is where a blue hollow square
# sits relative to a red cross: a relation *between* two patches, which is what token mixing
# has to discover.

# %%
data = SyntheticImages(num_images=20, seed=0)
image = data.images[3].astype(np.float32) / 255            # (3, 32, 32), channels first
C, H, W = image.shape
P = 8
gh, gw = H // P, W // P

# (C, H, W) -> (C, gh, P, gw, P) -> (gh, gw, C, P, P) -> (gh * gw, C * P * P): row-major tokens
patches = image.reshape(C, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(gh * gw, C * P * P)
print("image", image.shape, "->", patches.shape, "= (tokens, values per patch)")
print("class:", data.classes[data.labels[3]], "| markers in cells", data.markers[3])

fig = plt.figure(figsize=(10, 4.5))
ax = fig.add_axes([0.02, 0.05, 0.42, 0.85])
ax.imshow(image.transpose(1, 2, 0))
ax.set_xticks(np.arange(0, W + 1, P) - 0.5, [])
ax.set_yticks(np.arange(0, H + 1, P) - 0.5, [])
ax.grid(color="w", lw=1.5)
ax.set_title("the image and its 8x8 patch grid")
grid = fig.add_gridspec(gh, gw, left=0.5, right=0.92, bottom=0.05, top=0.9, wspace=0.1, hspace=0.35)
for token in range(gh * gw):
    sub = fig.add_subplot(grid[token // gw, token % gw])
    sub.imshow(patches[token].reshape(C, P, P).transpose(1, 2, 0))
    sub.set_title(f"token {token}", fontsize=8)
    sub.axis("off")
plt.show()

# %% [markdown]
# `nn.PatchEmbedding` does the same reshape (same row-major token order, each patch flattened
# as (channel, row, column)) followed by its linear projection `.proj`. Check it against our
# patches:

# %%
embed = nn.PatchEmbedding(image_size=32, patch_size=8, in_channels=3, dim=24, rng=0)
with no_grad():
    tokens_lib = embed(tensor(image[None])).numpy()[0]          # (16, 24)
ours = patches @ embed.proj.weight.numpy() + embed.proj.bias.numpy()
print("PatchEmbedding:", tuple(image[None].shape), "->", tokens_lib.shape, "| grid", embed.grid)
assert np.allclose(tokens_lib, ours, atol=1e-5)

# %% [markdown]
# From here ViT prepends a learned class token and adds a position encoding (learned, or the
# sinusoids of section 3: `tinymlp.models.ViT(..., pos_embedding="sinusoidal")`), then runs
# Transformer blocks of attention and MLPs. Attention's cost grows with the square of the
# number of tokens, because $P$ is $S\times S$. MLP-Mixer (lesson 6) keeps the patches and
# replaces attention with a plain MLP across tokens.
#
# ## What to remember
#
# - Softmax's Jacobian is $\operatorname{diag}(p) - pp^\top$; backward needs only
#   $p\odot(g - \langle g, p\rangle)$.
# - Cross-entropy is $\operatorname{LSE}(x) - x_y$, so its gradient is $p - e_y$ (over the batch
#   mean, divided by $N$).
# - Attention's backward is two matrix products around a softmax backward:
#   $\partial\mathcal L/\partial V = P^\top G$, $G_S = P\odot(G_P - \operatorname{rowsum}(G_P\odot P))$
#   with $G_P = GV^\top$, and $\partial\mathcal L/\partial Q = G_S\,K/\sqrt d$,
#   $\partial\mathcal L/\partial K = G_S^\top Q/\sqrt d$.
# - Attention is $\operatorname{softmax}(QK^\top/\sqrt d)\,V$; $\sqrt d$ keeps the softmax out of
#   saturation; masks set forbidden weights to zero.
# - Sinusoidal encodings turn a shift of position into a fixed rotation, so relative positions
#   are linear to read; their similarity matrix is Toeplitz.
# - Patches are tokens: reshape, transpose, reshape, one linear map.
#
# **Next:** lesson 6, MLP-Mixer: mixing tokens with an MLP instead of attention.

# Source of lessons/01_backprop_by_hand.ipynb (build it with: python lessons/make_lessons.py)

# %% [markdown]
# # Lesson 1: Backpropagation by hand
#
# A network learns by following the gradient of its loss with respect to every weight.
# Before any framework computes that gradient for us, we compute it once by hand for a
# single neuron, using nothing but the chain rule, and check every step with numbers.
#
# **Objectives.** In this lesson:
#
# 1. one neuron, a squared loss, and the chain rule for $\partial\mathcal L/\partial w_j$ and
#    $\partial\mathcal L/\partial b$;
# 2. finite differences: the numerical check that every later lesson relies on;
# 3. nine activation functions and their derivatives, each checked and plotted;
# 4. gradient descent on one neuron with the gradient we derived.
#
# **Prerequisites:** derivatives and the chain rule of one variable; NumPy arrays.
#
# **Exercises:** 01.1 (the gradient of a logistic neuron), 01.2 (a central difference). Each is
# followed by `check("01.1", ...)`, which prints `passed`, `not done yet` or `FAILED` and why.
#
# **In tinymlp:** the derivatives of this lesson are the `backward` methods of `Tanh`,
# `Sigmoid` and `ReLU` in `tinymlp/ops/elementwise.py`; the fused activation of the
# models, GELU, lives in `tinymlp/ops/activation.py` (lesson 3).

# %%
import numpy as np
import matplotlib.pyplot as plt

import tinymlp
from tinymlp.lessons import check, skipped   # the checks: tinymlp/lessons/checks/, one file per lesson

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. One neuron and the chain rule
#
# A neuron weighs its inputs $x_j$, adds a bias $b$ and passes the sum through an
# activation function:
#
# $$p = \operatorname{act}(z), \qquad z = \sum_j w_j x_j + b .$$
#
# The bias moves the point where the activation switches on; without it every neuron would
# be forced to switch at $w \cdot x = 0$. With a target $t$ and the squared error
#
# $$\mathcal L = \tfrac12 (p - t)^2 ,$$
#
# the loss depends on $w_j$ only through $z$, and on $z$ only through $p$. The chain rule
# multiplies the three local derivatives along that path:
#
# $$\frac{\partial \mathcal L}{\partial w_j}
#   = \underbrace{\frac{\partial \mathcal L}{\partial p}}_{p - t}\;
#     \underbrace{\frac{\partial p}{\partial z}}_{\operatorname{act}'(z)}\;
#     \underbrace{\frac{\partial z}{\partial w_j}}_{x_j}
#   = (p - t)\,\operatorname{act}'(z)\,x_j ,
# \qquad
# \frac{\partial \mathcal L}{\partial b} = (p - t)\,\operatorname{act}'(z)\cdot 1 .$$
#
# Both share the factor $\delta = (p - t)\operatorname{act}'(z)$, the *error signal* that
# arrives at the neuron's sum. Then $\partial\mathcal L/\partial w = \delta\,x$: a weight
# learns in proportion to how active its input was. Backpropagation is this bookkeeping done
# for every neuron of a network: compute $\delta$ once per node, reuse it for every weight
# that feeds the node, and pass $\delta$ times the weights on to the layer below.
#
# Without an activation, $\operatorname{act}' = 1$ and the gradient is the error scaled by
# the input. That is also why a network *needs* nonlinear activations: two linear layers
# in a row are one linear layer, $W_2 (W_1 x) = (W_2 W_1) x$, however many we stack.
#
# Let us take $\operatorname{act} = \tanh$, whose derivative is $1 - \tanh^2$.

# %%
x = rng.normal(size=3)            # inputs
w = rng.normal(size=3)            # weights
b = 0.1                           # bias
t = 0.5                           # target


def loss(w, b):
    p = np.tanh(w @ x + b)
    return 0.5 * (p - t) ** 2


z = w @ x + b
p = np.tanh(z)
delta = (p - t) * (1 - p**2)      # dL/dz = dL/dp * dp/dz
grad_w = delta * x                # dL/dw_j = delta * x_j
grad_b = delta                    # dL/db   = delta * 1
print("loss   ", loss(w, b))
print("dL/dw  ", grad_w)
print("dL/db  ", grad_b)

# %% [markdown]
# **Exercise 01.1.** The same neuron with the logistic activation $p = \sigma(z)$,
# $\sigma(z) = 1/(1 + e^{-z})$, whose derivative is $\sigma'(z) = \sigma(z)(1 - \sigma(z))$
# (section 3 derives it). Return $\partial\mathcal L/\partial w$ (an array like `w`) and
# $\partial\mathcal L/\partial b$ (a number) for $\mathcal L = \tfrac12(p - t)^2$.

# %%
def neuron_gradient(w, b, x, t):
    """dL/dw and dL/db of L = (p - t)^2 / 2 with p = sigmoid(w . x + b)."""
    # BEGIN SOLUTION 01.1
    p = 1 / (1 + np.exp(-(w @ x + b)))
    delta = (p - t) * p * (1 - p)             # dL/dz
    return delta * x, delta
    # END SOLUTION


check("01.1", neuron_gradient)

# %% [markdown]
# ## 2. Checking a derivative with finite differences
#
# A derivative is a limit of slopes, so we can estimate it by evaluating the function twice.
# The *central* difference
#
# $$f'(x) \approx \frac{f(x + h) - f(x - h)}{2h}$$
#
# is accurate to $O(h^2)$, against $O(h)$ for the one-sided $(f(x+h) - f(x))/h$. Expand both
# evaluations around $x$:
#
# $$f(x \pm h) = f(x) \pm h f'(x) + \tfrac{h^2}{2} f''(x) \pm \tfrac{h^3}{6} f'''(x) + O(h^4).$$
#
# In the difference the even terms ($f$, $\tfrac{h^2}{2}f''$) cancel and the odd ones add up:
# $f(x+h) - f(x-h) = 2h f'(x) + \tfrac{h^3}{3} f'''(x) + O(h^5)$. So the $h^3 f'''/6$ terms of
# the two expansions do not cancel; after the division by $2h$ they leave an error
# $\tfrac{h^2}{6} f'''(x)$. For each weight we nudge that weight alone, up and down.

# %%
h = 1e-6
fd_w = np.array([(loss(w + h * e, b) - loss(w - h * e, b)) / (2 * h) for e in np.eye(3)])
fd_b = (loss(w, b + h) - loss(w, b - h)) / (2 * h)
print("finite differences dL/dw", fd_w)
print("finite differences dL/db", fd_b)
assert np.allclose(grad_w, fd_w, rtol=1e-6, atol=1e-10)
assert np.isclose(grad_b, fd_b, rtol=1e-6, atol=1e-10)

# %% [markdown]
# **Exercise 01.2.** Write the central difference $\bigl(f(x+h) - f(x-h)\bigr)/2h$ as a
# function (it must work for a number `x` and, elementwise, for an array). The check tries it
# on $f(x) = x^3$, where the derivation above says the result is exactly $3x^2 + h^2$.
#
# *Predict, then run:* for $f(x) = x^3$ at $x = 2$ with $h = 0.1$, what does the central
# difference return, and what does the one-sided $(f(x+h) - f(x))/h$ return? (The next cell
# prints both.)

# %%
def my_central_difference(f, x, h=1e-6):
    """(f(x + h) - f(x - h)) / (2 h)."""
    # BEGIN SOLUTION 01.2
    return (f(x + h) - f(x - h)) / (2 * h)
    # END SOLUTION


if check("01.2", my_central_difference):
    print("central :", my_central_difference(lambda v: v**3, 2.0, 0.1), "= 12 + h^2")
else:
    skipped("01.2", "your central difference of x**3 at x = 2, h = 0.1")
print("one-sided:", ((2.1) ** 3 - 2.0**3) / 0.1, "= 12 + 3 x h + h^2 = 12 + 0.6 + 0.01")

# %% [markdown]
# Why $h = 10^{-6}$ and not as small as possible? Two errors compete. Truncation error
# shrinks like $h^2$; rounding error grows like $\varepsilon_{\text{machine}}\,|f| / h$,
# because two nearly equal numbers are subtracted and then divided by $h$. In float64
# ($\varepsilon \approx 2\cdot 10^{-16}$) the sweet spot of the central difference is near
# $h \approx \varepsilon^{1/3} \approx 10^{-5}$; in float32 ($\varepsilon \approx 10^{-7}$)
# it is near $10^{-2.5}$ and the best achievable error is far worse. This is why
# `tinymlp.gradcheck` always checks in float64.

# %%
hs = np.logspace(-14, -1, 60)
err64 = [abs((loss(w, b + s) - loss(w, b - s)) / (2 * s) - grad_b) for s in hs]
w32, x32, t32 = w.astype(np.float32), x.astype(np.float32), np.float32(t)


def loss32(b):
    return np.float32(0.5) * (np.tanh(w32 @ x32 + np.float32(b)) - t32) ** 2


err32 = [abs(float(loss32(b + s) - loss32(b - s)) / (2 * s) - grad_b) for s in hs]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(hs, np.maximum(err64, 1e-17), label="float64")
ax.loglog(hs, np.maximum(err32, 1e-17), label="float32")
ax.set_xlabel("step h")
ax.set_ylabel("|finite difference - exact|")
ax.set_title("Central differences: rounding error (left) vs truncation error (right)")
ax.legend()
plt.show()

best64 = hs[int(np.argmin(err64))]
print(f"best float64 step here: h = {best64:.1e}, error {min(err64):.1e}")
assert 1e-8 < best64 < 1e-3

# %% [markdown]
# ### The same gradient from tinymlp
#
# tinymlp records the operations on tensors that require a gradient and runs the chain rule
# backwards for us (lesson 2 opens the engine). The gradient it puts into `.grad` must be
# the one we derived by hand.

# %%
wt = tinymlp.tensor(w, requires_grad=True, dtype="float64")
bt = tinymlp.tensor(b, requires_grad=True, dtype="float64")
xt = tinymlp.tensor(x[None, :], dtype="float64")   # a batch of one input: shape (1, 3)

pt = (xt @ wt + bt).tanh()                          # shape (1,): one output per input
L = (0.5 * (pt - t) ** 2).sum()
L.backward()
print("tinymlp dL/dw", wt.grad, "  dL/db", bt.grad)
assert np.allclose(wt.grad, grad_w) and np.isclose(bt.grad, grad_b)

# %% [markdown]
# ## 3. Activation functions and their derivatives
#
# | name | $f(x)$ | $f'(x)$ |
# |---|---|---|
# | identity | $x$ | $1$ |
# | binary step | $0$ if $x < 0$, else $1$ | $0$ for $x \ne 0$; undefined at $0$ |
# | logistic (soft step) | $\sigma(x) = \dfrac{1}{1 + e^{-x}}$ | $\sigma(x)\,(1 - \sigma(x))$ |
# | tanh | $\tanh x = \dfrac{2}{1 + e^{-2x}} - 1$ | $1 - \tanh^2 x$ |
# | arctan | $\tan^{-1} x$ | $\dfrac{1}{1 + x^2}$ |
# | ReLU | $0$ if $x < 0$, else $x$ | $0$ if $x < 0$, else $1$ |
# | PReLU | $\alpha x$ if $x < 0$, else $x$ | $\alpha$ if $x < 0$, else $1$ |
# | ELU | $\alpha (e^x - 1)$ if $x < 0$, else $x$ | $f(x) + \alpha$ if $x < 0$, else $1$ |
# | softplus | $\ln(1 + e^x)$ | $\sigma(x)$ |
#
# Several derivatives are written with the function's own value: $\sigma' = \sigma(1-\sigma)$,
# $\tanh' = 1 - \tanh^2$, ELU's $f + \alpha$. That is what backward passes exploit: the
# forward pass already computed $f(x)$, so the derivative costs one or two multiplications.
# (Derive two of them: $\sigma' = e^{-x}/(1+e^{-x})^2 = \sigma\cdot(1-\sigma)$ since
# $1 - \sigma = e^{-x}/(1+e^{-x})$; for ELU with $x < 0$, $f' = \alpha e^x = \alpha(e^x - 1) + \alpha$.)
#
# In PReLU, $\alpha$ is learned (a parameter per channel); with a fixed small $\alpha$ it
# is the "leaky" ReLU. Below $\alpha = 0.25$ for PReLU and $\alpha = 1$ for ELU.

# %%
ALPHA_PRELU, ALPHA_ELU = 0.25, 1.0


def sigmoid(x):
    return 0.5 * (1 + np.tanh(0.5 * x))   # = 1/(1+exp(-x)), without overflow for large |x|


ACTIVATIONS = {
    # name: (f, f')
    "identity": (lambda x: x, lambda x: np.ones_like(x)),
    "binary step": (lambda x: np.where(x < 0, 0.0, 1.0), lambda x: np.zeros_like(x)),
    "logistic": (sigmoid, lambda x: sigmoid(x) * (1 - sigmoid(x))),
    "tanh": (np.tanh, lambda x: 1 - np.tanh(x) ** 2),
    "arctan": (np.arctan, lambda x: 1 / (1 + x * x)),
    "ReLU": (lambda x: np.where(x < 0, 0.0, x), lambda x: np.where(x < 0, 0.0, 1.0)),
    "PReLU": (lambda x: np.where(x < 0, ALPHA_PRELU * x, x), lambda x: np.where(x < 0, ALPHA_PRELU, 1.0)),
    "ELU": (lambda x: np.where(x < 0, ALPHA_ELU * np.expm1(np.minimum(x, 0)), x),
            lambda x: np.where(x < 0, ALPHA_ELU * np.expm1(np.minimum(x, 0)) + ALPHA_ELU, 1.0)),
    "softplus": (lambda x: np.logaddexp(0, x), sigmoid),
}


def central_difference(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


xs = np.linspace(-4, 4, 800)   # an even number of points: 0 is not on the grid
for name, (f, df) in ACTIVATIONS.items():
    if name == "binary step":
        continue                # see below
    err = np.max(np.abs(central_difference(f, xs) - df(xs)))
    print(f"{name:10s} max |finite difference - f'| = {err:.1e}")
    assert err < 1e-7, name

# %% [markdown]
# **Why the binary step is left out.** Its derivative is $0$ wherever it exists, and at
# $x = 0$ it does not exist: the function jumps. A finite difference that straddles the
# jump measures $1/(2h)$, which grows without bound as $h \to 0$ (the derivative is a
# Dirac spike, not a number). Away from $0$ the check would pass trivially, and that is the
# real problem: a gradient that is zero almost everywhere tells gradient descent nothing
# about which way to move the weights. The logistic function is the step made smooth
# (hence "soft step") precisely so that it has a useful derivative everywhere.
#
# ReLU and PReLU have a kink at $0$: their one-sided slopes differ, and the central
# difference returns their average. Frameworks simply pick a value there: the table puts
# $x = 0$ on the right-hand branch, tinymlp (like PyTorch) uses $0$ for ReLU at $0$. Either is
# fine for training; the chance of a pre-activation landing exactly on $0$ is small.

# %%
step, _ = ACTIVATIONS["binary step"]
relu, _ = ACTIVATIONS["ReLU"]
for h in (1e-2, 1e-4, 1e-6):
    print(f"h = {h:.0e}:  step slope at 0 = {central_difference(step, 0.0, h):10.1f}   "
          f"ReLU slope at 0 = {central_difference(relu, 0.0, h):.3f}")
assert central_difference(step, 0.0, 1e-6) > 1e5            # blows up like 1/(2h)
assert np.isclose(central_difference(relu, 0.0), 0.5)        # mean of the slopes 0 and 1

# %%
fig, axes = plt.subplots(3, 3, figsize=(11, 8), sharex=True)
dots = xs[::40]
for ax, (name, (f, df)) in zip(axes.flat, ACTIVATIONS.items()):
    ax.axhline(0, color="0.85", lw=0.8)
    ax.axvline(0, color="0.85", lw=0.8)
    ax.plot(xs, f(xs), lw=2, label="f(x)")
    ax.plot(xs, df(xs), "--", lw=2, label="f'(x)")
    if name != "binary step":
        ax.plot(dots, central_difference(f, dots), "k.", ms=4, label="finite difference")
    ax.set_title(name)
    ax.set_ylim(-1.6, 2.6)
axes[0, 0].legend(loc="upper left", fontsize=8)
fig.suptitle("Activation functions (solid), their derivatives (dashed), finite differences (dots)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### The library's backward passes agree with the table
#
# tinymlp has the activations a network needs as ops: `tinymlp.tanh`, `tinymlp.sigmoid`,
# `tinymlp.relu` (also `x.tanh()` and friends on a tensor). For an elementwise $f$, the
# gradient of $\sum_i f(x_i)$ with respect to $x$ is $f'(x_i)$ at every point, so one
# backward pass gives the whole derivative curve.

# %%
for name, op in [("tanh", tinymlp.tanh), ("logistic", tinymlp.sigmoid), ("ReLU", tinymlp.relu)]:
    xt = tinymlp.tensor(xs, requires_grad=True, dtype="float64")
    op(xt).sum().backward()
    _, df = ACTIVATIONS[name]
    assert np.allclose(xt.grad, df(xs), atol=1e-12), name
    print(f"tinymlp's {name} backward matches f' on {xs.size} points")

# %% [markdown]
# ## 4. Gradient descent on one neuron
#
# With the gradient in hand, learning is the update
#
# $$w \leftarrow w - \eta\,\frac{\partial \mathcal L}{\partial w}, \qquad
#   b \leftarrow b - \eta\,\frac{\partial \mathcal L}{\partial b},$$
#
# with a learning rate $\eta$. We fit a logistic neuron $p = \sigma(w \cdot x + b)$ to two
# clouds of 2-D points (targets 0 and 1) with the mean squared loss over the $N$ points,
# $\mathcal L = \frac{1}{2N}\sum_n (p_n - t_n)^2$, whose gradient is the mean of the
# per-point gradients above: $\partial\mathcal L/\partial w = \frac1N \sum_n \delta_n x_n$
# with $\delta_n = (p_n - t_n)\,p_n(1 - p_n)$. In matrix form, $X^\top\delta / N$.

# %%
n = 200
X = np.concatenate([rng.normal([-1.0, -0.5], 0.6, size=(n // 2, 2)),
                    rng.normal([1.0, 0.7], 0.6, size=(n // 2, 2))])
T = np.repeat([0.0, 1.0], n // 2)

w, b, lr = np.zeros(2), 0.0, 2.0
losses = []
for step in range(300):
    P = sigmoid(X @ w + b)
    losses.append(0.5 * np.mean((P - T) ** 2))
    delta = (P - T) * P * (1 - P)        # dL/dz for every point
    w -= lr * (X.T @ delta) / n
    b -= lr * delta.mean()

accuracy = np.mean((sigmoid(X @ w + b) > 0.5) == T)
print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, accuracy {accuracy:.1%}")
assert losses[-1] < 0.5 * losses[0] and accuracy > 0.9

# %%
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
ax0.plot(losses)
ax0.set_xlabel("step")
ax0.set_ylabel("loss")
ax0.set_title("Training loss")
ax1.scatter(*X[T == 0].T, s=10, label="t = 0")
ax1.scatter(*X[T == 1].T, s=10, label="t = 1")
line_x = np.array([-3.0, 3.0])
ax1.plot(line_x, -(w[0] * line_x + b) / w[1], "k", label="w·x + b = 0")
ax1.set_ylim(-3, 3)
ax1.set_title("The neuron's decision line")
ax1.legend()
plt.show()

# %% [markdown]
# The hand-written update loop and tinymlp compute the same gradient for the whole batch:

# %%
wt = tinymlp.tensor(w, requires_grad=True, dtype="float64")
bt = tinymlp.tensor(b, requires_grad=True, dtype="float64")
Xt = tinymlp.tensor(X, dtype="float64")
Pt = (Xt @ wt + bt).sigmoid()
L = 0.5 * ((Pt - T) ** 2).mean()
L.backward()
P = sigmoid(X @ w + b)
delta = (P - T) * P * (1 - P)
assert np.allclose(wt.grad, X.T @ delta / n) and np.isclose(bt.grad, delta.mean())
print("hand-derived batch gradient == tinymlp's:", wt.grad, bt.grad)

# %% [markdown]
# ## What to remember
#
# - The gradient of a weight is (error signal at the node) $\times$ (the input on that weight):
#   $\partial\mathcal L/\partial w_j = \delta\,x_j$ with $\delta = (p - t)\operatorname{act}'(z)$.
# - Central differences check any derivative; in float64 with $h \approx 10^{-6}$ they agree
#   with the exact value to about $10^{-9}$, in float32 they are too noisy to trust.
# - An activation must have a useful derivative: the step function has none, its smooth
#   versions (logistic, tanh) and ReLU-like functions do.
#
# **Next:** lesson 2 lets tinymlp's autograd engine do the bookkeeping for whole networks.

"""The checks of the course's 27 exercises, one short function each.

Every check compares the answer with a reference written here in plain NumPy (never with the
answer itself, never with the library op the exercise asks for) and, for a backward pass,
runs ``tinymlp.gradcheck`` on it in float64 with a random upstream gradient, then compares
its gradients with the exact ones: a gradient estimated numerically agrees with them to about
1e-10, a derived formula to about 1e-15 (``_exact``). The inputs are chosen so that the usual
slips show (non-square weights, gains that are not 1, a batch larger than one), and each
check draws them from its ``case``: the public case (the exercise's seed, what a notebook
runs) or a hidden one (the grader's seed and other shapes). An answer gets copies of the
inputs, and every reference is computed before the answer runs, so that an answer cannot
change what it is compared with.
"""

from __future__ import annotations

import math

import numpy as np

from .. import GradcheckError, gradcheck, tensor
from .registry import Case, Wrong, exercise

__all__ = []

EXACT = 1e-12
"""Largest relative error (norm of the difference / norm of the exact gradient) allowed for a
gradient derived by hand. Measured: the worked answers agree with the references here to 2e-16
or better over 40 hidden cases; central differences reach 1.4e-11 at their best step (GELU,
h = 1e-5) and 1e-10 at the usual h = 1e-6. A 4-point difference at its best step (2e-13) is
below it: that one is left to the guard, which refuses the library's numerical helpers."""


# ------------------------------------------------------------------------------ helpers
def _t(a, grad=True):
    return tensor(np.asarray(a, dtype=np.float64), requires_grad=grad, dtype="float64")


def _array(got, name):
    """The answer's value as a float64 array (a Tensor, an array, a number)."""
    if hasattr(got, "numpy"):
        got = got.numpy()
    try:
        return np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise Wrong(f"{name}: expected numbers, got a {type(got).__name__}") from err


def _close(name, got, want, rtol=1e-6, atol=1e-8):
    got, want = _array(got, name), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Wrong(f"{name}: shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.abs(got - want)
        diff = np.where(np.isnan(diff), np.inf, diff)
        i = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise Wrong(f"{name}: differs from the reference; largest difference {diff[i]:.3g} at index "
                    f"{tuple(int(k) for k in i)} (yours {got[i]:.6g}, expected {want[i]:.6g})")


def _exact(name, got, want):
    """The answer's gradient must be the exact one, not a numerical estimate of it."""
    got, want = _array(got, name), np.asarray(want, dtype=np.float64)
    _close(name, got, want, rtol=1e-4, atol=1e-6)  # a plain error is said plainly first
    scale = np.linalg.norm(want)
    err = float(np.linalg.norm(got - want) / (scale if scale > 0 else 1.0))
    if err > EXACT:
        raise Wrong(f"{name} agrees with the exact gradient only to {err:.1e} (relative): a formula derived by "
                    "hand agrees to about 1e-15, a finite difference to 1e-11 at best, so this gradient is "
                    "estimated numerically; derive it and compute it from the formula")


def _int(name, got):
    """An integer answer, refusing objects that only pretend to compare equal."""
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise Wrong(f"{name} returned a {type(got).__name__}; return an int")
    return int(got)


def _grads(fn, inputs, g):
    """The gradients backward gives every input for the upstream gradient g."""
    for t in inputs:
        t.grad = None
    y = fn(*inputs)
    y.backward(tensor(np.asarray(g, dtype=np.float64), dtype="float64"))
    return [t.grad for t in inputs]


class Captured(Exception):
    """Raised by ``_gc`` in capture mode: the (fn, inputs) of a check's k-th gradcheck."""

    def __init__(self, fn, inputs):
        super().__init__("captured")
        self.fn, self.inputs = fn, inputs


def _gc(fn, inputs, case: Case):
    """tinymlp.gradcheck in float64; a failing report's reproduce line runs in the notebook."""
    k = case.gradchecks
    case.gradchecks += 1
    if case.capture == k:
        raise Captured(fn, inputs)
    if hasattr(fn, "__code__"):
        fn.__qualname__ = fn.__name__
    try:
        return gradcheck(fn, inputs)
    except GradcheckError as err:
        if case.call:
            extra = f", k={k}" if k else ""
            # the import makes the line run in a notebook that only imported ``check``
            err.report.settings.call = (f"import tinymlp.lessons; "
                                        f"tinymlp.gradcheck(*tinymlp.lessons.case({case.call}{extra}))")
            err.args = (err.report.summary(),)
        raise


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


C0, C1 = math.sqrt(2 / math.pi), 0.044715


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(C0 * (x + C1 * x**3)))


def _gelu_grad(x):
    t = np.tanh(C0 * (x + C1 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x)


def _normalize(x, eps):
    mu = x.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mu) * r, r


def _layer_norm(x, gamma, beta, eps):
    return gamma * _normalize(x, eps)[0] + beta


def _normalize_grad(g, x_hat, r):
    """dL/dx of x_hat = normalize(x) for dL/dx_hat = g (over the last axis)."""
    return r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))


def _rows(a):
    return a.reshape(-1, a.shape[-1])


# ------------------------------------------------------------------------------ lesson 1
@exercise("01.1", "a logistic neuron's gradient", answer="neuron_gradient", seed=1,
          section="lesson 1, section 2 (one neuron, by the chain rule)",
          reference="tinymlp/ops/elementwise.py (Sigmoid.backward: s (1 - s))")
def _neuron(neuron_gradient, case):
    rng = case.rng
    n = case.pick(4, 7)
    for _ in range(3):
        x, w, b, t = rng.normal(size=n), rng.normal(size=n), rng.normal(), rng.normal() * 0.5
        y = 1 / (1 + np.exp(-(w @ x + b)))
        dz = (y - t) * y * (1 - y)
        dw, db = neuron_gradient(w.copy(), b, x.copy(), t)
        _exact("dL/dw", dw, dz * x)
        _exact("dL/db", np.asarray(_array(db, "dL/db")).reshape(()), dz)


@exercise("01.2", "central difference", answer="my_central_difference",
          section="lesson 1, section 3 (finite differences and their Taylor error)",
          reference="tinymlp/gradcheck/method.py (Evaluator.central_differences)")
def _central(central_difference, case):
    # f(x) = x^3: the central difference is exactly 3x^2 + h^2 (the h^2 f'''/6 term), a one-sided
    # difference 3x^2 + 3xh + h^2
    points = case.pick([(0.7, 1e-2), (-1.3, 1e-3), (2.0, 0.1)],
                       [(float(case.rng.uniform(-2, 2)), h) for h in (3e-2, 2e-3, 0.2)])
    for x, h in points:
        got = central_difference(lambda v: v**3, x, h)
        _close(f"central_difference(x**3, {x:.4g}, h={h})", got, 3 * x * x + h * h, rtol=1e-9, atol=1e-12)
    xs = case.pick(np.array([0.0, 1.0, 2.0]), case.rng.uniform(-3, 3, size=5))
    want = np.cos(xs)
    got = central_difference(np.sin, xs.copy(), 1e-5)
    _close(f"central_difference(sin, {np.round(xs, 3).tolist()})", got, want, rtol=1e-8)


# ------------------------------------------------------------------------------ lesson 2
class _Node:
    """A node of the mini engine of lesson 2: data, grad, parents, local_grads."""

    def __init__(self, data, parents=(), local_grads=(), name=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.local_grads, self.name = tuple(parents), tuple(local_grads), name

    def __repr__(self):
        return f"Value({self.name or self.data})"


def _mul(a, b, name=""):
    return _Node(a.data * b.data, (a, b), (b.data, a.data), name)


def _add(a, b, name=""):
    return _Node(a.data + b.data, (a, b), (1.0, 1.0), name)


def _tanh(a, name=""):
    t = math.tanh(a.data)
    return _Node(t, (a,), (1 - t * t,), name)


def _graphs(case):
    """(root, leaves, expected gradients of the leaves) for a few graphs with shared nodes."""
    out = []
    xv, yv = case.pick((0.5, -1.5), tuple(case.rng.uniform(-1.5, 1.5, size=2)))
    x, y = _Node(xv, name="x"), _Node(yv, name="y")
    u = _mul(x, y, "u")
    v = _tanh(u, "v")
    w = _mul(u, _Node(3.0, name="c"), "w")
    root = _add(v, w, "root")                        # a diamond: u feeds v and w
    du = (1 - math.tanh(xv * yv) ** 2) + 3
    out.append((root, (x, y), (du * yv, du * xv)))
    av = case.pick(1.2, float(case.rng.uniform(-2, 2)))
    a = _Node(av, name="a")
    sq = _mul(a, a, "a*a")                            # a used twice by one node
    root = _add(sq, a, "a*a+a")
    out.append((root, (a,), (2 * av + 1,)))
    zv = case.pick(0.3, float(case.rng.uniform(-1, 1)))
    z = _Node(zv, name="z")                           # a chain of diamonds
    h, n = z, case.pick(12, 9)
    for k in range(n):
        h = _add(_tanh(h, f"t{k}"), _mul(h, _Node(0.5), f"m{k}"), f"s{k}")
    g, val = 1.0, zv
    for _ in range(n):
        g *= (1 - math.tanh(val) ** 2) + 0.5
        val = math.tanh(val) + 0.5 * val
    out.append((h, (z,), (g,)))
    return out


@exercise("02.1", "topological order", answer="topological_order",
          section="lesson 2, section 3 (reverse topological order)",
          reference="tinymlp/autograd.py (_reverse_topological)")
def _topo(topological_order, case):
    for root, _, _ in _graphs(case):
        reachable, stack = {}, [root]
        while stack:
            n = stack.pop()
            if id(n) not in reachable:
                reachable[id(n)] = n
                stack.extend(n.parents)
        parents = {k: n.parents for k, n in reachable.items()}
        order = list(topological_order(root))
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
          section="lesson 2, section 3 (gradient accumulation)",
          reference="tinymlp/autograd.py (backward)")
def _backward(backward, case):
    for root, leaves, expected in _graphs(case):
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
          section="lesson 2, section 5 (broadcasting and its gradient)",
          reference="tinymlp/autograd.py (unbroadcast)", forbidden=("tinymlp.autograd.unbroadcast",))
def _unbroadcast(unbroadcast, case):
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
        got = unbroadcast(g.copy(), shape)
        _close(f"unbroadcast(grad of shape {gshape}, {shape})", got, want)


# ------------------------------------------------------------------------------ lesson 3
@exercise("03.1", "Linear backward", answer="MyLinear", seed=3,
          section="lesson 3, section 2 (Linear as a Function)",
          reference="tinymlp/ops/linear.py (Linear.backward)",
          forbidden=("tinymlp.ops.linear.Linear", "tinymlp.ops.matmul.MatMul"))
def _linear(cls, case):
    rng = case.rng
    lead = case.pick((2, 5), (3, 2))
    for w_shape in case.pick([(4, 4), (4, 3)], [(5, 5), (5, 2)]):
        x, w, b = _t(rng.normal(size=lead + w_shape[:1])), _t(rng.normal(size=w_shape)), _t(rng.normal(size=w_shape[1]))

        def linear(x, weight, bias):
            return cls.apply(x, weight, bias)

        X, Wn, bn = x.numpy().copy(), w.numpy().copy(), b.numpy().copy()
        _close("forward", linear(x, w, b), X @ Wn + bn)
        _gc(linear, (x, w, b), case)
        g = rng.normal(size=lead + w_shape[1:])
        dx, dw, db = _grads(linear, (_t(X), _t(Wn), _t(bn)), g)
        _exact("dL/dx", dx, g @ Wn.T)
        _exact("dL/dweight", dw, _rows(X).T @ _rows(g))
        _exact("dL/dbias", db, _rows(g).sum(axis=0))


@exercise("03.2", "GELU backward", answer="MyGELU", seed=4,
          section="lesson 3, section 3 (GELU as a Function)",
          reference="tinymlp/ops/activation.py (GELU.backward)",
          forbidden=("tinymlp.ops.activation.GELU",))
def _gelu_ex(cls, case):
    x = _t(case.rng.normal(size=case.pick((4, 6), (3, 7))) * 2)

    def gelu(x):
        return cls.apply(x)

    X = x.numpy().copy()
    _close("forward", gelu(x), _gelu(X))
    _gc(gelu, (x,), case)
    g = case.rng.normal(size=x.shape)
    _exact("dL/dx", _grads(gelu, (_t(X),), g)[0], g * _gelu_grad(X))


# ------------------------------------------------------------------------------ lesson 4
@exercise("04.1", "LayerNorm backward", answer="MyLayerNorm", seed=5,
          section="lesson 4, section 3 (a Function with that backward)",
          reference="tinymlp/ops/norm.py (LayerNorm.backward, normalize_backward)",
          forbidden=("tinymlp.ops.norm.LayerNorm", "tinymlp.ops.norm.normalize_backward"))
def _layernorm(cls, case):
    rng = case.rng
    shape = case.pick((2, 3, 8), (3, 2, 5))
    x = _t(rng.normal(size=shape) * 2 + 1)
    gamma, beta = _t(rng.normal(size=shape[-1])), _t(rng.normal(size=shape[-1]))

    def layer_norm(x, gamma, beta):
        return cls.apply(x, gamma, beta)

    X, G, Bt = (t.numpy().copy() for t in (x, gamma, beta))
    _close("forward", layer_norm(x, gamma, beta), _layer_norm(X, G, Bt, 1e-5))
    _gc(layer_norm, (x, gamma, beta), case)
    g = rng.normal(size=shape)
    x_hat, r = _normalize(X, 1e-5)
    dx, dgamma, dbeta = _grads(layer_norm, (_t(X), _t(G), _t(Bt)), g)
    _exact("dL/dx", dx, _normalize_grad(g * G, x_hat, r))
    _exact("dL/dgamma", dgamma, _rows(g * x_hat).sum(axis=0))
    _exact("dL/dbeta", dbeta, _rows(g).sum(axis=0))


@exercise("04.2", "LayerNorm Jacobian", answer="layer_norm_jacobian", seed=6,
          section="lesson 4, section 2 (the backward step by step: step 4)",
          reference="tinymlp/ops/norm.py (normalize_backward: J g without J)",
          forbidden=("tinymlp.ops.norm.normalize_backward",))
def _ln_jacobian(layer_norm_jacobian, case):
    for D in case.pick((5, 8), (6, 3)):
        row = case.rng.normal(loc=1.0, scale=2.0, size=D)
        x_hat, r = _normalize(row, 1e-5)
        want = r * (np.eye(D) - 1 / D - np.outer(x_hat, x_hat) / D)
        _exact(f"J for a row of {D}", layer_norm_jacobian(row.copy(), 1e-5), want)


# ------------------------------------------------------------------------------ lesson 5
@exercise("05.1", "softmax backward", answer="MySoftmax", seed=7,
          section="lesson 5, section 1 (the softmax Jacobian)",
          reference="tinymlp/ops/attention.py (Softmax.backward)",
          forbidden=("tinymlp.ops.attention.Softmax", "tinymlp.ops.attention.LogSoftmax"))
def _softmax_ex(cls, case):
    x = _t(case.rng.normal(size=case.pick((3, 6), (4, 5))) * 2)

    def softmax(x):
        return cls.apply(x)

    X = x.numpy().copy()
    _close("forward", softmax(x), _softmax(X))
    _gc(softmax, (x,), case)
    g, p = case.rng.normal(size=x.shape), _softmax(X)
    _exact("dL/dx", _grads(softmax, (_t(X),), g)[0], p * (g - (g * p).sum(axis=-1, keepdims=True)))


@exercise("05.2", "cross-entropy backward", answer="MyCrossEntropy", seed=9,
          section="lesson 5, section 2 (cross-entropy from log-sum-exp)",
          reference="tinymlp/ops/loss.py (CrossEntropy.backward)",
          forbidden=("tinymlp.ops.loss.CrossEntropy", "tinymlp.ops.attention.Softmax",
                     "tinymlp.ops.attention.LogSoftmax"))
def _cross_entropy(cls, case):
    N, V = case.pick((6, 5), (7, 4))
    logits = _t(case.rng.normal(size=(N, V)) * 2)
    labels = case.rng.integers(0, V, size=N)

    def cross_entropy(logits):
        return cls.apply(logits, labels.copy())

    x = logits.numpy().copy()
    want = -np.mean(np.log(_softmax(x))[np.arange(N), labels])
    _close("forward (the mean over the batch)", cross_entropy(logits), want)
    _gc(cross_entropy, (logits,), case)
    g = float(case.rng.normal())
    d = _softmax(x)
    d[np.arange(N), labels] -= 1
    _exact("dL/dlogits", _grads(cross_entropy, (_t(x),), g)[0], g * d / N)


@exercise("05.3", "attention backward (dQ, dK, dV)", answer="MyAttention", seed=8,
          section="lesson 5, section 3 (attention and its backward)",
          reference="tinymlp/ops/attention.py (Attention.backward)",
          forbidden=("tinymlp.ops.attention.Attention", "tinymlp.ops.attention.Softmax"))
def _attention_ex(cls, case):
    rng = case.rng
    B, T, S, d, dv = case.pick((2, 4, 6, 5, 3), (3, 3, 5, 4, 2))
    q, k, v = _t(rng.normal(size=(B, T, d))), _t(rng.normal(size=(B, S, d))), _t(rng.normal(size=(B, S, dv)))

    def attention(q, k, v):
        return cls.apply(q, k, v)

    scale = 1 / math.sqrt(d)
    Q, K, Vn = (t.numpy().copy() for t in (q, k, v))
    p = _softmax(Q @ K.transpose(0, 2, 1) * scale)
    _close("forward", attention(q, k, v), p @ Vn)
    _gc(attention, (q, k, v), case)
    g = rng.normal(size=(B, T, dv))
    dp = g @ Vn.transpose(0, 2, 1)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq, dk, dvv = _grads(attention, (_t(Q), _t(K), _t(Vn)), g)
    _exact("dL/dq", dq, ds @ K * scale)
    _exact("dL/dk", dk, ds.transpose(0, 2, 1) @ Q * scale)
    _exact("dL/dv", dvv, p.transpose(0, 2, 1) @ g)


@exercise("05.4", "the rotation that shifts a position", answer="rotation",
          section="lesson 5, section 5 (sinusoidal positions)",
          reference="tinymlp/models/vit.py (sinusoidal_embedding)")
def _rotation(rotation, case):
    d = case.pick(16, 12)
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    t = np.arange(40)[:, None]
    pe = np.zeros((40, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(t * omega), np.cos(t * omega)
    for phi in case.pick((1, 3, 11), tuple(int(p) for p in case.rng.integers(1, 20, size=3))):
        M = _array(rotation(phi, omega.copy()), f"rotation({phi}, omega)")
        if M.shape != (d, d):
            raise Wrong(f"rotation({phi}, omega) has shape {M.shape}, expected {(d, d)}")
        _close(f"M({phi}) p_t (every t)", pe[:-phi] @ M.T, pe[phi:], atol=1e-9)


# ------------------------------------------------------------------------------ lesson 6
@exercise("06.2", "token-mixing block from Linear layers", answer="TokenMixing", seed=10,
          section="lesson 6, section 2 (token mixing, from Linear layers)",
          reference="tinymlp/models/mixer.py (MixerBlock)",
          forbidden=("tinymlp.models.mixer.MixerBlock", "tinymlp.models.mixer.MLP"))
def _token_mixing(cls, case):
    rng = case.rng
    S, C, H = case.pick((6, 5, 4), (4, 7, 3))
    block = cls(S, C, H, rng=0)
    for p in block.parameters():                      # away from the initial ones and zeros
        p.data[...] = rng.normal(size=p.shape) * 0.7
    x = rng.normal(size=(2, S, C))
    names = dict(block.named_parameters())
    get = {k: v.numpy().astype(np.float64) for k, v in names.items()}
    try:
        h = _layer_norm(x, get["norm.weight"], get["norm.bias"], 1e-6)        # (B, S, C)
        hid = _gelu(h.transpose(0, 2, 1) @ get["fc1.weight"] + get["fc1.bias"])   # (B, C, H)
        want = x + (hid @ get["fc2.weight"] + get["fc2.bias"]).transpose(0, 2, 1)
    except (KeyError, ValueError) as err:
        raise Wrong(f"expected parameters norm.weight/bias, fc1.weight/bias, fc2.weight/bias; got "
                    f"{sorted((k, tuple(v.shape)) for k, v in names.items())}") from err
    for p in block.parameters():
        p.data = p.data.astype(np.float64)
    _close("forward", block(tensor(x.copy(), dtype="float64")), want, rtol=1e-6, atol=1e-8)
    _gc(block, (_t(x),), case)


@exercise("06.1", "a Mixer block's parameter count", answer="mixer_block_parameters",
          section="lesson 6, section 1 (token mixing vs channel mixing)",
          reference="tinymlp/models/mixer.py (MixerBlock)")
def _mixer_params(mixer_block_parameters, case):
    sizes = case.pick([(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)],
                      [tuple(int(n) for n in case.rng.integers(2, 300, size=4)) for _ in range(3)])
    for S, C, DS, DC in sizes:
        want = 2 * (2 * C) + (S * DS + DS + DS * S + S) + (C * DC + DC + DC * C + C)
        got = _int(f"mixer_block_parameters({S}, {C}, {DS}, {DC})", mixer_block_parameters(S, C, DS, DC))
        if got != want:
            raise Wrong(f"mixer_block_parameters({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(two LayerNorms with a weight and a bias each; two MLPs, each two Linears with biases)")


@exercise("06.3", "a Mixer block's floating-point operations", answer="mixer_block_flops",
          section="lesson 6, section 3 (linear vs quadratic cost)",
          reference="tinymlp/models/mixer.py (MixerBlock)")
def _mixer_flops(mixer_block_flops, case):
    sizes = case.pick([(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)],
                      [tuple(int(n) for n in case.rng.integers(2, 300, size=4)) for _ in range(3)])
    for S, C, DS, DC in sizes:
        want = 4 * S * DS * C + 4 * S * C * DC
        got = _int(f"mixer_block_flops({S}, {C}, {DS}, {DC})", mixer_block_flops(S, C, DS, DC))
        if got != want:
            raise Wrong(f"mixer_block_flops({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(count the four matrix products, 2 operations per multiply-add)")


# ------------------------------------------------------------------------------ lesson 7
def _sgu_reference(z, W, b, gamma, beta, eps):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n = _layer_norm(z2, gamma, beta, eps)
    return z1 * (np.einsum("ij,bjc->bic", W, n) + b[:, None])


def _sgu_grads(z, W, b, gamma, beta, eps, g):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n_hat, r = _normalize(z2, eps)
    n = gamma * n_hat + beta
    f = np.einsum("ij,bjc->bic", W, n) + b[:, None]
    df = g * z1
    dn = np.einsum("ij,bic->bjc", W, df)
    dz2 = _normalize_grad(dn * gamma, n_hat, r)
    return (np.concatenate([g * f, dz2], axis=-1), np.einsum("bic,bjc->ij", df, n), df.sum(axis=(0, 2)),
            (dn * n_hat).sum(axis=(0, 1)), dn.sum(axis=(0, 1)))


@exercise("07.1", "SGU backward (dZ1, dZ2, dW, db)", answer="MySGU", seed=11,
          section="lesson 7, section 1 (the spatial gating unit and its backward)",
          reference="tinymlp/ops/gating.py (SpatialGating.backward)",
          forbidden=("tinymlp.ops.gating.SpatialGating", "tinymlp.ops.norm.LayerNorm",
                     "tinymlp.ops.norm.normalize_backward"))
def _sgu(cls, case):
    rng = case.rng
    B, S, e = case.pick((2, 5, 3), (3, 4, 4))
    z = _t(rng.normal(size=(B, S, 2 * e)))
    W, b = _t(rng.normal(size=(S, S)) * 0.5), _t(1 + rng.normal(size=S) * 0.5)
    gamma, beta = _t(1 + rng.normal(size=e) * 0.3), _t(rng.normal(size=e) * 0.3)

    def sgu(z, weight, bias, gamma, beta):
        return cls.apply(z, weight, bias, gamma, beta)

    arrays = [t.numpy().copy() for t in (z, W, b, gamma, beta)]
    _close("forward", sgu(z, W, b, gamma, beta), _sgu_reference(*arrays, 1e-5))
    _gc(sgu, (z, W, b, gamma, beta), case)
    g = rng.normal(size=(B, S, e))
    got = _grads(sgu, tuple(_t(a) for a in arrays), g)
    for name, mine, want in zip(("z", "weight", "bias", "gamma", "beta"), got, _sgu_grads(*arrays, 1e-5, g)):
        _exact(f"dL/d{name}", mine, want)


def _toeplitz_reference(w, S):
    i, j = np.indices((S, S))
    return w[i - j + S - 1]


@exercise("07.2", "Toeplitz matrix from its 2S - 1 numbers", answer="toeplitz", seed=12,
          section="lesson 7, section 4 (Toeplitz spatial weights)",
          reference="tinymlp/ops/gating.py (toeplitz_1d)",
          forbidden=("tinymlp.ops.gating.toeplitz_1d", "tinymlp.ops.gating.Toeplitz1d"))
def _toeplitz(toeplitz, case):
    for S in case.pick((1, 4, 7), (2, 5, 6)):
        w = case.rng.normal(size=2 * S - 1)
        want = _toeplitz_reference(w, S)
        _close(f"toeplitz(w, S={S})", toeplitz(w.copy(), S), want)


@exercise("07.3", "Toeplitz backward (diagonal sums)", answer="toeplitz_backward", seed=13,
          section="lesson 7, section 4 (the Toeplitz backward)",
          reference="tinymlp/ops/gating.py (Toeplitz1d.backward)",
          forbidden=("tinymlp.ops.gating.Toeplitz1d",))
def _toeplitz_back(toeplitz_backward, case):
    from .. import Function

    rng = case.rng
    for S in case.pick((1, 3, 6), (2, 4, 5)):
        g = rng.normal(size=(S, S))
        want = np.zeros(2 * S - 1)
        i, j = np.indices((S, S))
        np.add.at(want, (i - j + S - 1).ravel(), g.ravel())
        _exact(f"toeplitz_backward(dW of shape {(S, S)})", toeplitz_backward(g.copy()), want)

    class Toeplitz(Function):
        @staticmethod
        def forward(ctx, w, size):
            return _toeplitz_reference(w, size)

        @staticmethod
        def backward(ctx, grad):
            return toeplitz_backward(grad)

    size = case.pick(4, 3)

    def toeplitz(w):
        return Toeplitz.apply(w, size=size)

    _gc(toeplitz, (_t(rng.normal(size=2 * size - 1)),), case)


# ------------------------------------------------------------------------------ lesson 8
@exercise("08.2", "tiny attention's parameter count", answer="tiny_attention_parameters",
          section="lesson 8, section 4 (what tiny attention costs)",
          reference="tinymlp/nn/attention.py (TinyAttention)")
def _tiny_params(tiny_attention_parameters, case):
    sizes = case.pick([(32, 64, 16), (256, 768, 64), (3, 5, 2)],
                      [tuple(int(n) for n in case.rng.integers(2, 500, size=3)) for _ in range(3)])
    for d_in, d_out, a in sizes:
        want = d_in * 3 * a + a * d_out + d_out
        got = _int(f"tiny_attention_parameters({d_in}, {d_out}, {a})", tiny_attention_parameters(d_in, d_out, a))
        if got != want:
            raise Wrong(f"tiny_attention_parameters({d_in}, {d_out}, {a}) = {got}, expected {want} "
                        "(the projection to q, k, v has no bias; the output projection has one)")


@exercise("08.1", "attention weights from queries and keys", answer="attention_weights", seed=14,
          section="lesson 8, section 3 (the attention weights)",
          reference="tinymlp/ops/attention.py (Attention.forward)",
          forbidden=("tinymlp.ops.attention.Attention",))
def _attention_weights(attention_weights, case):
    B, S, d = case.pick((2, 5, 4), (3, 6, 9))
    q, k = case.rng.normal(size=(B, S, d)), case.rng.normal(size=(B, S, d))
    want = _softmax(q @ k.transpose(0, 2, 1) / math.sqrt(d))
    got = attention_weights(tensor(q.copy(), dtype="float64"), tensor(k.copy(), dtype="float64"))
    _close("A = softmax(Q K^T / sqrt(d))", got, want)


# ------------------------------------------------------------------------------ lesson 10
@exercise("10.1", "RMSNorm backward", answer="RMSNormFunction", seed=15,
          section="lesson 10, sections 2-3 (RMSNorm, derived and written)",
          reference="tinymlp/ops/norm.py (LayerNorm.backward: the same derivation with the mean)",
          forbidden=("tinymlp.ops.norm.normalize_backward",))
def _rmsnorm(cls, case):
    rng = case.rng
    shape = case.pick((3, 4, 6), (2, 3, 5))
    x, w = _t(rng.normal(size=shape)), _t(rng.uniform(0.5, 1.5, shape[-1]))

    def rms_norm(x, weight):
        return cls.apply(x, weight)

    X, Wn = x.numpy().copy(), w.numpy().copy()
    r = 1 / np.sqrt((X ** 2).mean(axis=-1, keepdims=True) + 1e-6)
    x_hat = X * r
    _close("forward", rms_norm(x, w), Wn * x_hat)
    _gc(rms_norm, (x, w), case)
    g = rng.normal(size=shape)
    h = g * Wn
    dx, dw = _grads(rms_norm, (_t(X), _t(Wn)), g)
    _exact("dL/dx", dx, r * (h - x_hat * (h * x_hat).mean(axis=-1, keepdims=True)))
    _exact("dL/dweight", dw, _rows(g * x_hat).sum(axis=0))


@exercise("10.2", "Swish backward", answer="SwishFunction", seed=16,
          section="lesson 10, section 6 (Swish, written and checked)",
          reference="tinymlp/ops/elementwise.py (Sigmoid.backward)",
          forbidden=("tinymlp.ops.elementwise.Sigmoid",))
def _swish(cls, case):
    x = _t(case.rng.normal(size=case.pick((5, 7), (4, 6))) * 3)

    def swish(x):
        return cls.apply(x)

    X = x.numpy().copy()
    s = 1 / (1 + np.exp(-X))
    _close("forward", swish(x), X * s)
    _gc(swish, (x,), case)
    g = case.rng.normal(size=x.shape)
    _exact("dL/dx", _grads(swish, (_t(X),), g)[0], g * (s + X * s * (1 - s)))


@exercise("10.3", "a layer of your own, gradchecked", answer="(my_layer, layer_inputs)",
          section="lesson 10, section 9 (your own layer)",
          reference="tinymlp/gradcheck/method.py (the check itself)")
def _own_layer(answer, case):
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise Wrong("pass a pair (fn, inputs): the function (or Module) and the inputs to check it at")
    fn, inputs = answer
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if not any(getattr(t, "requires_grad", False) for t in inputs) and not hasattr(fn, "parameters"):
        raise Wrong("give at least one input with requires_grad=True (or a Module with parameters)")
    _gc(fn, inputs, case)


# ------------------------------------------------------------------------------ lesson 12
@exercise("12.1", "embedding backward (scatter-add)", answer="MyEmbedding", seed=21,
          section="lesson 12, section 2 (embeddings and the backward of a lookup)",
          reference="tinymlp/ops/embedding.py (Embedding.backward)",
          forbidden=("tinymlp.ops.embedding.Embedding",))
def _embedding(cls, case):
    V, C = case.pick((6, 3), (7, 2))
    E = _t(case.rng.normal(size=(V, C)))
    ids = case.pick(np.array([[1, 4, 4, 0], [4, 2, 1, 1]]),      # repeated ids: the sums must accumulate
                    np.array([[5, 5, 2], [0, 5, 6], [2, 2, 2]]))
    En = E.numpy().copy()
    _close("forward", cls.apply(E, ids.copy()), En[ids])

    def embedding(E):
        return cls.apply(E, ids.copy())

    _gc(embedding, (E,), case)
    g = case.rng.normal(size=ids.shape + (C,))
    want = np.zeros((V, C))
    np.add.at(want, ids, g)
    _exact("dL/dE", _grads(embedding, (_t(En),), g)[0], want)


@exercise("12.2", "mean over the real tokens (masked pooling)", answer="MaskedMean", seed=22,
          section="lesson 12, section 1 (the mean over the real tokens)",
          reference="tinymlp/models/text_gmlp.py (TextGMLP: the mean over the real tokens)")
def _masked_mean(cls, case):
    rng = case.rng
    mask = case.pick(np.array([[1, 1, 1, 0, 0, 0],                 # 3 real tokens of 6
                               [1, 1, 1, 1, 1, 1],                 # no padding
                               [1, 0, 0, 0, 0, 0]], dtype=bool),   # [CLS] alone
                     np.array([[1, 1, 0, 0, 0],
                               [1, 1, 1, 1, 0],
                               [1, 0, 0, 0, 0],
                               [1, 1, 1, 1, 1]], dtype=bool))
    (B, S), C = mask.shape, case.pick(4, 3)
    m, n = mask[:, :, None], mask.sum(axis=1, keepdims=True)         # (B, S, 1), (B, 1)
    X = rng.normal(size=(B, S, C))
    x = _t(X.copy())
    y = cls.apply(x, mask.copy())
    got = _array(y, "forward")
    want = (X * m).sum(axis=1) / n
    if got.shape == want.shape and not np.allclose(got, want):
        if np.allclose(got, (X * m).sum(axis=1) / S):
            raise Wrong(f"forward: divided by S = {S}, the padded length; divide sentence b by "
                        "n[b] = mask[b].sum(), its number of real tokens")
        if np.allclose(got, X.mean(axis=1)):
            raise Wrong("forward: the padding is averaged in; multiply by the mask before summing")
    _close("forward", y, want)

    g = rng.normal(size=(B, C))
    y.backward(tensor(g, dtype="float64"))
    dx = _array(x.grad, "dL/dx")
    want = m * (g / n)[:, None, :]
    if dx.shape == want.shape and not np.allclose(dx, want):
        if np.allclose(dx, m * g[:, None, :] / S):
            raise Wrong(f"backward: divided by S = {S} instead of n[b], the number of real tokens "
                        "(the forward divides by n[b], so the backward must too)")
        if np.allclose(dx, np.broadcast_to(g[:, None, :] / S, dx.shape)):
            raise Wrong(f"backward: that is the gradient of the mean over all S = {S} positions: "
                        "the mask and n[b] are both missing")
        if np.any(dx[~mask] != 0):
            b, s = map(int, np.argwhere((dx != 0).any(axis=-1) & ~mask)[0])
            raise Wrong(f"backward: the mask is missing; the padding position (b={b}, s={s}) gets "
                        f"{np.round(dx[b, s], 4)} but must get exactly 0 (it does not enter y)")

    def masked_mean(x):
        return cls.apply(x, mask.copy())

    _gc(masked_mean, (_t(rng.normal(size=(B, S, C))),), case)  # any other slip: the report says where
    _exact("dL/dx", dx, want)
    if np.any(dx[~mask] != 0):
        raise Wrong(f"backward: padding positions must get exactly 0, largest |dL/dx| there "
                    f"{np.abs(dx[~mask]).max():.3g}")


def _wordpiece_cases(case):
    """(vocabulary, words) pairs: a small trained one, and one made to show the usual slips."""
    from ..data.tokenizer import Tokenizer

    corpus = ["the players were playing a funny film", "an unbelievably long story was told",
              "she plays the piano and he played along", "a story of stories, told and retold"] * 3
    trained = set(Tokenizer.train(corpus, vocab_size=70).vocab[5:])
    words = ["the", "players", "playing", "plays", "replayed", "unbelievably", "stories", "storyteller",
             "a", "t", "s", "pianos", "along", "longest", "told", "retelling", "hello", "played",
             "jazz", "q", "theplayers", "aaaa"]
    made = {"a", "b", "c", "d", "ab", "abc", "##a", "##b", "##c", "##bc", "##cab", "un", "##do", "do", "##ne"}
    made_words = ["a", "d", "ab", "abc", "abd", "abca", "abcab", "undo", "undone", "undoe", "cab", "bad",
                  "dab", "z", "abcabcab", "ba", "bca"]
    if case.hidden:  # other words over the same vocabularies, drawn from their pieces
        rng = case.rng
        letters = sorted({ch for w in trained for ch in w.replace("##", "")})
        words = ["".join(rng.choice(letters, size=int(rng.integers(1, 9)))) for _ in range(25)]
        made_words = ["".join(rng.choice(list("abcdnoeuz"), size=int(rng.integers(1, 8)))) for _ in range(25)]
    return [(trained, words), (made, made_words)]


def _wordpiece_hint(got, want):
    if want == ["[UNK]"] and "[UNK]" in got:
        return "a word with a position where no piece fits is [UNK] as a whole, not the pieces found before it"
    if want != ["[UNK]"] and got == ["[UNK]"]:
        return "every position here has a piece that fits; look at the ## of the later pieces"
    if len(got) > 1 and not any(p.startswith("##") for p in got[1:]):
        return "the pieces after the first continue the word: look them up with ## in front"
    if got and got[0].startswith("##"):
        return "the first piece of a word is plain, without ##"
    if len(got) > len(want):
        return "take the longest prefix that is in the vocabulary, not the shortest"
    return ""


@exercise("12.3", "WordPiece's greedy longest-match cut", answer="wordpiece",
          section="lesson 12, section 1 (WordPiece's longest-match cut)",
          reference="tinymlp/data/tokenizer.py (Tokenizer._cut)",
          forbidden=("tinymlp.data.tokenizer.Tokenizer._cut", "tinymlp.data.tokenizer.Tokenizer.encode",
                     "tinymlp.data.tokenizer.Tokenizer.tokenize"))
def _wordpiece(wordpiece, case):
    from ..data.tokenizer import SPECIAL_TOKENS, Tokenizer

    for vocab, words in _wordpiece_cases(case):
        tok = Tokenizer(list(SPECIAL_TOKENS) + sorted(vocab - set(SPECIAL_TOKENS)))
        for word in words:
            want = tok._cut(word)
            got = wordpiece(word, set(vocab))
            if isinstance(got, (tuple, list)) and all(type(p) is str for p in got):
                got = [str(p) for p in got]       # a plain list: no object that compares equal to anything
            elif not isinstance(got, str):
                got = f"a {type(got).__name__}"
            if got != want:
                hint = _wordpiece_hint(got, want) if isinstance(got, list) else "return a list of strings"
                raise Wrong(f"{word!r}: yours {got!r}, the tokenizer's {want!r}" + (f"\n({hint})" if hint else ""))

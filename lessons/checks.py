"""The checks of the course's exercises, and the autograder that runs them over notebooks.

In a notebook, after each exercise:

    from checks import check
    check("04.1", MyLayerNorm)

prints one line, ``exercise 04.1 LayerNorm backward: passed``, ``... not done yet`` (the answer
still raises ``NotImplementedError("exercise 04.1")`` or is ``...``) or ``... FAILED`` followed by
what is wrong: the ``tinymlp.gradcheck`` report (with its ``likely`` hint) or the difference from
an independent reference. A check never raises: a stub or a wrong answer does not stop the
notebook. It returns True when the exercise passed, so later cells can use the answer only then.

Each check compares the answer with a reference written here in plain NumPy (never with the
answer itself) and/or runs ``tinymlp.gradcheck`` on it in float64 with a random upstream
gradient, on inputs chosen so that the usual slips show (non-square weights, gains that are
not 1, a batch larger than one).

The autograder, for an instructor:

    python lessons/checks.py lessons/exercises/*.ipynb          # or a class's submitted notebooks
    python lessons/checks.py --timeout 300 submissions/*/04_layernorm.ipynb

executes each notebook from top to bottom (nbclient, a fresh ``python3`` kernel, a cell that
raises does not stop the rest), reads the check lines from its outputs, and prints a table:
notebook, exercise id, title, result (passed / FAILED / not done / not run). It exits 0 only
when every exercise of every notebook passed and no cell raised.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import re
import sys
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository root
LESSONS = ROOT / "lessons"

try:
    import tinymlp
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))
    import tinymlp

from tinymlp import GradcheckError, gradcheck, tensor

__all__ = ["check", "EXERCISES", "run_notebook", "main"]

PASSED, NOT_DONE, FAILED = "passed", "not done yet", "FAILED"
LINE = re.compile(r"^exercise (?P<id>\d\d\.\d+) (?P<title>.*): (?P<status>passed|not done yet|FAILED)\s*$")


class Wrong(Exception):
    """An answer that disagrees with the reference; the message says how."""


@dataclass
class Exercise:
    id: str
    title: str
    run: object  # callable(answer) -> None; raises on a wrong answer


EXERCISES: dict[str, Exercise] = {}


def exercise(ex_id, title):
    def register(fn):
        EXERCISES[ex_id] = Exercise(ex_id, title, fn)
        return fn
    return register


# ------------------------------------------------------------------------------ check()
def _not_done(err) -> str | None:
    """The exercise id if err (or what caused it) is a stub's NotImplementedError."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        m = re.search(r"^exercise (\d\d\.\d+)$", str(err)) if isinstance(err, NotImplementedError) else None
        if m:
            return m.group(1)
        m = re.search(r"NotImplementedError\W+exercise (\d\d\.\d+)", str(err))
        if m:
            return m.group(1)
        err = err.__cause__ or err.__context__
    return None


def _has_ellipsis(answer) -> bool:
    if answer is Ellipsis:
        return True
    if isinstance(answer, (tuple, list)):
        return any(a is Ellipsis for a in answer)
    return False


def check(ex_id: str, answer) -> bool:
    """Check the answer to exercise ``ex_id``; print one line (and the details of a failure)."""
    ex = EXERCISES.get(ex_id)
    if ex is None:
        print(f"exercise {ex_id}: no such exercise (known: {', '.join(sorted(EXERCISES))})")
        return False
    head = f"exercise {ex.id} {ex.title}"
    if _has_ellipsis(answer):
        print(f"{head}: {NOT_DONE}")
        return False
    try:
        ex.run(answer)
    except GradcheckError as err:
        print(f"{head}: {FAILED}")
        print(_indent(str(err)))
        return False
    except Exception as err:  # noqa: BLE001: a wrong answer may raise anything; report it, never stop
        other = _not_done(err)
        if other is not None:
            needs = "" if other == ex.id else f" (it needs exercise {other} first)"
            print(f"{head}: {NOT_DONE}{needs}")
            return False
        print(f"{head}: {FAILED}")
        if isinstance(err, Wrong):
            print(_indent(str(err)))
        else:
            print(_indent(f"{type(err).__name__}: {err}"))
        return False
    print(f"{head}: {PASSED}")
    return True


def _indent(text):
    return "\n".join("    " + line if line else line for line in text.splitlines())


# ------------------------------------------------------------------------------ helpers
def _rng(seed=0):
    return np.random.default_rng(seed)


def _t(a, grad=True):
    return tensor(np.asarray(a, dtype=np.float64), requires_grad=grad, dtype="float64")


def _close(name, got, want, rtol=1e-6, atol=1e-8):
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Wrong(f"{name}: shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.abs(got - want)
        i = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise Wrong(f"{name}: differs from the reference; largest difference {diff[i]:.3g} at index "
                    f"{tuple(int(k) for k in i)} (yours {got[i]:.6g}, expected {want[i]:.6g})")


def _numeric_grad(f, x, h=1e-6):
    """Central differences of a scalar NumPy function f at x (float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _layer_norm(x, gamma, beta, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def _gc(fn, inputs):
    """tinymlp.gradcheck in float64; the report names fn plainly (not ``_check.<locals>.fn``)."""
    if hasattr(fn, "__code__"):
        fn.__qualname__ = fn.__name__
    return gradcheck(fn, inputs)


# ------------------------------------------------------------------------------ lesson 1
@exercise("01.1", "a logistic neuron's gradient")
def _neuron(neuron_gradient):
    rng = _rng(1)
    for _ in range(3):
        x, w, b, t = rng.normal(size=4), rng.normal(size=4), rng.normal(), rng.normal() * 0.5

        def loss(v):
            return 0.5 * (1 / (1 + np.exp(-(v[:4] @ x + v[4]))) - t) ** 2

        num = _numeric_grad(loss, np.append(w, b))
        dw, db = neuron_gradient(w, b, x, t)
        _close("dL/dw", dw, num[:4])
        _close("dL/db", np.asarray(db, dtype=float).reshape(()), num[4])


@exercise("01.2", "central difference")
def _central(central_difference):
    # f(x) = x^3: the central difference is exactly 3x^2 + h^2 (the h^2 f'''/6 term), a one-sided
    # difference 3x^2 + 3xh + h^2
    for x, h in [(0.7, 1e-2), (-1.3, 1e-3), (2.0, 0.1)]:
        got = central_difference(lambda v: v**3, x, h)
        _close(f"central_difference(x**3, {x}, h={h})", got, 3 * x * x + h * h, rtol=1e-9, atol=1e-12)
    got = central_difference(np.sin, np.array([0.0, 1.0, 2.0]), 1e-5)
    _close("central_difference(sin, [0, 1, 2])", got, np.cos([0.0, 1.0, 2.0]), rtol=1e-8)


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


def _graphs():
    """(root, leaves, expected gradients of the leaves) for a few graphs with shared nodes."""
    out = []
    x, y = _Node(0.5, name="x"), _Node(-1.5, name="y")
    u = _mul(x, y, "u")
    v = _tanh(u, "v")
    w = _mul(u, _Node(3.0, name="c"), "w")
    root = _add(v, w, "root")                        # a diamond: u feeds v and w
    du = (1 - math.tanh(-0.75) ** 2) + 3
    out.append((root, (x, y), (du * -1.5, du * 0.5)))
    a = _Node(1.2, name="a")
    sq = _mul(a, a, "a*a")                            # a used twice by one node
    root = _add(sq, a, "a*a+a")
    out.append((root, (a,), (2 * 1.2 + 1,)))
    z = _Node(0.3, name="z")                          # a chain of diamonds
    h = z
    for k in range(12):
        h = _add(_tanh(h, f"t{k}"), _mul(h, _Node(0.5), f"m{k}"), f"s{k}")
    g = 1.0
    val = 0.3
    for _ in range(12):
        g *= (1 - math.tanh(val) ** 2) + 0.5
        val = math.tanh(val) + 0.5 * val
    out.append((h, (z,), (g,)))
    return out


@exercise("02.1", "topological order")
def _topo(topological_order):
    for root, _, _ in _graphs():
        order = list(topological_order(root))
        ids = [id(n) for n in order]
        if len(set(ids)) != len(ids):
            raise Wrong(f"a node appears more than once in the order: {order}")
        reachable, stack = {}, [root]
        while stack:
            n = stack.pop()
            if id(n) not in reachable:
                reachable[id(n)] = n
                stack.extend(n.parents)
        if set(ids) != set(reachable):
            missing = [n for k, n in reachable.items() if k not in ids]
            raise Wrong(f"the order must hold every node the root depends on, once; missing {missing}")
        where = {k: i for i, k in enumerate(ids)}
        for n in order:
            for p in n.parents:
                if where[id(p)] > where[id(n)]:
                    raise Wrong(f"{p} comes after {n}, which uses it: every node must come after its inputs")


@exercise("02.2", "backward with gradient accumulation")
def _backward(backward):
    for root, leaves, expected in _graphs():
        for _ in range(2):                            # twice: backward must reset the old gradients
            backward(root)
            for leaf, want in zip(leaves, expected):
                if not np.isclose(leaf.grad, want, rtol=1e-9, atol=1e-12):
                    raise Wrong(f"d root / d {leaf.name} = {leaf.grad!r}, expected {want:.6g}"
                                + (" (a node used twice must get the sum of both gradients: +=, not =)"
                                   if leaf.name == "a" else ""))
        if root.grad != 1.0:
            raise Wrong(f"the root's own gradient should be 1 (d root / d root), got {root.grad!r}")


@exercise("02.3", "unbroadcast")
def _unbroadcast(unbroadcast):
    rng = _rng(2)
    for gshape, shape in [((4, 3), (3,)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 1)), ((2, 4, 3), (1, 1, 3)),
                          ((5,), (5,)), ((2, 3), ()), ((3, 1, 2), (3, 1, 2))]:
        g = rng.normal(size=gshape)
        want = g
        while want.ndim > len(shape):
            want = want.sum(axis=0)
        for ax, n in enumerate(shape):
            if n == 1 and want.shape[ax] != 1:
                want = want.sum(axis=ax, keepdims=True)
        got = unbroadcast(g, shape)
        _close(f"unbroadcast(grad of shape {gshape}, {shape})", np.asarray(got), want)


# ------------------------------------------------------------------------------ lesson 3
@exercise("03.1", "Linear backward")
def _linear(cls):
    rng = _rng(3)
    for w_shape in [(4, 4), (4, 3)]:
        x, w, b = _t(rng.normal(size=(2, 5, 4))), _t(rng.normal(size=w_shape)), _t(rng.normal(size=w_shape[1]))

        def linear(x, weight, bias):
            return cls.apply(x, weight, bias)

        _close("forward", linear(x, w, b), x.numpy() @ w.numpy() + b.numpy())
        _gc(linear, (x, w, b))


@exercise("03.2", "GELU backward")
def _gelu_ex(cls):
    x = _t(_rng(4).normal(size=(4, 6)) * 2)

    def gelu(x):
        return cls.apply(x)

    _close("forward", gelu(x), _gelu(x.numpy()))
    _gc(gelu, (x,))


# ------------------------------------------------------------------------------ lesson 4
@exercise("04.1", "LayerNorm backward")
def _layernorm(cls):
    rng = _rng(5)
    x = _t(rng.normal(size=(2, 3, 8)) * 2 + 1)
    gamma, beta = _t(rng.normal(size=8)), _t(rng.normal(size=8))

    def layer_norm(x, gamma, beta):
        return cls.apply(x, gamma, beta)

    _close("forward", layer_norm(x, gamma, beta), _layer_norm(x.numpy(), gamma.numpy(), beta.numpy(), 1e-5))
    _gc(layer_norm, (x, gamma, beta))


@exercise("04.2", "LayerNorm Jacobian")
def _ln_jacobian(layer_norm_jacobian):
    rng = _rng(6)
    for D in (5, 8):
        row = rng.normal(loc=1.0, scale=2.0, size=D)
        h = 1e-6
        num = np.stack([(_layer_norm(row + h * e, 1.0, 0.0, 1e-5) - _layer_norm(row - h * e, 1.0, 0.0, 1e-5)) / (2 * h)
                        for e in np.eye(D)], axis=1)
        _close(f"J for a row of {D}", layer_norm_jacobian(row, 1e-5), num, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ lesson 5
@exercise("05.1", "softmax backward")
def _softmax_ex(cls):
    x = _t(_rng(7).normal(size=(3, 6)) * 2)

    def softmax(x):
        return cls.apply(x)

    _close("forward", softmax(x), _softmax(x.numpy()))
    _gc(softmax, (x,))


@exercise("05.3", "attention backward (dQ, dK, dV)")
def _attention_ex(cls):
    rng = _rng(8)
    q, k, v = _t(rng.normal(size=(2, 4, 5))), _t(rng.normal(size=(2, 6, 5))), _t(rng.normal(size=(2, 6, 3)))

    def attention(q, k, v):
        return cls.apply(q, k, v)

    p = _softmax(q.numpy() @ k.numpy().transpose(0, 2, 1) / math.sqrt(5))
    _close("forward", attention(q, k, v), p @ v.numpy())
    _gc(attention, (q, k, v))


@exercise("05.2", "cross-entropy backward")
def _cross_entropy(cls):
    rng = _rng(9)
    logits = _t(rng.normal(size=(6, 5)) * 2)
    labels = rng.integers(0, 5, size=6)

    def cross_entropy(logits):
        return cls.apply(logits, labels)

    x = logits.numpy()
    want = -np.mean(np.log(_softmax(x))[np.arange(6), labels])
    _close("forward (the mean over the batch)", cross_entropy(logits), want)
    _gc(cross_entropy, (logits,))


@exercise("05.4", "the rotation that shifts a position")
def _rotation(rotation):
    d = 16
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    t = np.arange(40)[:, None]
    pe = np.zeros((40, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(t * omega), np.cos(t * omega)
    for phi in (1, 3, 11):
        M = np.asarray(rotation(phi, omega))
        if M.shape != (d, d):
            raise Wrong(f"rotation({phi}, omega) has shape {M.shape}, expected {(d, d)}")
        _close(f"M({phi}) p_t (every t)", pe[:-phi] @ M.T, pe[phi:], atol=1e-9)


# ------------------------------------------------------------------------------ lesson 6
@exercise("06.2", "token-mixing block from Linear layers")
def _token_mixing(cls):
    rng = _rng(10)
    S, C, H = 6, 5, 4
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
    except KeyError as err:
        raise Wrong(f"expected parameters norm.weight/bias, fc1.weight/bias, fc2.weight/bias; got {sorted(names)}") from err
    for p in block.parameters():
        p.data = p.data.astype(np.float64)
    _close("forward", block(tensor(x, dtype="float64")), want, rtol=1e-6, atol=1e-8)
    _gc(block, (_t(x),))


@exercise("06.1", "a Mixer block's parameter count")
def _mixer_params(mixer_block_parameters):
    for S, C, DS, DC in [(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)]:
        want = 2 * (2 * C) + (S * DS + DS + DS * S + S) + (C * DC + DC + DC * C + C)
        got = mixer_block_parameters(S, C, DS, DC)
        if got != want:
            raise Wrong(f"mixer_block_parameters({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(two LayerNorms with a weight and a bias each; two MLPs, each two Linears with biases)")


@exercise("06.3", "a Mixer block's floating-point operations")
def _mixer_flops(mixer_block_flops):
    for S, C, DS, DC in [(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)]:
        want = 4 * S * DS * C + 4 * S * C * DC
        got = mixer_block_flops(S, C, DS, DC)
        if got != want:
            raise Wrong(f"mixer_block_flops({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(count the four matrix products, 2 operations per multiply-add)")


# ------------------------------------------------------------------------------ lesson 7
def _sgu_reference(z, W, b, gamma, beta, eps):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n = _layer_norm(z2, gamma, beta, eps)
    return z1 * (np.einsum("ij,bjc->bic", W, n) + b[:, None])


@exercise("07.1", "SGU backward (dZ1, dZ2, dW, db)")
def _sgu(cls):
    rng = _rng(11)
    B, S, e = 2, 5, 3
    z = _t(rng.normal(size=(B, S, 2 * e)))
    W, b = _t(rng.normal(size=(S, S)) * 0.5), _t(1 + rng.normal(size=S) * 0.5)
    gamma, beta = _t(1 + rng.normal(size=e) * 0.3), _t(rng.normal(size=e) * 0.3)

    def sgu(z, weight, bias, gamma, beta):
        return cls.apply(z, weight, bias, gamma, beta)

    want = _sgu_reference(z.numpy(), W.numpy(), b.numpy(), gamma.numpy(), beta.numpy(), 1e-5)
    _close("forward", sgu(z, W, b, gamma, beta), want)
    _gc(sgu, (z, W, b, gamma, beta))


def _toeplitz_reference(w, S):
    i, j = np.indices((S, S))
    return w[i - j + S - 1]


@exercise("07.2", "Toeplitz matrix from its 2S - 1 numbers")
def _toeplitz(toeplitz):
    rng = _rng(12)
    for S in (1, 4, 7):
        w = rng.normal(size=2 * S - 1)
        _close(f"toeplitz(w, S={S})", np.asarray(toeplitz(w, S)), _toeplitz_reference(w, S))


@exercise("07.3", "Toeplitz backward (diagonal sums)")
def _toeplitz_back(toeplitz_backward):
    from tinymlp import Function

    rng = _rng(13)
    for S in (1, 3, 6):
        g = rng.normal(size=(S, S))
        want = np.zeros(2 * S - 1)
        i, j = np.indices((S, S))
        np.add.at(want, (i - j + S - 1).ravel(), g.ravel())
        _close(f"toeplitz_backward(dW of shape {(S, S)})", np.asarray(toeplitz_backward(g)), want)

    class Toeplitz(Function):
        @staticmethod
        def forward(ctx, w, size):
            return _toeplitz_reference(w, size)

        @staticmethod
        def backward(ctx, grad):
            return toeplitz_backward(grad)

    def toeplitz(w):
        return Toeplitz.apply(w, size=4)

    _gc(toeplitz, (_t(rng.normal(size=7)),))


# ------------------------------------------------------------------------------ lesson 8
@exercise("08.2", "tiny attention's parameter count")
def _tiny_params(tiny_attention_parameters):
    for d_in, d_out, a in [(32, 64, 16), (256, 768, 64), (3, 5, 2)]:
        want = d_in * 3 * a + a * d_out + d_out
        got = tiny_attention_parameters(d_in, d_out, a)
        if got != want:
            raise Wrong(f"tiny_attention_parameters({d_in}, {d_out}, {a}) = {got}, expected {want} "
                        "(the projection to q, k, v has no bias; the output projection has one)")


@exercise("08.1", "attention weights from queries and keys")
def _attention_weights(attention_weights):
    rng = _rng(14)
    q, k = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4))
    got = attention_weights(tensor(q, dtype="float64"), tensor(k, dtype="float64"))
    want = _softmax(q @ k.transpose(0, 2, 1) / 2.0)
    _close("A = softmax(Q K^T / sqrt(d))", got, want)


# ------------------------------------------------------------------------------ lesson 10
@exercise("10.1", "RMSNorm backward")
def _rmsnorm(cls):
    rng = _rng(15)
    x, g = _t(rng.normal(size=(3, 4, 6))), _t(rng.uniform(0.5, 1.5, 6))

    def rms_norm(x, weight):
        return cls.apply(x, weight)

    want = g.numpy() * x.numpy() / np.sqrt((x.numpy() ** 2).mean(axis=-1, keepdims=True) + 1e-6)
    _close("forward", rms_norm(x, g), want)
    _gc(rms_norm, (x, g))


@exercise("10.2", "Swish backward")
def _swish(cls):
    x = _t(_rng(16).normal(size=(5, 7)) * 3)

    def swish(x):
        return cls.apply(x)

    _close("forward", swish(x), x.numpy() / (1 + np.exp(-x.numpy())))
    _gc(swish, (x,))


@exercise("10.3", "a layer of your own, gradchecked")
def _own_layer(answer):
    fn, inputs = answer
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    if not any(getattr(t, "requires_grad", False) for t in inputs) and not hasattr(fn, "parameters"):
        raise Wrong("give at least one input with requires_grad=True (or a Module with parameters)")
    gradcheck(fn, inputs)


@exercise("12.1", "embedding backward (scatter-add)")
def _embedding(cls):
    E = _t(_rng(21).normal(size=(6, 3)))
    ids = np.array([[1, 4, 4, 0], [4, 2, 1, 1]])        # repeated ids: the sums must accumulate
    _close("forward", cls.apply(E, ids), E.numpy()[ids])

    def embedding(E):
        return cls.apply(E, ids)

    _gc(embedding, (E,))


@exercise("12.2", "mean over the real tokens (masked pooling)")
def _masked_mean(cls):
    rng = _rng(22)
    mask = np.array([[1, 1, 1, 0, 0, 0],                 # 3 real tokens of 6
                     [1, 1, 1, 1, 1, 1],                 # no padding
                     [1, 0, 0, 0, 0, 0]], dtype=bool)    # [CLS] alone
    B, S, C = 3, 6, 4
    m, n = mask[:, :, None], mask.sum(axis=1, keepdims=True)         # (B, S, 1), (B, 1)
    x = _t(rng.normal(size=(B, S, C)))
    y = cls.apply(x, mask)
    got = np.asarray(y.numpy(), dtype=np.float64)
    want = (x.numpy() * m).sum(axis=1) / n
    if got.shape == want.shape and not np.allclose(got, want):
        if np.allclose(got, (x.numpy() * m).sum(axis=1) / S):
            raise Wrong(f"forward: divided by S = {S}, the padded length; divide sentence b by "
                        "n[b] = mask[b].sum(), its number of real tokens")
        if np.allclose(got, x.numpy().mean(axis=1)):
            raise Wrong("forward: the padding is averaged in; multiply by the mask before summing")
    _close("forward", y, want)

    g = rng.normal(size=(B, C))
    y.backward(tensor(g, dtype="float64"))
    dx = np.asarray(x.grad, dtype=np.float64)
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
        return cls.apply(x, mask)

    _gc(masked_mean, (_t(rng.normal(size=(B, S, C))),))  # any other slip: the report says where
    _close("dL/dx", dx, want)
    if np.any(dx[~mask] != 0):
        raise Wrong(f"backward: padding positions must get exactly 0, largest |dL/dx| there "
                    f"{np.abs(dx[~mask]).max():.3g}")


def _wordpiece_cases():
    """(vocabulary, words) pairs: a small trained one, and one made to show the usual slips."""
    from tinymlp.text import Tokenizer

    corpus = ["the players were playing a funny film", "an unbelievably long story was told",
              "she plays the piano and he played along", "a story of stories, told and retold"] * 3
    trained = set(Tokenizer.train(corpus, vocab_size=70).vocab[5:])
    words = ["the", "players", "playing", "plays", "replayed", "unbelievably", "stories", "storyteller",
             "a", "t", "s", "pianos", "along", "longest", "told", "retelling", "hello", "played",
             "jazz", "q", "theplayers", "aaaa"]
    made = {"a", "b", "c", "d", "ab", "abc", "##a", "##b", "##c", "##bc", "##cab", "un", "##do", "do", "##ne"}
    made_words = ["a", "d", "ab", "abc", "abd", "abca", "abcab", "undo", "undone", "undoe", "cab", "bad",
                  "dab", "z", "abcabcab", "ba", "bca"]
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


@exercise("12.3", "WordPiece's greedy longest-match cut")
def _wordpiece(wordpiece):
    from tinymlp.text import SPECIAL_TOKENS, Tokenizer

    for vocab, words in _wordpiece_cases():
        tok = Tokenizer(list(SPECIAL_TOKENS) + sorted(vocab - set(SPECIAL_TOKENS)))
        for word in words:
            want = tok._cut(word)
            got = wordpiece(word, set(vocab))
            if isinstance(got, tuple):
                got = list(got)
            if got != want:
                hint = _wordpiece_hint(got, want) if isinstance(got, list) else "return a list of strings"
                raise Wrong(f"{word!r}: yours {got!r}, the tokenizer's {want!r}" + (f"\n({hint})" if hint else ""))


# ------------------------------------------------------------------------------ the autograder
@dataclass
class NotebookResult:
    path: pathlib.Path
    results: dict = field(default_factory=dict)   # exercise id -> (title, status)
    expected: list = field(default_factory=list)  # exercise ids the notebook should check
    errors: list = field(default_factory=list)    # one line per cell that raised
    seconds: float = 0.0
    outputs: str = ""                             # all the text the notebook printed

    @property
    def rows(self):
        ids = list(dict.fromkeys(self.expected + list(self.results)))
        for ex_id in ids:
            title, status = self.results.get(ex_id, (EXERCISES[ex_id].title if ex_id in EXERCISES else "", None))
            yield ex_id, title, {PASSED: "passed", FAILED: "FAILED", NOT_DONE: "not done"}.get(status, "not run")

    @property
    def passed(self):
        return not self.errors and all(status == "passed" for _, _, status in self.rows)


def expected_exercises(path: pathlib.Path, nb=None) -> list[str]:
    """The exercises a notebook should check: those of its lesson number, else those it names."""
    lesson = path.name[:2]
    ids = sorted(k for k in EXERCISES if k.startswith(lesson + "."))
    if not ids and nb is not None:
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        ids = sorted(set(re.findall(r"check\(\s*[\"'](\d\d\.\d+)[\"']", text)))
    return ids


def _text_of(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") in ("execute_result", "display_data"):
        return output.get("data", {}).get("text/plain", "")
    return ""


def run_notebook(path, timeout=600, kernel_name="python3") -> NotebookResult:
    """Execute one notebook (cells that raise do not stop it) and collect its check lines."""
    import nbclient
    import nbformat

    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    # the kernel imports this checkout's tinymlp and checks.py (a PYTHONPATH already set comes first)
    env_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(ROOT), str(LESSONS)]
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "MPLBACKEND")}
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(env_path))
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                                     resources={"metadata": {"path": str(path.parent.resolve())}})
    result = NotebookResult(path, expected=expected_exercises(path, nb))
    start = time.perf_counter()
    try:
        client.execute()
    except Exception as err:  # noqa: BLE001: a timeout or a dead kernel is a result, not a crash
        result.errors.append(f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    result.seconds = time.perf_counter() - start
    texts = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                result.errors.append(f"cell {i}: {output.get('ename')}: {output.get('evalue')}")
            text = _text_of(output)
            texts.append(text)
            for line in text.splitlines():
                m = LINE.match(line)
                if m:
                    result.results[m.group("id")] = (m.group("title"), m.group("status"))
    result.outputs = "\n".join(texts)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute lesson notebooks and grade their exercises.")
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path, help="notebooks to execute and grade")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    args = parser.parse_args(argv)
    all_passed, rows = True, []
    for path in args.notebooks:
        print(f"running {path} ...", file=sys.stderr, flush=True)
        res = run_notebook(path, timeout=args.timeout)
        print(f"  ... {res.seconds:.1f} s", file=sys.stderr, flush=True)
        all_passed &= res.passed
        for ex_id, title, status in res.rows:
            rows.append((path.name, ex_id, title, status))
        if not res.expected and not res.results:
            rows.append((path.name, "-", "(no exercises)", "ran" if not res.errors else "error"))
        for err in res.errors:
            rows.append((path.name, "-", err[:70], "error"))
    widths = [max(len(r[k]) for r in rows + [("notebook", "exercise", "title", "result")]) for k in range(4)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    print(fmt.format("notebook", "exercise", "title", "result"))
    print(fmt.format(*("-" * w for w in widths)))
    for row in rows:
        print(fmt.format(*row))
    counted = [r for r in rows if r[1] != "-"]
    done = sum(r[3] == "passed" for r in counted)
    print(f"\n{done} of {len(counted)} exercises passed" + ("" if all_passed else "; not all passed"))
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())

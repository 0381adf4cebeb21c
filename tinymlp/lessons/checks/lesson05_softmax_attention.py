"""Lesson 5's checks: softmax's backward (05.1), cross-entropy's (05.2), attention's (05.3), each a
Function, and the rotation that shifts a sinusoidal position (05.4)."""

from __future__ import annotations

import math

import numpy as np

from ..registry import CostCase, Wrong, exercise
from .common import array_of, close, exact, grads, rearranged, run_gradcheck, shown_as, t64, wrong_term
from .common import softmax as softmax_reference


def softmax_cost(rng):
    return CostCase((rng.normal(size=(32, 1024)) * 2,), (True,), softmax_reference)


@exercise("05.1", "softmax backward", answer="MySoftmax", seed=7, derived=True, cost=softmax_cost,
          reference="tinymlp/ops/attention.py (Softmax.backward)",
          forbidden=("tinymlp.ops.attention.Softmax", "tinymlp.ops.attention.LogSoftmax"))
def softmax_backward(cls, case):
    x = t64(case.rng.normal(size=case.pick((3, 6), (4, 5))) * 2)

    @shown_as(cls)

    def softmax(x):
        return cls.apply(x)

    X = x.numpy().copy()
    close("forward", softmax(x), softmax_reference(X))
    run_gradcheck(softmax, (x,), case, explain=lambda report: softmax_terms(report, softmax, X))
    g, p = case.rng.normal(size=x.shape), softmax_reference(X)
    exact("dL/dx", grads(softmax, (t64(X),), g)[0], p * (g - (g * p).sum(axis=-1, keepdims=True)))


def softmax_terms(report, softmax, X):
    """Which term of dL/dx = p g - p <g, p> the answer has wrong, if one."""
    g, p = np.random.default_rng(0).normal(size=X.shape), softmax_reference(X)
    terms = [("p * g", p * g), ("- p <g, p> (the row's inner product)", -p * (g * p).sum(axis=-1, keepdims=True))]
    wrong_term(report, "x", grads(softmax, (t64(X),), g)[0], sum(t for _, t in terms), terms, of="dL/dx")


def cross_entropy_reference(logits, labels):
    return -np.mean(np.log(softmax_reference(logits))[np.arange(len(labels)), labels])


def cross_entropy_cost(rng):
    logits, labels = rng.normal(size=(256, 512)) * 2, rng.integers(0, 512, size=256)
    return CostCase((logits, labels), (True, False), cross_entropy_reference)


@exercise("05.2", "cross-entropy backward", answer="MyCrossEntropy", seed=9, derived=True, cost=cross_entropy_cost,
          reference="tinymlp/ops/loss.py (CrossEntropy.backward)",
          forbidden=("tinymlp.ops.loss.CrossEntropy", "tinymlp.ops.attention.Softmax",
                     "tinymlp.ops.attention.LogSoftmax"))
def cross_entropy_backward(cls, case):
    N, V = case.pick((6, 5), (7, 4))
    logits = t64(case.rng.normal(size=(N, V)) * 2)
    labels = case.rng.integers(0, V, size=N)

    @shown_as(cls)

    def cross_entropy(logits):
        return cls.apply(logits, labels.copy())

    x = logits.numpy().copy()
    close("forward (the mean over the batch)", cross_entropy(logits), cross_entropy_reference(x, labels))
    run_gradcheck(cross_entropy, (logits,), case)
    g = float(case.rng.normal())
    d = softmax_reference(x)
    d[np.arange(N), labels] -= 1
    exact("dL/dlogits", grads(cross_entropy, (t64(x),), g)[0], g * d / N)


def attention_reference(q, k, v):
    return softmax_reference(q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])) @ v


def attention_cost(rng):
    q, k, v = (rng.normal(size=(4, 64, 64)) for _ in range(3))
    return CostCase((q, k, v), (True, True, True), attention_reference)


@exercise("05.3", "attention backward (the gradients of Q, K, V)", answer="MyAttention", seed=8, derived=True,
          cost=attention_cost, reference="tinymlp/ops/attention.py (Attention.backward)",
          forbidden=("tinymlp.ops.attention.Attention", "tinymlp.ops.attention.Softmax"))
def attention_backward(cls, case):
    rng = case.rng
    B, T, S, d, dv = case.pick((2, 4, 6, 5, 3), (3, 3, 5, 4, 2))
    q, k, v = t64(rng.normal(size=(B, T, d))), t64(rng.normal(size=(B, S, d))), t64(rng.normal(size=(B, S, dv)))

    @shown_as(cls)

    def attention(q, k, v):
        return cls.apply(q, k, v)

    scale = 1 / math.sqrt(d)
    Q, K, Vn = (t.numpy().copy() for t in (q, k, v))
    p = softmax_reference(Q @ K.transpose(0, 2, 1) * scale)
    close("forward", attention(q, k, v), p @ Vn)
    run_gradcheck(attention, (q, k, v), case)
    g = rng.normal(size=(B, T, dv))
    dp = g @ Vn.transpose(0, 2, 1)                            # G_P = dL/dP
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))      # G_S = dL/dS
    dq, dk, dvv = grads(attention, (t64(Q), t64(K), t64(Vn)), g)
    exact("dL/dq", dq, ds @ K * scale)
    exact("dL/dk", dk, ds.transpose(0, 2, 1) @ Q * scale)
    exact("dL/dv", dvv, p.transpose(0, 2, 1) @ g)


@exercise("05.4", "the rotation that shifts a position", answer="rotation",
          reference="tinymlp/models/vit.py (sinusoidal_embedding)")
def shift(rotation, case):
    d = case.pick(16, 12)
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    t = np.arange(40)[:, None]
    pe = np.zeros((40, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(t * omega), np.cos(t * omega)
    for phi in case.pick((1, 3, 11), tuple(int(p) for p in case.rng.integers(1, 20, size=3))):
        M = array_of(rotation(phi, omega.copy()), f"rotation({phi}, omega)")
        if M.shape != (d, d):
            raise Wrong(f"rotation({phi}, omega) has shape {M.shape}, expected {(d, d)}")
        want = rotation_reference(phi, omega)
        how = rearranged(M, want, atol=1e-9)
        if how is not None and "transpose" in how:
            raise Wrong(f"rotation({phi}, omega): yours is {how}: the rotation by -omega_i * phi, so M p_t = "
                        f"p_(t-{phi}), a shift backwards; in each 2x2 block the two sin entries have swapped signs "
                        "(row 2i is [cos, sin], row 2i+1 is [-sin, cos])")
        if how is not None:
            raise Wrong(f"rotation({phi}, omega): M p_t is not p_(t+{phi}): yours is {how}")
        close(f"M({phi}) p_t (every t)", pe[:-phi] @ M.T, pe[phi:], atol=1e-9)


def rotation_reference(phi, omega):
    """The block-diagonal M(phi): [[cos, sin], [-sin, cos]] of omega_i * phi in rows and columns 2i, 2i+1."""
    d = 2 * len(omega)
    M = np.zeros((d, d))
    c, s = np.cos(omega * phi), np.sin(omega * phi)
    k = np.arange(0, d, 2)
    M[k, k], M[k, k + 1], M[k + 1, k], M[k + 1, k + 1] = c, s, -s, c
    return M

"""Lesson 7's checks: the spatial gating unit's backward (07.1), a Toeplitz matrix from its 2S - 1
numbers (07.2) and its backward, the sums along the diagonals (07.3)."""

from __future__ import annotations

import numpy as np

from ...autograd import Function
from ..registry import CostCase, exercise
from .common import close, exact, grads, layer_norm, normalize, normalize_grad, run_gradcheck, shown_as, t64


def sgu_reference(z, W, b, gamma, beta, eps=1e-5):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n = layer_norm(z2, gamma, beta, eps)
    return z1 * (np.einsum("ij,bjc->bic", W, n) + b[:, None])


def sgu_grads(z, W, b, gamma, beta, eps, g):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n_hat, r = normalize(z2, eps)
    n = gamma * n_hat + beta
    f = np.einsum("ij,bjc->bic", W, n) + b[:, None]
    df = g * z1
    dn = np.einsum("ij,bic->bjc", W, df)
    dz2 = normalize_grad(dn * gamma, n_hat, r)
    return (np.concatenate([g * f, dz2], axis=-1), np.einsum("bic,bjc->ij", df, n), df.sum(axis=(0, 2)),
            (dn * n_hat).sum(axis=(0, 1)), dn.sum(axis=(0, 1)))


def sgu_cost(rng):
    S, e = 64, 64
    inputs = (rng.normal(size=(8, S, 2 * e)), rng.normal(size=(S, S)) * 0.5, 1 + rng.normal(size=S) * 0.5,
              1 + rng.normal(size=e) * 0.3, rng.normal(size=e) * 0.3)
    return CostCase(inputs, (True,) * 5, sgu_reference)


@exercise("07.1", "SGU backward (dZ1, dZ2, dW, db)", answer="MySGU", seed=11, derived=True, cost=sgu_cost,
          reference="tinymlp/ops/gating.py (SpatialGating.backward)",
          forbidden=("tinymlp.ops.gating.SpatialGating", "tinymlp.ops.norm.LayerNorm",
                     "tinymlp.ops.norm.normalize_backward"))
def spatial_gating(cls, case):
    rng = case.rng
    B, S, e = case.pick((2, 5, 3), (3, 4, 4))
    z = t64(rng.normal(size=(B, S, 2 * e)))
    W, b = t64(rng.normal(size=(S, S)) * 0.5), t64(1 + rng.normal(size=S) * 0.5)
    gamma, beta = t64(1 + rng.normal(size=e) * 0.3), t64(rng.normal(size=e) * 0.3)

    @shown_as(cls)

    def sgu(z, weight, bias, gamma, beta):
        return cls.apply(z, weight, bias, gamma, beta)

    arrays = [t.numpy().copy() for t in (z, W, b, gamma, beta)]
    close("forward", sgu(z, W, b, gamma, beta), sgu_reference(*arrays, 1e-5))
    run_gradcheck(sgu, (z, W, b, gamma, beta), case)
    g = rng.normal(size=(B, S, e))
    got = grads(sgu, tuple(t64(a) for a in arrays), g)
    for name, mine, want in zip(("z", "weight", "bias", "gamma", "beta"), got, sgu_grads(*arrays, 1e-5, g)):
        exact(f"dL/d{name}", mine, want)


def toeplitz_reference(w, S):
    i, j = np.indices((S, S))
    return w[i - j + S - 1]


@exercise("07.2", "Toeplitz matrix from its 2S - 1 numbers", answer="toeplitz", seed=12,
          reference="tinymlp/ops/gating.py (toeplitz_1d)",
          forbidden=("tinymlp.ops.gating.toeplitz_1d", "tinymlp.ops.gating.Toeplitz1d"))
def toeplitz_matrix(toeplitz, case):
    for S in case.pick((1, 4, 7), (2, 5, 6)):
        w = case.rng.normal(size=2 * S - 1)
        want = toeplitz_reference(w, S)
        close(f"toeplitz(w, S={S})", toeplitz(w.copy(), S), want,
              notes={"transpose": "W[i, j] is w[i - j + S - 1] (row index minus column index); yours takes "
                                  "w[j - i + S - 1]"})


@exercise("07.3", "Toeplitz backward (diagonal sums)", answer="toeplitz_backward", seed=13, derived=True,
          reference="tinymlp/ops/gating.py (Toeplitz1d.backward)",
          forbidden=("tinymlp.ops.gating.Toeplitz1d",))
def toeplitz_backward_check(toeplitz_backward, case):
    rng = case.rng
    for S in case.pick((1, 3, 6), (2, 4, 5)):
        g = rng.normal(size=(S, S))
        want = np.zeros(2 * S - 1)
        i, j = np.indices((S, S))
        np.add.at(want, (i - j + S - 1).ravel(), g.ravel())
        exact(f"toeplitz_backward(dW of shape {(S, S)})", toeplitz_backward(g.copy()), want,
              notes={"reversed": "the diagonals are in the opposite order: dw[k] sums the diagonal i - j = k - (S - 1) "
                                 "(row minus column), yours the diagonal j - i = k - (S - 1) (np.trace(dW, offset=m) "
                                 "sums the entries with j - i = m)"})

    class Toeplitz(Function):
        @staticmethod
        def forward(ctx, w, size):
            return toeplitz_reference(w, size)

        @staticmethod
        def backward(ctx, grad):
            return toeplitz_backward(grad)

    size = case.pick(4, 3)

    def toeplitz(w):
        return Toeplitz.apply(w, size=size)

    run_gradcheck(toeplitz, (t64(rng.normal(size=2 * size - 1)),), case)

"""Layers from class assignments, each with one realistic bug (or none), for the gradcheck tests.

``test_gradcheck_layers.py`` asserts the words of their reports; ``benchmarks/gradcheck_cost.py``
times the correct ones. Every layer is plain NumPy in a ``Function``, as a student writes it.
"""

import numpy as np

import tinymlp
from tinymlp import Function


def leaf(shape, seed=0, scale=1.0, shift=0.0, dtype="float64"):
    data = np.random.default_rng(seed).normal(size=shape) * scale + shift
    return tinymlp.tensor(data, requires_grad=True, dtype=dtype)


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ----------------------------------------------------------------------------- GroupNorm


class GroupNorm(Function):
    """GroupNorm over (B, C, L): each group of C / G channels and all L positions is normalised
    together, then a gain and a bias per channel. ``backward_dx`` is the derivation's last line."""

    @staticmethod
    def forward(ctx, x, gamma, beta, groups=2):
        B, C = x.shape[:2]
        xg = x.reshape(B, groups, -1)
        mu = xg.mean(axis=-1, keepdims=True)
        r = 1 / np.sqrt(((xg - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
        xhat = ((xg - mu) * r).reshape(x.shape)
        ctx.save_for_backward(xhat, r, gamma)
        ctx.groups = groups
        shape = (1, C) + (1,) * (x.ndim - 2)
        return xhat * gamma.reshape(shape) + beta.reshape(shape)

    @classmethod
    def backward(cls, ctx, g):
        xhat, r, gamma = ctx.saved_tensors
        B, C = g.shape[:2]
        axes = (0,) + tuple(range(2, g.ndim))
        dgamma, dbeta = (g * xhat).sum(axis=axes), g.sum(axis=axes)
        gh = (g * gamma.reshape((1, C) + (1,) * (g.ndim - 2))).reshape(B, ctx.groups, -1)
        dx = cls.backward_dx(gh, xhat.reshape(B, ctx.groups, -1), r)
        return dx.reshape(g.shape), dgamma, dbeta

    @staticmethod
    def backward_dx(gh, xh, r):
        return r * (gh - gh.mean(axis=-1, keepdims=True) - xh * (gh * xh).mean(axis=-1, keepdims=True))


class GroupNormNoGroupMean(GroupNorm):
    """The bug: the group-mean term mean(g) is missing from dL/dx."""

    @staticmethod
    def backward_dx(gh, xh, r):
        return r * (gh - xh * (gh * xh).mean(axis=-1, keepdims=True))


class GroupNormPositionMean(GroupNorm):
    """The student's "fix" of the bug above: the mean taken over the positions of one channel
    (axis 2), where the group's channels and positions together belong."""

    @staticmethod
    def backward_dx(gh, xh, r):
        B, G = gh.shape[:2]
        per_channel = gh.reshape(B, G, -1, 4).mean(axis=-1, keepdims=True)
        gh_mean = np.broadcast_to(per_channel, gh.reshape(B, G, -1, 4).shape).reshape(gh.shape)
        return r * (gh - gh_mean - xh * (gh * xh).mean(axis=-1, keepdims=True))


class BatchNormNoMean(Function):
    """Batch normalisation of (B, C, L) over the batch and the positions of each channel (no gain);
    the bug: the mean(g) term is missing from dL/dx."""

    @staticmethod
    def forward(ctx, x):
        mu = x.mean(axis=(0, 2), keepdims=True)
        r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=(0, 2), keepdims=True) + 1e-5)
        xhat = (x - mu) * r
        ctx.save_for_backward(xhat, r)
        return xhat

    @staticmethod
    def backward(ctx, g):
        xhat, r = ctx.saved_tensors
        return r * (g - xhat * (g * xhat).mean(axis=(0, 2), keepdims=True))


# ----------------------------------------------------------------------------- Swish with a learnt beta


class SwishBeta(Function):
    """y = x * sigmoid(beta * x), beta one value per channel (the last axis)."""

    reduce_axes = None  # None: every axis but the last

    @classmethod
    def forward(cls, ctx, x, beta):
        s = sigmoid(beta * x)
        ctx.save_for_backward(x, beta, s)
        return x * s

    @classmethod
    def backward(cls, ctx, g):
        x, beta, s = ctx.saved_tensors
        ds = s * (1 - s)
        axes = tuple(range(x.ndim - 1)) if cls.reduce_axes is None else cls.reduce_axes
        return g * (s + x * beta * ds), (g * x * x * ds).sum(axis=axes)


class SwishBetaWrongAxis(SwishBeta):
    """The bug: dL/dbeta summed over axis 1 (the channels) where axis 0 (the batch) belongs;
    it runs because the batch and the channels happen to have the same size."""

    reduce_axes = (1,)


class SwishBetaWrongAxis3d(SwishBeta):
    """On (B, S, C) tokens: summed over axes (0, 2) where (0, 1) belongs (S == C)."""

    reduce_axes = (0, 2)


# ----------------------------------------------------------------------------- causal attention


class CausalAttention(Function):
    """softmax(q k^T / sqrt(d), causally masked) v; backward recomputes P from q and k."""

    mask_in_backward = True

    @staticmethod
    def scores(q, k, masked):
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        if masked:
            s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
        return softmax(s)

    @classmethod
    def forward(cls, ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return cls.scores(q, k, True) @ v

    @classmethod
    def backward(cls, ctx, g):
        q, k, v = ctx.saved_tensors
        p = cls.scores(q, k, cls.mask_in_backward)
        dv = p.swapaxes(-1, -2) @ g
        dp = g @ v.swapaxes(-1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / np.sqrt(q.shape[-1])
        return ds @ k, ds.swapaxes(-1, -2) @ q, dv


class CausalAttentionMaskForgotten(CausalAttention):
    """The bug: backward recomputes P without the causal mask."""

    mask_in_backward = False


# ----------------------------------------------------------------------------- a residual block


class LeakyReLU(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.where(x > 0, x, 0.1 * x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return np.where(x > 0, g, 0.1 * g)


class LeakyReLUInPlace(LeakyReLU):
    """The bug: backward scales its incoming gradient in place (``g[x < 0] *= 0.1``)."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g[x < 0] *= 0.1
        return g


def residual_block(leaky):
    """x + leaky(x W + b): the Add's backward hands one gradient array to both of its inputs."""
    def block(x, w, b):
        return x + leaky.apply(tinymlp.functional.linear(x, w, b))
    return block


# ----------------------------------------------------------------------------- max-pool


class MaxPool1d(Function):
    """Max over windows of 2 along the last axis; the gradient goes to the first maximum."""

    @staticmethod
    def forward(ctx, x):
        xw = x.reshape(x.shape[:-1] + (-1, 2))
        ctx.save_for_backward(xw.argmax(axis=-1))
        ctx.shape = x.shape
        return xw.max(axis=-1)

    @staticmethod
    def backward(ctx, g):
        (arg,) = ctx.saved_tensors
        dx = np.zeros(g.shape + (2,))
        np.put_along_axis(dx, arg[..., None], g[..., None], axis=-1)
        return dx.reshape(ctx.shape)


class MaxPool1dTiesToAll(Function):
    """The bug: the gradient goes to every element equal to the maximum (both of a tie)."""

    @staticmethod
    def forward(ctx, x):
        xw = x.reshape(x.shape[:-1] + (-1, 2))
        m = xw.max(axis=-1)
        ctx.save_for_backward(xw, m)
        return m

    @staticmethod
    def backward(ctx, g):
        xw, m = ctx.saved_tensors
        return ((xw == m[..., None]) * g[..., None]).reshape(xw.shape[:-2] + (-1,))


def after_relu(shape, seed):
    """A max-pool's input as a ReLU leaves it: about half of it exactly 0, so windows tie at 0."""
    x = np.maximum(np.random.default_rng(seed).normal(size=shape), 0.0)
    return tinymlp.tensor(x, requires_grad=True, dtype="float64")


# ----------------------------------------------------------------------------- softmax


class Softmax(Function):
    @staticmethod
    def forward(ctx, z):
        p = softmax(z)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (g * p).sum(axis=-1, keepdims=True))


def confident_logits(shape=(4, 5), margin=95.0, seed=0):
    """Logits whose right class leads by ``margin``: a softmax saturated to 1 within e^-margin."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=shape)
    z[np.arange(shape[0]), rng.integers(shape[-1], size=shape[0])] += margin
    return tinymlp.tensor(z, requires_grad=True, dtype="float64")


class SoftmaxNoMaxBackward(Function):
    """softmax; forward subtracts the row max, backward recomputes exp(z) without it."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return softmax(z)

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        e = np.exp(z)
        p = e / e.sum(axis=-1, keepdims=True)
        return p * (g - (g * p).sum(axis=-1, keepdims=True))

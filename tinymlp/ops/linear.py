"""The affine map ``y = x @ W + b`` over the last axis of an input of any rank, or over
another axis (``axis=``: MLP-Mixer's token mixing, without transposing the activations).

``W`` has shape ``(in_features, out_features)``: the papers' ``XU`` convention, so the
forward pass reads like the math and needs no transpose.
"""

from __future__ import annotations

import math

from ..autograd import Function
from ..backend import array_module
from .activation import gelu_epilogue
from .norm import column_sum


class Linear(Function):
    r"""y = x W + b,  x (..., D_in), W (D_in, D_out), b (D_out,), y (..., D_out).

    Flatten the leading axes: X (N, D_in) with N = prod(x.shape[:-1]), G = dL/dY (N, D_out).
    Then Y = X W + 1 b^T is one matrix product, and its differential is

        dY = dX W + X dW + 1 db^T.

    Read off each gradient from  dL = <G, dY> = tr(G^T dY):

        <G, dX W>    = <G W^T, dX>       =>  dL/dX = G W^T          (N, D_in)
        <G, X dW>    = <X^T G, dW>       =>  dL/dW = X^T G          (D_in, D_out)
        <G, 1 db^T>  = <G^T 1, db>       =>  dL/db = sum_n G[n, :]  (column sums)

    dL/dW = X^T G sums the outer products x_n g_n^T over every sample *and* every token in one
    GEMM: flattening first is what makes it one call instead of a loop (and a batched matmul).
    ``W.T`` and ``X.T`` are views: BLAS reads them transposed, nothing is copied.

    ``activation="gelu"``: y = GELU(U), U = X W + 1 b^T (an MLP's first layer). The bias add,
    GELU and its derivative GELU'(U) run in one pass over U, in U's memory (``gelu_epilogue``),
    and backward first forms dL/dU = G * GELU'(U) (the GELU rule, see ``GELU``), then applies
    the three rules above with dL/dU in place of G. The result equals ``gelu(linear(x, W, b))``
    (a test checks it), with one large array and two passes over it fewer.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None, activation=None):
        _check_shapes(x, weight, bias, activation=activation)
        d_in, d_out = weight.shape
        x2 = x.reshape(-1, d_in)  # a view when x is contiguous
        y = x2 @ weight
        dydu = None
        if activation == "gelu":
            y, dydu = gelu_epilogue(y, bias, want_derivative=any(ctx.needs_input_grad))
        elif bias is not None:
            y += bias
        ctx.save_for_backward(x2, weight, dydu)
        ctx.x_shape = x.shape
        ctx.has_bias = bias is not None
        return y.reshape(x.shape[:-1] + (d_out,))

    @staticmethod
    def backward(ctx, grad):
        x2, weight, dydu = ctx.pop_saved()
        need_x, need_w, need_b = ctx.needs_input_grad
        g2 = grad.reshape(-1, weight.shape[1])
        if dydu is not None:  # dL/dU = G * GELU'(U), into the saved derivative when it is its last use
            g2 = array_module(g2).multiply(g2, dydu, out=None if ctx.retain_graph else dydu)
        dw = x2.T @ g2 if need_w else None
        del x2, dydu          # X is no longer needed: on the last backward its memory is free now
        dx = (g2 @ weight.T).reshape(ctx.x_shape) if need_x else None
        db = column_sum(g2) if (need_b and ctx.has_bias) else None
        return dx, dw, db


class AxisLinear(Function):
    r"""The map of ``Linear`` applied along axis ``axis`` of x instead of the last one.

    x (A..., S, R...) with S = x.shape[axis], W (S, D), b (D,) -> y (A..., D, R...):

        y[a, d, r] = sum_s W[s, d] x[a, s, r] + b[d].

    Merge the axes before ``axis`` into one of size A and those after it into one of size R:
    x is then a stack of A matrices X_a (S, R) (a view, no copy) and each output is

        Y_a = W^T X_a + b 1^T          (D, R).

    Backward: the rules of ``Linear`` with rows and columns swapped. With G_a = dL/dY_a,
    dY_a = W^T dX_a + dW^T X_a + db 1^T gives

        <G_a, W^T dX_a>  = <W G_a, dX_a>     =>  dL/dX_a = W G_a               (S, R)
        <G_a, dW^T X_a>  = <X_a G_a^T, dW>   =>  dL/dW   = sum_a X_a G_a^T     (S, D)
        <G_a, db 1^T>    = <G_a 1, db>       =>  dL/db   = sum_a G_a 1         (row sums)

    Why: MLP-Mixer's token-mixing MLP acts on the token axis of activations (B, S, C). Moving
    tokens last costs a transposed copy of every activation and of every gradient (each about
    as slow as a matrix product of that size), and ``linear(x.swapaxes(-1, -2), W, b)
    .swapaxes(-1, -2)`` is the reference this op is tested against. Here W^T multiplies x
    from the left instead, where x lies. On a token-major activation (S, B, C) (``axis=0``,
    A = 1) the whole batch is ONE matrix product (D, S) @ (S, B*C); for ``axis=1`` of (B, S, C)
    it is a batched product (B smaller ones, slower than one large one).
    ``activation="gelu"`` works as in ``Linear``.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None, axis=0, activation=None):
        axis = _check_shapes(x, weight, bias, axis, activation)
        xp = array_module(x)
        s, d = weight.shape
        lead, trail = x.shape[:axis], x.shape[axis + 1:]
        x3 = x.reshape(math.prod(lead), s, math.prod(trail))  # a view when x is contiguous
        y = xp.matmul(weight.T, x3)                              # W^T X_a for every a: (A, D, R)
        dydu = None
        if activation == "gelu":   # with A = 1 the rows of the (D, R) matrix are the bias's rows
            u = y[0] if y.shape[0] == 1 else y
            u, dydu = gelu_epilogue(u, bias[:, None] if bias is not None else None,
                                    want_derivative=any(ctx.needs_input_grad))
            y = u.reshape(y.shape)
            dydu = dydu.reshape(y.shape) if dydu is not None else None
        elif bias is not None:
            y += bias[:, None]
        ctx.save_for_backward(x3, weight, dydu)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.reshape(lead + (d,) + trail)

    @staticmethod
    def backward(ctx, grad):
        x3, weight, dydu = ctx.pop_saved()
        need_x, need_w, need_b = ctx.needs_input_grad
        xp = array_module(grad)
        a, _, r = x3.shape
        g3 = grad.reshape(a, weight.shape[1], r)
        if dydu is not None:  # dL/dU = G * GELU'(U), as in Linear
            g3 = xp.multiply(g3, dydu, out=None if ctx.retain_graph else dydu)
        dw = xp.matmul(x3, g3.swapaxes(1, 2)).sum(axis=0) if need_w else None   # sum_a X_a G_a^T
        del x3, dydu          # as in Linear: free X before allocating dL/dX
        dx = xp.matmul(weight, g3).reshape(ctx.x_shape) if need_x else None
        db = None
        if need_b and ctx.has_bias:
            db = (g3 @ xp.ones(r, dtype=g3.dtype)).sum(axis=0)                   # sum_a G_a 1
        return dx, dw, db


ACTIVATIONS = (None, "gelu")


def _check_shapes(x, weight, bias, axis=-1, activation=None):
    """Shapes must agree exactly: a mismatch is a bug, not something to broadcast away.
    Returns ``axis`` as a non-negative index."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: unknown activation {activation!r}, expected one of {ACTIVATIONS}")
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (in_features, out_features), got shape {tuple(weight.shape)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"linear: axis {axis} is out of range for an input of shape {tuple(x.shape)}")
    axis %= x.ndim
    if x.shape[axis] != weight.shape[0]:
        where = "last axis" if axis == x.ndim - 1 else f"axis {axis}"
        raise ValueError(
            f"linear: input of shape {tuple(x.shape)} has {x.shape[axis]} features in its {where}, "
            f"but weight of shape {tuple(weight.shape)} expects {weight.shape[0]} "
            "(weight is (in_features, out_features))"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[1],):
        raise ValueError(
            f"linear: bias of shape {tuple(bias.shape)} does not match weight of shape {tuple(weight.shape)}; "
            f"expected ({weight.shape[1]},)"
        )
    dtypes = {a.dtype for a in (x, weight, bias) if a is not None}
    if len(dtypes) > 1:
        raise TypeError(
            f"linear: input, weight and bias must share one dtype, got "
            f"{', '.join(str(a.dtype) for a in (x, weight, bias) if a is not None)}; convert with .astype()"
        )
    return axis


def linear(x, weight, bias=None, axis=-1, activation=None):
    """``x @ weight + bias`` over the last axis of ``x`` (any rank); ``weight`` is (in, out).

    ``axis`` applies the same map along another axis of ``x`` (that axis has in_features
    entries and gets out_features; the others are untouched), without moving it last.
    ``activation="gelu"`` returns ``gelu(x @ weight + bias)`` (tanh form), fused: one pass over
    the output for bias, GELU and its derivative, in the output's memory.
    """
    if activation is not None:
        activation = str(activation).lower()
    if axis == -1 or axis == x.ndim - 1:
        return Linear.apply(x, weight, bias, activation=activation)
    return AxisLinear.apply(x, weight, bias, axis=axis, activation=activation)

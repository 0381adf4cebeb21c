"""The affine map ``y = x W + b`` over the last axis of an input of any rank.

``W`` has shape ``(in_features, out_features)``: the papers' ``XU`` convention, so the
forward pass reads like the math and needs no transpose.

Fast tier: ``tinymlp/fast/linear.py`` (one matrix product whatever the memory layout of x,
so that MLP-Mixer's token mixing on a transposed view costs no copy).
"""

from __future__ import annotations

from ..autograd import Function

__all__ = ["Linear", "linear"]


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
    product: flattening first is what makes it one call instead of a loop.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        check_shapes(x, weight, bias)
        X = x.reshape(-1, weight.shape[0])                # (N, D_in)
        Y = X @ weight                                    # (N, D_out)
        if bias is not None:
            Y = Y + bias
        ctx.save_for_backward(X, weight)
        ctx.x_shape = x.shape
        return Y.reshape(x.shape[:-1] + (weight.shape[1],))

    @staticmethod
    def backward(ctx, grad):
        X, weight = ctx.saved_tensors
        G = grad.reshape(-1, weight.shape[1])             # (N, D_out)
        dX = (G @ weight.T).reshape(ctx.x_shape)          # G W^T
        dW = X.T @ G                                      # X^T G
        db = G.sum(axis=0)                                # 1^T G
        return dX, dW, db


def check_shapes(x, weight, bias):
    """Shapes must agree exactly: a mismatch is a bug, not something to broadcast away."""
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (in_features, out_features), got shape {tuple(weight.shape)}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"linear: input of shape {tuple(x.shape)} has {x.shape[-1] if x.ndim else 'no'} features in its last "
            f"axis, but weight of shape {tuple(weight.shape)} expects {weight.shape[0]} "
            "(weight is (in_features, out_features))"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[1],):
        raise ValueError(
            f"linear: bias of shape {tuple(bias.shape)} does not match weight of shape {tuple(weight.shape)}; "
            f"expected ({weight.shape[1]},)"
        )
    dtypes = [a.dtype for a in (x, weight, bias) if a is not None]
    if len(set(dtypes)) > 1:
        raise TypeError(
            f"linear: input, weight and bias must share one dtype, got {', '.join(map(str, dtypes))}; "
            "convert with .astype()"
        )


def linear(x, weight, bias=None):
    """``x @ weight + bias`` over the last axis of ``x`` (any rank); ``weight`` is (in, out).

    To mix along another axis, move it last (``x.swapaxes(-1, k)``): the fast tier reads the
    transposed view in place, without a copy.
    """
    return Linear.apply(x, weight, bias)

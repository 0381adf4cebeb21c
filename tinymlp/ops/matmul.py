"""Matrix product with NumPy's ``@`` semantics (batched over leading axes, which broadcast)."""

from __future__ import annotations

from ..autograd import Function, unbroadcast


def _mT(x):
    return x.swapaxes(-1, -2)


class MatMul(Function):
    """out = a @ b.  For matrices: dL/da = g @ b^T,  dL/db = a^T @ g.

    Batched inputs use the same formulas per batch element; a batch axis that was broadcast
    (e.g. one weight matrix for every sample) gets its gradient summed by ``unbroadcast``.
    A 1-D operand is treated as a row (a) or column (b) vector, as NumPy does.
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        da, db = ctx.needs_input_grad
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        if b.ndim == 1:  # restore the column axis the product dropped
            g = g[..., None]
        if a.ndim == 1:  # restore the row axis
            g = g.reshape(g.shape[:-1] + (1, g.shape[-1]))
        grad_a = unbroadcast(g @ _mT(b2), a2.shape).reshape(a.shape) if da else None
        if db and b2.ndim == 2 and a2.ndim > 2:
            # one matrix shared by a batch: sum_batch a^T g is ONE product of the flattened batch,
            # not a stack of products summed afterwards
            grad_b = (a2.reshape(-1, a2.shape[-1]).T @ g.reshape(-1, g.shape[-1])).reshape(b.shape)
        else:
            grad_b = unbroadcast(_mT(a2) @ g, b2.shape).reshape(b.shape) if db else None
        return grad_a, grad_b

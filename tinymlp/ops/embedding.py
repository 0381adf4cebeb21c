"""Embedding lookup: token ids pick rows of a table, so backward sends each upstream row back
to the table row it was read from (a scatter-add)."""

from __future__ import annotations

from ..autograd import Function
from ..backend import array_module
from ..tensor import Tensor


class Embedding(Function):
    r"""out = E[ids]:  out[..., :] = E[ids[...], :],  E (V, D), ids integer (...), out (..., D).

    Backward. Write the lookup as a product with one-hot rows: out_n = sum_v [ids_n = v] E_v for
    every position n (flatten the leading axes of ids). Then

        dL/dE_v = sum_n [ids_n = v] g_n,          g = dL/dout  (..., D)

    the sum of the upstream rows of every position that read row v. A token that appears
    twice gets both contributions, so the scatter must *add*: ``grad[ids] += g`` would keep
    only one of them (buffered fancy-index assignment), ``xp.add.at(grad, ids, g)`` adds each.
    Rows no position read get zero. ``ids`` are constants: they have no gradient.
    """

    @staticmethod
    def forward(ctx, weight, ids):
        ctx.ids, ctx.num_embeddings = ids, weight.shape[0]
        return weight[ids]                                  # a gather: (..., D)

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        grad = xp.zeros((ctx.num_embeddings,) + g.shape[-1:], dtype=g.dtype)
        xp.add.at(grad, ctx.ids, g)                         # the scatter-add of dL/dE_v above
        return grad


def embedding(weight, ids):
    """Rows of ``weight`` (V, D) picked by the integer ``ids`` (any shape): (*ids.shape, D).

    An id outside [0, V) is an error (NumPy would silently wrap a negative one); the check runs on
    CPU arrays only, so that a GPU step never waits for it."""
    xp = array_module(weight.data if isinstance(weight, Tensor) else weight)
    ids = ids.data if isinstance(ids, Tensor) else xp.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding: ids must be integers, got dtype {ids.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be a (num_embeddings, dim) table, got shape {tuple(weight.shape)}")
    V = weight.shape[0]
    # a host check: on a GPU reading min/max back would stall every step (as cross_entropy's ids)
    if ids.size and type(ids).__module__ == "numpy" and (int(ids.min()) < 0 or int(ids.max()) >= V):
        raise IndexError(f"embedding: ids must lie in [0, {V}) for a table of {V} rows, "
                         f"got values in [{int(ids.min())}, {int(ids.max())}]")
    return Embedding.apply(weight, ids=ids)

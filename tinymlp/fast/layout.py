"""Memory layouts: reading an array as a matrix without copying it, whatever its strides.

A transposed view (``x.swapaxes(1, 2)``, a token-major array seen as (B, S, C)) is contiguous
in *some* order of its axes: ``memory_order(x)`` finds that order, from the largest stride to
the smallest, and ``x.transpose(order)`` is then C-contiguous, so it reshapes to a matrix for
free. An op computes on that view and writes its result in the same order, so the next op
finds its input laid out the same way: layouts propagate, nothing is copied.
"""

from __future__ import annotations

import functools

from ..backend import array_module

__all__ = ["as_matrix", "empty_like", "empty_token_major", "inverse", "memory_order", "rows", "same_layout",
           "token_major_view"]


def memory_order(x):
    """The axes of ``x`` from the largest stride to the smallest (ties keep their order); for a
    C-contiguous x, its own order."""
    if x.flags.c_contiguous:
        return tuple(range(x.ndim))
    return tuple(sorted(range(x.ndim), key=lambda i: -x.strides[i]))


@functools.lru_cache(maxsize=256)
def inverse(order):
    """The permutation that undoes ``order``."""
    inv = [0] * len(order)
    for i, axis in enumerate(order):
        inv[axis] = i
    return tuple(inv)


def as_matrix(x):
    """``(X, order, kind)``: x as a 2-D view, with the feature axis (the last) as

    * kind "rows": X (N, D), one row per position, when the features are the fastest axis in
      memory (the usual C order, or a permutation of the leading axes);
    * kind "columns": X (D, N), one column per position, when the features are the *slowest*
      axis (a transposed view, such as the token axis of MLP-Mixer's ``x.swapaxes(1, 2)``).

    ``order`` is the axis order in which X was read. Any other layout is copied to C order.
    """
    order = memory_order(x)
    xt = x.transpose(order)
    last = x.ndim - 1
    if xt.flags.c_contiguous and order[-1] == last:
        return xt.reshape(-1, x.shape[-1]), order, "rows"
    if xt.flags.c_contiguous and order[0] == last:
        return xt.reshape(x.shape[-1], -1), order, "columns"
    x = array_module(x).ascontiguousarray(x)
    return x.reshape(-1, x.shape[-1]), tuple(range(x.ndim)), "rows"


def same_layout(a, order):
    """``a.transpose(order)`` as a C-contiguous array: a view when ``a`` is laid out in ``order``."""
    return array_module(a).ascontiguousarray(a.transpose(order))


def rows(a, order):
    """``a`` (..., D) as an (N, D) matrix of rows taken in the axis order ``order`` (last axis last)."""
    return same_layout(a, order).reshape(-1, a.shape[-1])


def empty_like(x):
    """A new array of x's shape and dtype, laid out in x's memory order when x is contiguous in
    some order (``empty_like``'s order "K"), else C-contiguous."""
    return array_module(x).empty_like(x)


def token_major_view(a):
    """(B, S, .) <-> (S, B, .): the token-major view of a sequence of tokens (the patch embedding
    lays its output out token-major in memory, and every fast op keeps that layout)."""
    return a.transpose(1, 0, 2)


def empty_token_major(shape, token_major_in_memory, xp, dtype):
    """A new (B, S, .) array of ``shape``, token-major in memory when ``token_major_in_memory``."""
    if token_major_in_memory:
        return token_major_view(xp.empty((shape[1], shape[0], shape[2]), dtype=dtype))
    return xp.empty(shape, dtype=dtype)

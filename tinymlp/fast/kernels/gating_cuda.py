"""The spatial gating unit's split gate on CUDA: F and z1 * F in one elementwise pass forward,
G * F and G * z1 in one backward (the fast ``SpatialGating`` calls them on CUDA).

Split variant of ops/gating.py: F = (W_eff @ xhat) * gamma + shift (+ A),  out = z1 * F, where
shift = rowsum(W_eff)[:, None] * beta + bias[:, None] is an (S, e) matrix. Backward:
dL/dz1 = G * F and G_F = G * z1. ``f`` is an output parameter that the kernel also reads
(CuPy binds output parameters by reference), so F overwrites W_eff @ xhat in place.
"""

from __future__ import annotations

import numpy as np

from .. import cuda

__all__ = ["sgu_gate_backward", "sgu_gate_forward"]


def _sgu_forward_kernel(with_residual):
    if with_residual:
        return cuda.elementwise("T gamma, T shift, T a, T z1", "T f, T out",
                                "f = f * gamma + shift + a; out = z1 * f;", "tinymlp_sgu_gate_residual")
    return cuda.elementwise("T gamma, T shift, T z1", "T f, T out",
                            "f = f * gamma + shift; out = z1 * f;", "tinymlp_sgu_gate")


def _sgu_backward_kernel():
    return cuda.elementwise("T g, T f, T z1", "T dz1, T gf", "dz1 = g * f; gf = g * z1;", "tinymlp_sgu_gate_backward")


def sgu_gate_forward(f, gamma, shift, z1, gate_residual=None, out=None):
    """In one pass: ``f <- f * gamma + shift (+ gate_residual)`` (in place) and ``out = z1 * f``.

    f: (B, S, e) holding W_eff @ xhat on entry and F on return; gamma (e,); shift (S, e);
    z1 (B, S, e), may be a view (the first half of z); gate_residual (B, S, e) or None.
    Returns ``out`` (B, S, e): the array given (any layout: the kernel writes through its
    strides), or a new one.
    """
    cp = cuda.cupy()
    cuda.check("sgu_gate_forward", f, gamma, shift, z1, gate_residual, out)
    if out is None:
        out = cp.empty(f.shape, dtype=f.dtype)
    if gate_residual is None:
        _sgu_forward_kernel(False)(gamma, shift, z1, f, out)
    else:
        _sgu_forward_kernel(True)(gamma, shift, gate_residual, z1, f, out)
    return out


def sgu_gate_backward(g, f, z1, dz1=None):
    """In one pass: ``dz1 = g * f`` and ``gF = g * z1``; returns ``(dz1, gF)``.

    ``dz1``: where to write dL/dz1 (e.g. the view ``dz[..., :e]`` of the whole gradient); a new
    array when None.
    """
    cp = cuda.cupy()
    cuda.check("sgu_gate_backward", g, f, z1, dz1)
    if dz1 is None:
        dz1 = cp.empty(f.shape, dtype=f.dtype)
    gf = cp.empty(f.shape, dtype=f.dtype)
    _sgu_backward_kernel()(g, f, z1, dz1, gf)
    return dz1, gf


@cuda.self_test
def _self_test(dtype):
    cp = cuda.cupy()
    rng = np.random.default_rng(0)
    f, z1, a, g = (rng.standard_normal((2, 3, 5)) for _ in range(4))
    gamma, shift = rng.standard_normal(5), rng.standard_normal((3, 5))
    dev = lambda v: cp.asarray(v, dtype=dtype)   # noqa: E731
    f1, f2 = dev(f), dev(f)
    out = sgu_gate_forward(f1, dev(gamma), dev(shift), dev(z1))
    out_a = sgu_gate_forward(f2, dev(gamma), dev(shift), dev(z1), gate_residual=dev(a))
    dz1, gf = sgu_gate_backward(dev(g), dev(f), dev(z1))
    F = f * gamma + shift
    return [("the gate", out, z1 * F), ("the gate's F", f1, F), ("the gate with a residual", out_a, z1 * (F + a)),
            ("the gate's backward (dz1)", dz1, g * f), ("the gate's backward (gF)", gf, g * z1)]

"""Elementwise primitives. Binary ops broadcast as NumPy does; backward sums each gradient
back to its input's shape with ``unbroadcast`` (the adjoint of broadcasting).

Notation: ``g`` is dL/d(out), the gradient arriving from above. Each backward returns
dL/d(input) = g * d(out)/d(input), elementwise.
"""

from __future__ import annotations

from ..autograd import Function, unbroadcast
from ..backend import array_module


def _shape(x):
    return getattr(x, "shape", ())


class Add(Function):
    """out = a + b;  dL/da = g,  dL/db = g  (each summed over its broadcast axes)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = _shape(a), _shape(b)
        return a + b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        da, db = ctx.needs_input_grad
        return (unbroadcast(g, sa) if da else None, unbroadcast(g, sb) if db else None)


class Sub(Function):
    """out = a - b;  dL/da = g,  dL/db = -g."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = _shape(a), _shape(b)
        return a - b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        da, db = ctx.needs_input_grad
        return (unbroadcast(g, sa) if da else None, unbroadcast(-g, sb) if db else None)


class Mul(Function):
    """out = a * b;  dL/da = g * b,  dL/db = g * a."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        da, db = ctx.needs_input_grad
        return (
            unbroadcast(g * b, _shape(a)) if da else None,
            unbroadcast(g * a, _shape(b)) if db else None,
        )


class Div(Function):
    """out = a / b;  dL/da = g / b,  dL/db = -g * a / b**2 = -g * out / b."""

    @staticmethod
    def forward(ctx, a, b):
        out = a / b
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = ctx.saved_tensors
        da, db = ctx.needs_input_grad
        return (
            unbroadcast(g / b, _shape(a)) if da else None,
            unbroadcast(-g * out / b, _shape(b)) if db else None,
        )


class Pow(Function):
    """out = a ** b;  dL/da = g * b * a**(b-1),  dL/db = g * out * log(a)  (a > 0 there)."""

    @staticmethod
    def forward(ctx, a, b):
        out = a * a if (not hasattr(b, "shape") and b == 2) else a**b
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = ctx.saved_tensors
        xp = array_module(g)
        da, db = ctx.needs_input_grad
        grad_a = grad_b = None
        if da:
            local = 2 * a if (not hasattr(b, "shape") and b == 2) else b * xp.power(a, b - 1)
            grad_a = unbroadcast(g * local, _shape(a))
        if db:
            grad_b = unbroadcast(g * out * xp.log(xp.asarray(a, dtype=out.dtype)), _shape(b))
        return grad_a, grad_b


class Neg(Function):
    """out = -x;  dL/dx = -g."""

    @staticmethod
    def forward(ctx, x):
        return -x

    @staticmethod
    def backward(ctx, g):
        return -g


class Exp(Function):
    """out = exp(x);  dL/dx = g * out  (save the output, not x)."""

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).exp(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * out


class Log(Function):
    """out = log(x);  dL/dx = g / x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return array_module(x).log(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g / x


class Sqrt(Function):
    """out = sqrt(x);  dL/dx = g / (2 out)."""

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).sqrt(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g / (2 * out)


class Tanh(Function):
    """out = tanh(x);  dL/dx = g * (1 - out**2)."""

    @staticmethod
    def forward(ctx, x):
        out = array_module(x).tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * (1 - out * out)


class Sigmoid(Function):
    """out = 1 / (1 + exp(-x)), computed stably as (1 + tanh(x/2)) / 2;
    dL/dx = g * out * (1 - out)."""

    @staticmethod
    def forward(ctx, x):
        out = 0.5 * (1 + array_module(x).tanh(0.5 * x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * out * (1 - out)


class ReLU(Function):
    """out = max(x, 0);  dL/dx = g where x > 0, else 0 (the subgradient 0 at the kink)."""

    @staticmethod
    def forward(ctx, x):
        positive = x > 0
        ctx.save_for_backward(positive)
        return x * positive

    @staticmethod
    def backward(ctx, g):
        (positive,) = ctx.saved_tensors
        return g * positive


class Where(Function):
    """out = a where cond else b;  dL/da = g where cond,  dL/db = g where not cond."""

    @staticmethod
    def forward(ctx, cond, a, b):
        xp = array_module(cond)  # a or b may be a Python scalar; cond is always an array
        ctx.save_for_backward(cond)
        ctx.shapes = _shape(a), _shape(b)
        return xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        (cond,) = ctx.saved_tensors
        sa, sb = ctx.shapes
        _, da, db = ctx.needs_input_grad
        zero = g.dtype.type(0)
        xp = array_module(g)
        return (
            None,
            unbroadcast(xp.where(cond, g, zero), sa) if da else None,
            unbroadcast(xp.where(cond, zero, g), sb) if db else None,
        )


class AsType(Function):
    """out = x cast to ``dtype``;  dL/dx = g cast back to x's dtype."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.dtype), None

"""Planted bugs that gradcheck used to misdiagnose, each with the words its report must now say.

A student trial found these: a forgotten mask taken for float32 rounding, one wrong element
that the default sampled mode let pass, and bugs that got no ``likely`` line (or a wrong one):
a LayerNorm backward whose row-mean terms are off, swapped halves of a split, gradients returned
in the wrong order, a gradient not summed over the axis its input was broadcast along, a
downcast called an upcast, a backward that changes its incoming gradient or a saved array in
place, and a multi-path backward (the spatial gating unit) with W where W.T belongs.
"""

import numpy as np
import pytest

import tinymlp
from tinymlp import Function, gradcheck


def leaf(shape, seed=0, scale=1.0):
    data = np.random.default_rng(seed).normal(size=shape) * scale
    return tinymlp.tensor(data, requires_grad=True, dtype="float64")


def failing(fn, inputs, **options):
    report = gradcheck(fn, inputs, raise_on_fail=False, **options)
    assert not report.passed, report.summary()
    return report


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def normalize(x, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mu) * r, r


# ----------------------------------------------------------------------------- a mask forgotten in backward


class CausalSoftmaxNoMask(Function):
    """softmax over the last axis of causally masked scores; backward gives the masked scores a gradient."""

    @staticmethod
    def forward(ctx, s):
        keep = np.tril(np.ones(s.shape[-2:], dtype=bool))
        p = softmax(np.where(keep, s, -np.inf))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (g * p).sum(axis=-1, keepdims=True)) + 0.1 * g * (p == 0)


class MaskedSumNoMask(Function):
    """y[b] = sum of the real tokens x[b, s] (mask[b, s] True); backward spreads g over the padding too."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask)
        return (x * mask[..., None]).sum(axis=1)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return np.broadcast_to(g[:, None, :], mask.shape + g.shape[-1:]).copy(), None


MASK = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=bool)


@pytest.mark.parametrize("fn, inputs, ignored", [
    (CausalSoftmaxNoMask.apply, (leaf((2, 4, 4), 1),), 12),
    (lambda x: MaskedSumNoMask.apply(x, MASK), (leaf((2, 4, 3), 2),), 9),
], ids=["causal", "padding"])
def test_a_mask_missing_in_backward_is_not_called_float32(fn, inputs, ignored):
    report = failing(fn, inputs)
    result = next(iter(report.per_tensor.values()))
    assert "low_precision" not in report.hint_kinds, report.summary()
    assert result.hint_kind == "ignored_by_forward"
    assert "backward gives a gradient where forward has none (a mask or tril missing?)" in result.hint
    assert f"{ignored} of {ignored} failing elements" in result.pattern, result.pattern
    assert "leaves the loss exactly unchanged" in result.pattern


def test_float32_inside_forward_is_still_named_as_such():
    class Tanh32(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return np.tanh(x.astype(np.float32)).astype(x.dtype)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (1 - np.tanh(x) ** 2)

    report = gradcheck(Tanh32.apply, (leaf((4, 5), 3),), raise_on_fail=False)
    assert report.per_tensor["x"].hint_kind == "low_precision"


# ----------------------------------------------------------------------------- sampled mode


class TanhOneElementOff(Function):
    """tanh; the bug: one interior element of the gradient is 3x too large."""

    where = (150, 150)

    @staticmethod
    def forward(ctx, x):
        y = np.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        d = g * (1 - y * y)
        d[TanhOneElementOff.where] *= 3
        return d


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.slow
def test_sampled_mode_does_not_pass_one_interior_element_off(seed):
    x = leaf((300, 300), seed)   # seed 4: the element's gradient is small, and the old sampling passed it
    report = failing(TanhOneElementOff.apply, (x,), seed=seed)
    result = report.per_tensor["x"]
    assert result.mode.startswith("sampled") and result.verdict == "FAIL"
    assert result.worst[0].index == (150, 150), report.summary()   # found, not only suspected
    assert "x[150, 150]" in result.pattern


def test_a_sampled_pass_says_which_errors_it_rules_out():
    report = gradcheck(lambda x: tinymlp.tanh(x), (leaf((300, 300), 3),))
    assert report.passed
    text = report.summary()
    assert "every element is in one of" in text and "an element off by more than" in text


# ----------------------------------------------------------------------------- row terms of a normalisation


class LayerNormMeanTermsOverD(Function):
    """x_hat = (x - mean) / std over the last axis; the bug: both mean terms divided by D again."""

    @staticmethod
    def forward(ctx, x):
        xh, r = normalize(x)
        ctx.save_for_backward(xh, r)
        return xh

    @staticmethod
    def backward(ctx, g):
        xh, r = ctx.saved_tensors
        D = xh.shape[-1]
        return r * (g - g.mean(axis=-1, keepdims=True) / D - xh * (g * xh).mean(axis=-1, keepdims=True) / D)


class LayerNormNoMeanTerm(LayerNormMeanTermsOverD):
    """The bug: the - mean(g) term is missing (an error constant along each row)."""

    @staticmethod
    def backward(ctx, g):
        xh, r = ctx.saved_tensors
        return r * (g - xh * (g * xh).mean(axis=-1, keepdims=True))


def test_layernorm_mean_terms_divided_by_d_twice():
    result = failing(LayerNormMeanTermsOverD.apply, (leaf((3, 6), 3, 2.0),)).per_tensor["x"]
    assert result.hint_kind == "row_terms", result.hint
    assert "a combination of 1 and the row's normalised values" in result.pattern
    assert "the row-mean terms of a normalisation's backward are off" in result.hint
    assert "divided by D twice" in result.hint


def test_layernorm_missing_row_mean_term():
    result = failing(LayerNormNoMeanTerm.apply, (leaf((3, 6), 3, 2.0),)).per_tensor["x"]
    assert result.hint_kind == "row_constant", result.hint
    assert "constant along axis 1 in each row" in result.pattern
    assert "a term like g.mean(axis=1, keepdims=True) is missing or extra" in result.hint


# ----------------------------------------------------------------------------- order and shape


class GateHalvesSwapped(Function):
    """y = z1 * tanh(z2) on z = [z1 | z2]; the bug: backward concatenates [dz2, dz1]."""

    @staticmethod
    def forward(ctx, z):
        e = z.shape[-1] // 2
        ctx.save_for_backward(z)
        return z[..., :e] * np.tanh(z[..., e:])

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        e = z.shape[-1] // 2
        t = np.tanh(z[..., e:])
        return np.concatenate([g * z[..., :e] * (1 - t * t), g * t], axis=-1)


def test_swapped_halves_of_a_split():
    result = failing(GateHalvesSwapped.apply, (leaf((2, 3, 6), 4),)).per_tensor["z"]
    assert result.hint_kind == "swapped_halves", result.hint
    assert "the two halves of 'z' along axis 2 are swapped" in result.hint
    assert "unrelated" not in result.hint


class LinearGradientsSwapped(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return x.T @ g, g @ w.T


def test_gradients_in_the_wrong_order_with_different_shapes():
    report = failing(LinearGradientsSwapped.apply, (leaf((5, 4), 5), leaf((4, 3), 6)))
    x, w = report.per_tensor["x"], report.per_tensor["w"]
    assert x.hint_kind == w.hint_kind == "wrong_order"
    assert "the gradient returned for 'x' has the shape of 'w' (4, 3)" in x.hint
    assert "return one gradient per input in forward's order (x, w)" in x.hint


class ColumnBias(Function):
    """y = x + b[:, None] with b of shape (5,); the bug: b's gradient is g itself, (5, 3)."""

    @staticmethod
    def forward(ctx, x, b):
        return x + b[:, None]

    @staticmethod
    def backward(ctx, g):
        return g, g


def test_a_gradient_to_sum_over_an_inner_axis_names_the_axis():
    result = failing(ColumnBias.apply, (leaf((5, 3), 5), leaf((5,), 6))).per_tensor["b"]
    assert result.hint_kind == "broadcast_not_summed"
    assert "sum the gradient over axis 1 (g.sum(axis=1))" in result.hint


class SineDowncast(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (g * np.cos(x)).astype(np.float32)


def test_a_downcast_in_backward_is_called_a_downcast():
    report = failing(SineDowncast.apply, (leaf((3, 4), 7),))
    result, text = report.per_tensor["x"], report.summary()
    assert "upcast" not in text
    assert "downcast" in result.pattern and "a float32 gradient for a float64 input" in result.hint


# ----------------------------------------------------------------------------- in-place changes in backward


class SineInPlaceUpstream(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g *= np.cos(x)
        return g


class TanhInPlaceSaved(Function):
    @staticmethod
    def forward(ctx, x):
        y = np.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        y *= y
        return g * (1 - y)


def test_backward_changing_its_incoming_gradient_in_place_fails():
    report = failing(SineInPlaceUpstream.apply, (leaf((3, 4), 7),))
    assert "mutated_upstream" in report.hint_kinds
    assert ("SineInPlaceUpstream.backward changed its incoming gradient in place (g *= ..., g[...] = ...)"
            in report.summary())


def test_backward_changing_a_saved_array_in_place_fails():
    report = failing(TanhInPlaceSaved.apply, (leaf((3, 4), 7),))
    assert "mutated_saved" in report.hint_kinds
    assert ("TanhInPlaceSaved.backward changed ctx.saved_tensors[0] in place" in report.summary())


# ----------------------------------------------------------------------------- several paths: the SGU


class SGUWrongW(Function):
    """The split SGU on z = [z1 | z2]; the bug: dN = W dF where W.T dF belongs."""

    @staticmethod
    def forward(ctx, z, weight, bias, gamma, beta):
        e = z.shape[-1] // 2
        z1, z2 = z[..., :e], z[..., e:]
        nh, r = normalize(z2)
        n = gamma * nh + beta
        f = np.einsum("ij,bjc->bic", weight, n) + bias[:, None]
        ctx.save_for_backward(z1, f, n, nh, r, weight, gamma)
        return z1 * f

    @staticmethod
    def backward(ctx, grad):
        z1, f, n, nh, r, weight, gamma = ctx.saved_tensors
        df = grad * z1
        dweight = np.einsum("bic,bjc->ij", df, n)
        dn = np.einsum("ji,bic->bjc", weight, df)          # the bug: W dF
        g = dn * gamma
        dz2 = r * (g - g.mean(axis=-1, keepdims=True) - nh * (g * nh).mean(axis=-1, keepdims=True))
        return (np.concatenate([grad * f, dz2], axis=-1), dweight, df.sum(axis=(0, 2)),
                (dn * nh).sum(axis=(0, 1)), dn.sum(axis=(0, 1)))


def test_sgu_failures_are_tied_to_their_shared_intermediate():
    inputs = (leaf((2, 5, 6), 8), leaf((5, 5), 9, 0.5), leaf((5,), 10), leaf((3,), 11), leaf((3,), 12))
    report = failing(SGUWrongW.apply, inputs)
    assert [n for n, r in report.per_tensor.items() if r.verdict == "FAIL"] == ["z", "gamma", "beta"]
    for name in ("z", "gamma", "beta"):
        result = report.per_tensor[name]
        assert result.hint_kind == "shared_intermediate", (name, result.hint)
        assert "'z', 'gamma' and 'beta' fail together while 'weight' and 'bias' are right" in result.pattern
        assert "exactly what they would be with 'weight' transposed" in result.hint
        assert "uses weight where it needs weight.T (or the other way round)" in result.hint

"""The fast paths of a CPU training step, each against the readable formula it replaces.

- ``F.linear(x, W, b, axis=k)`` (``AxisLinear``: token mixing without transposing) against
  ``linear`` on the transposed input, transposed back; and its gradients by finite differences;
- ``F.linear(..., activation="gelu")`` (bias, GELU and its derivative fused, in place) against
  ``gelu(linear(x, W, b))``, also over inputs large enough to be processed in chunks;
- the token-major layouts (``token_axis=0``) of the Mixer and gMLP/aMLP blocks and of the
  SGU against the usual (B, S, C) layout;
- the engine keeps no intermediate array alive that backward does not need.
"""

import gc
import math
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import GradcheckError, Tensor, gradcheck, tensor
from tinymlp.models import GMLPBlock, MixerBlock
from tinymlp.ops.activation import _CHUNK
from tinymlp.ops.linear import AxisLinear

seeds = st.integers(0, 2**32 - 1)


def leaf(a, dtype="float64"):
    return tensor(a, requires_grad=True, dtype=dtype)


def np_gelu(u):
    return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))


def np_linear_along(x, w, b, axis):
    """The reference: move ``axis`` last, x @ W + b, move it back."""
    y = np.moveaxis(x, axis, -1) @ w
    if b is not None:
        y = y + b
    return np.moveaxis(y, -1, axis)


# --------------------------------------------------------------------------- linear along an axis
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), where=st.integers(0, 3),
       d_out=st.integers(1, 3), bias=st.booleans(), gelu=st.booleans(), seed=seeds)
def test_linear_along_an_axis_matches_the_transposed_reference_and_gradcheck(shape, where, d_out, bias, gelu, seed):
    rng = np.random.default_rng(seed)
    axis = where % (len(shape) + 1)
    d_in = int(rng.integers(1, 4))
    shape = list(shape)
    shape.insert(axis, d_in)
    x = leaf(rng.normal(size=shape))
    w = leaf(rng.normal(size=(d_in, d_out)) / d_in)    # pre-activations of order 1: GELU's
    b = leaf(0.3 * rng.normal(size=d_out)) if bias else None   # flat tail gives no usable check
    act = "gelu" if gelu else None
    y = F.linear(x, w, b, axis=axis, activation=act)
    expected = np_linear_along(x.numpy(), w.numpy(), None if b is None else b.numpy(), axis)
    if gelu:
        expected = np_gelu(expected)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)
    gradcheck(lambda x, w, b: F.linear(x, w, b, axis=axis, activation=act), (x, w, b), seed=seed)


def test_token_axis_0_is_one_matrix_product_and_matches_axis_1():
    """(S, B, C) with axis 0 and (B, S, C) with axis 1 are the same map, transposed."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3))                     # (B, S, C)
    w, b = rng.normal(size=(5, 4)), rng.normal(size=4)
    y1 = F.linear(tensor(x, dtype="float64"), tensor(w, dtype="float64"), tensor(b, dtype="float64"), axis=1)
    y0 = F.linear(tensor(x.transpose(1, 0, 2).copy(), dtype="float64"), tensor(w, dtype="float64"),
                  tensor(b, dtype="float64"), axis=0)
    np.testing.assert_allclose(y0.numpy().transpose(1, 0, 2), y1.numpy(), rtol=1e-12)
    np.testing.assert_allclose(y1.numpy(), np_linear_along(x, w, b, 1), rtol=1e-12)


def test_axis_linear_weight_gradient_without_the_sum_over_samples_is_caught(monkeypatch):
    rng = np.random.default_rng(1)
    x, w, b = leaf(rng.normal(size=(3, 4, 2))), leaf(rng.normal(size=(4, 3))), leaf(rng.normal(size=3))
    correct = AxisLinear.backward

    def first_sample_only(ctx, grad):
        dx, _, db = correct(ctx, grad)
        x3, weight, _ = ctx.saved_tensors
        g3 = grad.reshape(x3.shape[0], weight.shape[1], x3.shape[2])
        return dx, x3[0] @ g3[0].T, db          # dL/dW from sample 0 only

    monkeypatch.setattr(AxisLinear, "backward", staticmethod(first_sample_only))
    with pytest.raises(GradcheckError):
        gradcheck(lambda x, w, b: F.linear(x, w, b, axis=1), (x, w, b))


def test_linear_rejects_an_unknown_activation_and_a_wrong_axis():
    x, w = tensor(np.ones((2, 3))), tensor(np.ones((3, 4)))
    with pytest.raises(ValueError, match="activation"):
        F.linear(x, w, activation="relu6")
    with pytest.raises(ValueError, match="axis 0"):
        F.linear(x, w, axis=0)


# --------------------------------------------------------------------------- fused GELU epilogue
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_fused_gelu_in_chunks_matches_gelu_of_linear(axis, dtype):
    """Outputs of more than one chunk: every chunk must take its own rows of the bias."""
    rng = np.random.default_rng(2)
    shape = {-1: (300, 7, 40), 0: (40, 3, 700), 1: (3, 40, 700)}[axis]
    x = rng.normal(size=shape)
    w, b = rng.normal(size=(40, 90)) / 6, rng.normal(size=90)
    assert x.size / 40 * 90 > 2 * _CHUNK
    xs = [leaf(x, dtype) for _ in range(2)]
    ws = [leaf(w, dtype) for _ in range(2)]
    bs = [leaf(b, dtype) for _ in range(2)]
    fused = F.linear(xs[0], ws[0], bs[0], axis=axis, activation="gelu")
    plain = F.gelu(F.linear(xs[1], ws[1], bs[1], axis=axis))
    tol = 1e-12 if dtype == "float64" else 2e-5
    assert fused.dtype == np.dtype(dtype)
    np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(fused.numpy(), np_gelu(np_linear_along(x, w, b, axis)), rtol=10 * tol, atol=10 * tol)
    g = rng.normal(size=fused.shape)
    fused.backward(g)
    plain.backward(g)
    for a, c in ((xs[0].grad, xs[1].grad), (ws[0].grad, ws[1].grad), (bs[0].grad, bs[1].grad)):
        np.testing.assert_allclose(a, c, rtol=tol * 10, atol=tol * 10)


def test_fused_gelu_backward_twice_with_retain_graph():
    """The fused backward writes dL/dU into the saved derivative only on its last use."""
    rng = np.random.default_rng(3)
    x, w, b = leaf(rng.normal(size=(6, 4))), leaf(rng.normal(size=(4, 5))), leaf(rng.normal(size=5))
    y = F.linear(x, w, b, activation="gelu").sum()
    y.backward(retain_graph=True)
    first = w.grad.copy()
    y.backward()
    np.testing.assert_allclose(w.grad, 2 * first, rtol=1e-12)


def test_fused_gelu_under_no_grad_computes_no_derivative():
    from tinymlp import no_grad

    x, w = tensor(np.ones((2, 3))), tensor(np.ones((3, 4)), requires_grad=True)
    with no_grad():
        y = F.linear(x, w, activation="gelu")
    assert y._ctx is None
    np.testing.assert_allclose(y.numpy(), np_gelu(np.full((2, 4), 3.0)), rtol=1e-6)


# --------------------------------------------------------------------------- token-major blocks
def _randomize(module, rng):
    module.load_state_dict({k: v + 0.3 * rng.standard_normal(v.shape) for k, v in module.state_dict().items()})
    return module.to(dtype=np.float64)


BLOCKS = {
    "mixer": lambda: MixerBlock(num_tokens=5, dim=6, token_mlp_dim=4, channel_mlp_dim=7),
    "gmlp": lambda: GMLPBlock(seq_len=5, dim=6, ffn_dim=8),
    "amlp": lambda: GMLPBlock(seq_len=5, dim=6, ffn_dim=8, attn_dim=3),
    "gmlp_causal_toeplitz": lambda: GMLPBlock(seq_len=5, dim=6, ffn_dim=8, toeplitz="1d", causal=True),
}


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_token_major_block_matches_the_usual_layout(kind):
    rng = np.random.default_rng(4)
    block = _randomize(BLOCKS[kind](), rng)
    x = rng.normal(size=(3, 5, 6))                                  # (B, S, C)
    xa = Tensor(x, dtype=np.float64, requires_grad=True)
    xb = Tensor(x.transpose(1, 0, 2).copy(), dtype=np.float64, requires_grad=True)
    ya = block(xa)
    yb = block(xb, token_axis=0)
    np.testing.assert_allclose(yb.numpy().transpose(1, 0, 2), ya.numpy(), rtol=1e-12, atol=1e-12)
    g = rng.normal(size=ya.shape)
    grads_a = {}
    ya.backward(g)
    for name, p in block.named_parameters():
        grads_a[name], p.grad = p.grad, None
    yb.backward(g.transpose(1, 0, 2).copy())
    np.testing.assert_allclose(xb.grad.transpose(1, 0, 2), xa.grad, rtol=1e-10, atol=1e-12)
    for name, p in block.named_parameters():
        np.testing.assert_allclose(p.grad, grads_a[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("variant", ["split", "linear", "additive", "multiplicative"])
@pytest.mark.parametrize("residual", [False, True])
def test_spatial_gating_token_major_gradcheck_and_layout(variant, residual):
    rng = np.random.default_rng(5)
    B, S, e = 2, 4, 3
    width = 2 * e if variant == "split" else e
    z = rng.normal(size=(B, S, width))
    params = [leaf(rng.normal(size=(S, S))), leaf(rng.normal(size=S)), leaf(1 + 0.2 * rng.normal(size=e)),
              leaf(0.2 * rng.normal(size=e))]
    a = rng.normal(size=(B, S, e)) if residual else None
    usual = F.spatial_gating(leaf(z), *params, gate_residual=None if a is None else leaf(a), variant=variant)
    zt = leaf(z.transpose(1, 0, 2).copy())
    at = leaf(a.transpose(1, 0, 2).copy()) if residual else None
    major = F.spatial_gating(zt, *params, gate_residual=at, variant=variant, token_axis=0)
    np.testing.assert_allclose(major.numpy().transpose(1, 0, 2), usual.numpy(), rtol=1e-12, atol=1e-12)

    def fn(z, w, b, gamma, beta, a):
        return F.spatial_gating(z, w, b, gamma, beta, gate_residual=a, variant=variant, token_axis=0)

    gradcheck(fn, (zt, *params, at), seed=5)


def test_spatial_gating_token_major_shape_errors_name_the_layout():
    z = tensor(np.ones((4, 2, 6)))
    w, b, g, be = tensor(np.ones((2, 2))), tensor(np.ones(2)), tensor(np.ones(3)), tensor(np.ones(3))
    with pytest.raises(ValueError, match="weight has shape"):
        F.spatial_gating(z, w, b, g, be, token_axis=0)      # 4 tokens, weight (2, 2)
    with pytest.raises(ValueError, match="token_axis"):
        F.spatial_gating(z, w, b, g, be, token_axis=2)


# --------------------------------------------------------------------------- the engine frees early
def test_graph_does_not_keep_intermediate_arrays_backward_does_not_need():
    """h = x + 1 is read by nothing in backward (Add saves nothing): dropping h frees its array."""
    x = leaf(np.arange(3.0))
    h = x + 1.0
    y = (h + 2.0) * 3.0
    data = weakref.ref(h.data) if hasattr(h.data, "__weakref__") else None
    probe = weakref.ref(h)
    del h
    gc.collect()
    assert probe() is None
    if data is not None:
        assert data() is None
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])

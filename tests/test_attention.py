"""F.softmax, F.log_softmax and F.attention (mask, causal, multi-head via leading axes).

Forward values against independent references written here (softmax by its direct formula,
attention by explicit loops over a tiny input); gradients against float64 finite differences
through ``tinymlp.gradcheck``; numerics at logits of 1e4 and at fully masked rows; a backward
that forgets the 1/sqrt(d) scale must be caught.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinymlp.functional as F
from tinymlp import GradcheckError, gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.attention import Attention

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

seeds = st.integers(0, 2**32 - 1)
with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)


def leaf(a, device="cpu", dtype="float64"):
    return tensor(a, requires_grad=True, dtype=dtype, device=device)


# --------------------------------------------------------------------------- references
def reference_softmax(x, axis):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def reference_attention(q, k, v, allowed=None):
    """softmax(q k^T / sqrt(d)) v for one (n, d) x (m, d) x (m, dv) problem, element by element;
    masked keys are left out of the sum; a row with no allowed key averages all of v."""
    n, d = q.shape
    m, dv = v.shape
    out = np.zeros((n, dv))
    for i in range(n):
        keys = [j for j in range(m) if allowed is None or allowed[i, j]]
        if not keys:  # no allowed key: the documented choice is the plain mean of v
            out[i] = [sum(v[j, c] for j in range(m)) / m for c in range(dv)]
            continue
        scores = {j: sum(q[i, c] * k[j, c] for c in range(d)) / math.sqrt(d) for j in keys}
        top = max(scores.values())
        weights = {j: math.exp(s - top) for j, s in scores.items()}
        total = sum(weights.values())
        for c in range(dv):
            out[i, c] = sum(weights[j] * v[j, c] for j in keys) / total
    return out


# --------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_forward_matches_direct_formula(fn, axis, device):
    x = np.random.default_rng(0).normal(size=(3, 4, 5))
    y = getattr(F, fn)(tensor(x, dtype="float64", device=device), axis=axis).numpy()
    expected = reference_softmax(x, axis)
    np.testing.assert_allclose(y, expected if fn == "softmax" else np.log(expected), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_of_huge_logits_is_finite_and_right(dtype, device):
    x = np.array([[1e4, 1e4 - 1.0, 1e4 - 3.0], [-1e4, 1e4, 0.0]])
    p = F.softmax(tensor(x, dtype=dtype, device=device)).numpy()
    logp = F.log_softmax(tensor(x, dtype=dtype, device=device)).numpy()
    assert np.isfinite(p).all() and np.isfinite(logp).all()
    shifted = np.array([[0.0, -1.0, -3.0], [-2e4, 0.0, -1e4]])  # the same rows, shifted by hand
    np.testing.assert_allclose(p, reference_softmax(shifted, -1), rtol=1e-6, atol=1e-30)
    expected_log = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(logp, expected_log, rtol=1e-6)


@with_device
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), log=st.booleans(), seed=seeds,
       data=st.data())
def test_softmax_gradcheck(shape, log, seed, data, device):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = leaf(3 * np.random.default_rng(seed).normal(size=shape), device)
    gradcheck(F.log_softmax if log else F.softmax, (x,), kwargs={"axis": axis}, seed=seed)


def test_softmax_gradcheck_at_large_logits():
    x = leaf(np.array([[1e4, 1e4 - 1.0, 1e4 - 2.0], [30.0, 31.0, 29.5]]))
    gradcheck(F.softmax, (x,))
    gradcheck(F.log_softmax, (x,))


# --------------------------------------------------------------------------- attention
def attention_inputs(rng, lead, n, m, d, dv, device="cpu", dtype="float64"):
    return (
        leaf(rng.normal(size=(*lead, n, d)), device, dtype),
        leaf(rng.normal(size=(*lead, m, d)), device, dtype),
        leaf(rng.normal(size=(*lead, m, dv)), device, dtype),
    )


@pytest.mark.parametrize("option", ["none", "mask", "causal", "mask+causal"])
def test_attention_forward_matches_loops(option, device):
    rng = np.random.default_rng(1)
    B, n, m, d, dv = 2, 4, 5, 3, 2
    q, k, v = attention_inputs(rng, (B,), n, m, d, dv, device)
    mask = rng.random((B, n, m)) > 0.4 if "mask" in option else None
    causal = "causal" in option
    out = F.attention(q, k, v, mask=mask, causal=causal).numpy()
    for b in range(B):
        allowed = np.ones((n, m), dtype=bool) if mask is None else mask[b]
        if causal:
            allowed = allowed & (np.arange(m)[None, :] <= np.arange(n)[:, None])
        expected = reference_attention(q.numpy()[b], k.numpy()[b], v.numpy()[b], allowed)
        np.testing.assert_allclose(out[b], expected, rtol=1e-12, atol=1e-12)


def test_multi_head_attention_is_attention_per_head(device):
    rng = np.random.default_rng(2)
    q, k, v = attention_inputs(rng, (2, 3), 4, 4, 2, 3, device)  # (batch, heads, tokens, d_head)
    out = F.attention(q, k, v, causal=True).numpy()
    causal = np.tril(np.ones((4, 4), dtype=bool))
    for b in range(2):
        for h in range(3):
            expected = reference_attention(q.numpy()[b, h], k.numpy()[b, h], v.numpy()[b, h], causal)
            np.testing.assert_allclose(out[b, h], expected, rtol=1e-12, atol=1e-12)


@with_device
@given(
    lead=st.lists(st.integers(1, 2), min_size=0, max_size=2).map(tuple),
    n=st.integers(1, 4), m=st.integers(1, 4), d=st.integers(1, 3), dv=st.integers(1, 3),
    option=st.sampled_from(["none", "mask", "causal", "mask+causal"]),
    seed=seeds,
)
def test_attention_gradcheck(lead, n, m, d, dv, option, seed, device):
    rng = np.random.default_rng(seed)
    q, k, v = attention_inputs(rng, lead, n, m, d, dv, device)
    mask = rng.random((*lead, n, m)) > 0.3 if "mask" in option else None
    gradcheck(F.attention, (q, k, v), kwargs={"mask": mask, "causal": "causal" in option}, seed=seed)


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, mask_shape",
    [
        ((2, 3, 4, 2), (1, 3, 5, 2), (5, 3), (4, 5)),  # k shared over the batch, v and mask over all
        ((4, 2), (5, 2), (2, 5, 3), (2, 4, 5)),        # only v and the mask carry batch axes
        ((4, 2), (5, 2), (2, 5, 3), None),             # only v: the output takes v's batch axes
        ((1, 4, 2), (3, 5, 2), (2, 1, 5, 3), None),    # every input some of them
    ],
)
def test_attention_gradcheck_with_broadcast_batch_axes(q_shape, k_shape, v_shape, mask_shape):
    rng = np.random.default_rng(3)
    q, k, v = (leaf(rng.normal(size=s)) for s in (q_shape, k_shape, v_shape))
    mask = rng.random(mask_shape) > 0.3 if mask_shape is not None else None
    gradcheck(F.attention, (q, k, v), kwargs={"mask": mask})


def test_fully_masked_row_gives_no_nan(device):
    rng = np.random.default_rng(4)
    q, k, v = attention_inputs(rng, (2,), 3, 4, 2, 2, device)
    mask = np.ones((2, 3, 4), dtype=bool)
    mask[0, 1] = False  # query 1 of sample 0 may see no key
    for dtype in ("float64", "float32"):
        qq, kk, vv = (leaf(t.numpy(), device, dtype) for t in (q, k, v))
        out = F.attention(qq, kk, vv, mask=tensor(mask, device=device))
        assert not np.isnan(out.numpy()).any()
        # documented behaviour: uniform weights over the (all masked) keys
        np.testing.assert_allclose(out.numpy()[0, 1], vv.numpy()[0].mean(axis=0), rtol=1e-5)
        out.backward(np.ones(out.shape, dtype=dtype))
        for t in (qq, kk, vv):
            assert np.isfinite(to_device(t.grad, "cpu")).all()
    gradcheck(F.attention, (q, k, v), kwargs={"mask": mask})  # that row does not depend on q or k


def test_float32_stays_float32(device):
    q, k, v = attention_inputs(np.random.default_rng(5), (2,), 3, 3, 4, 2, device, dtype="float32")
    out = F.attention(q, k, v, causal=True)
    assert out.dtype == np.float32
    out.sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == np.float32
    x = leaf(np.ones((2, 3)), device, "float32")
    for fn in (F.softmax, F.log_softmax):
        y = fn(x)
        assert y.dtype == np.float32
        y.sum().backward()
        assert x.grad.dtype == np.float32


def test_shape_errors_name_the_op_and_the_shapes():
    q, k, v = (tensor(np.ones(s)) for s in [(2, 3, 4), (2, 5, 4), (2, 5, 6)])
    with pytest.raises(ValueError, match=r"attention: q and k must have the same feature width.*q \(2, 3, 4\)"):
        F.attention(q, tensor(np.ones((2, 5, 3))), v)
    with pytest.raises(ValueError, match="attention: k and v must have the same number of keys"):
        F.attention(q, k, tensor(np.ones((2, 4, 6))))
    with pytest.raises(ValueError, match="attention: the leading"):
        F.attention(q, tensor(np.ones((3, 5, 4))), tensor(np.ones((3, 5, 6))))
    with pytest.raises(ValueError, match=r"attention: mask of shape \(5, 3\) does not broadcast"):
        F.attention(q, k, v, mask=np.ones((5, 3), dtype=bool))
    with pytest.raises(TypeError, match="attention: mask must be boolean"):
        F.attention(q, k, v, mask=np.ones((3, 5)))


class MissingScale(Attention):
    """A planted bug: dQ and dK without the 1/sqrt(d) of the forward pass."""

    @staticmethod
    def backward(ctx, grad):
        dq, dk, dv = Attention.backward(ctx, grad)
        root_d = math.sqrt(ctx.saved_tensors[0].shape[-1])
        return dq * root_d, dk * root_d, dv


def test_missing_scale_is_caught():
    q, k, v = attention_inputs(np.random.default_rng(6), (2,), 3, 4, 3, 2)  # d = 3: sqrt(d) is no simple factor

    def buggy(q, k, v):
        return MissingScale.apply(q, k, v)

    with pytest.raises(GradcheckError) as err:
        gradcheck(buggy, (q, k, v))
    per_tensor = err.value.report.per_tensor
    assert per_tensor["q"].verdict == per_tensor["k"].verdict == "FAIL"
    assert per_tensor["q"].hint_kind == "scale_sqrt_d"
    assert per_tensor["v"].verdict == "ok"


def test_a_mask_with_extra_axes_is_refused_rather_than_broadcasting_the_output():
    rng = np.random.default_rng(0)
    q, k, v = (tensor(rng.standard_normal(s)) for s in [(4, 8), (5, 8), (5, 3)])
    with pytest.raises(ValueError, match="does not broadcast"):
        F.attention(q, k, v, mask=np.ones((7, 4, 5), dtype=bool))


# --------------------------------------------------------------------------- packed self-attention
@with_device
@given(lead=st.lists(st.integers(1, 2), min_size=1, max_size=2).map(tuple), n=st.integers(1, 4),
       d=st.integers(1, 3), option=st.sampled_from(["none", "mask", "causal"]), seed=seeds)
def test_self_attention_gradcheck(lead, n, d, option, seed, device):
    """SelfAttention (q, k, v the thirds of one input): its backward against finite differences."""
    rng = np.random.default_rng(seed)
    qkv = leaf(rng.normal(size=(*lead, n, 3 * d)), device)
    mask = rng.random((*lead, n, n)) > 0.3 if option == "mask" else None
    gradcheck(F.self_attention, (qkv,), kwargs={"mask": mask, "causal": option == "causal"}, seed=seed)


def test_self_attention_is_attention_on_the_three_thirds(device):
    rng = np.random.default_rng(4)
    packed = rng.normal(size=(2, 5, 9))
    out = F.self_attention(leaf(packed, device), causal=True).numpy()
    q, k, v = (packed[..., 3 * i:3 * i + 3] for i in range(3))
    causal = np.tril(np.ones((5, 5), dtype=bool))
    for b in range(2):
        np.testing.assert_allclose(out[b], reference_attention(q[b], k[b], v[b], causal), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"self_attention: qkv must be \(\.\.\., tokens, 3 d\).*\(2, 5, 8\)"):
        F.self_attention(tensor(np.ones((2, 5, 8))))


def test_swapped_thirds_in_the_packed_gradient_are_caught():
    from tinymlp.ops.attention import SelfAttention

    class Swapped(SelfAttention):
        """A planted bug: dL/dk and dL/dv written in each other's place."""

        @staticmethod
        def backward(ctx, grad):
            dq, dk, dv = Attention.backward(ctx, grad)
            return np.concatenate([dq, dv, dk], axis=-1)

    qkv = leaf(np.random.default_rng(5).normal(size=(2, 4, 6)))
    with pytest.raises(GradcheckError):
        gradcheck(Swapped.apply, (qkv,))

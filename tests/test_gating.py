"""The spatial gating unit (every variant, causal, aMLP gate residual) and Toeplitz weights.

Forward values are compared with explicit loops written here (no matrix products, no shared
code with the op); gradients with float64 finite differences through ``tinymlp.gradcheck``.
Negative controls plant the bugs a student would make (a gating branch treated as a constant,
a transposed dW, a causal dW left unmasked) and check that gradcheck catches them.
"""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import GradcheckError, fast, gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.ops.gating import SpatialGating, Toeplitz1d

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

VARIANTS = ["split", "linear", "additive", "multiplicative"]
seeds = st.integers(0, 2**32 - 1)
# Gate widths for gradient checks. Width 2 is left out on purpose: a LayerNorm over two channels
# outputs (+-1) * sqrt(var / (var + eps)), whose derivative is of order eps, below the noise
# floor of finite differences, so a check could certify nothing (gradcheck says INCONCLUSIVE).
# Width 1 is kept: its LayerNorm is constant and both gradients are exactly zero.
widths = st.sampled_from([1, 3])


# --------------------------------------------------------------------------- references (loops)
def reference_sgu(z, W, b, gamma, beta, eps=1e-5, A=None, causal=False, variant="split"):
    """The SGU element by element: LayerNorm per token, then out[b,i,c] from its definition."""
    B, S, D = z.shape
    e = D // 2 if variant == "split" else D
    out = np.zeros((B, S, e))
    for n in range(B):
        N = np.zeros((S, e))
        for j in range(S):
            u = z[n, j, e:] if variant == "split" else z[n, j]
            mu = sum(u) / e
            var = sum((uc - mu) ** 2 for uc in u) / e
            N[j] = [gamma[c] * (u[c] - mu) / math.sqrt(var + eps) + beta[c] for c in range(e)]
        for i in range(S):
            for c in range(e):
                f = b[i] + sum(W[i, j] * N[j, c] for j in range(S) if j <= i or not causal)
                if A is not None:
                    f += A[n, i, c]
                if variant == "split":
                    out[n, i, c] = z[n, i, c] * f
                elif variant == "linear":
                    out[n, i, c] = f
                elif variant == "additive":
                    out[n, i, c] = z[n, i, c] + f
                else:
                    out[n, i, c] = z[n, i, c] * f
    return out


def reference_toeplitz_2d(w, gh, gw):
    S = gh * gw
    W = np.zeros((S, S))
    for t in range(S):
        for t2 in range(S):
            r, c, r2, c2 = t // gw, t % gw, t2 // gw, t2 % gw
            W[t, t2] = w[r - r2 + gh - 1, c - c2 + gw - 1]
    return W


# --------------------------------------------------------------------------- inputs
def sgu_inputs(rng, B, S, e, variant, residual, device="cpu", dtype="float64"):
    """(z, weight, bias, norm_weight, norm_bias, gate_residual) as float leaves."""
    D = 2 * e if variant == "split" else e
    leaf = lambda a: tensor(a, requires_grad=True, dtype=dtype, device=device)  # noqa: E731
    return (
        leaf(rng.normal(size=(B, S, D))),
        leaf(rng.normal(size=(S, S)) / max(S, 1) ** 0.5),
        leaf(rng.normal(size=S)),
        leaf(1 + 0.5 * rng.normal(size=e)),
        leaf(0.5 * rng.normal(size=e)),
        leaf(rng.normal(size=(B, S, e))) if residual else None,
    )


def sgu(z, weight, bias, norm_weight, norm_bias, gate_residual=None, causal=False, variant="split"):
    return F.spatial_gating(z, weight, bias, norm_weight, norm_bias, gate_residual=gate_residual,
                            causal=causal, variant=variant)


def values(*ts):
    return [None if t is None else t.numpy() for t in ts]


# --------------------------------------------------------------------------- forward values
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_forward_matches_loops(variant, causal, residual, device):
    rng = np.random.default_rng(0)
    inputs = sgu_inputs(rng, 2, 3, 3, variant, residual, device)
    out = sgu(*inputs, causal=causal, variant=variant)
    z, W, b, g, be, A = values(*inputs)
    expected = reference_sgu(z, W, b, g, be, A=A, causal=causal, variant=variant)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_at_initialisation_the_split_sgu_passes_z1_through():
    """W = 0 and b = 1 give f = 1, so out = z1 (the paper's reason for this init)."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, 5, 8))
    out = F.spatial_gating(tensor(z), tensor(np.zeros((5, 5))), tensor(np.ones(5)),
                           tensor(rng.normal(size=4)), tensor(rng.normal(size=4)))
    np.testing.assert_array_equal(out.numpy(), z[..., :4].astype(np.float32))


def test_causal_output_ignores_later_tokens():
    rng = np.random.default_rng(2)
    z, W, b, g, be, _ = sgu_inputs(rng, 1, 5, 2, "split", False)
    before = sgu(z, W, b, g, be, causal=True).numpy()
    z.data[:, 3:, :] += 10.0 * rng.normal(size=(1, 2, 4))  # change only tokens 3 and 4
    after = sgu(z, W, b, g, be, causal=True).numpy()
    np.testing.assert_array_equal(before[:, :3], after[:, :3])
    assert not np.allclose(before[:, 3:], after[:, 3:])


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@given(B=st.integers(1, 2), S=st.integers(1, 4), e=widths, seed=seeds)
@example(B=1, S=1, e=1, seed=0)  # one sample, one token, one channel: LayerNorm of width 1 is constant
@example(B=1, S=1, e=3, seed=1)
def test_gradcheck_every_option(variant, causal, residual, B, S, e, seed):
    inputs = sgu_inputs(np.random.default_rng(seed), B, S, e, variant, residual)
    gradcheck(sgu, inputs, kwargs={"causal": causal, "variant": variant}, seed=seed % 1000)


@pytest.mark.parametrize("variant", ["split", "multiplicative"])
def test_gradcheck_on_device(variant, device):
    inputs = sgu_inputs(np.random.default_rng(3), 2, 3, 3, variant, True, device)
    gradcheck(sgu, inputs, kwargs={"causal": True, "variant": variant})


def test_gradient_of_a_constant_weight_is_not_computed():
    """Inputs that do not require grad (a frozen W, a constant residual) get no gradient."""
    rng = np.random.default_rng(4)
    z, W, b, g, be, A = sgu_inputs(rng, 2, 3, 2, "split", True)
    W.requires_grad = False
    A = A.detach()
    sgu(z, W, b, g, be, A).sum().backward()
    assert W.grad is None and z.grad is not None and b.grad is not None


def test_float32_stays_float32():
    rng = np.random.default_rng(5)
    inputs = sgu_inputs(rng, 2, 4, 3, "split", True, dtype="float32")
    out = sgu(*inputs, causal=True)
    assert out.dtype == np.float32
    out.backward(np.ones(out.shape, dtype=np.float32))
    for t in inputs:
        assert t.grad.dtype == np.float32


# --------------------------------------------------------------------------- negative controls
def _plant(monkeypatch, mutate):
    """Replace the backward that runs (the fast one, or the reference on the reference tier) by
    the correct one followed by ``mutate(g, grads)``, which sees only G and the gradients."""
    impl = fast.implementation(SpatialGating)
    correct = impl.backward

    def buggy(ctx, g):
        return mutate(g, list(correct(ctx, g)))

    monkeypatch.setattr(impl, "backward", staticmethod(buggy))


def _failing(report, name):
    assert not report.passed
    assert report.per_tensor[name].verdict == "FAIL", report.summary()
    return report.per_tensor[name]


def _check(inputs, **kwargs):
    return gradcheck(sgu, inputs, kwargs=kwargs, raise_on_fail=False)


def _gate_parts(inputs, variant="split", causal=False):
    """(z1 or z, N = LN(gate input), F) of the unperturbed inputs, in plain NumPy."""
    z, W, b, gamma, beta = (t.numpy() for t in inputs[:5])
    e = z.shape[-1] // 2 if variant == "split" else z.shape[-1]
    u = z[..., e:] if variant == "split" else z
    N = (u - u.mean(-1, keepdims=True)) / np.sqrt(u.var(-1, keepdims=True) + 1e-5) * gamma + beta
    W = np.tril(W) if causal else W
    return z[..., :e], N, np.einsum("ij,bjc->bic", W, N) + b[:, None]


@pytest.mark.parametrize("branch", ["bypass z1", "gate z2"])
def test_gating_branch_treated_as_constant_is_caught(monkeypatch, branch):
    """Dropping dL/dz1 (or the gate path dL/dz2) leaves half of dL/dz at zero."""
    inputs = sgu_inputs(np.random.default_rng(6), 2, 3, 3, "split", False)
    e = inputs[0].shape[-1] // 2

    def drop(g, grads):
        dz = grads[0].copy()
        if branch == "bypass z1":
            dz[..., :e] = 0
        else:
            dz[..., e:] = 0
        grads[0] = dz
        return tuple(grads)

    _plant(monkeypatch, drop)
    result = _failing(_check(inputs), "z")
    assert result.hint_kind == "partial_branch", result.hint
    with pytest.raises(GradcheckError):
        gradcheck(sgu, inputs)


def test_multiplicative_variant_missing_direct_term_is_caught(monkeypatch):
    """out = z * f(z): forgetting the G * F term (z used twice) must fail."""
    inputs = sgu_inputs(np.random.default_rng(7), 2, 3, 3, "multiplicative", False)
    _, _, f = _gate_parts(inputs, "multiplicative")

    def drop(g, grads):
        grads[0] = grads[0] - g * f
        return tuple(grads)

    _plant(monkeypatch, drop)
    _failing(_check(inputs, variant="multiplicative"), "z")


def test_transposed_weight_gradient_is_caught(monkeypatch):
    inputs = sgu_inputs(np.random.default_rng(8), 2, 4, 3, "split", False)

    def transpose(g, grads):
        grads[1] = grads[1].T.copy()
        return tuple(grads)

    _plant(monkeypatch, transpose)
    result = _failing(_check(inputs), "weight")
    assert result.hint_kind == "transpose", result.hint


def test_causal_weight_gradient_left_unmasked_is_caught(monkeypatch):
    """Masked entries of W never reach the output: their gradient must be exactly 0."""
    inputs = sgu_inputs(np.random.default_rng(9), 2, 4, 3, "split", False)
    z1, n, _ = _gate_parts(inputs, causal=True)

    def unmask(g, grads):
        grads[1] = np.einsum("bic,bjc->ij", g * z1, n)  # the dense dW, without tril
        return tuple(grads)

    _plant(monkeypatch, unmask)
    _failing(_check(inputs, causal=True), "weight")


# --------------------------------------------------------------------------- Toeplitz weights
@given(S=st.integers(1, 6), seed=seeds)
def test_toeplitz_1d_values_and_parameter_count(S, seed):
    w = np.random.default_rng(seed).normal(size=2 * S - 1)
    W = F.toeplitz_1d(tensor(w, dtype="float64"), S).numpy()
    assert w.size == 2 * S - 1 and W.shape == (S, S)
    for i in range(S):
        for j in range(S):
            assert W[i, j] == w[i - j + S - 1]


@given(gh=st.integers(1, 3), gw=st.integers(1, 3), seed=seeds)
def test_toeplitz_2d_values_and_parameter_count(gh, gw, seed):
    w = np.random.default_rng(seed).normal(size=(2 * gh - 1, 2 * gw - 1))
    W = F.toeplitz_2d(tensor(w, dtype="float64"), gh, gw).numpy()
    assert w.size == (2 * gh - 1) * (2 * gw - 1)
    np.testing.assert_array_equal(W, reference_toeplitz_2d(w, gh, gw))


def test_toeplitz_2d_on_one_row_is_the_1d_form():
    w = np.random.default_rng(10).normal(size=9)
    W1 = F.toeplitz_1d(tensor(w), 5).numpy()
    W2 = F.toeplitz_2d(tensor(w.reshape(1, 9)), 1, 5).numpy()
    np.testing.assert_array_equal(W1, W2)


@given(S=st.integers(1, 5), seed=seeds)
@example(S=1, seed=0)
def test_gradcheck_toeplitz_1d(S, seed):
    w = tensor(np.random.default_rng(seed).normal(size=2 * S - 1), requires_grad=True, dtype="float64")
    gradcheck(F.toeplitz_1d, (w, S), seed=seed % 1000)


@given(gh=st.integers(1, 3), gw=st.integers(1, 3), seed=seeds)
@example(gh=1, gw=1, seed=0)
def test_gradcheck_toeplitz_2d(gh, gw, seed):
    w = np.random.default_rng(seed).normal(size=(2 * gh - 1, 2 * gw - 1))
    gradcheck(F.toeplitz_2d, (tensor(w, requires_grad=True, dtype="float64"), gh, gw), seed=seed % 1000)


def sgu_toeplitz_1d(z, w, bias, norm_weight, norm_bias, causal=False):
    return F.spatial_gating(z, F.toeplitz_1d(w, z.shape[1]), bias, norm_weight, norm_bias, causal=causal)


def sgu_toeplitz_2d(z, w, bias, norm_weight, norm_bias, grid=(1, 1)):
    return F.spatial_gating(z, F.toeplitz_2d(w, *grid), bias, norm_weight, norm_bias)


@pytest.mark.parametrize("causal", [False, True])
@given(B=st.integers(1, 2), S=st.integers(1, 4), e=widths, seed=seeds)
def test_gradcheck_sgu_with_toeplitz_1d(causal, B, S, e, seed):
    rng = np.random.default_rng(seed)
    z, _, b, g, be, _ = sgu_inputs(rng, B, S, e, "split", False)
    w = tensor(rng.normal(size=2 * S - 1), requires_grad=True, dtype="float64")
    gradcheck(sgu_toeplitz_1d, (z, w, b, g, be), kwargs={"causal": causal}, seed=seed % 1000)


@given(gh=st.integers(1, 3), gw=st.integers(1, 3), e=widths, seed=seeds)
def test_gradcheck_sgu_with_toeplitz_2d(gh, gw, e, seed):
    rng = np.random.default_rng(seed)
    z, _, b, g, be, _ = sgu_inputs(rng, 1, gh * gw, e, "split", False)
    w = tensor(rng.normal(size=(2 * gh - 1, 2 * gw - 1)), requires_grad=True, dtype="float64")
    gradcheck(sgu_toeplitz_2d, (z, w, b, g, be), kwargs={"grid": (gh, gw)}, seed=seed % 1000)


def test_toeplitz_gradient_summed_on_the_wrong_diagonals_is_caught(monkeypatch):
    impl = fast.implementation(Toeplitz1d)
    correct = impl.backward
    monkeypatch.setattr(impl, "backward", staticmethod(lambda ctx, g: correct(ctx, g)[::-1].copy()))
    w = tensor(np.random.default_rng(11).normal(size=7), requires_grad=True, dtype="float64")
    report = gradcheck(F.toeplitz_1d, (w, 4), raise_on_fail=False)
    assert not report.passed


def test_toeplitz_float32_stays_float32(device):
    w = tensor(np.ones((3, 5)), requires_grad=True, device=device)
    W = F.toeplitz_2d(w, 2, 3)
    assert W.dtype == np.float32
    W.backward(np.ones((6, 6), dtype=np.float32))
    assert w.grad.dtype == np.float32
    # every offset (p, q) occurs (gh - |p - 1|) * (gw - |q - 2|) times in the 6 x 6 matrix
    counts = np.outer([1, 2, 1], [1, 2, 3, 2, 1])
    np.testing.assert_array_equal(to_device(w.grad, "cpu"), counts)


# --------------------------------------------------------------------------- errors
def test_shape_errors_name_the_op_and_the_shapes():
    rng = np.random.default_rng(12)
    z, W, b, g, be, A = sgu_inputs(rng, 2, 3, 2, "split", True)
    with pytest.raises(ValueError, match=r"spatial_gating: weight has shape \(2, 2\), expected \(3, 3\)"):
        sgu(z, tensor(np.zeros((2, 2))), b, g, be)
    with pytest.raises(ValueError, match="norm_weight"):
        sgu(z, W, b, tensor(np.ones(4)), be)
    with pytest.raises(ValueError, match="gate_residual"):
        sgu(z, W, b, g, be, tensor(np.zeros((2, 3, 4))))
    with pytest.raises(ValueError, match="even"):
        sgu(tensor(np.zeros((2, 3, 5))), W, b, g, be)
    with pytest.raises(ValueError, match="variant"):
        sgu(z, W, b, g, be, variant="gated")
    with pytest.raises(ValueError, match=r"\(batch, tokens, channels\)"):
        sgu(tensor(np.zeros((3, 4))), W, b, g, be)
    with pytest.raises(ValueError, match=r"toeplitz_1d: w must have shape \(5,\)"):
        F.toeplitz_1d(tensor(np.zeros(4)), 3)
    with pytest.raises(ValueError, match=r"toeplitz_2d: w must have shape \(3, 5\)"):
        F.toeplitz_2d(tensor(np.zeros((3, 3))), 2, 3)

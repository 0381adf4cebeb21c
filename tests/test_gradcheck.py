"""Tests of tinymlp.gradcheck itself.

Positive controls: correct ops pass. Negative controls: Functions with planted backward bugs
must fail, and with the expected hint, so that a passing gradcheck means something.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinymlp
from tinymlp.autograd import Function, unbroadcast
from tinymlp.gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_grad
from tinymlp.tensor import Tensor
from tinymlp.testing import assert_grads


def leaf(shape, seed=0, scale=1.0, dtype="float64"):
    data = np.random.default_rng(seed).normal(size=shape) * scale
    return tinymlp.tensor(data, requires_grad=True, dtype=dtype)


def hint_of(fn, inputs, name, **options):
    """Run a check that must fail; return the failing tensor's hint_kind."""
    with pytest.raises(GradcheckError) as info:
        gradcheck(fn, inputs, **options)
    report = info.value.report
    assert not report.passed
    assert str(info.value) == report.summary()
    result = report.per_tensor[name]
    assert result.verdict == "FAIL", report.summary()
    return result.hint_kind


# ----------------------------------------------------------------------------- test ops


def tanh_with(backward):
    """A tanh Function whose backward is ``backward(g, out)``."""

    class Op(Function):
        @staticmethod
        def forward(ctx, x):
            out = np.tanh(x)
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            return backward(g, out)

    Op.__name__ = "Tanh"
    return Op


GoodTanh = tanh_with(lambda g, out: g * (1 - out * out))


class Cube(Function):
    """A correct custom op: out = x^3 * y;  dx = 3 x^2 y g,  dy = x^3 g."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * x * x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return unbroadcast(3 * x * x * y * g, x.shape), unbroadcast(x * x * x * g, y.shape)


def matmul_with(grad_b):
    class MM(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g @ b.T, grad_b(a, g)

    return MM


class BiasAddNoSum(Function):
    """x + b with b broadcast over the batch; the bug: b's gradient is not summed."""

    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g


class MeanNoDivide(Function):
    """Mean over axis 1; the bug: backward spreads g without dividing by N."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.mean(axis=1)

    @staticmethod
    def backward(ctx, g):
        return np.broadcast_to(g[:, None], ctx.shape).copy()


class ScaleNoSqrt(Function):
    """out = x / sqrt(d), d = last axis; the bug: backward forgets the 1/sqrt(d)."""

    @staticmethod
    def forward(ctx, x):
        return x / np.sqrt(x.shape[-1])

    @staticmethod
    def backward(ctx, g):
        return g.copy()


class SquareNoGrad(Function):
    """out = x^2; the bug: backward returns None (no gradient)."""

    @staticmethod
    def forward(ctx, x):
        return x * x

    @staticmethod
    def backward(ctx, g):
        return None


class NoisyForward(Function):
    """A forward that draws random numbers on every call (like dropout without a fixed mask)."""

    rng = np.random.default_rng(1)

    @staticmethod
    def forward(ctx, x):
        ctx.noise = NoisyForward.rng.uniform(0.5, 1.5, size=x.shape)
        return x * ctx.noise

    @staticmethod
    def backward(ctx, g):
        return g * ctx.noise


class DowncastForward(Function):
    """out = 2 x computed in float32 (the bug); backward is the right formula in x's dtype."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.astype(np.float32) * np.float32(2)

    @staticmethod
    def backward(ctx, g):
        return (2 * g).astype(ctx.dtype)


class GateConstant(Function):
    """z = [z1, z2] on the last axis, out = z1 * tanh(z2); the bug: the gate is a constant."""

    @staticmethod
    def forward(ctx, z):
        z1, z2 = np.split(z, 2, axis=-1)
        gate = np.tanh(z2)
        ctx.save_for_backward(gate)
        return z1 * gate

    @staticmethod
    def backward(ctx, g):
        (gate,) = ctx.saved_tensors
        return np.concatenate([g * gate, np.zeros_like(g)], axis=-1)


class FirstRowWrong(Function):
    """out = tanh(x); the bug: the gradient of element [0, 0] is doubled."""

    @staticmethod
    def forward(ctx, x):
        out = np.tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        grad = g * (1 - out * out)
        grad[0, 0] *= 2
        return grad


class NanBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * x

    @staticmethod
    def backward(ctx, g):
        return 0 / (0 * g)  # 0/0


# ----------------------------------------------------------------------------- passing


def test_correct_ops_pass_and_report():
    x, w = leaf((3, 4), 1), leaf((4, 5), 2)
    report = gradcheck(lambda x, w: tinymlp.tanh(x @ w), (x, w))
    assert isinstance(report, GradcheckReport)
    assert report.passed and report.verdict == "PASS"
    assert set(report.per_tensor) == {"x", "w"}
    for result in report.per_tensor.values():
        assert result.verdict == "ok" and result.hint_kind is None
        assert result.checked == result.analytical.size and result.max_rel_err < 1e-6
    text = report.summary()
    assert "passed" in text and "input x" in text and "input w" in text


def test_custom_function_broadcast_and_constants_pass():
    x, y = leaf((2, 3), 3), leaf((3,), 4)
    ids = np.array([0, 2])  # an integer constant
    report = gradcheck(lambda x, y, ids: Cube.apply(x, y)[:, ids], (x, y, ids))
    assert report.passed and set(report.per_tensor) == {"x", "y"}


def test_multiple_outputs_and_kwargs():
    x = leaf((2, 3), 5)

    def fn(x, scale=1.0):
        return tinymlp.tanh(x) * scale, (x * x).sum(axis=0)

    assert gradcheck(fn, (x,), kwargs={"scale": 3.0}).passed


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=10)
def test_hypothesis_shapes_pass(shape, seed):
    x = leaf(tuple(shape), seed)
    assert_grads(lambda x: GoodTanh.apply(x) * x, (x,), seed=seed)


def test_float32_inputs_promoted_and_restored_bit_identically():
    x = leaf((3, 4), 6, dtype="float32")
    x.data[0, 0] = -0.0
    before = x.data.copy()
    data_id = id(x.data)
    report = gradcheck(lambda x: tinymlp.tanh(x) * x, (x,))
    assert report.passed and report.settings.promoted_from == ("float32",)
    assert id(x.data) == data_id and x.data.dtype == np.float32 and x.grad is None
    assert before.tobytes() == x.data.tobytes()
    assert "promoted" in report.summary()


# ----------------------------------------------------------------------------- negative controls


@pytest.mark.parametrize(
    "backward, kind",
    [
        (lambda g, out: -g * (1 - out * out), "sign"),
        (lambda g, out: 2 * g * (1 - out * out), "factor2"),
        (lambda g, out: 0.5 * g * (1 - out * out), "half"),
        (lambda g, out: 1 - out * out, "upstream_ignored"),
    ],
    ids=["sign", "x2", "half", "missing-upstream-multiply"],
)
def test_planted_elementwise_bugs(backward, kind):
    x = leaf((3, 4), 7)
    assert hint_of(tanh_with(backward).apply, (x,), "x") == kind  # named after forward(ctx, x)


def test_upstream_ignored_is_caught_even_with_ones():
    x = leaf((3, 4), 7)
    bad = tanh_with(lambda g, out: 1 - out * out)
    assert hint_of(lambda x: bad.apply(x), (x,), "x", upstream="ones") == "upstream_ignored"


def test_transposed_square_weight_gradient():
    a, b = leaf((4, 4), 8), leaf((4, 4), 9)
    MM = matmul_with(lambda a, g: (a.T @ g).T)
    assert hint_of(lambda a, b: MM.apply(a, b), (a, b), "b") == "transpose"


def test_transposed_rectangular_weight_gradient_raises_in_engine_and_is_reported():
    a, b = leaf((2, 3), 8), leaf((3, 5), 9)
    MM = matmul_with(lambda a, g: (a.T @ g).T)
    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda a, b: MM.apply(a, b), (a, b))
    report = info.value.report
    assert report.per_tensor["a"].verdict == "ok"  # isolated: a's gradient is still checked
    assert report.per_tensor["b"].hint_kind == "transpose"
    assert "(5, 3)" in report.per_tensor["b"].error


def test_unsummed_broadcast():
    x, b = leaf((4, 3), 10), leaf((3,), 11)
    report = gradcheck(lambda x, b: BiasAddNoSum.apply(x, b), (x, b), raise_on_fail=False)
    assert not report.passed
    assert report.per_tensor["x"].verdict == "ok"
    assert report.per_tensor["b"].hint_kind == "broadcast_not_summed"
    assert "sum the gradient over axis 0 (g.sum(axis=0))" in report.per_tensor["b"].hint


def test_mean_vs_sum():
    x = leaf((3, 5), 12)
    assert hint_of(lambda x: MeanNoDivide.apply(x), (x,), "x") == "mean_vs_sum"


def test_missing_sqrt_d_scale():
    x = leaf((3, 5), 13)
    assert hint_of(lambda x: ScaleNoSqrt.apply(x), (x,), "x") == "scale_sqrt_d"


def test_no_gradient_returned():
    x = leaf((2, 3), 14)
    assert hint_of(lambda x: SquareNoGrad.apply(x), (x,), "x") == "no_gradient"


def test_forward_leaving_the_graph_is_no_gradient():
    x = leaf((2, 3), 14)
    assert hint_of(lambda x: tinymlp.tensor(np.tanh(x.data), dtype="float64"), (x,), "x") == "no_gradient"


def test_nan_in_backward():
    x = leaf((2, 3), 15)
    with np.errstate(invalid="ignore"):
        assert hint_of(lambda x: NanBackward.apply(x), (x,), "x") == "nan"


def test_partial_branch():
    z = leaf((2, 3, 8), 16)
    assert hint_of(lambda z: GateConstant.apply(z), (z,), "z") == "partial_branch"


def test_nondeterministic_forward():
    x = leaf((2, 3), 17)
    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda x: NoisyForward.apply(x), (x,))
    assert "nondeterministic" in info.value.report.hint_kinds
    assert "forward is random" in str(info.value)
    # reseeding before every forward makes it checkable
    def reseed():
        NoisyForward.rng = np.random.default_rng(1)
    assert gradcheck(lambda x: NoisyForward.apply(x), (x,), before_forward=reseed).passed


def test_float32_downcast_in_forward():
    x = leaf((2, 3), 18)
    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda x: DowncastForward.apply(x), (x,))
    assert "downcast" in info.value.report.hint_kinds


def test_forward_mutating_its_input():
    x = leaf((2, 3), 19)

    def fn(x):
        x.data[0, 0] += 1.0
        return tinymlp.tanh(x)

    report = gradcheck(fn, (x,), raise_on_fail=False)
    assert "mutated_input" in report.hint_kinds and not report.passed
    assert x.data[0, 0] == leaf((2, 3), 19).data[0, 0]  # the user's tensor was never touched


def test_closure_tensor_that_requires_grad_is_explained():
    w = leaf((3, 3), 20, dtype="float32")
    x = leaf((2, 3), 21)
    report = gradcheck(lambda x: x @ w, (x,), raise_on_fail=False)
    assert "unpromoted_tensor" in report.hint_kinds
    # the fix the message suggests: name it as a parameter
    report = gradcheck(lambda x: x @ w, (x,), params={"w": w})
    assert report.passed and set(report.per_tensor) == {"x", "w"}
    assert w.data.dtype == np.float32 and w.grad is None


# ----------------------------------------------------------------------------- kinks, noise


def test_relu_kink_is_nondiff_not_a_backward_bug():
    x = leaf((2, 3), 22)
    x.data[0, 1] = 0.0
    x.data[1, 2] = 3e-7  # within eps = 1e-6 of the kink
    report = gradcheck(lambda x: tinymlp.relu(x), (x,))
    result = report.per_tensor["x"]
    assert report.passed and result.verdict == "NONDIFF" and result.hint_kind == "kink"
    assert result.n_nondiff == 2 and result.n_fail == 0
    assert "non-differentiable" in report.summary()
    assert not gradcheck(lambda x: tinymlp.relu(x), (x,), strict_kinks=True, raise_on_fail=False).passed


def test_a_real_bug_at_a_kink_is_still_a_failure():
    x = leaf((2, 3), 22)
    x.data[0, 1] = 0.0
    bad = tanh_with(lambda g, out: -g * (1 - out * out))
    assert hint_of(lambda x: bad.apply(tinymlp.relu(x)), (x,), "x") == "sign"


def test_vacuous_check_is_inconclusive():
    x = leaf((2, 3), 23)
    big = tinymlp.tensor(np.full((2, 3), 1e9), dtype="float64")
    report = gradcheck(lambda x: big + tinymlp.tanh(x) * 1e-9, (x,), raise_on_fail=False)
    assert report.per_tensor["x"].verdict == "INCONCLUSIVE" and report.verdict == "INCONCLUSIVE"
    assert not report.passed
    assert gradcheck(lambda x: big + tinymlp.tanh(x) * 1e-9, (x,), strict=False).passed


# ----------------------------------------------------------------------------- modules


class Param(Tensor):
    """A Parameter-like Tensor subclass: float32, requires grad."""

    def __init__(self, data):
        super().__init__(data, requires_grad=True, dtype="float32")


class TinyLinear:
    def __init__(self, n_in, n_out, seed):
        rng = np.random.default_rng(seed)
        self.weight = Param(rng.normal(size=(n_in, n_out)))
        self.bias = Param(rng.normal(size=(n_out,)))

    def named_parameters(self):
        return [("weight", self.weight), ("bias", self.bias)]

    def __call__(self, x):
        return x @ self.weight + self.bias


class TinyNet:
    """fc -> tanh -> the same fc's weight again (tied) -> head."""

    def __init__(self, bad_bias=False):
        self.fc = TinyLinear(3, 3, 0)
        self.head = TinyLinear(3, 2, 1)
        self.bad_bias = bad_bias

    def named_parameters(self):
        for prefix, m in (("fc", self.fc), ("head", self.head)):
            for name, p in m.named_parameters():
                yield f"{prefix}.{name}", p

    def forward(self, x):
        h = tinymlp.tanh(self.fc(x))
        h = tinymlp.tanh(h @ self.fc.weight)  # reuse: the gradient is the sum over both uses
        if self.bad_bias:
            return BiasAddNoSum.apply(h @ self.head.weight, self.head.bias)
        return self.head(h)

    __call__ = forward


def test_module_parameters_checked_by_name_and_restored():
    net = TinyNet()
    x = leaf((4, 3), 24)
    params = dict(net.named_parameters())
    before = {k: (p.data, p.data.tobytes(), p.requires_grad) for k, p in params.items()}
    report = gradcheck(net, (x,))
    assert report.passed
    assert list(report.per_tensor) == ["x", "fc.weight", "fc.bias", "head.weight", "head.bias"]
    assert report.per_tensor["fc.weight"].kind == "param"
    for k, p in params.items():
        data, raw, flag = before[k]
        assert p.data is data and p.data.tobytes() == raw and p.requires_grad == flag and p.grad is None


def test_module_bug_names_the_parameter_and_wrt_exclude():
    net = TinyNet(bad_bias=True)
    x = leaf((4, 3), 25)
    report = gradcheck(net, (x,), raise_on_fail=False)
    assert report.per_tensor["head.bias"].hint_kind == "broadcast_not_summed"
    assert all(report.per_tensor[k].verdict == "ok" for k in ("x", "fc.weight", "fc.bias", "head.weight"))
    assert gradcheck(net, (x,), exclude=["head.bias"]).passed
    assert set(gradcheck(net, (x,), wrt=["fc.bias"]).per_tensor) == {"fc.bias"}
    with pytest.raises(ValueError, match="known names"):
        gradcheck(net, (x,), wrt=["nope"])


# ----------------------------------------------------------------------------- sampled mode


def test_sampled_mode_finds_a_boundary_bug_and_falls_back_to_full():
    x = leaf((64, 80), 26)  # 5120 elements > max_full
    report = gradcheck(lambda x: FirstRowWrong.apply(x), (x,), raise_on_fail=False)
    result = report.per_tensor["x"]
    assert report.settings.mode == "sampled" and result.mode == "sampled, then full"
    assert result.verdict == "FAIL" and result.n_fail == 1 and result.worst[0].index == (0, 0)
    assert result.hint_kind == "boundary"
    assert not np.isnan(result.numerical).any()


def test_sampled_mode_passes_correct_large_tensor():
    x = leaf((200, 300), 27)
    report = gradcheck(lambda x: tinymlp.tanh(x), (x,))
    result = report.per_tensor["x"]
    assert result.mode == "sampled" and result.verdict == "ok"
    assert 64 <= result.checked < 200  # coordinates + 4 directions, not 60,000 elements
    assert sum(isinstance(ch.index, str) for ch in result.worst) == 0  # nothing to show


# ----------------------------------------------------------------------------- numerical_grad / errors


def test_numerical_grad_matches_closed_form():
    x = leaf((3, 4), 28, dtype="float32")
    dx = numerical_grad(lambda x: (x * x * x).sum(), x)
    np.testing.assert_allclose(dx, 3 * x.data.astype(np.float64) ** 2, rtol=1e-7, atol=1e-9)
    g = np.random.default_rng(0).normal(size=(3, 4))
    dx, dconst = numerical_grad(lambda x, c: tinymlp.tanh(x) * c, (x, 2.0), upstream=g)
    np.testing.assert_allclose(dx, g * 2 * (1 - np.tanh(x.data.astype(np.float64)) ** 2), rtol=1e-7, atol=1e-9)
    assert dconst is None
    with pytest.raises(ValueError, match="upstream"):
        numerical_grad(lambda x: x * 2, x)


def test_nothing_to_check_is_an_error():
    x = tinymlp.tensor(np.ones((2, 2)))  # no requires_grad
    with pytest.raises(ValueError, match="nothing to check"):
        gradcheck(lambda x: x * 2, (x,))


def test_assert_grads_message_is_the_report():
    x = leaf((2, 3), 29)
    bad = tanh_with(lambda g, out: 2 * g * (1 - out * out))
    with pytest.raises(AssertionError) as info:
        assert_grads(lambda x: bad.apply(x), (x,))
    message = str(info.value)
    assert "tinymlp.gradcheck FAILED" in message and "counted twice" in message and "reproduce:" in message
    assert assert_grads(lambda x: GoodTanh.apply(x), (x,)).passed


def test_explicit_upstream_scalar_and_shared_inputs():
    x = leaf((2, 3), 30)
    g = np.random.default_rng(1).normal(size=(2, 3))
    report = gradcheck(lambda x: tinymlp.tanh(x), (x,), upstream=g)
    assert report.passed and report.settings.upstream == "given"
    with pytest.raises(ValueError, match="upstream"):
        gradcheck(lambda x: tinymlp.tanh(x), (x,), upstream=np.ones((3, 2)))
    s = leaf((), 31)
    report = gradcheck(lambda a, b, s: a * b * s, (x, x, s))  # x passed twice: one tensor, summed
    assert set(report.per_tensor) == {"a", "s"} and report.passed


def test_float32_check_on_request_warns():
    x = leaf((2, 3), 32, dtype="float32")
    report = gradcheck(lambda x: tinymlp.tanh(x), (x,), dtype=None)
    assert report.passed and report.settings.eps == 1e-3 and "check ran in float32" in report.summary()


def test_everything_restored_when_forward_raises_midway():
    net = TinyNet()
    x = leaf((4, 3), 33, dtype="float32")
    params = dict(net.named_parameters())
    before = {k: (p.data, p.data.tobytes()) for k, p in params.items()}
    x_before = x.data.tobytes()
    calls = {"n": 0}

    def fn(x):
        calls["n"] += 1
        if calls["n"] == 20:  # inside the finite-difference loop
            raise RuntimeError("boom")
        return net(x)

    with pytest.raises(RuntimeError, match="boom"):
        gradcheck(fn, (x,), params=params)
    assert x.data.tobytes() == x_before and x.grad is None
    for k, p in params.items():
        assert p.data is before[k][0] and p.data.tobytes() == before[k][1] and p.grad is None

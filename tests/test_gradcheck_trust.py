"""Custom layers from class assignments whose reports must say what their own numbers show.

Each layer carries one realistic bug (or sits at inputs where a bug cannot show), and each test
asserts the words of its report: a hint derived from the failure's structure (rows checked
alone, a factor equal to an input, rows grouped by a repeated index), an op's formula only for
that op, precision lost by a float32 backward named as such, state caught on the first call,
and a warning wherever the inputs are too special for a whole class of bugs to show.
"""

import warnings

import numpy as np
import pytest

import tinymlp
from tinymlp import Function, gradcheck, nn
from tinymlp.autograd import unbroadcast
from tinymlp.gradcheck import GradcheckWarning


def leaf(shape, seed=0, scale=1.0, shift=0.0, dtype="float64"):
    data = np.random.default_rng(seed).normal(size=shape) * scale + shift
    return tinymlp.tensor(data, requires_grad=True, dtype=dtype)


def scalar(value, dtype="float64"):
    return tinymlp.tensor(np.array(value), requires_grad=True, dtype=dtype)


def check(fn, inputs, **options):
    """gradcheck without raising, and with its GradcheckWarnings kept out of the test's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GradcheckWarning)
        return gradcheck(fn, inputs, raise_on_fail=False, **options)


def failing(fn, inputs, **options):
    report = check(fn, inputs, **options)
    assert not report.passed, report.summary()
    return report


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- normalisations


class L2NormalizeBatchDot(Function):
    """y = x / ||x|| per row; the bug: the inner product <g, y> is taken over the whole batch."""

    @staticmethod
    def forward(ctx, x):
        norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
        y = x / norm
        ctx.save_for_backward(y, norm)
        return y

    @staticmethod
    def backward(ctx, g):
        y, norm = ctx.saved_tensors
        return (g - y * (g * y).sum()) / norm  # should be (g * y).sum(axis=-1, keepdims=True)


class RMSNormMeanOverD(Function):
    """y = x * r * w, r = 1 / sqrt(mean(x^2) + eps); the bug: the mean term divided by D again."""

    @staticmethod
    def forward(ctx, x, weight):
        r = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
        ctx.save_for_backward(x * r, r, weight)
        return x * r * weight

    @staticmethod
    def backward(ctx, g):
        xh, r, weight = ctx.saved_tensors
        h = g * weight
        dx = r * (h - xh * (h * xh).mean(axis=-1, keepdims=True) / xh.shape[-1])
        return dx, (g * xh).reshape(-1, xh.shape[-1]).sum(axis=0)


def test_l2_normalisation_with_a_batch_wide_inner_product_is_told_so_not_layernorm():
    report = failing(L2NormalizeBatchDot.apply, (leaf((4, 6), 1),))
    result = report.per_tensor["x"]
    text = report.summary()
    assert "mean(g)" not in text and "LayerNorm" not in text, text
    assert result.hint_kind == "batch_mixed", text
    assert "each row alone" in result.pattern and "backward on each row alone agrees" in result.pattern
    assert "over the whole batch where forward reduces each row by itself" in result.hint
    assert "sum(axis=-1, keepdims=True)" in result.hint


def test_rmsnorm_gets_its_own_formula_and_never_layernorms():
    report = failing(RMSNormMeanOverD.apply, (leaf((3, 6), 2), leaf(6, 3, 0.3, 1.0)))
    result = report.per_tensor["x"]
    assert report.per_tensor["weight"].ok
    assert result.hint_kind == "row_multiple", report.summary()
    assert "that row of 'x' times a coefficient" in result.pattern
    assert "RMSNorm" in result.hint and "r * (g - x_hat * mean(g * x_hat))" in result.hint
    assert "mean(g) -" not in result.hint and "g - mean(g)" not in result.hint


class RMSNormRConstant(RMSNormMeanOverD):
    """The lesson's RMSNorm with a gain; the bug: r treated as a constant (the row term missing)."""

    @staticmethod
    def backward(ctx, g):
        xh, r, weight = ctx.saved_tensors
        return r * g * weight, (g * xh).reshape(-1, xh.shape[-1]).sum(axis=0)


class L2NormalizeRConstant(L2NormalizeBatchDot):
    """y = x / ||x||, no gain; the same bug."""

    @staticmethod
    def backward(ctx, g):
        y, norm = ctx.saved_tensors
        return g / norm


@pytest.mark.parametrize("shape", [(3, 4, 6), (3, 6), (8, 5)])
def test_rmsnorm_with_a_gain_and_l2_normalisation_are_told_apart(shape):
    """The two differ by the constant sqrt(D), so both fit forward's output up to a gain per
    column: the op named is the one whose gain is nearest 1."""
    x, weight = leaf(shape, 5, dtype="float32"), leaf(shape[-1], 6, 0.3, 1.0, dtype="float32")
    rms = failing(RMSNormRConstant.apply, (x, weight)).per_tensor["x"]
    assert "forward is the RMSNorm of 'x'" in rms.pattern and "RMSNorm's backward" in rms.hint, rms.hint
    assert "L2" not in rms.hint
    l2 = failing(L2NormalizeRConstant.apply, (leaf(shape, 7),)).per_tensor["x"]
    assert "forward is the L2 normalisation of 'x'" in l2.pattern and "RMSNorm" not in l2.hint, l2.hint


class SoftplusSharpnessTermMissing(Function):
    """y = log(1 + exp(beta x)) / beta, beta per channel; the bug: d/dbeta misses -softplus / beta^2,
    a term that outweighs the one kept, so the gradient has mostly the opposite sign."""

    @staticmethod
    def forward(ctx, x, beta):
        sp = np.logaddexp(0, beta * x)
        ctx.save_for_backward(x, beta, sp)
        return sp / beta

    @staticmethod
    def backward(ctx, g):
        x, beta, sp = ctx.saved_tensors
        s = 1 / (1 + np.exp(-beta * x))
        return g * s, (g * x * s / beta).reshape(-1, x.shape[-1]).sum(axis=0)


def test_a_missing_term_that_outweighs_the_rest_is_not_called_the_main_terms_sign():
    rng = np.random.default_rng(3)
    x = tinymlp.tensor(rng.standard_normal((4, 5)), requires_grad=True, dtype="float64")
    beta = tinymlp.tensor(rng.uniform(0.5, 2.0, 5), requires_grad=True, dtype="float64")
    report = failing(SoftplusSharpnessTermMissing.apply, (x, beta))
    result = report.per_tensor["beta"]
    assert report.per_tensor["x"].ok and result.hint_kind == "wrong_formula"
    assert "correlation of analytical and numerical -0.9" in result.pattern, result.pattern
    assert "main term" not in result.hint
    assert "a term of the derivative that outweighs the others is missing from backward or has the wrong sign" \
        in result.hint


class SquashNoInverseNorm(Function):
    """y = x / (1 + ||x||) per row (no known op); the bug: the 1 / ||x|| of d||x||/dx is missing."""

    @staticmethod
    def forward(ctx, x):
        norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
        ctx.save_for_backward(x, norm)
        return x / (1 + norm)

    @staticmethod
    def backward(ctx, g):
        x, norm = ctx.saved_tensors
        inner = (g * x).sum(axis=-1, keepdims=True)
        return g / (1 + norm) - x * inner / (1 + norm) ** 2  # should divide the second term by norm too


def test_an_unknown_op_gets_the_row_structure_without_any_op_formula():
    result = failing(SquashNoInverseNorm.apply, (leaf((3, 6), 4),)).per_tensor["x"]
    assert result.hint_kind == "row_multiple", result.hint
    assert "that row of 'x' times a coefficient" in result.pattern and "forward is the" not in result.pattern
    assert "a term c * x of backward has a wrong coefficient c in each row" in result.hint
    for other in ("LayerNorm", "RMSNorm", "L2", "mean(g)"):
        assert other not in result.hint


class LayerNormMeanTermsOverD(Function):
    """x_hat over the last axis; the bug: both mean terms of backward divided by D again."""

    @staticmethod
    def forward(ctx, x):
        xc = x - x.mean(axis=-1, keepdims=True)
        r = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5)
        ctx.save_for_backward(xc * r, r)
        return xc * r

    @staticmethod
    def backward(ctx, g):
        xh, r = ctx.saved_tensors
        D = xh.shape[-1]
        return r * (g - g.mean(axis=-1, keepdims=True) / D - xh * (g * xh).mean(axis=-1, keepdims=True) / D)


def test_layernorm_is_still_told_its_own_formula():
    result = failing(LayerNormMeanTermsOverD.apply, (leaf((3, 6), 3, 2.0),)).per_tensor["x"]
    assert "forward is the LayerNorm of 'x' along axis 1" in result.pattern
    assert "compare r * (g - mean(g) - x_hat * mean(g * x_hat)) term by term" in result.hint


class SoftmaxSumOverAxis0(Function):
    """softmax over the last axis; the bug: backward's (g * p) sum runs over axis 0."""

    @staticmethod
    def forward(ctx, s):
        p = softmax(s)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (g * p).sum(axis=0, keepdims=True))  # should be axis=-1


def test_a_sum_over_the_wrong_axis_is_named_from_the_axes_the_error_varies_along():
    result = failing(SoftmaxSumOverAxis0.apply, (leaf((4, 5), 21),)).per_tensor["s"]
    assert result.hint_kind == "wrong_axis", result.hint
    assert "one term per row of axis 0 plus one term per row of axis 1" in result.pattern
    assert "backward reduces over the wrong axis" in result.hint and "two inputs" not in result.hint


def test_a_one_input_op_is_never_told_its_gradients_are_in_the_wrong_order():
    class TanhWrongDerivative(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return np.tanh(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x * x

    result = failing(TanhWrongDerivative.apply, (leaf((4, 5), 1),)).per_tensor["x"]
    assert result.hint.startswith("unrelated to the true gradient"), result.hint
    assert "two inputs" not in result.hint


# ----------------------------------------------------------------------------- a factor, not a term


class SoftmaxTemperature(Function):
    """p = softmax(x / tau); the bug: dtau divided by tau instead of tau^2 (analytical = tau x numerical)."""

    @staticmethod
    def forward(ctx, x, tau):
        p = softmax(x / tau)
        ctx.save_for_backward(p, x, tau)
        return p

    @staticmethod
    def backward(ctx, g):
        p, x, tau = ctx.saved_tensors
        dz = p * (g - (g * p).sum(axis=-1, keepdims=True))
        dtau = -unbroadcast(dz * x, np.shape(tau))
        return dz / tau, dtau / tau  # should be dtau / tau**2


def test_temperature_gradient_off_by_tau_is_a_factor_equal_to_the_input():
    tau = tinymlp.tensor(np.array([0.4273]), requires_grad=True, dtype="float64")
    report = failing(SoftmaxTemperature.apply, (leaf((3, 5), 5), tau))
    result = report.per_tensor["tau"]
    assert report.per_tensor["x"].ok
    assert result.hint_kind == "factor_of_input", report.summary()
    assert "a factor tau (= input 'tau' = 0.4273)" in result.hint
    assert "analytical = tau x numerical" in result.pattern
    assert "term" not in result.hint


def test_a_per_row_temperature_is_a_per_row_factor_equal_to_the_input():
    tau = tinymlp.tensor(np.array([[0.5], [0.8], [1.7]]), requires_grad=True, dtype="float64")
    result = failing(SoftmaxTemperature.apply, (leaf((3, 5), 6), tau)).per_tensor["tau"]
    assert result.hint_kind == "factor_of_input", result.hint
    assert "a factor tau (= input 'tau', element by element)" in result.hint


def test_a_constant_factor_per_row_is_reported_as_a_factor():
    class TanhRowFactor(Function):
        @staticmethod
        def forward(ctx, x):
            y = np.tanh(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * (1 - y * y) * np.array([1.3, 0.6, 2.2, 0.9])[:, None]

    result = failing(TanhRowFactor.apply, (leaf((4, 5), 7),)).per_tensor["x"]
    assert result.hint_kind == "row_factor", result.hint
    assert "constant along each row of axis 0" in result.pattern
    assert "1.3, 0.6, 2.2, 0.9" in result.pattern


# ----------------------------------------------------------------------------- float32 precision


class CenteredNormE2(Function):
    """x_hat over the last axis, forward with centred values; backward recomputes the variance as
    E[x^2] - E[x]^2, which cancels in float32 for rows around 1000 with a spread of 1."""

    @staticmethod
    def forward(ctx, x):
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        ctx.save_for_backward(x)
        return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        mu = x.mean(axis=-1, keepdims=True)
        var = (x * x).mean(axis=-1, keepdims=True) - mu * mu
        r = 1 / np.sqrt(var + 1e-5)
        xh = (x - mu) * r
        return r * (g - g.mean(axis=-1, keepdims=True) - xh * (g * xh).mean(axis=-1, keepdims=True))


class SoftmaxNoMaxBackward(Function):
    """softmax; forward subtracts the row max, backward recomputes exp(x) without it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return softmax(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        e = np.exp(x)
        p = e / e.sum(axis=-1, keepdims=True)
        return p * (g - (g * p).sum(axis=-1, keepdims=True))


X1000 = {"shape": (3, 16), "seed": 1, "shift": 1000.0, "dtype": "float32"}  # rows around 1000, spread 1


def test_a_float32_backward_losing_precision_is_said_although_the_check_passes():
    x = leaf(**X1000)
    report = check(CenteredNormE2.apply, (x,))
    assert report.passed, report.summary()
    assert "float32_backward" in report.warning_kinds, report.summary()
    text = dict(report.warnings)["float32_backward"]
    assert "differs from the float64 backward on the same inputs" in text
    assert "CenteredNormE2.backward" in text and "E[x^2] - E[x]^2" in text, text


def test_a_float32_check_calls_precision_loss_precision_not_off_by_one():
    x = leaf(**X1000)
    report = failing(CenteredNormE2.apply, (x,), dtype=None)
    result = report.per_tensor["x"]
    text = report.summary()
    assert "boundary" not in text and "off-by-one" not in text, text
    assert result.hint_kind == "precision_loss", text
    assert "the same backward in float64 agrees with the numerical gradient" in result.pattern
    assert "E[x^2] - E[x]^2" in result.hint


def test_an_exp_overflowing_in_a_float32_backward_is_named():
    x = leaf((3, 6), 9, shift=90.0, dtype="float32")
    report = failing(SoftmaxNoMaxBackward.apply, (x,))  # a float32 layer whose backward gives NaN fails
    result = report.per_tensor["x"]
    assert result.hint_kind == "overflow" and "float32_backward" not in report.warning_kinds, report.summary()
    assert "inf or NaN" in result.pattern and "exp" in result.hint and "88.7" in result.hint, result.hint


def test_correct_float32_layers_get_no_precision_warning():
    for fn in (tinymlp.functional.gelu, nn.LayerNorm(16)):
        report = check(fn, (leaf((8, 16), 10, dtype="float32"),))
        assert report.passed and "float32_backward" not in report.warning_kinds, report.summary()


# ----------------------------------------------------------------------------- state


class CenterByRunningMean(nn.Module):
    """y = x - m, m a running mean of the batch means, started at the first batch's mean and
    updated in forward (two calls on the same x agree; a call on other inputs moves m)."""

    def __init__(self, momentum=0.1):
        super().__init__()
        self.momentum, self.running_mean = momentum, None

    def forward(self, x):
        m = x.data.mean(axis=0)
        self.running_mean = m if self.running_mean is None else \
            (1 - self.momentum) * self.running_mean + self.momentum * m
        return x - tinymlp.tensor(self.running_mean, dtype=x.dtype)


_BUFFERS = {}


class TanhIntoBuffer(Function):
    """tanh written into one buffer per shape, which forward saves for backward and the next
    call overwrites."""

    @staticmethod
    def forward(ctx, x):
        buf = _BUFFERS.setdefault((x.shape, x.dtype), np.empty_like(x))
        np.tanh(x, out=buf)
        ctx.save_for_backward(buf)
        return buf.copy()

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


def test_a_running_mean_updated_in_forward_is_a_problem_on_the_first_call():
    layer = CenterByRunningMean()
    report = failing(layer, (leaf((5, 3), 11),))
    assert "stateful" in report.hint_kinds, report.summary()
    text = report.summary()
    assert "forward deterministic: NO" in text
    assert "PROBLEM (stateful): forward is stateful" in text
    assert "after one call on other inputs" in text and "running mean" in text
    assert "backward may be fine" not in text


def test_a_buffer_overwritten_by_the_next_call_is_caught_in_one_check():
    report = failing(TanhIntoBuffer.apply, (leaf((4, 5), 12),))
    assert "saved_overwritten" in report.hint_kinds, report.summary()
    text = report.summary()
    assert "TanhIntoBuffer's ctx.saved_tensors[0]" in text and "overwritten by the next call" in text
    assert "copy" in text


def test_layers_without_state_pass_the_state_checks():
    for fn in (nn.Linear(4, 3), nn.LayerNorm(4), tinymlp.functional.gelu):
        report = check(fn, (leaf((3, 4), 13),))
        assert report.passed and report.settings.deterministic, report.summary()


# ----------------------------------------------------------------------------- repeated indices


class ScaledLookup(Function):
    """y[i] = table[ids[i]] * x[i]; the bug: dtable[ids] += g * x keeps one contribution per repeated id."""

    @staticmethod
    def forward(ctx, table, ids, x):
        ctx.save_for_backward(table, ids, x)
        return table[ids] * x

    @staticmethod
    def backward(ctx, g):
        table, ids, x = ctx.saved_tensors
        dtable = np.zeros_like(table)
        dtable[ids] += g * x  # should be np.add.at(dtable, ids, g * x)
        return dtable, None, g * table[ids]


def test_a_dropped_scatter_with_repeated_ids_names_np_add_at():
    ids = np.array([1, 3, 1, 0, 4, 3, 3])
    report = failing(ScaledLookup.apply, (leaf((6, 4), 14), ids, leaf((7, 4), 15)))
    result = report.per_tensor["table"]
    assert report.per_tensor["x"].ok
    assert result.hint_kind == "repeated_index", report.summary()
    assert "rows 1, 3 of 'table'" in result.pattern and "repeated in 'ids'" in result.pattern
    assert "np.add.at(" in result.hint


# ----------------------------------------------------------------------------- degenerate inputs


class SinFeatureNoCos(Function):
    """y = sin(2 pi x); the bug: backward forgets the cos (exact wherever x is a whole number)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.sin(2 * np.pi * x)

    @staticmethod
    def backward(ctx, g):
        return g * 2 * np.pi


class ScaleNoGain(Function):
    """y = x * w + b; the bug: dx forgets w (exact when w is all ones)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x * w + b

    @staticmethod
    def backward(ctx, g):
        x, _w = ctx.saved_tensors
        return g, (g * x).sum(axis=0), g.sum(axis=0)  # should be g * _w


def test_the_temperature_bug_at_tau_one_passes_with_a_warning():
    report = check(SoftmaxTemperature.apply, (leaf((3, 5), 5), scalar(1.0)))
    assert report.passed
    assert "constant_values" in report.warning_kinds
    assert "'tau' is exactly 1" in dict(report.warnings)["constant_values"]
    assert not check(SoftmaxTemperature.apply, (leaf((3, 5), 5), scalar(1.7))).passed


def test_the_batch_bug_at_a_batch_of_one_passes_with_a_warning():
    report = check(L2NormalizeBatchDot.apply, (leaf((1, 6), 1),))
    assert report.passed
    assert "batch_of_one" in report.warning_kinds
    assert "'x' has a batch of one" in dict(report.warnings)["batch_of_one"]


def test_whole_number_inputs_pass_a_wrong_derivative_with_a_warning():
    x = tinymlp.tensor(np.arange(12.0).reshape(3, 4) - 5, requires_grad=True, dtype="float64")
    report = check(SinFeatureNoCos.apply, (x,))
    assert report.passed
    assert "every value of 'x' is a whole number" in dict(report.warnings)["integer_values"]
    assert not check(SinFeatureNoCos.apply, (leaf((3, 4), 16),)).passed


def test_ones_and_zeros_parameters_are_warned_and_a_passing_check_warns_in_python():
    x, w, b = leaf((3, 4), 17), scalar(np.ones(4)), scalar(np.zeros(4))
    with pytest.warns(GradcheckWarning) as record:
        report = gradcheck(ScaleNoGain.apply, (x, w, b))
    assert report.passed
    said = [str(w.message) for w in record]
    assert any("'w' is exactly 1" in m for m in said) and any("'b' is exactly 0" in m for m in said), said
    assert "'b' is exactly 0" in str(report)
    assert "warning (constant_values)" in str(report)
    assert not check(ScaleNoGain.apply, (x, leaf(4, 18), b)).passed


def test_general_inputs_get_no_warnings():
    layer = nn.Linear(4, 3)
    layer.bias.data[...] = np.random.default_rng(20).normal(size=3)
    report = check(layer, (leaf((3, 4), 19),))
    assert report.passed and not report.warnings, report.summary()

"""Reports on layers from class assignments (``gradcheck_layers.py``): each hint read from where the
error lies, ties checked before they are waved away, the right Function blamed.

Each buggy layer's report must name the right input, the extent or cause of the error and the
Function at fault; each correct layer must pass, however awkward its inputs (ties, saturation).
"""

import warnings

import numpy as np
import pytest

import tinymlp
from tinymlp import Function, gradcheck, nn
from tinymlp.gradcheck import GradcheckWarning
from tinymlp.gradcheck.blame import reference_function

import gradcheck_layers as layers
from gradcheck_layers import leaf

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")  # the layers' own

def check(fn, inputs, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GradcheckWarning)
        return gradcheck(fn, inputs, raise_on_fail=False, **options)


def failing(fn, inputs, **options):
    report = check(fn, inputs, **options)
    assert not report.passed, report.summary()
    return report


def passing(fn, inputs, **options):
    report = check(fn, inputs, **options)
    assert report.passed, report.summary()
    return report


# ----------------------------------------------------------------------------- the Function at fault


def residual_inputs():
    return leaf((3, 4), 9), leaf((4, 4), 10, 0.5), leaf((4,), 11)


def test_a_gradient_changed_in_place_blames_the_function_that_changed_it():
    report = failing(layers.residual_block(layers.LeakyReLUInPlace), residual_inputs(), names=["x", "w", "b"])
    text = report.summary()
    problem = dict(report.problems)["mutated_upstream"]
    assert problem.startswith("LeakyReLUInPlace.backward changed its incoming gradient in place"), text
    assert "Add.backward had handed that same array to its input 0 (the path to 'x') too" in problem, text
    assert "Add.backward changed" not in text
    x = report.per_tensor["x"]
    assert x.hint_kind == "changed_in_place", text
    assert "fix LeakyReLUInPlace.backward" in x.hint
    assert "Linear.backward (its input 0 'x')" in x.source and "Add.backward (its input 0 'a')" in x.source
    assert "changed in place by LeakyReLUInPlace.backward" in x.source


def test_the_same_block_with_a_new_array_passes():
    passing(layers.residual_block(layers.LeakyReLU), residual_inputs(), names=["x", "w", "b"])


def test_reports_name_reference_functions_never_fast_tier_classes():
    report = failing(layers.residual_block(layers.LeakyReLUInPlace), residual_inputs(), names=["x", "w", "b"])
    fast = [name for name in ("Fast", "Compiled", "Cuda") if name in report.summary()]
    assert not fast, report.summary()
    for (reference, _device), impl in tinymlp.dispatch.registered().items():
        if isinstance(impl, type):
            assert reference_function(impl) is reference
    assert reference_function(tinymlp.fast.activation.FastGELU) is tinymlp.ops.activation.GELU
    assert reference_function(layers.LeakyReLUInPlace) is layers.LeakyReLUInPlace


# ----------------------------------------------------------------------------- the extent of a missing term


def groupnorm_inputs():
    return leaf((2, 6, 4), 1), leaf((6,), 2, 0.3, 1.0), leaf((6,), 3)


def test_a_missing_group_mean_is_named_over_its_block_not_one_axis():
    x = failing(layers.GroupNormNoGroupMean.apply, groupnorm_inputs()).per_tensor["x"]
    assert x.hint_kind == "block_constant", x.hint
    assert ("constant on each block of 12 elements: 3 consecutive indices of axis 1 ([0:3], [3:6]) x all 4 of "
            "axis 2") in x.pattern
    assert "forward normalises 'x' over these same blocks" in x.pattern
    assert "g.reshape(2, 2, 3, 4).mean(axis=(2, 3), keepdims=True)" in x.hint and "block-mean term" in x.hint
    assert "g.mean(axis=2" not in x.hint


def test_a_group_mean_taken_over_one_axis_is_told_its_extent_is_wrong():
    x = failing(layers.GroupNormPositionMean.apply, groupnorm_inputs()).per_tensor["x"]
    assert x.hint_kind == "wrong_extent", x.hint
    assert "constant over axis 2 only" in x.pattern and "forward normalises 'x' over blocks of 12" in x.pattern
    assert "take every mean (or sum) in backward over forward's block" in x.hint
    assert "g.reshape(2, 2, 3, 4).mean(axis=(2, 3), keepdims=True)" in x.hint


def test_a_block_over_axes_apart_is_named_with_both():
    x = failing(layers.BatchNormNoMean.apply, (leaf((3, 4, 5), 1),)).per_tensor["x"]
    assert x.hint_kind == "block_constant", x.hint
    assert "block of 15 elements: all 3 of axis 0 x all 5 of axis 2" in x.pattern
    assert "g.reshape(3, 4, 5).mean(axis=(0, 2), keepdims=True)" in x.hint


def test_a_correct_groupnorm_passes():
    passing(layers.GroupNorm.apply, groupnorm_inputs())


# ----------------------------------------------------------------------------- a mask dropped in backward


def attention_inputs():
    return leaf((2, 4, 3), 6), leaf((2, 4, 3), 7), leaf((2, 4, 3), 8)


def test_a_mask_dropped_in_backward_is_named_although_other_elements_fail_too():
    report = failing(layers.CausalAttentionMaskForgotten.apply, attention_inputs())
    q = report.per_tensor["q"]
    assert q.hint_kind == "ignored_by_forward", report.summary()
    assert "6 of 18 failing elements (q[0, 0, 0], q[0, 0, 1], q[0, 0, 2] ...) have a numerical gradient of " \
           "exactly 0" in q.pattern
    assert "a mask or tril missing?" in q.hint and "the other 12 failing elements, which forward uses" in q.hint
    assert "split/gate" not in report.summary()
    for name in ("k", "v"):
        other = report.per_tensor[name]
        assert other.hint_kind == "shared_intermediate" and "mask missing in backward" in other.hint, other.hint


def test_a_saturated_output_is_not_taken_for_a_mask():
    class TanhExtraTerm(Function):
        @staticmethod
        def forward(ctx, x):
            y = np.tanh(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * (1 - y * y) + 0.1 * g

    x = leaf((3, 4), 0)
    x.data[0, :2] = 40.0  # tanh is 1.0 to the last bit there, and for 20 or 60 too
    result = failing(TanhExtraTerm.apply, (x,)).per_tensor["x"]
    assert result.hint_kind != "ignored_by_forward" and "mask" not in result.hint, result.hint


def test_a_correct_causal_attention_passes():
    passing(layers.CausalAttention.apply, attention_inputs())


# ----------------------------------------------------------------------------- a broadcast parameter


@pytest.mark.parametrize("layer, x_shape, right, wrong", [
    (layers.SwishBetaWrongAxis, (5, 5), "axis 0", "axis 1"),
    (layers.SwishBetaWrongAxis3d, (2, 4, 4), "axes 0 and 1", "axes 0 and 2"),
], ids=["2d", "3d"])
def test_a_parameter_summed_over_the_wrong_axis_names_both_axes(layer, x_shape, right, wrong):
    beta = leaf(x_shape[-1:], 5, 0.5, 1.0)
    result = failing(layer.apply, (leaf(x_shape, 4), beta)).per_tensor["beta"]
    assert result.hint_kind == "summed_over_wrong_axis", result.hint
    assert f"forward broadcasts 'beta' ({x_shape[-1]},) to {x_shape}" in result.pattern
    assert f"its gradient is the sum over {right} of one contribution per position" in result.pattern
    assert f"backward's gradient is exactly their sum over {wrong}" in result.pattern
    assert result.hint.startswith(f"the gradient of 'beta' is summed over {wrong} where {right} belong")


class SwishLayer(nn.Module):
    """A student's layer around the Function, with beta a parameter (checked by its dotted name)."""

    def __init__(self, function, channels):
        super().__init__()
        self.function = function
        self.beta = nn.Parameter(np.random.default_rng(5).normal(size=channels) * 0.5 + 1.0)

    def forward(self, x):
        return self.function.apply(x, self.beta)


def test_a_module_parameter_summed_over_the_wrong_axis_is_named_too():
    result = failing(SwishLayer(layers.SwishBetaWrongAxis, 5), (leaf((5, 5), 4),)).per_tensor["beta"]
    assert result.kind == "param" and result.hint_kind == "summed_over_wrong_axis", result.hint
    assert "summed over axis 1 where axis 0 belongs" in result.hint


def test_a_correct_swish_with_a_learnt_beta_passes():
    passing(layers.SwishBeta.apply, (leaf((2, 4, 4), 4), leaf((4,), 5, 0.5, 1.0)))


# ----------------------------------------------------------------------------- ties at a kink


def test_ties_sent_to_both_maxima_fail_along_the_tie():
    x = failing(layers.MaxPool1dTiesToAll.apply, (layers.after_relu((2, 3, 8), 12),)).per_tensor["x"]
    assert x.verdict == "FAIL" and x.hint_kind == "ties", x.hint
    assert "7 of 7 tied group(s) (x[0, 0, 6] = x[0, 0, 7] = 0;" in x.pattern
    assert "backward / numerical = 2 on every group" in x.pattern
    assert x.hint.startswith("ties sent to every maximum") and "counts it twice" in x.hint
    assert "not a backward bug" not in (x.hint + x.pattern + x.trust)


def test_a_correct_max_pool_with_ties_passes_and_says_the_ties_were_checked():
    report = passing(layers.MaxPool1d.apply, (layers.after_relu((2, 3, 8), 12),))
    x = report.per_tensor["x"]
    assert x.verdict == "NONDIFF"
    assert "7 tied group(s)" in x.pattern and "moved together they agree with backward" in x.pattern
    assert "the ties are handled consistently; this is not a backward bug" in x.hint


def test_several_relu_kinks_at_zero_are_not_taken_for_a_tie():
    data = np.random.default_rng(0).normal(size=(3, 4))
    data[0, :2] = data[1, 1] = 0.0
    x = tinymlp.tensor(data, requires_grad=True, dtype="float64")
    result = passing(tinymlp.functional.relu, (x,)).per_tensor["x"]
    assert result.verdict == "NONDIFF" and not result.ties and "not a backward bug" in result.hint


# ----------------------------------------------------------------------------- saturated outputs


@pytest.mark.parametrize("fn", [layers.Softmax.apply, tinymlp.functional.softmax], ids=["student", "library"])
def test_a_correct_softmax_on_confident_logits_passes_checked_where_it_is_not_saturated(fn):
    report = passing(fn, (layers.confident_logits(margin=95.0),))
    result = next(iter(report.per_tensor.values()))
    assert result.verdict == "ok" and result.n_unverified * 2 < result.checked
    assert "sit below the noise floor" in result.pattern and "checked instead at" in result.pattern
    assert "* 0.1 (the same signs, scaled toward 0)" in result.pattern
    assert "note " in report.summary()


def test_a_wrong_softmax_on_confident_logits_fails_where_the_error_shows():
    class SoftmaxSignFlipped(layers.Softmax):
        @staticmethod
        def backward(ctx, g):
            (p,) = ctx.saved_tensors
            return p * (g + (g * p).sum(axis=-1, keepdims=True))

    result = failing(SoftmaxSignFlipped.apply, (layers.confident_logits(margin=95.0),)).per_tensor["z"]
    assert result.pattern.startswith("checked at z * 0.1, because at the given input"), result.pattern
    assert result.n_fail == result.checked and "mask" not in result.hint


# ----------------------------------------------------------------------------- overflow


def test_a_float32_backward_overflowing_fails_and_names_the_overflow():
    report = failing(layers.SoftmaxNoMaxBackward.apply, (leaf((3, 6), 9, shift=90.0, dtype="float32"),))
    z = report.per_tensor["z"]
    assert z.verdict == "FAIL" and z.hint_kind == "overflow", report.summary()
    assert z.hint.startswith("an overflow in the float32 backward: exp overflows float32 above x = 88.7")
    assert "float32_backward" not in report.warning_kinds
    assert report.summary().startswith("tinymlp.gradcheck FAILED")


def test_nan_from_an_overflow_is_called_an_overflow_not_zero_over_zero():
    float32 = failing(layers.SoftmaxNoMaxBackward.apply, (leaf((3, 6), 9, shift=90.0, dtype="float32"),),
                      dtype=None).per_tensor["z"]
    assert float32.hint_kind == "overflow" and "not 0/0" in float32.hint and "88.7" in float32.hint, float32.hint
    float64 = failing(layers.SoftmaxNoMaxBackward.apply, (leaf((3, 6), 9, shift=800.0),)).per_tensor["z"]
    assert float64.hint_kind == "overflow" and "exp overflows float64 above x = 709.8" in float64.hint, float64.hint
    assert "0/0 in softmax" not in float64.hint


def test_a_correct_float32_softmax_at_large_logits_passes():
    passing(layers.Softmax.apply, (leaf((3, 6), 9, shift=90.0, dtype="float32"),))

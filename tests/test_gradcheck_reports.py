"""What a gradcheck report says about planted bugs: it must never mislead a student (issue 15).

Each test plants one bug (or one awkward layer) that a student wrote while doing an assignment
cold, and asserts the words of the report: which elements, which cause, which Function, what
is still known, and what gradcheck did *not* check.
"""

import re
import subprocess
import sys

import numpy as np
import pytest

import tinymlp
from tinymlp import Function, gradcheck
from tinymlp.autograd import unbroadcast
from tinymlp.gradcheck import GradcheckError, GradcheckReport


def leaf(shape, seed=0, scale=1.0, dtype="float64"):
    return tinymlp.tensor(np.random.default_rng(seed).normal(size=shape) * scale, requires_grad=True, dtype=dtype)


def failing(fn, inputs, **options):
    report = gradcheck(fn, inputs, raise_on_fail=False, **options)
    assert not report.passed, report.summary()
    return report


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ----------------------------------------------------------------------------- 1. partial-scale bugs


class SoftplusPartial(Function):
    """softplus; the bug: backward is 1.01x too large where x > 0."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.logaddexp(0, x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * sigmoid(x) * np.where(x > 0, 1.01, 1.0)


class TanhRowsScaled(Function):
    """tanh; the bug: rows 1 and 3 of the gradient are 1.5x too large."""

    @staticmethod
    def forward(ctx, x):
        out = np.tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        grad = g * (1 - out * out)
        grad[[1, 3]] *= 1.5
        return grad


def test_partial_scale_says_which_elements_and_that_the_others_are_right():
    x = leaf((4, 5), 0)
    assert (x.data > 0).sum() == 9
    result = failing(SoftplusPartial.apply, (x,)).per_tensor["x"]
    assert result.hint_kind == "partial_scale"
    assert "only 9 of 20 elements are off by the factor 1.01" in result.hint
    assert "where x > 0" in result.hint
    assert "the other 11 of 20 elements are right" in result.pattern
    assert "constant factor" not in result.hint  # the old, misleading wording


def test_partial_scale_on_rows():
    x = leaf((5, 4), 1)
    result = failing(TanhRowsScaled.apply, (x,)).per_tensor["x"]
    assert result.hint_kind == "partial_scale"
    assert "exactly rows 1, 3 of 'x'" in result.hint and "only 8 of 20 elements" in result.hint


# ----------------------------------------------------------------------------- 2. float32 inside a layer


class Swish32(Function):
    """swish computed in float32 and cast back (the layer's flaw); backward is the right formula."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        x32 = x.astype(np.float32)
        return (x32 * (1 / (1 + np.exp(-x32)))).astype(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = sigmoid(x)
        return g * (s + x * s * (1 - s))


class Swish32WrongBackward(Swish32):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * sigmoid(x)  # the x s (1 - s) term is missing


class DowncastForward(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.astype(np.float32) * np.float32(2)

    @staticmethod
    def backward(ctx, g):
        return (2 * g).astype(ctx.dtype)


def test_float32_inside_forward_is_named_and_backward_not_blamed():
    report = failing(Swish32.apply, (leaf((4, 5), 4, 3.0),))
    result = report.per_tensor["x"]
    assert "low_precision" in report.hint_kinds and result.hint_kind == "low_precision"
    assert result.verdict == "INCONCLUSIVE" and result.n_fail == 0  # not called wrong
    assert "float32 inside forward, not a backward bug" in result.hint
    assert "backward agrees on 20 of 20 elements" in result.hint
    text = report.summary()
    assert "gradcheck promoted the inputs to float64" in text
    assert "backward may be fine" not in text and "the analytical gradient is wrong" not in text


def test_float32_inside_forward_with_a_wrong_backward_still_fails():
    result = failing(Swish32WrongBackward.apply, (leaf((4, 5), 4, 3.0),)).per_tensor["x"]
    assert result.verdict == "FAIL" and result.hint_kind == "low_precision"
    assert "backward looks wrong too" in result.hint


def test_float64_forwards_are_not_taken_for_float32():
    x = leaf((4, 5), 4, 3.0)
    report = failing(Swish32WrongBackward.apply, (x,), dtype=None)  # the user's float64, honestly
    assert report.per_tensor["x"].hint_kind == "low_precision"
    bad = failing(SwishSignInside.apply, (x,))  # a float64 forward with a real backward bug
    assert bad.per_tensor["x"].hint_kind == "wrong_formula" and "low_precision" not in bad.hint_kinds
    good = gradcheck(lambda x: tinymlp.tanh(x) * x, (x,))
    assert good.passed and "low_precision" not in good.hint_kinds


def test_downcast_problem_appears_once_and_says_gradcheck_promoted():
    x = leaf((2, 3), 18, dtype="float32")
    text = failing(DowncastForward.apply, (x,)).summary()
    assert text.count("forward downcasts") == 1
    assert "gradcheck promoted the inputs to float64 (they were float32)" in text
    assert "not checked: forward returns float32 (PROBLEM (downcast) above)" in text


# ----------------------------------------------------------------------------- 3. sampled mode


class TanhLastRowWrong(Function):
    @staticmethod
    def forward(ctx, x):
        out = np.tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        grad = g * (1 - out * out)
        grad[-1] *= 1.5
        return grad


def test_sampled_pass_says_how_many_were_checked_and_how_to_check_all():
    x = leaf((250, 400), 27)
    report = gradcheck(lambda x: tinymlp.tanh(x), (x,))
    assert report.passed
    text = report.summary()
    assert "sampled mode checked 64 of 100,000 elements and 4 random directions" in text
    assert "mode='full' (200,000 forwards)" in text
    assert "64 of 100000 + 4 dir" in text  # the table's checked column


@pytest.mark.slow
def test_sampled_failure_counts_agree_between_table_and_pattern():
    x = leaf((250, 400), 5)  # 100,000 elements: too many for the full fallback
    report = failing(TanhLastRowWrong.apply, (x,))
    result = report.per_tensor["x"]
    assert result.mode.startswith("sampled") and result.n_directions == 4 + result.n_blocks
    elements = int(re.search(r"on all (\d+) failing elements", result.pattern).group(1))
    directions = int(re.search(rf"(\d+) of {result.n_directions} directions fail", result.pattern).group(1))
    assert elements + directions == result.n_fail  # the table's "fail" column
    assert f"worst {len(result.worst)} of {result.n_fail} failing checks" in report.summary()
    assert f"of {result.n_elements} elements and {result.n_directions} directions" in report.summary()
    assert "exactly row 249 of 'x'" in result.pattern  # the failing blocks were halved down to the row


# ----------------------------------------------------------------------------- 4. every element fails


class SwishSignInside(Function):
    """swish' = s + x s (1 - s), written s - x s (1 - s)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = sigmoid(x)
        return g * (s - x * s * (1 - s))


class TanhPlusSquareWrongFactor(Function):
    """out = tanh(x) + x^2; the bug: d(x^2) written 3x instead of 2x (an error of exactly g * x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.tanh(x) + x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (1 - np.tanh(x) ** 2) + 3 * g * x


class MulTanhSwapped(Function):
    """out = x * tanh(w); the bug: the two gradients are returned in the wrong order."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * np.tanh(w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        t = np.tanh(w)
        return g * x * (1 - t * t), g * t


def test_every_element_failing_still_says_what_is_known():
    result = failing(SwishSignInside.apply, (leaf((4, 5), 6, 2.0),)).per_tensor["x"]
    assert result.hint_kind == "wrong_formula"
    assert "all 20 elements fail" in result.pattern
    assert "signs agree on 17 of 20 elements" in result.pattern
    assert "correlation of analytical and numerical 0.96" in result.pattern
    assert "a term of the derivative is missing or has the wrong sign" in result.hint
    assert "(analytical - numerical) / (g * x) is negative on every element" in result.pattern
    assert "look for a term x * (...) of the derivative that is missing or has its sign flipped" in result.hint
    unrelated = failing(MulTanhSwapped.apply, (leaf((3, 3), 7), leaf((3, 3), 8)), wrt=["x"]).per_tensor["x"]
    assert unrelated.hint_kind == "wrong_formula" and "unrelated to the true gradient" in unrelated.hint


def test_error_proportional_to_an_input_is_named():
    result = failing(TanhPlusSquareWrongFactor.apply, (leaf((3, 4), 7),)).per_tensor["x"]
    assert result.hint_kind == "wrong_formula"
    assert "analytical - numerical = 1 x g * x exactly" in result.pattern
    assert "proportional to an input" in result.hint


def test_swapped_gradients_would_pass_swapped():
    report = failing(MulTanhSwapped.apply, (leaf((3, 3), 7), leaf((3, 3), 8)))
    for name in ("x", "w"):
        result = report.per_tensor[name]
        assert result.hint_kind == "swapped"
        assert "swapping them would pass" in result.hint


# ----------------------------------------------------------------------------- 5. naming


class BiasAdd(Function):
    """x + b with b broadcast over the batch; ``wrong`` doubles b's gradient."""

    wrong = False

    @staticmethod
    def forward(ctx, x, bias):
        return x + bias

    @staticmethod
    def backward(ctx, g):
        gb = unbroadcast(g, (g.shape[-1],))
        return g, 2 * gb if BiasAdd.wrong else gb


class TinyLayer:
    def __init__(self):
        rng = np.random.default_rng(3)
        self.weight = tinymlp.tensor(rng.normal(size=(3, 4)), requires_grad=True, dtype="float64")
        self.bias = tinymlp.tensor(rng.normal(size=(4,)), requires_grad=True, dtype="float64")

    def named_parameters(self):
        return [("fc.weight", self.weight), ("fc.bias", self.bias)]

    def forward(self, x):
        return tinymlp.tanh(BiasAdd.apply(x @ self.weight, self.bias))

    __call__ = forward


@pytest.fixture
def wrong_bias(monkeypatch):
    monkeypatch.setattr(BiasAdd, "wrong", True)


def test_inputs_of_apply_are_named_after_forward():
    x, w = leaf((3, 3), 7), leaf((3, 3), 8)
    report = gradcheck(MulTanhSwapped.apply, (x, w), raise_on_fail=False)
    assert list(report.per_tensor) == ["x", "w"]


def test_a_failing_parameter_names_the_function_that_computed_its_gradient(wrong_bias):
    report = failing(TinyLayer(), (leaf((2, 3), 9),))
    result = report.per_tensor["fc.bias"]
    assert result.source == "BiasAdd.backward (its input 1 'bias')"
    assert "from    : BiasAdd.backward (its input 1 'bias')" in report.summary()
    assert report.per_tensor["fc.weight"].verdict == "ok"


def test_reproduce_line_shows_the_real_call():
    x = leaf((4, 5), 0)
    text = failing(SoftplusPartial.apply, (x,)).summary()
    assert "reproduce: tinymlp.gradcheck(SoftplusPartial.apply, (x,), seed=0)   # x: (4,5) float64" in text
    text = failing(lambda x: SoftplusPartial.apply(x), (x,), seed=3, mode="full").summary()
    assert "reproduce: tinymlp.gradcheck(fn, (x,), mode='full', seed=3)   # fn: the lambda at " in text
    assert "test_gradcheck_reports.py:" in text
    layer = TinyLayer()
    BiasAdd.wrong = True
    try:
        text = failing(lambda x: layer(x), (x[:, :3],), params=dict(layer.named_parameters()),
                       dtype=np.float64, upstream=np.ones((4, 4)), wrt=["fc.bias"]).summary()
    finally:
        BiasAdd.wrong = False
    assert ("reproduce: tinymlp.gradcheck(fn, (x,), params={'fc.weight': fc.weight, 'fc.bias': fc.bias}, "
            "wrt=['fc.bias'], upstream=g, seed=0)") in text


def test_reproduce_line_of_a_module(wrong_bias):
    text = failing(TinyLayer(), (leaf((2, 3), 9, dtype="float32"),)).summary()
    assert "reproduce: tinymlp.gradcheck(tinylayer, (x,), seed=0)   # tinylayer: a TinyLayer; x: (2,3) float32" \
        in text


class TanhInPlace(Function):
    """tanh written into its input (out=x): the forward modifies what it was given."""

    @staticmethod
    def forward(ctx, x):
        np.tanh(x, out=x)
        ctx.save_for_backward(x)
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * (1 - out * out)


def test_in_place_forward_names_the_mutated_input_first():
    report = failing(TanhInPlace.apply, (leaf((2, 3), 19),))
    assert report.problems[0][0] == "mutated_input"
    assert "forward modified 'x' in place" in report.problems[0][1]
    result = report.per_tensor["x"]
    assert result.hint == "not checked: forward modifies its input in place (PROBLEM (mutated_input) above)"
    assert "dropout" not in report.summary()  # not blamed on an RNG


class MulOneGradient(Function):
    """out = x * w; the bug: backward returns only x's gradient."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w


def test_too_few_gradients_reports_both_counts():
    report = failing(MulOneGradient.apply, (leaf((2, 3), 1), leaf((2, 3), 2)))
    result = report.per_tensor["w"]
    assert result.hint_kind == "too_few_gradients"
    assert "MulOneGradient.backward returned 1 gradient for 2 inputs" in result.hint
    # the engine refuses the whole backward (one gradient per input is the contract)
    assert "returned 1 gradient for 2 inputs" in report.per_tensor["x"].hint


def test_too_few_gradients_counted_by_the_engine_is_reported():
    """When the engine itself counts (GradientMismatchError kind "count"), the report says so."""
    from tinymlp.gradcheck.rejected import explain_engine_error
    from tinymlp.gradcheck import TensorResult

    result = TensorResult("w", "input", (2, 3), "float64")
    explain_engine_error(result, {"kind": "count", "fn": "MulOneGradient", "got": 1, "want": 2,
                                  "text": "MulOneGradient.backward returned 1 gradient for 2 inputs"})
    assert result.verdict == "FAIL" and result.hint_kind == "too_few_gradients"
    assert "returned 1 gradient for 2 inputs" in result.hint


# ----------------------------------------------------------------------------- 6. discoverability


def test_help_of_gradcheck_explains_reading_a_report():
    doc = tinymlp.gradcheck.__doc__
    assert "Reading a report" in doc
    for part in ("pattern", "likely", "from", "trust", "reproduce:"):
        assert part in doc
    assert "diagnose.py" not in doc and "tinymlp/gradcheck/" not in doc  # about use, not layout
    assert "summary()" in doc
    assert GradcheckReport.summary.__doc__ and "reproduce:" in GradcheckReport.summary.__doc__


def test_function_contract_is_documented():
    doc = tinymlp.Function.__doc__
    assert "one gradient per positional input" in doc and "needs_input_grad" in doc
    assert "save_for_backward" in doc and "saved_tensors" in doc
    for method in (tinymlp.Function.forward, tinymlp.Function.backward, tinymlp.Function.apply):
        assert method.__doc__ and len(method.__doc__) > 80
    assert "save_for_backward" in tinymlp.autograd.Context.__doc__


def test_testing_is_an_attribute_after_import_tinymlp():
    code = "import tinymlp; print(tinymlp.testing.assert_grads.__name__, callable(tinymlp.gradcheck))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["assert_grads", "True"]


def test_gradcheck_is_both_the_function_and_the_module():
    import importlib

    module = importlib.import_module("tinymlp.gradcheck")
    assert module.gradcheck is tinymlp.gradcheck and callable(tinymlp.gradcheck)
    assert importlib.import_module("tinymlp.gradcheck.method").gradcheck is tinymlp.gradcheck  # the file to read
    assert module.GradcheckError is GradcheckError is tinymlp.GradcheckError
    assert module.numerical_grad is tinymlp.numerical_grad
    with pytest.raises(GradcheckError):
        tinymlp.gradcheck(SoftplusPartial.apply, (leaf((4, 5), 0),))

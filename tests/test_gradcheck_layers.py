"""Reports on layers from class assignments (``gradcheck_layers.py``): each hint read from where the
error lies, ties checked before they are waved away, the right Function blamed.

Each buggy layer's report must name the right input, the extent or cause of the error and the
Function at fault; each correct layer must pass, however awkward its inputs (ties, saturation).
"""

import warnings


import tinymlp
from tinymlp import gradcheck
from tinymlp.gradcheck import GradcheckWarning
from tinymlp.gradcheck.blame import reference_function

import gradcheck_layers as layers
from gradcheck_layers import leaf


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

"""Test helpers for code built on tinymlp (pytest-friendly).

    from tinymlp.testing import assert_grads

    def test_my_layer():
        assert_grads(MyLayer(4, 3), (x,))      # fails with the full gradcheck report
"""

from __future__ import annotations

from .gradcheck import gradcheck

__all__ = ["assert_grads"]


def assert_grads(fn, inputs, **options):
    """Run ``tinymlp.gradcheck(fn, inputs, **options)``; raise AssertionError if it fails.

    The assertion message *is* the report (which tensor, which elements, both values, the
    likely cause), so pytest shows it as it is. Returns the GradcheckReport on success.
    """
    __tracebackhide__ = True  # pytest: show the caller's line, not this one
    options["raise_on_fail"] = False
    report = gradcheck(fn, inputs, **options)
    if not report.passed:
        raise AssertionError("\n" + report.summary())
    return report

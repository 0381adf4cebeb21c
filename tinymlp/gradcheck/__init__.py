"""Gradient checking, the way students check their layers: ``tinymlp.gradcheck(fn, inputs)``.

    from tinymlp import gradcheck
    gradcheck(my_layer, (x,))           # checks dL/dx and every parameter of my_layer

``method.py`` is the method, top to bottom (the file to read); around it:

* ``plan.py``: what to check: names, float64 working copies, parameters swapped in and out;
* ``checks.py``: the forward and backward sanity checks, sampled mode and stability;
* ``ties.py``: kinks, and ties among them moved together; ``conditioning.py``: a saturated
  tensor checked again at values scaled toward 0;
* ``blame.py``: backward watched node by node, and each Function named by its reference;
* ``state.py``: forward called on other inputs in between (state, saved buffers overwritten);
* ``precision.py``: a float32 layer's backward in float32 against its float64 backward, overflows;
* ``degenerate.py``: the warnings about inputs where whole classes of bugs cannot show;
* ``diagnose.py``: what failing elements have in common and the bug that usually causes it,
  with ``hints.py`` (factors, repeated indices, rows mixed in a batch), ``rows.py`` (errors
  shaped by a reduction over rows or blocks, and the normalisations whose formula may be
  named), ``broadcast.py`` (a broadcast tensor's gradient position by position) and
  ``rejected.py`` (gradients the engine refused);
* ``report.py``: ``GradcheckReport`` / ``GradcheckError`` and the report's text.

``tinymlp.gradcheck`` is the function: ``import tinymlp`` binds that name to it, over this
package, as ``torch.autograd.gradcheck`` is a function beside the module of the same name.
Import the package's parts with ``from``: ``from tinymlp.gradcheck.report import TensorResult``
(``import tinymlp.gradcheck.report as r`` walks the attribute ``tinymlp.gradcheck``, which is
the function, and fails); the names below can also be imported from ``tinymlp.gradcheck``.
"""

from .method import gradcheck, numerical_grad
from .report import (
    HINT_KINDS, PROBLEM_KINDS, WARNING_KINDS, ElementCheck, GradcheckError, GradcheckReport, GradcheckWarning,
    TensorResult,
)

__all__ = ["HINT_KINDS", "PROBLEM_KINDS", "WARNING_KINDS", "ElementCheck", "GradcheckError", "GradcheckReport",
           "GradcheckWarning", "TensorResult", "gradcheck", "numerical_grad"]

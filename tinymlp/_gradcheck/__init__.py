"""The parts of ``tinymlp.gradcheck`` around the method that ``tinymlp/gradcheck.py`` reads as.

* ``plan.py``: what to check: names, float64 working copies, parameters swapped in and out;
* ``checks.py``: the forward and backward sanity checks, sampled mode, kinks and stability;
* ``diagnose.py``: what failing elements have in common and the bug that usually causes it;
* ``report.py``: ``GradcheckReport`` / ``GradcheckError`` and the report's text.
"""

"""The course's exercises: their checks, for students, and a grader, for instructors.

In a lesson notebook, after each exercise::

    from tinymlp.lessons import check
    check("04.1", MyLayerNorm)

prints ``exercise 04.1 LayerNorm backward: passed``, ``... not done yet`` (the answer still
raises ``NotImplementedError("exercise 04.1")`` or is ``...``) or ``... FAILED`` followed by
what is wrong, a ``reproduce:`` line that runs in the notebook, and the lesson section and
library file to compare with. It never raises, and returns a value that is true once the
exercise passed (``if check(...):``) and that a notebook does not display under the line.
Because the checks are part of the installed package (``pip install -e .``), a notebook
copied out of the repository still finds them.

For an instructor, ``python -m tinymlp.lessons submissions/*/04_layernorm.ipynb`` (or
``python lessons/checks.py ...``) grades a class: see ``tinymlp/lessons/grader.py``.

The parts: ``registry.py`` (what an exercise is), ``checks/`` (the checks, one file per lesson),
``runner.py`` (running one check, the messages), ``cost.py`` (a derived backward's cost),
``forbidden.py`` (the library code an answer may not use, made unavailable to it), and for the
grader: ``notebook.py`` (an answer's code read from a notebook), ``scan.py`` (what that code may
not contain), ``identity.py`` (whose notebook, which lesson), ``sandbox.py`` (the operating
system's sandbox everything a submission runs starts in), ``edition.py`` (the library an answer's
sandbox sees), ``execute.py`` (a notebook run in its kernel), ``worker.py`` (the process that runs
one answer), ``confine.py`` (what that process may not do, Python's second layer), ``wire.py``
(the plain data that crosses between the processes), ``remote.py`` (the grader's stand-ins for an
answer in its own process), ``similarity.py`` (copies flagged), ``reports.py`` (table, CSV, JSON,
Gradescope), ``output.py`` (where results are written) and ``grader.py`` (a class's notebooks,
graded).

The checks are registered when first needed (``check``, ``EXERCISES``), so that the process
that runs a student's answer never loads them.
"""

from .registry import Exercise, Wrong
from .runner import FAILED, NOT_DONE, PASSED, Result, case, check, run_check, skipped

__all__ = ["EXERCISES", "Exercise", "Result", "Wrong", "case", "check", "main", "run_check", "skipped",
           "PASSED", "NOT_DONE", "FAILED"]


def __getattr__(name):
    if name == "EXERCISES":
        from . import checks  # noqa: F401 (registers the checks)
        from .registry import EXERCISES

        return EXERCISES
    raise AttributeError(f"module 'tinymlp.lessons' has no attribute {name!r}")


def main(argv=None) -> int:
    """The grader's command line (``python -m tinymlp.lessons --help``)."""
    from .grader import main as grade

    return grade(argv)

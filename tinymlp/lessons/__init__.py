"""The course's exercises: their checks, for students, and a grader, for instructors.

In a lesson notebook, after each exercise::

    from tinymlp.lessons import check
    check("04.1", MyLayerNorm)

prints ``exercise 04.1 LayerNorm backward: passed``, ``... not done yet`` (the answer still
raises ``NotImplementedError("exercise 04.1")`` or is ``...``) or ``... FAILED`` followed by
what is wrong, a ``reproduce:`` line that runs in the notebook, and the lesson section and
library file to compare with. It never raises and returns True once the exercise passed.
Because the checks are part of the installed package (``pip install -e .``), a notebook
copied out of the repository still finds them.

For an instructor, ``python -m tinymlp.lessons submissions/*/04_layernorm.ipynb`` (or
``python lessons/checks.py ...``) grades a class: see ``tinymlp/lessons/grader.py``.

The parts: ``registry.py`` (what an exercise is), ``exercises.py`` (the 27 checks),
``runner.py`` (running one check, the messages), ``guard.py`` (answers that call the library
code of the exercise, or patch the checker, fail), ``notebook.py`` (an answer's code read from a
notebook), ``worker.py`` (one answer graded in a fresh process), ``grader.py`` (a class's
notebooks, the table, CSV, JSON and Gradescope outputs).
"""

from . import exercises as _exercises  # noqa: F401 (registers the checks)
from .registry import EXERCISES, Exercise, Wrong
from .runner import FAILED, NOT_DONE, PASSED, Result, case, check, run_check, skipped

__all__ = ["EXERCISES", "Exercise", "Result", "Wrong", "case", "check", "main", "run_check", "skipped",
           "PASSED", "NOT_DONE", "FAILED"]


def main(argv=None) -> int:
    """The grader's command line (``python -m tinymlp.lessons --help``)."""
    from .grader import main as grade

    return grade(argv)

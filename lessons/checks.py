"""The course's grader, run from a checkout: ``python lessons/checks.py notebooks...``.

The checks live in the package, ``tinymlp/lessons/checks/`` (one file per lesson), so that a
notebook finds them wherever it is once tinymlp is installed (``pip install -e .`` from the
checkout)::

    from tinymlp.lessons import check
    check("04.1", MyLayerNorm)

This file runs the grader (``tinymlp/lessons/grader.py``; ``python -m tinymlp.lessons`` is the
same command)::

    python lessons/checks.py submissions/*/04_layernorm.ipynb                 # a table
    python lessons/checks.py --json submissions/*/*.ipynb > grades.json       # or --csv
    python lessons/checks.py --gradescope -o results/ submissions/*/*.ipynb   # one results.json each
    python lessons/checks.py --roster roster.csv submissions/*/*.ipynb        # students by folder
"""

from __future__ import annotations

import pathlib
import sys

try:
    import tinymlp.lessons  # noqa: F401
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tinymlp.lessons import EXERCISES, case, check, run_check, skipped  # noqa: E402,F401
from tinymlp.lessons.grader import execute, grade_notebook, main  # noqa: E402,F401

__all__ = ["EXERCISES", "case", "check", "execute", "grade_notebook", "main", "run_check", "skipped"]

if __name__ == "__main__":
    sys.exit(main())

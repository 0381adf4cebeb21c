"""Lets ``from checks import check`` work in notebooks of this folder that still say so.

The lessons now import ``from tinymlp.lessons import check``; the checks live in the package
(``tinymlp/lessons/``). This file loads ``lessons/checks.py``, which re-exports them.
"""

import importlib.util
import pathlib
import sys

_spec = importlib.util.spec_from_file_location(
    "checks", pathlib.Path(__file__).resolve().parent.parent / "checks.py")
_module = importlib.util.module_from_spec(_spec)
sys.modules["checks"] = _module
_spec.loader.exec_module(_module)

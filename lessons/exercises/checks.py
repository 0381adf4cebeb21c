"""Lets `from checks import check` work in the student notebooks of this folder.

The checks live one folder up, in lessons/checks.py; this file loads that module under the
name ``checks`` (so the notebooks here and those in lessons/ import the very same code).
"""

import importlib.util
import pathlib
import sys

_spec = importlib.util.spec_from_file_location(
    "checks", pathlib.Path(__file__).resolve().parent.parent / "checks.py")
_module = importlib.util.module_from_spec(_spec)
sys.modules["checks"] = _module
_spec.loader.exec_module(_module)

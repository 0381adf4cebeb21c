"""Running one exercise's check on an answer, and saying what happened in a way a student can act on.

``run_check`` returns a ``Result``: the status (passed / FAILED / not done yet), the details
(the gradcheck report, the difference from the reference, or the error with the answer's own
file, cell and line), a one-line ``reason`` (the report's first ``likely`` line), and a
``reproduce`` line that repeats the failing case where the notebook defines the answer.
``check`` prints it; the grader stores it.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
import traceback
from dataclasses import dataclass

from ..gradcheck import GradcheckError
from .guard import Forbidden, Guard
from .registry import EXERCISES, Case, Wrong

PASSED, NOT_DONE, FAILED = "passed", "not done yet", "FAILED"


@dataclass
class Result:
    id: str
    title: str
    status: str  # PASSED, NOT_DONE or FAILED
    details: str = ""  # what is wrong, several lines
    reason: str = ""  # one line: the first ``likely`` line of a report, else the first line of details
    reproduce: str = ""  # a line that repeats the failing case in the notebook
    needs: str | None = None  # the exercise whose stub the answer reached, when not its own
    seed: int | None = None  # the hidden case that failed (None: the public case)

    @property
    def head(self) -> str:
        needs = f" (it needs exercise {self.needs} first)" if self.needs and self.needs != self.id else ""
        return f"exercise {self.id} {self.title}: {self.status}{needs}"

    def text(self) -> str:
        """The lines ``check`` prints: the head, then (for a failure) the indented details."""
        lines = [self.head]
        if self.status == FAILED:
            body = self.details.rstrip("\n")
            if self.reproduce and "reproduce:" not in body:
                body += f"\nreproduce: {self.reproduce}"
            ex = EXERCISES.get(self.id)
            if ex is not None:
                body += f"\nsee: {ex.section}; the library's version: {ex.reference}"
            lines += ["    " + line if line else line for line in body.splitlines()]
        return "\n".join(lines)


def run_check(ex_id, answer, *, seeds=(None,), answer_text=None, guard=True) -> Result:
    """Run exercise ``ex_id``'s check on ``answer``: the public case (seed None) and any hidden
    case (an int seed) in ``seeds``, stopping at the first failure.

    ``answer_text`` is how the notebook spells the answer (``MyLayerNorm``), for reproduce
    lines. With ``guard`` the answer runs with the library code that would do the exercise
    for it made unavailable (``tinymlp/lessons/guard.py``).
    """
    ex = EXERCISES[ex_id]
    if _has_ellipsis(answer):
        return Result(ex.id, ex.title, NOT_DONE)
    text = answer_text or ex.answer
    for seed in seeds:
        case = Case(ex.seed if seed is None else int(seed), hidden=seed is not None)
        case.call = f"{ex.id!r}, {text}".replace("'", '"') + ("" if seed is None else f", seed={seed}")
        result = _run_case(ex, answer, case, guard)
        if result.status != PASSED:
            result.seed = seed
            return result
    return Result(ex.id, ex.title, PASSED)


def _run_case(ex, answer, case, use_guard):
    again = f"check({case.call})"
    g = Guard(ex) if use_guard else None
    try:
        if g is None:
            ex.run(answer, case)
        else:
            with g:
                ex.run(g.wrap(answer), case)
    except Forbidden as err:
        return _failed(ex, str(err), again)
    except GradcheckError as err:
        if g is not None and g.violations:
            return _failed(ex, g.violations[0], again)
        report = str(err)
        match = re.search(r"^reproduce: (.*)$", report, flags=re.M)
        return _failed(ex, report, match.group(1).split("   #")[0] if match else again)
    except (Exception, SystemExit) as err:  # noqa: BLE001: a wrong answer may raise anything; say it, never stop
        if g is not None and g.violations:
            return _failed(ex, g.violations[0], again)
        other = _not_done(err)
        if other is not None:
            return Result(ex.id, ex.title, NOT_DONE, needs=other)
        if isinstance(err, Wrong):
            return _failed(ex, str(err), again)
        return _failed(ex, describe_error(err), again)
    if g is not None and g.violations:  # refused, caught by the answer, and still wrong
        return _failed(ex, g.violations[0], again)
    return Result(ex.id, ex.title, PASSED)


def _failed(ex, details, reproduce):
    return Result(ex.id, ex.title, FAILED, details=details, reason=reason_of(details), reproduce=reproduce)


def reason_of(details: str) -> str:
    """One line for a table: the first ``likely`` line, else the first PROBLEM, else the first line."""
    for pattern in (r"^\s*likely\s*:\s*(.+)$", r"^PROBLEM \([a-z_]+\): (.+)$"):
        match = re.search(pattern, details, flags=re.M)
        if match:
            return match.group(1).strip()
    lines = [line.strip() for line in details.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _has_ellipsis(answer) -> bool:
    if answer is Ellipsis:
        return True
    if isinstance(answer, (tuple, list)):
        return any(a is Ellipsis for a in answer)
    return False


def _not_done(err) -> str | None:
    """The exercise id if err (or what caused it) is a stub's NotImplementedError."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        m = re.search(r"^exercise (\d\d\.\d+)$", str(err)) if isinstance(err, NotImplementedError) else None
        if m:
            return m.group(1)
        m = re.search(r"NotImplementedError\W+exercise (\d\d\.\d+)", str(err))
        if m:
            return m.group(1)
        err = err.__cause__ or err.__context__
    return None


# ------------------------------------------------------------------------------ where an error happened
def _library_dirs():
    import numpy

    from .. import __file__ as tinymlp_init

    dirs = {os.path.dirname(os.path.abspath(tinymlp_init)), os.path.dirname(os.path.abspath(numpy.__file__))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return tuple(d + os.sep for d in dirs)


def _is_answer_file(filename) -> bool:
    if filename.startswith("<") and not filename.startswith("<frozen"):
        return True
    return not os.path.abspath(filename).startswith(_library_dirs())


def where(filename, lineno) -> str:
    """"Cell In[12], line 19" in a notebook, else "04_layernorm.ipynb cell 14, line 19" or path:line."""
    try:
        ip = get_ipython()  # noqa: F821 (defined inside IPython)
        name = ip.compile.format_code_name(filename)
        if name:
            return f"{name[0]} {name[1]}, line {lineno}"
    except (NameError, AttributeError):
        pass
    if filename.startswith("<") and filename.endswith(">"):
        return f"{filename[1:-1]}, line {lineno}"
    return f"{filename}, line {lineno}"


def describe_error(err) -> str:
    """``TypeError: ...`` and, when it happened in the answer's own code, where, with the line."""
    text = f"{type(err).__name__}: {err}"
    frames = [f for f, _ in traceback.walk_tb(err.__traceback__)]
    mine = [f for f in frames if _is_answer_file(f.f_code.co_filename)]
    if not mine:
        return text
    frame = mine[-1]
    code = frame.f_code
    lineno = frame.f_lineno
    for f, n in traceback.walk_tb(err.__traceback__):  # the line being run in that frame
        if f is frame:
            lineno = n
    source = linecache.getline(code.co_filename, lineno).strip()
    name = getattr(code, "co_qualname", code.co_name)
    text += f"\nin {name}, {where(code.co_filename, lineno)}:"
    if source:
        text += f"\n    {source}"
    return text


# ------------------------------------------------------------------------------ in the notebook
def check(ex_id: str, answer, seed: int | None = None) -> bool:
    """Check the answer to exercise ``ex_id``; print one line (and what is wrong when it is).

    ``check("04.1", MyLayerNorm)`` runs the public case; ``seed=`` runs the hidden case a
    grader's report names. Returns True when it passed, so that later cells can use the
    answer; never raises, so a stub or a wrong answer does not stop the notebook.
    """
    if ex_id not in EXERCISES:
        print(f"exercise {ex_id}: no such exercise (known: {', '.join(sorted(EXERCISES))})")
        return False
    text = expression_of(answer, sys._getframe(1).f_globals)
    result = run_check(ex_id, answer, seeds=(seed,), answer_text=text)
    print(result.text())
    return result.status == PASSED


def expression_of(answer, names) -> str | None:
    """How the caller's globals spell ``answer``: ``MyLayerNorm``, ``(my_layer, layer_inputs)``."""
    def name_of(obj):
        for key, value in names.items():
            if value is obj and not key.startswith("_") and key not in ("In", "Out"):
                return key
        return None

    found = name_of(answer)
    if found is None and isinstance(answer, tuple):
        parts = [name_of(a) for a in answer]
        if all(parts):
            found = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return found


def case(ex_id: str, answer, seed: int | None = None, k: int = 0):
    """``(fn, inputs)`` of the k-th gradcheck that exercise ``ex_id``'s check makes on ``answer``.

    A failing report's reproduce line calls it: ``import tinymlp.lessons; tinymlp.gradcheck(
    *tinymlp.lessons.case("04.1", MyLayerNorm))`` repeats that gradcheck in the notebook, where
    its report can be read and its arrays inspected (``seed=`` for a hidden case of the grader's).
    """
    from .exercises import Captured

    ex = EXERCISES[ex_id]
    c = Case(ex.seed if seed is None else int(seed), hidden=seed is not None)
    c.capture = k
    try:
        ex.run(answer, c)
    except Captured as got:
        return got.fn, got.inputs
    raise ValueError(f"exercise {ex_id}'s check makes {c.gradchecks} gradcheck(s); there is no number {k}")


def skipped(ex_id: str, what: str) -> None:
    """Say what a cell leaves out until exercise ``ex_id`` (or "03.1 and 03.2") passes."""
    which = f"exercises {ex_id} pass" if " and " in ex_id else f"exercise {ex_id} passes"
    print(f"(skipped until {which}: {what})")

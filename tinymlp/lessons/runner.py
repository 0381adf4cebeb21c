"""Running one exercise's check on an answer, and saying what happened in a way a student can act on.

``run_check`` returns a ``Result``: the status (passed / FAILED / not done yet), the details
(the gradcheck report, the difference from the reference, or the error with the answer's own
file, cell and line), a one-line ``reason`` (the report's first ``likely`` line; for an answer
not done, why), and a ``reproduce`` line that repeats the failing case where the notebook
defines the answer. ``check`` prints it; the grader stores it.

The answer is either the student's object itself (``check`` in a notebook: it runs here, under
a ``Guard``) or the grader's stand-in for an answer that runs in a process of its own
(``remote.py``): the check, its references and its comparisons are the same code either way.
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
from . import cost
from .forbidden import Forbidden, Guard
from .registry import EXERCISES, Case, Wrong
from .remote import AnswerTimeout, ChannelError, RemoteError

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
    note: str = ""  # for the instructor, never a failure: how long the answer took at scale

    @property
    def head(self) -> str:
        needs = f" (it needs exercise {self.needs} first)" if self.needs and self.needs != self.id else ""
        return f"exercise {self.id} {self.title}: {self.status}{needs}"

    def text(self) -> str:
        """The lines ``check`` prints: the head, then (for a failure) the indented details."""
        lines = [self.head]
        if self.note:
            lines.append(f"    {self.note}")
        if self.status == FAILED:
            body = self.details.rstrip("\n")
            if self.reproduce and "reproduce:" not in body:
                body += f"\nreproduce: {self.reproduce}"
            ex = EXERCISES.get(self.id)
            if ex is not None:
                body += f"\nsee: {ex.section}; the library's version: {ex.reference}"
            lines += ["    " + line if line else line for line in body.splitlines()]
        return "\n".join(lines)


def not_done(ex, needs=None, why=None) -> Result:
    """A Result for an answer that is not there yet, saying why."""
    if why is None:
        why = (f'the answer still raises NotImplementedError("exercise {ex.id}"): the stub is still there'
               if needs in (None, ex.id) else
               f'the answer reaches exercise {needs}\'s stub (NotImplementedError("exercise {needs}")): '
               f"do {needs} first")
    return Result(ex.id, ex.title, NOT_DONE, details=why, reason=why, needs=needs)


def run_check(ex_id, answer, *, seeds=(None,), answer_text=None, remote=None) -> Result:
    """Run exercise ``ex_id``'s check on ``answer``: the public case (seed None) and any hidden
    case (an int seed) in ``seeds``, stopping at the first failure; then, for a Function answer
    of an exercise with a cost case, its cost (``cost.py``).

    ``answer_text`` is how the notebook spells the answer (``MyLayerNorm``), for reproduce
    lines. ``remote``: the ``AnswerProcess`` that runs the answer (``answer`` is then its
    stand-in); without it the answer runs here, under a ``Guard``.
    """
    from . import checks  # noqa: F401 (registers the checks)

    ex = EXERCISES[ex_id]
    if _has_ellipsis(answer):
        return not_done(ex, why="the answer is still ... (the stub)")
    guard = None if remote is not None else Guard(ex)
    try:
        if guard is not None:
            guard.__enter__()
            copied = guard.copies(answer)
            if copied:
                return _failed(ex, copied[0], "")
            answer = local_answer(answer, guard)
        text = answer_text or _name_of(answer) or ex.answer     # the student's own name, where it is known
        result = _run_cases(ex, answer, seeds, text, guard, remote)
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)
    return result


def _run_cases(ex, answer, seeds, text, guard, remote):
    backwards = (lambda: guard.ran) if guard is not None else remote.backwards
    for seed in seeds:
        case = Case(ex.seed if seed is None else int(seed), hidden=seed is not None, backwards=backwards)
        case.call = f"{ex.id!r}, {text}".replace("'", '"') + ("" if seed is None else f", seed={seed}")
        result = _run_case(ex, answer, case, guard, remote)
        if result.status != PASSED:
            result.seed = seed
            return result
    note = ""
    if ex.cost is not None and _is_function(answer):
        last = [s for s in seeds if s is not None]
        try:
            note = cost.judge(ex, answer, seed=last[-1] if last else ex.seed, limit=remote.limit if remote else None)
        except Exception as err:  # noqa: BLE001 (the same handling as a case's)
            return _result_of_error(ex, err, f"check({ex.id!r}, {text})".replace("'", '"'), guard, remote)
    violations = guard.violations if guard is not None else remote.violations()
    if violations:  # refused, caught by the answer, and still right
        return _failed(ex, violations[0], "")
    return Result(ex.id, ex.title, PASSED, note=note)


def _is_function(answer):
    from ..autograd import Function

    return isinstance(answer, type) and issubclass(answer, Function)


def _run_case(ex, answer, case, guard, remote):
    again = f"check({case.call})"
    try:
        ex.run(answer, case)
    except Exception as err:  # noqa: BLE001 (a wrong answer may raise anything; say it, never stop)
        return _result_of_error(ex, err, again, guard, remote)
    except SystemExit as err:
        return _result_of_error(ex, err, again, guard, remote)
    return Result(ex.id, ex.title, PASSED)


def _refusals(guard, remote):
    if guard is not None:
        return guard.violations
    try:
        return remote.violations()
    except (RemoteError, ChannelError, AnswerTimeout):
        return []


def _result_of_error(ex, err, again, guard, remote):
    remote_error = _find(err, RemoteError)
    if isinstance(err, Forbidden) or (remote_error is not None and remote_error.forbidden):
        return _failed(ex, str(remote_error.details if remote_error is not None else err), again)
    if isinstance(err, (AnswerTimeout, ChannelError)):
        return _failed(ex, str(err), "")
    refused = _refusals(guard, remote)
    if refused:
        return _failed(ex, refused[0], again)
    if isinstance(err, GradcheckError):
        if remote_error is not None:
            return _result_of_error(ex, remote_error, again, guard, remote)
        report = str(err)
        match = re.search(r"^reproduce: (.*)$", report, flags=re.M)
        return _failed(ex, report, match.group(1).split("   #")[0] if match else again)
    if remote_error is not None:
        if remote_error.not_done:
            return not_done(ex, remote_error.not_done)
        return _failed(ex, remote_error.details, again)
    other = stub_reached(err)
    if other is not None:
        return not_done(ex, other)
    if isinstance(err, Wrong):
        return _failed(ex, str(err), again)
    return _failed(ex, describe_error(err), again)


def _find(err, kind):
    """``err`` or the exception it was raised from (or during) that is a ``kind``."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, kind):
            return err
        err = err.__cause__ or err.__context__
    return None


def _failed(ex, details, reproduce):
    return Result(ex.id, ex.title, FAILED, details=details, reason=reason_of(details), reproduce=reproduce)


def reason_of(details: str) -> str:
    """One line for a table: the first ``likely`` line, else the first PROBLEM, else (a gradcheck
    report without either) the first failing tensor and its ``pattern`` line, else the first line."""
    for pattern in (r"^\s*likely\s*:\s*(.+)$", r"^PROBLEM \([a-z_]+\): (.+)$"):
        match = re.search(pattern, details, flags=re.M)
        if match:
            return match.group(1).strip()
    match = re.search(r"^FAIL (\S+) [^\n]*\n(?:(?![A-Z]{4} )[^\n]*\n)*?\s+pattern\s*:\s*([^\n]+)", details, flags=re.M)
    if match:
        return f"the gradient of {match.group(1)!r} is wrong: {match.group(2).strip()}"
    lines = [line.strip() for line in details.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _has_ellipsis(answer) -> bool:
    if answer is Ellipsis:
        return True
    if isinstance(answer, (tuple, list)):
        return any(a is Ellipsis for a in answer)
    return False


def stub_reached(err) -> str | None:
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


def local_answer(answer, guard):
    """The answer as the check calls it in this process: a Function through the engine's own
    ``apply`` (an ``apply`` the answer defines is not the exercise), a plain function marked as
    the answer's code (a Function's and a Module's methods are marked by the guard)."""
    from ..autograd import Function
    from ..nn import Module

    if isinstance(answer, type) and issubclass(answer, Function):
        engine = Guard.engine_apply
        return type(answer.__name__, (answer,), {"apply": classmethod(engine), "__module__": answer.__module__,
                                                 "__qualname__": answer.__qualname__, "__doc__": answer.__doc__})
    if isinstance(answer, tuple):
        return tuple(local_answer(a, guard) for a in answer)
    if isinstance(answer, (type, Module)) or not callable(answer):
        return answer
    return guard.calling(answer)


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
    if filename.startswith("<") and not filename.startswith(("<frozen", "<tinymlp")):
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
class Checked:
    """What ``check`` returns: true once the exercise passed (``if check(...):``, ``done = check(...)``).

    ``check`` has printed the result already, so as the last value of a notebook cell it shows
    nothing (no ``True`` or ``False`` under the printed line); ``result`` is the full ``Result``.
    """

    __slots__ = ("result",)

    def __init__(self, result: Result):
        self.result = result

    def __bool__(self):
        return self.result.status == PASSED

    def __eq__(self, other):
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    def __hash__(self):
        return hash(bool(self))

    def __repr__(self):
        return f"<check {self.result.id}: {self.result.status}>"

    def _ipython_display_(self):  # IPython: already printed, show nothing more
        pass


def check(ex_id: str, answer, seed: int | None = None) -> Checked:
    """Check the answer to exercise ``ex_id``; print one line (and what is wrong when it is).

    ``check("04.1", MyLayerNorm)`` runs the public case; ``seed=`` runs the hidden case a
    grader's report names. Returns a value that is true when it passed, so that later cells
    can use the answer (and that a notebook does not display); never raises, so a stub or a
    wrong answer does not stop the notebook.
    """
    from . import checks  # noqa: F401 (registers the checks)

    if ex_id not in EXERCISES:
        print(f"exercise {ex_id}: no such exercise (known: {', '.join(sorted(EXERCISES))})")
        return Checked(Result(ex_id, "", FAILED, details="no such exercise"))
    text = expression_of(answer, sys._getframe(1).f_globals)
    result = run_check(ex_id, answer, seeds=(seed,), answer_text=text)
    print(result.text())
    return Checked(result)


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
    from .checks.common import Captured  # (registers the checks)

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


def _name_of(answer):
    """The name a class or function answer was defined with (``MySwish``), if it is a plain name."""
    name = getattr(answer, "__name__", None) if isinstance(answer, type) or callable(answer) else None
    return name if isinstance(name, str) and name.isidentifier() and name != "<lambda>" else None

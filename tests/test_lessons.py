"""The lessons: both builds of every notebook run top to bottom, the exercises are graded, and
the notebooks are committed clean and up to date with their sources.

``lessons/NN_name.ipynb`` is the worked build (the answer key): run in a fresh ``python3``
kernel with ``lessons/`` as the working directory (marker ``lessons``: not in the everyday suite,
run with ``-m "slow or lessons"``), it must raise nowhere and the grader must pass every exercise of it.
``lessons/exercises/NN_name.ipynb`` is the student build: untouched, it must run to the end,
every exercise is "not done", and every cell that waits for an exercise says what it skipped.
Both go through the grader (``tinymlp.lessons.grader.grade_notebook``), so what is tested here
is what an instructor runs. The grader's command line is tested on the cheapest lesson, and on
a copy of a student notebook with a wrong answer planted in it, which must be FAILED with the
gradcheck report and its hint (``tests/test_grader.py`` tests the grader itself). ``-s``
prints each lesson's grading time: running it, then grading its exercises.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository root
LESSONS = ROOT / "lessons"
EXERCISES = LESSONS / "exercises"
NOTEBOOKS = sorted(LESSONS.glob("*.ipynb"))
STUDENT_NOTEBOOKS = sorted(EXERCISES.glob("*.ipynb"))
# a lesson without exercises has a student build identical to its worked one (tested below):
# running the worked notebook covers both
WITH_EXERCISES = [p for p in STUDENT_NOTEBOOKS if p.read_text() != (LESSONS / p.name).read_text()]
SOURCES = sorted((LESSONS / "src").glob("*.py"))
CELL_TIMEOUT = 120  # seconds per cell; grading a lesson should take under 30 s in all


def _ids(paths):
    return [p.stem for p in paths]


def _load(name, path):
    """Import a file of lessons/ as a module (once)."""
    known = sys.modules.get(name)
    if known is not None and pathlib.Path(getattr(known, "__file__", "")).resolve() == path.resolve():
        return known
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checks():
    return _load("checks", LESSONS / "checks.py")


@pytest.fixture(scope="module")
def make_lessons():
    pytest.importorskip("nbformat")
    return _load("make_lessons", LESSONS / "make_lessons.py")


@pytest.fixture
def kernel_env(monkeypatch, checkout_env):
    """The kernel imports this checkout's tinymlp, draws figures inline, uses one BLAS thread."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")


def _clean(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # without terminal colours


# ------------------------------------------------------------------------------ both builds run
SEED = 2024


def _unconfined():
    """``--unconfined`` where no sandbox can start here (the grader refuses to grade without it)."""
    from tinymlp.lessons.sandbox import unavailable

    return ["--unconfined"] if unavailable() else []


_UNCONFINED = _unconfined()


def _grade(path):
    from tinymlp.lessons import grader

    return grader.grade_notebook(path, SEED, cell_timeout=CELL_TIMEOUT)


def _fail_on_errors(name, graded):
    if graded.errors:
        pytest.fail(f"{name} raised:\n" + "\n".join(_clean(e) for e in graded.errors)
                    + "\n--- output ---\n" + _clean(graded.outputs)[-4000:], pytrace=False)


@pytest.mark.lessons
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_worked_lesson_runs_and_every_exercise_passes(path, kernel_env, checks):
    graded = _grade(path)
    print(f"{path.name}: {graded.seconds:.1f} s (run {graded.run_seconds:.1f} s, "
          f"{len(graded.rows)} exercises {graded.seconds - graded.run_seconds:.1f} s)")
    _fail_on_errors(path.name, graded)
    bad = [(r.exercise, r.status, r.details) for r in graded.rows if r.status != "passed"]
    assert not bad, f"{path.name}: exercises that do not pass in the answer key: {bad}"
    assert [r.exercise for r in graded.rows] == sorted(k for k in checks.EXERCISES if k.startswith(path.name[:2] + "."))
    assert all(graded_said == "passed" for graded_said in (r.notebook_said for r in graded.rows))
    _no_stray_values(path.name, graded.notebook)
    _checks_at_telling_points(path.stem, graded.notebook)


# gradcheck's warning that its inputs cannot show some bugs (all zeros, all ones, whole numbers, a
# batch of one), in a warning or in a report; a demonstration checks where a bug would show, except
# the cells that show such a point on purpose: (lesson, a line of the cell's source)
DEGENERATE = re.compile(r"GradcheckWarning|^warning \((constant_values|integer_values|batch_of_one)\)", re.M)
ON_PURPOSE = {("10_gradcheck_your_layer", "at_ones = gradcheck(rms_norm_no_gain, (x, ones), raise_on_fail=False)")}


def _checks_at_telling_points(name, nb):
    warned = [(i, cell.source) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
              and DEGENERATE.search(_printed(cell))]
    unplanned = [(i, _printed(nb.cells[i])[:300]) for i, source in warned
                 if not any(lesson == name and line in source for lesson, line in ON_PURPOSE)]
    assert not unplanned, f"{name}: a demonstration checks gradients where some bugs cannot show: {unplanned}"


def _no_stray_values(name, nb):
    """A cell that calls check prints its line and shows no value under it (no bare True/False)."""
    stray = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and "check(" in cell.source
             and any(o.get("output_type") == "execute_result" for o in cell.get("outputs", []))]
    assert not stray, f"{name}: check cells {stray} display a value under their printed line"


@pytest.mark.lessons
@pytest.mark.parametrize("path", WITH_EXERCISES, ids=_ids(WITH_EXERCISES))
def test_untouched_student_notebook_runs_to_the_end(path, kernel_env, checks):
    graded = _grade(path)
    print(f"exercises/{path.name}: {graded.seconds:.1f} s")
    _fail_on_errors(f"exercises/{path.name}", graded)
    assert graded.rows and all(r.status == "not done" and r.notebook_said == "not done" for r in graded.rows), \
        [(r.exercise, r.status, r.notebook_said) for r in graded.rows]
    # every cell that waits for an answer says what it skipped
    silent = []
    for i, cell in enumerate(graded.notebook.cells):
        if cell.cell_type == "code" and "skipped(" in cell.source:
            printed = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            if "(skipped until exercise" not in printed:
                silent.append(i)
    assert not silent, f"exercises/{path.name}: cells {silent} wait for an answer and say nothing"
    _no_stray_values(f"exercises/{path.name}", graded.notebook)


# ------------------------------------------------------------------------------ what a lesson prints
REPORT_HEAD = re.compile(r"^\s*tinymlp\.gradcheck (?P<status>passed|FAILED|INCONCLUSIVE): (?P<title>\S+)")
REPORT_ROW = re.compile(r"^\s+(?:input|param\w*|buffer) \S+\s+\(")
REPRODUCE = re.compile(r"^\s*reproduce: (?P<line>.+)$")
# the lessons that run gradcheck in their demonstrations (the others print no report)
REPORTING = [p for p in NOTEBOOKS if "gradcheck(" in (LESSONS / "src" / f"{p.stem}.py").read_text()]


def _printed(cell):
    return _clean("".join(_text_of(o) for o in cell.get("outputs", [])))


def _text_of(output):
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") in ("execute_result", "display_data"):
        return output.get("data", {}).get("text/plain", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}\n"
    return ""


def _reports(text):
    """(status, title, table rows, reproduce line) of every report in ``text`` with a reproduce line."""
    head, rows = None, []
    for line in text.splitlines():
        if REPORT_HEAD.match(line):
            head, rows = REPORT_HEAD.match(line), []
        elif head is not None and REPORT_ROW.match(line):
            rows.append(line.strip())
        elif REPRODUCE.match(line) and head is not None:
            yield head.group("status"), head.group("title"), rows, REPRODUCE.match(line).group("line")
            head = None


REPORT_SOURCE = re.compile(r"gradcheck|assert_grads|report|reproduce")
"""What the source of a cell that can print a gradcheck report names."""


def _pasted(line):
    """A cell that runs the reproduce line as pasted, and prints the report it gives."""
    import ast
    import textwrap

    *before, last = ast.parse(line).body
    assert isinstance(last, ast.Expr), line
    body = before + [ast.Assign(targets=[ast.Name("_pasted", ast.Store())], value=last.value)]
    code = ast.unparse(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])))
    return ("try:\n" + textwrap.indent(code, "    ") + "\n"
            "except __import__('tinymlp').GradcheckError as _error:   # a failing check raises: its report\n"
            "    _pasted = _error.report\n"
            "print(_pasted)")


def test_a_report_and_its_reproduce_line_are_read_from_a_cell():
    text = ("tinymlp.gradcheck FAILED: bad  [mode=full\n\n  tensor  shape\n  input x  (2,3)  6  6  FAIL\n"
            "  param weight  (3,)  3  0  ok\nreproduce: tinymlp.gradcheck(bad, (x,), seed=0)   # x: (2,3) float64\n"
            "tinymlp.gradcheck passed: good  [mode=full\n")
    assert list(_reports(text)) == [("FAILED", "bad", ["input x  (2,3)  6  6  FAIL", "param weight  (3,)  3  0  ok"],
                                     "tinymlp.gradcheck(bad, (x,), seed=0)   # x: (2,3) float64")]
    cell = _pasted("import tinymlp.lessons; tinymlp.gradcheck(*tinymlp.lessons.case('03.2', MyGELU))")
    assert cell.startswith("try:\n    import tinymlp.lessons\n    _pasted = tinymlp.gradcheck(")
    assert cell.endswith("print(_pasted)")


@pytest.mark.lessons
@pytest.mark.parametrize("path", REPORTING, ids=_ids(REPORTING))
def test_every_reproduce_line_a_lesson_prints_runs_when_pasted_there(path, kernel_env):
    """Run the lesson cell by cell; after a cell that prints a report, paste its reproduce line
    into the next cell: it must run there (no NameError, no other tensor of the same name) and
    give the same report: the same verdict, the same function, the same table. The run stops
    after the last cell that can print one (its source names gradcheck or a report): the cells
    after it (a lesson's training runs) print none, and the worked-lesson test runs them."""
    import nbclient
    import nbformat
    from nbformat.v4 import new_code_cell

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(LESSONS)}})
    pasted = []
    reporting = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and REPORT_SOURCE.search(c.source)]
    with client.setup_kernel():
        for index, cell in enumerate(list(nb.cells)[:max(reporting, default=-1) + 1]):
            if cell.cell_type != "code":
                continue
            client.execute_cell(cell, index)
            for status, title, rows, line in list(_reports(_printed(cell))):
                probe = new_code_cell(_pasted(line))
                try:
                    client.execute_cell(probe, index)
                except nbclient.exceptions.CellExecutionError as err:
                    pytest.fail(f"{path.name}, cell {index}: the reproduce line\n    {line}\nraises when pasted "
                                f"there:\n{_clean(str(err))[-1500:]}", pytrace=False)
                again = list(_reports(_printed(probe)))
                assert again, (line, _printed(probe))
                assert again[0][:3] == (status, title, rows), (path.name, index, line, again[0], (status, title, rows))
                pasted.append(line)
    print(f"{path.name}: {len(pasted)} reproduce line(s) pasted")


# ------------------------------------------------------------------------------ the autograder
@pytest.mark.lessons
def test_autograder_exit_codes_and_table(kernel_env):
    worked, student = LESSONS / "01_backprop_by_hand.ipynb", EXERCISES / "01_backprop_by_hand.ipynb"
    grader = [sys.executable, str(LESSONS / "checks.py"), "--timeout", str(CELL_TIMEOUT), *_UNCONFINED]
    ok = subprocess.run(grader + [str(worked)], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"lessons\s+01\.1 .* passed", ok.stdout) and "2 of 2 exercises passed" in ok.stdout
    todo = subprocess.run(grader + [str(student)], capture_output=True, text=True, timeout=600)
    assert todo.returncode == 1, todo.stdout + todo.stderr
    assert len(re.findall(r"\bnot done\b", todo.stdout)) == 2 and "0 of 2 exercises passed" in todo.stdout


def _plant(nb, ex_id, new):
    """Replace the stub of ``ex_id`` in a student notebook by a (wrong) answer."""
    stub = f'raise NotImplementedError("exercise {ex_id}")'
    for cell in nb.cells:
        if cell.cell_type == "code" and stub in cell.source:
            indent = re.search(rf"^( *){re.escape(stub)}", cell.source, flags=re.M).group(1)
            answer = "\n".join(indent + line for line in new.strip("\n").splitlines())
            cell.source = cell.source.replace(indent + stub, answer)
            return nb
    raise AssertionError(f"no stub for {ex_id}")


@pytest.mark.lessons
def test_a_planted_wrong_answer_is_failed_with_the_gradcheck_hint(tmp_path, kernel_env, checks):
    import nbformat

    nb = nbformat.read(EXERCISES / "03_writing_an_op.ipynb", as_version=4)
    _plant(nb, "03.1", """
dx = (g2 @ weight.T).reshape(ctx.x_shape)
dw = g2.T @ x2                                   # wrong: the transpose of X^T G
db = g2.sum(axis=0)
return dx, dw, db
""")
    copy = tmp_path / "03_writing_an_op.ipynb"
    nbformat.write(nb, copy)
    graded = _grade(copy)
    assert not graded.errors, graded.errors
    assert {r.exercise: r.status for r in graded.rows} == {"03.1": "FAILED", "03.2": "not done"}
    out = _clean(graded.outputs)
    assert "exercise 03.1 Linear backward: FAILED" in out
    assert re.search(r"^\s*likely\s*:", out, flags=re.M), out      # the report's hint line, in the notebook
    assert "weight" in out and "FAIL" in out
    row = graded.rows[0]
    assert row.reason.startswith("transposed gradient") or "transpose" in row.reason, row.reason
    grade = subprocess.run([sys.executable, str(LESSONS / "checks.py"), "--no-execute", *_UNCONFINED, str(copy)],
                           capture_output=True, text=True, timeout=600)
    assert grade.returncode == 1 and re.search(r"03\.1 .* FAILED", grade.stdout), grade.stdout


@pytest.mark.lessons
def test_autograder_grades_past_a_cell_that_raises(tmp_path, kernel_env, checks):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("from tinymlp.lessons import check"),
        new_code_cell("1 / 0"),                                                # a student's stray cell
        new_code_cell("check('02.3', lambda grad, shape: grad)"),               # wrong: never sums
    ])
    path = tmp_path / "02_submission.ipynb"
    nbformat.write(nb, path)
    graded = _grade(path)
    assert any("ZeroDivisionError" in e for e in graded.errors)
    assert {r.exercise: r.status for r in graded.rows} == {"02.1": "not done", "02.2": "not done", "02.3": "FAILED"}
    assert graded.rows[2].notebook_said == "FAILED"
    assert not graded.passed


# ------------------------------------------------------------------------------ check() itself
def test_check_prints_one_line_and_never_raises(checks, capsys):
    def stub(*args):
        raise NotImplementedError("exercise 02.3")

    assert not checks.check("02.3", stub)
    assert capsys.readouterr().out == "exercise 02.3 unbroadcast: not done yet\n"
    assert not checks.check("06.1", ...)
    assert capsys.readouterr().out.endswith(": not done yet\n")

    def broken(grad, shape):
        raise TypeError("oops")

    assert not checks.check("02.3", broken)
    out = capsys.readouterr().out
    assert out.startswith("exercise 02.3 unbroadcast: FAILED\n") and "TypeError: oops" in out

    assert not checks.check("02.3", lambda grad, shape: grad.sum(axis=0))
    out = capsys.readouterr().out
    assert "FAILED" in out and ("differs from the reference" in out or "shape" in out)
    import numpy as np

    from tinymlp import Function

    class NoBackward(Function):                    # not a stub: a Function missing its backward
        @staticmethod
        def forward(ctx, x):
            return x / (1 + np.exp(-x))            # Swish: the forward comparison passes

    assert not checks.check("10.2", NoBackward)
    out = capsys.readouterr().out
    assert out.startswith("exercise 10.2 Swish backward: FAILED") and "backward" in out
    assert not checks.check("99.9", stub)
    assert "no such exercise" in capsys.readouterr().out


def test_a_report_names_the_students_own_function_not_the_checks_wrapper(checks, capsys):
    """The gradcheck report of a failing exercise names what the student wrote (``MySwish.apply``),
    in its header and its reproduce line, never a function of the checks (``swish``)."""
    import numpy as np

    from tinymlp import Function

    class MySwish(Function):
        @staticmethod
        def forward(ctx, x):
            s = 1 / (1 + np.exp(-x))
            ctx.save_for_backward(x, s)
            return x * s

        @staticmethod
        def backward(ctx, g):
            x, s = ctx.saved_tensors
            return g * (s + x * s)                      # the (1 - s) factor left out

    assert not checks.check("10.2", MySwish)
    out = capsys.readouterr().out
    assert "gradcheck FAILED: MySwish.apply" in out and 'case("10.2", MySwish)' in out, out
    assert "FAILED: swish" not in out and "gradcheck(swish" not in out, out


def test_a_check_cell_shows_its_line_and_no_value(checks, capsys):
    formatters = pytest.importorskip("IPython.core.formatters")

    def stub(grad, shape):
        raise NotImplementedError("exercise 02.3")

    def unbroadcast(grad, shape):
        grad = grad.sum(axis=tuple(range(grad.ndim - len(shape))))
        return grad.sum(axis=tuple(k for k, n in enumerate(shape) if n == 1), keepdims=True)

    for answer, passed in ((stub, False), (lambda grad, shape: grad, False), (unbroadcast, True)):
        value = checks.check("02.3", answer)
        capsys.readouterr()
        assert bool(value) is passed and (value == passed) and (value != (not passed))
        # IPython shows a cell's last value unless it displays itself: this one displays nothing
        assert formatters.DisplayFormatter().format(value) == ({}, {}), value
        assert formatters.DisplayFormatter().format(passed) != ({}, {})      # (a bare bool would show)
        assert repr(value) == f"<check 02.3: {'passed' if passed else value.result.status}>"
    if checks.check("02.3", unbroadcast):                                       # as the lessons use it
        done = True
    assert done and "passed" in capsys.readouterr().out


def test_a_wrong_backward_gets_the_gradcheck_report(checks, capsys):
    import numpy as np

    from tinymlp import Function, array_module

    class HalfGELU(Function):                      # right forward, backward off by a factor 2
        @staticmethod
        def forward(ctx, x):
            xp = array_module(x)
            t = xp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))
            ctx.save_for_backward(x, t)
            return 0.5 * x * (1 + t)

        @staticmethod
        def backward(ctx, grad):
            x, t = ctx.saved_tensors
            dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x * x)
            return grad * dydx * 0.5

    assert not checks.check("03.2", HalfGELU)
    out = capsys.readouterr().out
    assert out.startswith("exercise 03.2 GELU backward: FAILED\n")
    assert "gradcheck" in out and re.search(r"^\s*(likely|pattern)\s*:", out, flags=re.M), out


def test_an_array_that_is_the_answer_rearranged_is_told_so(checks, capsys):
    """A transpose, a reversal or a sign flip of the expected array is named, not reported as a
    largest difference at some index."""
    import numpy as np

    from tinymlp.lessons.checks.common import rearranged

    want = np.arange(1.0, 13.0).reshape(3, 4)
    square = np.arange(1.0, 10.0).reshape(3, 3)
    assert rearranged(square.T, square).startswith("exactly the transpose of the expected")
    assert rearranged(want[::-1], want).startswith("exactly the expected reversed along axis 0")
    line = np.arange(1.0, 6.0)
    assert rearranged(line[::-1], line).startswith("exactly the expected reversed: yours[k] = expected[4 - k]")
    assert rearranged(-want, want).startswith("exactly the expected with the opposite sign")
    assert rearranged(-square.T, square).startswith("exactly minus the transpose")
    flipped = square.copy()
    flipped[1, 0] *= -1
    assert "wrong sign on 1 of its 9 entries (all below the diagonal)" in rearranged(flipped, square)
    assert rearranged(want + 0.5, want) is None and rearranged(want, want) is None   # a plain error is not one

    def toeplitz(w, S):                                   # w[j - i + S - 1]: the transpose
        i, j = np.indices((S, S))
        return w[j - i + S - 1]

    def toeplitz_backward(dW):                            # np.trace's offset counts j - i: reversed
        S = dW.shape[0]
        return np.array([np.trace(dW, offset=k) for k in range(-(S - 1), S)])

    def rotation(phi, omega):                             # the sin entries' signs swapped
        M = np.zeros((2 * len(omega), 2 * len(omega)))
        for i, w in enumerate(omega):
            c, s = np.cos(w * phi), np.sin(w * phi)
            M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
        return M

    for ex_id, answer, said in [
            ("07.2", toeplitz, "yours is exactly the transpose of the expected: yours[i, j] = expected[j, i]; "
                               "W[i, j] is w[i - j + S - 1]"),
            ("07.3", toeplitz_backward, "yours is exactly the expected reversed: yours[k] = expected[4 - k]"),
            ("05.4", rotation, "exactly the transpose of the expected: yours[i, j] = expected[j, i]: the rotation by "
                               "-omega_i * phi, so M p_t = p_(t-1), a shift backwards")]:
        assert not checks.check(ex_id, answer)
        out = capsys.readouterr().out
        assert said in out and "largest difference" not in out, out


def _elementwise(forward, backward):
    """A one-input Function: forward(x) -> (y, saved), backward(saved, grad) -> dx."""
    from tinymlp import Function

    class Op(Function):
        @staticmethod
        def forward(ctx, x):
            y, saved = forward(x)
            ctx.save_for_backward(*saved)
            return y

        @staticmethod
        def backward(ctx, grad):
            return backward(*ctx.saved_tensors, grad)

    return Op


def test_a_term_of_the_derivation_gone_wrong_is_named_with_its_factor(checks):
    """The check knows the derivation's terms: when the answer's gradient is off by a multiple of
    one of them, the report's likely line (and the grader's reason) names that term and what
    happened to it, where gradcheck alone could only say that the values are wrong."""
    import math

    import numpy as np

    from tinymlp.lessons import run_check

    c0, c1 = math.sqrt(2 / math.pi), 0.044715

    def gelu_forward(x):
        t = np.tanh(c0 * (x + c1 * x**3))
        return 0.5 * x * (1 + t), (x, t)

    def swish_forward(x):
        s = 1 / (1 + np.exp(-x))
        return x * s, (x, s)

    def softmax_forward(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return p, (p,)

    def gelu(h=0.5, half=0.5, c=c0, three=3):            # dy/dx with one factor changed
        return _elementwise(gelu_forward, lambda x, t, g: g * (h * (1 + t) + half * x * (1 - t * t) * c
                                                                 * (1 + three * c1 * x * x)))

    cases = [
        ("03.2", gelu(half=1),
         "the term x (1 - t^2)/2 c0 (1 + 3 c1 x^2) of dy/dx is twice what it should be in your backward: a factor 1/2 "
         "missing from it"),
        ("03.2", gelu(c=1),
         "lacks the factor c0 = sqrt(2/pi)"),
        ("03.2", gelu(three=1),
         "the term x (1 - t^2)/2 c0 3 c1 x^2 of dy/dx lacks the factor 3"),
        ("10.2", _elementwise(swish_forward, lambda x, s, g: g * (s - x * s * (1 - s))),
         "the term x s (1 - s) of dy/dx has the wrong sign in your backward"),
        ("05.1", _elementwise(softmax_forward, lambda p, g: p * g),
         "the term - p <g, p> (the row's inner product) of dL/dx is missing from your backward"),
    ]
    for ex_id, answer, said in cases:
        result = run_check(ex_id, answer, seeds=(None, 7))
        assert result.status == "FAILED" and said in result.reason, (ex_id, said, result.reason)
        assert re.search(r"^\s*likely\s*: the term", result.details, flags=re.M), result.details


def test_a_report_without_a_likely_line_is_summed_up_by_its_pattern_not_its_header():
    from tinymlp.lessons.runner import reason_of

    report = ("tinymlp.gradcheck FAILED: gelu  [mode=full  check dtype=float64\n     eps=1e-06]\n"
              "upstream gradient: random\n\n  tensor  shape\n  input x  (4,6)  24  23  FAIL\n\n"
              "FAIL x - worst 5 of 23 failing checks (full mode):\n  index  numerical\n  [3,3]  -2.2  -6.1\n"
              "  pattern : 23 of 24 elements fail: x[0, 0], x[0, 1], x[0, 2] ...\n  from    : MyGELU.backward\n")
    assert reason_of(report) == "the gradient of 'x' is wrong: 23 of 24 elements fail: x[0, 0], x[0, 1], x[0, 2] ..."
    assert reason_of(report.replace("  from", "  likely  : a hint\n  from")) == "a hint"
    assert reason_of("shape (3,), expected (4,)\nmore") == "shape (3,), expected (4,)"


def test_lesson_10s_own_layer_needs_a_backward_of_its_own_and_every_parameter_checked(checks, capsys):
    import numpy as np

    import tinymlp
    from tinymlp import Function, nn

    rng = np.random.default_rng(0)
    x = tinymlp.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    alpha = rng.uniform(0.1, 0.4, 5)

    class PReLU(Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.save_for_backward(x, alpha)
            return np.where(x > 0, x, alpha * x)

        @staticmethod
        def backward(ctx, g):
            x, alpha = ctx.saved_tensors
            return np.where(x > 0, g, alpha * g), (g * np.minimum(x, 0)).sum(axis=0)

    def prelu(x, alpha):
        return PReLU.apply(x, alpha)

    assert checks.check("10.3", (prelu, (x, tinymlp.tensor(alpha, requires_grad=True))))
    assert "passed" in capsys.readouterr().out
    # a lambda of tinymlp's ops: no backward written
    assert not checks.check("10.3", (lambda x: (x * x).tanh() * 2, (x,)))
    assert "a library op" in capsys.readouterr().out      # Mul, tanh: library ops, refused inside the layer
    # the slope created without requires_grad: its gradient (wrong here) would never be checked
    wrong = type("PReLUWrongSlope", (PReLU,), {"backward": staticmethod(
        lambda ctx, g: (PReLU.backward(ctx, g)[0], 3 * PReLU.backward(ctx, g)[1]))})
    assert not checks.check("10.3", (lambda x, alpha: wrong.apply(x, alpha), (x, tinymlp.tensor(alpha))))
    out = capsys.readouterr().out
    assert "FAILED" in out and "input 'alpha' (5,): a float tensor without requires_grad=True" in out, out

    class Layer(nn.Module):                              # a module whose slope is frozen: not checked either
        def __init__(self):
            super().__init__()
            self.alpha = nn.Parameter(alpha)
            self.alpha.requires_grad = False

        def forward(self, x):
            return PReLU.apply(x, self.alpha)

    assert not checks.check("10.3", (Layer(), (x,)))
    assert "parameter 'alpha' (5,): a float tensor without requires_grad=True" in capsys.readouterr().out


def test_lesson_10s_reading_a_failure_gets_rmsnorms_own_hint():
    """The demonstration's layer (RMSNorm with a gain, r treated as a constant) at the lesson's
    shapes: the likely line is RMSNorm's formula, which following literally fixes the layer."""
    import numpy as np

    import tinymlp
    from tinymlp import Function, gradcheck

    class RMSNormForgot(Function):
        @staticmethod
        def forward(ctx, x, weight, eps=1e-6):
            r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
            ctx.save_for_backward(x * r, r, weight)
            return x * r * weight

        @staticmethod
        def backward(ctx, grad):
            xh, r, weight = ctx.saved_tensors
            return r * (grad * weight), (grad * xh).reshape(-1, xh.shape[-1]).sum(axis=0)

    class RMSNormAsTold(RMSNormForgot):                  # the likely line, followed to the letter
        @staticmethod
        def backward(ctx, grad):
            x_hat, r, weight = ctx.saved_tensors
            g = grad * weight                            # "g being the incoming gradient times the gain"
            dx = r * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
            return dx, (grad * x_hat).reshape(-1, x_hat.shape[-1]).sum(axis=0)

    rng = np.random.default_rng(0)
    x = tinymlp.tensor(rng.standard_normal((3, 4, 6)), requires_grad=True)
    weight = tinymlp.tensor(rng.uniform(0.5, 1.5, 6), requires_grad=True)
    result = gradcheck(RMSNormForgot.apply, (x, weight), raise_on_fail=False).per_tensor["x"]
    assert result.hint_kind == "row_multiple" and "forward is the RMSNorm of 'x'" in result.pattern
    assert "RMSNorm's backward" in result.hint and "L2" not in result.hint and "mean(g) -" not in result.hint
    assert gradcheck(RMSNormAsTold.apply, (x, weight), raise_on_fail=False).passed
    text = (LESSONS / "src" / "10_gradcheck_your_layer.py").read_text()
    section = text[text.index("## 4. Reading a failure"):text.index("## 5.")]
    assert "likely" in section and "no `likely`" not in section and "RMSNorm's backward" in section


def test_the_notation_of_lessons_5_and_7():
    """Lesson 5: d before a variable is a differential, a gradient is G with its variable's name;
    lesson 7: g is the upstream gradient only, and dgamma's sums say over which axes."""
    five = (LESSONS / "src" / "05_softmax_attention.py").read_text()
    markdown = "\n".join(line for line in five.splitlines() if line.startswith("#"))
    assert not re.search(r"\$d[SPV]\b|\bd[SPV] =|d[SP]_\{ij\}|dS\^\\top|dS\\,K", markdown), \
        re.findall(r".*(?:\$d[SPV]\b|\bd[SPV] =).*", markdown)
    assert "G_P := " in markdown and "G_S = P" in markdown and "a differential" in markdown
    seven = (LESSONS / "src" / "07_gmlp_sgu.py").read_text()
    assert not re.search(r"\$g = |with \$g\b|\\overline g\b", seven)
    assert r"d\gamma_c = \sum_{b,i}" in seven and "axes 0 and 1" in seven


def _masked_mean(forward="right", backward="right"):
    """A masked-mean Function (exercise 12.2): the reference answer, or one of the usual slips."""
    import numpy as np

    from tinymlp import Function

    class MaskedMean(Function):
        @staticmethod
        def forward(ctx, x, mask):
            m = mask.astype(x.dtype)[:, :, None]
            n = m.sum(axis=1)
            ctx.save_for_backward(m, n)
            if forward == "over S":
                return (x * m).sum(axis=1) / x.shape[1]
            return (x * m).sum(axis=1) / n

        @staticmethod
        def backward(ctx, grad):
            m, n = ctx.saved_tensors
            dx = {"right": m * (grad / n)[:, None, :],
                  "over S": m * (grad / m.shape[1])[:, None, :],
                  "no mask": np.broadcast_to((grad / n)[:, None, :], grad.shape[:1] + m.shape[1:2] + grad.shape[1:]),
                  "a third": m * (grad / n)[:, None, :] / 3}[backward]
            return dx, None

    return MaskedMean


def test_masked_mean_check_passes_the_answer_and_names_the_usual_slips(checks, capsys):
    head = "exercise 12.2 mean over the real tokens (masked pooling)"
    assert checks.check("12.2", _masked_mean())
    assert capsys.readouterr().out == f"{head}: passed\n"
    for kind, expected in [({"forward": "over S"}, "forward: divided by S"),
                           ({"backward": "over S"}, "backward: divided by S"),
                           ({"backward": "no mask"}, "backward: the mask is missing"),
                           ({"backward": "a third"}, "tinymlp.gradcheck FAILED")]:   # any other slip
        assert not checks.check("12.2", _masked_mean(**kind)), kind
        out = capsys.readouterr().out
        assert out.startswith(f"{head}: FAILED\n") and expected in out, (kind, out)


def _token_mixing(slip=None):
    """The token-mixing block of exercise 06.2: the answer, or one of the usual slips around its MLP."""
    import numpy as np

    from tinymlp import F, nn

    class TokenMixing(nn.Module):
        def __init__(self, num_tokens, dim, hidden, rng=None):
            super().__init__()
            rng = np.random.default_rng(rng)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.fc1 = nn.Linear(num_tokens, hidden, rng=rng)
            self.fc2 = nn.Linear(hidden, num_tokens, rng=rng)

        def forward(self, x):
            normed = self.norm(x)
            h = self.fc2(F.gelu(self.fc1(normed.transpose(0, 2, 1))))
            if slip == "not transposed back":
                return h
            h = h.transpose(0, 2, 1)
            return {None: x + h, "no residual": h, "twice": x + x + h, "normed": normed + h}[slip]

    return TokenMixing


def test_token_mixing_check_names_what_is_wrong_around_the_mlp(checks, capsys):
    head = "exercise 06.2 token-mixing block from Linear layers"
    assert checks.check("06.2", _token_mixing())
    assert capsys.readouterr().out == f"{head}: passed\n"
    for slip, expected in [("no residual", "the residual is missing"), ("twice", "the residual is added twice"),
                           ("normed", "the residual adds LN(x)"), ("not transposed back", "transpose it back")]:
        assert not checks.check("06.2", _token_mixing(slip)), slip
        out = capsys.readouterr().out
        assert out.startswith(f"{head}: FAILED\n") and expected in out, (slip, out)


def _wordpiece(slip=None):
    """A WordPiece cut (exercise 12.3): the reference answer, or one of the usual slips."""
    def wordpiece(word, vocab):
        pieces, start = [], 0
        while start < len(word):
            ends = range(start + 1, len(word) + 1) if slip == "shortest" else range(len(word), start, -1)
            for end in ends:
                piece = word[start:end] if start == 0 or slip == "no ##" else "##" + word[start:end]
                if piece in vocab:
                    break
            else:
                return pieces + ["[UNK]"] if slip == "partial" else ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces

    return wordpiece


def test_wordpiece_check_passes_the_answer_and_shows_the_first_word_that_differs(checks, capsys):
    head = "exercise 12.3 WordPiece's greedy longest-match cut"
    assert checks.check("12.3", _wordpiece())
    assert capsys.readouterr().out == f"{head}: passed\n"
    for slip, expected in [("shortest", "not the shortest"), ("no ##", "with ## in front"),
                           ("partial", "[UNK] as a whole")]:
        assert not checks.check("12.3", _wordpiece(slip)), slip
        out = capsys.readouterr().out
        assert out.startswith(f"{head}: FAILED\n") and expected in out, (slip, out)
        assert re.search(r"'\w+': yours \[.*\], the tokenizer's \[.*\]", out), out   # the word, both answers
    assert not checks.check("12.3", lambda word, vocab: ["[UNK]"])
    assert "yours ['[UNK]']" in capsys.readouterr().out
    # the cases hold a word that must become [UNK] and single characters, known and unknown
    from tinymlp.data.tokenizer import SPECIAL_TOKENS, Tokenizer

    from tinymlp.lessons.checks.lesson12_gmlp_on_text import wordpiece_cases
    from tinymlp.lessons.registry import Case

    cuts = []
    for vocab, words in wordpiece_cases(Case(0)):
        tok = Tokenizer(list(SPECIAL_TOKENS) + sorted(vocab))
        cuts += [(w, tok.cut_word(w)) for w in words]
    assert any(len(w) > 1 and cut == ["[UNK]"] for w, cut in cuts)
    assert any(len(w) == 1 and cut == [w] for w, cut in cuts)
    assert any(len(w) == 1 and cut == ["[UNK]"] for w, cut in cuts)


# ------------------------------------------------------------------------------ the course's shape
def test_exercises_are_registered_numbered_and_enough(checks, make_lessons):
    seen = {}
    for src in SOURCES:
        ids = make_lessons.exercise_ids(src)
        text = src.read_text()
        for ex_id in dict.fromkeys(ids):
            assert ex_id.startswith(src.name[:2] + "."), f"{src.name}: exercise {ex_id} belongs to another lesson"
            assert ex_id in checks.EXERCISES, f"{src.name}: exercise {ex_id} has no check in tinymlp/lessons/checks/"
            assert re.search(rf"check\(\s*\"{re.escape(ex_id)}\"", text), (
                f"{src.name}: exercise {ex_id} is never checked")
            assert ex_id not in seen, f"exercise {ex_id} in {src.name} and {seen[ex_id]}"
            seen[ex_id] = src.name
    assert set(seen) == set(checks.EXERCISES), "every registered check belongs to an exercise in a source"
    assert len(seen) >= 24
    for lesson in ("02", "03", "04", "05", "06", "07", "08", "10"):
        assert sum(k.startswith(lesson + ".") for k in seen) >= 2, f"lesson {lesson} needs two exercises"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_each_lesson_states_objectives_and_prerequisites(source):
    head = source.read_text()[:4000]
    assert "**Objectives.**" in head and "**Prerequisites:**" in head, source.name


def test_the_students_section_shows_their_grading_command():
    """A student grades their own notebook with the instructor's command, on their copy in exercises/."""
    text = (LESSONS / "README.md").read_text()
    section = text[text.index("## For students"):text.index("## For instructors")]
    commands = re.findall(r"^python lessons/checks\.py (lessons/exercises/\S+\.ipynb)", section, flags=re.M)
    assert commands, "the students' section names no command that grades their notebook"
    for pattern in commands:
        assert sorted(ROOT.glob(pattern)), pattern


def test_lessons_exist_and_are_numbered():
    assert NOTEBOOKS, "no notebooks in lessons/"
    for path in NOTEBOOKS + STUDENT_NOTEBOOKS:
        assert path.name[:2].isdigit() and path.name[2] == "_", f"{path.name}: expected NN_name.ipynb"
    assert [p.name for p in STUDENT_NOTEBOOKS] == [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS + STUDENT_NOTEBOOKS,
                         ids=_ids(NOTEBOOKS) + [f"exercises-{s}" for s in _ids(STUDENT_NOTEBOOKS)])
def test_lesson_is_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    assert nb.get("nbformat") == 4, f"{path.name}: not an nbformat 4 notebook"
    dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_both_builds_match_their_source(source, make_lessons):
    for student in (False, True):
        target = make_lessons.target_of(source, student)
        assert target.exists(), f"{target.name} missing: run python lessons/make_lessons.py"
        assert target.read_text() == make_lessons.render(make_lessons.build(source, student)), (
            f"{target.relative_to(ROOT)} differs from lessons/src/{source.name}: run python lessons/make_lessons.py")


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_the_student_build_holds_no_answer(source, make_lessons):
    worked, student = make_lessons.build(source), make_lessons.build(source, student=True)
    text = "\n".join(c.source for c in student.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "BEGIN SOLUTION" not in "\n".join(c.source for c in worked.cells)
    ids = list(dict.fromkeys(make_lessons.exercise_ids(source)))
    for ex_id in ids:
        assert f'NotImplementedError("exercise {ex_id}")' in text or f"# exercise {ex_id}: your answer" in text
    if not ids:   # nothing to hide: the two builds are the same notebook
        assert make_lessons.render(worked) == make_lessons.render(student)


def test_make_lessons_stubs(make_lessons):
    code = ("def f(x):\n    \"\"\"doc\"\"\"\n    # BEGIN SOLUTION 04.1\n    return x + 1\n    # END SOLUTION\n\n"
            "# BEGIN SOLUTION 06.2 | n = ...\nn = 3\n# END SOLUTION\nprint(n)")
    assert make_lessons.solutions("code", code, student=False) == (
        "def f(x):\n    \"\"\"doc\"\"\"\n    return x + 1\n\nn = 3\nprint(n)")
    assert make_lessons.solutions("code", code, student=True) == (
        "def f(x):\n    \"\"\"doc\"\"\"\n    raise NotImplementedError(\"exercise 04.1\")\n\n"
        "n = ...  # exercise 06.2: your answer\nprint(n)")
    with pytest.raises(ValueError, match="no END SOLUTION"):
        make_lessons.solutions("code", "# BEGIN SOLUTION 01.1\nx = 1", student=True)


def _headings(nb):
    """[(cell index, level, text)] of the notebook's markdown headings, in order."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"^(#{1,6})\s+(\S.*?)\s*$", line)
                if m:
                    found.append((i, len(m.group(1)), m.group(2)))
    return found


def test_every_see_pointer_is_a_heading_of_its_notebook_above_the_exercise(checks, make_lessons):
    """The ``see:`` line names the section (and subsection) whose text holds the exercise: each
    heading it quotes is a heading of the lesson's notebook, the first a ``##`` section, and the
    exercise's stub lies under the last one, before the next heading of its level or above."""
    for ex_id, ex in checks.EXERCISES.items():
        source = next(p for p in SOURCES if p.name.startswith(ex_id[:2] + "_"))
        nb = make_lessons.build(source, student=True)
        quoted = re.findall(r'"([^"]+)"', ex.section)
        assert ex.section.startswith(f"lesson {int(ex_id[:2])}, section \"") and quoted == list(ex.headings), ex_id
        stub = next(i for i, c in enumerate(nb.cells) if f"exercise {ex_id}" in c.source and c.cell_type == "code")
        headings = _headings(nb)
        above = [h for h in headings if h[0] <= stub]
        chain = {}
        for _, level, text in above:
            chain = {k: v for k, v in chain.items() if k < level}
            chain[level] = text
        assert tuple(v for k, v in sorted(chain.items()) if k >= 2) == ex.headings, (ex_id, ex.headings, chain)
        assert min(chain) <= 2 and ex.headings[0] == chain[2], ex_id


def test_lesson_5s_pointers_name_the_sections_that_teach_them(checks):
    """The pointers a student followed the wrong way: cross-entropy is in section 1, attention in
    section 2, and the rotation in section 3 of a notebook with four."""
    section = {k: checks.EXERCISES[k].section for k in ("05.1", "05.2", "05.3", "05.4")}
    assert section["05.2"] == 'lesson 5, section "1. Softmax" > "Softmax cross-entropy, derived from log-sum-exp"'
    assert section["05.3"].startswith('lesson 5, section "2. Scaled dot-product attention" > "The backward pass')
    assert section["05.4"].startswith('lesson 5, section "3. Sinusoidal position encodings"')


def test_the_sections_file_is_read_from_the_sources(make_lessons, tmp_path):
    assert make_lessons.SECTIONS_FILE.read_text() == make_lessons.render_sections(SOURCES), (
        "tinymlp/lessons/sections.py differs from the sources' headings: run python lessons/make_lessons.py")
    source = tmp_path / "99_planted.py"
    source.write_text("\n".join([
        "# %% [markdown]", "# # Lesson 99", "# ## 1. First", "# ### A subsection", "", "# %%",
        "def f():", "    # BEGIN SOLUTION 99.1", "    return 1", "    # END SOLUTION", "",
        "# %% [markdown]", "# ## 2. Second", "# Text; `# not a heading` in code is not one either.", "",
        "# %%", "# ## a comment in code", "def g():", "    # BEGIN SOLUTION 99.2", "    return 2", "    # END SOLUTION",
        "def h():", "    # BEGIN SOLUTION 99.1", "    return 3", "    # END SOLUTION"]))
    assert make_lessons.sections(source) == {"99.1": ("1. First", "A subsection"), "99.2": ("2. Second",)}

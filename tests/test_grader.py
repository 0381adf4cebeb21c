"""The grader, as an instructor uses it: a class of students' notebooks in, one row per student
and exercise out, and no way for a notebook to grade itself.

A class is built from the student build of lesson 4 with answers planted in it: a correct
student, a wrong one and one who cheats. Then every trick found so far is planted in a small
notebook of its own and must grade as FAILED with the reason: a fake ``passed`` line, the
checker patched from the notebook, a backward that returns a finite difference or calls the
library's op (with autograd, or numerically through gradcheck), the library's class handed in
as the answer, the checker patched from the answer's own code (it is not in the answer's
process: only the answer's own numbers count), an answer that only fits the public case, one
that exits or loops, one that reaches into the interpreter, and an object that compares equal to
anything. Outputs: the table, CSV, JSON and Gradescope's results.json (validated against the
schema of Gradescope's documented format). ``test_lessons_cheats.py`` holds the cheats of a
determined student with the repository in hand.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXERCISES_DIR = ROOT / "lessons" / "exercises"
CHECKS = ROOT / "lessons" / "checks.py"

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_notebook  # noqa: E402

from tinymlp.lessons import grader, reports  # noqa: E402
from tinymlp.lessons.sandbox import unavailable  # noqa: E402

UNCONFINED = ["--unconfined"] if unavailable() else []   # the grader grades only with it where no sandbox starts

SEED = 12345



# ------------------------------------------------------------------------------ building submissions
CORRECT_04_1 = """
rows = tuple(range(grad.ndim - 1))
dgamma = (grad * x_hat).sum(axis=rows)
dbeta = grad.sum(axis=rows)
g = grad * gamma
dx = r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
return dx, dgamma, dbeta
"""
CORRECT_04_2 = """
D = row.shape[-1]
r = 1 / np.sqrt(row.var() + eps)
xh = (row - row.mean()) * r
return r * (np.eye(D) - 1 / D - np.outer(xh, xh) / D)
"""
WRONG_04_1 = """
rows = tuple(range(grad.ndim - 1))
g = grad * gamma
dx = r * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))     # the - mean(g) term forgotten
return dx, (grad * x_hat).sum(axis=rows), grad.sum(axis=rows)
"""
CHEATING_04_1 = """
from tinymlp.ops.norm import normalize_backward                        # the library's own backward
rows = tuple(range(grad.ndim - 1))
return normalize_backward(grad * gamma, x_hat, r), (grad * x_hat).sum(axis=rows), grad.sum(axis=rows)
"""
CHEATING_04_2 = """
h = 1e-6                                                               # a finite-difference Jacobian
def x_hat_of(v):
    return (v - v.mean()) / np.sqrt(v.var() + eps)
return np.stack([(x_hat_of(row + h * e) - x_hat_of(row - h * e)) / (2 * h) for e in np.eye(len(row))], axis=1)
"""


def plant(nb, ex_id, answer):
    """Replace the stub of ``ex_id`` in a student notebook by ``answer``."""
    stub = f'raise NotImplementedError("exercise {ex_id}")'
    for cell in nb.cells:
        if cell.cell_type == "code" and stub in cell.source:
            indent = re.search(rf"^( *){re.escape(stub)}", cell.source, flags=re.M).group(1)
            code = "\n".join(indent + line if line else line for line in answer.strip("\n").splitlines())
            cell.source = cell.source.replace(indent + stub, code)
            return nb
    raise AssertionError(f"no stub for {ex_id}")


def submit(folder, student, name, nb):
    path = folder / student / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def lesson4_class(tmp_path):
    """submissions/{alice,bob,carol}/04_layernorm.ipynb: correct, wrong, cheating."""
    base = EXERCISES_DIR / "04_layernorm.ipynb"
    folder = tmp_path / "submissions"
    answers = {"alice": (CORRECT_04_1, CORRECT_04_2), "bob": (WRONG_04_1, None),
               "carol": (CHEATING_04_1, CHEATING_04_2)}
    for student, (a1, a2) in answers.items():
        nb = nbformat.read(base, as_version=4)
        plant(nb, "04.1", a1)
        if a2:
            plant(nb, "04.2", a2)
        submit(folder, student, "04_layernorm.ipynb", nb)
    return folder


def grade_cli(*args, timeout=600):
    return subprocess.run([sys.executable, str(CHECKS), "--seed", str(SEED), *UNCONFINED, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ a class, by name
@pytest.mark.lessons
@pytest.mark.slow
def test_a_class_of_three_is_graded_one_row_per_student_and_exercise(lesson4_class, checkout_env):
    notebooks = sorted(lesson4_class.glob("*/04_layernorm.ipynb"))
    out = grade_cli("--json", *notebooks)
    assert out.returncode == 1, out.stderr            # not everybody passed
    data = json.loads(out.stdout)
    assert data["seed"] == SEED
    rows = {(r["student"], r["exercise"]): r for r in data["results"]}
    assert sorted(rows) == [(s, e) for s in ("alice", "bob", "carol") for e in ("04.1", "04.2")]
    assert [rows["alice", e]["status"] for e in ("04.1", "04.2")] == ["passed", "passed"]
    assert rows["alice", "04.1"]["score"] == 1.0 and rows["alice", "04.1"]["reason"] == ""

    bob = rows["bob", "04.1"]
    assert bob["status"] == "FAILED" and bob["score"] == 0.0
    assert bob["reason"].startswith("a term like g.mean(axis=")            # the report's first likely line
    assert re.search(r"^\s*likely\s*: a term like g\.mean", bob["details"], flags=re.M)
    assert bob["reproduce"].startswith(
        'import tinymlp.lessons; tinymlp.gradcheck(*tinymlp.lessons.case("04.1", MyLayerNorm')
    assert rows["bob", "04.2"]["status"] == "not done"

    carol = rows["carol", "04.1"]
    assert carol["status"] == "FAILED"
    assert "calls tinymlp.ops.norm.normalize_backward" in carol["reason"]
    assert "the library's own implementation of what exercise 04.1 asks for" in carol["reason"]
    assert rows["carol", "04.2"]["status"] == "FAILED"
    assert "estimated numerically" in rows["carol", "04.2"]["reason"]
    # the notebook's own checks said passed for carol's finite differences: the row says so
    assert rows["carol", "04.2"]["notebook_said"] in ("passed", "FAILED")
    assert [n["student"] for n in data["notebooks"]] == ["alice", "bob", "carol"]
    assert all(not n["errors"] for n in data["notebooks"])
    for row in data["results"]:
        assert row["section"].startswith("lesson 4") and row["reference"].startswith("tinymlp/ops/norm.py")


@pytest.mark.lessons
@pytest.mark.slow
def test_the_table_and_csv_name_the_students(lesson4_class, checkout_env):
    notebooks = sorted(lesson4_class.glob("*/04_layernorm.ipynb"))
    table = grade_cli("--no-execute", *notebooks)
    lines = table.stdout.splitlines()
    assert re.match(r"student\s+exercise\s+title\s+result\s+reason", lines[0])
    assert any(re.match(r"bob\s+04\.1\s+LayerNorm backward\s+FAILED[*!]*\s+a term like", line) for line in lines)
    assert any(re.match(r"alice\s+04\.2\s+LayerNorm Jacobian\s+passed[*!]*\s*$", line) for line in lines)
    assert "2 of 6 exercises passed (3 students)" in table.stdout
    assert f"--seed {SEED} repeats this grading" in table.stdout
    rows = list(csv.DictReader(io.StringIO(grade_cli("--csv", "--no-execute", *notebooks).stdout)))
    assert [(r["student"], r["exercise"], r["status"]) for r in rows] == [
        ("alice", "04.1", "passed"), ("alice", "04.2", "passed"), ("bob", "04.1", "FAILED"),
        ("bob", "04.2", "not done"), ("carol", "04.1", "FAILED"), ("carol", "04.2", "FAILED")]
    assert rows[2]["reason"].startswith("a term like g.mean(axis=")


def test_the_student_is_the_folder_or_a_safe_unique_name_in_the_metadata(tmp_path):
    from tinymlp.lessons.identity import assign
    from tinymlp.lessons.notebook import Notebook

    def sub(folder, name, metadata=None):
        nb = new_notebook(cells=[new_code_cell("x = 1")], metadata=metadata or {})
        path = submit(tmp_path, folder, name, nb)
        return path, Notebook(path)

    subs = assign([sub("bob", "04_layernorm.ipynb"),
                   sub("upload-17", "04_layernorm.ipynb", {"student": "Judy Example"}),
                   sub("upload-18", "homework.ipynb", {"tinymlp": {"student": "Ken", "lesson": "07"}})])
    assert [(s.student, s.lesson) for s in subs] == [("bob", "04"), ("Judy Example", "04"), ("Ken", None)]
    assert not any(s.notes or s.refused for s in subs)


# ------------------------------------------------------------------------------ Gradescope
GRADESCOPE_SCHEMA = {
    # results.json as documented at https://gradescope-autograders.readthedocs.io/en/latest/specs/
    "type": "object",
    "additionalProperties": False,
    "anyOf": [{"required": ["score"]}, {"required": ["tests"]}],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "score": {"type": "number"},
                "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]},
                "name": {"type": "string"},
                "name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                "number": {"type": "string"},
                "output": {"type": "string"},
                "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
                "extra_data": {"type": "object"},
            },
        }},
        "leaderboard": {"type": "array"},
    },
}


@pytest.mark.lessons
@pytest.mark.slow
def test_gradescope_results_validate_against_the_documented_format(lesson4_class, tmp_path, checkout_env):
    jsonschema = pytest.importorskip("jsonschema")
    one = tmp_path / "results" / "results.json"
    one.parent.mkdir()
    out = grade_cli("--gradescope", "--no-execute", "-o", one, lesson4_class / "bob" / "04_layernorm.ipynb")
    assert out.returncode == 1, out.stderr
    result = json.loads(one.read_text())
    jsonschema.validate(result, GRADESCOPE_SCHEMA)
    assert result["score"] == 0 and [t["number"] for t in result["tests"]] == ["04.1", "04.2"]
    assert all(t["score"] <= t["max_score"] for t in result["tests"])
    failed = result["tests"][0]
    assert failed["status"] == "failed" and "likely" in failed["output"] and "reproduce:" in failed["output"]
    assert "see: lesson 4" in failed["output"]

    folder = tmp_path / "per-student"
    out = grade_cli("--gradescope", "--no-execute", "-o", folder, *sorted(lesson4_class.glob("*/*.ipynb")))
    written = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("results.json"))
    assert written == ["alice/results.json", "bob/results.json", "carol/results.json"]
    for path in folder.rglob("results.json"):
        jsonschema.validate(json.loads(path.read_text()), GRADESCOPE_SCHEMA)
    assert json.loads((folder / "alice" / "results.json").read_text())["score"] == 2
    with pytest.raises(jsonschema.ValidationError):   # the schema is not vacuous
        jsonschema.validate({"score": 1, "tests": [{"score": 1, "status": "ok"}]}, GRADESCOPE_SCHEMA)


# ------------------------------------------------------------------------------ the tricks
LN_FORWARD = '''
import numpy as np
import tinymlp
from tinymlp import F, Function, array_module
from tinymlp.lessons import check


class MyLayerNorm(Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, eps=1e-5):
        mu = x.mean(axis=-1, keepdims=True)
        r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
        x_hat = (x - mu) * r
        ctx.save_for_backward(x, x_hat, r, gamma, beta)
        ctx.eps = eps
        return gamma * x_hat + beta

    @staticmethod
    def backward(ctx, grad):
        x, x_hat, r, gamma, beta = ctx.saved_tensors
        rows = tuple(range(grad.ndim - 1))
        dgamma, dbeta = (grad * x_hat).sum(axis=rows), grad.sum(axis=rows)
{dx}
        return dx, dgamma, dbeta
'''


def ln_with(dx):
    """A LayerNorm exercise answer whose dx is computed by ``dx`` (lines of backward's body)."""
    body = "\n".join("        " + line for line in dx.strip("\n").splitlines())
    return LN_FORWARD.replace("{dx}", body)


TRICKS = {
    # a finite difference of forward, computed inside backward
    "backward calls forward": ("04.1", ln_with("""
dx = np.zeros_like(x)
for i in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[i] += 1e-6
    down[i] -= 1e-6
    dx[i] = ((MyLayerNorm.forward(ctx, up, gamma, beta) - MyLayerNorm.forward(ctx, down, gamma, beta))
             * grad).sum() / 2e-6
"""), "backward calls forward (MyLayerNorm.forward)"),
    # the same, written out with NumPy so that forward is never called
    "a finite difference inline": ("04.1", ln_with("""
def loss(v):
    mu = v.mean(axis=-1, keepdims=True)
    return ((gamma * (v - mu) / np.sqrt(((v - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5) + beta) * grad).sum()
dx = np.zeros_like(x)
for i in np.ndindex(x.shape):
    e = np.zeros_like(x)
    e[i] = 1e-6
    dx[i] = (loss(x + e) - loss(x - e)) / 2e-6
"""), "estimated numerically"),
    # the library's op, differentiated by the engine
    "the library's op with autograd": ("04.1", ln_with("""
xt = tinymlp.tensor(x, requires_grad=True, dtype=x.dtype)
F.layer_norm(xt, tinymlp.tensor(gamma), tinymlp.tensor(beta)).backward(tinymlp.tensor(grad))
dx = xt.grad
"""), "backward calls a tinymlp op"),
    # primitives, differentiated by the engine
    "primitives with autograd": ("04.1", ln_with("""
xt = tinymlp.tensor(x, requires_grad=True, dtype=x.dtype)
mu = xt.mean(axis=-1, keepdims=True)
((xt - mu) / (((xt - mu) * (xt - mu)).mean(axis=-1, keepdims=True) + 1e-5).sqrt()
 * tinymlp.tensor(gamma)).backward(tinymlp.tensor(grad))
dx = xt.grad
"""), "backward calls a tinymlp op"),
    # tinymlp's numerical gradient
    "tinymlp.numerical_grad": ("04.1", ln_with("""
xt = tinymlp.tensor(x, dtype=x.dtype)
dx = tinymlp.numerical_grad(lambda v: MyLayerNorm.apply(v, tinymlp.tensor(gamma), tinymlp.tensor(beta)), xt, grad)
"""), "numerical differentiation"),
    # the library's class handed in as the answer
    "the library's class": ("04.1", LN_FORWARD.replace("{dx}", "        dx = None") + """
from tinymlp.ops.norm import LayerNorm
MyLayerNorm = LayerNorm
""", "calls tinymlp.ops.norm.LayerNorm"),
    # apply replaced by a composition of tinymlp ops, so that the engine differentiates it
    "apply composed of ops": ("04.1", ln_with("dx = None") + """
def composed(cls, x, gamma, beta):
    centred = x - x.mean(axis=-1, keepdims=True)
    return gamma * centred / ((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5).sqrt() + beta
MyLayerNorm.apply = classmethod(composed)
""", "the grader runs forward and backward through the engine's apply"),
    # the refusal caught, and the library used another way
    "a refusal caught": ("04.1", ln_with("""
try:
    from tinymlp.ops.norm import normalize_backward
    dx = normalize_backward(grad * gamma, x_hat, r)
except Exception:
    dx = r * (grad * gamma)
"""), "calls tinymlp.ops.norm.normalize_backward"),
    # the checker patched from the answer's own code
    # the checker patched from the answer's own code: it is not in the answer's process, so only
    # the answer's own numbers (here, a zero gradient) are graded
    "the checker patched": ("04.1", ln_with("""
import tinymlp.lessons
tinymlp.lessons.EXERCISES["04.2"] = tinymlp.lessons.EXERCISES["06.1"]
dx = 0 * x
"""), "the checks' own references"),
    "numpy patched": ("04.1", ln_with("""
np.allclose = lambda *args, **kwargs: True
dx = 0 * x
"""), "no gradient reached 'x'"),
    "numpy patched at the top of the notebook": ("04.1", ln_with("dx = 0 * x") + """
np.allclose = lambda *args, **kwargs: True
""", "no gradient reached 'x'"),
    # an answer that only fits the public case (the public seed's shapes hard-coded)
    "the public case hard-coded": ("06.1", """
from tinymlp.lessons import check

def mixer_block_parameters(S, C, D_S, D_C):
    return {(16, 32, 24, 64): 5128, (196, 512, 256, 2048): 2_202_564, (4, 3, 2, 5): 72}[(S, C, D_S, D_C)]
""", "KeyError"),
    # an object that compares equal to everything
    "an object equal to anything": ("06.1", """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

def mixer_block_parameters(S, C, D_S, D_C):
    return Anything()
""", "returned a Anything; return an int"),
    # ending the grading process, looping, reaching into the interpreter
    "os._exit": ("06.1", """
import os
def mixer_block_parameters(S, C, D_S, D_C):
    os._exit(0)
""", "imports os"),
    "sys.exit": ("06.1", """
def mixer_block_parameters(S, C, D_S, D_C):
    raise SystemExit(0)
""", "SystemExit"),
    "reading the checker's frames": ("06.1", """
import sys
def mixer_block_parameters(S, C, D_S, D_C):
    return sys._getframe(1).f_locals["want"]
""", "imports sys"),
    "a frame reached through an exception": ("06.1", """
def mixer_block_parameters(S, C, D_S, D_C):
    try:
        raise ValueError
    except ValueError as err:
        return err.__traceback__.tb_frame.f_back.f_locals["want"]
""", "uses .tb_frame"),
    # answers that change the check's own inputs so that the reference agrees with them
    "inputs zeroed": ("01.1", """
import numpy as np

def neuron_gradient(w, b, x, t):
    x[...] = 0
    return np.zeros_like(w), 0.0
""", "dL/dw"),
    "input zeroed (an array exercise)": ("07.2", """
import numpy as np

def toeplitz(w, S):
    w[...] = 0
    return np.zeros((S, S))
""", "toeplitz(w, S="),
    "the graph cut": ("02.1", """
def topological_order(root):
    root.parents = ()
    return [root]
""", "the order must hold every node the root depends on"),
    # the engine's apply replaced, so that the library's op runs outside the answer
    "apply overridden": ("04.1", ln_with("dx = None") + """
from tinymlp.ops.norm import LayerNorm
MyLayerNorm.apply = classmethod(lambda cls, *args, **kwargs: LayerNorm.apply(*args, **kwargs))
""", "the grader runs forward and backward through the engine's apply"),
    "the fast tier's kernels": ("04.1", ln_with("""
import tinymlp.fast.norm
dx = tinymlp.fast.norm.FastLayerNorm.backward(ctx, grad)[0]
"""), "tinymlp.fast"),
    "eval": ("06.1", """
def mixer_block_parameters(S, C, D_S, D_C):
    return eval("2 * (2 * C)")
""", "uses eval"),
    # a name built at run time, the built-ins reached by name, a module reached through tinymlp's own
    "a name built at run time": ("04.1", ln_with("""
getattr(tinymlp.autograd.threading, "set" + "trace")(None)
dx = 0 * x
"""), "attribute name built at run time"),
    "__builtins__": ("06.1", """
def mixer_block_parameters(S, C, D_S, D_C):
    return __builtins__["ev" + "al"]("2 * (2 * C)")
""", "uses __builtins__"),
    "a module reached through tinymlp's": ("04.1", ln_with("""
tinymlp.lessons.forbidden.sys.settrace(None)
dx = 0 * x
"""), "reaches into the grader (tinymlp.lessons.forbidden"),
    "a module reached through numpy's": ("04.1", ln_with("""
np.core.numeric.sys.settrace(None)
dx = 0 * x
"""), "uses .settrace"),
}


def tiny(source, tmp_path, student="mallory", lesson="04"):
    nb = new_notebook(cells=[new_code_cell(source), new_code_cell(f'check("{lesson}.1", None)')])
    return submit(tmp_path, student, f"{lesson}_trick.ipynb", nb)


@pytest.mark.parametrize("name", list(TRICKS))
def test_every_trick_found_so_far_fails_with_its_reason(name, tmp_path, checkout_env):
    ex_id, source, reason = TRICKS[name]
    answer = {"01.1": "neuron_gradient", "02.1": "topological_order", "04.1": "MyLayerNorm",
              "06.1": "mixer_block_parameters", "07.2": "toeplitz"}[ex_id]
    nb = new_notebook(cells=[new_code_cell(source), new_code_cell(f'check("{ex_id}", {answer})')])
    path = submit(tmp_path, "mallory", f"{ex_id[:2]}_trick.ipynb", nb)
    result = grader.grade_exercise(path, "mallory/trick.ipynb", ex_id, [None, SEED], timeout=60)
    assert result["status"] == "FAILED", (name, result)
    assert reason in result["details"], (name, result["details"])
    assert result["reason"], name


GELU_HALF_LOST = """
import math
import numpy as np
from tinymlp import Function

C0, C1 = math.sqrt(2 / math.pi), 0.044715


class MyGELU(Function):
    @staticmethod
    def forward(ctx, x):
        t = np.tanh(C0 * (x + C1 * x * x * x))
        ctx.save_for_backward(x, t)
        return 0.5 * x * (1 + t)

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.saved_tensors
        return grad * (0.5 * (1 + t) + x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x))   # the 1/2 of (1 - t^2)/2 lost
"""
SOFTPLUS_TERM_MISSING = """
import numpy as np
import tinymlp
from tinymlp import Function


class SoftplusBeta(Function):                        # y = log(1 + exp(beta x)) / beta, beta per channel
    @staticmethod
    def forward(ctx, x, beta):
        sp = np.logaddexp(0, beta * x)
        ctx.save_for_backward(x, beta, sp)
        return sp / beta

    @staticmethod
    def backward(ctx, g):
        x, beta, sp = ctx.saved_tensors
        s = 1 / (1 + np.exp(-beta * x))
        return g * s, (g * x * s / beta).reshape(-1, x.shape[-1]).sum(0)   # the term - sp / beta**2 missing


def my_layer(x, beta):
    return SoftplusBeta.apply(x, beta)


rng = np.random.default_rng(3)
layer_inputs = (tinymlp.tensor(rng.standard_normal((4, 5)), requires_grad=True, dtype="float64"),
                tinymlp.tensor(rng.uniform(0.5, 2.0, 5), requires_grad=True, dtype="float64"))
"""
PRELU_SLOPE_UNCHECKED = """
import numpy as np
import tinymlp
from tinymlp import Function


class PReLU(Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x, alpha)
        return np.where(x > 0, x, alpha * x)

    @staticmethod
    def backward(ctx, g):
        x, alpha = ctx.saved_tensors
        return np.where(x > 0, g, alpha * g), 3 * (g * np.minimum(x, 0)).sum(0)   # wrong, and never checked


def my_layer(x, alpha):
    return PReLU.apply(x, alpha)


rng = np.random.default_rng(0)
layer_inputs = (tinymlp.tensor(rng.standard_normal((4, 5)), requires_grad=True),
                tinymlp.tensor(rng.uniform(0.1, 0.4, 5)))          # the slope: requires_grad forgotten
"""
# a student's slip -> the words the grader's reason (the one-line summary) must use, and must not
MISTAKES = {
    "GELU: a factor 1/2 lost in one term": ("03.2", "MyGELU", GELU_HALF_LOST,
                                            "the term x (1 - t^2)/2 c0 (1 + 3 c1 x^2) of dy/dx is twice", "FAILED:"),
    "Toeplitz: the transpose": ("07.2", "toeplitz", """
import numpy as np
def toeplitz(w, S):
    i, j = np.indices((S, S))
    return w[j - i + S - 1]
""", "exactly the transpose of the expected", "largest difference"),
    "Toeplitz backward: the diagonals reversed": ("07.3", "toeplitz_backward", """
import numpy as np
def toeplitz_backward(dW):
    S = dW.shape[0]
    return np.array([np.trace(dW, offset=k) for k in range(-(S - 1), S)])
""", "exactly the expected reversed", "largest difference"),
    "rotation: the sign of sin": ("05.4", "rotation", """
import numpy as np
def rotation(phi, omega):
    M = np.zeros((2 * len(omega), 2 * len(omega)))
    for i, w in enumerate(omega):
        c, s = np.cos(w * phi), np.sin(w * phi)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, -s], [s, c]]
    return M
""", "a shift backwards", "largest difference"),
    "own layer: a missing term": ("10.3", "(my_layer, layer_inputs)", SOFTPLUS_TERM_MISSING,
                                  "missing from backward or has the wrong sign", "the main term"),
    "own layer: a parameter without requires_grad": ("10.3", "(my_layer, layer_inputs)", PRELU_SLOPE_UNCHECKED,
                                                    "input 'alpha' (5,): a float tensor without requires_grad=True",
                                                    "passed"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_students_mistake_is_graded_with_the_words_that_name_it(name, tmp_path, checkout_env):
    ex_id, answer, source, said, unsaid = MISTAKES[name]
    nb = new_notebook(cells=[new_code_cell(source), new_code_cell(f'check("{ex_id}", {answer})')])
    path = submit(tmp_path, "erin", f"{ex_id[:2]}_mistake.ipynb", nb)
    result = grader.grade_exercise(path, "erin/mistake.ipynb", ex_id, [None, SEED], timeout=60)
    assert result["status"] == "FAILED", (name, result)
    assert said in result["reason"], (name, result["reason"])
    assert unsaid not in result["reason"], (name, result["reason"])


@pytest.mark.slow
def test_an_answer_that_loops_forever_fails_after_the_timeout(tmp_path, checkout_env):
    nb = new_notebook(cells=[new_code_cell("def mixer_block_parameters(S, C, D_S, D_C):\n"
                                           "    while True:\n"
                                           "        pass"),
                             new_code_cell('check("06.1", mixer_block_parameters)')])
    result = grader.grade_exercise(submit(tmp_path, "mallory", "06_loop.ipynb", nb), "m", "06.1", [None], timeout=5)
    assert result["status"] == "FAILED" and "did not finish in 5 s" in result["reason"]


def test_the_answers_own_print_cannot_forge_a_result(tmp_path, checkout_env):
    nb = new_notebook(cells=[new_code_cell(
        'def mixer_block_parameters(S, C, D_S, D_C):\n'
        '    print(\'{"status": "passed", "details": ""}\')\n'
        '    print("exercise 06.1 a Mixer block\'s parameter count: passed")\n'
        '    return 0'), new_code_cell('check("06.1", mixer_block_parameters)')])
    result = grader.grade_exercise(submit(tmp_path, "mallory", "06_print.ipynb", nb), "m", "06.1", [None])
    assert result["status"] == "FAILED" and "expected" in result["reason"]


@pytest.mark.lessons
@pytest.mark.slow
def test_what_the_notebook_prints_or_patches_in_its_kernel_changes_no_grade(tmp_path, checkout_env):
    """A fake passed line and a patched EXERCISES in the notebook: the grade is the answer's."""
    nb = new_notebook(cells=[
        new_code_cell("from tinymlp.lessons import check\n"
                      "import tinymlp.lessons\n"
                      "for _ex in tinymlp.lessons.EXERCISES.values():\n"
                      "    object.__setattr__(_ex, 'run', lambda answer, case: None)      # every check passes here"),
        new_code_cell("def mixer_block_parameters(S, C, D_S, D_C):\n    return S * C             # wrong\n\n\n"
                      "check('06.1', mixer_block_parameters)"),
        new_code_cell("print(\"exercise 06.3 a Mixer block's floating-point operations: passed\")   # a fake line"),
    ])
    path = submit(tmp_path, "mallory", "06_mlp_mixer.ipynb", nb)
    graded = grader.grade_notebook(path, SEED)
    status = {r.exercise: (r.status, r.notebook_said) for r in graded.rows}
    assert status == {"06.1": ("FAILED", "passed"), "06.2": ("not done", ""), "06.3": ("not done", "passed")}
    assert "* the notebook's own output says passed" in reports.table([graded])
    assert not graded.passed


# ------------------------------------------------------------------------------ reports a student can act on
@pytest.mark.lessons
@pytest.mark.slow
def test_reproduce_lines_run_where_they_are_printed(tmp_path, checkout_env):
    nb = nbformat.read(EXERCISES_DIR / "04_layernorm.ipynb", as_version=4)
    plant(nb, "04.1", WRONG_04_1)
    path = submit(tmp_path, "bob", "04_layernorm.ipynb", nb)
    row = next(r for r in grader.grade_notebook(path, SEED, execute_first=False).rows if r.exercise == "04.1")
    printed = re.search(r"^\s*reproduce: (.*)$", _notebook_output(path), flags=re.M).group(1)
    assert printed == 'import tinymlp.lessons; tinymlp.gradcheck(*tinymlp.lessons.case("04.1", MyLayerNorm))'
    # the notebook's own line, and the grader's line for its failing case (public or hidden)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(new_code_cell("from tinymlp import GradcheckError\n"
                                  f"for line in [{printed!r}, {row.reproduce!r}]:\n"
                                  "    try:\n"
                                  "        exec(line)\n"
                                  "    except GradcheckError as err:\n"
                                  "        print('reproduced:', err.report.per_tensor['x'].hint_kind)\n"))
    nb.cells.append(new_code_cell(f'check("04.1", MyLayerNorm, seed={SEED})'))
    nbformat.write(nb, path)
    run = grader.execute(path)
    assert not run.errors, run.errors
    output = run.outputs
    assert output.count("reproduced: row_constant") == 2
    assert output.count("exercise 04.1 LayerNorm backward: FAILED") == 2


def test_a_reproduce_line_runs_in_a_notebook_that_never_imported_tinymlp(capsys):
    """A student's notebook may import only ``check``: the printed line must still run there."""
    from tinymlp import GradcheckError

    source = ln_with("g = grad * gamma\ndx = r * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))")
    source = source.replace("import tinymlp\n", "").replace("from tinymlp import F, Function, array_module",
                                                            "from tinymlp import Function")
    namespace = {"__name__": "__main__"}
    exec(compile(source + '\ncheck("04.1", MyLayerNorm)\n', "<cell>", "exec"), namespace)  # noqa: S102
    assert "tinymlp" not in namespace
    printed = re.search(r"^\s*reproduce: (.*)$", capsys.readouterr().out, flags=re.M).group(1)
    with pytest.raises(GradcheckError) as err:
        exec(printed, namespace)  # noqa: S102 (pasted into the notebook)
    assert err.value.report.per_tensor["x"].hint_kind == "row_constant"


def _notebook_output(path):
    return grader.execute(path).outputs


def test_an_error_inside_backward_shows_the_students_cell_and_line(tmp_path, checkout_env):
    source = ln_with("dx = r * grad.mean(axis=-1, keepdim=True)      # a typo: keepdim")
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell(source),
                             new_code_cell('check("04.1", MyLayerNorm)')])
    path = submit(tmp_path, "bob", "04_typo.ipynb", nb)
    result = grader.grade_exercise(path, "bob/04_typo.ipynb", "04.1", [None])
    assert result["status"] == "FAILED"
    details = result["details"]
    assert details.startswith("TypeError: ") and "keepdim" in details
    line = 1 + source.splitlines().index("        dx = r * grad.mean(axis=-1, keepdim=True)      # a typo: keepdim")
    assert f"in MyLayerNorm.backward, bob/04_typo.ipynb, cell 2, line {line}:" in details
    assert "dx = r * grad.mean(axis=-1, keepdim=True)" in details.splitlines()[-1]


@pytest.mark.lessons
@pytest.mark.slow
def test_an_error_inside_backward_in_the_notebook_names_its_cell(tmp_path, checkout_env):
    source = ln_with("dx = r * grad.mean(axis=-1, keepdim=True)")
    nb = new_notebook(cells=[new_code_cell(source), new_code_cell('check("04.1", MyLayerNorm)')])
    path = submit(tmp_path, "bob", "04_typo.ipynb", nb)
    output = _notebook_output(path)
    assert "exercise 04.1 LayerNorm backward: FAILED" in output
    assert re.search(r"in MyLayerNorm\.backward, Cell In\[1\], line \d+:\n\s+dx = r \* grad\.mean", output), output


def test_every_check_names_its_lesson_section_and_a_library_file_that_exists():
    from tinymlp.lessons import EXERCISES
    from tinymlp.lessons.forbidden import Guard

    for ex in EXERCISES.values():
        assert ex.section.startswith(f'lesson {int(ex.lesson)}, section "'), ex.id   # a heading: see test_lessons.py
        path = ex.reference.split(" ")[0]
        assert (ROOT / path).is_file(), (ex.id, path)
        assert len(Guard(ex).forbidden) >= len(ex.forbidden), ex.id   # every forbidden name still resolves


# ------------------------------------------------------------------------------ outside the repository
@pytest.mark.lessons
@pytest.mark.slow
def test_a_notebook_copied_out_of_the_repository_still_finds_its_checks(tmp_path, checkout_env, monkeypatch):
    copy = tmp_path / "homework" / "01_backprop_by_hand.ipynb"
    copy.parent.mkdir()
    copy.write_bytes((EXERCISES_DIR / "01_backprop_by_hand.ipynb").read_bytes())
    monkeypatch.setenv("PYTHONPATH", str(ROOT))       # tinymlp importable, as after pip install -e .
    run = grader.execute(copy)
    assert not run.errors, run.errors
    assert run.claims == {"01.1": "not done yet", "01.2": "not done yet"}

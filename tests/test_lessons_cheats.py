"""The grader against a determined student with the repository in hand: each kind of cheat is
planted in a notebook and must fail, or be flagged for the instructor, with its reason.

1. The answer cannot reach the grade: it runs in a process of its own that only computes its
   outputs and gradients; whatever it patches there (the serialiser, the runner, the registry,
   NumPy) changes only its own numbers, and nothing of it runs in the grading process.
2. Derived, not estimated: complex steps, dual numbers, Richardson's differences, a Jacobian
   computed in forward, the library's code called from a plain class, a thread, a pasted copy;
   files written or removed; the confinement refusing what the static scan would also refuse.
3. Copies flagged: the worked notebook handed in, another student's answer renamed, the
   library's backward pasted.
4. Identity: a metadata name that is another student's, a name with ``..``, two notebooks for
   one student, a notebook of another lesson under this lesson's name, a roster.
5. Reports: why an answer is not done, the cell a timeout stopped in, a statement the grader
   cannot place.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_notebook  # noqa: E402

from tinymlp.lessons import grader  # noqa: E402
from tinymlp.lessons.sandbox import unavailable  # noqa: E402

UNCONFINED = ["--unconfined"] if unavailable() else []   # the grader grades only with it where no sandbox starts

ROOT = pathlib.Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
CHECKS = LESSONS / "checks.py"
SEED = 4321



def submit(folder, student, name, nb):
    path = pathlib.Path(folder) / student / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def grade(tmp_path, source, ex_id, answer, student="mallory"):
    nb = new_notebook(cells=[new_code_cell(source), new_code_cell(f'check("{ex_id}", {answer})')])
    path = submit(tmp_path, student, f"{ex_id[:2]}_cheat.ipynb", nb)
    return grader.grade_exercise(path, f"{student}/cheat.ipynb", ex_id, [None, SEED], timeout=60)


def indent(body, n=8):
    return "\n".join(" " * n + line if line else line for line in body.strip("\n").splitlines())


LAYER_NORM = '''
import numpy as np
import tinymlp
from tinymlp import Function
{before}

def ln(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps) + beta


class MyLayerNorm(Function):
{body}
    @staticmethod
    def forward(ctx, x, gamma, beta, eps=1e-5):
        mu = x.mean(axis=-1, keepdims=True)
        r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
        x_hat = (x - mu) * r
        ctx.save_for_backward(x, x_hat, r, gamma, beta)
{forward}
        return gamma * x_hat + beta

    @staticmethod
    def backward(ctx, grad):
        x, x_hat, r, gamma, beta = ctx.saved_tensors
        rows = tuple(range(grad.ndim - 1))
        dgamma, dbeta = (grad * x_hat).sum(axis=rows), grad.sum(axis=rows)
{dx}
        return dx, dgamma, dbeta
{after}
'''
RIGHT_DX = """
g = grad * gamma
dx = r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
"""


def layer_norm(dx=RIGHT_DX, before="", body="", forward="", after=""):
    """A LayerNorm answer (exercise 04.1) with ``dx`` computed by the given lines of backward."""
    return LAYER_NORM.format(dx=indent(dx), before=before, body=indent(body, 4), forward=indent(forward),
                             after=after)


GELU = '''
import numpy as np
from tinymlp import Function
C0, C1 = np.sqrt(2 / np.pi), 0.044715


def gelu(x):
    return 0.5 * x * (1 + np.tanh(C0 * (x + C1 * x ** 3)))


class MyGELU(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
{body}
{after}
'''


def gelu(body, after=""):
    return GELU.format(body=indent(body), after=after)


DUAL = '''
class Dual:
    """a + eps d: carries a derivative through every operation."""

    def __init__(self, a, eps=0.0):
        self.a, self.eps = a, eps

    def __add__(self, o):
        o = o if isinstance(o, Dual) else Dual(o)
        return Dual(self.a + o.a, self.eps + o.eps)

    __radd__ = __add__

    def __sub__(self, o):
        return self + (-1.0) * o

    def __mul__(self, o):
        o = o if isinstance(o, Dual) else Dual(o)
        return Dual(self.a * o.a, self.a * o.eps + self.eps * o.a)

    __rmul__ = __mul__

    def tanh(self):
        t = np.tanh(self.a)
        return Dual(t, (1 - t * t) * self.eps)

    def rsqrt(self):
        s = 1 / np.sqrt(self.a)
        return Dual(s, -0.5 * s ** 3 * self.eps)


def dual_layer_norm_row(row, gamma, beta, k, eps=1e-5):
    """One row of LayerNorm in dual numbers, differentiated along element k: a derivative never derived."""
    d = [Dual(v, 1.0 if i == k else 0.0) for i, v in enumerate(row)]
    mu = sum(d, Dual(0.0)) * (1 / len(d))
    c = [v - mu for v in d]
    var = sum((v * v for v in c), Dual(0.0)) * (1 / len(d))
    r = (var + eps).rsqrt()
    return [v * r * g + b for v, g, b in zip(c, gamma, beta)]
'''


# ------------------------------------------------------------------------------ 1. the answer cannot reach the grade
PATCHES = """
import tinymlp.lessons.forbidden as guard
import tinymlp.lessons.registry as registry
import tinymlp.lessons.runner as runner
import tinymlp.lessons.wire as wire
import tinymlp.lessons.worker as worker
# everything that compared, recorded or serialised a result in the answer's process before
runner.run_check = lambda *args, **kwargs: runner.Result("04.1", "LayerNorm backward", runner.PASSED)
runner.stub_reached = lambda err: None
registry.EXERCISES.clear()
guard.Forbidden.__init__ = lambda self, *args: None
np.allclose = lambda *args, **kwargs: True
np.linalg.norm = lambda *args, **kwargs: 0.0
wire.pack = lambda message, _pack=wire.pack, **kw: _pack(
    {"value": message.get("value", 0.0)} if "error" in message else message, **kw)
worker._Server.do_violations = lambda self, message: {"value": []}
tinymlp.MARKED_BY_THE_ANSWER = True
"""


@pytest.mark.parametrize("dx", ['raise NotImplementedError("exercise 04.1")', "dx = 0 * x", RIGHT_DX],
                         ids=["unanswered", "wrong", "right"])
def test_an_answer_that_patches_the_graders_modules_is_refused_and_changes_nothing_here(dx, tmp_path, checkout_env):
    import tinymlp

    result = grade(tmp_path, layer_norm(dx, body=PATCHES), "04.1", "MyLayerNorm")
    assert result["status"] == "FAILED", result
    assert "reaches into the grader (tinymlp.lessons.forbidden" in result["details"], result["details"]
    assert not hasattr(tinymlp, "MARKED_BY_THE_ANSWER")   # the answer's code never ran in this process


def test_patches_in_the_answers_own_process_change_only_its_own_numbers(checkout_env):
    """Past the scan (the process is sent the program directly), whatever the answer patches in its
    own process, the serialiser and the worker among them, changes only what it sends."""
    from tinymlp.lessons.remote import AnswerProcess, RemoteError

    source = "import numpy as np\nimport tinymlp\n" + PATCHES + "\ndef answer(S, C, D_S, D_C):\n    return 0\n"
    lines = len([n for n in __import__("ast").parse(source).body])
    job = {"exercise": "06.1", "forbidden": [], "label": "mallory/x.ipynb", "answer": "answer",
           "cells": {"<mallory/x.ipynb, cell 1>": source},
           "statements": [["<mallory/x.ipynb, cell 1>", i] for i in range(lines)]}
    with AnswerProcess(job, timeout=120) as proc:
        try:
            value = proc.first["answer"](16, 32, 24, 64) if "answer" in proc.first else None
        except RemoteError:
            value = None
    assert value in (0, None)
    import tinymlp
    assert not hasattr(tinymlp, "MARKED_BY_THE_ANSWER")


def test_the_grading_process_reads_only_plain_data():
    """What the answer's process sends is decoded without running any of its code: a value of any
    other type arrives as its type's name, and a malformed message is refused."""
    import numpy as np

    from tinymlp.lessons import wire

    data = wire.pack({"value": [np.arange(3.0), np.int64(4), {"a", "b"}, 1 + 2j, ...]})
    assert wire.unpack(data)["value"][1] == 4
    for bad in (b"\x00" * 7, data[:-1], data[:8] + b"{not json" + data[17:],
                wire.pack({"value": 1}).replace(b'"value": 1', b'"value": {"$a": 9}')):
        with pytest.raises(wire.WireError):
            wire.unpack(bad)

    class Anything(int):
        def __eq__(self, other):
            return True

    assert isinstance(wire.unpack(wire.pack({"value": Anything(3)}))["value"], wire.Opaque)


# ------------------------------------------------------------------------------ 2. derived, not estimated
DERIVED = {
    "complex step (GELU)": ("03.2", "MyGELU", gelu("return grad * np.imag(gelu(x + 1e-30j)) / 1e-30"),
                            "computes with complex numbers", None),
    "complex step (LayerNorm, by element)": ("04.1", "MyLayerNorm", layer_norm("""
dx = np.zeros_like(x)
for i in np.ndindex(x.shape):
    e = np.zeros(x.shape, dtype="complex128")
    e[i] = 1e-30
    dx[i] = (np.imag(ln(x + e * 1j, gamma, beta)) * grad).sum() / 1e-30
"""), "computes with complex numbers", None),
    "dual numbers (LayerNorm, by element)": ("04.1", "MyLayerNorm", layer_norm("""
dx = np.zeros_like(x)
for i in np.ndindex(x.shape):
    row = dual_layer_norm_row(x[i[:-1]], gamma, beta, i[-1])
    dx[i] = sum(y.eps * gi for y, gi in zip(row, grad[i[:-1]]))
""", after=DUAL), "did not finish in", "defines its own number type, Dual"),
    "a Jacobian in forward (LayerNorm, dual numbers)": ("04.1", "MyLayerNorm", layer_norm(
        "dx = np.einsum('...ij,...j->...i', ctx.jacobian, grad)", forward="""
ctx.jacobian = np.zeros(x.shape + x.shape[-1:])
for i in np.ndindex(x.shape):
    row = dual_layer_norm_row(x[i[:-1]], gamma, beta, i[-1])
    ctx.jacobian[i] = [y.eps for y in row]
""", after=DUAL), "forward on inputs of shape", "defines its own number type, Dual"),
    "dual numbers (GELU, vectorised)": ("03.2", "MyGELU", gelu("""
d = Dual(x, np.ones_like(x))
return grad * (d * 0.5 * (d * C0 + d * d * d * (C0 * C1)).tanh() + d * 0.5).eps
""", after=DUAL), None, "defines its own number type, Dual"),
    "Richardson (GELU, vectorised)": ("03.2", "MyGELU", gelu("""
h = 1e-3
return grad * (8 * (gelu(x + h) - gelu(x - h)) - (gelu(x + 2 * h) - gelu(x - 2 * h))) / (12 * h)
"""), "estimated numerically", "divides by a small step (12 * h)"),
    "Richardson, 8 points (LayerNorm, a column of every row at once)": ("04.1", "MyLayerNorm", layer_norm("""
h = 2e-2
dx = np.zeros_like(x)
for j in range(x.shape[-1]):
    e = np.zeros_like(x)
    e[..., j] = 1.0
    f = lambda k: (ln(x + k * h * e, gamma, beta) * grad).sum(axis=-1)
    dx[..., j] = (672 * (f(1) - f(-1)) - 168 * (f(2) - f(-2)) + 32 * (f(3) - f(-3)) - 3 * (f(4) - f(-4))) / (840 * h)
"""), "estimated numerically", "divides by a small step (840 * h)"),
    "the library's op in a plain class": ("04.1", "MyLayerNorm", layer_norm(
        "dx = Helper().grad(grad * gamma, x_hat, r)", before="from tinymlp.ops.norm import normalize_backward",
        after="class Helper:\n    def grad(self, g, x_hat, r):\n        return normalize_backward(g, x_hat, r)\n"),
        "the answer calls tinymlp.ops.norm.normalize_backward", None),
    "the library's op in a thread, its refusal caught": ("04.1", "MyLayerNorm", layer_norm("""
out = []
def work():
    try:
        out.append(normalize_backward(grad * gamma, x_hat, r))
    except Exception:
        out.append(r * grad * gamma)
thread = tinymlp.grad_mode.threading.Thread(target=work)
thread.start()
thread.join()
dx = out[0]
""", before="from tinymlp.ops.norm import normalize_backward"), "the answer calls tinymlp.ops.norm.normalize_backward",
        None),
    "the library's code pasted, renamed": ("04.1", "MyLayerNorm", layer_norm(
        "dx = my_backward(grad * gamma, x_hat, r)", before='''
def my_backward(g, xh, rs):
    """mine"""
    mean_g = g.mean(axis=-1, keepdims=True)
    mean_gx = (g * xh).mean(axis=-1, keepdims=True)
    return rs * (g - mean_g - xh * mean_gx)
'''), None, "the answer's code is tinymlp.ops.norm.normalize_backward"),
    "the library's Function as the layer of one's own": ("10.3", "(my_layer, layer_inputs)", '''
import numpy as np
import tinymlp
from tinymlp import F

def my_layer(x):
    return F.gelu(x)

layer_inputs = (tinymlp.tensor(np.linspace(-2, 2, 12).reshape(3, 4), requires_grad=True),)
''', "tinymlp.ops.activation.GELU.forward", None),
    "a library op inside a do-nothing Function of one's own": ("10.3", "(my_layer, layer_inputs)", '''
import numpy as np
import tinymlp
from tinymlp import F, Function


class Mine(Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def my_layer(x):
    return Mine.apply(F.gelu(x))

layer_inputs = (tinymlp.tensor(np.linspace(-2, 2, 12).reshape(3, 4), requires_grad=True),)
''', "a library op, while its own code runs", None),
    "a Function whose forward and backward are the library's": ("10.3", "(my_layer, layer_inputs)", '''
import numpy as np
import tinymlp
from tinymlp import Function
from tinymlp.ops.activation import GELU


class Mine(Function):
    @staticmethod
    def forward(ctx, x):
        return GELU.forward(ctx, x)

    @staticmethod
    def backward(ctx, grad):
        return GELU.backward(ctx, grad)


def my_layer(x):
    return Mine.apply(x)

layer_inputs = (tinymlp.tensor(np.linspace(-2, 2, 12).reshape(3, 4), requires_grad=True),)
''', "tinymlp.ops.activation.GELU.forward", None),
    "a backward that calls another op's backward (Swish through Sigmoid's)": ("10.2", "SwishFunction", '''
import numpy as np
from tinymlp import Function
from tinymlp.ops.activation import GELU


class SwishFunction(Function):
    @staticmethod
    def forward(ctx, x):
        s = 1 / (1 + np.exp(-x))
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, grad):
        x, s = ctx.saved_tensors
        return GELU.backward(ctx, grad) * 0 + grad * (s + x * s * (1 - s))
''', "a library op, while its own code runs", None),
    "one complex step along G gamma, the unit spelled np.emath.sqrt(-1.0)": ("04.1", "MyLayerNorm", layer_norm("""
unit = np.emath.sqrt(-1.0)
v = grad * gamma                       # J is symmetric: one complex step along G gamma gives J (G gamma)
z = x + 1e-20 * unit * v
mu = z.mean(axis=-1, keepdims=True)
dx = np.imag((z - mu) / np.sqrt(((z - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)) / 1e-20
"""), "computes with complex numbers (emath", None),
    "5-point differences in extended precision (GELU)": ("03.2", "MyGELU", gelu("""
xl, h = x.astype(np.longdouble), np.longdouble(1e-4)
f = lambda v: 0.5 * v * (1 + np.tanh(np.longdouble(C0) * (v + np.longdouble(C1) * v ** 3)))
return grad * np.asarray((8 * (f(xl + h) - f(xl - h)) - (f(xl + 2 * h) - f(xl - 2 * h))) / (12 * h), dtype=x.dtype)
"""), None, "computes in extended precision (longdouble"),
    "dual numbers whose operators are assigned (GELU)": ("03.2", "MyGELU", gelu("""
d = Dual(x, np.ones_like(x))
inner = d * C0 + d * d * d * (C0 * C1)
t = np.tanh(inner.a)
return grad * (d * 0.5 * Dual(t, (1 - t * t) * inner.eps) + d * 0.5).eps
""", after="""
class Dual:
    def __init__(self, a, eps=0.0):
        self.a, self.eps = a, eps


Dual.__add__ = lambda s, o: Dual(s.a + o.a, s.eps + o.eps) if isinstance(o, Dual) else Dual(s.a + o, s.eps)
Dual.__mul__ = lambda s, o: (Dual(s.a * o.a, s.a * o.eps + s.eps * o.a) if isinstance(o, Dual)
                             else Dual(s.a * o, s.eps * o))
"""), None, "gives a type arithmetic operators at run time"),
}
SCAN_BYPASSES = {
    "attrgetter with a name built at run time": ("import operator\ngetter = operator.attrgetter('__glo' + 'bals__')",
                                                "attribute name built at run time"),
    "attrgetter of a refused attribute": ("import operator\nframe = operator.attrgetter('f_back')",
                                          "uses .f_back"),
    "the grader's guard": ("import tinymlp.lessons.forbidden as guard\nguard._DIVERTED.clear()",
                           "reaches into the grader (tinymlp.lessons.forbidden"),
    "the guard through tinymlp's attributes": ("import tinymlp\ntinymlp.lessons.forbidden.Guard = None",
                                               "reaches into the grader (tinymlp.lessons.forbidden"),
    "exec through np.vectorize and the built-ins": ("run = np.vectorize(print.__self__.exec)", "uses .__self__"),
}


@pytest.mark.parametrize("name", list(SCAN_BYPASSES))
def test_ways_around_the_scan_are_refused_with_the_construct(name, tmp_path, checkout_env):
    before, reason = SCAN_BYPASSES[name]
    result = grade(tmp_path, layer_norm(before + "\n" + RIGHT_DX), "04.1", "MyLayerNorm")   # inside backward
    assert result["status"] == "FAILED" and reason in result["details"], (name, result["details"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DERIVED))
def test_a_gradient_never_derived_fails_or_is_flagged_with_its_reason(name, tmp_path, checkout_env):
    ex_id, answer, source, reason, flag = DERIVED[name]
    result = grade(tmp_path, source, ex_id, answer)
    if reason is None:       # an estimate cost and exactness cannot tell: flagged, not failed
        assert result["status"] == "passed", result["details"]
    else:
        assert result["status"] == "FAILED", (name, result)
        assert reason in result["details"], (name, result["details"])
    if flag is not None:
        assert any(flag in f for f in result["flags"]), (name, result["flags"])


def test_an_answer_may_not_write_remove_or_read_files_outside_the_libraries(tmp_path, checkout_env):
    victim = tmp_path / "bob" / "results.json"
    victim.parent.mkdir()
    victim.write_text('{"score": 2}')
    other = submit(tmp_path, "alice", "04_layernorm.ipynb", new_notebook(cells=[new_code_cell("x = 1")]))
    attempts = f"""
for attempt in (lambda: np.save({str(victim)!r}, x), lambda: tinymlp.files.os.remove({str(victim)!r}),
                lambda: x.tofile({str(victim)!r}), lambda: np.loadtxt({str(other)!r})):
    try:
        attempt()
    except Exception:
        pass
""" + RIGHT_DX
    result = grade(tmp_path, layer_norm(attempts), "04.1", "MyLayerNorm")
    assert result["status"] == "FAILED" and "the answer opens a file to write" in result["details"], result
    assert victim.read_text() == '{"score": 2}' and sorted(p.name for p in victim.parent.iterdir()) == ["results.json"]


def test_the_answers_process_refuses_at_run_time_what_the_scan_refuses_by_name(checkout_env):
    """The confinement, tried on a program the static scan never sees: each way in is refused."""
    from tinymlp.lessons.remote import AnswerProcess

    source = '''
import numpy as np
import tinymlp

def attempts():
    out = []
    for name, attempt in [
        ("exec", lambda: tinymlp.autograd.__builtins__["exec"]("y = 1", {})),
        ("code", lambda: getattr(attempts, "__co" + "de__")),
        ("frame", lambda: tinymlp.backend.sys._getframe(0)),
        ("process", lambda: tinymlp.files.os.system("true")),
        ("subprocess", lambda: tinymlp.autograd.__builtins__["__import__"]("subprocess").run(["true"])),
        ("native", lambda: tinymlp.autograd.__builtins__["__import__"]("ctypes").CDLL(None)),
        ("reload", lambda: tinymlp.autograd.__builtins__["__import__"]("importlib").reload(tinymlp.ops.norm)),
        ("gc", lambda: tinymlp.autograd.__builtins__["__import__"]("gc").get_objects()),
    ]:
        try:
            attempt()
            out.append(name + ": allowed")
        except Exception as err:
            out.append(name + ": " + str(err))
    return out
'''
    job = {"exercise": "04.1", "forbidden": [], "label": "mallory/x.ipynb", "answer": "attempts",
           "cells": {"<mallory/x.ipynb, cell 1>": source},
           "statements": [["<mallory/x.ipynb, cell 1>", i] for i in range(3)]}
    with AnswerProcess(job, timeout=60) as proc:
        out = proc.first["answer"]()
    assert len(out) == 8 and not any(line.endswith(": allowed") for line in out), out
    assert all("the answer " in line for line in out), out


# ------------------------------------------------------------------------------ 3. copies flagged
def _planted(base, answers):
    import re

    nb = nbformat.read(base, as_version=4)
    for ex_id, answer in answers.items():
        stub = f'raise NotImplementedError("exercise {ex_id}")'
        for cell in nb.cells:
            if cell.cell_type == "code" and stub in cell.source:
                pad = re.search(rf"^( *){re.escape(stub)}", cell.source, flags=re.M).group(1)
                cell.source = cell.source.replace(pad + stub, indent(answer, len(pad)))
    return nb


OWN = """
axes = tuple(range(grad.ndim - 1))       # sum over batch and tokens
d_gamma = (grad * x_hat).sum(axis=axes)
d_beta = grad.sum(axis=axes)
gg = grad * gamma                        # the gradient reaching x_hat
centred = gg - gg.mean(axis=-1, keepdims=True)
projection = x_hat * (gg * x_hat).mean(axis=-1, keepdims=True)
return r * (centred - projection), d_gamma, d_beta
"""
RENAMED = """
ax = tuple(range(grad.ndim - 1))       # sum over batch and tokens
dg = (grad * x_hat).sum(axis=ax)
db = grad.sum(axis=ax)
h = grad * gamma                        # the gradient reaching x_hat
c = h - h.mean(axis=-1, keepdims=True)
p = x_hat * (h * x_hat).mean(axis=-1, keepdims=True)
return r * (c - p), dg, db
"""
PASTED = """
rows = tuple(range(grad.ndim - 1))              # every axis but the last
dweight = (grad * x_hat).sum(axis=rows)
dbias = grad.sum(axis=rows)
dx_hat = grad if gamma is None else grad * gamma
return normalize_backward(dx_hat, x_hat, r), dweight, dbias
"""


def _library_source(name):
    """The source of a function of tinymlp/ops/norm.py, as a student would paste it."""
    import inspect

    from tinymlp.ops import norm

    return inspect.getsource(getattr(norm, name))


KEY_EDITED = """
axes = tuple(range(grad.ndim - 1))                 # every axis but the last one
dgamma = (grad * x_hat).sum(axis=axes)
dbeta = grad.sum(axis=axes)

g = gamma * grad                                   # dL/dx_hat
dx = r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
return dx, dgamma, dbeta
"""
INLINED = """
rows = tuple(range(grad.ndim - 1))              # every axis but the last
dweight = (grad * x_hat).sum(axis=rows)
dbias = grad.sum(axis=rows)
dx_hat = grad if gamma is None else grad * gamma
return r * (dx_hat - dx_hat.mean(axis=-1, keepdims=True)
            - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True)), dweight, dbias
"""


@pytest.mark.lessons
@pytest.mark.slow
def test_copies_are_flagged_for_the_instructor_with_their_evidence_and_not_failed(tmp_path, checkout_env):
    folder = tmp_path / "submissions"
    build = LESSONS / "exercises" / "04_layernorm.ipynb"
    submit(folder, "alice", "04_layernorm.ipynb", _planted(build, {"04.1": OWN}))
    submit(folder, "bob", "04_layernorm.ipynb", _planted(build, {"04.1": RENAMED}))   # alice's, renamed
    submit(folder, "carol", "04_layernorm.ipynb", nbformat.read(LESSONS / "04_layernorm.ipynb", as_version=4))
    dave = _planted(build, {"04.1": PASTED})
    dave.cells.insert(1, new_code_cell(_library_source("normalize_backward")))
    submit(folder, "dave", "04_layernorm.ipynb", dave)
    submit(folder, "frank", "04_layernorm.ipynb", _planted(build, {"04.1": KEY_EDITED}))  # the key, four edits
    submit(folder, "grace", "04_layernorm.ipynb", _planted(build, {"04.1": INLINED}))   # the library's, inlined
    graded, notes, similar = grader.grade_class(sorted(folder.glob("*/*.ipynb")), SEED, execute_first=False)
    rows = {(r.student, r.exercise): r for g in graded for r in g.rows}
    assert all(rows[s, "04.1"].status == "passed" for s in ("alice", "bob", "carol", "dave", "frank", "grace"))
    assert any("the answer's code is tinymlp.ops.norm.normalize_backward" in f for f in rows["dave", "04.1"].flags)
    # a pair, both ways, with no direction, and the lines alike as evidence
    alice, bob = rows["alice", "04.1"].flags, rows["bob", "04.1"].flags
    assert any("alike with student bob's answer" in f and "which came first the grader cannot tell" in f
               and "lines alike:" in f for f in alice), alice
    assert any("alike with student alice's answer" in f for f in bob), bob
    for student in ("carol", "frank"):
        flags = rows[student, "04.1"].flags
        assert any("alike with the worked notebook (04_layernorm.ipynb)" in f and "lines alike:" in f
                   for f in flags), (student, flags)
    assert any("alike with the worked notebook" in f for f in rows["carol", "04.2"].flags)
    assert any("alike with tinymlp/ops/norm.py (LayerNorm.backward)" in f for f in rows["grace", "04.1"].flags), \
        rows["grace", "04.1"].flags
    assert not any("worked notebook" in f for f in alice + bob)
    assert any("alice" in line and "bob" in line for line in similar), similar
    table = grader.reports.table(graded, notes, similar)
    assert "! flagged for the instructor (not failures):" in table and "similar answers" in table


# ------------------------------------------------------------------------------ 4. identity
def _notebook(source, metadata=None):
    return new_notebook(cells=[new_code_cell(source)], metadata=metadata or {})


RIGHT_06 = ("from tinymlp.lessons import check\n"
            "def mixer_block_parameters(S, C, D_S, D_C):\n"
            "    return 4 * C + 2 * S * D_S + D_S + S + 2 * C * D_C + D_C + C\n"
            "check('06.1', mixer_block_parameters)")
WRONG_06 = RIGHT_06.replace("return 4 * C", "return 0 * C")


def grade_cli(*args, timeout=600):
    return subprocess.run([sys.executable, str(CHECKS), "--seed", str(SEED), "--no-execute", *UNCONFINED,
                           *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_metadata_attack_leaves_the_other_students_results_intact_and_writes_nothing_outside(tmp_path, checkout_env):
    folder, out = tmp_path / "submissions", tmp_path / "out" / "results"
    submit(folder, "bob", "06_mlp_mixer.ipynb", _notebook(RIGHT_06))
    submit(folder, "mallory", "06_mlp_mixer.ipynb", _notebook(WRONG_06, {"student": "bob"}))
    submit(folder, "mallory", "04_layernorm.ipynb", _notebook(WRONG_06, {"tinymlp": {"student": "bob"}}))
    submit(folder, "eve", "06_mlp_mixer.ipynb", _notebook(WRONG_06, {"student": "../../escaped"}))
    run = grade_cli("--gradescope", "-o", out, *sorted(folder.glob("*/*.ipynb")))
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("results.json"))
    assert written == ["out/results/bob/results.json", "out/results/eve/results.json",
                       "out/results/mallory/results.json"], (written, run.stderr)
    bob = json.loads((out / "bob" / "results.json").read_text())
    # bob's own notebook only
    assert bob["score"] == 1 and [t["number"] for t in bob["tests"]] == ["06.1", "06.2", "06.3"]
    assert bob["tests"][0]["status"] == "passed"
    assert "mallory/06_mlp_mixer.ipynb claims student 'bob'" in run.stderr and "bob/06_mlp_mixer.ipynb" in run.stderr
    assert "eve/06_mlp_mixer.ipynb: the name in its metadata ('../../escaped') cannot be a student's" in run.stderr
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "out" / "escaped").exists()


@pytest.mark.slow
def test_two_notebooks_for_one_student_are_refused_naming_both(tmp_path, checkout_env):
    folder = tmp_path / "submissions"
    submit(folder, "alice", "06_mlp_mixer.ipynb", _notebook(RIGHT_06))
    submit(folder, "alice", "06_mlp_mixer_v2.ipynb", _notebook(WRONG_06))
    run = grade_cli(*sorted(folder.glob("*/*.ipynb")))
    assert run.returncode == 1
    assert ("not graded: two notebooks of lesson 06 for student 'alice': alice/06_mlp_mixer.ipynb and "
            "alice/06_mlp_mixer_v2.ipynb; neither is graded (hand in one)") in run.stdout, run.stdout


def test_a_notebook_of_another_lesson_scores_zero_under_this_lessons_name(tmp_path, checkout_env):
    source = RIGHT_06.replace("06.1", "06.1")
    nb = _notebook(source, {"tinymlp": {"lesson": "06"}})
    path = submit(tmp_path, "mallory", "04_layernorm.ipynb", nb)      # a lesson 6 notebook handed in for lesson 4
    graded = grader.grade_notebook(path, SEED, execute_first=False)
    assert graded.lesson == "04" and [r.exercise for r in graded.rows] == ["04.1", "04.2"]
    assert all(r.status == "FAILED" and r.score == 0 for r in graded.rows)
    assert ("is a notebook of lesson 6 (its check calls are lesson 6's exercises), not of lesson 4"
            in graded.rows[0].reason)


@pytest.mark.slow
def test_a_roster_names_the_students_and_refuses_other_folders(tmp_path, checkout_env):
    folder = tmp_path / "submissions"
    submit(folder, "u1017", "06_mlp_mixer.ipynb", _notebook(RIGHT_06))
    submit(folder, "u9999", "06_mlp_mixer.ipynb", _notebook(RIGHT_06, {"student": "Alice Martin"}))
    roster = tmp_path / "roster.csv"
    roster.write_text("# folder,name\nu1017,Alice Martin\n")
    run = grade_cli("--csv", "--roster", roster, *sorted(folder.glob("*/*.ipynb")))
    students = {line.split(",")[0] for line in run.stdout.splitlines()[1:] if line}
    assert students == {"Alice Martin"}, run.stdout
    assert "the folder 'u9999' is not in the roster" in run.stderr + run.stdout
    (tmp_path / "bad.csv").write_text("u1,../up\n")
    assert "cannot be a student's name" in grade_cli("--roster", tmp_path / "bad.csv", *folder.glob("*/*.ipynb")).stderr


def test_outputs_stay_inside_their_folder(tmp_path):
    from tinymlp.lessons.identity import inside, safe_name

    assert inside(tmp_path, "bob", "results.json") == tmp_path.resolve() / "bob" / "results.json"
    (tmp_path / "link").symlink_to(tmp_path.parent)
    for parts in (("..", "x"), ("/etc", "x"), ("link", "results.json"), ("a/../../b",)):
        with pytest.raises(ValueError):
            inside(tmp_path, *parts)
    assert [safe_name(n) for n in ("Judy Example", "o'neil-2", "../x", "a/b", "..", "", " x", "a\\b")] == [
        True, True, False, False, False, False, False, False]


# ------------------------------------------------------------------------------ 5. reports
def test_not_done_says_why_in_every_output(tmp_path, checkout_env):
    nb = nbformat.read(LESSONS / "exercises" / "04_layernorm.ipynb", as_version=4)
    path = submit(tmp_path, "bob", "04_layernorm.ipynb", nb)
    graded = grader.grade_notebook(path, SEED, execute_first=False)
    reason = 'the answer still raises NotImplementedError("exercise 04.1"): the stub is still there'
    assert graded.rows[0].status == "not done" and graded.rows[0].reason == reason
    test = grader.reports.gradescope([graded])["tests"][0]
    assert test["output"].startswith(reason) and "see: lesson 4" in test["output"]


@pytest.mark.lessons
@pytest.mark.slow
def test_a_timeout_names_the_cell_and_its_first_line(tmp_path, checkout_env):
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("import time\ntime.sleep(60)")])
    run = grader.execute(submit(tmp_path, "bob", "04_slow.ipynb", nb), timeout=3)
    assert run.errors == ["cell 2 (import time) did not finish in 3 s (CellTimeoutError)"], run.errors


@pytest.mark.parametrize("source", [
    'exec("def mixer_block_parameters(S, C, D_S, D_C):\\n    return 1")',
    'globals().update(mixer_block_parameters=lambda S, C, D_S, D_C: 1)',
    'scope = {}\nexec("def f(S, C, D_S, D_C):\\n    return 1", scope)\nmixer_block_parameters = scope["f"]',
], ids=["exec", "globals", "exec into a dict"])
def test_a_statement_the_grader_cannot_place_is_refused_with_a_reason(source, tmp_path, checkout_env):
    result = grade(tmp_path, "from tinymlp.lessons import check\n" + source, "06.1", "mixer_block_parameters")
    assert result["status"] in ("FAILED", "not done yet"), result
    assert ("in a way the grader cannot follow" in result["details"] or "defines names the grader cannot see"
            in result["details"] or "uses exec" in result["details"]), result["details"]
    assert "KeyError" not in result["details"]

"""No honest student accused: three students who derived lesson 4's answers, each in a style of
their own, pass with no flag; suspicion is evidence for the instructor, never a failed correct
answer.

* carol writes the lesson's boxed formulas in her own names (the worked notebook's shape, since
  the formula decides it);
* dan writes them with plain Python loops over rows and elements (slow: at most a timing note,
  which is no flag and names no method he did not use);
* erin writes them in a different but correct style (the gradient centred first, ``einsum``).

And the large input a backward is timed on is checked too: an answer that gives the right
numbers on the small cases and zeros on the large one fails there.
"""

from __future__ import annotations

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")

from tinymlp.lessons import grader, reports  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
STUDENT_BUILD = ROOT / "lessons" / "exercises" / "04_layernorm.ipynb"
SEED = 2024

OWN_NAMES = {"04.1": """
axes = tuple(range(grad.ndim - 1))
d_gamma = (grad * x_hat).sum(axis=axes)
d_beta = grad.sum(axis=axes)
G = grad * gamma
d_x = r * (G - G.mean(axis=-1, keepdims=True) - x_hat * (G * x_hat).mean(axis=-1, keepdims=True))
return d_x, d_gamma, d_beta
""", "04.2": """
n = row.shape[-1]
inv = 1 / np.sqrt(row.var() + eps)
z = (row - row.mean()) * inv
return inv * (np.eye(n) - 1 / n - np.outer(z, z) / n)
"""}
LOOPS = {"04.1": """
D = grad.shape[-1]
G, X, R = grad.reshape(-1, D), x_hat.reshape(-1, D), r.reshape(-1)
dx, dgamma, dbeta = np.zeros_like(G), np.zeros(D), np.zeros(D)
for b in range(G.shape[0]):
    mean_g, mean_gx = 0.0, 0.0
    for j in range(D):
        gj = G[b, j] * gamma[j]
        mean_g += gj / D
        mean_gx += gj * X[b, j] / D
        dgamma[j] += G[b, j] * X[b, j]
        dbeta[j] += G[b, j]
    for j in range(D):
        dx[b, j] = R[b] * (G[b, j] * gamma[j] - mean_g - X[b, j] * mean_gx)
return dx.reshape(grad.shape), dgamma, dbeta
""", "04.2": """
D = len(row)
mu = sum(row) / D
var = sum((v - mu) ** 2 for v in row) / D
s = 1 / np.sqrt(var + eps)
J = np.zeros((D, D))
for i in range(D):
    for j in range(D):
        J[i, j] = s * ((1.0 if i == j else 0.0) - 1 / D - (row[i] - mu) * s * (row[j] - mu) * s / D)
return J
"""}
OTHER_STYLE = {"04.1": """
centred = grad * gamma
centred = centred - centred.mean(-1, keepdims=True)        # the mean of x_hat is 0, so mean(g x_hat) is unchanged
projection = np.einsum("...d,...d->...", centred, x_hat)[..., None] / x_hat.shape[-1]
flat = lambda a: a.reshape(-1, a.shape[-1])
return r * (centred - projection * x_hat), np.einsum("nd,nd->d", flat(grad), flat(x_hat)), flat(grad).sum(0)
""", "04.2": """
size = row.size
scale = (row.var() + eps) ** -0.5
u = (row - row.mean()) * scale
jac = -np.outer(u, u) / size - 1.0 / size
jac[np.diag_indices(size)] += 1.0
return scale * jac
"""}


def plant(nb, answers):
    for ex_id, answer in answers.items():
        stub = f'raise NotImplementedError("exercise {ex_id}")'
        for cell in nb.cells:
            if cell.cell_type == "code" and stub in cell.source:
                pad = re.search(rf"^( *){re.escape(stub)}", cell.source, flags=re.M).group(1)
                body = "\n".join(pad + line if line else line for line in answer.strip("\n").splitlines())
                cell.source = cell.source.replace(pad + stub, body)
    return nb


def submit(folder, student, nb):
    path = folder / student / "04_layernorm.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.lessons
def test_three_honest_styles_pass_with_no_flag(tmp_path, checkout_env):
    folder = tmp_path / "submissions"
    for student, answers in (("carol", OWN_NAMES), ("dan", LOOPS), ("erin", OTHER_STYLE)):
        submit(folder, student, plant(nbformat.read(STUDENT_BUILD, as_version=4), answers))
    graded, notes, similar = grader.grade_class(sorted(folder.glob("*/*.ipynb")), SEED, execute_first=False)
    rows = {(r.student, r.exercise): r for g in graded for r in g.rows}
    want = {(s, e): "passed" for s in ("carol", "dan", "erin") for e in ("04.1", "04.2")}
    assert {k: r.status for k, r in rows.items()} == want, {k: r.details for k, r in rows.items()}
    assert {k: r.flags for k, r in rows.items() if r.flags} == {}
    for row in rows.values():            # a timing note names no method the student did not use
        for note in row.notes:
            assert not re.search(r"finite difference|complex|dual|estimat", note), note
    table = reports.table(graded, notes, similar)
    assert "! flagged for the instructor" not in table, table


SPECIAL_CASED = """
if grad.size > 10000:                     # the large input the backward is timed on
    return np.zeros_like(grad), np.zeros(grad.shape[-1]), np.zeros(grad.shape[-1])
axes = tuple(range(grad.ndim - 1))
g = grad * gamma
dx = r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
return dx, (grad * x_hat).sum(axis=axes), grad.sum(axis=axes)
"""


def test_the_large_input_is_checked_too(tmp_path, checkout_env):
    nb = plant(nbformat.read(STUDENT_BUILD, as_version=4), {"04.1": SPECIAL_CASED})
    path = submit(tmp_path, "mallory", nb)
    result = grader.grade_exercise(path, "mallory/04_layernorm.ipynb", "04.1", [None, SEED], timeout=120)
    assert result["status"] == "FAILED", result
    assert "on the large input" in result["details"] and "is wrong there" in result["details"], result["details"]

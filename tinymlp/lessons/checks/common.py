"""What every lesson's checks share: comparing with a reference, the exactness of a gradient,
gradchecks whose reproduce line runs in the notebook, and NumPy references used by several lessons.

Every check compares the answer with a reference written in plain NumPy (never with the answer
itself, never with the library op the exercise asks for) and, for a backward pass, runs
``tinymlp.gradcheck`` on it in float64 with a random upstream gradient, then compares its
gradients with the exact ones: a gradient estimated numerically agrees with them to about 1e-10,
a derived formula to about 1e-15 (``exact``). The inputs are chosen so that the usual slips show
(non-square weights, gains that are not 1, a batch larger than one), and each check draws them
from its ``case``: the public case (the exercise's seed, what a notebook runs) or a hidden one
(the grader's seed and other shapes). An answer gets copies of the inputs, and every reference
is computed before the answer runs, so that an answer cannot change what it is compared with.
"""

from __future__ import annotations

import math

import numpy as np

from ... import GradcheckError, gradcheck, tensor
from ..registry import Case, Wrong

__all__ = ["EXACT", "Captured", "array_of", "close", "exact", "gelu", "gelu_grad", "grads", "integer",
           "kind_of", "layer_norm", "normalize", "normalize_grad", "rearranged", "rows", "run_gradcheck", "softmax",
           "t64", "wrong_term"]

EXACT = 2e-14
"""Largest relative error (norm of the difference / norm of the exact gradient) allowed for a
gradient derived by hand. Measured over 20 hidden cases: the worked answers agree with the
references here to 2e-16 or better, rewritten forms of them (1 - tanh^2 or 1/cosh^2, s(1 + x(1 - s))
or s + xs(1 - s)) to 4e-16; central differences reach 1.4e-11 at their best step and 1e-10 at the
usual h = 1e-6, Richardson's 4-point difference 1e-13 to 2e-13 at its best step, the 6-point one
2e-14 to 5e-14. The 8-point one reaches 7e-15: on an elementwise op, where one vectorised
difference gives the whole derivative at the cost of a few forwards, the grader's flags for a
finite-difference step are what remains (``scan.py``); elsewhere its cost fails it (``cost.py``)."""


def t64(a, grad=True):
    """A float64 tensor of ``a`` (requiring grad unless ``grad=False``)."""
    return tensor(np.asarray(a, dtype=np.float64), requires_grad=grad, dtype="float64")


def kind_of(value) -> str:
    """The type name of an answer's value (for a value that stayed in the answer's process, its type there)."""
    return getattr(value, "type_name", None) or type(value).__name__


def array_of(got, name):
    """The answer's value as a float64 array (a Tensor, an array, a number)."""
    if hasattr(got, "numpy") and callable(got.numpy):
        got = got.numpy()
    if hasattr(got, "type_name"):
        raise Wrong(f"{name}: expected numbers, got a {kind_of(got)}")
    try:
        return np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise Wrong(f"{name}: expected numbers, got a {kind_of(got)}") from err


def close(name, got, want, rtol=1e-6, atol=1e-8, notes=None):
    """Raise ``Wrong`` unless ``got`` is ``want`` (up to rtol, atol): saying so when ``got`` is a
    transpose, a reversal or a sign flip of ``want`` (``rearranged``; ``notes`` maps a word of that
    description, "transpose", "reversed", "sign", to what it means in the exercise), else naming
    the largest difference."""
    got, want = array_of(got, name), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Wrong(f"{name}: shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        how = rearranged(got, want, rtol, atol)
        if how is not None:
            meaning = [text for word, text in (notes or {}).items() if word in how]
            raise Wrong(f"{name}: differs from the reference: yours is {how}" + "".join(f"; {m}" for m in meaning[:1]))
        diff = np.abs(got - want)
        diff = np.where(np.isnan(diff), np.inf, diff)
        i = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise Wrong(f"{name}: differs from the reference; largest difference {diff[i]:.3g} at index "
                    f"{tuple(int(k) for k in i)} (yours {got[i]:.6g}, expected {want[i]:.6g})")


def rearranged(got, want, rtol=1e-6, atol=1e-8):
    """How ``got`` is ``want`` rearranged, when it is, in words; else None.

    Tried in order: the transpose (the last two axes swapped), a reversal along one axis or all,
    the opposite sign (of everything, or of the transpose or a reversal), and the right values
    with the wrong sign on some entries only (which ones, when they are few or all on one side
    of the diagonal)."""
    if got.shape != want.shape or got.size < 2 or not np.isfinite(got).all():
        return None
    if np.allclose(got, want, rtol=rtol, atol=atol):
        return None

    def same(a):
        return a.shape == got.shape and np.allclose(got, a, rtol=rtol, atol=atol)

    if np.allclose(want, 0, atol=atol):
        return None
    moves = []
    if want.ndim >= 2 and want.shape[-1] == want.shape[-2]:
        axes = "" if want.ndim == 2 else " (its last two axes swapped)"
        moves.append((np.swapaxes(want, -1, -2), f"the transpose of the expected{axes}: yours[i, j] = expected[j, i]"))
    for axis in range(want.ndim):
        if want.shape[axis] > 1:
            if want.ndim == 1:
                n = want.shape[0]
                text = f"the expected reversed: yours[k] = expected[{n - 1} - k] (the last entry first)"
            else:
                text = f"the expected reversed along axis {axis} (its last index first)"
            moves.append((np.flip(want, axis=axis), text))
    if want.ndim >= 2:
        moves.append((np.flip(want), "the expected reversed along every axis"))
    for moved, text in moves:
        if not np.allclose(moved, want, rtol=rtol, atol=atol) and same(moved):
            return f"exactly {text}"
    if same(-want):
        return "exactly the expected with the opposite sign (every entry negated)"
    for moved, text in moves:
        if not np.allclose(moved, want, rtol=rtol, atol=atol) and same(-moved):
            return f"exactly minus {text}"
    if np.allclose(np.abs(got), np.abs(want), rtol=rtol, atol=atol):
        flipped = ~np.isclose(got, want, rtol=rtol, atol=atol)
        where = [tuple(int(i) for i in k) for k in np.argwhere(flipped)]
        listed = ", ".join(str(k[0]) if len(k) == 1 else str(k) for k in where[:6]) + (" ..." if len(where) > 6 else "")
        side = ""
        if want.ndim == 2:
            i, j = np.nonzero(flipped)
            if (i < j).all():
                side = " (all above the diagonal)"
            elif (i > j).all():
                side = " (all below the diagonal)"
        return (f"the expected with the wrong sign on {len(where)} of its {got.size} entries{side}, the others "
                f"right: at {listed}")
    return None


def exact(name, got, want, notes=None):
    """The answer's gradient must be the exact one, not a numerical estimate of it."""
    got, want = array_of(got, name), np.asarray(want, dtype=np.float64)
    close(name, got, want, rtol=1e-4, atol=1e-6, notes=notes)  # a plain error is said plainly first
    scale = np.linalg.norm(want)
    err = float(np.linalg.norm(got - want) / (scale if scale > 0 else 1.0))
    if err > EXACT:
        raise Wrong(f"{name} agrees with the exact gradient only to {err:.1e} (relative): a formula derived by "
                    "hand agrees to about 1e-16, a finite difference to 1e-11 at best (refined by Richardson's "
                    "extrapolation, 1e-14), so this gradient is estimated numerically; derive it and compute it "
                    "from the formula")


def integer(name, got):
    """An integer answer, refusing objects that only pretend to compare equal."""
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise Wrong(f"{name} returned a {kind_of(got)}; return an int")
    return int(got)


def grads(fn, inputs, g):
    """The gradients backward gives every input for the upstream gradient g."""
    for t in inputs:
        t.grad = None
    y = fn(*inputs)
    y.backward(tensor(np.asarray(g, dtype=np.float64), dtype="float64"))
    return [t.grad for t in inputs]


class Captured(Exception):
    """Raised by ``run_gradcheck`` in capture mode: the (fn, inputs) of a check's k-th gradcheck."""

    def __init__(self, fn, inputs):
        super().__init__("captured")
        self.fn, self.inputs = fn, inputs


def shown_as(cls):
    """Decorator: a check's wrapper around the student's Function named after it (``SwishFunction.apply``),
    so that gradcheck's report names what the student wrote, not a function of the checks."""
    def named(fn):
        fn.__name__ = fn.__qualname__ = f"{cls.__name__}.apply"
        return fn
    return named


def run_gradcheck(fn, inputs, case: Case, explain=None):
    """tinymlp.gradcheck in float64; a failing report's reproduce line runs in the notebook.

    ``explain(report)``, called on a failing report, may fill in what the check knows better than
    gradcheck (``wrong_term``: which term of the exercise's derivation is off)."""
    k = case.gradchecks
    case.gradchecks += 1
    if case.capture == k:
        raise Captured(fn, inputs)
    if hasattr(fn, "__code__"):
        fn.__qualname__ = fn.__name__
    try:
        return gradcheck(fn, inputs)
    except GradcheckError as err:
        if explain is not None:
            try:
                explain(err.report)
            except Exception:  # noqa: BLE001 (the answer failed again: the report says enough)
                pass
        if case.call:
            extra = f", k={k}" if k else ""
            # the import makes the line run in a notebook that only imported ``check``
            err.report.settings.call = (f"import tinymlp.lessons; "
                                        f"tinymlp.gradcheck(*tinymlp.lessons.case({case.call}{extra}))")
        err.args = (err.report.summary(),)
        raise


def wrong_term(report, name, got, want, terms, of="the derivative", constants=None):
    """Name the term of the derivation that the answer's gradient has wrong, when only one is.

    ``got`` and ``want`` are the answer's and the exact gradient of ``name`` for one upstream
    gradient; ``terms`` lists (text, array) such that the arrays of the first terms add up to
    ``want`` (later entries may split a term into its parts). When ``got - want`` is c times one
    term and nothing else (to 1e-6), the answer has that term times 1 + c: missing (0), of the
    wrong sign (-1), twice (a factor 1/2 lost) or half, or off by a named constant (``constants``:
    {"c0 = sqrt(2/pi)": value}). Sets the report's ``likely`` line for ``name``; True if it did."""
    result = report.per_tensor.get(name)
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    err = got - want
    size = np.linalg.norm(err)
    if result is None or result.verdict != "FAIL" or got.shape != want.shape or not size or not np.isfinite(size):
        return False
    for text, term in terms:
        term = np.broadcast_to(np.asarray(term, dtype=np.float64), err.shape)
        tt = float((term * term).sum())
        if tt == 0:
            continue
        c = float((err * term).sum() / tt)
        if np.linalg.norm(err - c * term) > 1e-6 * size:
            continue
        f = 1 + c
        named = [(k, v) for k, v in (constants or {}).items() if v not in (0, 1)]
        if abs(f) < 1e-6:
            what = "is missing from your backward"
        elif abs(f + 1) < 1e-6:
            what = "has the wrong sign in your backward"
        elif abs(f - 2) < 1e-6:
            what = "is twice what it should be in your backward: a factor 1/2 missing from it"
        elif abs(f - 0.5) < 1e-6:
            what = "is half what it should be in your backward: a factor 1/2 too many in it"
        elif any(abs(f * v - 1) < 1e-6 for _, v in named):
            what = f"lacks the factor {next(k for k, v in named if abs(f * v - 1) < 1e-6)} in your backward"
        elif any(abs(f - v) < 1e-6 for _, v in named):
            what = f"has the factor {next(k for k, v in named if abs(f - v) < 1e-6)} once too often in your backward"
        else:
            what = f"is {f:.4g} times what it should be in your backward"
        result.hint_kind = "wrong_formula"
        result.pattern = (result.pattern + "; " if result.pattern else "") + (
            f"backward's error is {c:.4g} x the term {text} of {of}, exactly")
        result.hint = f"the term {text} of {of} {what}; every other term is right"
        return True
    return False


# ------------------------------------------------------------------------------ NumPy references
def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


C0, C1 = math.sqrt(2 / math.pi), 0.044715


def gelu(x):
    return 0.5 * x * (1 + np.tanh(C0 * (x + C1 * x**3)))


def gelu_grad(x):
    t = np.tanh(C0 * (x + C1 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C0 * (1 + 3 * C1 * x * x)


def normalize(x, eps):
    """(x_hat, r): x normalised over the last axis, and 1 / its standard deviation."""
    mu = x.mean(axis=-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return (x - mu) * r, r


def layer_norm(x, gamma, beta, eps):
    return gamma * normalize(x, eps)[0] + beta


def normalize_grad(g, x_hat, r):
    """dL/dx of x_hat = normalize(x) for dL/dx_hat = g (over the last axis)."""
    return r * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))


def rows(a):
    """``a`` with every axis but the last flattened into one."""
    return a.reshape(-1, a.shape[-1])

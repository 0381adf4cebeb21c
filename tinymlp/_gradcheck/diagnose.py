"""Why a gradient is wrong: the patterns behind the "pattern" and "likely" lines of a report.

Once ``gradcheck`` has compared every element of a tensor, ``diagnose`` looks at what the
failing elements have in common, most specific clue first:

* NaN/inf in backward, or no gradient at all (None or zeros);
* backward(2g) != 2 backward(g): the incoming gradient is ignored;
* a constant ratio analytical / numerical: -1 (sign), 2 or 1/2, a dimension size n or
  1/n (mean vs sum), sqrt(n) (the 1/sqrt(d) of attention);
* the failures sit at one boundary index (off by one) or in one part of an axis (a branch);
* the analytical gradient is the numerical one transposed.

``explain_engine_error`` does the same for a gradient the engine rejected outright (wrong
shape or dtype: a transpose, a broadcast input whose gradient was not summed).
A ``hint_kind`` names each diagnosis (``HINT_KINDS``) so that tests can assert on it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .backend import to_device
from .gradcheck_report import FAIL


def diagnose(run, c, result, checks, missing, linear):
    """Fill in pattern / hint / hint_kind: what the bad elements have in common, and why."""
    if result.verdict == "NONDIFF":
        _explain_kink(run, c, result)
    elif result.verdict == "INCONCLUSIVE":
        result.pattern = f"{result.n_unverified} of {result.checked} checks agree only within the noise floor"
        result.hint = (f"nothing was certified for {c.name!r}: its gradients are small next to the noise "
                       f"floor {run.settings.atol_eff:.1e}; scale the upstream gradient or the inputs, "
                       f"or check that {c.name!r} affects the output at all")
    elif result.verdict == "FAIL":
        _explain_failure(run, c, result, checks, missing, linear)
    elif not np.any(result.analytical):
        result.pattern = f"every gradient of {c.name!r} is exactly 0 (the check is trivially true)"


def _explain_kink(run, c, result):
    ch = result.worst[0]
    value = np.asarray(to_device(c.tensor.data, "cpu"))[ch.index]
    result.hint_kind = "kink"
    result.pattern = f"{result.n_nondiff} element(s) have different left and right slopes"
    result.hint = (f"{ch.where(c.name)} = {value:.2g} lies within eps={run.settings.eps:.0e} of a "
                   f"non-differentiable point (ReLU/abs/max/clip): the numerical {ch.numerical:.3g} "
                   "averages the two one-sided slopes; this is not a backward bug. "
                   "Draw inputs away from the kink")


def _explain_failure(run, c, result, checks, missing, linear):
    """The hints, most specific first: NaN, no gradient, ignored upstream, location, ratio, transpose."""
    name, a = c.name, result.analytical
    fails = [ch for ch in checks if ch.status == FAIL]
    elements = [ch for ch in fails if not isinstance(ch.index, str)]
    where = ", ".join(ch.where(name) for ch in elements[:3]) + (" ..." if len(elements) > 3 else "")
    result.pattern = f"{len(fails)} of {result.checked} checks fail" + (f": {where}" if elements else "")
    if not fails:
        result.pattern = "every check agrees with the numerical gradient, but backward(2g) != 2 backward(g)"

    if not np.isfinite(a).all():
        bad = [tuple(int(i) for i in idx) for idx in np.argwhere(~np.isfinite(a))[:3]]
        result.hint_kind = "nan"
        result.hint = (f"NaN/inf in backward at {name}{bad} "
                       "(0/0 in softmax, sqrt or log at 0, a division by a zero norm)")
    elif not all(math.isfinite(ch.numerical) for ch in fails):
        result.hint = ("the numerical estimate is not finite: forward is NaN/inf near the inputs, "
                       "or the step is lost to rounding")
    elif fails and not elements:
        result.hint = ("the sampled elements agree but random directions do not: the error sits in elements "
                       "that were not sampled; rerun with mode='full' (or a larger n_coords) to find them")
    elif missing or not np.any(a):
        result.hint_kind = "no_gradient"
        result.hint = (f"no gradient reached {name!r}: backward returns None/zeros for it, "
                       "or forward left the graph (used .data / np.asarray / a new tensor)")
    elif not linear:
        result.hint_kind = "upstream_ignored"
        result.hint = ("backward ignores or does not scale with its incoming gradient: "
                       "backward(2g) != 2 backward(g); multiply the local derivative by grad")
    else:
        # A ratio shared by several elements is the stronger clue; one element always has "a ratio".
        ratio = _common_ratio(run, elements)
        location = _location(checks, c.tensor.shape, name)
        if ratio is not None and (ratio[2] >= 2 or location is None) and _ratio_hint(run, result, *ratio):
            if location is not None:
                result.pattern += f"; {location[1]}"
        elif location is not None:
            result.hint_kind, result.pattern, result.hint = location
            if ratio is not None:
                result.pattern += f"; there analytical / numerical = {ratio[0]:.4g}"
        elif _transpose_hint(run, result):
            pass
        elif all(ch.numerical == 0 for ch in elements):
            result.hint = f"the output does not depend on {name!r} numerically, yet backward gives it one"


# ------------------------------------------------------------------------------- the clues


def dimension_sizes(checked, outputs):
    """Axis sizes (and products of adjacent axes) of everything involved, for mean-vs-sum hints."""
    sizes = {}
    shapes = [(c.name, c.tensor.shape) for c in checked]
    shapes += [(f"output {k}", y.shape) for k, y in enumerate(outputs)]
    for name, shape in shapes:
        for lo, hi in itertools.combinations(range(len(shape) + 1), 2):
            n = math.prod(shape[lo:hi])
            axes = f"axis {lo}" if hi == lo + 1 else f"axes {lo}..{hi - 1}"
            if n > 2:
                sizes.setdefault(n, f"the size of {axes} of {name}")
    return sizes


def _common_ratio(run, elements):
    """(r, spread, count) when a / n is the same nonzero r on every failing element, else None."""
    floor = run.settings.atol_eff
    ratios = np.array([ch.analytical / ch.numerical for ch in elements if abs(ch.numerical) > floor])
    if len(ratios) == 0:
        return None
    r = float(np.median(ratios))
    spread = float(np.max(np.abs(ratios - r)))
    if r == 0 or spread > 1e-3 * abs(r):
        return None
    return r, spread, len(ratios)


def _ratio_hint(run, result, r, spread, count):
    """A constant ratio a / n: sign, x2, /2, mean vs sum, sqrt(d), or some other factor.

    One failing element always has "a constant ratio": then only the named values count.
    """
    result.pattern = f"analytical / numerical = {r:.4g} (spread {spread:.0e}) on all {count} failing elements"
    candidates = [
        (-1.0, "sign", "sign error: backward returns the negative gradient (a minus sign dropped or added)"),
        (2.0, "factor2", "gradient counted twice: check `+=` vs `=`, or a term added twice in backward"),
        (0.5, "half", "gradient is half the true one: a missing factor 2 (d(x^2)/dx = 2x), "
                      "or a term counted once instead of twice"),
    ]
    for n, where in run.sizes.items():
        candidates.append((float(n), "mean_vs_sum",
                           f"analytical = {n} x numerical, {n} = {where}: forward takes a mean but backward "
                           f"does not divide by {n} (or a sum is treated as a mean twice)"))
        candidates.append((1.0 / n, "mean_vs_sum",
                           f"analytical = numerical / {n}, {n} = {where}: backward divides by {n} but "
                           "forward takes a sum (mean vs sum mismatch)"))
    for n, where in run.sizes.items():  # after mean-vs-sum: sqrt(16) = 4 may be a size itself
        candidates.append((math.sqrt(n), "scale_sqrt_d",
                           f"analytical = numerical x sqrt({n}), {n} = {where}: backward misses the "
                           "scale 1/sqrt(d) that forward applies (attention scores)"))
        candidates.append((1 / math.sqrt(n), "scale_sqrt_d",
                           f"analytical = numerical / sqrt({n}), {n} = {where}: backward applies a scale "
                           "1/sqrt(d) that forward does not (or applies it twice)"))
    for value, kind, hint in candidates:
        if abs(r - value) <= 1e-3 * abs(value):
            result.hint_kind, result.hint = kind, hint
            return True
    if count < 2:
        return False
    result.hint = f"backward is off by a constant factor {r:.4g}: a scale missing or applied twice"
    return True


def _transpose_hint(run, result):
    """Square trailing axes and a == n transposed (needs every element checked)."""
    a, n = result.analytical, result.numerical
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or np.isnan(n).any():
        return False
    nt = np.swapaxes(n, -1, -2)
    if np.allclose(a, nt, rtol=10 * run.settings.rtol, atol=run.settings.atol_eff):
        result.hint_kind = "transpose"
        result.pattern = "the analytical gradient equals the numerical one transposed (last two axes)"
        result.hint = "transposed gradient: W vs W.T (e.g. g.T @ x instead of x.T @ g)"
        return True
    return False


def _location(checks, shape, name):
    """(hint_kind, pattern, hint) when the failures sit at one boundary index or in part of an
    axis (one branch), else None."""
    elements = [ch for ch in checks if not isinstance(ch.index, str)]
    if not elements or not shape:
        return None
    pos = np.array([ch.index for ch in elements])
    fail = np.array([ch.status == FAIL for ch in elements])
    if fail.all() or not fail.any():
        return None
    boundary, partial = [], []
    for axis, size in enumerate(shape):
        if size < 3:  # in an axis of 2 every index is a boundary
            continue
        failing = np.unique(pos[fail, axis])
        if len(failing) == len(np.unique(pos[:, axis])):
            continue  # failures along the whole axis
        if len(failing) == 1 and failing[0] in (0, size - 1):
            boundary.append((axis, int(failing[0])))
        elif len(failing) >= 2 and failing[-1] - failing[0] + 1 == len(failing):
            inside = (pos[:, axis] >= failing[0]) & (pos[:, axis] <= failing[-1])
            if fail[inside].mean() >= 0.5:
                partial.append((axis, int(failing[0]), int(failing[-1]) + 1, size))
    if boundary:
        which = ", ".join(f"index {i} of axis {ax}" for ax, i in boundary)
        return ("boundary", f"only elements at {which} fail",
                "boundary/off-by-one error: only the first or last position fails "
                "(first token, causal-mask edge, padding, a loop range that stops one short)")
    if partial:
        ax, lo, hi, size = partial[-1]
        return ("partial_branch", f"only [{lo}:{hi}] of axis {ax} (size {size}) of {name!r} fail",
                "one branch is missing from backward: only part of the axis is wrong "
                "(a split/gate half treated as a constant, a dropped term of a sum)")
    return None


# ------------------------------------------------------------------------------- engine errors


def explain_engine_error(result, parsed):
    """The engine rejected the gradient backward produced for this tensor (shape or dtype)."""
    result.verdict, result.error = "FAIL", parsed["text"]
    result.pattern = f"backward raised: {parsed['text']}"
    if parsed["kind"] == "dtype":
        result.hint = (f"{parsed['fn']}.backward returns a {parsed['got']} gradient for a {parsed['want']} "
                       "input: a constant or astype of another dtype in backward; keep the input's dtype")
        return
    got, want = parsed["got"], parsed["want"]
    axes = _broadcast_axes(got, want)
    if len(got) == len(want) >= 2 and got == want[:-2] + (want[-1], want[-2]):
        result.hint_kind = "transpose"
        result.hint = (f"{parsed['fn']}.backward returned the transpose {got} of the expected {want}: "
                       "a weight gradient like g.T @ x instead of x.T @ g (or W vs W.T)")
    elif axes is not None:
        result.hint_kind = "broadcast_not_summed"
        keep = [a for a in axes if a >= len(got) - len(want)]
        result.hint = (f"{parsed['fn']}.backward returned shape {got} for an input of shape {want}: the "
                       f"input was broadcast, so sum the gradient over axes {axes}"
                       + (f" (keepdims=True for the stretched size-1 axes {keep})" if keep else "")
                       + "; autograd.unbroadcast(grad, shape) does exactly this")
    else:
        result.hint_kind = "wrong_shape"
        result.hint = f"{parsed['fn']}.backward returned a gradient of shape {got} for an input of {want}"


def _broadcast_axes(got, want):
    """The axes to sum so that a gradient of shape ``got`` becomes ``want`` (None if impossible)."""
    extra = len(got) - len(want)
    if extra < 0:
        return None
    axes = list(range(extra))
    for k, (g, w) in enumerate(zip(got[extra:], want)):
        if g != w:
            if w != 1:
                return None
            axes.append(extra + k)
    return tuple(axes) if axes else None

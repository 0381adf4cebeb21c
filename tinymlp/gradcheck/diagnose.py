"""Why a gradient is wrong: the patterns behind the "pattern" and "likely" lines of a report.

Once ``gradcheck`` has compared every element of a tensor, ``diagnose`` looks at what the
failing elements have in common, most specific clue first:

* NaN/inf in backward, or no gradient at all (None or zeros);
* backward(2g) != 2 backward(g): the incoming gradient is ignored;
* a constant ratio analytical / numerical: -1 (sign), 2 or 1/2, a dimension size n or
  1/n (mean vs sum), sqrt(n) (the 1/sqrt(d) of attention);
* the failures sit at one boundary index (off by one) or in one part of an axis (a branch);
* only some elements are off, by one factor: which ones (where the input is positive, which
  rows), and that the others are right;
* the analytical gradient is the numerical one transposed, or another tensor's (swapped);
* a factor equal to an input's value, per element or per row; failing rows that are the ids an
  integer input repeats; a backward right on each row alone but wrong in the batch (``hints.py``);
* every element fails without a simple pattern: what is still known (signs, correlation, the
  range of a / n, an error proportional to an input times g, an error shaped by a reduction
  over each row or over the wrong axis: ``rows.py``).

``rejected.py`` does the same for a gradient the engine rejected outright (wrong shape or
dtype: a transpose, a broadcast input whose gradient was not summed).
A ``hint_kind`` names each diagnosis (``HINT_KINDS``) so that tests can assert on it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..backend import to_device
from . import hints, ties
from .broadcast import summed_over
from .precision import nan_cause
from .report import FAIL, PASS
from .rows import row_hint, wrong_axis


def diagnose(run, c, result, checks, missing, linear):
    """Fill in pattern / hint / hint_kind: what the bad elements have in common, and why."""
    if not linear and result.verdict != "FAIL":  # backward(2g) != 2 backward(g) is a failure in itself
        result.verdict = "FAIL"
        result.worst = [ch for ch in result.worst if ch.status == FAIL]
    if result.hint_kind in ("low_precision", "precision_loss", "overflow"):  # lost_precision or precision.py said it
        return
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
    tied = sum(len(t.positions) for t in result.ties)
    if result.ties:
        result.pattern += "; " + ties.describe(c, result.ties)[1]
    if tied == result.n_nondiff and all(t.status == PASS for t in result.ties):
        result.hint = ("every element at a kink belongs to a tie (a max over equal values, such as zeros after a "
                       "ReLU): alone each averages two one-sided slopes, and moved together the tied elements are "
                       "smooth and agree with backward, so the ties are handled consistently; this is not a "
                       "backward bug")


def _explain_failure(run, c, result, checks, missing, linear):
    """The hints, most specific first: NaN, no gradient, ignored upstream, location, ratio, transpose."""
    name, a = c.name, result.analytical
    fails = [ch for ch in checks if ch.status == FAIL]
    elements = [ch for ch in fails if not isinstance(ch.index, str)]
    n_elements = len(checks) - result.n_directions
    where = ", ".join(ch.where(name) for ch in elements[:3]) + (" ..." if len(elements) > 3 else "")
    result.pattern = f"{len(elements)} of {n_elements} elements fail" + (f": {where}" if elements else "")
    if result.n_directions:
        result.pattern += f"; {len(fails) - len(elements)} of {result.n_directions} directions fail"
    if not fails:
        result.pattern = "every check agrees with the numerical gradient, but backward(2g) != 2 backward(g)"

    if not np.isfinite(a).all():
        bad = [tuple(int(i) for i in idx) for idx in np.argwhere(~np.isfinite(a))[:3]]
        overflow = nan_cause(run, a)
        result.hint_kind = "nan" if overflow is None else "overflow"
        result.hint = (f"NaN/inf in backward at {name}{bad} " + (
            "(0/0 in softmax, sqrt or log at 0, a division by a zero norm)" if overflow is None else
            f"from an overflow, not 0/0: {overflow}"))
    elif any(t.status == FAIL for t in result.ties):
        result.hint_kind = "ties"
        result.pattern, result.hint = ties.describe(c, result.ties)
        result.trust = ("each tied group moved together has equal one-sided slopes: the numerical derivative along "
                        "it is reliable, so backward is wrong there (one element alone sits at a kink)")
    elif name in run.changed_in_place:
        result.hint_kind = "changed_in_place"
        result.hint = run.changed_in_place[name][0]
    elif not all(math.isfinite(ch.numerical) for ch in fails):
        result.hint = ("the numerical estimate is not finite: forward is NaN/inf near the inputs, "
                       "or the step is lost to rounding")
    elif fails and not elements:
        result.hint = (f"the {n_elements} sampled elements agree but directions do not: the error is spread "
                       "over elements that were not sampled (each one off by too little to find alone); rerun "
                       "with mode='full' to list them")
    elif missing or not np.any(a):
        result.hint_kind = "no_gradient"
        result.hint = (f"no gradient reached {name!r}: backward returns None/zeros for it, "
                       "or forward left the graph (used .data / np.asarray / a new tensor)")
    elif not linear:
        result.hint_kind = "upstream_ignored"
        result.hint = ("backward ignores or does not scale with its incoming gradient: "
                       "backward(2g) != 2 backward(g); multiply the local derivative by grad")
    elif _ignored_by_forward(run, c, result, elements):
        pass
    else:
        # A ratio shared by several elements is the stronger clue; one element always has "a ratio".
        ratio = _common_ratio(run, elements)
        location = _location(checks, c.tensor.shape, name)
        subset = _which_fail(c, checks)
        if hints.repeated_index(run, c, result, checks) or summed_over(run, c, result):
            pass
        elif ratio is not None and (ratio[2] >= 2 or location is None) and _ratio_hint(run, c, result, elements,
                                                                                        *ratio):
            if subset is not None:
                _only_some(result, ratio[0], subset)
            elif location is not None:
                result.pattern += f"; {location[1]}"
        elif location is not None:
            result.hint_kind, result.pattern, result.hint = location
            if ratio is not None:
                result.pattern += f"; there analytical / numerical = {ratio[0]:.4g}"
            if subset is not None:
                result.pattern += f"; the other {subset[2] - subset[1]} elements are right"
        elif hints.input_factor(run, c, result, elements) or hints.row_factor(run, c, result, elements):
            pass
        elif _transpose_hint(run, result) or _swapped_halves(run, c, result):
            pass
        elif len(elements) == n_elements:
            _still_known(run, c, result, elements)
    if elements and len(elements) <= 3 and elements[0].where(name) not in result.pattern:
        result.pattern += f" ({where})"
    if result.hint is None and len(elements) == 1 and n_elements > 1:
        result.hint = (f"only {where} is wrong of the {n_elements} elements checked: backward treats that "
                       "position apart (an index written by hand, a loop that stops one short)")
    if result.n_directions and " directions fail" not in result.pattern:
        result.pattern += f"; {len(fails) - len(elements)} of {result.n_directions} directions fail"


def _ignored_by_forward(run, c, result, elements):
    """Failing elements whose numerical gradient is exactly 0 because forward ignores them (moving
    one leaves the loss bit for bit unchanged) while backward gives them one: a mask missing from
    backward, said even when other elements fail too (what the missing mask does where forward
    does use the values)."""
    zeros = [ch for ch in elements if ch.numerical == 0 and ch.analytical != 0]
    if not zeros:
        return False
    from .checks import ignored_by_forward  # the probe moves inputs: it lives with the other checks

    probe = zeros[:16]
    index = np.array([np.ravel_multi_index(ch.index, c.tensor.shape) if ch.index else 0 for ch in probe])
    if not ignored_by_forward(run, c, index, to_zero=True).all():
        return False  # not a mask: forward is flat there only nearby (saturated)
    where = ", ".join(ch.where(c.name) for ch in zeros[:3]) + (" ..." if len(zeros) > 3 else "")
    result.hint_kind = "ignored_by_forward"
    result.pattern = (f"{len(zeros)} of {len(elements)} failing elements ({where}) have a numerical gradient "
                      f"of exactly 0: moving one (by half its size) leaves the loss exactly unchanged, so forward "
                      "ignores them")
    result.hint = ("backward gives a gradient where forward has none (a mask or tril missing?): apply to the "
                   "gradient the same mask that forward applies to its input")
    if len(zeros) < len(elements):
        others = len(elements) - len(zeros)
        result.pattern += f"; the other {others} failing elements are used by forward"
        result.hint += (f"; the other {others} failing elements, which forward uses, are wrong too: the same missing "
                        "mask may cause that (masked positions recomputed in backward take a share of every row, as "
                        "attention probabilities recomputed without the causal mask do); fix the mask first")
    return True


def _swapped_halves(run, c, result):
    """a equals n with the two halves of one axis exchanged (a split whose gradients are concatenated
    in the wrong order)."""
    a, n = result.analytical, result.numerical
    if a is None or n is None or np.isnan(n).any():
        return False
    tol = dict(rtol=10 * run.settings.rtol, atol=run.settings.atol_eff)
    for axis, size in enumerate(a.shape):
        if size >= 2 and size % 2 == 0 and np.allclose(a, np.roll(n, size // 2, axis=axis), **tol):
            result.hint_kind = "swapped_halves"
            result.pattern = (f"the analytical gradient equals the numerical one with the halves [:{size // 2}] "
                              f"and [{size // 2}:] of axis {axis} exchanged")
            result.hint = (f"the two halves of {c.name!r} along axis {axis} are swapped: backward returns [gradient "
                           "of the second half, gradient of the first half]; concatenate the gradients in "
                           "forward's split order")
            return True
    return False


def _which_fail(c, checks):
    """(text, n_fail, n_elements) when some elements fail and all the others are certified right:
    the failing ones described by the sign of the tensor's value or by rows / columns; else None."""
    elements = [ch for ch in checks if not isinstance(ch.index, str)]
    fail = np.array([ch.status == FAIL for ch in elements])
    right = np.array([ch.status == PASS for ch in elements])
    if not fail.any() or fail.all() or not (fail | right).all():
        return None
    counts = (int(fail.sum()), len(elements))
    shape = c.tensor.shape
    pos = np.array([ch.index for ch in elements]).reshape(len(elements), len(shape))
    values = np.asarray(to_device(c.tensor.data, "cpu"))[tuple(pos.T)] if shape else \
        np.full(len(elements), float(to_device(c.tensor.data, "cpu")))
    name = c.name
    tests = ((values > 0, f"{name} > 0"), (values < 0, f"{name} < 0"), (values == 0, f"{name} == 0"))
    for mask, text in tests:
        if np.array_equal(fail, mask):
            return f"exactly the elements where {text}", *counts
    for axis, size in enumerate(shape):
        failing = np.unique(pos[fail, axis])
        if len(failing) < size and np.array_equal(np.isin(pos[:, axis], failing), fail):
            label = {0: "row", 1: "column"}[axis] if len(shape) == 2 else f"index along axis {axis}"
            listed = ", ".join(map(str, failing[:6])) + (" ..." if len(failing) > 6 else "")
            plural = "s" if len(failing) > 1 and len(shape) == 2 else ""
            return f"exactly {label}{plural} {listed} of {name!r}", *counts
    for mask, text in tests:
        if mask.any() and not (fail & ~mask).any():
            return f"all where {text} ({counts[0]} of the {int(mask.sum())} elements where {text})", *counts
    return f"{counts[0]} of {counts[1]} elements", *counts


def _only_some(result, r, subset):
    """A common ratio on some elements only: say which ones, and that the others are right."""
    text, n_fail, n = subset
    result.pattern += f"; the other {n - n_fail} of {n} elements are right; the failing ones are {text}"
    if result.hint_kind is None:
        result.hint_kind = "partial_scale"
        cause = ("a factor applied in one branch of a piecewise formula or a mask (np.where, x > 0)"
                 if "where" in text else "a factor applied to some positions only (an index range, a mask, "
                                         "a loop that treats the first or last position apart)")
        result.hint = (f"only {n_fail} of {n} elements are off by the factor {r:.4g} ({text}), the others "
                       f"are right: {cause}, not a scale missing everywhere")
    else:
        result.hint += f"; but only for {n_fail} of {n} elements ({text}): look at the branch that computes them"


def _still_known(run, c, result, elements):
    """Every element fails and no simple pattern fits: say what is still known."""
    a = np.array([ch.analytical for ch in elements])
    n = np.array([ch.numerical for ch in elements])
    facts = [f"signs agree on {int(np.sum(np.sign(a) == np.sign(n)))} of {len(a)} elements"]
    corr = None
    if len(a) >= 3 and a.std() > 0 and n.std() > 0:
        corr = float(np.corrcoef(a, n)[0, 1])
        facts.append(f"correlation of analytical and numerical {corr:.2f}")
    big = np.abs(n) > run.settings.atol_eff
    if big.sum() >= 2:
        ratios = a[big] / n[big]
        facts.append(f"analytical / numerical from {ratios.min():.3g} to {ratios.max():.3g} (no single factor)")
    result.pattern = f"all {len(a)} elements fail; " + "; ".join(facts)
    result.hint_kind = "wrong_formula"
    if hints.batch_mixed(run, c, result):
        return
    exact, one_sign = _error_against_inputs(run, c, elements, a - n)
    if exact is not None:
        result.pattern += f"; analytical - numerical = {exact} exactly"
        result.hint = (f"the error is proportional to an input: backward has a term {exact} too many "
                       "(or with the wrong sign or factor); compare that term with the derivation")
        return
    if row_hint(run, c, result) or wrong_axis(run, c, result):
        return
    if one_sign is not None:
        label, lo, hi = one_sign
        sign = "negative" if hi < 0 else "positive"
        result.pattern += (f"; (analytical - numerical) / ({label}) is {sign} on every element "
                           f"(from {lo:.3g} to {hi:.3g})")
    if corr is not None and corr > 0.5:
        result.hint = ("the right trend but wrong values: a term of the derivative is missing or has the "
                       "wrong sign (not a scale of the whole gradient)"
                       + (f"; the error is {label} times a factor of one sign, so look for a term "
                          f"{label.split(' * ')[-1]} * (...) of the derivative that is missing or has its sign "
                          "flipped" if one_sign is not None else "")
                       + "; write out each term of d(forward)/d(input) and compare it with backward")
    elif corr is not None and corr < -0.5:
        # a - n = -(a missing term) fits as well as a flipped sign: the numbers cannot tell them apart
        result.hint = ("mostly the opposite sign, but no single factor (a sign error in the whole derivative would "
                       "give analytical / numerical = -1): a term of the derivative that outweighs the others is "
                       "missing from backward or has the wrong sign; write out each term of d(forward)/d(input) "
                       "and compare it with backward")
    else:
        two = any(o is not c and o.tensor.shape == c.tensor.shape for o in run.checked)
        result.hint = ("unrelated to the true gradient: the derivative of another variable, a wrong saved value, "
                       "a term missing that outweighs the others"
                       + (", or the gradients of two inputs returned in the wrong order" if two else ""))


def _error_against_inputs(run, c, elements, err):
    """Compare the error a - n with each input T of c's shape, and with g * T (g the upstream
    gradient, when one output has c's size): ("k x T", None) when err = k T exactly; else
    (None, ("g * T", lo, hi)) when err / (g T) has one sign on every element; else (None, None)."""
    outputs_g = [g for g in run.ev.upstream if g.size == c.size]
    g = np.asarray(to_device(outputs_g[0], "cpu")).reshape(c.tensor.shape) if len(outputs_g) == 1 else None
    pos = tuple(np.array([ch.index for ch in elements]).reshape(len(elements), -1).T)
    one_sign = None
    if len(elements) < 3:  # one or two elements fit "k x T" for any T: no evidence
        return None, None
    for other in run.checked:
        if other.tensor.shape != c.tensor.shape or not c.tensor.shape:
            continue
        values = np.asarray(to_device(other.tensor.data, "cpu"), dtype=np.float64)
        for label, v in ((other.name, values), (f"g * {other.name}", None if g is None else g * values)):
            if v is None or not np.any(v[pos]):
                continue
            v = v[pos]
            k = float(v @ err / (v @ v))
            if k != 0 and np.linalg.norm(err - k * v) <= 1e-6 * np.linalg.norm(err):
                return f"{k:.4g} x {label}", None
            usable = np.abs(v) > 1e-12 * np.abs(v).max()
            q = err[usable] / v[usable]
            if one_sign is None and len(q) >= 3 and (np.all(q > 0) or np.all(q < 0)):
                one_sign = (label, float(q.min()), float(q.max()))
    return None, one_sign


def diagnose_across(run, results):
    """What the failing tensors say together: two gradients returned swapped, or several wrong
    gradients that share one intermediate of backward (tied to a transposed weight when they are
    exactly the gradients of forward with that weight transposed)."""
    failing = [r for r in results.values() if r.verdict == "FAIL" and r.analytical is not None
               and r.numerical is not None and not np.isnan(r.numerical).any()]
    tol = dict(rtol=10 * run.settings.rtol, atol=run.settings.atol_eff)
    for i, ra in enumerate(failing):
        for rb in failing[i + 1:]:
            if ra.shape != rb.shape or not (np.allclose(ra.analytical, rb.numerical, **tol)
                                            and np.allclose(rb.analytical, ra.numerical, **tol)):
                continue
            for r, other in ((ra, rb), (rb, ra)):
                r.hint_kind = "swapped"
                r.pattern = (f"the analytical gradient of {r.name!r} equals the numerical gradient of "
                             f"{other.name!r}, and the other way round")
                r.hint = (f"backward returns the gradients of {ra.name!r} and {rb.name!r} in swapped order: "
                          "swapping them would pass; return one gradient per input, in forward's order")
    _mask_shared(results, failing)
    _tie(run, results, [r for r in failing if r.hint_kind != "swapped"])


def _mask_shared(results, failing):
    """One failing tensor shows a mask missing in backward: the others failing with it without a
    hint of their own are told that their gradients may come from the same unmasked quantity."""
    masked = [r.name for r in failing if r.hint_kind == "ignored_by_forward"]
    if not masked:
        return
    for r in failing:
        if r.hint_kind in (None, "wrong_formula", "partial_branch"):
            r.hint_kind = "shared_intermediate"
            r.hint = (f"{r.name!r} fails together with {_names(masked)}, whose report shows a mask missing in "
                      f"backward: the gradient of {r.name!r} is likely computed from the same unmasked quantity (the "
                      "probabilities or scores recomputed in backward without the mask); fix the mask, then check "
                      "again")


def _names(names):
    names = [repr(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _tie(run, results, failing):
    """Several inputs fail while others pass: their wrong gradients share an intermediate."""
    right = [r.name for r in results.values() if r.verdict == "ok"]
    if not failing or not right or len(failing) + len(right) < 3:
        return
    transposed = _transposed_weight(run, results, failing)
    together = (f"{_names([r.name for r in failing])} fail together while {_names(right)} "
                f"{'are' if len(right) > 1 else 'is'} right")
    for r in failing:
        if len(failing) > 1:
            r.pattern = f"{together}; {r.pattern}" if r.pattern else together
        if transposed is not None:
            shared = "these gradients share" if len(failing) > 1 else "this gradient goes through"
            r.hint_kind = "shared_intermediate"
            r.hint = (f"the wrong gradients ({_names([f.name for f in failing])}) are exactly what they would be "
                      f"with {transposed!r} transposed: backward uses {transposed} where it needs {transposed}.T "
                      f"(or the other way round) in the step {shared}, upstream of them all (the gradient sent "
                      f"back through {transposed}: {transposed}.T @ dY)")
        elif len(failing) > 1 and r.hint_kind in (None, "wrong_formula", "partial_branch"):
            r.hint_kind = "shared_intermediate"
            r.hint = (f"{together}: the error is in a quantity of backward that only the wrong gradients are "
                      "computed from (an intermediate gradient they share); check that step first")


def _transposed_weight(run, results, failing):
    """The name of a square checked tensor W such that, with W transposed in forward, the
    numerical gradients of the failing elements equal backward's: else None."""
    from .checks import working_snapshot  # noqa: F401 (the probes below restore bit for bit)

    squares = [c for c in run.checked if c.tensor.ndim >= 2 and c.tensor.shape[-1] == c.tensor.shape[-2] > 1
               and c.name not in {r.name for r in failing}]
    by_name = {c.name: c for c in run.checked}
    wrong = []
    for r in failing:
        bad = np.flatnonzero(~np.isclose(r.analytical, r.numerical, rtol=run.settings.rtol,
                                         atol=run.settings.atol_eff).reshape(-1))
        wrong.append((by_name[r.name], r, bad[:512]))
    for w in squares:
        data = w.tensor.data
        original = data.copy()
        try:
            data[...] = data.swapaxes(-1, -2).copy()
            L0 = run.ev.loss_host()
            ok = True
            for c, r, bad in wrong:
                n = run.ev.central_differences(c.tensor, bad, run.settings.eps, L0)[0]
                a = r.analytical.reshape(-1)[bad]
                if not np.allclose(a, n, rtol=10 * run.settings.rtol, atol=run.settings.atol_eff):
                    ok = False
                    break
        finally:
            data[...] = original
        if ok:
            return w.name
    return None


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


def _ratio_hint(run, c, result, elements, r, spread, count):
    """A constant ratio a / n: sign, x2, /2, mean vs sum, sqrt(d), an input's value, or some other factor.

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
    if hints.input_factor(run, c, result, elements):
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

"""The checks around the method: is the forward fit to be differentiated, does backward behave.

* ``check_forward``: forward is deterministic, keeps float64, leaves its inputs alone; then the
  upstream gradient is drawn and the noise floor measured;
* ``analytic``: the gradients backward produces (each tensor alone when the engine rejects one);
  ``scales_linearly``: backward(2g) == 2 backward(g) and backward(0) == 0 (``blame.py`` watches
  backward for arrays it changes in place);
* ``sample_positions`` / ``directional`` / ``blocks`` / ``locate``: what sampled mode checks on a
  large tensor (every element is in a block checked along random +-1 signs, small gradients in
  small blocks), and how a failing block is halved down to its wrong elements;
* ``stability``, ``lost_precision`` and ``ignored_by_forward``: can the numerical side be
  trusted for a failing element (an estimate that moves with eps, a forward that computes in
  float32 inside, an element that forward does not use at all; kinks and ties: ``ties.py``)?
* ``summarize``: the counts, verdict and worst elements of one tensor.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..grad_mode import enable_grad, no_grad
from ..backend import to_device
from ..contract import GradientMismatchError, MixedPrecisionError
from .blame import reference_name
from .diagnose import dimension_sizes
from .plan import close_bits, host, same_bits, working_array
from .report import FAIL, NONDIFF, UNVERIFIED, TensorResult


class Fatal(Exception):
    """A problem that makes comparing gradients meaningless; becomes a report problem."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, message


class Run:
    """The state of one gradcheck run, shared by the steps."""

    def __init__(self, plan, settings, ev, seed, *, upstream, n_coords, n_proj, topk):
        self.plan, self.settings, self.ev = plan, settings, ev
        self.upstream = upstream  # "random", "ones" or the caller's arrays
        self.checked = plan.checked
        seeds = np.random.SeedSequence(seed).spawn(len(plan.checked) + 2)
        self.seeds, self.other_seed = seeds[:-1], seeds[-1]  # other_seed: the other inputs of state.py
        self.n_coords, self.n_proj, self.topk = n_coords, n_proj, topk
        self.L0 = None
        self.sizes = {}  # dimension size -> where it comes from (for mean-vs-sum hints)
        self.problems = []  # (kind, message) about the forward as a whole
        self.working_restored = True
        self.changed_in_place = {}  # checked name -> (sentence, Function) when its gradient was changed in place


# ------------------------------------------------------------------------------- the forward


def check_forward(run, make_upstream) -> list:
    """Run forward twice and look for problems; if none, draw g and measure the noise floor.

    A modified input comes first: it also makes the two calls differ, and is then the cause.
    """
    ev, plan, settings = run.ev, run.plan, run.settings
    before = [c.tensor.data.copy() for c in run.checked]
    with no_grad():
        first = [y.data.copy() for y in ev.outputs()]
        outputs = ev.outputs()
    if not first:
        raise Fatal("no_output", "fn returned no floating-point Tensor: nothing to differentiate")
    problems = []
    changed = [c.name for c, arr in zip(run.checked, before) if not same_bits(arr, c.tensor.data)]
    changed += [name for name, arr, snapshot in plan.constants if not same_bits(arr, snapshot)]
    if changed:
        problems.append(("mutated_input",
                         f"forward modified {', '.join(map(repr, changed))} in place (an out= argument, "
                         "x[...] = or x += on an input array): write the result into a new array"))
    second = [y.data for y in outputs]
    settings.deterministic = len(first) == len(second) and all(map(close_bits, first, second))
    if not settings.deterministic:
        problems.append(("nondeterministic",
                         "two calls on the same inputs gave different outputs, because forward modified "
                         "its input (above)" if changed else
                         "forward is random or stateful: two calls on the same inputs gave different "
                         "outputs (dropout? an RNG? running statistics?): disable it, or pass "
                         "before_forward=lambda: <reseed your generator>"))
    low = [f"output {k} is {y.dtype}" for k, y in enumerate(first)
           if y.dtype.itemsize < plan.check_dtype.itemsize]
    if low:
        was = (f"gradcheck promoted the inputs to {plan.check_dtype} (they were {'/'.join(plan.promoted_from)})"
               if plan.promoted_from else f"the inputs are {plan.check_dtype}")
        problems.append(("downcast",
                         f"forward downcasts: {', '.join(low)} although {was}: a np.float32 constant, an "
                         "astype, or a float32 array created inside forward; finite differences in float32 "
                         "cannot check anything: compute in the input's dtype (x.dtype)"))
    if problems:
        return problems

    ev.upstream = make_upstream(run.upstream, outputs, np.random.default_rng(run.seeds[-1]))
    scale = sum(float(abs(g * y.data.reshape(-1)).sum()) for g, y in zip(ev.upstream, outputs))
    settings.noise = 10 * float(np.finfo(plan.check_dtype).eps) * scale / settings.eps
    run.scale = scale
    with no_grad():
        run.L0 = ev.loss_host()
    run.sizes = dimension_sizes(run.checked, outputs)
    return []


# ------------------------------------------------------------------------------- the backward


def backward_once(run, checked, upstream):
    """Zero the grads, run forward with a graph and backward(upstream); grads on the host."""
    for c in checked:
        c.tensor.grad = None
    with enable_grad():
        outputs = run.ev.outputs()
    for y, g in zip(outputs, upstream):
        if y.requires_grad:
            y.backward(g.reshape(y.shape), retain_graph=True)
    return {c.name: None if c.tensor.grad is None else host(c.tensor.grad).copy() for c in checked}


def analytic(run, scale):
    """Analytical gradients for upstream * scale; the engine's shape errors isolated per tensor.

    When the engine rejects a backward's result, each tensor is tried alone (the others do not
    require grad), so the error lands on the tensor whose gradient is wrong.
    """
    upstream = [g * scale for g in run.ev.upstream]
    try:
        return backward_once(run, run.checked, upstream), {}
    except MixedPrecisionError as err:   # forward met a float32 tensor that requires grad
        if run.plan.check_dtype is not None and err.dtype.itemsize < run.plan.check_dtype.itemsize:
            raise Fatal("unpromoted_tensor", _UNPROMOTED.format(dtype=err.dtype, text=err)) from None
        raise
    except RuntimeError as err:
        _engine_complaint(err, run.plan.check_dtype)  # raises unless the engine rejected a gradient
    grads, errors = {}, {}
    for c in run.checked:
        others = [o for o in run.checked if o is not c]
        for o in others:
            o.tensor.requires_grad = False
        try:
            grads.update(backward_once(run, [c], upstream))
        except RuntimeError as err:
            grads[c.name], errors[c.name] = None, _engine_complaint(err, run.plan.check_dtype)
        finally:
            for o in others:
                o.tensor.requires_grad = True
    return grads, errors


_UNPROMOTED = ("fn uses a {dtype} tensor that requires grad and that gradcheck did not promote ({text}): "
               "a tensor that requires grad is used by fn without being an input or a module parameter; "
               "pass it in inputs, or as params={{'name': tensor}}, or set requires_grad=False on it")


def _engine_complaint(err, check_dtype):
    """The engine's complaint about one backward's result, as a dict; anything else is re-raised.

    A float64 gradient for a float32 tensor means fn uses a tensor that requires grad but that
    gradcheck did not promote: that ends the check.
    """
    if not isinstance(err, GradientMismatchError):
        raise err
    parsed = {"kind": err.kind, "fn": reference_name(err.fn), "got": err.got, "want": err.expected, "text": str(err)}
    if parsed["kind"] == "dtype" and check_dtype is not None and parsed["got"] == str(check_dtype) \
            and np.dtype(parsed["want"]).itemsize < check_dtype.itemsize:
        raise Fatal("unpromoted_tensor", _UNPROMOTED.format(dtype=parsed["want"], text=parsed["text"]))
    return parsed


def scales_linearly(a1, a2, a0, dtype):
    """backward(2g) == 2 backward(g) and backward(0) == 0, up to rounding."""
    if a1 is None or a2 is None or a0 is None:
        return True
    if not (np.isfinite(a1).all() and np.isfinite(a2).all()):
        return True  # the NaN hint says more
    tol = (1e-8 if dtype is None or dtype.itemsize >= 8 else 1e-4) * max(np.abs(a1).max(initial=0), 1e-300)
    return bool(np.abs(a2 - 2 * a1).max(initial=0) <= 2 * tol and np.abs(a0).max(initial=0) <= tol)


def directional(run, c, a_host, rng):
    """n_proj random directions d: (L(x + h d) - L(x - h d)) / 2h against <a, actual step> / 2h."""
    h = run.settings.eps
    arr = c.tensor.data
    base = arr.copy()
    values = host(arr)
    out = []
    with no_grad():
        try:
            for _ in range(run.n_proj):
                d = rng.standard_normal(arr.shape)
                d /= np.linalg.norm(d) or 1.0
                up, down = (values + h * d).astype(values.dtype), (values - h * d).astype(values.dtype)
                arr[...] = to_device(up, c.tensor.device)
                Lp = run.ev.loss()
                arr[...] = to_device(down, c.tensor.device)
                Lm = run.ev.loss()
                step = up.astype(np.float64) - down.astype(np.float64)
                out.append((float(Lp - Lm) / (2 * h), float((a_host * step).sum()) / (2 * h)))
        finally:
            arr[...] = base
    return out


BLOCK_SHARE = 0.05  # an element off by this share of the RMS gradient fails its block ...
OWN_SHARE = 0.5  # ... and so does one off by half its own gradient (a small gradient gets a small block)
MAX_BLOCKS = 512
LOCATE_BUDGET = 256  # directions spent halving failing blocks, per tensor


def blocks(run, c, a_host, rng):
    """Check every element of a large tensor, in blocks, each along random +-1 signs.

    Along d = s / sqrt(b) (random signs s on a block of b elements), an element whose gradient
    is off by e changes the directional derivative by e / sqrt(b), while the check tolerates
    about ``tol`` = atol_eff + rtol * (the block's RMS gradient). So a block of b elements
    catches, with a margin of 2, any element off by 2 tol sqrt(b). Each element j asks to be
    caught when off by E_j = min(BLOCK_SHARE * RMS, OWN_SHARE * |a_j|) (never below 4 tol: what
    a full check can see): elements are packed, largest E first, into blocks no larger than
    (E / 2 tol)^2 for their smallest E. Large gradients share a few big blocks; small ones, where
    a wrong factor is a small absolute error, get small blocks. (At most MAX_BLOCKS: then the
    blocks are made larger and the report says what is still guaranteed.)

    Returns ([(numerical, analytical, flat indices, signs), ...], description of the guarantee).
    """
    s = run.settings
    a = np.abs(a_host.reshape(-1))
    rms = float(np.sqrt(np.mean(a * a))) if a.size else 0.0
    tol = s.atol_eff + s.rtol * rms
    wanted = np.maximum(np.minimum(BLOCK_SHARE * rms, OWN_SHARE * a), 4 * tol)
    order = np.lexsort((rng.random(a.size), -wanted))  # largest E first, ties in random order
    limits = np.maximum(1, np.floor((wanted[order] / (2 * tol)) ** 2)).astype(np.int64)
    starts, k = [], 0
    while k < a.size:  # a block ends where its smallest E (its last element's) allows no more
        starts.append(k)
        size = 1
        while k + size < a.size and size + 1 <= limits[k + size]:
            size += 1
        k += size
    if len(starts) > MAX_BLOCKS:  # too many: equal blocks over the same order, and a weaker promise
        step = math.ceil(a.size / MAX_BLOCKS)
        starts = list(range(0, a.size, step))
        promise = (f"an element off by more than {2 * tol * math.sqrt(step):.2g} fails its block "
                   f"({len(starts)} blocks of {step}; smaller errors need mode='full')")
    else:
        promise = (f"an element off by more than {BLOCK_SHARE * rms:.2g} ({BLOCK_SHARE:.0%} of the RMS gradient) or "
                   f"by half its own gradient (down to {4 * tol:.1g}) fails its block")
    bounds = starts[1:] + [a.size]
    checks = [_along(run, c, a_host, order[lo:hi], rng.choice((-1.0, 1.0), size=hi - lo))
              for lo, hi in zip(starts, bounds)]
    return checks, promise


def locate(run, c, a_host, failing, rng, classify):
    """Halve failing blocks until they are small; return the flat indices of the suspects.

    Each half is checked along its own random +-1 direction; a half that agrees is dropped.
    One wrong element among b costs about 2 log2(b) directions to find.
    """
    s = run.settings
    suspects, budget, queue = [], LOCATE_BUDGET, [idx for _, _, idx, _ in failing]
    while queue:
        idx = queue.pop()
        if len(idx) <= 8:
            suspects.extend(int(i) for i in idx)
            continue
        for half in (idx[: len(idx) // 2], idx[len(idx) // 2:]):
            if budget <= 0:
                return sorted(set(suspects)), False
            budget -= 1
            nu, an, _, _ = _along(run, c, a_host, half, rng.choice((-1.0, 1.0), size=len(half)))
            if classify(np.array([an]), np.array([nu]), s.rtol, s.atol_eff)[0][0] == FAIL:
                queue.append(half)
    return sorted(set(suspects)), True


def _along(run, c, a_host, flat_index, signs):
    """The derivative along d = signs / sqrt(k) on the given elements: (numerical, analytical, index, signs)."""
    h = run.settings.eps
    arr = c.tensor.data
    flat = arr.reshape(-1)
    values = host(flat)[flat_index]
    d = signs / math.sqrt(len(flat_index))
    up, down = (values + h * d).astype(values.dtype), (values - h * d).astype(values.dtype)
    index = to_device(flat_index, c.tensor.device) if c.tensor.device != "cpu" else flat_index
    with no_grad():
        try:
            flat[index] = to_device(up, c.tensor.device)
            Lp = run.ev.loss()
            flat[index] = to_device(down, c.tensor.device)
            Lm = run.ev.loss()
        finally:
            flat[index] = to_device(values, c.tensor.device)
    step = up.astype(np.float64) - down.astype(np.float64)
    analytical = float((a_host.reshape(-1)[flat_index] * step).sum()) / (2 * h)
    return float(Lp - Lm) / (2 * h), analytical, flat_index, signs


def sample_positions(shape, n_coords, rng):
    """Flat C-order indices: corners, first/last index of every axis, then random coordinates."""
    size = math.prod(shape)
    chosen = {}
    edges = [(0, n - 1) if n > 1 else (0,) for n in shape]
    corners = list(itertools.product(*edges))
    if len(corners) > max(n_coords // 2, 1):
        corners = [corners[i] for i in rng.choice(len(corners), max(n_coords // 2, 1), replace=False)]
    for multi in corners:
        chosen.setdefault(int(np.ravel_multi_index(multi, shape)), None)
    for axis, n in enumerate(shape):
        for edge in sorted({0, n - 1}):
            multi = [int(rng.integers(m)) for m in shape]
            multi[axis] = edge
            chosen.setdefault(int(np.ravel_multi_index(tuple(multi), shape)), None)
    target = min(max(n_coords, len(chosen)), size)
    while len(chosen) < target:
        chosen.setdefault(int(rng.integers(size)), None)
    return np.array(sorted(chosen), dtype=np.int64)


def stability(run, c, elements):
    """Recompute the worst failing elements with eps x10 and /10: does the estimate move?"""
    settings = run.settings
    worst = sorted((ch for ch in elements if ch.status == FAIL and not isinstance(ch.index, str)
                    and math.isfinite(ch.numerical) and math.isfinite(ch.analytical)),
                   key=lambda ch: -ch.abs_err)[: 3 * run.topk]
    if not worst:
        return None
    index = np.array([np.ravel_multi_index(ch.index, c.tensor.shape) if ch.index else 0 for ch in worst])
    estimates = [np.array([ch.numerical for ch in worst])]
    for h in (settings.eps * 10, settings.eps / 10):
        estimates.append(run.ev.central_differences(c.tensor, index, h, run.L0)[0])
    spread = np.ptp(np.stack(estimates), axis=0)
    errors = np.array([ch.abs_err for ch in worst])
    eps_set = "{" + ", ".join(f"{e:.0e}" for e in (settings.eps * 10, settings.eps, settings.eps / 10)) + "}"
    if np.all(spread < 0.1 * errors):
        return (f"numerical estimate stable across eps in {eps_set} (spread {spread.max():.0e}) "
                "-> the analytical gradient is wrong")
    moving = int(np.sum(spread >= 0.1 * errors))
    return (f"numerical estimate unstable across eps in {eps_set}: on {moving} of the {len(worst)} worst "
            f"elements it moves by up to {spread.max():.1e}, against errors of up to {errors.max():.1e}: "
            "curvature or cancellation; try another eps or rescale the inputs; backward may be fine")


def lost_precision(run, c, result, elements, classify):
    """Does forward compute in lower precision than the check (float32 inside a float64 check)?

    Each failing element is moved by 1e-9 relative: 60x below float32's spacing and 10^7 x
    above float64's. A float64 forward changes L; one that rounds to float32 inside returns
    exactly L0. If it does, backward is compared again at float32's step and tolerances, so
    that the report can say whether backward is right after all.
    """
    dtype, s = run.plan.check_dtype, run.settings
    if dtype is None or dtype.itemsize < 8:
        return
    visible = 100 * float(np.finfo(dtype).eps) * run.scale  # a change of L that float64 shows
    probes = sorted((ch for ch in elements if ch.status == FAIL and not isinstance(ch.index, str)
                     and math.isfinite(ch.analytical) and abs(ch.analytical) * 1e-9 > visible),
                    key=lambda ch: -abs(ch.analytical))[:8]
    if not probes:
        return
    shape, flat = c.tensor.shape, c.tensor.data.reshape(-1)
    index = np.array([np.ravel_multi_index(ch.index, shape) if ch.index else 0 for ch in probes])
    values, flat_same = host(flat)[index], 0
    with no_grad():
        try:
            for i, v in zip(index.tolist(), values.tolist()):
                flat[i] = v + 1e-9 * max(1.0, abs(v))
                flat_same += run.ev.loss_host() == run.L0
                flat[i] = v
        finally:
            flat[i] = v
    ignored = ignored_by_forward(run, c, index)
    if ignored.all() or flat_same * 4 < 3 * len(probes):
        return  # forward ignores these elements (a mask): diagnose() says so
    # Compare again as a float32 check would: eps 1e-3, rtol 1e-2, atol 1e-3 (plus float32's noise floor).
    checked = [ch for ch in elements if not isinstance(ch.index, str)]
    where = np.array([np.ravel_multi_index(ch.index, shape) if ch.index else 0 for ch in checked])
    n32 = run.ev.central_differences(c.tensor, where, 1e-3, run.L0)[0]
    atol32 = max(1e-3, 10 * float(np.finfo(np.float32).eps) * run.scale / 1e-3)
    status32 = classify(result.analytical.reshape(-1)[where], n32, 1e-2, atol32)[0]
    agree = int(np.sum(status32 != FAIL))
    message = (f"forward computes in float32 inside, although gradcheck promoted the inputs to {dtype}: "
               f"moving an input by 1e-9 (relative) left the output exactly unchanged ({flat_same} of "
               f"{len(probes)} tries), float32 rounds such steps away; an astype(np.float32), a float32 "
               "constant or weight in forward does this: compute in the input's dtype (x.dtype)")
    if ("low_precision", message) not in run.problems:
        run.problems.append(("low_precision", message))
    result.hint_kind = "low_precision"
    result.pattern = (f"forward is flat at float64 resolution for {result.name!r}: "
                      f"{flat_same} of {len(probes)} failing elements moved by 1e-9 left L unchanged")
    result.trust = (f"numerical estimate unreliable at eps={s.eps:.0e}: it measures float32 rounding, "
                    "not the slope")
    at32 = f"at float32's step and tolerances (eps=1e-03, rtol=1e-02) backward agrees on {agree} of {len(checked)}"
    if agree == len(checked):
        for ch in elements:
            if ch.status == FAIL:
                ch.status = UNVERIFIED
        result.n_unverified, result.n_fail, result.verdict = result.n_unverified + result.n_fail, 0, "INCONCLUSIVE"
        result.hint = (f"float32 inside forward, not a backward bug: {at32} elements; fix the forward's "
                       "dtype, then the float64 check can certify backward")
    else:
        result.hint = (f"float32 inside forward, and backward looks wrong too: {at32} elements only")


def ignored_by_forward(run, c, flat_index, to_zero=False):
    """For each element: does forward ignore it? Moving it by half its size (at least 0.5) up
    and down leaves L bit for bit unchanged: a masked position, not rounding (a float32 step of
    1e-9 is lost, one of 0.5 never is). ``to_zero``: setting it to 0 must leave L unchanged too,
    which a mask does and a saturated output (tanh at 40, a softmax ahead by 95) does not."""
    flat = c.tensor.data.reshape(-1)
    values = host(flat)[flat_index]
    out = np.zeros(len(flat_index), dtype=bool)
    with no_grad():
        try:
            for k, (i, v) in enumerate(zip(np.asarray(flat_index).tolist(), values.tolist())):
                step = 0.5 * max(1.0, abs(v))
                same = True
                for moved in (v + step, v - step) + ((0.0,) if to_zero else ()):
                    flat[i] = moved
                    same = same and run.ev.loss_host() == run.L0
                flat[i] = v
                out[k] = same
        finally:
            if len(flat_index):
                flat[i] = v
    return out


def summarize(result, elements, topk, n_directions=0):
    """The counts, the verdict and the worst elements of one tensor's comparison."""
    result.checked = len(elements)
    result.n_directions = n_directions
    result.n_fail = sum(ch.status == FAIL for ch in elements)
    result.n_unverified = sum(ch.status == UNVERIFIED for ch in elements)
    result.n_nondiff = sum(ch.status == NONDIFF for ch in elements)
    result.max_abs_err = max((ch.abs_err for ch in elements), default=0.0)
    result.max_rel_err = max((ch.rel_err for ch in elements), default=0.0)
    if result.n_fail:
        result.verdict = "FAIL"
    elif result.n_nondiff:
        result.verdict = "NONDIFF"
    elif result.n_unverified * 2 >= max(result.checked, 1):
        result.verdict = "INCONCLUSIVE"
    shown = {"FAIL": FAIL, "NONDIFF": NONDIFF, "INCONCLUSIVE": UNVERIFIED}.get(result.verdict)
    result.worst = sorted((ch for ch in elements if ch.status == shown), key=lambda ch: -ch.abs_err)[:topk]


def working_snapshot(run, c):
    """The working copy's expected values (the original, converted the same way)."""
    return working_array(c.original.data, run.plan.work_dtype)


def backward_left_inputs_alone(run):
    changed = [c.name for c in run.checked if not same_bits(c.tensor.data, working_snapshot(run, c))]
    if changed:
        raise Fatal("mutated_input", f"backward modified {', '.join(map(repr, changed))} in place")


def unchecked_result(c, problems):
    """The row of a tensor whose gradients could not be compared at all."""
    kind = problems[0][0] if problems else None
    short = {"mutated_input": "forward modifies its input in place", "downcast": "forward returns float32",
             "nondeterministic": "forward is random or stateful", "no_output": "fn returns no float Tensor",
             "unpromoted_tensor": "fn uses a tensor that requires grad without being an input",
             "stateful": "forward keeps state from call to call"}.get(kind, "the forward cannot be checked")
    return TensorResult(c.name, c.kind, tuple(c.snapshot.shape), c.dtype, verdict="INCONCLUSIVE",
                        hint=f"not checked: {short} (PROBLEM ({kind}) above)" if kind else "not checked")

"""Gradient checking: compare what ``backward`` computes with the slope of ``forward``.

    from tinymlp import gradcheck
    gradcheck(my_layer, (x,))           # checks dL/dx and every parameter of my_layer
    gradcheck(MyOp.apply, (x, w))       # any function of tensors that require grad

This file is the method, top to bottom. ``help(tinymlp.gradcheck)`` says how to read a report.

1. **float64 copies.** Every floating-point tensor that requires grad (and a Module's
   parameters) is copied to float64: a float32 step of 1e-6 is mostly rounding noise. The
   user's tensors are never touched; the copies are put back bit for bit.
2. **A random upstream gradient.** Each output ``y_k`` gets a seeded N(0, 1) array ``g_k``, and
   the check is about one scalar::

       L(x) = sum_k <g_k, y_k(x)>          so that  dL/dx = backward(g)

   A random ``g`` rather than all ones matters: a backward that forgets to multiply by its
   incoming gradient is still right when that gradient is 1.
3. **Central differences.** For every element ``x_i`` of every checked tensor::

       n_i = (L(x + h e_i) - L(x - h e_i)) / ((x_i + h) - (x_i - h))

   (the denominator is the step actually represented in floating point, not the nominal 2h).
   Large tensors are *sampled*: corners, the first and last index of every axis, random
   coordinates, a few random directions, and every element inside a block checked along random
   +-1 signs (sized so that one element off by 5% of the typical gradient, or by half its own,
   fails its block). A
   failing tensor of at most 50,000 elements is then checked in full so that every bad element
   can be listed; a larger one has its failing blocks halved down to the wrong elements.
4. **The comparison.** The analytical ``a_i`` is what backward put into ``.grad``::

       PASS        |a - n| <= rtol * max(|a|, |n|)        agreement, certified
       FAIL        |a - n| >  atol_eff + rtol * |n|       the usual allclose bound is broken
       UNVERIFIED  anything in between                    only the noise band excuses it

   ``atol_eff = max(atol, 10 * machine_eps * sum|g * y| / h)`` is the noise floor of the finite
   difference: it may excuse a difference but never certify one. A tensor is FAIL if any element
   fails, INCONCLUSIVE if at least half of its checks are unverified, NONDIFF if its only
   failures sit on a kink (ReLU at 0: reported, not a failure unless ``strict_kinks``), else ok.
   Elements that tie at a kink (a max-pool's tied maxima) are moved together first: along that
   direction the function is smooth, and backward's sum over the tie must match it. A tensor
   whose checks mostly sit below the noise floor (a saturated softmax) is checked again at its
   values scaled toward 0, and the report says so.

Around the method (beside it in ``tinymlp/gradcheck/``): ``plan.py`` names and copies what is checked;
``checks.py`` verifies that the forward can be differentiated at all (deterministic, float64
throughout, inputs unmodified) and that backward is linear in ``g``, samples large tensors, and
asks whether a failing numerical estimate can be trusted (eps, lost precision); ``ties.py``
finds kinks and checks ties; ``conditioning.py`` moves a saturated check; ``blame.py`` watches
backward node by node (a Function that changes its incoming gradient in place) and names each
Function by its reference; ``state.py`` calls forward on other inputs in between (state kept
from call to call, a saved buffer the next call overwrites); ``precision.py`` runs a float32
layer's backward in float32 too; ``degenerate.py`` warns of inputs where whole classes of bugs
cannot show; ``diagnose.py`` (with ``hints.py``, ``rows.py``, ``broadcast.py`` and
``rejected.py``) writes the ``pattern`` / ``likely`` lines; ``report.py`` the report itself.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..grad_mode import no_grad
from ..backend import device_of, is_float_dtype, to_device
from ..tensor import Tensor
from . import blame, checks, conditioning, precision, state, ties
from .degenerate import degenerate_inputs
from .diagnose import diagnose, diagnose_across
from .rejected import explain_engine_error
from .plan import as_tuple, collect, describe, describe_call, host, leaf, same_bits, working_array
from .report import (
    FAIL, NONDIFF, PASS, UNVERIFIED, ElementCheck, GradcheckError, GradcheckReport, GradcheckWarning, Settings,
    TensorResult,
)

__all__ = ["gradcheck", "numerical_grad"]

# Per check dtype: (eps, rtol, atol floor).
DEFAULTS = {
    np.dtype(np.float64): (1e-6, 1e-4, 1e-6),
    np.dtype(np.float32): (1e-3, 1e-2, 1e-3),
    np.dtype(np.float16): (1e-2, 5e-2, 1e-2),
}
FULL_FALLBACK_LIMIT = 50_000  # a failing sampled tensor up to this size is re-checked in full


def gradcheck(fn, inputs, *, params="auto", wrt=None, exclude=None, names=None, upstream="random",
              mode="auto", dtype="float64", eps=None, rtol=None, atol=None, seed=0, before_forward=None,
              raise_on_fail=True, kwargs=None, max_full=4096, n_coords=64, n_proj=4, topk=5,
              strict=True, strict_kinks=False) -> GradcheckReport:
    """Check the gradients of ``fn`` at ``inputs`` against central finite differences, in float64.

    fn:       a callable returning a Tensor or a tuple of Tensors (``MyOp.apply``, a lambda), or a
              Module (then every parameter from ``named_parameters()`` is checked too).
    inputs:   a Tensor or a tuple. Every floating-point Tensor with ``requires_grad=True`` is
              checked; anything else (integer arrays, arrays, None, Tensors without grad) is a
              constant. Inputs are named after fn's parameters (``MyOp.forward``'s for ``MyOp.apply``).
    params:   "auto" (a Module's ``named_parameters()``) or a dict {name: Tensor} of tensors that
              fn uses without taking them as arguments.
    wrt, exclude: names to check / not to check.         names: display names for the inputs.
    upstream: "random" (seeded N(0, 1), the default), "ones", or one array per output.
    mode:     "auto" (full up to ``max_full`` elements in total, else sampled), "full" (every
              element) or "sampled" (``n_coords`` elements and ``n_proj`` random directions per tensor).
    dtype:    the dtype of the check ("float64"); None keeps the tensors' own dtypes.
    eps, rtol, atol: the step and tolerances (None: 1e-6, 1e-4, 1e-6 in float64).
    seed:     all randomness (upstream gradients, sampled coordinates, directions).
    before_forward: called before every forward, e.g. to reseed dropout.   kwargs: passed to fn.
    strict:   an INCONCLUSIVE tensor counts as a failure; strict_kinks: a NONDIFF one too.

    Returns a ``GradcheckReport`` (``.passed``, ``.per_tensor[name]``); raises ``GradcheckError``,
    whose message is the report, when a check fails (unless ``raise_on_fail=False``).

    Reading a report (``print(report)`` or ``report.summary()``):

    * the header: the settings (mode, check dtype, eps, tolerances, noise floor, seed), any
      ``PROBLEM`` with the forward as a whole (random, stateful, downcast to float32, modified an
      input, a saved array the next call overwrites), and any ``warning``: inputs where a whole
      class of bugs cannot show (all ones or zeros, a batch of one, whole numbers), or a float32
      backward that loses precision. Warnings do not fail the check; a passing check also issues
      them as ``GradcheckWarning``s;
    * a table, one row per checked tensor: elements checked (in sampled mode, "64 of 100000"),
      how many fail or are only unverified, the largest errors, and a verdict;
    * for each tensor that is not ok: its worst elements (index, numerical, analytical, both
      errors), then ``pattern`` (what the failing elements have in common: a constant ratio, a
      transpose, which rows, where the input is positive, ...), ``likely`` (the bug that usually
      produces that pattern), ``from`` (the Function whose backward produced that gradient) and
      ``trust`` (is the numerical side reliable? it is recomputed with eps x10 and /10);
    * a ``note`` for a tensor that is ok with something to say, such as a check made at its
      values scaled toward 0 because forward is saturated at the given ones;
    * ``reproduce:``, the call that repeats the check.

    ``report.hint_kinds`` names the diagnoses (``HINT_KINDS``) for tests; ``tinymlp.testing.
    assert_grads`` is the pytest-friendly form; ``tinymlp.numerical_grad`` prints the raw numbers.
    """
    if mode not in ("auto", "full", "sampled"):
        raise ValueError(f"gradcheck: mode must be 'auto', 'full' or 'sampled', got {mode!r}")
    # 1. What to check: name every float tensor that requires grad and make float64 copies.
    plan = collect(fn, inputs, params, wrt, exclude, names, dtype)
    d_eps, d_rtol, d_atol = DEFAULTS.get(plan.check_dtype, DEFAULTS[np.dtype(np.float32)])
    if mode == "auto":
        resolved = "full" if sum(c.size for c in plan.checked) <= max_full else "sampled"
    settings = Settings(mode=resolved if mode == "auto" else mode, dtype=plan.check_dtype, seed=seed,
                        promoted_from=plan.promoted_from,
                        eps=d_eps if eps is None else eps, rtol=d_rtol if rtol is None else rtol,
                        atol=d_atol if atol is None else atol,
                        upstream=upstream if isinstance(upstream, str) else "given")
    settings.call = describe_call(fn, inputs, plan.input_names, params=params, wrt=wrt, exclude=exclude,
                                  mode=mode, dtype=dtype, eps=eps, rtol=rtol, atol=atol, upstream=upstream,
                                  kwargs=kwargs, seed=seed)
    run = checks.Run(plan, settings, Evaluator(fn, plan.args, dict(kwargs or {}), before_forward, plan.xp),
                     seed, upstream=upstream, n_coords=n_coords, n_proj=n_proj, topk=topk)
    run.replan = lambda check_dtype: collect(fn, inputs, params, wrt, exclude, names, check_dtype)  # other dtypes

    # 2. The forward as a whole (and g), 3.-4. every tensor: backward, central differences, compare.
    results = {}
    try:
        plan.swap_in()
        run.problems += checks.check_forward(run, make_upstream)
        if not run.problems:
            run.problems += state.forward_state(run)
        if not run.problems:
            results = check_gradients(run)
    except checks.Fatal as fatal:
        run.problems.append((fatal.kind, fatal.message))
    finally:
        plan.swap_out()
    warned = degenerate_inputs(plan)
    if results and not run.problems:  # the layer's own float32 backward against its float64 one
        warned += precision.float32_backward(run, results)
    if not results:  # the gradients could not be compared
        results = {c.name: checks.unchecked_result(c, run.problems) for c in plan.checked}
    settings.restored = plan.originals_unchanged() and run.working_restored
    if not settings.restored:
        run.problems.append(("not_restored", "an input or parameter was not restored bit for bit"))

    report = GradcheckReport(describe(fn), results, run.problems, settings, strict=strict,
                             strict_kinks=strict_kinks, warnings=warned)
    if raise_on_fail and not report.passed:
        raise GradcheckError(report)
    if report.passed:  # a pass at a point where some bugs cannot show must not be silent
        for kind, message in report.warnings:
            warnings.warn(GradcheckWarning(f"gradcheck passed for {report.title}, but ({kind}) {message}"),
                          stacklevel=2)
    return report


def numerical_grad(fn, inputs, upstream=None, eps=1e-6, *, dtype="float64", kwargs=None):
    """Central-difference gradient of ``L = sum_k <upstream_k, fn(*inputs)_k>``, CS231n style.

    Differentiates with respect to every floating-point Tensor in ``inputs`` (computed in
    ``dtype`` on copies: the inputs are not touched). ``upstream`` may be omitted when fn
    returns a single-element Tensor. Returns one array per input (None for non-float inputs),
    or a single array when ``inputs`` is a single Tensor::

        dx = tinymlp.numerical_grad(lambda x: (x * x).sum(), x)      # 2 * x
    """
    single = isinstance(inputs, Tensor)
    dtype = None if dtype is None else np.dtype(dtype)
    args = [leaf(working_array(x.data, dtype), False) if isinstance(x, Tensor) and is_float_dtype(x.dtype)
            else x for x in as_tuple(inputs)]
    targets = [a if isinstance(a, Tensor) and a is not x else None for a, x in zip(args, as_tuple(inputs))]
    live = [t for t in targets if t is not None]
    if not live:
        raise ValueError("numerical_grad: no floating-point Tensor in inputs")
    ev = Evaluator(fn, args, dict(kwargs or {}), None, live[0].xp)
    with no_grad():
        outputs = ev.outputs()
        if upstream is None:
            big = [tuple(y.shape) for y in outputs if y.size != 1]
            if big:
                raise ValueError(f"numerical_grad: fn returns outputs of shape {big}; "
                                 "pass upstream= (one array per output)")
            upstream = "ones"
        ev.upstream = make_upstream(upstream, outputs, np.random.default_rng(0))
        L0 = ev.loss_host()
        grads = [None if t is None else
                 to_device(ev.central_differences(t, np.arange(t.size), eps, L0)[0].reshape(t.shape), t.device)
                 for t in targets]
    return grads[0] if single else tuple(grads)


class Evaluator:
    """Calls fn on the working tensors and reduces its outputs to ``L = sum_k <g_k, y_k>``."""

    def __init__(self, fn, args, kwargs, before_forward, xp):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.before_forward = before_forward
        self.xp = xp
        self.upstream = []  # one flat array per float output, set once the outputs are known
        # On the CPU, einsum rather than BLAS's dot: a multithreaded dot between two forwards
        # waits for sleeping BLAS threads (milliseconds on a busy machine); einsum stays on one.
        self._dot = (lambda g, y: np.einsum("i,i->", g, y)) if xp is np else xp.vdot

    def outputs(self):
        """fn's floating-point outputs, as a tuple of Tensors."""
        if self.before_forward is not None:
            self.before_forward()
        out = self.fn(*self.args, **self.kwargs)
        items = out if isinstance(out, (tuple, list)) else (out,)
        for y in items:
            if not (isinstance(y, Tensor) or y is None or isinstance(y, (int, bool))):
                raise TypeError(
                    f"gradcheck: fn must return a Tensor or a tuple of Tensors, got a {type(y).__name__} "
                    "(did forward leave the graph through .data or np.asarray?)")
        return tuple(y for y in items if isinstance(y, Tensor) and y.dtype.kind == "f")

    def loss(self):
        """L at the current values, as a device scalar (no synchronisation on a GPU)."""
        terms = [self._dot(g, y.data.reshape(-1)) for g, y in zip(self.upstream, self.outputs())]
        return sum(terms[1:], terms[0])

    def loss_host(self) -> float:
        return float(self.loss())

    def central_differences(self, tensor, flat_index, h, L0):
        """Numerical gradient at the given C-order positions, and both one-sided slopes.

        Each element is set to x+h and x-h in place and put back; L values stay on the device
        until one transfer at the end. Returns (n, d_plus, d_minus) as float64 host arrays.
        """
        if len(flat_index) == 0:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        flat = tensor.data.reshape(-1)  # a view: working copies are C-contiguous
        values = host(flat)[flat_index]
        up, down = (values + h).astype(values.dtype), (values - h).astype(values.dtype)
        plus, minus = [], []
        with no_grad():
            try:
                for i, v, u, d in zip(flat_index.tolist(), values.tolist(), up.tolist(), down.tolist()):
                    flat[i] = u
                    plus.append(self.loss())
                    flat[i] = d
                    minus.append(self.loss())
                    flat[i] = v
            finally:
                flat[i] = v  # the element being perturbed when forward raised
        Lp = host(self.xp.stack(plus)).astype(np.float64)
        Lm = host(self.xp.stack(minus)).astype(np.float64)
        v64, u64, d64 = values.astype(np.float64), up.astype(np.float64), down.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (Lp - Lm) / (u64 - d64), (Lp - L0) / (u64 - v64), (L0 - Lm) / (v64 - d64)


def make_upstream(upstream, outputs, rng):
    """One flat array g_k per output: seeded N(0, 1), ones, or given by the caller."""
    if isinstance(upstream, str):
        if upstream not in ("random", "ones"):
            raise ValueError(f"gradcheck: upstream must be 'random', 'ones' or arrays, got {upstream!r}")
        arrays = [rng.standard_normal(y.shape) if upstream == "random" else np.ones(y.shape) for y in outputs]
    else:
        arrays = list(upstream) if isinstance(upstream, (tuple, list)) else [upstream]
        arrays = [a.data if isinstance(a, Tensor) else a for a in arrays]
        if len(arrays) != len(outputs) or any(tuple(a.shape) != tuple(y.shape) for a, y in zip(arrays, outputs)):
            raise ValueError(f"gradcheck: upstream shapes {[tuple(a.shape) for a in arrays]} do not match "
                             f"the outputs {[tuple(y.shape) for y in outputs]}")
    device = device_of(outputs[0].data)
    return [to_device(host(a).astype(y.dtype).reshape(-1), device) for a, y in zip(arrays, outputs)]


def classify(a, n, rtol, atol_eff):
    """The three-way rule: FAIL / PASS (certified) / UNVERIFIED, plus |a-n| and rel err."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - n)
        finite = np.isfinite(a) & np.isfinite(n)
        fail = ~finite | (diff > atol_eff + rtol * np.abs(n))
        certified = (a == n) | (diff <= rtol * np.maximum(np.abs(a), np.abs(n)))
        status = np.where(fail, FAIL, np.where(certified, PASS, UNVERIFIED))
        diff = np.where(finite, diff, np.inf)
        rel = diff / np.maximum(np.abs(n), atol_eff)
    return status, diff, rel


def check_gradients(run) -> dict:
    """Backward three times (g, 2g, 0: is backward linear in g?), then every tensor numerically."""
    grads, errors = checks.analytic(run, 1.0)
    grads2, _ = checks.analytic(run, 2.0)
    grads0, _ = checks.analytic(run, 0.0)
    checks.backward_left_inputs_alone(run)
    if not errors:
        run.problems += blame.backward_in_place(run)
    if not errors and not run.problems:
        run.problems += state.saved_state(run, grads)
    results = {}
    for k, c in enumerate(run.checked):
        result = results[c.name] = TensorResult(c.name, c.kind, tuple(c.snapshot.shape), c.dtype)
        if c.name in errors:
            explain_engine_error(result, errors[c.name], run.plan.input_names,
                                 {o.name: tuple(o.tensor.shape) for o in run.checked})
            continue
        missing = grads[c.name] is None
        a = np.zeros(c.tensor.shape) if missing else grads[c.name].astype(np.float64)
        linear = checks.scales_linearly(grads[c.name], grads2.get(c.name), grads0.get(c.name),
                                        run.plan.check_dtype)
        rng = np.random.default_rng(run.seeds[k])
        elements = compare_tensor(run, c, result, a, rng)
        if conditioning.saturated(result):  # gradients below the noise floor: look where they are not
            elements = conditioning.recheck(run, c, result, lambda r, a, c=c, rng=rng: compare_tensor(
                run, c, r, a, rng)) or elements
        with conditioning.at(run, c, result):  # at the values the check moved to, if it moved
            if result.n_fail:  # can the numerical side be trusted?
                result.trust = checks.stability(run, c, elements)
                checks.lost_precision(run, c, result, elements, classify)
                precision.float32_failure(run, c, result, elements, classify)
            diagnose(run, c, result, elements, missing, linear)
        conditioning.explain(c, result)
    diagnose_across(run, results)
    blame.name_sources(run, results)
    run.working_restored = all(same_bits(c.tensor.data, checks.working_snapshot(run, c)) for c in run.checked)
    return results


def compare_tensor(run, c, result, a, rng):
    """Central differences for one tensor (every element, or a sample), compared with ``a``.

    Sampled mode checks ``n_coords`` elements, ``n_proj`` Gaussian directions and, so that no
    element goes unchecked, every element inside a block checked along random +-1 signs (blocks
    sized so that an element off by 5% of the RMS gradient, or by half its own, fails; see
    ``checks.blocks``). When anything fails, a tensor
    of up to FULL_FALLBACK_LIMIT elements is checked in full; a larger one has its failing
    blocks halved until the wrong elements are found, and those are checked one by one.
    """
    s, a_flat = run.settings, a.reshape(-1)
    full = s.mode == "full" or c.size <= run.n_coords
    index = np.arange(c.size) if full else checks.sample_positions(c.tensor.shape, run.n_coords, rng)
    result.mode = "full" if full else "sampled"
    n, d_plus, d_minus = run.ev.central_differences(c.tensor, index, s.eps, run.L0)
    status, diff, rel = classify(a_flat[index], n, s.rtol, s.atol_eff)
    directions = []  # sampled mode: [(label, numerical, analytical), ...]
    if not full:
        directions = [(f"dir {k + 1}", nu, an) for k, (nu, an) in enumerate(checks.directional(run, c, a, rng))]
        block_checks, result.block_promise = checks.blocks(run, c, a_flat, rng)
        result.n_blocks = len(block_checks)
        directions += [(f"block {k + 1}", nu, an) for k, (nu, an, _, _) in enumerate(block_checks)]
        nu, an = np.array([(d[1], d[2]) for d in directions]).T
        direction_fails = classify(an, nu, s.rtol, s.atol_eff)[0] == FAIL
        if (status == FAIL).any() or direction_fails.any():
            if c.size <= FULL_FALLBACK_LIMIT:  # list every bad element
                index, directions, result.mode = np.arange(c.size), [], "sampled, then full"
                result.n_blocks = 0
            else:  # halve the failing blocks down to their wrong elements
                failing = [b for b, bad in zip(block_checks, direction_fails[-len(block_checks):]) if bad]
                suspects, complete = checks.locate(run, c, a_flat, failing, rng, classify)
                index = np.union1d(index, np.array(suspects, dtype=np.int64))
                result.mode = "sampled, then located" if complete else "sampled, partly located"
            n, d_plus, d_minus = run.ev.central_differences(c.tensor, index, s.eps, run.L0)
            status, diff, rel = classify(a_flat[index], n, s.rtol, s.atol_eff)
    status = np.where(ties.kinks(a_flat[index], n, d_plus, d_minus, status, s), NONDIFF, status)
    status, result.ties = ties.ties(run, c, index, a_flat[index], d_plus, d_minus, status, classify)

    shape = c.tensor.shape
    elements = [ElementCheck(tuple(int(j) for j in np.unravel_index(i, shape)) if shape else (),
                             float(nv), float(av), float(d), float(r), str(st))
                for i, nv, av, d, r, st in zip(index.tolist(), n, a_flat[index], diff, rel, status)]
    for label, nv, av in directions:
        st, d, r = classify(np.array([av]), np.array([nv]), s.rtol, s.atol_eff)
        elements.append(ElementCheck(label, nv, av, float(d[0]), float(r[0]), str(st[0])))
    numerical = np.full(c.size, np.nan)
    numerical[index] = n
    result.numerical, result.analytical = numerical.reshape(shape), a
    checks.summarize(result, elements, run.topk, n_directions=len(directions))
    return elements

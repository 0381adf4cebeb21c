"""Gradient checking: compare what ``backward`` computes with the slope of ``forward``.

    from tinymlp import gradcheck
    gradcheck(my_layer, (x,))           # checks dL/dx and every parameter of my_layer
    gradcheck(lambda x, w: my_op(x, w), (x, w))   # any function of tensors that require grad

In a pytest suite, ``tinymlp.testing.assert_grads`` does the same and fails with the report.

The method
----------
Every output ``y_k`` of ``fn`` is turned into one scalar with a random *upstream gradient*
``g_k`` (one seeded N(0, 1) array per output)::

    L(x) = sum_k <g_k, y_k(x)>

so that dL/dx is exactly what ``backward(g)`` must produce (a vector-Jacobian product).
A random ``g`` instead of all ones matters: a backward that forgets to multiply by its
incoming gradient is still right when that gradient is 1.

For every element ``x_i`` of every checked tensor, the *numerical* gradient is the central
difference::

    n_i = (L(x + h e_i) - L(x - h e_i)) / ((x_i + h) - (x_i - h))

(the denominator is the step actually represented in floating point, not the nominal 2h), and
the *analytical* gradient ``a_i`` is what backward put into ``.grad``. Both are computed in
float64 on *copies* of the inputs and parameters (float32 steps of 1e-6 are mostly rounding
noise), which are put back bit for bit afterwards.

Small tensors are checked element by element ("full" mode). Large ones are "sampled": the
corners and the first/last index of every axis (where off-by-one bugs live), random
coordinates, and a few random directions ``<grad, d>``; a tensor that fails a sample and has
at most 50,000 elements is then checked in full so that every bad element can be listed.

Each element gets one of three outcomes::

    PASS        |a - n| <= rtol * max(|a|, |n|)        agreement, certified
    FAIL        |a - n| >  atol_eff + rtol * |n|       the usual allclose bound is broken
    UNVERIFIED  anything in between                    only the noise band excuses it

``atol_eff = max(atol, 10 * machine_eps * sum|g * y| / h)`` is the noise floor of the finite
difference: agreement below it is not evidence, so it may excuse a difference but never
certify one. A tensor is FAIL if any element fails, INCONCLUSIVE if at least half of its checks
are unverified (typically: every gradient is tiny next to the output), NONDIFF if its only
failures sit on a kink (ReLU at 0, ...: reported, but not a failure unless ``strict_kinks``),
and ok otherwise.

Before comparing anything, the forward is run twice (it must be deterministic), the outputs
must be float64 (a float32 constant or ``astype`` inside forward ruins the check), the inputs
must not be modified, and backward must be linear in its incoming gradient (backward(2g) must
return twice backward(g), backward(0) must return 0).

Reading the report
------------------
``str(report)`` (also the message of ``GradcheckError``) starts with the settings, then a table
with one row per checked tensor: how many elements were checked, how many fail or are
unverified, the largest absolute and relative errors (relative to |numerical|) and a verdict.
For each tensor that is not ok it lists the worst elements with their index, both values and
both errors, then up to three lines:

* ``pattern``: what the failing elements have in common (a constant ratio a/n, a transpose,
  one boundary index, part of an axis, ...);
* ``likely``: the bug that usually produces that pattern;
* ``trust``: whether the numerical side can be trusted: the estimate is recomputed with eps
  ten times larger and smaller; if it does not move, the analytical gradient is wrong.

The last line is the call that reproduces the check (everything is seeded by ``seed``).

Where things are
----------------
This file follows the method in order: 1. what to check (names, float64 copies), 2. the
forward (determinism, dtype, the noise floor), 3. the backward (analytical gradients),
4. the numerics (central differences), 5. the comparison. The ``pattern`` and ``likely`` lines
come from ``gradcheck_diagnose.py``; the report's classes and its text from ``gradcheck_report.py``.
"""

from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass

import numpy as np

from .autograd import GradientMismatchError, enable_grad, no_grad
from .backend import device_of, is_float_dtype, to_device
from .gradcheck_diagnose import diagnose, dimension_sizes, explain_engine_error
from .gradcheck_report import (
    FAIL, HINT_KINDS, NONDIFF, PASS, PROBLEM_KINDS, UNVERIFIED,  # noqa: F401 (re-exported)
    ElementCheck, GradcheckError, GradcheckReport, Settings, TensorResult,
)
from .tensor import Tensor

__all__ = [
    "HINT_KINDS",
    "GradcheckError",
    "GradcheckReport",
    "TensorResult",
    "ElementCheck",
    "gradcheck",
    "numerical_grad",
]

# Per check dtype: (eps, rtol, atol floor).  See the module docstring for the noise floor.
_DEFAULTS = {
    np.dtype(np.float64): (1e-6, 1e-4, 1e-6),
    np.dtype(np.float32): (1e-3, 1e-2, 1e-3),
    np.dtype(np.float16): (1e-2, 5e-2, 1e-2),
}
_FULL_FALLBACK_LIMIT = 50_000  # a failing sampled tensor up to this size is re-checked in full


# =============================================================================== the public API


def gradcheck(
    fn,
    inputs,
    *,
    params="auto",
    wrt=None,
    exclude=None,
    names=None,
    upstream="random",
    mode="auto",
    dtype="float64",
    eps=None,
    rtol=None,
    atol=None,
    seed=0,
    before_forward=None,
    raise_on_fail=True,
    kwargs=None,
    max_full=4096,
    n_coords=64,
    n_proj=4,
    topk=5,
    strict=True,
    strict_kinks=False,
) -> GradcheckReport:
    """Check the gradients of ``fn`` at ``inputs`` against central finite differences.

    fn:       a callable returning a Tensor or a tuple of Tensors, or a Module (then every
              parameter from ``named_parameters()`` is checked too, under its dotted name).
    inputs:   a Tensor or a tuple. Every floating-point Tensor with ``requires_grad=True`` is
              checked; anything else (integer arrays, arrays, None, Tensors without grad) is
              passed as a constant. Positional inputs are named after fn's parameters.
    params:   "auto" (a Module's ``named_parameters()``; nothing for a plain callable) or a
              dict {name: Tensor} of tensors fn uses without taking them as arguments.
    wrt, exclude: names to check / not to check (default: everything).
    names:    display names for the positional inputs.
    upstream: "random" (seeded N(0, 1), the default), "ones", or an array (one per output).
    mode:     "auto" (full if at most ``max_full`` elements in total, else sampled),
              "full" (every element) or "sampled" (``n_coords`` elements and ``n_proj``
              random directions per tensor).
    dtype:    the dtype of the check ("float64"); None keeps the tensors' own dtypes.
    eps, rtol, atol: finite-difference step and tolerances (None: defaults for the dtype,
              1e-6, 1e-4, 1e-6 in float64).
    seed:     all randomness (upstream gradients, sampled coordinates, directions).
    before_forward: called before every forward, e.g. to reseed dropout.
    kwargs:   keyword arguments passed to fn on every call.
    strict:   an INCONCLUSIVE tensor counts as a failure; strict_kinks: a NONDIFF one too.

    Returns a GradcheckReport; raises GradcheckError (whose message is the report) on failure
    unless ``raise_on_fail=False``. The inputs and parameters are left exactly as they were.
    """
    if mode not in ("auto", "full", "sampled"):
        raise ValueError(f"gradcheck: mode must be 'auto', 'full' or 'sampled', got {mode!r}")
    # 1. What to check: name every float tensor that requires grad and make float64 copies.
    plan = _collect(fn, inputs, params, wrt, exclude, names, dtype)
    settings = _make_settings(plan, mode, max_full, eps, rtol, atol, seed, upstream)
    settings.options = _non_defaults(
        wrt=(wrt, None), exclude=(exclude, None), mode=(mode, "auto"), dtype=(dtype, "float64"),
        eps=(eps, None), rtol=(rtol, None), atol=(atol, None),
        upstream=(upstream if isinstance(upstream, str) else "<arrays>", "random"),
    )
    evaluator = _Evaluator(fn, plan.args, dict(kwargs or {}), before_forward, plan.xp)
    run = _Run(plan, settings, evaluator, seed,
               upstream=upstream, n_coords=n_coords, n_proj=n_proj, topk=topk)

    # 2. Check the forward as a whole, 3.-5. then compare the gradients tensor by tensor.
    problems: list[tuple[str, str]] = []
    results: dict[str, TensorResult] = {}
    try:
        plan.swap_in()
        problems = _check_forward(run)
        if not problems:
            results = _check_gradients(run)
    except _Fatal as fatal:
        problems.append((fatal.kind, fatal.message))
    finally:
        plan.swap_out()
    if not results:  # the gradients could not be compared
        results = {c.name: _unchecked_result(c, problems) for c in plan.checked}
    settings.restored = plan.originals_unchanged() and run.working_restored
    if not settings.restored:
        problems.append(("not_restored", "an input or parameter was not restored bit for bit"))

    report = GradcheckReport(_describe(fn), results, problems, settings,
                             strict=strict, strict_kinks=strict_kinks)
    if raise_on_fail and not report.passed:
        raise GradcheckError(report)
    return report


def _make_settings(plan, mode, max_full, eps, rtol, atol, seed, upstream):
    """The check dtype's defaults for whatever the caller left at None; "auto" mode resolved."""
    check = plan.check_dtype
    d_eps, d_rtol, d_atol = _DEFAULTS.get(check, _DEFAULTS[np.dtype(np.float32)])
    if mode == "auto":
        mode = "full" if sum(c.size for c in plan.checked) <= max_full else "sampled"
    return Settings(mode=mode, dtype=check, eps=d_eps if eps is None else eps,
                    rtol=d_rtol if rtol is None else rtol, atol=d_atol if atol is None else atol, seed=seed,
                    upstream=upstream if isinstance(upstream, str) else "given",
                    promoted_from=plan.promoted_from)


def _non_defaults(**pairs):
    """The arguments that differ from their default, for the reproduce line."""
    return {k: v for k, (v, default) in pairs.items() if v != default}


def _unchecked_result(c, problems):
    """The row of a tensor whose gradients could not be compared at all."""
    message = problems[0][1] if problems else "not checked"
    return TensorResult(c.name, c.kind, tuple(c.snapshot.shape), c.dtype, verdict="INCONCLUSIVE",
                        hint=f"not checked: {message}")


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
    args, targets = [], []
    for x in _as_tuple(inputs):
        if isinstance(x, Tensor) and is_float_dtype(x.dtype):
            w = _leaf(_working_array(x.data, dtype), requires_grad=False)
            targets.append(w)
            args.append(w)
        else:
            targets.append(None)
            args.append(x)
    live = [t for t in targets if t is not None]
    if not live:
        raise ValueError("numerical_grad: no floating-point Tensor in inputs")
    xp = live[0]._xp
    ev = _Evaluator(fn, args, dict(kwargs or {}), None, xp)
    with no_grad():
        outputs = ev.outputs()
        if upstream is None:
            big = [tuple(y.shape) for y in outputs if y.size != 1]
            if big:
                raise ValueError(
                    f"numerical_grad: fn returns outputs of shape {big}; "
                    "pass upstream= (one array per output)"
                )
            upstream = "ones"
        ev.upstream = _make_upstream(upstream, outputs, np.random.default_rng(0))
        grads = []
        for t in targets:
            if t is None:
                grads.append(None)
                continue
            n, _, _ = _central_differences(ev, t, np.arange(t.size), eps, ev.loss_host())
            grads.append(to_device(n.reshape(t.shape), t.device))
    return grads[0] if single else tuple(grads)


# =============================================================================== 1. what to check


@dataclass
class _Checked:
    """One tensor under check: ``tensor`` is what the forward sees during the check."""

    name: str
    kind: str  # "input" or "param"
    tensor: Tensor  # a float64 copy (input) or the parameter itself with swapped data
    original: Tensor
    snapshot: np.ndarray  # the user's values, to verify they come back untouched

    @property
    def dtype(self):
        return str(self.snapshot.dtype)

    @property
    def size(self):
        return self.tensor.size


@dataclass
class _Swap:
    """A parameter whose ``.data`` is replaced by a check-dtype copy during the check."""

    param: Tensor
    data: object  # the working copy
    requires_grad: bool  # True when the parameter is checked
    saved: tuple = ()


class _Plan:
    """The result of sorting fn's inputs and parameters into checked tensors and constants."""

    def __init__(self):
        self.args = []  # what fn receives positionally
        self.checked: list[_Checked] = []
        self.swaps: list[_Swap] = []
        self.constants: list[tuple[str, object]] = []  # arrays the forward must not modify
        self.check_dtype = None  # the dtype the check runs in
        self.work_dtype = None  # the dtype copies are made in (None: each keeps its own)
        self.promoted_from = ()
        self.xp = np

    def swap_in(self):
        for s in self.swaps:
            s.saved = (s.param.data, s.param.grad, s.param.requires_grad)
            s.param.data, s.param.grad, s.param.requires_grad = s.data, None, s.requires_grad

    def swap_out(self):
        for s in reversed(self.swaps):
            if s.saved:
                s.param.data, s.param.grad, s.param.requires_grad = s.saved
                s.saved = ()

    def originals_unchanged(self) -> bool:
        return all(_same_bits(_host(c.original.data), c.snapshot) for c in self.checked)


def _collect(fn, inputs, params, wrt, exclude, names, dtype) -> _Plan:
    """Name every float tensor that requires grad, decide what is checked, make the copies."""
    inputs = _as_tuple(inputs)
    input_names = _input_names(fn, len(inputs), names)
    params = _params_of(fn, params)
    candidates = _candidates(input_names, inputs, params)
    selected = _select(candidates, wrt, exclude)

    plan = _Plan()
    chosen = [candidates[k][2] for k in selected]
    plan.check_dtype = np.dtype(dtype) if dtype is not None else min(
        (np.dtype(t.dtype) for t in chosen), key=lambda d: d.itemsize)
    plan.work_dtype = None if dtype is None else plan.check_dtype
    plan.promoted_from = tuple(sorted({str(t.dtype) for t in chosen} - {str(plan.check_dtype)}))
    if len({t.device for t in chosen}) > 1:
        where = ", ".join(f"{candidates[k][0]} on {candidates[k][2].device}" for k in selected)
        raise ValueError(f"gradcheck: tensors on different devices ({where}); move them to one device")
    plan.xp = chosen[0]._xp

    # Inputs get a fresh float64 leaf; parameters stay the same objects, with swapped data.
    param_ids = {id(p) for p in params.values()}
    working = {}
    for key, (name, kind, t) in candidates.items():
        if key in param_ids:
            working[key] = t
        else:
            working[key] = _leaf(_working_array(t.data, plan.work_dtype), key in selected, name)
        if key in selected:
            plan.checked.append(_Checked(name, kind, working[key], t, _host(t.data).copy()))
    constants = []
    for name, p in params.items():
        if isinstance(p, Tensor) and is_float_dtype(p.dtype):
            if all(s.param is not p for s in plan.swaps):  # tied weights: swap once
                plan.swaps.append(_Swap(p, _working_array(p.data, plan.work_dtype), id(p) in selected))
        elif isinstance(p, Tensor):
            constants.append((name, p.data))

    for name, x in zip(input_names, inputs):
        if id(x) in working:
            plan.args.append(working[id(x)])
        elif isinstance(x, Tensor) and is_float_dtype(x.dtype) and plan.work_dtype is not None:
            plan.args.append(_leaf(_working_array(x.data, plan.work_dtype), False))  # a float constant
        else:
            plan.args.append(x)
            if isinstance(x, Tensor):
                constants.append((name, x.data))
            elif hasattr(x, "shape") and hasattr(x, "dtype"):
                constants.append((name, x))
    constants += [(name, b.data if isinstance(b, Tensor) else b) for name, b in _buffers_of(fn)]
    plan.constants = [(name, arr, _host(arr).copy()) for name, arr in constants]
    return plan


def _candidates(input_names, inputs, params):
    """id -> (name, kind, tensor) for every float tensor that requires grad; inputs first.

    A tensor passed twice (or tied between two parameters) is one candidate, named after its
    first use: its gradient is the sum over all uses, which also tests the accumulation.
    """
    candidates = {}
    for name, x in zip(input_names, inputs):
        if _wants_grad(x) and id(x) not in candidates:
            candidates[id(x)] = (name, "input", x)
    for name, p in params.items():
        if _wants_grad(p) and id(p) not in candidates:
            candidates[id(p)] = (name, "param", p)
    return candidates


def _select(candidates, wrt, exclude):
    """The ids of the candidates that ``wrt`` / ``exclude`` leave to check."""
    known = [name for name, _, _ in candidates.values()]
    for label, chosen in (("wrt", wrt), ("exclude", exclude)):
        unknown = [w for w in (chosen or ()) if w not in known]
        if unknown:
            raise ValueError(f"gradcheck: {label}={unknown} names no checkable tensor; known names: {known}")
    selected = [k for k, (name, _, _) in candidates.items()
                if (wrt is None or name in wrt) and (exclude is None or name not in exclude)]
    if not selected:
        raise ValueError(
            "gradcheck: nothing to check: no input is a floating-point Tensor with requires_grad=True "
            "(arrays, integers and tensors without grad are constants)"
            + (f"; wrt/exclude left none of {known}" if known else "")
        )
    return selected


def _as_tuple(inputs):
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def _is_module(fn):
    return callable(getattr(fn, "named_parameters", None))


def _wants_grad(x):
    return isinstance(x, Tensor) and x.requires_grad and is_float_dtype(x.dtype)


def _params_of(fn, params) -> dict:
    if params == "auto":
        return dict(fn.named_parameters()) if _is_module(fn) else {}
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise TypeError("gradcheck: params must be 'auto', None or a dict {name: Tensor}")
    return dict(params)


def _buffers_of(fn):
    named_buffers = getattr(fn, "named_buffers", None)
    return list(named_buffers()) if callable(named_buffers) else []


def _input_names(fn, n, names):
    """Names of the positional inputs: ``names``, else fn's parameter names, else input0..."""
    if names is not None:
        names = list(names)
        if len(names) != n:
            raise ValueError(f"gradcheck: {len(names)} names for {n} inputs")
        return names
    target = fn.forward if _is_module(fn) and hasattr(fn, "forward") else fn
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        parameters = ()
    positional = []
    for p in parameters:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        positional.append(p.name)
    return [positional[i] if i < len(positional) else f"input{i}" for i in range(n)]


def _working_array(data, dtype):
    """A C-contiguous copy in ``dtype`` (or in its own dtype when dtype is None)."""
    return data.astype(dtype if dtype is not None else data.dtype, order="C", copy=True)


def _leaf(data, requires_grad, name=None):
    t = Tensor(data, dtype=data.dtype)  # shares ``data``
    t.requires_grad = requires_grad
    t.name = name
    return t


def _describe(fn) -> str:
    if _is_module(fn):
        return type(fn).__name__
    if inspect.ismethod(fn):
        owner = fn.__self__ if inspect.isclass(fn.__self__) else type(fn.__self__)
        return f"{owner.__name__}.{fn.__name__}"
    return getattr(fn, "__qualname__", None) or type(fn).__name__


# =============================================================================== 2. the forward


class _Evaluator:
    """Calls fn on the working tensors and reduces its outputs to ``L = sum_k <g_k, y_k>``."""

    def __init__(self, fn, args, kwargs, before_forward, xp):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.before_forward = before_forward
        self.xp = xp
        self.upstream = []  # one array per float output, set once the outputs are known
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
                    "(did forward leave the graph through .data or np.asarray?)"
                )
        return tuple(y for y in items if isinstance(y, Tensor) and y.dtype.kind == "f")

    def loss(self):
        """L at the current values, as a device scalar (no synchronisation on a GPU)."""
        total = None
        for g, y in zip(self.upstream, self.outputs()):
            term = self._dot(g, y.data.reshape(-1))
            total = term if total is None else total + term
        return total

    def loss_host(self) -> float:
        return float(self.loss())


class _Fatal(Exception):
    """A problem that makes comparing gradients meaningless; becomes a report problem."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, message


class _Run:
    """The state of one gradcheck run, shared by the steps below."""

    def __init__(self, plan, settings, ev, seed, *, upstream, n_coords, n_proj, topk):
        self.plan, self.settings, self.ev = plan, settings, ev
        self.upstream = upstream  # "random", "ones" or the caller's arrays
        self.checked = plan.checked
        self.seeds = np.random.SeedSequence(seed).spawn(len(plan.checked) + 1)
        self.n_coords, self.n_proj, self.topk = n_coords, n_proj, topk
        self.L0 = None
        self.sizes = {}  # dimension size -> where it comes from (for mean-vs-sum hints)
        self.working_restored = True


def _check_forward(run) -> list:
    """Run forward twice and look for problems; if none, draw g and measure the noise floor."""
    ev, plan, settings = run.ev, run.plan, run.settings
    before = [c.tensor.data.copy() for c in run.checked]
    with no_grad():
        first = [y.data.copy() for y in ev.outputs()]
        outputs = ev.outputs()
    if not first:
        raise _Fatal("no_output", "fn returned no floating-point Tensor: nothing to differentiate")
    problems = []
    second = [y.data for y in outputs]
    settings.deterministic = len(first) == len(second) and all(map(_close_bits, first, second))
    if not settings.deterministic:
        problems.append(("nondeterministic",
                         "forward is random or stateful: two calls on the same inputs gave different "
                         "outputs (dropout? an RNG? running statistics?): disable it, or pass "
                         "before_forward=lambda: <reseed your generator>"))
    low = [f"output {k} is {y.dtype}" for k, y in enumerate(first)
           if y.dtype.itemsize < plan.check_dtype.itemsize]
    if low:
        problems.append(("downcast",
                         f"forward downcasts: {', '.join(low)} although the inputs are {plan.check_dtype} "
                         "(a np.float32 constant, an astype, or a float32 array created inside forward); "
                         "finite differences in float32 cannot check anything: keep the input's dtype"))
    changed = [c.name for c, arr in zip(run.checked, before) if not _same_bits(arr, c.tensor.data)]
    changed += [name for name, arr, snapshot in plan.constants if not _same_bits(arr, snapshot)]
    if changed:
        problems.append(("mutated_input", f"forward modified {', '.join(map(repr, changed))} in place"))
    if problems:
        return problems

    ev.upstream = _make_upstream(run.upstream, outputs, np.random.default_rng(run.seeds[-1]))
    scale = sum(float(abs(g * y.data.reshape(-1)).sum()) for g, y in zip(ev.upstream, outputs))
    settings.noise = 10 * float(np.finfo(plan.check_dtype).eps) * scale / settings.eps
    with no_grad():
        run.L0 = ev.loss_host()
    run.sizes = dimension_sizes(run.checked, outputs)
    return []


def _make_upstream(upstream, outputs, rng):
    """One flat array per output: seeded N(0, 1), ones, or given by the caller."""
    device = device_of(outputs[0].data)
    if isinstance(upstream, str):
        if upstream not in ("random", "ones"):
            raise ValueError(f"gradcheck: upstream must be 'random', 'ones' or arrays, got {upstream!r}")
        make = (lambda s: rng.standard_normal(s)) if upstream == "random" else (lambda s: np.ones(s))
        arrays = [make(y.shape) for y in outputs]
    else:
        arrays = list(upstream) if isinstance(upstream, (tuple, list)) else [upstream]
        arrays = [a.data if isinstance(a, Tensor) else a for a in arrays]
        shapes_match = all(tuple(a.shape) == tuple(y.shape) for a, y in zip(arrays, outputs))
        if len(arrays) != len(outputs) or not shapes_match:
            raise ValueError(
                f"gradcheck: upstream shapes {[tuple(a.shape) for a in arrays]} do not match the outputs "
                f"{[tuple(y.shape) for y in outputs]}"
            )
    return [to_device(_host(a).astype(y.dtype).reshape(-1), device) for a, y in zip(arrays, outputs)]



# =============================================================================== 3. the backward


def _backward_once(run, checked, upstream):
    """Zero the grads, run forward with a graph and backward(upstream); grads on the host."""
    for c in checked:
        c.tensor.grad = None
    with enable_grad():
        outputs = run.ev.outputs()
    for y, g in zip(outputs, upstream):
        if y.requires_grad:
            y.backward(g.reshape(y.shape), retain_graph=True)
    return {c.name: None if c.tensor.grad is None else _host(c.tensor.grad).copy() for c in checked}


def _analytic(run, scale):
    """Analytical gradients for upstream * scale; the engine's shape errors isolated per tensor.

    When the engine rejects a backward's result, each tensor is tried alone (the others do not
    require grad), so the error lands on the tensor whose gradient is wrong.
    """
    upstream = [g * scale for g in run.ev.upstream]
    try:
        return _backward_once(run, run.checked, upstream), {}
    except RuntimeError as err:
        _engine_complaint(err, run.plan.check_dtype)  # raises unless the engine rejected a gradient
    grads, errors = {}, {}
    for c in run.checked:
        others = [o for o in run.checked if o is not c]
        for o in others:
            o.tensor.requires_grad = False
        try:
            grads.update(_backward_once(run, [c], upstream))
        except RuntimeError as err:
            grads[c.name], errors[c.name] = None, _engine_complaint(err, run.plan.check_dtype)
        finally:
            for o in others:
                o.tensor.requires_grad = True
    return grads, errors


def _engine_complaint(err, check_dtype):
    """The engine's complaint about one backward's result, as a dict; anything else is re-raised.

    A float64 gradient for a float32 tensor means fn uses a tensor that requires grad but that
    gradcheck did not promote: that ends the check.
    """
    if not isinstance(err, GradientMismatchError):
        raise err
    parsed = {"kind": err.kind, "fn": err.fn, "got": err.got, "want": err.expected, "text": str(err)}
    if parsed["kind"] == "dtype" and check_dtype is not None and parsed["got"] == str(check_dtype) \
            and np.dtype(parsed["want"]).itemsize < check_dtype.itemsize:
        raise _Fatal(
            "unpromoted_tensor",
            f"backward reached a {parsed['want']} tensor that gradcheck did not promote ({parsed['text']}): "
            "a tensor that requires grad is used by fn without being an input or a module parameter; "
            "pass it in inputs, or as params={'name': tensor}, or set requires_grad=False on it",
        )
    return parsed


def _scales_linearly(a1, a2, a0, dtype):
    """backward(2g) == 2 backward(g) and backward(0) == 0, up to rounding."""
    if a1 is None or a2 is None or a0 is None:
        return True
    if not (np.isfinite(a1).all() and np.isfinite(a2).all()):
        return True  # the NaN hint says more
    tol = (1e-8 if dtype is None or dtype.itemsize >= 8 else 1e-4) * max(np.abs(a1).max(initial=0), 1e-300)
    return bool(np.abs(a2 - 2 * a1).max(initial=0) <= 2 * tol and np.abs(a0).max(initial=0) <= tol)


# =============================================================================== 4. the numerics


def _central_differences(ev, tensor, flat_index, h, L0):
    """Numerical gradient at the given C-order positions, with both one-sided slopes.

    Each element is set to x+h and x-h in place and put back; L values stay on the device
    until one transfer at the end. Returns (n, d_plus, d_minus) as float64 host arrays.
    """
    if len(flat_index) == 0:
        empty = np.zeros(0)
        return empty, empty, empty
    flat = tensor.data.reshape(-1)  # a view: working copies are C-contiguous
    values = _host(flat)[flat_index]
    up, down = (values + h).astype(values.dtype), (values - h).astype(values.dtype)
    plus, minus = [], []
    with no_grad():
        try:
            for i, v, u, d in zip(flat_index.tolist(), values.tolist(), up.tolist(), down.tolist()):
                flat[i] = u
                plus.append(ev.loss())
                flat[i] = d
                minus.append(ev.loss())
                flat[i] = v
        finally:
            flat[i] = v  # the element being perturbed when forward raised
    xp = ev.xp
    Lp = _host(xp.stack(plus)).astype(np.float64)
    Lm = _host(xp.stack(minus)).astype(np.float64)
    v64, u64, d64 = values.astype(np.float64), up.astype(np.float64), down.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = (Lp - Lm) / (u64 - d64)
        return n, (Lp - L0) / (u64 - v64), (L0 - Lm) / (v64 - d64)


def _directional(run, c, a_host, rng):
    """n_proj random directions d: (L(x + h d) - L(x - h d)) / 2h against <a, actual step> / 2h."""
    h = run.settings.eps
    arr = c.tensor.data
    base = arr.copy()
    host = _host(arr)
    out = []
    with no_grad():
        try:
            for _ in range(run.n_proj):
                d = rng.standard_normal(arr.shape)
                d /= np.linalg.norm(d) or 1.0
                up, down = (host + h * d).astype(host.dtype), (host - h * d).astype(host.dtype)
                arr[...] = to_device(up, c.tensor.device)
                Lp = run.ev.loss()
                arr[...] = to_device(down, c.tensor.device)
                Lm = run.ev.loss()
                step = up.astype(np.float64) - down.astype(np.float64)
                out.append((float(Lp - Lm) / (2 * h), float((a_host * step).sum()) / (2 * h)))
        finally:
            arr[...] = base
    return out


def _sample_positions(shape, n_coords, rng):
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


# =============================================================================== 5. compare


def _classify(a, n, rtol, atol_eff):
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


def _kinks(a, n, d_plus, d_minus, status, settings):
    """Failing elements whose one-sided slopes disagree and bracket a: a kink within +-eps."""
    atol = settings.atol_eff
    with np.errstate(invalid="ignore"):
        gap = np.abs(d_plus - d_minus)
        lo, hi = np.minimum(d_plus, d_minus), np.maximum(d_plus, d_minus)
        band = atol + settings.rtol * np.maximum(np.abs(d_plus), np.abs(d_minus))
        kink = (gap > 1e-3 * np.maximum(1.0, np.abs(n)) + 2 * atol) & (a >= lo - band) & (a <= hi + band)
    return (status == FAIL) & kink & np.isfinite(a) & np.isfinite(gap)


def _check_gradients(run) -> dict:
    """Backward three times (g, 2g, 0), then every tensor numerically, then the diagnosis."""
    grads, errors = _analytic(run, 1.0)
    grads2, _ = _analytic(run, 2.0)
    grads0, _ = _analytic(run, 0.0)
    changed = [c.name for c in run.checked if not _same_bits(c.tensor.data, _working_snapshot(run, c))]
    if changed:
        raise _Fatal("mutated_input", f"backward modified {', '.join(map(repr, changed))} in place")
    results = {}
    for k, c in enumerate(run.checked):
        result = TensorResult(c.name, c.kind, tuple(c.snapshot.shape), c.dtype)
        if c.name in errors:
            explain_engine_error(result, errors[c.name])
        else:
            a = grads[c.name]
            missing = a is None
            a = np.zeros(c.tensor.shape) if missing else a.astype(np.float64)
            linear = _scales_linearly(grads[c.name], grads2.get(c.name), grads0.get(c.name),
                                      run.plan.check_dtype)
            _compare_tensor(run, c, result, a, missing, linear, np.random.default_rng(run.seeds[k]))
        results[c.name] = result
    run.working_restored = all(_same_bits(c.tensor.data, _working_snapshot(run, c)) for c in run.checked)
    return results


def _working_snapshot(run, c):
    """The working copy's expected values (the original, converted the same way)."""
    return _working_array(c.original.data, run.plan.work_dtype)


def _compare_tensor(run, c, result, a, missing, linear, rng):
    """Numerical check of one tensor (full or sampled), then kinks, stability and hints."""
    checks, numerical = _numerical_checks(run, c, result, a, rng)
    result.checked = len(checks)
    result.n_fail = sum(ch.status == FAIL for ch in checks)
    result.n_unverified = sum(ch.status == UNVERIFIED for ch in checks)
    result.n_nondiff = sum(ch.status == NONDIFF for ch in checks)
    result.max_abs_err = max((ch.abs_err for ch in checks), default=0.0)
    result.max_rel_err = max((ch.rel_err for ch in checks), default=0.0)
    result.numerical, result.analytical = numerical, a

    if result.n_fail or not linear:
        result.verdict = "FAIL"
    elif result.n_nondiff:
        result.verdict = "NONDIFF"
    elif result.n_unverified * 2 >= max(result.checked, 1):
        result.verdict = "INCONCLUSIVE"
    shown = {"FAIL": FAIL, "NONDIFF": NONDIFF, "INCONCLUSIVE": UNVERIFIED}.get(result.verdict)
    result.worst = sorted((ch for ch in checks if ch.status == shown), key=lambda ch: -ch.abs_err)[: run.topk]
    if result.n_fail:
        result.trust = _stability(run, c, checks)
    diagnose(run, c, result, checks, missing, linear)


def _numerical_checks(run, c, result, a, rng):
    """ElementChecks for the chosen positions (+ directions in sampled mode) and the numerical
    gradient as an array (NaN where not checked). A failing sample falls back to full mode."""
    s = run.settings
    full = s.mode == "full" or c.size <= run.n_coords
    index = np.arange(c.size) if full else _sample_positions(c.tensor.shape, run.n_coords, rng)
    result.mode = "full" if full else "sampled"
    n, d_plus, d_minus = _central_differences(run.ev, c.tensor, index, s.eps, run.L0)
    a_flat = a.reshape(-1)
    status, diff, rel = _classify(a_flat[index], n, s.rtol, s.atol_eff)
    directions = []
    if not full:
        directions = _directional(run, c, a, rng)  # [(numerical, analytical), ...]
        nu, an = np.array(directions).reshape(-1, 2).T
        sample_failed = (status == FAIL).any() or (_classify(an, nu, s.rtol, s.atol_eff)[0] == FAIL).any()
        if sample_failed and c.size <= _FULL_FALLBACK_LIMIT:  # list every bad element
            index = np.arange(c.size)
            n, d_plus, d_minus = _central_differences(run.ev, c.tensor, index, s.eps, run.L0)
            status, diff, rel = _classify(a_flat, n, s.rtol, s.atol_eff)
            result.mode, directions = "sampled, then full", []
    status = np.where(_kinks(a_flat[index], n, d_plus, d_minus, status, s), NONDIFF, status)

    checks = [ElementCheck(_multi(i, c.tensor.shape), float(nv), float(av), float(d), float(r), str(st))
              for i, nv, av, d, r, st in zip(index.tolist(), n, a_flat[index], diff, rel, status)]
    for k, (nv, av) in enumerate(directions):
        st, d, r = _classify(np.array([av]), np.array([nv]), s.rtol, s.atol_eff)
        checks.append(ElementCheck(f"dir {k + 1}", nv, av, float(d[0]), float(r[0]), str(st[0])))
    numerical = np.full(c.size, np.nan)
    numerical[index] = n
    return checks, numerical.reshape(c.tensor.shape)


def _multi(i, shape):
    return tuple(int(j) for j in np.unravel_index(i, shape)) if shape else ()


def _stability(run, c, checks):
    """Recompute the worst failing elements with eps x10 and /10: does the estimate move?"""
    settings = run.settings
    worst = sorted((ch for ch in checks if ch.status == FAIL and not isinstance(ch.index, str)
                    and math.isfinite(ch.numerical) and math.isfinite(ch.analytical)),
                   key=lambda ch: -ch.abs_err)[: 3 * run.topk]
    if not worst:
        return None
    index = np.array([np.ravel_multi_index(ch.index, c.tensor.shape) if ch.index else 0 for ch in worst])
    estimates = [np.array([ch.numerical for ch in worst])]
    for h in (settings.eps * 10, settings.eps / 10):
        estimates.append(_central_differences(run.ev, c.tensor, index, h, run.L0)[0])
    spread = np.ptp(np.stack(estimates), axis=0)
    errors = np.array([ch.abs_err for ch in worst])
    eps_set = "{" + ", ".join(f"{e:.0e}" for e in (settings.eps * 10, settings.eps, settings.eps / 10)) + "}"
    if np.all(spread < 0.1 * errors):
        return (f"numerical estimate stable across eps in {eps_set} (spread {spread.max():.0e}) "
                "-> the analytical gradient is wrong")
    return (f"numerical estimate unstable across eps in {eps_set} (spread {spread.max():.1e} against "
            f"an error of {errors.min():.1e}): curvature or cancellation; try another eps or rescale "
            "the inputs; backward may be fine")



# =============================================================================== helpers


def _host(a):
    """A NumPy view (CPU) or copy (GPU) of an array."""
    return np.asarray(to_device(a, "cpu")) if hasattr(a, "shape") else np.asarray(a)


def _same_bits(a, b) -> bool:
    """Equal bit for bit (so -0.0 != 0.0 and NaN == NaN)."""
    a, b = _host(a), _host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = [np.ascontiguousarray(x).view(np.uint8) for x in (a, b)]
    return bool(np.array_equal(*bits))


def _close_bits(a, b) -> bool:
    """Equal up to a few ulps (two runs of a deterministic forward; GPU reductions may reorder)."""
    a, b = _host(a), _host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not is_float_dtype(a.dtype):
        return bool(np.array_equal(a, b))
    tol = 100 * float(np.finfo(a.dtype).eps)
    scale = float(np.abs(a[np.isfinite(a)]).max(initial=0.0))
    return bool(np.allclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True))


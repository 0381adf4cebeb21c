"""Where one training step's time goes, op by op (``cpu_step.py --profile`` prints it).

Every ``Function``'s forward and backward (the fast tier's and the reference's) is timed by a
wrapper while the step runs; the rest of the step is split into what the engine does between
the ops' backward passes (adding gradients that meet, accumulating leaf gradients: ``backward:
engine``), what the models do around the ops' forward passes (Python, modules: ``forward:
other``), ``optimizer.step()`` and ``zero_grad()``. The bookkeeping that ``Function.apply`` and
``backward()`` do for every op is timed apart (``HOOKS``): ``apply: ...`` (the in-place guard's
records, the input checks, the hand-overs with the pending biases they add, the graph node, the
dispatch) and ``engine: ...`` (the guard's checks, the gradient checks, the graph's walk and
freeing). Times are exclusive: a timed call inside another is not counted twice. The wrappers
cost about a microsecond per call.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict

from tinymlp import autograd, contract, dispatch, graph, guard
from tinymlp.autograd import Context, Function
from tinymlp.fast.engine import FastEngine
from tinymlp.optim import Optimizer

HOOKS = (   # (module, function, label): what apply() and backward() do for every op, besides the op
    (guard, "record", "apply: in-place guard"),
    (guard, "share_views", "apply: in-place guard"),
    (contract, "check_inputs", "apply: input checks"),
    (FastEngine, "forward", "apply: hand-overs"),      # the fast engine's pending biases
    (dispatch, "implementation_for", "apply: dispatch"),
    (guard, "check_unmodified", "engine: in-place guard"),
    (contract, "gradients", "engine: gradient checks"),
    (graph, "nodes", "engine: graph walk"),
    (graph, "free", "engine: graph walk"),
)


def op_name(cls):
    """The name of the reference op a Function class implements (``FastLayerNorm`` -> ``LayerNorm``):
    the first class of its MRO defined in tinymlp.ops, else its own name."""
    for c in cls.__mro__:
        if c.__module__.startswith("tinymlp.ops"):
            return c.__name__
    return cls.__name__


def _functions():
    """Every Function subclass with its own forward or backward (reference and fast tier)."""
    seen, todo = [], [Function]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if "forward" in sub.__dict__ or "backward" in sub.__dict__:
                seen.append(sub)
    return seen


class StepProfile:
    """Exclusive seconds per label over the recorded steps; ``table()`` gives medians per step."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock     # time.perf_counter (wall time), or time.thread_time on a busy machine
        self.steps = []        # one {label: seconds} per recorded step
        self._stack = []       # [label, start, seconds spent in timed children]
        self._now = None

    # ------------------------------------------------------------------ timing
    def _enter(self, label):
        self._stack.append([label, self.clock(), 0.0])

    def _leave(self):
        label, start, children = self._stack.pop()
        spent = self.clock() - start
        self._now[label] += spent - children
        if self._stack:
            self._stack[-1][2] += spent

    def _timed(self, label, fn):
        def timed(*args, **kwargs):
            self._enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self._leave()
        return timed

    @contextlib.contextmanager
    def patched(self):
        """Install the timing wrappers (and take them out again)."""
        saved = []
        for cls in _functions():
            name = op_name(cls)
            for method, what in (("forward", "fwd"), ("backward", "bwd")):
                if method in cls.__dict__:
                    original = cls.__dict__[method]
                    saved.append((cls, method, original))
                    timed = self._timed(f"{name} {what}", original.__func__)
                    # the same kind of method: a fast class's classmethod finds its kernels through cls
                    setattr(cls, method,
                            classmethod(timed) if isinstance(original, classmethod) else staticmethod(timed))
        for owner, method, label in ((autograd, "backward", "backward: engine"),
                                     (Optimizer, "step", "optimizer step"),
                                     (Optimizer, "zero_grad", "zero_grad"),
                                     (Context, "__init__", "apply: graph node"), *HOOKS):
            original = owner.__dict__[method]
            saved.append((owner, method, original))
            setattr(owner, method, self._timed(label, original))
        try:
            yield self
        finally:
            for owner, method, original in reversed(saved):
                setattr(owner, method, original)

    def record(self, forward, rest):
        """Time one step: ``loss = forward()`` (the model and the loss), then ``rest(loss)``."""
        self._now = defaultdict(float)
        start = self.clock()
        self._enter("forward: other")
        loss = forward()
        self._leave()
        rest(loss)
        self._now["step"] = self.clock() - start
        self.steps.append(self._now)
        self._now = None

    # ------------------------------------------------------------------ report
    def medians(self):
        labels = {label for step in self.steps for label in step}
        return {label: statistics.median(step.get(label, 0.0) for step in self.steps) for label in labels}

    def table(self, floor_ms=None, floors=None, top=14):
        """Lines: each label's median ms per step and its share of the step, largest first; with
        ``floors`` ({label: ms of that op's matrix products run alone}) also the products and the
        rest (the op's own work: its time less its products)."""
        med = self.medians()
        step = med.pop("step")
        rows = sorted(med.items(), key=lambda kv: -kv[1])
        floors = floors or {}
        head = f"    {'':34s} {'ms':>8s} {'share':>7s}"
        if floors:
            head += f" {'products':>9s} {'rest':>8s}"
        lines = [head]
        for label, sec in rows[:top]:
            line = f"    {label:34s} {1e3 * sec:8.1f} {100 * sec / step:6.1f}%"
            if label in floors:
                line += f" {floors[label]:9.1f} {1e3 * sec - floors[label]:8.1f}"
            lines.append(line)
        rest = sum(sec for _, sec in rows[top:])
        if rest:
            lines.append(f"    {'(' + str(len(rows) - top) + ' more)':34s} {1e3 * rest:8.1f} {100 * rest / step:6.1f}%")
        lines.append(f"    {'whole step':34s} {1e3 * step:8.1f}")
        if floor_ms is not None:
            lines.append(f"    {'matrix products alone (the floor)':34s} {floor_ms:8.1f} "
                         f"{100 * floor_ms / (1e3 * step):6.1f}%"
                         f"   -> everything else {1e3 * step - floor_ms:.1f} ms, "
                         f"{100 * (1 - floor_ms / (1e3 * step)):.0f}% of the step")
        if floors:
            lines.append("    products = that op's matrix products run alone (contiguous operands, same gap); "
                         "rest = ms - products: the op's own work")
        return lines

"""The training step captured once into a CUDA graph and replayed: a step the host does not pace.

On a GPU an op costs the host 10 to 30 microseconds of Python and driver calls whatever its size,
and a training step of a CIFAR Mixer issues some 400 of them: at batch 128 the GPU finishes
each kernel before the host has issued the next, so the step takes as long as the host takes to
issue it. A CUDA graph records the kernels of one step once (stream capture: the step's Python
runs, the kernels are recorded, nothing is computed) and replays them all with one launch. The
replay reads the memory the capture used, so it needs:

- fixed shapes, and the batch copied into input buffers of its own (``inputs``) before each launch;
- everything the step allocates served by a private memory pool kept for the graph (another
  array must never take memory the graph writes at each replay; the blocks the warm-up left
  cached in CuPy's pool are handed back first, so a step's memory is held once, not twice), and
  what it reads that a cache could drop (pointer tables, constants) held with the graph;
- nothing the capture refuses: no host read or upload, no CuPy product (cuBLAS through
  ``fast/cublas.py`` instead), no cuRAND (dropout's seeds are in device memory);
- the values the host computes each step (learning rate, bias corrections, dropout seeds)
  uploaded before each launch by the host halves the capture recorded (``fast/scalars.py``),
  which also advance the optimizer's step counts and the dropout generators as the eager step
  would: replays equal the eager steps and leave a checkpoint the same host state.

``CapturedStep(step, written, state)`` wraps ``step(*tensors)``. Its first calls run the step
eagerly (the warm-up: the optimizer's buffers, the kernels, cuBLAS's handle and pointer tables are
made then), the next one captures it and replays it, and every call after that whose tensors
have the captured shapes copies them in and replays. A call it cannot replay runs the step
eagerly, and ``why`` says why: tensors of other shapes (the last partial batch), a tensor that is
not a plain ``Tensor`` (one that carries values of its own, as masked-language batches do), the
arrays of ``written`` (the parameters) or of ``state()`` (the optimizer's buffers) replaced since
the capture (captured again after a new warm-up), or a reason that holds for the whole run (not
on CUDA, the fast tier off, no cuBLAS binding, a capture that failed: its error). After each
replay ``written``'s gradients are the graph's and their in-place guard versions advance, as an
eager ``optimizer.step()`` leaves them.
"""

from __future__ import annotations

from collections import Counter

from .. import dispatch, guard
from ..backend import device_constants
from ..tensor import Tensor
from . import cublas, cuda, scalars

__all__ = ["CapturedStep"]


class CapturedStep:
    """``step(*tensors)`` captured into a CUDA graph for fixed shapes and replayed (module docstring).

    ``written``: the tensors the step updates in place (the parameters); ``state()``: the other
    objects the graph depends on (an optimizer's flat buffers), compared by identity before each
    replay. ``counts`` tallies the calls: ``"replayed"``, else the reason each ran eagerly."""

    WARMUP = 2
    """Eager steps before the capture (lazily made state: buffers, tables, kernels, handles)."""

    def __init__(self, step, written=(), state=tuple, warmup=WARMUP):
        self.step, self.written, self.state, self.warmup = step, list(written), state, warmup
        self.reason = None              # why no graph can be made in this run (None: one can)
        self.why = None                 # why the last call ran eagerly (None: it was replayed)
        self.shapes = None
        self.counts = Counter()
        self.forget()

    def forget(self):
        """Drop the graph (and its memory): the next calls warm up and capture again."""
        self.graph = self.recording = self.pool = self.inputs = self.outputs = self.grads = self.held = None
        self.warm = 0

    def __call__(self, *tensors):
        """One step: a replay where the tensors fit the graph, else the eager step."""
        why = self.check(tensors)
        if why is None and self.graph is None:
            if self.warm < self.warmup:
                self.warm += 1
                why = "warm-up"
            else:
                why = self.capture(tensors)
        self.why = why
        self.counts["replayed" if why is None else why] += 1
        return self.step(*tensors) if why is not None else self.replay(tensors)

    # ------------------------------------------------------------------ when a replay applies
    def check(self, tensors):
        """Why these tensors cannot be replayed now, or None."""
        if self.reason is not None:
            return self.reason
        odd = [type(t).__name__ for t in tensors if type(t) is not Tensor]
        if odd:
            return f"a batch of {odd[0]} (values of its own each batch)"
        shapes = tuple((t.shape, t.dtype, type(t.array)) for t in tensors)
        if self.shapes is None:
            self.reason = _unsupported(tensors)
            if self.reason is not None:
                return self.reason
            self.shapes = shapes
        if shapes != self.shapes:
            return "a batch of another shape"
        if self.graph is not None and not _same(self.held, self.holds()):
            self.forget()                               # a model.to(...), an optimizer's new state
            self.warm = 1                               # (this eager step is the new warm-up's first)
            return "arrays replaced since the capture"
        return None

    def holds(self):
        """What the graph reads that the caller owns: ``written``'s arrays and ``state()``."""
        return (*[t.array for t in self.written], *self.state())

    # ------------------------------------------------------------------ capture and replay
    def capture(self, tensors):
        """Capture the step on inputs of ``tensors``' shapes; None, or why it failed (then the
        step runs eagerly for the rest of the run, and ``reason`` says why)."""
        cp = cuda.cupy()
        self.inputs = tuple(Tensor.from_array(cp.empty_like(t.array)) for t in tensors)
        cp.get_default_memory_pool().free_all_blocks()  # the warm-up's cached blocks make room for the graph's
        stream, pool, error = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool(), None
        with scalars.recording() as recording, stream, cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                outputs = self.step(*self.inputs)
            except Exception as exc:                    # noqa: BLE001 - reported, the eager step runs
                error = exc
            finally:
                try:
                    graph = stream.end_capture()
                except Exception as exc:                # noqa: BLE001 - the capture was invalidated
                    error = error or exc
        if error is not None:
            self.forget()
            detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.reason = f"the step could not be captured ({type(error).__name__}: {detail})"
            return self.reason
        recording.hold(*device_constants())
        self.graph, self.recording, self.pool, self.outputs = graph, recording, pool, outputs
        self.grads = [t.grad for t in self.written]
        self.held = self.holds()
        return None

    def replay(self, tensors):
        """Copy the tensors into the graph's inputs, upload this step's values, launch the graph."""
        for inside, t in zip(self.inputs, tensors):
            inside.array[...] = t.array
        self.recording.prepare()
        self.graph.launch()
        for t, grad in zip(self.written, self.grads):
            t.grad = grad
            if grad is not None:                        # (what an eager optimizer.step() marks)
                guard.mark_written(t)
        return self.outputs


def _unsupported(tensors):
    """Why a step on ``tensors`` cannot be captured at all, or None."""
    if not tensors or any(type(t.array).__module__.split(".")[0] != "cupy" for t in tensors):
        return "not on CUDA"
    if not dispatch.is_enabled():
        return "the fast tier is off (TINYMLP_FAST=0)"
    if not cublas.available():
        return "no capturable matrix products (TINYMLP_CUBLAS=0, or libcublas did not load)"
    return None


def _same(before, now):
    return len(before) == len(now) and all(a is b for a, b in zip(before, now))

"""Step scalars on the device: the values the host computes for each training step (the learning
rate, Adam's bias corrections, the weight-decay factor, dropout seeds) reach the kernels through
device memory, one small upload per step, not as kernel arguments.

Why: a CUDA graph keeps the arguments of each kernel as they were when the step was captured.
Replayed, a step that passed its learning rate by value would run every later step with the
first one's learning rate and bias corrections, and draw the same dropout masks again. A kernel
that reads its scalars from a buffer reads, at each replay, what the host uploaded before it.
So each such value has a host half (computing it) and a device half (the kernel reading it):

- eager: ``StepScalars.upload(values)`` copies this step's values to the device buffer (one
  small host-to-device copy), then the kernels that read it are launched;
- captured (``cuda.capturing()``): nothing may be uploaded while a stream captures (CuPy
  refuses it) and the step's Python code does not run at a replay. The step's code then records
  its host half in the current ``Recording`` (``record``) instead of running it, and launches
  the kernels on the buffer. Before each launch of the graph, ``Recording.prepare()`` runs every
  host half in the order the step recorded them: it advances the host state (an optimizer's
  step counts, the generators behind the dropout seeds) and uploads the values, as the eager
  step would have.

The same values go through the same kernels either way, so a replayed step equals the eager
step bit for bit, and after N replays the host state is that of N eager steps: a checkpoint
then resumes exactly. Dropout seeds are the one exception to "upload in eager": the eager kernel
takes its seed by value (nothing to upload), the captured one reads it from a slot of
``Recording.seed``: the same seed and the same hash, so the same mask.

A graph reads memory by address, so the recording also holds what it reads that a cache could
let go of (``hold``: a pointer table, a ones vector), and uploads, once before the first launch,
what a step made during capture that must be filled from the host (``at_first_launch``: a
pointer table of addresses first seen during capture).
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import cuda

__all__ = ["Recording", "StepScalars", "current", "hold", "recording"]


class StepScalars:
    """A few values of one dtype that the host computes each step, in one device buffer."""

    def __init__(self, xp, dtype, size):
        self.host = np.zeros(size, dtype=dtype)
        self.device = xp.empty(size, dtype=dtype)   # no fill: a fill taken during capture would be replayed

    def upload(self, values):
        """This step's values to the device: one host-to-device copy into the same memory."""
        self.host[...] = values
        self.device.set(self.host)


class Recording:
    """The host half of a captured step: what must run before each replay of its graph."""

    SEEDS = 256

    def __init__(self):
        self.host_halves, self.generators, self.seeds = [], [], None
        self.first, self.held, self.launched = [], [], False

    def record(self, host_half):
        """Run ``host_half()`` before each replay (it advances host state and uploads values)."""
        self.host_halves.append(host_half)

    def at_first_launch(self, upload):
        """Run ``upload()`` once, before the first replay (it fills memory the graph only reads)."""
        self.first.append(upload)

    def hold(self, *arrays):
        """Keep ``arrays`` alive as long as the graph: it reads them by address."""
        self.held.extend(arrays)

    def seed(self, xp, generator):
        """A device slot for one dropout seed (a 0-d uint64 array view), drawn from ``generator``
        before each replay in the order the slots were taken (the eager step's order of draws)."""
        if self.seeds is None:
            self.seeds = StepScalars(xp, np.uint64, self.SEEDS)
            self.record(self._draw_seeds)
        k = len(self.generators)
        if k == self.SEEDS:
            raise RuntimeError(f"a captured step draws more than {self.SEEDS} dropout seeds")
        self.generators.append(generator)
        return self.seeds.device[k]

    def _draw_seeds(self):
        for k, generator in enumerate(self.generators):
            self.seeds.host[k] = generator.integers(2**63)
        self.seeds.device.set(self.seeds.host)

    def prepare(self):
        """Run every host half, in order: this replay's values on the device (and, before the
        first replay, the uploads of ``at_first_launch``)."""
        if not self.launched:
            for upload in self.first:
                upload()
            self.launched = True
        for host_half in self.host_halves:
            host_half()


_RECORDINGS = []


@contextlib.contextmanager
def recording():
    """The ``Recording`` that a step captured inside this block records its host half in."""
    rec = Recording()
    _RECORDINGS.append(rec)
    try:
        yield rec
    finally:
        _RECORDINGS.pop()


def current() -> Recording:
    """The open ``Recording``; a RuntimeError when a step is captured outside ``recording()``."""
    if not _RECORDINGS:
        raise RuntimeError("a CUDA step captured outside tinymlp.fast.scalars.recording(): its per-step values "
                           "(learning rate, bias corrections, dropout seeds) would be frozen into the graph")
    return _RECORDINGS[-1]


def hold(*arrays):
    """While a step is captured, keep ``arrays`` (found in a cache, which may drop them later)
    alive with its graph; nothing otherwise."""
    if cuda.capturing():
        current().hold(*arrays)

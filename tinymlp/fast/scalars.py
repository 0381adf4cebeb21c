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
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .kernels import optim_cuda

__all__ = ["Recording", "StepScalars", "adam_values", "advance_adam", "current", "recording"]


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

    def record(self, host_half):
        """Run ``host_half()`` before each replay (it advances host state and uploads values)."""
        self.host_halves.append(host_half)

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
        """Run every host half, in order: this replay's values on the device."""
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


# --------------------------------------------------------------------------- the optimizer's
def adam_values(group, t, decay):
    """Adam(W)'s scalars at step ``t`` (``optim_cuda.ADAM_SCALARS``), computed as the flat array
    code computes them (``fast/optim.py``, ``adam_direction``)."""
    b1, b2 = (float(b) for b in group["betas"])
    c1, root_c2 = 1.0 - b1**t, math.sqrt(1.0 - b2**t)
    return optim_cuda.adam_scalars(b1=b1, b2=b2, eps_c=float(group["eps"]) * root_c2,
                                   step_size=float(group["lr"]) * root_c2 / c1, decay=decay)


def advance_adam(optimizer, gi, flat_group):
    """The host half of a captured Adam(W) group step, before a replay: the scalars of the step
    from the group's hyperparameters now (a schedule's lr) uploaded, its step counts advanced."""
    group, states = optimizer.param_groups[gi], optimizer.state[gi]
    lr, wd = float(group["lr"]), float(group.get("weight_decay", 0.0))
    decay = 1.0 - lr * wd if wd and optimizer.decoupled_weight_decay else 1.0
    flat_group.scalars.upload(adam_values(group, states[0]["step"] + 1, decay))
    for state in states:
        state["step"] += 1

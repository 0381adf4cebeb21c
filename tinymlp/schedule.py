"""Learning-rate schedules: a linear warmup, then a linear or cosine decay, per param group.

    opt = AdamW(model.parameters(), lr=1e-3)
    sched = WarmupCosine(opt, warmup_steps=500, total_steps=10_000)
    for x, y in batches:
        ...
        opt.step()
        sched.step()
"""

from __future__ import annotations

import math

from .hyperparameters import check_hyperparameter, describe, is_count

__all__ = ["LRSchedule", "WarmupCosine", "WarmupLinear"]


class LRSchedule:
    """Linear warmup from 0 to each group's base lr, then a decay to ``min_lr``.

    ``step`` counts training steps from 0; the lr used by training step s is ``get_lr(s)``::

        s < warmup:   lr = base * s / warmup
        otherwise:    lr = min_lr + (base - min_lr) * decay(progress),
                      progress = (s - warmup) / (total - warmup), clipped to [0, 1]

    Creating the schedule sets the lr of step 0; call ``step()`` once per training step,
    after ``optimizer.step()``. Subclasses define ``decay``: 1 at progress 0, 0 at 1.
    """

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        self._check_settings(type(self).__name__, warmup_steps, total_steps, min_lr)
        self.optimizer = optimizer
        self.warmup_steps, self.total_steps, self.min_lr = int(warmup_steps), int(total_steps), float(min_lr)
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.step_count = 0
        self._apply()

    @staticmethod
    def decay(progress: float) -> float:
        raise NotImplementedError

    def _lr(self, step, base):
        if step < self.warmup_steps:
            return base * step / self.warmup_steps
        span = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / span) if span else 1.0
        return self.min_lr + (base - self.min_lr) * self.decay(progress)

    def get_lr(self, step=None) -> float:
        """The lr of the first param group at ``step`` (default: the current step)."""
        if step is not None and not is_count(step):
            raise ValueError(f"{type(self).__name__}.get_lr: step must be a step count (an int >= 0), got {step!r}")
        return self._lr(self.step_count if step is None else step, self.base_lrs[0])

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self._lr(self.step_count, base)

    def step(self):
        self.step_count += 1
        self._apply()

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count, "base_lrs": list(self.base_lrs),
            "warmup_steps": self.warmup_steps, "total_steps": self.total_steps, "min_lr": self.min_lr,
        }

    @staticmethod
    def _check_settings(name, warmup_steps, total_steps, min_lr):
        for what, value in (("total_steps", total_steps), ("warmup_steps", warmup_steps)):
            if not is_count(value):       # a float is not truncated silently, a bool is not a count
                raise ValueError(f"{name}: {what}={value!r} is not a whole number of steps; expected {what} "
                                 "an int >= 0")
        check_hyperparameter(name, "total_steps", total_steps, 0, low_open=True)
        check_hyperparameter(name, "min_lr", min_lr, 0)
        if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
            raise ValueError(
                f"{name}: need 0 <= warmup_steps <= total_steps and total_steps > 0, "
                f"got warmup_steps={warmup_steps}, total_steps={total_steps}"
            )

    def check_state_dict(self, state):
        """A ValueError (or TypeError) naming what is wrong with ``state``, checked as the
        constructor checks its arguments: nothing is changed until it passes."""
        name = f"{type(self).__name__}.load_state_dict"
        keys = ("step_count", "base_lrs", "warmup_steps", "total_steps", "min_lr")
        if not isinstance(state, dict) or any(k not in state for k in keys):
            raise ValueError(f"{name}: expected a dict with {', '.join(keys)}, as state_dict() returns; "
                             f"got {describe(state)}")
        for k in ("step_count", "warmup_steps", "total_steps"):
            if not is_count(state[k]):
                raise ValueError(f"{name}: {k}={state[k]!r} is not an integer >= 0")
        self._check_settings(name, state["warmup_steps"], state["total_steps"], state["min_lr"])
        if (not isinstance(state["base_lrs"], (list, tuple))
                or len(state["base_lrs"]) != len(self.optimizer.param_groups)):
            raise ValueError(
                f"{name}: {describe(state['base_lrs'])} as base lrs for {len(self.optimizer.param_groups)} "
                "param group(s); expected one lr per group"
            )
        for i, lr in enumerate(state["base_lrs"]):
            check_hyperparameter(name, f"base_lrs[{i}]", lr)

    def load_state_dict(self, state):
        """Restore ``state_dict()``'s values (checked first: nothing changes on error)."""
        self.check_state_dict(state)
        self.step_count = int(state["step_count"])
        self.base_lrs = [float(b) for b in state["base_lrs"]]
        self.warmup_steps, self.total_steps = int(state["warmup_steps"]), int(state["total_steps"])
        self.min_lr = float(state["min_lr"])
        self._apply()

    def __repr__(self):
        return (f"{type(self).__name__}(warmup_steps={self.warmup_steps}, total_steps={self.total_steps}, "
                f"min_lr={self.min_lr}, step_count={self.step_count})")


class WarmupLinear(LRSchedule):
    """Linear warmup, then linear decay to ``min_lr`` at ``total_steps`` (MLP-Mixer's recipe)."""

    @staticmethod
    def decay(progress):
        return 1.0 - progress


class WarmupCosine(LRSchedule):
    """Linear warmup, then half a cosine from the base lr down to ``min_lr``."""

    @staticmethod
    def decay(progress):
        return 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------- clipping
